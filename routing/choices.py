from django.db import models


class TaskStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    ROUTED = "routed", "Routed"
    ACCEPTED = "accepted", "Accepted"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    NEEDS_CONFIRMATION = "needs_confirmation", "Needs confirmation"
    MANUAL_REVIEW = "manual_review", "Manual review"
    CANCELLED = "cancelled", "Cancelled"
    DEAD_LETTERED = "dead_lettered", "Dead-lettered"


TERMINAL = (TaskStatus.SUCCEEDED, TaskStatus.FAILED, TaskStatus.CANCELLED, TaskStatus.DEAD_LETTERED)
# States a repeated request_id answers from without executing anything.
SETTLED = (*TERMINAL, TaskStatus.NEEDS_CONFIRMATION, TaskStatus.MANUAL_REVIEW)


class Decision(models.TextChoices):
    EXECUTE = "execute", "Execute"
    CONFIRM = "confirm", "Confirm"
    MANUAL_REVIEW = "manual_review", "Manual review"


class AttemptOutcome(models.TextChoices):
    SUCCESS = "success", "Success"
    TIMEOUT = "timeout", "Timeout"
    CONNECT_ERROR = "connect_error", "Connection failed"
    SERVER_ERROR = "server_error", "5xx"
    CLIENT_ERROR = "client_error", "4xx"
    BAD_OUTPUT = "bad_output", "Output breaks output_schema"
    FINGERPRINT = "fingerprint_mismatch", "Answered with another endpoint id"
    ACCEPTED = "accepted", "Accepted (async)"


class Mode(models.TextChoices):
    SYNC = "sync", "Synchronous"
    ASYNC = "async", "Asynchronous"


class ReviewReason(models.TextChoices):
    """Why a task waits for a person (BRIEF §5: low score, every candidate failed, callback dead-lettered)."""

    LOW_SCORE = "low_score", "Scored below the confirm band"
    ALL_FAILED = "all_failed", "Every candidate failed"
    DEAD_LETTER = "dead_letter", "Callback dead-lettered"
