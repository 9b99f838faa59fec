"""After the call: what http-async agents report on tasks they ACKed, by callback or when polled."""

from __future__ import annotations

import asyncio
import logging

import httpx
from django.conf import settings

from reach_platform import engine, jsonsafe, netguard
from reach_platform.errors import ApplicationError, NotFound, PermissionDenied
from registry.models import Instance
from registry.services import agent_networks
from routing.choices import TaskStatus
from routing.models import Task
from routing.transitions import Timeline

logger = logging.getLogger(__name__)

_AGENT_REPORTS = {"running": TaskStatus.RUNNING, "succeeded": TaskStatus.SUCCEEDED, "failed": TaskStatus.FAILED}
_REPORTABLE = {TaskStatus.RUNNING: [TaskStatus.ACCEPTED],
               TaskStatus.SUCCEEDED: [TaskStatus.ACCEPTED, TaskStatus.RUNNING],
               TaskStatus.FAILED: [TaskStatus.ACCEPTED, TaskStatus.RUNNING]}


def task_callback(*, entry, request_id: str, status: str, result=None, error: str = "") -> Task:
    """An http-async agent reports progress. Only the instance the task was sent to may report: the same
    endpoint id *and* environment (a staging key of the same endpoint id may not complete a dev task). The
    agent names the task by the id it was sent (the task's ``key``)."""
    row = Task.objects.filter(key=request_id).first()
    if row is None:
        raise NotFound(f"No task with request_id '{request_id}'.")
    sent_to = row.instance_id is not None and Instance.objects.filter(
        pk=row.instance_id, agent__endpoint_id=entry.endpoint_id, agent__environment_id=entry.environment_id).exists()
    if row.agent_endpoint != entry.endpoint_id or not sent_to:
        raise PermissionDenied("Only the agent this task was sent to may report on it.", code="not_your_task")
    return task_agent_report(task=row, status=status, result=result, error=error, source=entry.endpoint_id)


def task_agent_report(*, task: Task, status: str, result=None, error: str = "", source: str) -> Task:
    """Apply an async agent's report (callback or poll): ACCEPTED -> RUNNING -> SUCCEEDED | FAILED; a repeated,
    late or out-of-order report changes nothing (the state machine's compare-and-set)."""
    target = _AGENT_REPORTS[status]
    if task.status not in _REPORTABLE[target]:
        return task
    timeline = Timeline(task)
    timeline.move(target, reported_by=source)
    if target == TaskStatus.SUCCEEDED:
        task.result = result
    if target == TaskStatus.FAILED:
        task.error = {"code": "agent_failed", "message": error or "the agent reported a failure"}
    timeline.commit(fields=["result", "error"], expect=_REPORTABLE[target])
    return task


def _waiting(limit: int) -> list[Task]:
    return list(Task.objects.filter(status__in=[TaskStatus.ACCEPTED, TaskStatus.RUNNING],
                                    instance__status_url__gt="")
                .select_related("instance").order_by("updated_at")[:limit])


async def _poll_one(row: Task, gate: asyncio.Semaphore) -> bool:
    if row.instance is None:
        return False
    async with gate:
        try:  # the status URL is resolved, checked and connected to as one (the agents' address guard)
            response = await netguard.arequest("GET", row.instance.status_url, allowed_networks=agent_networks(),
                                               client=engine.http(), params={"request_id": row.key},
                                               headers={"X-Reach-Request-Id": row.key}, what="status_url",
                                               timeout=float(settings.REACH["POLL_TIMEOUT_S"]))
            report = jsonsafe.parse_json(response.content) if response.status_code == 200 else {}
        except (httpx.HTTPError, ApplicationError):
            return False
    if not isinstance(report, dict) or report.get("status") not in _AGENT_REPORTS:
        return False
    before = row.status
    after = await engine.db(task_agent_report, task=row, status=report["status"], result=report.get("result"),
                            error=str(report.get("error") or ""), source=f"poll:{row.agent_endpoint}")
    return after.status != before


async def poll(*, limit: int = 500) -> int:
    """Poll the status URLs of http-async agents that declare one, for the tasks they ACKed and have not
    finished: concurrently, at most POLL_CONCURRENCY at a time, each within POLL_TIMEOUT_S. The agent answers
    ``{"status": "running" | "succeeded" | "failed", "result"?, "error"?}``; a task still ``accepted`` there is
    left alone. Returns how many reports changed a task."""
    rows = await engine.db(_waiting, limit)
    gate = asyncio.Semaphore(int(settings.REACH["POLL_CONCURRENCY"]))
    results = await asyncio.gather(*(_poll_one(row, gate) for row in rows))
    return sum(results)


def tasks_poll(*, limit: int = 500) -> int:
    return engine.run(poll(limit=limit))
