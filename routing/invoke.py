"""The invoke path, in call order: admit -> resolve -> execute -> record.

Every way a task runs comes through ``run``: a sync invoke (the ASGI fast lane or the DRF view), an async task
in a worker (``run_queued``), a confirmation, a retry after a refusal, a re-dispatch from the review queue and
a schedule's firing (both async tasks). The agent calls and every wait are awaited on the engine loop
(``reach_platform.engine``); the few database statements (the claim, the outcome) run in its database threads.

    invoke()            claim the request_id (one INSERT) or answer a repeat of it (_repeat)
    run()
      admit             the caller's concurrency and rate quotas (one Redis round trip)
      _plan()           resolve, the loop guard and the budget; async runs checkpoint RUNNING
      gateway.execute   the attempt loop over the candidates (awaited)
      _record()         outcome, timeline, attempts and cost entries in one compare-and-set transaction
"""

from __future__ import annotations

import asyncio
import logging
import random
import secrets
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from functools import cache, partial

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from ledger.services import Price, budget_check, budgets_known_absent, cost_entry_for
from reach_platform import engine, tracing
from reach_platform.errors import (
    ApplicationError,
    Conflict,
    InvalidInput,
    PaymentRequired,
    TooManyRequests,
)
from reach_platform.metrics import BUDGET_REFUSALS, INVOKES, QUOTA_REFUSALS, RESOLVE_SECONDS
from routing import admission, gateway, lifecycle, resolver, rowsql, snapshot, waiting
from routing.callbacks import check_callback_url
from routing.choices import Decision, ReviewReason, TaskStatus
from routing.models import AgentSession, Attempt, Task, TaskEvent
from routing.resolver import Resolution
from routing.transitions import Deferred, Timeline

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


def _reach(key: str):
    return settings.REACH[key]


def random_id() -> str:
    """128 random bits as hex, for ids that must be unique but not secret (a trace id, a default request_id):
    ``uuid4`` asks the kernel for them on every call, which showed in the invoke path's profile."""
    return f"{random.getrandbits(128):032x}"


def _trace_from(headers: InvokeHeaders) -> str:
    if headers.trace_id:
        return headers.trace_id[:64]
    if headers.traceparent and len(headers.traceparent.split("-")) == 4:
        return headers.traceparent.split("-")[1]
    return random_id()


# --- invoke: claim or repeat ------------------------------------------------------------------------------

def task_fields(*, caller, payload: dict, task: str | None = None, capability: str | None = None,
                request_id: str | None = None, mode: str = "sync", callback_url: str = "", top_k: int | None = None,
                user_key: str = "", action: str | None = None, domains: list[str] | None = None,
                cost_preference: float = 0.0, headers: InvokeHeaders | None = None,
                redispatch_of: str = "", door: str = "") -> dict:
    """The new task's columns, after the checks that need no database. ``door`` names the front door that is
    not our REST API (``a2a``: its changes are streamed and pushed, ``routing.a2a_push``)."""
    headers = headers or InvokeHeaders()
    if headers.depth >= _reach("MAX_DEPTH"):
        raise InvalidInput(f"Call depth {headers.depth + 1} exceeds the limit of {_reach('MAX_DEPTH')}.",
                           code="depth_exceeded")
    budget = _reach("RETRY_BUDGET") if headers.retry_budget is None else min(headers.retry_budget,
                                                                            _reach("RETRY_BUDGET"))
    return dict(
        request_id=request_id or random_id(), caller=caller, mode=mode, capability_requested=capability or "",
        task_text=task or "", payload=payload, callback_url=callback_url, user_key=user_key,
        top_k=top_k or _reach("TOP_K"), retry_budget=budget, depth=headers.depth,
        call_path=list(headers.call_path), trace_id=_trace_from(headers), parent_request_id=headers.parent_request_id,
        deadline_at=timezone.now() + timedelta(seconds=_reach("TASK_DEADLINE_S")),
        options={"action": action, "domains": domains, "cost_preference": cost_preference,
                 "traceparent": headers.traceparent, **({"redispatch_of": redispatch_of} if redispatch_of else {}),
                 **({"door": door} if door else {})})


def claim(fields: dict) -> tuple[Task, bool]:
    """Insert the task: the request_id unique per caller makes this the claim that lets exactly one of
    concurrent duplicates run. Returns (task, created); a duplicate gets the existing task. The task's ``key``
    is its request_id unless another caller's task holds that already (then a suffixed one: the ids of one
    caller never block another's). An async task's PENDING event is written by the same statement and the task
    is queued for a worker when it commits; a sync task's PENDING event is written with the rest of its timeline
    when its run ends (one write fewer). One prepared statement (``routing.rowsql``)."""
    if fields["callback_url"]:
        check_callback_url(fields["callback_url"])  # resolves the host: done here, off the event loop
    for row in _keyed(fields):
        claimed = rowsql.rows_json(Task, [row])
        inserted = rowsql.fetch(_CLAIM_SQL[row.mode == "async"], [claimed])
        if inserted:
            return _claimed(row, inserted[0][0], claimed), True
        if (mine := _own_task(fields)) is not None:  # a concurrent duplicate won the insert: answer from it
            return mine, False
    raise _no_key()


async def claim_on_loop(fields: dict) -> tuple[Task, bool]:
    """``claim`` awaited on the engine loop (a sync task without a callback_url: nothing to resolve or queue)."""
    if fields["callback_url"] or fields["mode"] == "async" or engine.in_caller_thread():
        return await engine.db(claim, fields)
    for row in _keyed(fields):
        inserted = await rowsql.afetch(_CLAIM_SQL[False], [rowsql.rows_json(Task, [row])])
        if inserted:
            return _claimed(row, inserted[0][0]), True
        if (mine := await engine.db(_own_task, fields)) is not None:
            return mine, False
    raise _no_key()


def _keyed(fields: dict):
    """The new task under each key it may take, in turn (one instance, its key changed for the next try)."""
    row = rowsql.build(Task, **fields, key=fields["request_id"])
    yield row
    row.key = f"{fields['request_id'][:88]}~{getattr(fields['caller'], 'pk', 0)}"
    yield row
    row.key = f"{fields['request_id'][:88]}~{secrets.token_hex(5)}"  # drawn only when both keys are taken
    yield row


CARRIED_ROW_MAX = 16_384  # bytes of a claimed async task's row that its Celery message carries (``run_queued``)


def _claimed(row: Task, pk: int, claimed: str = "") -> Task:
    """The claimed task; an async one is queued for a worker when the claim commits, its message carrying the
    row as inserted (``claimed``, the claim's JSON) unless it is large (a big payload): the worker's first
    statement is then the compare-and-set that takes the task, not a read of it."""
    row.pk = pk
    row._state.adding, row._state.db = False, "default"
    if row.mode == "async":
        from routing.tasks import CLAIMED_HEADER, execute_task

        headers = {CLAIMED_HEADER: claimed} if claimed and len(claimed) <= CARRIED_ROW_MAX else None
        transaction.on_commit(partial(execute_task.apply_async, (row.pk,), headers=headers))
    return row


def _no_key() -> Conflict:
    return Conflict("Could not give this request a unique key; send it again.", code="request_id_conflict")


_CLAIM = f"{rowsql.insert_from_json(Task)} ON CONFLICT DO NOTHING RETURNING id, created_at"
_CLAIM_SQL = {
    False: _CLAIM,
    True: f"WITH claimed AS ({_CLAIM}), pending AS (INSERT INTO routing_taskevent (task_id, at, from_status, "
          f"to_status, detail) SELECT id, created_at, '', '{TaskStatus.PENDING.value}', '{{}}' FROM claimed) "
          f"SELECT id FROM claimed",
}


def _own_task(fields: dict) -> Task | None:
    """The task this caller already holds under this request_id."""
    if fields["caller"] is None:
        return Task.objects.filter(caller__isnull=True, request_id=fields["request_id"]).first()
    return Task.objects.filter(caller=fields["caller"], request_id=fields["request_id"]).first()


async def invoke(*, caller, payload: dict, confirm: str | None = None, answer=None, **options) -> Task:
    """A caller's request: claimed, then run now (sync) or by a worker (async). A repeat of a request_id never
    executes twice; a repeat with ``answer`` answers an agent's question (INPUT_REQUIRED) and runs the next
    turn. ``on_step`` (optional, async, must not raise): awaited with the task and the first candidate once the
    task is routed, before the agent is called (the MCP door reports it to its client)."""
    on_step = options.pop("on_step", None)
    headers = options.get("headers") or InvokeHeaders()
    async with engine.gate():  # left before the agent call or the wait on a duplicate's outcome
        fields = task_fields(caller=caller, payload=payload, **options)
        row, created = await claim_on_loop(fields)
        if not created:
            return await _repeat(row, caller=caller, confirm=confirm, traceparent=headers.traceparent,
                                 answer=answer)
        if row.mode == "async":
            return row
        pending = rowsql.build(TaskEvent, task=row, at=row.created_at, from_status="",
                               to_status=TaskStatus.PENDING)
        return await run(row, events=[pending], traceparent=headers.traceparent, on_step=on_step)


def task_invoke(*, caller, payload: dict, **options) -> Task:
    """``invoke`` for sync code (the DRF view, schedules, the review queue, the shell). An async task is only
    claimed, in the caller's thread and transaction; a sync one runs on the engine loop (inside a transaction,
    on a loop of its own with its database work in this thread: see ``engine.run_in_caller_thread``)."""
    if options.get("mode", "sync") == "async" and not options.get("confirm") and options.get("answer") is None:
        options.pop("confirm", None)
        options.pop("answer", None)
        row, created = claim(task_fields(caller=caller, payload=payload, **options))
        return row
    if connection.in_atomic_block:
        return engine.run_in_caller_thread(lambda: invoke(caller=caller, payload=payload, **options))
    return engine.run(invoke(caller=caller, payload=payload, **options))


def _refusal(exc: ApplicationError) -> dict:
    """The error of a task refused before any agent was called (bad input, quota, budget, cycle): marked so that
    the caller's retry with the same request_id runs again instead of receiving the refusal for good."""
    return {"code": exc.code, "message": exc.message, "refused": True, "http_status": exc.status_code}


async def _repeat(row: Task, *, caller, confirm: str | None, traceparent: str, answer=None) -> Task:
    """A request_id seen before: never execute twice. A refused sync request (nothing ran) runs again, as a
    retry after a 429 must; a confirmation runs the chosen candidate; otherwise the repeat waits on the event
    loop for the outcome (bounded) and answers with it. Repeats count against the caller's quotas."""
    if row.caller_id and caller is not None and row.caller_id != caller.pk:  # only a caller-less task's key
        raise Conflict("This request_id belongs to another caller.", code="request_id_conflict")
    await _admit_caller(row.caller_id)
    try:
        if row.mode == "sync" and row.status == TaskStatus.FAILED and (row.error or {}).get("refused"):
            retried = await engine.db(_reopen_refused, row)
            if retried is not None:
                return await run(retried, traceparent=traceparent, quota_held=True)
        if confirm and row.status == TaskStatus.NEEDS_CONFIRMATION:
            confirmed = await engine.db(_confirm, row, confirm)
            if confirmed is not None:
                return await run(confirmed, traceparent=traceparent, quota_held=True)
        if answer is not None and row.status == TaskStatus.INPUT_REQUIRED:
            answered = await engine.db(_answer, row, answer)
            if answered is not None:
                return await run(answered, traceparent=traceparent, quota_held=True)
        if row.mode != "sync":
            return row
        engine.leave_gate()
        return await waiting.until_settled(row, timeout=float(_reach("DUPLICATE_WAIT_S")))
    finally:
        await admission.caller_release(row.caller_id)


def _reopen_refused(row: Task) -> Task | None:
    timeline = Timeline(row)
    refused = row.error or {}
    timeline.move(TaskStatus.PENDING, retried_after=refused.get("code"))
    row.error = None
    if timeline.commit(fields=["error"], guard={"error__refused": True}):
        return row
    return None  # another retry took it: the caller waits for that one


def _answer(row: Task, answer) -> Task | None:
    """The caller answers an A2A agent's question: the next turn goes to the same agent and A2A task."""
    turn = dict((row.options or {}).get("a2a") or {})
    turn["answer"] = answer
    turn["turn"] = int(turn.get("turn", 0)) + 1
    timeline = Timeline(row)
    timeline.move(TaskStatus.PENDING, answered_turn=turn["turn"])
    row.options = {**(row.options or {}), "a2a": turn}
    row.capability_requested = (row.capability_label or "").split("@")[0] or row.capability_requested
    return row if timeline.commit(fields=["options", "capability_requested"]) else None


def _confirm(row: Task, choice: str) -> Task | None:
    allowed = {c["capability"] for c in row.decision.get("candidates", [])}
    if choice not in allowed:
        raise InvalidInput(f"'{choice}' is not one of the candidates: {', '.join(sorted(allowed))}.")
    timeline = Timeline(row)
    timeline.move(TaskStatus.PENDING, confirmed=choice)
    row.capability_requested = choice
    return row if timeline.commit(fields=["capability_requested"]) else None


# --- the worker's entry -----------------------------------------------------------------------------------

@cache
def _lease_sql() -> str:
    table = connection.ops.quote_name(Task._meta.db_table)
    return (f"UPDATE {table} SET claimed_at = %s WHERE id = %s AND status = ANY(%s) "
            f"AND (claimed_at IS NULL OR claimed_at < %s) {rowsql.returning(Task)}")


async def _lease(task_id: int) -> Task | str:
    """Claim an async task with a lease, in one statement on the loop. Workers ack late, so a worker killed
    mid-task gets its message redelivered: while the lease runs a redelivery does nothing; after it the task is
    resumed, unless the lost run had already called a non-idempotent capability (which may have run): that task
    fails, never runs twice. Returns the task to run, or its status when there is nothing to run."""
    now = timezone.now()
    rows = await rowsql.afetch(_lease_sql(), [now, task_id, [TaskStatus.PENDING, TaskStatus.ROUTED, TaskStatus.RUNNING],
                                              now - timedelta(seconds=_reach("TASK_LEASE_S"))])
    if not rows:
        return "claimed or settled"
    row = rowsql.instance(Task, rows[0])
    return row if row.status == TaskStatus.PENDING else await engine.db(_resume_lost, row)


def _resume_lost(row: Task) -> Task | str:
    """A leased task whose earlier run was lost with its worker: failed if that run may have called a
    non-idempotent capability, else run again."""
    timeline = Timeline(row)
    if (row.options or {}).get("non_idempotent_started"):
        timeline.move(TaskStatus.FAILED, error="worker_lost")
        row.error = {"code": "worker_lost", "message": "the worker was lost during a call to a non-idempotent "
                                                       "capability; it is not run again"}
        timeline.commit(fields=["error"])
        return row.status
    timeline.note(resumed="worker lost; running again")
    TaskEvent.objects.bulk_create(timeline.events)
    return row


class _NotTaken(Exception):
    """A run from the row its message carried did not take the task (``run(take=True)``): another run took or
    settled it, or its plan needs more than the loop; the lease decides instead."""


async def run_queued(task_id: int, claimed: str | None = None) -> str:
    """Carry out an async task in a worker: the same path as a sync invoke. ``claimed``: the task's row as its
    claim inserted it (carried by the message; ``_claimed``): a run of a capability named and planned on the
    loop then takes the task with its RUNNING checkpoint, one statement, instead of leasing it first. Whatever
    that run cannot take (a redelivery, a task another run holds or settled) goes through the lease."""
    if claimed is not None:
        carried = rowsql.from_rows_json(Task, claimed, task_id)
        try:
            carried = await run(carried, traceparent=(carried.options or {}).get("traceparent", ""), take=True)
        except _NotTaken:
            pass
        except ApplicationError as exc:  # already recorded on the task by run
            return exc.code
        else:
            return carried.status
    row = await _lease(task_id)
    if isinstance(row, str):
        return row
    try:
        row = await run(row, traceparent=(row.options or {}).get("traceparent", ""))
    except ApplicationError as exc:  # already recorded on the task by run
        return exc.code
    return row.status


# --- run: admit -> resolve -> execute -> record ----------------------------------------------------------

@dataclass
class Plan:
    row: Task
    timeline: Timeline
    candidates: list
    ctx: gateway.CallContext | None = None
    session: AgentSession | None = None
    checkpoint: bool = False  # an async run's RUNNING is still to be committed (``_plan(checkpoint=False)``)


CHECKPOINT_FIELDS = ("options", "decision", "text_hash")  # what an async run's RUNNING checkpoint saves


async def _admit_caller(caller_id, instance_ids=(), admit=()) -> admission.CallerAdmission:
    """Take the caller's quotas; the answer carries the routing snapshot's generation and the open breakers among
    ``instance_ids`` (read in the same round trip), and the call's admission to the first of ``admit`` that
    takes it."""
    admitted = await admission.caller_acquire(caller_id, instance_ids=instance_ids, admit=admit)
    if not admitted.refused:
        return admitted
    QUOTA_REFUSALS.labels(scope="caller").inc()
    if admitted.refused == "concurrency":
        raise TooManyRequests("Too many concurrent requests for this caller.", retry_after=1,
                              code="caller_concurrency")
    raise TooManyRequests("Request rate over this caller's quota.", retry_after=admitted.wait,
                          code="caller_rate")


def _on_loop_snapshot(row: Task) -> snapshot.Snapshot | None:
    """The snapshot a run naming its capability may be planned with on the loop (``_plan_on_loop``): this
    process's last one, if it has the capability; whether it is still current, the admission's answer tells.
    A sync run, or an async task's first run (a resumed one goes through its database thread)."""
    if (row.mode != "sync" and row.status != TaskStatus.PENDING) or not row.capability_requested or row.user_key:
        return None
    snap = snapshot.built()
    return snap if snap is not None and row.capability_requested in snap.by_capability else None


def _plan_on_loop(row: Task, timeline: Timeline, traceparent: str, snap: snapshot.Snapshot,
                  admitted: admission.CallerAdmission | None, picked=None) -> Plan | Resolution | None:
    """The plan of a sync run naming its capability, made on the event loop when that needs no I/O: the snapshot
    is current and the breakers were read with the admission. Returns the resolution instead when the rest needs
    the database (a review to open, a budget to read), and None when nothing could be done here. ``picked``: the
    version ``resolver.pick_named`` picked before the admission."""
    if admitted is None or admitted.open_instances is None or admitted.generation != snap.generation:
        return None
    resolution = _resolution(row, traceparent, lambda: resolver.resolve_named(
        snap, row.capability_requested, row.payload, admitted.open_instances, picked))
    if resolution.decision != Decision.EXECUTE or not budgets_known_absent(
            caller_id=row.caller_id, team_slugs=[c.version.team for c in resolution.candidates]):
        return resolution
    return _plan(row, timeline, traceparent, resolution=resolution, budget_known_absent=True, checkpoint=False)


async def run(row: Task, *, traceparent: str = "", events=(), quota_held: bool = False, on_step=None,
              take: bool = False) -> Task:
    """``take``: an async task's row as its message carried it, not yet leased: planned on the loop and taken by
    its RUNNING checkpoint, or ``_NotTaken`` before any agent is called."""
    timeline = Timeline(row, events=events)
    admitted = None
    snap = _on_loop_snapshot(row)
    if take and (snap is None or not timeline.on_loop()):
        raise _NotTaken
    # a request naming its capability: its version and the order of its instances are known before the caller's
    # admission, so the call's admission to an instance comes in the same round trip
    picked = resolver.pick_named(snap, row.capability_requested) if snap else None
    order = gateway.pick_weighted_round_robin(picked.instances) if picked and not quota_held else ()
    try:
        if not quota_held:
            admitted = await _queued(row, lambda: _admit_caller(
                row.caller_id, resolver.named_instances(snap, row.capability_requested) if snap else (), order))
    except ApplicationError as exc:
        await engine.db(_refuse, timeline, exc)
        raise
    after = Deferred()  # the Redis commands of the outcome's commit, sent with the quota release
    slot = admitted.instance if admitted is not None else None  # the instance slot the admission took
    ctx = None
    try:
        try:
            plan = _plan_on_loop(row, timeline, traceparent, snap, admitted, picked) if snap else None
            if take and not (isinstance(plan, Plan) and plan.checkpoint):
                raise _NotTaken
            if not isinstance(plan, Plan):
                plan = await engine.db(_plan, row, timeline, traceparent, admitted and admitted.generation, plan)
        except ApplicationError as exc:  # refused before any agent was called: input, cycle, budget
            await engine.db(_refuse, timeline, exc)
            raise
        if plan.checkpoint and not await _checkpoint(timeline, take=take):
            if take:
                raise _NotTaken
            return plan.row  # settled meanwhile (reaped, cancelled): nothing to call
        if plan.ctx is None:
            return plan.row
        plan.ctx.after = after
        if (slot is not None and picked is not None and plan.candidates[0].id == picked.id
                and plan.ctx.sticky_instance_id in (None, slot.id)):  # an A2A answer goes to the agent that asked
            ctx, plan.ctx.admitted = plan.ctx, (picked.id, slot)
        try:
            engine.leave_gate()  # before on_step too: it may wait on its client (the MCP door's progress report)
            if on_step is not None:
                await on_step(plan.row, plan.candidates[0])
            execution = await _queued(row, lambda: gateway.execute(candidates=plan.candidates, payload=row.payload,
                                                                   ctx=plan.ctx))
        except ApplicationError as exc:  # every capable agent at capacity, nothing called
            await engine.db(_refuse, timeline, exc)
            raise
        except BaseException:
            await asyncio.shield(engine.db(_crashed, timeline))
            raise
        row = await asyncio.shield(_record_on_loop(plan, execution, after))
        if row.status == TaskStatus.ACCEPTED and ((row.options or {}).get("a2a") or {}).get("push"):
            # what the agent pushed before ACCEPTED was written was not applied: read its task once now
            await asyncio.shield(lifecycle.a2a_follow_up(row))
        return row
    finally:
        if slot is not None and (ctx is None or ctx.admitted is not None):  # the call did not go there
            after.later(partial(admission.release_instance_into, instance=slot))
        await asyncio.shield(admission.caller_release(row.caller_id, after=after, release=not quota_held))


async def _checkpoint(timeline: Timeline, *, take: bool = False) -> bool:
    """An async run planned on the loop commits RUNNING before its agent call: one statement awaited here, or the
    transaction in a database thread when more is due (``Timeline.on_loop``). False: settled meanwhile. ``take``
    (``run``; on the loop only): the same statement takes the task's lease, unless a worker holds it."""
    if take:
        now = timezone.now()
        timeline.task.claimed_at = now
        return await timeline.acommit(fields=(*CHECKPOINT_FIELDS, "claimed_at"),
                                      lease_before=now - timedelta(seconds=_reach("TASK_LEASE_S")))
    if timeline.on_loop():
        return await timeline.acommit(fields=CHECKPOINT_FIELDS)
    return await engine.db(partial(timeline.commit, fields=CHECKPOINT_FIELDS))


async def _queued(row: Task, attempt):
    """A sync caller hears 429 + Retry-After at once when a quota or every capable agent is full; an async task
    waits its turn instead (backing off with jitter) until its deadline."""
    while True:
        try:
            return await attempt()
        except TooManyRequests as exc:
            if row.mode != "async" or (row.deadline_at and timezone.now() >= row.deadline_at):
                raise
            await asyncio.sleep(min(float(exc.retry_after), 1.0) * random.uniform(0.2, 1.0))


def _resolution(row: Task, traceparent: str, resolve) -> Resolution:
    with RESOLVE_SECONDS.time(), tracing.tracer.start_as_current_span(
            "reach.resolve", context=tracing.parent_context(traceparent),
            attributes={"reach.request_id": row.key}):
        return resolve()


def _plan(row: Task, timeline: Timeline, traceparent: str, generation: str | None = None,
          resolution: Resolution | None = None, *, budget_known_absent: bool = False, checkpoint: bool = True) -> Plan:
    """Resolve (in this database thread: embedding a text is CPU work, and the routing snapshot may be reloaded
    from PostgreSQL), then the loop guard and the budget. A confirm or manual-review decision ends the run.
    ``generation``: the routing snapshot's, read with the caller's admission; ``resolution``: made already
    (``_plan_on_loop``). An async run checkpoints RUNNING before any agent is called: here, or with
    ``checkpoint=False`` (on the loop) the plan says so and ``run`` awaits the same compare-and-set."""
    options = row.options or {}
    if resolution is None:
        resolution = _resolution(row, traceparent, lambda: resolver.resolve(
            task=row.task_text or None, capability=row.capability_requested or None, payload=row.payload,
            action=options.get("action"), domains=options.get("domains"), top_k=row.top_k,
            cost_preference=options.get("cost_preference") or 0.0, generation=generation))
    row.decision = resolution.as_dict()
    row.text_hash = resolution.text_hash
    if resolution.decision == Decision.CONFIRM:
        timeline.move(TaskStatus.NEEDS_CONFIRMATION, score=row.decision["score"])
        _commit_run(row, timeline)
        return Plan(row, timeline, [])
    if resolution.decision == Decision.MANUAL_REVIEW:
        timeline.move(TaskStatus.MANUAL_REVIEW, score=row.decision["score"],
                      reason=row.decision["reasons"][0] if row.decision["reasons"] else "")
        row.review_reason = ReviewReason.LOW_SCORE
        _commit_run(row, timeline, opens_review=True)
        return Plan(row, timeline, [])
    # loop guard: an agent already on the call path may not be called again (A -> B -> A)
    path = set(row.call_path)
    candidates = [c.version for c in resolution.candidates if c.version.agent not in path]
    if not candidates:
        raise Conflict(f"Call cycle refused: {' -> '.join([*row.call_path, resolution.candidates[0].version.agent])}.",
                       code="cycle_detected")
    if resolution.decision == Decision.EXECUTE and not row.capability_requested:
        candidates = candidates[: row.top_k]
    try:
        warnings = [] if budget_known_absent else budget_check(caller_id=row.caller_id,
                                                               team_slugs=[c.team for c in candidates])
    except PaymentRequired as exc:
        BUDGET_REFUSALS.labels(scope=(exc.details or {}).get("scope", "?")).inc()
        raise
    if warnings:
        row.decision["budget_warnings"] = warnings
    timeline.move(TaskStatus.ROUTED, agent=candidates[0].agent, capability=candidates[0].capability)
    timeline.move(TaskStatus.RUNNING)
    pending_checkpoint = False
    if row.mode == "async":  # persist RUNNING before calling agents: a lost worker's run is resumed or failed
        row.options = {**options, "non_idempotent_started": any(not c.idempotent for c in candidates)}
        if not checkpoint:
            pending_checkpoint = True
        elif not timeline.commit(fields=CHECKPOINT_FIELDS):
            return Plan(row, timeline, [])  # settled meanwhile (reaped, cancelled): nothing to call
    session = _open_session(row, candidates[0].agent) if row.user_key else None
    ctx = gateway.CallContext(request_id=row.key, trace_id=row.trace_id, depth=row.depth,
                              call_path=row.call_path, budget=row.retry_budget, user_key=row.user_key,
                              traceparent=traceparent, sticky_instance_id=session.instance_id if session else None,
                              task_text=row.task_text, task_pk=row.pk, mode=row.mode,
                              a2a_turn=options.get("a2a") if options.get("a2a", {}).get("answer") is not None
                              else None)
    if ctx.a2a_turn and row.instance_id:
        ctx.sticky_instance_id = row.instance_id  # the agent that asked
    return Plan(row, timeline, candidates, ctx, session, checkpoint=pending_checkpoint)


def _record(plan: Plan, execution: gateway.Execution, after: Deferred | None = None) -> Task:
    """The run's outcome through the state machine; the Redis commands due after its commit go into ``after``."""
    if plan.session is not None and execution.instance:
        AgentSession.objects.filter(pk=plan.session.pk).update(instance_id=execution.instance.id,
                                                               last_activity_at=timezone.now())
    return _commit_run(plan.row, plan.timeline, **_outcome(plan, execution), defer=after)


async def _record_on_loop(plan: Plan, execution: gateway.Execution, after: Deferred) -> Task:
    """``_record`` with its one statement awaited on the loop, when nothing else is due (no agent session to
    touch, no review item to open, ``Timeline.on_loop``); else in a database thread."""
    failed = not execution.ok
    if plan.session is not None or not plan.timeline.on_loop(opens_review=failed):
        return await engine.db(_record, plan, execution, after)
    outcome = _outcome(plan, execution)
    row, timeline = plan.row, plan.timeline
    records, costs = _run_rows(row, outcome["attempts"])
    status = row.status
    moved = await timeline.acommit(fields=RUN_FIELDS, attempts=records, cost_entries=costs, defer=after)
    if not moved:
        await engine.db(_discarded, row, status, records, costs)
    return _finished(row, moved, status)


def _outcome(plan: Plan, execution: gateway.Execution) -> dict:
    """Apply the execution to the in-memory task and timeline; returns what ``_commit_run`` writes with it."""
    row, timeline = plan.row, plan.timeline
    row.retry_budget = execution.budget_left
    row.fallback = execution.fallback
    if execution.version:
        row.version_id = execution.version.id
        row.agent_endpoint = execution.version.agent
        row.capability_label = f"{execution.version.capability}@{execution.version.version}"
    if execution.instance:
        row.instance_id = execution.instance.id
    attempts = execution.attempts
    if execution.ok and execution.input_required:
        question = execution.result or {}
        row.result = {"question": question.get("question", ""),
                      **({"data": question["data"]} if question.get("data") else {})}  # a schema, a sampling request
        row.options = {**(row.options or {}), "a2a": {k: question.get(k) for k in ("task_id", "context_id")}
                       | {"turn": ((row.options or {}).get("a2a") or {}).get("turn", 0)}}
        timeline.move(TaskStatus.INPUT_REQUIRED)
        return {"attempts": attempts}
    if execution.ok and execution.accepted:
        if isinstance(execution.result, dict) and execution.result.get("push"):  # an A2A task followed by push
            row.options = {**(row.options or {}), "a2a": {
                **{k: execution.result.get(k) for k in ("task_id", "context_id", "push")},
                "turn": ((row.options or {}).get("a2a") or {}).get("turn", 0)}}
        timeline.move(TaskStatus.ACCEPTED)
        return {"attempts": attempts}
    if execution.ok:
        row.result = execution.result
        timeline.move(TaskStatus.SUCCEEDED, **({"fallback": True} if execution.fallback else {}))
        return {"attempts": attempts}
    row.review_reason = ReviewReason.ALL_FAILED  # every candidate failed: a person may still answer it
    row.error = execution.error
    timeline.move(TaskStatus.FAILED, error=(execution.error or {}).get("code"))
    return {"attempts": attempts, "opens_review": True}


def _refuse(timeline: Timeline, exc: ApplicationError) -> Task:
    row = timeline.task
    row.error = _refusal(exc)
    timeline.move(TaskStatus.FAILED, error=exc.code)
    return _commit_run(row, timeline)


def _crashed(timeline: Timeline) -> Task:
    row = timeline.task
    row.error = {"code": "gateway_error", "message": "unexpected error"}
    timeline.move(TaskStatus.FAILED, error="gateway_error")
    return _commit_run(row, timeline)


# The columns a run changes. The others are written at creation or by compare-and-set updates elsewhere (a
# worker's claim, a confirmation), which saving every column from this process's copy could overwrite.
RUN_FIELDS = ["decision", "text_hash", "review_reason", "retry_budget", "fallback", "version_id", "agent_endpoint",
              "capability_label", "instance_id", "result", "error", "attempts_count", "options"]


def _commit_run(row: Task, timeline: Timeline, *, attempts=(), opens_review: bool = False,
                defer: Deferred | None = None) -> Task:
    """Write the run's outcome through the state machine. When the task moved meanwhile (the reaper failed it,
    a person answered it), the outcome is discarded, but the attempts and their cost are kept: the agent was
    called."""
    records, costs = _run_rows(row, attempts)
    status = row.status
    moved = timeline.commit(fields=RUN_FIELDS, attempts=records, cost_entries=costs, opens_review=opens_review,
                            defer=defer)
    if not moved:
        _discarded(row, status, records, costs)
    return _finished(row, moved, status)


def _run_rows(row: Task, attempts) -> tuple[list[Attempt], list]:
    """The run's attempt rows and their cost entries (and the task's attempt count)."""
    records = [rowsql.build(Attempt, task=row, number=a.number, version_id=a.version_id,
                            instance_id=a.instance_id, started_at=a.started_at, latency_ms=a.latency_ms,
                            timeout_ms=a.timeout_ms, outcome=a.outcome, status_code=a.status_code, error=a.error,
                            is_retry=a.is_retry, is_fallback=a.is_fallback, usage=a.usage) for a in attempts]
    row.attempts_count = len(attempts)
    return records, _cost_entries(row, attempts)


def _discarded(row: Task, outcome: str, records: list, costs: list) -> None:
    """A late outcome: noted on the timeline, its attempts and their cost kept."""
    with transaction.atomic():
        TaskEvent.objects.create(task=row, at=timezone.now(), from_status=row.status, to_status=row.status,
                                 detail={"discarded_outcome": outcome})
        Attempt.objects.bulk_create(records)
        if costs:
            from ledger.services import cost_entries_record

            cost_entries_record(entries=costs)


def _finished(row: Task, moved: bool, outcome: str) -> Task:
    if not moved:
        logger.warning("late outcome discarded", extra={"request_id": row.key, "status": row.status,
                                                        "discarded": outcome})
        return row
    INVOKES.labels(outcome=row.status, agent=row.agent_endpoint or "-").inc()
    logger.info("invoke finished", extra={"request_id": row.key, "trace_id": row.trace_id,
                                          "status": row.status, "decision": row.decision.get("decision"),
                                          "agent": (row.decision.get("candidates") or [{}])[0].get("agent")})
    return row


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
                      price_in=Decimal(str(info.price_in)), price_out=Decimal(str(info.price_out)),
                      cost_per_call=Decimal(str(info.cost_per_call)), avg_tokens=info.avg_tokens)
        entries.append(cost_entry_for(price=price, request_id=row.key, caller_id=row.caller_id,
                                      version_id=a.version_id, instance_id=a.instance_id, outcome=a.outcome,
                                      usage=a.usage, latency_ms=a.latency_ms, number=a.number, is_retry=a.is_retry,
                                      is_fallback=a.is_fallback, at=a.started_at))
    return entries


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

