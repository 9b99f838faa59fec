"""Housekeeping on a timer (Celery beat): tasks stuck past their deadline, idle sessions."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from routing.choices import IN_FLIGHT, TaskStatus
from routing.models import AgentSession, Task
from routing.transitions import Timeline


def tasks_reap(*, now=None) -> int:
    """Fail tasks stuck past their deadline (a lost worker, an async agent that never reported), with the state
    they were stuck in on the timeline, and fire their callbacks. A late outcome after this is discarded by
    the state machine. Returns how many were reaped."""
    now = now or timezone.now()
    reaped = 0
    for row in Task.objects.filter(status__in=(*IN_FLIGHT, TaskStatus.INPUT_REQUIRED), deadline_at__lt=now):
        stuck_in = row.status
        timeline = Timeline(row)
        timeline.move(TaskStatus.FAILED, reason=f"deadline passed while {stuck_in}")
        row.error = {"code": "deadline_exceeded", "message": f"no outcome by the deadline (stuck {stuck_in})"}
        moved = timeline.commit(fields=["error"])
        reaped += moved
        if moved and stuck_in in (TaskStatus.INPUT_REQUIRED, TaskStatus.ACCEPTED, TaskStatus.RUNNING):
            # nobody answers the agent's question, or its pushed outcome never came: its A2A task stops too
            _cancel_a2a_task(row)
    return reaped


def _cancel_a2a_task(row: Task) -> None:
    from routing.a2a_transport import cancel_sync

    task_id = ((row.options or {}).get("a2a") or {}).get("task_id")
    if task_id and row.instance is not None:
        cancel_sync(row.instance.url, task_id)


def sessions_close_idle(*, now=None) -> int:
    """Close sessions idle for SESSION_IDLE_S (30 min): their instance binding is released."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.REACH["SESSION_IDLE_S"])
    return AgentSession.objects.filter(closed_at__isnull=True, last_activity_at__lt=cutoff).update(
        closed_at=now, close_reason="idle")
