"""Waiting for a task's outcome while holding nothing but a coroutine.

A repeat of an in-flight request_id (on any node) waits here: one Redis subscription per process hears every
task transition (``routing.transitions.announce``) and wakes the waiters of that task, which then re-read it.
A waiter also re-reads every few seconds, so a lost message costs a little latency, never an answer.
"""

from __future__ import annotations

import asyncio
import logging

from reach_platform import engine
from routing.choices import SETTLED
from routing.models import Task
from routing.transitions import TASK_CHANNEL

logger = logging.getLogger(__name__)
REREAD_S = 5.0


class Watcher:
    def __init__(self):
        self.waiters: dict[int, set[asyncio.Event]] = {}
        self.listening: asyncio.Task | None = None
        self.ready = asyncio.Event()

    async def ensure(self) -> None:
        if self.listening is None or self.listening.done():
            self.ready.clear()
            self.listening = asyncio.get_running_loop().create_task(self._listen())
        try:
            await asyncio.wait_for(self.ready.wait(), timeout=5)
        except TimeoutError:  # Redis is slow or away: the waiter still re-reads on its timer
            logger.warning("task watcher is not subscribed yet")

    async def _listen(self) -> None:
        while True:
            pubsub = engine.redis().pubsub()
            try:
                await pubsub.subscribe(TASK_CHANNEL)
                self.ready.set()
                async for message in pubsub.listen():
                    if message.get("type") != "message":
                        continue
                    pk = int(message["data"].split(b":", 1)[0])
                    for event in self.waiters.get(pk, ()):
                        event.set()
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.warning("task watcher lost its subscription; resubscribing", exc_info=True)
                self.ready.clear()
                await asyncio.sleep(1)
            finally:
                try:
                    await pubsub.aclose()
                except Exception:  # the connection is gone already
                    pass

    def add(self, pk: int, event: asyncio.Event) -> None:
        self.waiters.setdefault(pk, set()).add(event)

    def discard(self, pk: int, event: asyncio.Event) -> None:
        events = self.waiters.get(pk)
        if events is not None:
            events.discard(event)
            if not events:
                del self.waiters[pk]


_watchers: dict[int, Watcher] = {}


def _watcher() -> Watcher:
    loop = asyncio.get_running_loop()
    watcher = _watchers.get(id(loop))
    if watcher is None:
        watcher = _watchers[id(loop)] = Watcher()
    return watcher


def _reload(pk: int) -> Task:
    return Task.objects.get(pk=pk)


async def until_settled(row: Task, *, timeout: float) -> Task:
    """The task once it has an outcome (or needs a person), or as it is after ``timeout`` seconds."""
    if row.status in SETTLED:
        return row
    watcher = _watcher()
    event = asyncio.Event()
    watcher.add(row.pk, event)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    try:
        await watcher.ensure()
        while True:
            event.clear()
            row = await engine.db(_reload, row.pk)
            remaining = deadline - loop.time()
            if row.status in SETTLED or remaining <= 0:
                return row
            try:
                await asyncio.wait_for(event.wait(), timeout=min(remaining, REREAD_S))
            except TimeoutError:
                pass
    finally:
        watcher.discard(row.pk, event)
