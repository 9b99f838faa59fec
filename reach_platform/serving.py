"""How the web tier is started, in one place (``make run``, the benchmarks and the tests use it; the README's
*Serving* section gives the same command line).

uvicorn with uvloop and httptools, one process per core (``WEB_WORKERS``, default 2), each listening on a socket of
its own (``reach_platform.webserver``): an in-flight invoke is a coroutine on the process's event loop, so one
process holds thousands of calls to slow agents.
"""

from __future__ import annotations

import gc
import os
import sys


def web_command(host: str, port: int | str, *, workers: int | None = None) -> list[str]:
    workers = workers or int(os.environ.get("WEB_WORKERS", "2"))
    return [sys.executable, "-m", "reach_platform.webserver", "--host", host, "--port", str(port),
            "--workers", str(workers), "--timeout-keep-alive", "30", "--backlog", "4096", "--log-level", "warning"]


def worker_command(*, concurrency: int | None = None, extra: list[str] | None = None) -> list[str]:
    """A Celery worker: a thread pool whose threads each wait on one task running on the process's engine loop
    (acks late), so a worker holds ``concurrency`` async calls in flight (default 1,000: on 2 cores, 500 capped the
    calls in flight of bench/async_drain.py). Run one per core, as the web tier runs one process per core."""
    concurrency = concurrency or int(os.environ.get("WORKER_CONCURRENCY", "1000"))
    return [sys.executable, "-m", "celery", "-A", "reach_platform", "worker", "-l", "warning", "--pool", "threads",
            "--concurrency", str(concurrency), *(extra or [])]


def tune_gc() -> None:
    """Collect garbage less often in a serving process (web and worker): ``REACH_GC_THRESHOLD``, default
    (20000, 10, 10) against CPython's (700, 10, 10).

    A process holding a thousand calls in flight keeps each call's objects (its coroutine, futures, request and
    task) alive for the agent's seconds. With CPython's 700 net allocations between youngest-generation
    collections those objects are collected, survive, are promoted and are walked again by every older
    collection: at 1,024 callers (``bench/slow_agents.py``) collections took 8-10 % of a gateway process's CPU
    (perf, py-spy; 1.3-1.5 s of collections a process in a 20 s run, timed with ``gc.callbacks``). What dies
    young is freed by reference counting either way; a larger youngest generation only defers the cycles, a few
    MB of them at most."""
    from django.conf import settings  # serving's command lines are built before Django is set up

    gc.set_threshold(*settings.REACH["GC_THRESHOLD"])
