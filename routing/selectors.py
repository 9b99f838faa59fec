"""Reads of tasks, shared by the API and the admin: a task for its caller; and for the operations dashboard,
invokes by outcome and agent, attempt latency, the hourly series and the callback outbox. Every query is bounded by a time window on an indexed column (or a status index), and
``endpoints`` (None: every agent) restricts it to some agents, for team members."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import BooleanField, Case, Count, Q, QuerySet, When
from django.db.models.functions import TruncHour

from ledger.selectors import Percentile
from reach_platform.errors import NotFound
from registry.permissions import can_read_any_task
from routing.choices import AttemptOutcome, TaskStatus
from routing.models import Attempt, CallbackDelivery, Task

FAILED = (TaskStatus.FAILED, TaskStatus.DEAD_LETTERED)
OK_ATTEMPTS = (AttemptOutcome.SUCCESS, AttemptOutcome.ACCEPTED)


def _tasks(since: datetime, endpoints: list[str] | None) -> QuerySet[Task]:
    qs = Task.objects.filter(created_at__gte=since)
    return qs if endpoints is None else qs.filter(agent_endpoint__in=endpoints)


def task_counts(*, since: datetime, recent_since: datetime, endpoints: list[str] | None = None) -> list[dict]:
    """The tasks created since ``since`` counted by agent endpoint, status, hour and whether they are recent
    (created since ``recent_since``): one scan serves every count of the dashboard (by outcome, by agent, per
    hour, for the last hour and the last day)."""
    return [dict(row) for row in _tasks(since, endpoints).order_by()
                .annotate(hour=TruncHour("created_at"),
                          recent=Case(When(created_at__gte=recent_since, then=True), default=False,
                                      output_field=BooleanField()))
                .values("agent_endpoint", "status", "hour", "recent").annotate(n=Count("id"))]


def attempt_latency_by_agent(*, since: datetime, endpoints: list[str] | None = None) -> dict[str, dict]:
    """{agent endpoint: {attempts, ok, p50, p95}} over the attempts started since ``since``."""
    qs = Attempt.objects.filter(started_at__gte=since)
    if endpoints is not None:
        qs = qs.filter(instance__agent__endpoint_id__in=endpoints)
    rows = (qs.order_by().values("instance__agent__endpoint_id").annotate(
        attempts=Count("id"), ok=Count("id", filter=Q(outcome__in=OK_ATTEMPTS)),
        p50=Percentile("latency_ms", 0.5), p95=Percentile("latency_ms", 0.95)))
    return {row["instance__agent__endpoint_id"] or "": {k: row[k] for k in ("attempts", "ok", "p50", "p95")}
            for row in rows}


def attempt_latency(*, since: datetime, endpoints: list[str] | None = None) -> dict:
    """{p50, p95} over every attempt started since ``since``."""
    qs = Attempt.objects.filter(started_at__gte=since)
    if endpoints is not None:
        qs = qs.filter(instance__agent__endpoint_id__in=endpoints)
    return qs.aggregate(p50=Percentile("latency_ms", 0.5), p95=Percentile("latency_ms", 0.95))


def outbox_counts(*, endpoints: list[str] | None = None) -> dict[str, int]:
    """Callback deliveries waiting to go out (pending) and dead-lettered ones."""
    qs = CallbackDelivery.objects.filter(status__in=[CallbackDelivery.Status.PENDING, CallbackDelivery.Status.DEAD])
    if endpoints is not None:
        qs = qs.filter(task__agent_endpoint__in=endpoints)
    counts = {row["status"]: row["n"] for row in qs.order_by().values("status").annotate(n=Count("id"))}
    return {"pending": counts.get("pending", 0), "dead": counts.get("dead", 0)}


def task_for_caller(*, request_id: str, caller: Any) -> Task:
    """A caller's task by the caller's own request_id; those who may read any task also find any by its key.
    Another caller's request_id is not found (request_ids are per caller: nothing tells that it exists)."""
    row = Task.objects.filter(caller=caller, request_id=request_id).first() if caller is not None else None
    if row is None and can_read_any_task(caller):
        row = Task.objects.filter(key=request_id).first()
    if row is None:
        raise NotFound(f"No task with request_id '{request_id}'.")
    return row
