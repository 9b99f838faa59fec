"""The invoke path, readable top to bottom:
api view -> task_invoke -> resolver.resolve -> gateway.execute (attempt loop) -> task state + events + attempts."""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Q
from django.utils import timezone

from ledger.services import Price, budget_check, cost_entries_record, cost_entry_for
from reach_platform import jsonsafe, netguard, tracing
from reach_platform.errors import (
    ApplicationError,
    Conflict,
    InvalidInput,
    NotFound,
    PaymentRequired,
    PermissionDenied,
    TooManyRequests,
)
from reach_platform.metrics import BUDGET_REFUSALS, INVOKES, QUOTA_REFUSALS, RESOLVE_SECONDS
from registry.permissions import can_read_any_task
from registry.services import agent_networks
from routing import capacity, gateway, resolver, snapshot
from routing.callbacks import check_callback_url, outbox_enqueue
from routing.choices import SETTLED, TERMINAL, Decision, ReviewReason, TaskStatus
from routing.models import AgentSession, Attempt, Task, TaskEvent
from routing.signals import attempts_recorded, review_item_opened

logger = logging.getLogger(__name__)


@dataclass
class InvokeHeaders:
    """What a nested call carries from the agent that makes it."""

    depth: int = 0
    call_path: tuple[str, ...] = ()
    retry_budget: int | None = None
    trace_id: str = ""
    traceparent: str = ""
    parent_request_id: str = ""


# States without an outcome yet.
STUCK = (TaskStatus.PENDING, TaskStatus.ROUTED, TaskStatus.RUNNING, TaskStatus.ACCEPTED)


class Timeline:
    """Transitions collected during one invoke, written in one batch with the outcome."""

    def __init__(self, task: Task):
        self.task = task
        self.events: list[TaskEvent] = []

    def move(self, to: str, **detail) -> None:
        self.events.append(TaskEvent(task=self.task, at=timezone.now(), from_status=self.task.status,
                                     to_status=to, detail=detail))
        self.task.status = to


def _reach(key: str):
    return settings.REACH[key]


def _trace_from(headers: InvokeHeaders) -> str:
    if headers.trace_id:
        return headers.trace_id[:64]
    if headers.traceparent and len(headers.traceparent.split("-")) == 4:
        return headers.traceparent.split("-")[1]
    return uuid.uuid4().hex


def task_invoke(*, caller, payload: dict, task: str | None = None, capability: str | None = None,
                request_id: str | None = None, mode: str = "sync", callback_url: str = "", top_k: int | None = None,
                user_key: str = "", confirm: str | None = None, action: str | None = None,
                domains: list[str] | None = None, cost_preference: float = 0.0,
                headers: InvokeHeaders | None = None, redispatch_of: str = "") -> Task:
    headers = headers or InvokeHeaders()
    if headers.depth >= _reach("MAX_DEPTH"):
        raise InvalidInput(f"Call depth {headers.depth + 1} exceeds the limit of {_reach('MAX_DEPTH')}.",
                           code="depth_exceeded")
    request_id = request_id or uuid.uuid4().hex
    if callback_url:
        check_callback_url(callback_url)
    budget = _reach("RETRY_BUDGET") if headers.retry_budget is None else min(headers.retry_budget,
                                                                            _reach("RETRY_BUDGET"))
    fields = dict(
        request_id=request_id, caller=caller, mode=mode, capability_requested=capability or "",
        task_text=task or "", payload=payload, callback_url=callback_url, user_key=user_key,
        top_k=top_k or _reach("TOP_K"), retry_budget=budget, depth=headers.depth,
        call_path=list(headers.call_path), trace_id=_trace_from(headers), parent_request_id=headers.parent_request_id,
        deadline_at=timezone.now() + timedelta(seconds=_reach("TASK_DEADLINE_S")),
        options={"action": action, "domains": domains, "cost_preference": cost_preference,
                 "traceparent": headers.traceparent, **({"redispatch_of": redispatch_of} if redispatch_of else {})})
    try:
        if mode == "async":
            with transaction.atomic():
                row = Task.objects.create(**fields)
                TaskEvent.objects.create(task=row, at=row.created_at, from_status="", to_status=TaskStatus.PENDING)
                from routing.tasks import execute_task

                transaction.on_commit(lambda: execute_task.delay(row.pk))
            return row
        row = _claim(fields)
    except IntegrityError:  # a concurrent duplicate won the insert: answer from its outcome
        return _repeat(Task.objects.get(request_id=request_id), caller=caller, confirm=confirm, payload=payload,
                       headers=headers)
    # A sync run writes its PENDING event with the rest of its timeline when it ends (one transaction fewer).
    pending = TaskEvent(task=row, at=row.created_at, from_status="", to_status=TaskStatus.PENDING)
    return _run(row, task=task, capability=capability, payload=payload, action=action, domains=domains,
                cost_preference=cost_preference, traceparent=headers.traceparent, pending_event=pending)


def _claim(fields: dict) -> Task:
    """Insert the task: the unique request_id makes this the claim that lets exactly one of concurrent
    duplicates run. One statement in autocommit; a savepoint inside a caller's transaction, so that a duplicate
    does not break it."""
    if connection.in_atomic_block:
        with transaction.atomic():
            return Task.objects.create(**fields)
    return Task.objects.create(**fields)


def _refusal(exc: ApplicationError) -> dict:
    """The error of a task refused before any agent was called (bad input, quota, budget, cycle): marked so that
    the caller's retry with the same request_id runs again instead of receiving the refusal for good."""
    return {"code": exc.code, "message": exc.message, "refused": True, "http_status": exc.status_code}


def _repeat(row: Task, *, caller, confirm: str | None, payload: dict, headers: InvokeHeaders) -> Task:
    """A request_id seen before: never execute twice. Wait for a running one, then return its stored outcome.
    A sync request refused before any agent was called (nothing ran) is run again, as a retry after a 429 must."""
    if row.caller_id and caller is not None and row.caller_id != caller.pk:
        raise Conflict("This request_id belongs to another caller.", code="request_id_conflict")
    if row.mode == "sync" and row.status == TaskStatus.FAILED and (row.error or {}).get("refused"):
        refused = row.error
        if Task.objects.filter(pk=row.pk, status=TaskStatus.FAILED, error__refused=True).update(
                status=TaskStatus.PENDING, error=None, updated_at=timezone.now()):
            row.status, row.error = TaskStatus.PENDING, None
            retried = TaskEvent(task=row, at=timezone.now(), from_status=TaskStatus.FAILED,
                                to_status=TaskStatus.PENDING, detail={"retried_after": refused.get("code")})
            options = row.options or {}
            return _run(row, task=row.task_text or None, capability=row.capability_requested or None,
                        payload=row.payload, action=options.get("action"), domains=options.get("domains"),
                        cost_preference=options.get("cost_preference") or 0.0, traceparent=headers.traceparent,
                        pending_event=retried)
        row.refresh_from_db()  # another retry took it: wait for that one below
    if confirm and row.status == TaskStatus.NEEDS_CONFIRMATION:
        allowed = {c["capability"] for c in row.decision.get("candidates", [])}
        if confirm not in allowed:
            raise InvalidInput(f"'{confirm}' is not one of the candidates: {', '.join(sorted(allowed))}.")
        if Task.objects.filter(pk=row.pk, status=TaskStatus.NEEDS_CONFIRMATION).update(
                status=TaskStatus.PENDING, capability_requested=confirm):
            TaskEvent.objects.create(task=row, at=timezone.now(), from_status=TaskStatus.NEEDS_CONFIRMATION,
                                     to_status=TaskStatus.PENDING, detail={"confirmed": confirm})
            row.refresh_from_db()
            return _run(row, task=None, capability=confirm, payload=row.payload, action=None, domains=None,
                        cost_preference=0.0, traceparent=headers.traceparent)
    deadline = time.monotonic() + 60
    while row.status not in SETTLED and row.mode == "sync" and time.monotonic() < deadline:
        time.sleep(0.05)
        row.refresh_from_db()
    return row


def task_execute(*, task_id: int) -> str:
    """Carry out an async task in a worker: the same path as a sync invoke.

    Workers ack late, so a worker killed mid-task gets its message redelivered. The task is claimed with a lease:
    a redelivery while the lease runs does nothing; after it, the task is resumed, unless the lost run had
    already called a non-idempotent capability (which may have run): that task fails, never runs twice.
    """
    now = timezone.now()
    lease = timedelta(seconds=_reach("TASK_LEASE_S"))
    claimed = (Task.objects.filter(pk=task_id, status__in=(TaskStatus.PENDING, TaskStatus.ROUTED, TaskStatus.RUNNING))
               .filter(Q(claimed_at__isnull=True) | Q(claimed_at__lt=now - lease)).update(claimed_at=now))
    if not claimed:
        return "claimed or settled"
    row = Task.objects.get(pk=task_id)
    options = row.options or {}
    if row.status != TaskStatus.PENDING:  # a run was lost with its worker
        timeline = Timeline(row)
        if options.get("non_idempotent_started"):
            _finish(row, timeline, TaskStatus.FAILED, error={
                "code": "worker_lost", "message": "the worker was lost during a call to a non-idempotent "
                                                  "capability; it is not run again"})
            return row.status
        TaskEvent.objects.create(task=row, at=now, from_status=row.status, to_status=row.status,
                                 detail={"resumed": "worker lost; running again"})
    try:
        _run(row, task=row.task_text or None, capability=row.capability_requested or None, payload=row.payload,
             action=options.get("action"), domains=options.get("domains"),
             cost_preference=options.get("cost_preference") or 0.0, traceparent=options.get("traceparent", ""))
    except ApplicationError as exc:  # already recorded on the task by _run
        return exc.code
    return Task.objects.values_list("status", flat=True).get(pk=task_id)


def _checkpoint(row: Task, timeline: Timeline, candidates) -> None:
    """Async runs persist RUNNING before calling agents, and whether a non-idempotent capability may be called,
    so that a run lost with its worker is resumed or failed safely (see task_execute)."""
    row.options = {**(row.options or {}),
                   "non_idempotent_started": any(not c.idempotent for c in candidates)}
    with transaction.atomic():
        Task.objects.filter(pk=row.pk).update(status=row.status, options=row.options, decision=row.decision)
        TaskEvent.objects.bulk_create(timeline.events)
    timeline.events = []


_AGENT_REPORTS = {"running": TaskStatus.RUNNING, "succeeded": TaskStatus.SUCCEEDED, "failed": TaskStatus.FAILED}


def task_callback(*, entry, request_id: str, status: str, result=None, error: str = "") -> Task:
    """An http-async agent reports progress. Only the agent the task was sent to may report."""
    row = Task.objects.filter(request_id=request_id).first()
    if row is None:
        raise NotFound(f"No task with request_id '{request_id}'.")
    if row.agent_endpoint != entry.endpoint_id:
        raise PermissionDenied("Only the agent this task was sent to may report on it.", code="not_your_task")
    return task_agent_report(task=row, status=status, result=result, error=error, source=entry.endpoint_id)


def task_agent_report(*, task: Task, status: str, result=None, error: str = "", source: str) -> Task:
    """Apply an async agent's report (callback or poll): ACCEPTED -> RUNNING -> SUCCEEDED | FAILED; a repeated,
    late or out-of-order report changes nothing."""
    target = _AGENT_REPORTS[status]
    allowed_from = {TaskStatus.RUNNING: [TaskStatus.ACCEPTED],
                    TaskStatus.SUCCEEDED: [TaskStatus.ACCEPTED, TaskStatus.RUNNING],
                    TaskStatus.FAILED: [TaskStatus.ACCEPTED, TaskStatus.RUNNING]}[target]
    with transaction.atomic():
        locked = Task.objects.select_for_update().get(pk=task.pk)
        if locked.status not in allowed_from:
            return locked
        timeline = Timeline(locked)
        timeline.move(target, reported_by=source)
        if target == TaskStatus.SUCCEEDED:
            locked.result = result
        if target == TaskStatus.FAILED:
            locked.error = {"code": "agent_failed", "message": error or "the agent reported a failure"}
        locked.save()
        TaskEvent.objects.bulk_create(timeline.events)
        if target in TERMINAL:
            outbox_enqueue(locked)
            if (locked.options or {}).get("redispatch_of"):
                transaction.on_commit(lambda: _settle_origin(locked))
    return locked


def tasks_poll(*, limit: int = 200) -> int:
    """Poll the status URL of http-async agents that declare one, for tasks they ACKed and have not finished.
    The agent answers ``{"status": "running" | "succeeded" | "failed", "result"?, "error"?}``; a task still
    ``accepted`` there is left alone. Returns how many reports were applied."""
    import httpx

    applied = 0
    waiting = (Task.objects.filter(status__in=[TaskStatus.ACCEPTED, TaskStatus.RUNNING], instance__status_url__gt="")
               .select_related("instance").order_by("updated_at")[:limit])
    for row in waiting:
        try:
            response = netguard.request("GET", row.instance.status_url, allowed_networks=agent_networks(),
                                        params={"request_id": row.request_id}, what="status_url",
                                        headers={"X-Reach-Request-Id": row.request_id}, timeout=5)
            report = jsonsafe.parse_json(response.content) if response.status_code == 200 else {}
            report = report if isinstance(report, dict) else {}
        except (httpx.HTTPError, ApplicationError):
            continue
        if report.get("status") in _AGENT_REPORTS:
            before = row.status
            after = task_agent_report(task=row, status=report["status"], result=report.get("result"),
                                      error=str(report.get("error") or ""), source=f"poll:{row.agent_endpoint}")
            applied += after.status != before
    return applied


def _open_session(row: Task, agent: str) -> AgentSession:
    """The caller's open session with ``agent`` for this user_key (opened when there is none)."""
    now = timezone.now()
    session = AgentSession.objects.filter(caller_id=row.caller_id, user_key=row.user_key, agent_endpoint=agent,
                                          closed_at__isnull=True).first()
    if session is None:
        try:
            with transaction.atomic():
                session = AgentSession.objects.create(caller_id=row.caller_id, user_key=row.user_key,
                                                      agent_endpoint=agent, last_activity_at=now)
        except IntegrityError:  # opened concurrently
            session = AgentSession.objects.get(caller_id=row.caller_id, user_key=row.user_key,
                                               agent_endpoint=agent, closed_at__isnull=True)
    return session


def sessions_close_idle(*, now=None) -> int:
    """Close sessions idle for SESSION_IDLE_S (30 min): their instance binding is released."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=_reach("SESSION_IDLE_S"))
    return AgentSession.objects.filter(closed_at__isnull=True, last_activity_at__lt=cutoff).update(
        closed_at=now, close_reason="idle")


# States a person may settle from: waiting for review, or failed on every candidate.
RESOLVABLE = (TaskStatus.MANUAL_REVIEW, TaskStatus.FAILED)


def task_resolve_by_hand(*, task: Task, status: str, result=None, error: dict | None = None, actor=None,
                         via: str = "") -> Task:
    """Settle a task from the review queue (an answer, a rejection or a re-dispatched task's outcome): the
    caller's task completes with it and its callback fires."""
    with transaction.atomic():
        locked = Task.objects.select_for_update().get(pk=task.pk)
        if locked.status not in RESOLVABLE:
            raise Conflict(f"Task {locked.request_id} is {locked.status}, not waiting for review.",
                           code="state_conflict")
        timeline = Timeline(locked)
        detail = {"resolved_by": getattr(actor, "username", None) or "reviewer"}
        if via:
            detail["via"] = via
        timeline.move(status, **detail)
        locked.result = result
        locked.error = error
        locked.save()
        TaskEvent.objects.bulk_create(timeline.events)
        outbox_enqueue(locked)
    return locked


def task_redispatch(*, task: Task, capability: str, actor=None) -> Task:
    """Send a queued task's request to a capability a person chose: a normal async task, linked by
    ``parent_request_id``; when it ends, the original task ends with its outcome (see _settle_origin)."""
    from registry.models import Capability

    if task.status not in RESOLVABLE:
        raise Conflict(f"Task {task.request_id} is {task.status}, not waiting for review.", code="state_conflict")
    if not Capability.objects.filter(name=capability).exists():
        raise InvalidInput(f"Unknown capability '{capability}'.", code="unknown_capability")
    n = Task.objects.filter(parent_request_id=task.request_id, options__redispatch_of=task.request_id).count() + 1
    child = task_invoke(caller=task.caller, payload=task.payload, task=task.task_text or None, capability=capability,
                        request_id=f"{task.request_id[:90]}.r{n}", mode="async",
                        headers=InvokeHeaders(parent_request_id=task.request_id, trace_id=task.trace_id),
                        redispatch_of=task.request_id)
    TaskEvent.objects.create(task=task, at=timezone.now(), from_status=task.status, to_status=task.status,
                             detail={"redispatched_to": capability, "request_id": child.request_id,
                                     "by": getattr(actor, "username", None) or "reviewer"})
    return child


def _settle_origin(row: Task) -> None:
    """A re-dispatched task ended: its original task ends with the same outcome (once)."""
    origin = Task.objects.filter(request_id=row.options["redispatch_of"]).first()
    if origin is None or origin.status not in RESOLVABLE:
        return
    try:
        task_resolve_by_hand(task=origin, status=row.status, result=row.result, error=row.error, via=row.request_id)
    except Conflict:  # settled concurrently
        pass


def tasks_reap(*, now=None) -> int:
    """Fail tasks stuck past their deadline (a lost worker, an async agent that never reported), with the state
    they were stuck in on the timeline, and fire their callbacks. Returns how many were reaped."""
    now = now or timezone.now()
    reaped = 0
    for row in Task.objects.filter(status__in=STUCK, deadline_at__lt=now).only("pk", "status"):
        with transaction.atomic():
            locked = Task.objects.select_for_update().filter(pk=row.pk, status__in=STUCK).first()
            if locked is None:
                continue
            timeline = Timeline(locked)
            stuck_in = locked.status
            timeline.move(TaskStatus.FAILED, reason=f"deadline passed while {stuck_in}")
            locked.error = {"code": "deadline_exceeded", "message": f"no outcome by the deadline (stuck {stuck_in})"}
            locked.save()
            TaskEvent.objects.bulk_create(timeline.events)
            outbox_enqueue(locked)
            reaped += 1
    return reaped


def _run(row: Task, *, task, capability, payload, action, domains, cost_preference, traceparent,
         pending_event: TaskEvent | None = None) -> Task:
    timeline = Timeline(row)
    if pending_event is not None:
        timeline.events.append(pending_event)
    try:
        return _route_and_call(row, timeline, task=task, capability=capability, payload=payload, action=action,
                               domains=domains, cost_preference=cost_preference, traceparent=traceparent)
    except ApplicationError as exc:  # refused before any agent was called: quota, input, cycle, budget, capacity
        _finish(row, timeline, TaskStatus.FAILED, error=_refusal(exc))
        raise


def _route_and_call(row: Task, timeline: Timeline, *, task, capability, payload, action, domains, cost_preference,
                    traceparent) -> Task:
    caller_key = f"caller:{row.caller_id}"
    if not capacity.acquire(caller_key, _reach("CALLER_MAX_CONCURRENCY")):
        QUOTA_REFUSALS.labels(scope="caller").inc()
        raise TooManyRequests("Too many concurrent requests for this caller.", retry_after=1,
                              code="caller_concurrency")
    try:
        wait = capacity.take_token(caller_key, _reach("CALLER_MAX_QPS"))
        if wait > 0:
            QUOTA_REFUSALS.labels(scope="caller").inc()
            raise TooManyRequests("Request rate over this caller's quota.", retry_after=wait, code="caller_rate")
        with RESOLVE_SECONDS.time(), tracing.tracer.start_as_current_span(
                "reach.resolve", context=tracing.parent_context(traceparent),
                attributes={"reach.request_id": row.request_id}):
            resolution = resolver.resolve(task=task, capability=capability, payload=payload, action=action,
                                          domains=domains, top_k=row.top_k, cost_preference=cost_preference)
        row.decision = resolution.as_dict()
        row.text_hash = resolution.text_hash
        if resolution.decision == Decision.CONFIRM:
            timeline.move(TaskStatus.NEEDS_CONFIRMATION, score=row.decision["score"])
            return _finish(row, timeline)
        if resolution.decision == Decision.MANUAL_REVIEW:
            timeline.move(TaskStatus.MANUAL_REVIEW, score=row.decision["score"],
                          reason=row.decision["reasons"][0] if row.decision["reasons"] else "")
            row.review_reason = ReviewReason.LOW_SCORE
            return _finish(row, timeline)
        # loop guard: an agent already on the call path may not be called again (A -> B -> A)
        path = set(row.call_path)
        candidates = [c.version for c in resolution.candidates if c.version.agent not in path]
        if not candidates:
            raise Conflict(f"Call cycle refused: "
                           f"{' -> '.join([*row.call_path, resolution.candidates[0].version.agent])}.",
                           code="cycle_detected")
        if resolution.decision == Decision.EXECUTE and capability is None:
            candidates = candidates[: row.top_k]
        try:
            warnings = budget_check(caller_id=row.caller_id, team_slugs=[c.team for c in candidates])
        except PaymentRequired as exc:
            BUDGET_REFUSALS.labels(scope=(exc.details or {}).get("scope", "?")).inc()
            raise
        if warnings:
            row.decision["budget_warnings"] = warnings
        timeline.move(TaskStatus.ROUTED, agent=candidates[0].agent, capability=candidates[0].capability)
        timeline.move(TaskStatus.RUNNING)
        if row.mode == "async":
            _checkpoint(row, timeline, candidates)
        session = _open_session(row, candidates[0].agent) if row.user_key else None
        ctx = gateway.CallContext(request_id=row.request_id, trace_id=row.trace_id, depth=row.depth,
                                  call_path=row.call_path, budget=row.retry_budget, user_key=row.user_key,
                                  traceparent=traceparent,
                                  sticky_instance_id=session.instance_id if session else None)
        try:
            execution = gateway.execute(candidates=candidates, payload=payload, ctx=ctx)
        except ApplicationError:
            raise  # every capable agent at capacity, nothing called: a refusal, recorded by _run
        except Exception:
            _finish(row, timeline, TaskStatus.FAILED, error={"code": "gateway_error", "message": "unexpected error"})
            raise
        if session is not None and execution.instance:
            AgentSession.objects.filter(pk=session.pk).update(instance_id=execution.instance.id,
                                                              last_activity_at=timezone.now())
        row.retry_budget = execution.budget_left
        row.fallback = execution.fallback
        if execution.version:
            row.version_id = execution.version.id
            row.agent_endpoint = execution.version.agent
            row.capability_label = f"{execution.version.capability}@{execution.version.version}"
        if execution.instance:
            row.instance_id = execution.instance.id
        if execution.ok and execution.accepted:
            timeline.move(TaskStatus.ACCEPTED)
            return _finish(row, timeline, attempts=execution.attempts)
        if execution.ok:
            row.result = execution.result
            return _finish(row, timeline, TaskStatus.SUCCEEDED, attempts=execution.attempts,
                           fallback=execution.fallback)
        row.review_reason = ReviewReason.ALL_FAILED  # every candidate failed: a person may still answer it
        return _finish(row, timeline, TaskStatus.FAILED, error=execution.error, attempts=execution.attempts)
    finally:
        capacity.release(caller_key)


def _cost_entries(row: Task, attempts: list) -> list:
    """One ledger entry per attempt, priced from the routing snapshot (no query)."""
    if not attempts:
        return []
    versions = snapshot.last().versions  # the snapshot that resolved this request: no Redis round trip
    entries = []
    for a in attempts:
        info = versions.get(a.version_id)
        if info is None:
            continue
        price = Price(agent=info.agent, team=info.team, model_name=info.model_name,
                      price_in=Decimal(info.price_in), price_out=Decimal(info.price_out),
                      cost_per_call=Decimal(str(info.cost_per_call)), avg_tokens=info.avg_tokens)
        entries.append(cost_entry_for(price=price, request_id=row.request_id, caller_id=row.caller_id,
                                      version_id=a.version_id, instance_id=a.instance_id, outcome=a.outcome,
                                      usage=a.usage, latency_ms=a.latency_ms, number=a.number, is_retry=a.is_retry,
                                      is_fallback=a.is_fallback, at=a.started_at))
    return entries


# The columns a run changes. The others are written at creation or by compare-and-set updates elsewhere (a
# worker's claim, a confirmation), which saving every column from this process's copy could overwrite.
RUN_FIELDS = ["status", "decision", "text_hash", "review_reason", "retry_budget", "fallback", "version",
              "agent_endpoint", "capability_label", "instance", "result", "error", "attempts_count", "options",
              "updated_at"]


def _finish(row: Task, timeline: Timeline, status: str | None = None, *, error: dict | None = None,
            attempts: list | None = None, fallback: bool = False) -> Task:
    if status:
        detail = {"fallback": True} if fallback else {}
        if error:
            detail["error"] = error.get("code")
        timeline.move(status, **detail)
    if error is not None:
        row.error = error
    attempts = attempts or []
    row.attempts_count = len(attempts)
    with transaction.atomic():
        row.save(update_fields=RUN_FIELDS)
        TaskEvent.objects.bulk_create(timeline.events)
        if row.status in TERMINAL:
            outbox_enqueue(row)
        Attempt.objects.bulk_create([
            Attempt(task=row, number=a.number, version_id=a.version_id, instance_id=a.instance_id,
                    started_at=a.started_at, latency_ms=a.latency_ms, timeout_ms=a.timeout_ms, outcome=a.outcome,
                    status_code=a.status_code, error=a.error, is_retry=a.is_retry, is_fallback=a.is_fallback,
                    usage=a.usage) for a in attempts])
        cost_entries_record(entries=_cost_entries(row, attempts))
        if attempts:
            version_ids = {a.version_id for a in attempts}
            transaction.on_commit(lambda: attempts_recorded.send(sender=Task, version_ids=version_ids))
        if row.review_reason and row.status in (TaskStatus.MANUAL_REVIEW, TaskStatus.FAILED):
            transaction.on_commit(lambda: review_item_opened.send(sender=Task, task_id=row.pk))
        if row.status in TERMINAL and (row.options or {}).get("redispatch_of"):
            transaction.on_commit(lambda: _settle_origin(row))
    INVOKES.labels(outcome=row.status, agent=row.agent_endpoint or "-").inc()
    logger.info("invoke finished", extra={"request_id": row.request_id, "trace_id": row.trace_id,
                                          "status": row.status, "decision": row.decision.get("decision"),
                                          "agent": (row.decision.get("candidates") or [{}])[0].get("agent")})
    return row


def task_for_caller(*, request_id: str, caller) -> Task:
    row = Task.objects.filter(request_id=request_id).first()
    if row is None:
        raise NotFound(f"No task with request_id '{request_id}'.")
    if row.caller_id and caller is not None and row.caller_id != caller.pk and not can_read_any_task(caller):
        raise PermissionDenied("This task belongs to another caller.")
    return row
