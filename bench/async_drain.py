"""Async drain: N async invokes with a callback_url, against the example order agent answering after
--latency-ms, carried out by one worker node (--worker-processes Celery worker processes, reach_platform.serving.worker_command;
by default one per core, as the README's *Serving* runs them).

python bench/async_drain.py [--tasks 2000] [--latency-ms 2000] [--worker-concurrency 1000] [--worker-processes N]

Measures the time from the first submit to the last callback received by a local receiver, tasks lost (no
callback within --wait seconds), duplicate executions (the agent's own count) and duplicate callbacks, and the
peak number of calls in flight at the agent, and where the cores went: CPU milliseconds per task of each process
group (the submitter and callback receiver, the gateway, the workers, the agent, PostgreSQL, Redis). Last line:
JSON. Target (issue 11): 2,000 tasks drained in
<= 15 s on one worker node, 0 lost, 0 duplicates.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import time
import uuid
from pathlib import Path

import httpx
from _common import CpuMeter, interpreter, serve_gateway, setup_django, start_order_agent, start_worker
from _load import http_sink, run_load

BASE = Path(__file__).resolve().parent.parent


class Receiver:
    """The callers' callback endpoint: records each delivery by request_id."""

    def __init__(self):
        self.received: dict[str, int] = {}
        self.last_at = 0.0
        self.handle = http_sink(self._record)

    def _record(self, body: bytes) -> None:
        try:
            rid = json.loads(body).get("request_id", "") if body else ""
        except ValueError:
            return
        self.received[rid] = self.received.get(rid, 0) + 1
        self.last_at = time.perf_counter()


def _counts() -> tuple[int, int]:
    """PostgreSQL's committed and rolled-back transactions in this database and Redis's commands processed so far
    (PostgreSQL counts a backend's after it ends or idles a second: read once the processes are gone)."""
    import redis
    from django.conf import settings
    from django.db import connection

    time.sleep(1.5)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()")
        transactions = cursor.fetchone()[0]
    commands = redis.Redis.from_url(settings.REDIS_URL).info("stats")["total_commands_processed"]
    return transactions, commands


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--latency-ms", type=int, default=2000)
    parser.add_argument("--worker-concurrency", type=int, default=int(os.environ.get("WORKER_CONCURRENCY", "1000")))
    parser.add_argument("--worker-processes", type=int,
                        default=int(os.environ.get("WORKER_PROCESSES", str(os.cpu_count() or 1))),
                        help="Celery worker processes on the node (default one per core)")
    parser.add_argument("--submitters", type=int, default=64)
    parser.add_argument("--wait", type=float, default=120)
    parser.add_argument("--port", type=int, default=8768)
    args = parser.parse_args()

    setup_django("reach_bench_drain")
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    agents, agent_url = start_order_agent(port_offset=20400, faults={"latency_ms": args.latency_ms})
    token = Token.objects.create(user=get_user_model().objects.create_user("bench-caller")).key
    env = dict(REACH_CALLER_MAX_QPS="100000", REACH_CALLER_MAX_CONCURRENCY="100000", REACH_WARM_UP="0",
               REACH_CALLBACK_ALLOWED_NETWORKS="127.0.0.0/8")
    web, gateway = serve_gateway("reach_bench_drain", args.port, **env)
    workers = [start_worker("reach_bench_drain", concurrency=args.worker_concurrency, name=f"drain{k}", **env)
               for k in range(args.worker_processes)]
    receiver = Receiver()

    async def scenario():
        server = await asyncio.start_server(receiver.handle, "127.0.0.1", 0, backlog=4096)
        hook = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/hook"
        body = lambda: {"capability": "order.query", "payload": {"order_id": "42"}, "mode": "async",  # noqa: E731
                        "callback_url": hook, "request_id": uuid.uuid4().hex}
        t0 = time.perf_counter()
        submitted = await run_load(f"{gateway}/api/v1/invoke", body, concurrency=args.submitters, seconds=600,
                                   headers={"Authorization": f"Token {token}"}, ok_statuses=(202,),
                                   count=args.tasks)
        submit_s = time.perf_counter() - t0
        deadline = time.perf_counter() + args.wait
        while len(receiver.received) < submitted.ok and time.perf_counter() < deadline:
            await asyncio.sleep(0.1)
        await asyncio.sleep(1)  # late duplicates, if any
        server.close()
        return t0, submit_s, submitted

    meter = CpuMeter(submitter_and_receiver=CpuMeter.pid(os.getpid()), gateway=CpuMeter.process_groups(web.pid),
                     workers=CpuMeter.process_groups(*(w.pid for w in workers)),
                     agent=CpuMeter.process_groups(agents.pid), postgres=CpuMeter.named("postgres"),
                     redis=CpuMeter.named("redis-server"))
    counts_before = _counts()
    try:
        meter.start()
        t0, submit_s, submitted = asyncio.run(scenario())
        cpu = meter.stop(submitted.ok)
        stats = httpx.get(f"{agent_url}/stats", timeout=10).json()
    finally:
        for proc in (web, agents, *workers):
            os.killpg(proc.pid, signal.SIGTERM)
        for proc in (web, agents, *workers):
            proc.wait(30)
    counts = [(after - before) / max(1, submitted.ok) for before, after in zip(counts_before, _counts(), strict=True)]
    executions = stats["executions"]
    figures = {
        "tasks": args.tasks, "latency_ms": args.latency_ms, "worker_concurrency": args.worker_concurrency,
        "worker_processes": args.worker_processes,
        "submitted": submitted.ok, "submit_errors": submitted.errors, "submit_s": round(submit_s, 2),
        "drain_s": round(receiver.last_at - t0, 2) if receiver.received else None,
        "callbacks": len(receiver.received), "lost": submitted.ok - len(receiver.received),
        "duplicate_executions": sum(1 for n in executions.values() if n > 1),
        "duplicate_callbacks": sum(1 for n in receiver.received.values() if n > 1),
        "peak_in_flight": stats.get("max_in_flight"),
        "cpu_ms_per_task": cpu,
        # what a task costs in round trips, whatever the machine's speed: PostgreSQL transactions (a statement
        # outside a transaction is one) and Redis commands, per task, over the whole run
        "postgres_transactions_per_task": round(counts[0], 2), "redis_commands_per_task": round(counts[1], 2),
    }
    figures["interpreter"] = interpreter()
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
