"""After the call: what http-async agents report on tasks they ACKed, by callback or when polled, and what A2A
agents push about the async tasks they took (``task_a2a_push``)."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

import httpx
from django.conf import settings
from django.utils import timezone
from django.utils.crypto import constant_time_compare

from reach_platform import engine, jsonsafe, netguard
from reach_platform.errors import ApplicationError, InvalidInput, NotFound, PermissionDenied
from registry.choices import Transport
from registry.models import Instance
from registry.services import agent_networks
from routing import a2a_transport
from routing.choices import AttemptOutcome, TaskStatus
from routing.models import Task
from routing.schemas import validator_for
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
    left alone. A2A tasks followed by push that have not moved for A2A_QUIET_S are read with ``GetTask`` (at most
    once per A2A_QUIET_S each): pushes are best effort. Returns how many reports changed a task."""
    rows = await engine.db(_waiting, limit)
    quiet = await engine.db(_a2a_quiet, limit)
    gate = asyncio.Semaphore(int(settings.REACH["POLL_CONCURRENCY"]))
    results = await asyncio.gather(*(_poll_one(row, gate) for row in rows), *(_read_a2a(row, gate) for row in quiet))
    return sum(results)


def tasks_poll(*, limit: int = 500) -> int:
    return engine.run(poll(limit=limit))


# --- A2A push notifications ---------------------------------------------------------------------------------

_PUSH_KINDS = ("task", "statusUpdate", "artifactUpdate")  # an A2A v1.0 StreamResponse, as a2a-sdk pushes it
_A2A_WAITING = (TaskStatus.ACCEPTED, TaskStatus.RUNNING)


def task_a2a_report(*, task: Task, a2a_task: dict, source: str) -> Task:
    """Apply an A2A agent's task (pushed, or read after the attempt) to our task, through the state machine as an
    http-async agent's report is: working -> RUNNING; completed -> SUCCEEDED with its artifacts as the result
    (checked against the version's output_schema); input-required -> INPUT_REQUIRED with the question (the
    caller answers through the invoke API); failed, rejected, cancelled, auth-required -> FAILED."""
    state = (a2a_task.get("status") or {}).get("state", "")
    if state in ("TASK_STATE_SUBMITTED", "TASK_STATE_WORKING", ""):
        return task_agent_report(task=task, status="running", source=source)
    outcome, value, error = a2a_transport.outcome_of_task(a2a_task)
    if outcome == AttemptOutcome.SUCCESS:
        schema = task.version.output_schema if task.version_id and task.version else None
        problems = [e.message for e in validator_for(schema).iter_errors(value)] if schema else []
        if problems:
            return task_agent_report(task=task, status="failed", source=source,
                                     error=f"the agent's result breaks output_schema: {problems[0]}"[:300])
        return task_agent_report(task=task, status="succeeded", result=value, source=source)
    if outcome == AttemptOutcome.INPUT_REQUIRED:
        if task.status not in _A2A_WAITING:
            return task
        turn = ((task.options or {}).get("a2a") or {})
        timeline = Timeline(task)
        timeline.move(TaskStatus.INPUT_REQUIRED, reported_by=source)
        task.result = {"question": value.get("question", ""),
                       **({"data": value["data"]} if value.get("data") else {})}
        task.options = {**(task.options or {}), "a2a": {**turn, "task_id": value.get("task_id") or turn.get("task_id"),
                                                        "context_id": value.get("context_id") or turn.get("context_id")}}
        timeline.commit(fields=["result", "options"], expect=list(_A2A_WAITING))
        return task
    return task_agent_report(task=task, status="failed", error=error, source=source)


def _pushed_task_id(event: dict) -> tuple[str, dict, str]:
    kinds = [k for k in _PUSH_KINDS if isinstance(event.get(k), dict)]
    if len(kinds) != 1:
        raise InvalidInput("A push is one A2A StreamResponse: exactly one of task, statusUpdate, artifactUpdate.",
                           code="invalid_push")
    body = event[kinds[0]]
    task_id = body.get("id") if kinds[0] == "task" else body.get("taskId")
    if not isinstance(task_id, str) or not task_id:
        raise InvalidInput("The pushed event names no task id.", code="invalid_push")
    return kinds[0], body, task_id


def task_a2a_push(*, task_pk: int, instance_pk: int, token: str, event) -> Task:
    """An A2A agent pushes an update on one of our async tasks (``POST /a2a-push/<task>/<instance>``).

    Only the instance the task was sent to may push: the token must be the one the gateway made for this task and
    instance (``a2a_transport.push_token``), the instance must still be the registered card's JSON-RPC URL and the
    card unflagged, and the task must be the one sent there (its instance, agent and A2A task id). A task whose
    attempt is not recorded yet is left alone (the attempt reads the agent's task once it is); a repeated, late
    or out-of-order push changes nothing (the state machine's compare-and-set)."""
    if not token or not constant_time_compare(token, a2a_transport.push_token(task_pk, instance_pk)):
        raise PermissionDenied("This push token is not the one given for this task.", code="bad_push_token")
    if not isinstance(event, dict):
        raise InvalidInput("A push body is a JSON object (an A2A StreamResponse).", code="invalid_push")
    kind, body, task_id = _pushed_task_id(event)
    row = Task.objects.select_related("version").filter(pk=task_pk).first()
    if row is None:
        raise NotFound("No such task.")
    instance = Instance.objects.select_related("agent__a2a_card").filter(pk=instance_pk).first()
    card = getattr(instance.agent, "a2a_card", None) if instance is not None else None
    if instance is None or card is None or card.flagged or instance.url != card.rpc_url:
        raise PermissionDenied("The pushing instance is not a registered A2A agent in good standing.",
                               code="not_your_task")
    sent = (row.options or {}).get("a2a") or {}
    if row.instance_id is None:
        return row  # the attempt is not recorded yet: it reads the agent's task itself once it is
    if row.instance_id != instance.pk or row.agent_endpoint != instance.agent.endpoint_id \
            or (sent.get("task_id") and sent["task_id"] != task_id):
        raise PermissionDenied("Only the agent this task was sent to may push on it.", code="not_your_task")
    if row.status not in _A2A_WAITING or kind == "artifactUpdate":
        return row  # settled already, or a partial artifact (the completed task carries them all)
    a2a_task = body if kind == "task" else {"id": task_id, "contextId": body.get("contextId", ""),
                                            "status": body.get("status") or {}}
    state = (a2a_task.get("status") or {}).get("state", "")
    if kind == "statusUpdate" and state in a2a_transport.TERMINAL | a2a_transport.INTERRUPTED:
        # a status update carries no artifacts: read the whole task from the registered instance
        a2a_task = a2a_transport.get_task_sync(instance.url, task_id) or a2a_task
    return task_a2a_report(task=row, a2a_task=a2a_task, source=f"push:{instance.agent.endpoint_id}")


# An A2A task followed by push that has not moved for this long is read once with GetTask (a lost push costs
# this much latency, never the outcome); then again at most this often.
A2A_QUIET_S = 60.0


def _a2a_quiet(limit: int) -> list[Task]:
    cutoff = timezone.now() - timedelta(seconds=A2A_QUIET_S)
    return list(Task.objects.filter(status__in=_A2A_WAITING, instance__transport=Transport.A2A,
                                    options__a2a__push=True, updated_at__lt=cutoff)
                .select_related("instance").order_by("updated_at")[:limit])


async def _read_a2a(row: Task, gate: asyncio.Semaphore) -> bool:
    task_id = ((row.options or {}).get("a2a") or {}).get("task_id")
    if row.instance is None or not task_id:
        return False
    if not await engine.redis().set(f"reach:a2a-read:{row.pk}", "1", nx=True, ex=int(A2A_QUIET_S)):
        return False  # read less than A2A_QUIET_S ago
    async with gate:
        a2a_task = await a2a_transport.get_task(row.instance.url, task_id)
    if a2a_task is None:
        return False
    before = row.status
    after = await engine.db(task_a2a_report, task=row, a2a_task=a2a_task, source=f"read:{row.agent_endpoint}")
    return after.status != before


async def a2a_follow_up(row: Task) -> Task:
    """Right after an A2A task was recorded ACCEPTED: read it once, so that what the agent did (and pushed) before
    that was written is not lost."""
    task_id = ((row.options or {}).get("a2a") or {}).get("task_id")
    instance_pk = row.instance_id
    if not task_id or instance_pk is None:
        return row
    instance = await engine.db(lambda: Instance.objects.filter(pk=instance_pk).first())
    if instance is None:
        return row
    a2a_task = await a2a_transport.get_task(instance.url, task_id)
    if a2a_task is None:
        return row
    return await engine.db(task_a2a_report, task=row, a2a_task=a2a_task, source=f"read:{row.agent_endpoint}")
