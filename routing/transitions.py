"""The one task state machine. Every status change of a task, wherever it happens (the invoke path, a worker,
an agent's callback or a poll, the reaper, the review queue, a confirmation, a retry after a refusal), goes
through ``Timeline.commit``: a compare-and-set on the task's status that, in one transaction, writes the new
status and columns, an event row per step, the attempts and cost entries of the run, and for a terminal state
the callback outbox row. A change whose task is no longer in the state it was read in writes nothing and
returns False: of two racing writers (a reaper and a late success, two agent reports, a reviewer's answer and
a late agent report) exactly one moves the task.

The allowed steps are ``routing.choices.ALLOWED_TRANSITIONS``. After the commit, waiters for the task (repeats of
its request_id and A2A streams, on any node) are told through Redis (``TASK_CHANNEL``); a task of the A2A door
also gets one push-notification outbox row per config of it (``routing.a2a_push``) in the same transaction.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from django.db import connection, transaction
from django.utils import timezone

from reach_platform import engine
from routing import rowsql
from routing.a2a_push import push_enqueue
from routing.choices import ALLOWED_TRANSITIONS, TERMINAL
from routing.models import Attempt, Task, TaskEvent

logger = logging.getLogger(__name__)
TASK_CHANNEL = "reach:task-changed"


class IllegalTransition(ValueError):
    """A step the state machine does not allow (a programming error, never a caller's)."""


class Timeline:
    """The steps one writer takes a task through, committed together by ``commit``.

    ``move`` checks each step against the state machine and updates the in-memory task; nothing is written
    until ``commit``, so a sync invoke writes its whole timeline (pending -> routed -> running -> succeeded)
    with its outcome in one transaction."""

    def __init__(self, task: Task, *, events: Iterable[TaskEvent] = ()):
        self.task = task
        self.started_from = task.status
        self.events: list[TaskEvent] = list(events)

    def move(self, to: str, **detail) -> None:
        current = self.task.status
        if to not in ALLOWED_TRANSITIONS.get(current, ()):
            raise IllegalTransition(f"{current} -> {to} is not a transition of the task state machine")
        self.events.append(rowsql.build(TaskEvent, task=self.task, at=timezone.now(), from_status=current,
                                        to_status=to, detail=detail))
        self.task.status = to

    def note(self, **detail) -> None:
        """An event that changes no state (a resumed run, a re-dispatch)."""
        status = self.task.status
        self.events.append(rowsql.build(TaskEvent, task=self.task, at=timezone.now(), from_status=status,
                                        to_status=status, detail=detail))

    def commit(self, *, fields: Iterable[str] = (), expect: Iterable[str] | None = None, attempts=(),
               cost_entries=(), opens_review: bool = False, guard: dict | None = None,
               defer: Deferred | None = None) -> bool:
        """Write the steps if the task is still in the state they start from (or one of ``expect``).

        ``fields`` are the other columns of the in-memory task to save with the status (foreign keys by their
        ``*_id`` attribute, which reads no related row); ``opens_review`` tells
        the review queue that the task now waits for a person; ``guard`` adds conditions to the compare-and-set
        (say, that the failure being retried was a refusal); ``defer`` collects the Redis commands due after
        the commit (the announcement, the cost counters) for the caller to send with its own (the invoke path
        sends them with the caller's quota release: one round trip). Returns whether this writer moved the
        task; on False nothing was written and the in-memory task is reloaded."""
        task = self.task
        expected = list(expect) if expect is not None else [self.started_from]
        columns = {name: getattr(task, name) for name in fields}
        now = timezone.now()
        task.updated_at = now
        if not connection.in_atomic_block and not guard and not pushes(task):
            sql, params, delivery = _one_statement(task, expected, list(columns), self.events, attempts,
                                                   cost_entries)
            answer = rowsql.fetch(sql, params)[0]
            if not answer[0]:  # the task is no longer in the expected state: another writer moved it
                task.refresh_from_db()
                return False
            self._committed(answer, delivery, attempts, cost_entries, opens_review, defer)
            return True
        with transaction.atomic():
            moved = Task.objects.filter(pk=task.pk, status__in=expected, **(guard or {})).update(
                status=task.status, updated_at=now, **columns)
            if not moved:
                task.refresh_from_db()
                return False
            TaskEvent.objects.bulk_create(self.events)
            if attempts:
                Attempt.objects.bulk_create(attempts)
            if cost_entries:
                from ledger.services import cost_entries_record

                cost_entries_record(entries=list(cost_entries))
            _after_move(task, attempts=attempts, opens_review=opens_review)
        self.started_from = task.status
        self.events = []
        return True

    def on_loop(self, *, opens_review: bool = False) -> bool:
        """Whether ``acommit`` can write these steps: nothing but the one statement is due (no A2A push configs
        to read, no review queue to reopen, no re-dispatch to settle)."""
        task = self.task
        return not (pushes(task) or opens_review or (task.options or {}).get("redispatch_of")
                    or engine.in_caller_thread())

    async def acommit(self, *, fields: Iterable[str] = (), attempts=(), cost_entries=(),
                      defer: Deferred | None = None, lease_before=None) -> bool:
        """``commit`` awaited on the engine loop, its one statement on the loop's own connections (only when
        ``on_loop()``): the same compare-and-set and rows, with no thread hop. ``lease_before`` (a datetime):
        also take the task's lease (``claimed_at``), only if no other worker took it since then."""
        task = self.task
        task.updated_at = timezone.now()
        sql, params, delivery = _one_statement(task, [self.started_from], list(fields), self.events, attempts,
                                               cost_entries, first_try=True, lease_before=lease_before)
        answer = (await rowsql.afetch(sql, params))[0]
        if not answer[0]:
            await engine.db(task.refresh_from_db)
            return False
        later = defer if defer is not None else Deferred()
        self._committed(answer, delivery, attempts, cost_entries, False, later, first_try=True)
        if defer is None:
            await later.asend()
        return True

    def _committed(self, answer, delivery, attempts, cost_entries, opens_review: bool, defer, *,
                   first_try: bool = False) -> None:
        """After the one statement moved the task: start its callback delivery and tell the others (now, or with
        the caller's round trip when it passed ``defer``). ``first_try``: the statement counted the delivery's
        first try and read the caller's signing secret (``_one_statement``), so the try needs no statement."""
        task = self.task
        if delivery is not None:
            from routing.callbacks import dispatch, dispatch_first

            if first_try:
                delivery.pk = answer[1]
                dispatch_first(delivery, answer[2])
            else:
                dispatch(answer[1])
        later = defer if defer is not None else Deferred()
        _after_move(task, attempts=attempts, opens_review=opens_review, outbox=False, announced=later)
        later.costs.extend(cost_entries)
        if defer is None:
            later.send()
        self.started_from = task.status
        self.events = []


def _one_statement(task, expected, fields, events, attempts, cost_entries, *, first_try: bool = False,
                   lease_before=None):
    """The same writes as the transaction in ``commit``, as one statement (one round trip, its own
    transaction): the compare-and-set UPDATE and, only when it matched, the INSERTs of the events, attempts,
    cost entries and the callback outbox row, each table's rows passed as one JSON parameter
    (``routing.rowsql``). Used outside transactions and without a ``guard`` only. Returns (sql, params, the
    outbox row or None); the statement answers (moved, outbox id). ``first_try`` (the engine loop tries the
    delivery at once, ``callbacks.dispatch_first``): the outbox row is written with its first try counted and
    the statement also answers the caller's signing secret, so that try starts without a statement of its own.
    ``lease_before``: the set also requires that no worker took the task's lease (``claimed_at``) since then."""
    from ledger.models import CostEntry
    from routing.callbacks import outbox_row
    from routing.models import CallbackDelivery

    assignments, values = rowsql.update_values(Task, task, ["status", "updated_at", *fields])
    lease = " AND (claimed_at IS NULL OR claimed_at < %s)" if lease_before is not None else ""
    parts = [f"WITH moved AS (UPDATE routing_task SET {assignments} "
             f"WHERE id = %s AND status = ANY(%s){lease} RETURNING id)"]
    params = [*values, task.pk, expected, *([lease_before] if lease_before is not None else [])]
    delivery = outbox_row(task) if task.status in TERMINAL else None
    if delivery is not None and first_try:
        delivery.attempts = 1
    for name, model, objs in (("events", TaskEvent, events), ("attempts", Attempt, attempts),
                              ("costs", CostEntry, cost_entries), ("outbox", CallbackDelivery,
                                                                   [delivery] if delivery else [])):
        if objs:
            returning = " RETURNING id" if model is CallbackDelivery else ""
            parts.append(f", {name} AS ({rowsql.insert_from_json(model, when='EXISTS (SELECT 1 FROM moved)')}"
                         f"{returning})")
            params.append(rowsql.rows_json(model, objs))
    parts.append(" SELECT (SELECT count(*) FROM moved)" + (", (SELECT id FROM outbox)" if delivery else ""))
    if delivery is not None and first_try:
        parts.append(", (SELECT secret FROM routing_callersecret WHERE caller_id = %s)")
        params.append(task.caller_id)
    return "".join(parts), params, delivery


def _after_move(task: Task, *, attempts, opens_review: bool, outbox: bool = True,
                announced: Deferred | None = None) -> None:
    """Inside the transaction that moved ``task``: the outbox row of a terminal state (unless the caller wrote
    it), and what to tell others once it commits. With ``announced`` the move has committed already (the one
    statement): what waits for the commit runs now, and the announcement goes into ``announced``."""
    from routing.callbacks import outbox_enqueue
    from routing.signals import attempts_recorded, review_item_opened

    def once_committed(fn) -> None:
        if announced is not None:
            fn()
        else:
            transaction.on_commit(fn)

    if outbox and task.status in TERMINAL:
        outbox_enqueue(task)
    if pushes(task):
        push_enqueue(task)
    if attempts:
        version_ids = {a.version_id for a in attempts}
        once_committed(lambda: attempts_recorded.send(sender=Task, version_ids=version_ids))
    if opens_review:
        once_committed(lambda: review_item_opened.send(sender=Task, task_id=task.pk))
    if task.status in TERMINAL and (task.options or {}).get("redispatch_of"):
        from routing.manual import settle_origin

        once_committed(lambda: settle_origin(task))
    # repeats of a request wait for its outcome and A2A streams follow every change (routing.waiting)
    status = task.status
    if announced is not None:
        announced.announcements.append(f"{task.pk}:{status}")
    else:
        transaction.on_commit(lambda: announce(task.pk, status))


class Deferred:
    """Redis commands due once a transition committed: its announcement (``TASK_CHANNEL``), the month-to-date
    cost counters of its entries, and whatever else the run left for later (``later``: the settlement of its
    successful agent call), sent in one round trip (``send``) or added to the caller's pipeline."""

    def __init__(self):
        self.announcements: list[str] = []
        self.costs: list = []
        self.commands: list = []  # functions that add commands to a pipeline

    def later(self, add) -> None:
        self.commands.append(add)

    def add_to(self, pipe) -> None:
        from ledger.services import cost_counters_pipe

        for add in self.commands:
            add(pipe)
        cost_counters_pipe(pipe, self.costs)
        for message in self.announcements:
            pipe.publish(TASK_CHANNEL, message)

    async def asend(self) -> None:
        """``send`` on the engine loop, in the round trip of the loop's other commands (``engine.redis_pipelined``)."""
        try:
            replies = await engine.redis_pipelined(self.add_to)
        except Exception:  # as in send: best effort
            logger.warning("could not send a transition's announcement and cost counters", exc_info=True)
            return
        if any(isinstance(reply, Exception) for reply in replies):
            logger.warning("a transition's announcement or cost counter was refused by Redis")

    def send(self) -> None:
        from routing.snapshot import redis_client

        pipe = redis_client().pipeline(transaction=False)
        self.add_to(pipe)
        if len(pipe):
            try:
                pipe.execute()
            except Exception:  # a waiter re-reads on its timer; ledger.services.spend_rebuild restores counters
                logger.warning("could not send a transition's announcement and cost counters", exc_info=True)


def pushes(task: Task) -> bool:
    """Whether a change of this task may have A2A push configs to notify (a task of the A2A door)."""
    return (task.options or {}).get("door") == "a2a"


def announce(task_pk: int, status: str) -> None:
    """Tell every node's waiters that this task moved (best effort: a waiter also re-reads on a timer)."""
    from routing.snapshot import redis_client

    try:
        redis_client().publish(TASK_CHANNEL, f"{task_pk}:{status}")
    except Exception:  # a waiter falls back to its own re-read
        logger.warning("could not announce a task transition", exc_info=True)
