"""A2A streams (``SendStreamingMessage``, ``SubscribeToTask``) built from a task's committed changes.

A stream starts with the task as it is, then sends one ``statusUpdate`` per change of its A2A state, read from
the task's event timeline (so no step is skipped, in the order committed), and for a completed task its result
as an ``artifactUpdate`` before the last status. It ends when the task reaches a terminal state or comes to wait
for the client (input required, a confirmation), or after the task deadline. It waits on the process's one Redis
subscription to task changes (``routing.waiting``), which every committed change announces, and re-reads the
task only when told (or every ``waiting.REREAD_S`` seconds, should an announcement be lost): no polling loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from datetime import datetime

from django.conf import settings

from reach_platform import engine
from routing import waiting
from routing.a2a_shapes import STREAM_ENDS, a2a_task, artifact, context_of, dumps, state_of, status_of
from routing.choices import TERMINAL, TaskStatus
from routing.models import Task, TaskEvent

logger = logging.getLogger(__name__)


def _max_s() -> float:
    return float(settings.REACH["TASK_DEADLINE_S"])  # no task of ours runs longer


def _last_event_id(pk: int) -> int:
    return TaskEvent.objects.filter(task_id=pk).order_by("-id").values_list("id", flat=True).first() or 0


def _changes(pk: int, after: int) -> tuple[list[tuple[int, str, datetime]], Task]:
    """The events committed after event ``after`` (read before the task, so the task is at least as new)."""
    events = list(TaskEvent.objects.filter(task_id=pk, id__gt=after).order_by("id")
                  .values_list("id", "to_status", "at"))
    return events, Task.objects.get(pk=pk)


def _first_event_id(pk: int) -> int:
    return TaskEvent.objects.filter(task_id=pk).order_by("id").values_list("id", flat=True).first() or 0


async def follow(row: Task, *, from_start: bool = False, subscribed: bool = False) -> AsyncIterator[dict]:
    """The A2A ``StreamResponse`` objects of one task, from its state now (``from_start``: from its creation,
    ``row`` being the task as created, so a new task's stream shows every state it went through) until the
    stream ends. A ``subscribed`` stream (SubscribeToTask) to a task that waits for the client follows it through
    the client's answer (A2A 3.1.6: it ends at a terminal state)."""
    watcher = waiting._watcher()
    changed = asyncio.Event()
    watcher.add(row.pk, changed)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _max_s()
    try:
        await watcher.ensure()
        if from_start:
            after = await engine.db(_first_event_id, row.pk)  # its creation (pending)
        else:
            after = await engine.db(_last_event_id, row.pk)
            row = await engine.db(Task.objects.get, pk=row.pk)  # as it is now, no later than the events read
        yield {"task": a2a_task(row)}
        if row.status in (TERMINAL if subscribed else STREAM_ENDS):
            return
        shown = state_of(row.status)
        while loop.time() < deadline:
            changed.clear()
            events, row = await engine.db(_changes, row.pk, after)
            for event_id, to_status, at in events:
                after = event_id
                ends = to_status in STREAM_ENDS
                if to_status == TaskStatus.SUCCEEDED and row.status == TaskStatus.SUCCEEDED:
                    yield {"artifactUpdate": {"taskId": row.request_id, "contextId": context_of(row),
                                              "artifact": artifact(row), "lastChunk": True}}
                state = state_of(to_status)
                if state != shown or ends:
                    status = status_of(row) if ends and row.status == to_status else {
                        "state": state, "timestamp": at.isoformat().replace("+00:00", "Z")}
                    yield {"statusUpdate": {"taskId": row.request_id, "contextId": context_of(row),
                                            "status": status}}
                    shown = state
                if ends:
                    return
            try:
                await asyncio.wait_for(changed.wait(), timeout=max(0.0, min(waiting.REREAD_S,
                                                                             deadline - loop.time())))
            except TimeoutError:
                pass
    finally:
        watcher.discard(row.pk, changed)


async def serve_sse(send, receive, rid, events: AsyncIterator[dict]) -> None:
    """Send ``events`` as server-sent events, each a JSON-RPC response to request ``rid``; stop as soon as the
    client goes away (the stream's wait is cancelled, not left to run until the task ends)."""
    await send({"type": "http.response.start", "status": 200, "headers": [
        (b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]})

    async def pump() -> None:
        async for event in events:
            data = dumps({"jsonrpc": "2.0", "id": rid, "result": event})
            await send({"type": "http.response.body", "body": f"data: {data}\n\n".encode(), "more_body": True})

    async def watch() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    loop = asyncio.get_running_loop()
    pumping, watching = loop.create_task(pump()), loop.create_task(watch())
    try:
        await asyncio.wait({pumping, watching}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for job in (pumping, watching):
            job.cancel()
        await asyncio.gather(pumping, watching, return_exceptions=True)
    if not pumping.cancelled() and pumping.exception() is not None:
        logger.error("A2A stream failed", exc_info=pumping.exception())
    if not (watching.done() and not watching.cancelled()):  # the client is still there: end the response
        await send({"type": "http.response.body", "body": b"", "more_body": False})
