"""Tasks settled by people: answers and rejections from the review queue, and re-dispatches to a capability a
reviewer chose (whose outcome settles the original task)."""

from __future__ import annotations

from django.utils import timezone

from reach_platform.errors import Conflict, InvalidInput
from routing.choices import TaskStatus
from routing.invoke import InvokeHeaders, task_invoke
from routing.models import Task, TaskEvent
from routing.transitions import Timeline

# States a person may settle from: waiting for review, or failed on every candidate.
RESOLVABLE = (TaskStatus.MANUAL_REVIEW, TaskStatus.FAILED)


def task_resolve_by_hand(*, task: Task, status: str, result=None, error: dict | None = None, actor=None,
                         via: str = "") -> Task:
    """Settle a task from the review queue (an answer, a rejection or a re-dispatched task's outcome): the
    caller's task completes with it and its callback fires. Of a person and a late agent report, one wins."""
    task.refresh_from_db()
    if task.status not in RESOLVABLE:
        raise Conflict(f"Task {task.request_id} is {task.status}, not waiting for review.", code="state_conflict")
    timeline = Timeline(task)
    detail = {"resolved_by": getattr(actor, "username", None) or "reviewer"}
    if via:
        detail["via"] = via
    timeline.move(status, **detail)
    task.result, task.error = result, error
    if not timeline.commit(fields=["result", "error"]):
        raise Conflict(f"Task {task.request_id} is {task.status}, not waiting for review.", code="state_conflict")
    return task


def task_redispatch(*, task: Task, capability: str, actor=None) -> Task:
    """Send a queued task's request to a capability a person chose: a normal async task, linked by
    ``parent_request_id``; when it ends, the original task ends with its outcome (see settle_origin)."""
    from registry.models import Capability

    if task.status not in RESOLVABLE:
        raise Conflict(f"Task {task.request_id} is {task.status}, not waiting for review.", code="state_conflict")
    if not Capability.objects.filter(name=capability).exists():
        raise InvalidInput(f"Unknown capability '{capability}'.", code="unknown_capability")
    n = Task.objects.filter(parent_request_id=task.key, options__redispatch_of=task.key).count() + 1
    child = task_invoke(caller=task.caller, payload=task.payload, task=task.task_text or None, capability=capability,
                        request_id=f"{task.request_id[:90]}.r{n}", mode="async",
                        headers=InvokeHeaders(parent_request_id=task.key, trace_id=task.trace_id),
                        redispatch_of=task.key)
    TaskEvent.objects.create(task=task, at=timezone.now(), from_status=task.status, to_status=task.status,
                             detail={"redispatched_to": capability, "request_id": child.request_id, "key": child.key,
                                     "by": getattr(actor, "username", None) or "reviewer"})
    return child


def settle_origin(row: Task) -> None:
    """A re-dispatched task ended: its original task ends with the same outcome (once)."""
    origin = Task.objects.filter(key=row.options["redispatch_of"]).first()
    if origin is None or origin.status not in RESOLVABLE:
        return
    try:
        task_resolve_by_hand(task=origin, status=row.status, result=row.result, error=row.error, via=row.key)
    except Conflict:  # settled concurrently (a reviewer answered it meanwhile)
        pass
