"""The invoke gate (reach_platform.engine.gate): slots go to the oldest request, a request waiting on I/O gives its
slot back and takes the next one ahead of younger requests, and only the request itself can give its slot away."""

import asyncio
import concurrent.futures

import pytest

from reach_platform import engine


@pytest.fixture
def one_slot(settings):
    settings.REACH = {**settings.REACH, "INVOKE_GATE": 1}


def _run(main):
    """``main()`` on a loop of its own, in a thread of its own (the browser tests leave the main thread's loop
    marked running)."""
    async def wrapped():
        try:
            return await main()
        finally:
            await engine._close_clients_here()

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, wrapped()).result()


def test_a_request_back_from_its_io_goes_before_younger_ones(one_slot):
    log: list[str] = []

    async def a():
        async with engine.gate():
            log.append("A in")
            await engine.off_gate(asyncio.sleep(0.01))  # B takes the slot meanwhile
            log.append("A back")

    async def b():
        async with engine.gate():
            log.append("B in")
            await asyncio.sleep(0.05)  # CPU work as far as the gate knows: A's wait ends meanwhile

    async def c():
        async with engine.gate():
            log.append("C in")

    async def main():
        first = asyncio.ensure_future(a())
        await asyncio.sleep(0)  # A holds the slot
        second = asyncio.ensure_future(b())
        await asyncio.sleep(0)
        third = asyncio.ensure_future(c())  # C is younger than A: it waits until A is done
        await asyncio.gather(first, second, third)

    _run(main)
    assert log == ["A in", "B in", "A back", "C in"]


def test_a_task_started_from_a_request_cannot_give_its_slot_away(one_slot):
    log: list[str] = []

    async def child():
        engine.leave_gate()  # the copied context holds A's slot, which is not the child's to give
        await engine.off_gate(asyncio.sleep(0.01))
        log.append("child done")

    async def a():
        async with engine.gate():
            await asyncio.create_task(child())
            await asyncio.sleep(0.02)
            log.append("A out")

    async def b():
        async with engine.gate():
            log.append("B in")

    async def main():
        first = asyncio.ensure_future(a())
        await asyncio.sleep(0)
        await asyncio.gather(first, b())

    _run(main)
    assert log == ["child done", "A out", "B in"]


def test_a_cancelled_waiter_loses_no_slot(one_slot):
    async def hold(event: asyncio.Event):
        async with engine.gate():
            await event.wait()

    async def main():
        release = asyncio.Event()
        holder = asyncio.ensure_future(hold(release))
        await asyncio.sleep(0)
        waiter = asyncio.ensure_future(hold(asyncio.Event()))
        await asyncio.sleep(0)
        waiter.cancel()
        release.set()
        await holder
        with pytest.raises(asyncio.CancelledError):
            await waiter
        done = asyncio.Event()
        done.set()
        await asyncio.wait_for(hold(done), 1)  # the slot came back
        return engine._clients_here().gate

    gate = _run(main)
    assert gate.free == 1 and not [w for w in gate.waiters if not w[2].done()]
