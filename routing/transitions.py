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
        self.events.append(TaskEvent(task=self.task, at=timezone.now(), from_status=current, to_status=to,
                                     detail=detail))
        self.task.status = to

    def note(self, **detail) -> None:
        """An event that changes no state (a resumed run, a re-dispatch)."""
        status = self.task.status
        self.events.append(TaskEvent(task=self.task, at=timezone.now(), from_status=status, to_status=status,
                                     detail=detail))

    def commit(self, *, fields: Iterable[str] = (), expect: Iterable[str] | None = None, attempts=(),
               cost_entries=(), opens_review: bool = False, guard: dict | None = None) -> bool:
        """Write the steps if the task is still in the state they start from (or one of ``expect``).

        ``fields`` are the other columns of the in-memory task to save with the status (foreign keys by their
        ``*_id`` attribute, which reads no related row); ``opens_review`` tells
        the review queue that the task now waits for a person; ``guard`` adds conditions to the compare-and-set
        (say, that the failure being retried was a refusal). Returns whether this writer moved the task; on
        False nothing was written and the in-memory task is reloaded."""
        task = self.task
        expected = list(expect) if expect is not None else [self.started_from]
        columns = {name: getattr(task, name) for name in fields}
        now = timezone.now()
        task.updated_at = now
        if not connection.in_atomic_block and not guard and not pushes(task):
            if not _commit_in_one_round_trip(task, expected, guard, columns, now, self.events, attempts,
                                             cost_entries):
                task.refresh_from_db()
                return False
            _after_move(task, attempts=attempts, opens_review=opens_review, outbox=False)
            if cost_entries:
                from ledger.services import cost_counters_add

                cost_counters_add(entries=list(cost_entries))
            self.started_from = task.status
            self.events = []
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


def _commit_in_one_round_trip(task, expected, guard, columns, now, events, attempts, cost_entries) -> bool:
    """The same writes as the transaction in ``commit``, as one statement (one round trip, its own
    transaction): the compare-and-set UPDATE and, only when it matched, the INSERTs of the events, attempts,
    cost entries and the callback outbox row, each table's rows passed as one JSON parameter
    (``routing.rowsql``). Used outside transactions and without a ``guard`` only."""
    from ledger.models import CostEntry
    from routing.callbacks import outbox_row
    from routing.models import CallbackDelivery

    assignments, values = rowsql.update_values(Task, task, ["status", "updated_at", *columns])
    parts = [f"WITH moved AS (UPDATE routing_task SET {', '.join(assignments)} "
             f"WHERE id = %s AND status = ANY(%s) RETURNING id)"]
    params = [*values, task.pk, expected]
    delivery = outbox_row(task) if task.status in TERMINAL else None
    for name, model, objs in (("events", TaskEvent, events), ("attempts", Attempt, attempts),
                              ("costs", CostEntry, cost_entries), ("outbox", CallbackDelivery,
                                                                   [delivery] if delivery else [])):
        if objs:
            returning = " RETURNING id" if model is CallbackDelivery else ""
            parts.append(f", {name} AS ({rowsql.insert_from_json(model, when='EXISTS (SELECT 1 FROM moved)')}"
                         f"{returning})")
            params.append(rowsql.rows_json(model, objs))
    parts.append(" SELECT (SELECT count(*) FROM moved)" + (", (SELECT id FROM outbox)" if delivery else ""))
    row = rowsql.fetch("".join(parts), params)[0]
    if not row[0]:
        return False  # the task is no longer in the expected state: another writer moved it
    if delivery is not None:
        from routing.callbacks import dispatch

        dispatch(row[1])
    return True


def _after_move(task: Task, *, attempts, opens_review: bool, outbox: bool = True) -> None:
    """Inside the transaction that moved ``task``: the outbox row of a terminal state (unless the caller wrote
    it), and what to tell others once it commits."""
    from routing.callbacks import outbox_enqueue
    from routing.signals import attempts_recorded, review_item_opened

    if outbox and task.status in TERMINAL:
        outbox_enqueue(task)
    if pushes(task):
        push_enqueue(task)
    if attempts:
        version_ids = {a.version_id for a in attempts}
        transaction.on_commit(lambda: attempts_recorded.send(sender=Task, version_ids=version_ids))
    if opens_review:
        transaction.on_commit(lambda: review_item_opened.send(sender=Task, task_id=task.pk))
    if task.status in TERMINAL and (task.options or {}).get("redispatch_of"):
        from routing.manual import settle_origin

        transaction.on_commit(lambda: settle_origin(task))
    # repeats of a request wait for its outcome and A2A streams follow every change (routing.waiting)
    status = task.status
    transaction.on_commit(lambda: announce(task.pk, status))


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
