"""What exists: teams, environments, the allowlist, agents and their instances, versioned capability
descriptors, their embeddings, and the audit trail of every change."""

from __future__ import annotations

import hashlib
import secrets

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import models
from pgvector.django import VectorField

from registry.choices import AgentStatus, Liveness, Transport, VectorKind, VersionState


class Team(models.Model):
    """A team that owns agents. Members may edit their own team's agents and capability versions only."""

    slug = models.SlugField(unique=True)
    name = models.CharField(max_length=200)
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, blank=True, related_name="reach_teams")

    def __str__(self) -> str:
        return self.slug


class Environment(models.Model):
    """A deployment environment (dev, staging, prod). Agents of one environment never take another's traffic."""

    name = models.SlugField(unique=True)
    description = models.CharField(max_length=200, blank=True)

    def __str__(self) -> str:
        return self.name


def hash_key(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


class AllowlistEntry(models.Model):
    """Permission for one endpoint id to register in one environment, with the agent credential that proves it.

    The raw key is shown once when issued; only its SHA-256 is stored.
    """

    environment = models.ForeignKey(Environment, on_delete=models.PROTECT, related_name="allowlist")
    endpoint_id = models.SlugField(max_length=100)
    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="allowlist")
    key_hash = models.CharField(max_length=64, blank=True, db_index=True)
    key_prefix = models.CharField(max_length=12, blank=True, help_text="First characters of the key, to tell keys apart.")
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["environment", "endpoint_id"], name="allowlist_unique_env_endpoint")
        ]
        verbose_name_plural = "allowlist entries"

    def __str__(self) -> str:
        return f"{self.endpoint_id}@{self.environment}"

    def issue_key(self) -> str:
        raw = "ar_" + secrets.token_urlsafe(32)
        self.key_hash = hash_key(raw)
        self.key_prefix = raw[:10]
        return raw


class Agent(models.Model):
    """A logical agent endpoint (``order-analysis-agent``). Callers address its capabilities, never its hosts."""

    endpoint_id = models.SlugField(max_length=100, unique=True)
    display_name = models.CharField(max_length=200, blank=True)
    description = models.TextField(blank=True)
    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="agents")
    environment = models.ForeignKey(Environment, on_delete=models.PROTECT, related_name="agents")
    status = models.CharField(max_length=16, choices=AgentStatus.choices, default=AgentStatus.ACTIVE)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["endpoint_id"]

    def __str__(self) -> str:
        return self.endpoint_id


class AgentCard(models.Model):
    """The A2A agent card an agent was registered from: the truth. A card the agent later serves with another
    name, URL or skills is flagged for a human, never followed."""

    agent = models.OneToOneField(Agent, on_delete=models.CASCADE, related_name="a2a_card")
    card_url = models.URLField(max_length=500, help_text="Where the card was fetched (/.well-known/agent-card.json).")
    card = models.JSONField(help_text="The card as registered.")
    name = models.CharField(max_length=200, help_text="The registered card name (fingerprint).")
    rpc_url = models.URLField(max_length=500, help_text="The registered JSON-RPC interface URL (fingerprint).")
    skills_digest = models.CharField(max_length=64)
    registered_at = models.DateTimeField(auto_now_add=True)
    last_checked_at = models.DateTimeField(null=True, blank=True)
    flagged = models.BooleanField(default=False, db_index=True)
    flag_reason = models.TextField(blank=True)
    served_card = models.JSONField(null=True, blank=True, help_text="What the agent served when it was flagged.")

    def __str__(self) -> str:
        return f"card of {self.agent.endpoint_id}"


class Instance(models.Model):
    """One running copy of an agent: where it listens, how much it can take, and whether it is alive."""

    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="instances")
    instance_id = models.CharField(max_length=100, help_text="Stable id the agent gives this copy (e.g. host:port).")
    url = models.URLField(max_length=500)
    transport = models.CharField(max_length=16, choices=Transport.choices, default=Transport.HTTP)
    health_url = models.URLField(max_length=500, blank=True)
    status_url = models.URLField(max_length=500, blank=True, help_text="Poll URL of an http-async agent.")
    versions = ArrayField(models.CharField(max_length=40), default=list, blank=True,
                          help_text="Capability versions this copy serves (empty: all). A canary version's "
                                    "traffic goes only to instances that serve it.")
    weight = models.PositiveIntegerField(default=100)
    max_concurrency = models.PositiveIntegerField(default=16)
    max_qps = models.FloatField(default=100.0)
    reg_version = models.PositiveBigIntegerField(default=0)
    started_at = models.DateTimeField(null=True, blank=True)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    last_seen_at = models.DateTimeField(null=True, blank=True, help_text="Last heartbeat or good probe.")
    last_probe_at = models.DateTimeField(null=True, blank=True)
    last_probe_ok = models.BooleanField(null=True)
    suspect_since = models.DateTimeField(null=True, blank=True)
    liveness = models.CharField(max_length=16, choices=Liveness.choices, default=Liveness.ONLINE, db_index=True)
    in_flight = models.PositiveIntegerField(default=0, help_text="Reported by the agent's heartbeat.")
    load = models.FloatField(default=0.0, help_text="Reported by the agent's heartbeat (0-1).")
    deregistered_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["agent", "instance_id"], name="instance_unique_per_agent")
        ]
        ordering = ["agent_id", "instance_id"]

    def __str__(self) -> str:
        return f"{self.agent.endpoint_id}/{self.instance_id}"


class Capability(models.Model):
    """A named capability an agent offers (``order.query``); its content lives in versions."""

    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="capabilities")
    name = models.CharField(max_length=120, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        verbose_name_plural = "capabilities"

    def __str__(self) -> str:
        return self.name


class CapabilityVersion(models.Model):
    """One versioned capability descriptor. Only ACTIVE versions route; a canary takes ``canary_share`` of traffic."""

    capability = models.ForeignKey(Capability, on_delete=models.CASCADE, related_name="versions")
    version = models.CharField(max_length=40)
    state = models.CharField(max_length=16, choices=VersionState.choices, default=VersionState.DRAFT, db_index=True)
    description = models.TextField(blank=True)
    action = models.CharField(max_length=40)
    domains = ArrayField(models.CharField(max_length=60), default=list, blank=True)
    tags = ArrayField(models.CharField(max_length=60), default=list, blank=True)
    keywords = ArrayField(models.CharField(max_length=100), default=list, blank=True)
    languages = ArrayField(models.CharField(max_length=10), default=list, blank=True)
    examples = models.JSONField(default=list, blank=True)
    negative_cases = models.JSONField(default=list, blank=True)
    reject_conditions = models.JSONField(default=list, blank=True, help_text="JSON Schemas the payload must NOT match.")
    input_schema = models.JSONField(default=dict, blank=True)
    output_schema = models.JSONField(default=dict, blank=True)
    input_modes = ArrayField(models.CharField(max_length=100), default=list, blank=True,
                             help_text="Media types the capability takes (an A2A skill's inputModes).")
    output_modes = ArrayField(models.CharField(max_length=100), default=list, blank=True,
                              help_text="Media types the capability answers (an A2A skill's outputModes).")
    idempotent = models.BooleanField(default=True)
    confidence_weight = models.FloatField(default=1.0)
    timeout_ms = models.PositiveIntegerField(default=30000)
    max_retries = models.PositiveIntegerField(default=2)
    avg_latency_ms = models.FloatField(default=0)
    p95_latency_ms = models.FloatField(default=0)
    avg_tokens_per_call = models.PositiveIntegerField(default=0)
    cost_per_call = models.DecimalField(max_digits=12, decimal_places=6, default=0)
    price_per_1k_input_tokens = models.DecimalField(max_digits=12, decimal_places=6, default=0)
    price_per_1k_output_tokens = models.DecimalField(max_digits=12, decimal_places=6, default=0)
    model_name = models.CharField(max_length=120, blank=True)
    is_canary = models.BooleanField(default=False)
    canary_share = models.FloatField(default=0.0, help_text="Share of the capability's traffic (0-1) for a canary.")
    rolled_back = models.BooleanField(default=False)
    source_digest = models.CharField(max_length=64, blank=True, help_text="Digest of the imported descriptor.")
    embedded_with = models.CharField(max_length=200, blank=True)
    submitted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    reviewed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    review_comment = models.TextField(blank=True)
    activated_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["capability", "version"], name="version_unique_per_capability")
        ]
        ordering = ["capability__name", "-created_at"]

    def __str__(self) -> str:
        return f"{self.capability.name}@{self.version}"


class CapabilityVector(models.Model):
    """One embedded text of an ACTIVE capability version. Vectors of different embedders coexist: the column has
    no fixed dimension and each embedder dimension gets its own partial HNSW index (see migrations)."""

    version = models.ForeignKey(CapabilityVersion, on_delete=models.CASCADE, related_name="vectors")
    embedder = models.CharField(max_length=200, db_index=True)
    dim = models.PositiveIntegerField()
    kind = models.CharField(max_length=16, choices=VectorKind.choices)
    position = models.PositiveIntegerField(default=0)
    text = models.TextField()
    embedding = VectorField()

    class Meta:
        indexes = [models.Index(fields=["embedder", "kind"])]

    def __str__(self) -> str:
        return f"{self.kind} #{self.position} of version {self.version_id} ({self.embedder})"


class AuditLog(models.Model):
    """One explicit audit row per change: who, when, what, before/after."""

    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    actor_label = models.CharField(max_length=200, blank=True, help_text="Agent, system task or user name.")
    action = models.CharField(max_length=80, db_index=True)
    target_type = models.CharField(max_length=80)
    target_id = models.CharField(max_length=80)
    target_repr = models.CharField(max_length=300, blank=True)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    request_id = models.CharField(max_length=100, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["target_type", "target_id"])]

    def __str__(self) -> str:
        return f"{self.action} {self.target_repr}"
