"""Prometheus metrics (served at /metrics to admins or with REACH_METRICS_TOKEN)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

INVOKES = Counter("reach_invokes_total", "Invokes by outcome and agent", ["outcome", "agent"])
RESOLVE_SECONDS = Histogram("reach_resolve_seconds", "Resolve latency",
                            buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1))
CALL_SECONDS = Histogram("reach_agent_call_seconds", "Agent call latency per attempt", ["agent", "outcome"],
                         buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
QUOTA_REFUSALS = Counter("reach_quota_refusals_total", "429 answers", ["scope"])
BUDGET_WARNINGS = Counter("reach_budget_warnings_total", "Invokes past a budget's warn ratio", ["scope"])
BUDGET_REFUSALS = Counter("reach_budget_refusals_total", "402 answers", ["scope"])


def metrics_view(request):
    """Prometheus text format. Admin sessions, or ``Authorization: Bearer $REACH_METRICS_TOKEN``."""
    import hmac
    import os

    from django.http import HttpResponse
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    token = os.environ.get("REACH_METRICS_TOKEN", "")
    header = request.headers.get("Authorization", "")
    from registry.permissions import can_read_metrics

    user = getattr(request, "user", None)
    allowed = (user is not None and user.is_authenticated and can_read_metrics(user)) \
        or (token and hmac.compare_digest(header, f"Bearer {token}"))
    if not allowed:
        return HttpResponse("metrics need an admin session or the metrics token\n", status=403)
    _refresh_gauges()
    return HttpResponse(generate_latest(), content_type=CONTENT_TYPE_LATEST)


from prometheus_client import Gauge  # noqa: E402

MANUAL_REVIEW = Gauge("reach_manual_review_waiting", "Tasks waiting in the manual review queue")
DEAD_LETTERS = Gauge("reach_dead_letters", "Dead-lettered callback deliveries")
OUTBOX_BACKLOG = Gauge("reach_outbox_backlog", "Callback deliveries not yet delivered")
BREAKERS_OPEN = Gauge("reach_breakers_open", "Instances whose circuit breaker is open")
INSTANCES = Gauge("reach_instances", "Registered instances by liveness", ["liveness"])


def _refresh_gauges() -> None:
    from registry.generation import redis_client
    from registry.models import Instance
    from routing.models import CallbackDelivery, Task

    MANUAL_REVIEW.set(Task.objects.filter(status="manual_review").count())
    DEAD_LETTERS.set(CallbackDelivery.objects.filter(status="dead").count())
    OUTBOX_BACKLOG.set(CallbackDelivery.objects.filter(status="pending").count())
    BREAKERS_OPEN.set(sum(1 for _ in redis_client().scan_iter("reach:breaker:*:open")))
    for liveness in ("online", "suspect", "offline"):
        INSTANCES.labels(liveness=liveness).set(
            Instance.objects.filter(deregistered_at__isnull=True, liveness=liveness).count())
