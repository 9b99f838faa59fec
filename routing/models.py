"""Requests and what happened to them: tasks, their event timeline, attempts, and the resolver's calibration."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from registry.models import CapabilityVersion, Instance
from routing.choices import AttemptOutcome, Mode, ReviewReason, TaskStatus


class Task(models.Model):
    """One caller request, keyed by its idempotency key ``request_id``, which is the caller's own: unique per
    caller, so one caller cannot take another's ids. ``key`` is the task's id everywhere else (agents, their
    callbacks and status URLs, the review queue, the ledger): the request_id itself when no other caller's task
    holds it, else the request_id with a suffix. Holds the decision and the outcome."""

    request_id = models.CharField(max_length=100)
    key = models.CharField(max_length=100)
    # indexed by task_request_id_per_caller, whose first column it is
    caller = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+",
                               db_index=False)
    status = models.CharField(max_length=24, choices=TaskStatus.choices, default=TaskStatus.PENDING)
    fallback = models.BooleanField(default=False, help_text="A later candidate answered.")
    mode = models.CharField(max_length=8, choices=Mode.choices, default=Mode.SYNC)
    capability_requested = models.CharField(max_length=120, blank=True)
    task_text = models.TextField(blank=True)
    text_hash = models.CharField(max_length=32, blank=True)
    payload = models.JSONField(default=dict, blank=True)
    callback_url = models.URLField(max_length=500, blank=True)
    user_key = models.CharField(max_length=200, blank=True)
    top_k = models.PositiveSmallIntegerField(default=3)
    decision = models.JSONField(default=dict, blank=True, help_text="Decision, score breakdown and reasons.")
    version = models.ForeignKey(CapabilityVersion, null=True, blank=True, on_delete=models.SET_NULL,
                                related_name="tasks")
    instance = models.ForeignKey(Instance, null=True, blank=True, on_delete=models.SET_NULL, related_name="tasks")
    # Denormalised at routing time so that answers and lists need no joins.
    agent_endpoint = models.CharField(max_length=100, blank=True)
    capability_label = models.CharField(max_length=170, blank=True, help_text="capability@version")
    result = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    attempts_count = models.PositiveSmallIntegerField(default=0)
    retry_budget = models.PositiveSmallIntegerField(default=3)
    depth = models.PositiveSmallIntegerField(default=0)
    call_path = models.JSONField(default=list, blank=True)
    trace_id = models.CharField(max_length=64, blank=True)
    parent_request_id = models.CharField(max_length=100, blank=True)
    options = models.JSONField(default=dict, blank=True, help_text="Routing options kept for async execution.")
    review_reason = models.CharField(max_length=16, choices=ReviewReason.choices, blank=True,
                                     help_text="Why the task is (or was) in the manual review queue.")
    claimed_at = models.DateTimeField(null=True, blank=True, help_text="When a worker took an async task.")
    deadline_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [models.UniqueConstraint(fields=["caller", "request_id"], name="task_request_id_per_caller"),
                       models.UniqueConstraint(fields=["key"], name="task_key_unique")]
        # Every invoke writes a task row twice (the claim, the outcome) and its indexed columns change, so each
        # index costs two entries per invoke. Only what is read is indexed: not the text_hash (nothing looks it
        # up), not review_reason alone (the queue has its own partial index) and none of the ``_like``
        # (varchar_pattern_ops) twins that ``db_index=True`` adds on PostgreSQL for LIKE 'prefix%' lookups, which
        # nothing makes (migration 0014: 19 indexes down to 10).
        indexes = [
            # the review queue (tasks with a review_reason, oldest first): a few out of millions of tasks; with
            # the id included, counting the items that wait is an index-only scan
            models.Index(fields=["created_at"], include=["id"], condition=~models.Q(review_reason=""),
                         name="task_review_queue"),
            models.Index(fields=["status"], name="task_status"),  # the reaper, the outbox, the dashboard
            models.Index(fields=["agent_endpoint"], name="task_agent_endpoint"),  # a team's tasks, the ledger
            models.Index(fields=["trace_id"], name="task_trace_id"),  # one trace's tasks
        ]

    def __str__(self) -> str:
        return self.key

    def save(self, *args, **kwargs) -> None:
        if not self.key:  # the claim (routing.invoke.claim) sets it; elsewhere a task is keyed by its request_id
            self.key = self.request_id
        super().save(*args, **kwargs)


class TaskEvent(models.Model):
    """One state transition (or notable step) of a task, with its time: the timeline."""

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField(db_index=True)
    from_status = models.CharField(max_length=24, blank=True)
    to_status = models.CharField(max_length=24)
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["at", "id"]

    def __str__(self) -> str:
        return f"{self.task_id}: {self.from_status} -> {self.to_status}"


class Attempt(models.Model):
    """One call to one agent instance for a task (retries and fallbacks are attempts too)."""

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="attempts")
    number = models.PositiveSmallIntegerField()
    version = models.ForeignKey(CapabilityVersion, null=True, on_delete=models.SET_NULL, related_name="+")
    instance = models.ForeignKey(Instance, null=True, on_delete=models.SET_NULL, related_name="attempts")
    started_at = models.DateTimeField()
    latency_ms = models.FloatField(default=0)
    timeout_ms = models.FloatField(default=0)
    outcome = models.CharField(max_length=24, choices=AttemptOutcome.choices)
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    error = models.TextField(blank=True)
    is_retry = models.BooleanField(default=False)
    is_fallback = models.BooleanField(default=False)
    usage = models.JSONField(null=True, blank=True)

    class Meta:
        ordering = ["task_id", "number"]
        # the dashboard's latency figures read a time window of attempts
        indexes = [models.Index(fields=["started_at"], name="attempt_started_at_idx")]

    def __str__(self) -> str:
        return f"{self.task_id}#{self.number} {self.outcome}"


class RoutingCalibration(models.Model):
    """The resolver's score scale for one embedder, fitted from what the registry holds (see routing.calibration)."""

    embedder = models.CharField(max_length=200, unique=True)
    params = models.JSONField(default=dict)
    head = models.BinaryField(null=True, blank=True, help_text="The discriminative head (npz), when fitted.")
    capabilities = models.PositiveIntegerField(default=0)
    computed_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"calibration for {self.embedder}"


class CallerSecret(models.Model):
    """The per-caller key that signs callback deliveries (HMAC-SHA256), shown to the caller in the admin."""

    caller = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="reach_secret")
    secret = models.CharField(max_length=100)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"callback secret of {self.caller}"


class A2APushConfig(models.Model):
    """An A2A push-notification config of a caller's task (``CreateTaskPushNotificationConfig``, or inline in
    ``SendMessage``): every change of the task is POSTed to ``url`` through the callback outbox. Keyed by the
    caller and the A2A task id (our request_id), so a config sent with the message that creates the task exists
    before the task's first change."""

    caller = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    task_request_id = models.CharField(max_length=100)
    config_id = models.CharField(max_length=100)
    url = models.URLField(max_length=500)
    token = models.CharField(max_length=500, blank=True, help_text="Sent as X-A2A-Notification-Token.")
    auth_scheme = models.CharField(max_length=40, blank=True)
    auth_credentials = models.CharField(max_length=1000, blank=True, help_text="Sent as Authorization.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["caller", "task_request_id", "config_id"],
                                               name="a2a_push_config_unique")]
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"push config {self.config_id} of {self.task_request_id}"


class CallbackDelivery(models.Model):
    """Outbox row: written in the same transaction as the task's change (its terminal state for a callback_url,
    every change for an A2A push config), delivered by a worker."""

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        DELIVERED = "delivered", "Delivered"
        DEAD = "dead", "Dead-lettered"

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="deliveries")
    url = models.URLField(max_length=500)
    body = models.JSONField()
    push_config = models.ForeignKey(A2APushConfig, null=True, blank=True, on_delete=models.CASCADE,
                                    related_name="deliveries",
                                    help_text="The A2A push config this delivers for (its token and credentials "
                                              "are sent as headers); deleting the config drops what is pending.")
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.PENDING, db_index=True)
    attempts = models.PositiveSmallIntegerField(default=0)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    next_attempt_at = models.DateTimeField(null=True, blank=True, db_index=True,
                                           help_text="When the next try is due (the outbox sweep restarts late ones).")
    delivered_at = models.DateTimeField(null=True, blank=True)
    dead_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name_plural = "callback deliveries"

    def __str__(self) -> str:
        return f"callback for {self.task_id} ({self.status})"


class Schedule(models.Model):
    """A cron (or fixed-interval) entry that invokes a capability or a task text with a payload. Each run is a
    normal task (parent_request_id ``schedule:<id>``). Kept in step with a django-celery-beat PeriodicTask."""

    name = models.CharField(max_length=120, unique=True)
    enabled = models.BooleanField(default=True)
    cron = models.CharField(max_length=120, blank=True, help_text="Five fields: minute hour day month weekday.")
    every_seconds = models.PositiveIntegerField(null=True, blank=True, help_text="Instead of cron.")
    capability = models.CharField(max_length=120, blank=True)
    task_text = models.TextField(blank=True)
    payload = models.JSONField(default=dict, blank=True)
    caller = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+",
                               help_text="Whose quotas and budget the runs use.")
    periodic_task = models.OneToOneField("django_celery_beat.PeriodicTask", null=True, blank=True,
                                         on_delete=models.SET_NULL, related_name="+", editable=False)
    last_run_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.name


class AgentSession(models.Model):
    """A conversation of one caller's user (``user_key``) with one agent: it sticks to one instance while open and
    closes after SESSION_IDLE_S without activity (seed incident: leaked sessions exhausted an agent)."""

    caller = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.CASCADE, related_name="+")
    user_key = models.CharField(max_length=200)
    agent_endpoint = models.CharField(max_length=100)
    instance = models.ForeignKey(Instance, null=True, on_delete=models.SET_NULL, related_name="sessions")
    opened_at = models.DateTimeField(auto_now_add=True)
    last_activity_at = models.DateTimeField(db_index=True)
    closed_at = models.DateTimeField(null=True, blank=True, db_index=True)
    close_reason = models.CharField(max_length=40, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["caller", "user_key", "agent_endpoint"],
                                               condition=models.Q(closed_at__isnull=True),
                                               name="one_open_session_per_user_and_agent")]

    def __str__(self) -> str:
        return f"{self.user_key} @ {self.agent_endpoint}"
