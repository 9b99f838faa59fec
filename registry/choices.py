from django.db import models


class AgentStatus(models.TextChoices):
    ACTIVE = "active", "Active"
    DISABLED = "disabled", "Disabled"


class Transport(models.TextChoices):
    HTTP = "http", "HTTP (sync JSON)"
    HTTP_ASYNC = "http-async", "HTTP async (202 ACK, then callback or poll)"
    A2A = "a2a", "A2A v1.0 (JSON-RPC SendMessage)"


class Liveness(models.TextChoices):
    ONLINE = "online", "Online"
    SUSPECT = "suspect", "Suspect"
    OFFLINE = "offline", "Offline"


# Instances that may take traffic; SUSPECT ones are down-weighted, not removed.
ROUTABLE_LIVENESS = (Liveness.ONLINE, Liveness.SUSPECT)


class VersionState(models.TextChoices):
    DRAFT = "draft", "Draft"
    SUBMITTED = "submitted", "Submitted"
    APPROVED = "approved", "Approved"
    REJECTED = "rejected", "Rejected"
    ACTIVE = "active", "Active"
    RETIRED = "retired", "Retired"


# The preset list of actions (BRIEF §1); extended only by review.
ACTIONS = (
    "summarize", "analyze", "search", "generate", "transform",
    "notify", "query", "classify", "extract", "review",
)


class VectorKind(models.TextChoices):
    EXAMPLE = "example", "Example request"
    NEGATIVE = "negative", "Negative case"
    DESCRIPTION = "description", "Description"
    CENTROID = "centroid", "Centroid of the examples"
