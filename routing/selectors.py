"""Reads of tasks, shared by the API and the admin."""

from __future__ import annotations

from reach_platform.errors import NotFound, PermissionDenied
from routing.models import Task


def task_for_caller(*, request_id: str, caller) -> Task:
    row = Task.objects.filter(request_id=request_id).first()
    if row is None:
        raise NotFound(f"No task with request_id '{request_id}'.")
    if row.caller_id and caller is not None and row.caller_id != caller.pk and not caller.is_staff:
        raise PermissionDenied("This task belongs to another caller.")
    return row
