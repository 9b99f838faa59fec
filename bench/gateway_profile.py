"""Where the gateway's time goes per sync invoke: wall time split into PostgreSQL on the event loop, work in the
database threads, Redis, the agent call and the rest (Django, DRF, resolver, gateway code), measured in-process
over N sequential invokes through the real view and the one invoke path (``routing/invoke.py``).

python bench/gateway_profile.py [--requests 300] [--cprofile 25]

The meters wrap the primitives every invoke awaits: ``rowsql.afetch`` (a statement on the loop's own pool),
``engine.db`` (a function in a database thread: ORM work, a resolve), the loop's Redis client (commands and the
auto-pipeliner's batches) and ``engine.post_json`` (the agent call). The example order-agent answers at once
(its descriptor's 30 ms are turned off), so "agent" is the HTTP round trip to it. Calls run one at a time, so
each part is wall time the request waited on it. With --cprofile K, also prints the K functions with the most
cumulative time (of this thread: the loop's thread is not profiled). Last line: JSON with per-request
milliseconds (mean) for each part and the number of calls of each per request.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import uuid
from pathlib import Path

from _common import setup_django, start_order_agent

BASE = Path(__file__).resolve().parent.parent


class Meter:
    def __init__(self):
        self.seconds = 0.0
        self.calls = 0

    def timed(self, fn):
        async def wrapper(*args, **kwargs):
            t = time.perf_counter()
            try:
                return await fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t
                self.calls += 1
        return wrapper


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--cprofile", type=int, default=0)
    args = parser.parse_args()
    setup_django("reach_bench_profile")
    from unittest import mock

    import redis.asyncio as aioredis
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token
    from rest_framework.test import APIClient

    from reach_platform import engine
    from routing import rowsql

    agents, _ = start_order_agent(port_offset=21000, instance_id="profile", faults={"latency_ms": 0})
    user = get_user_model().objects.create_user("profile-caller")
    token = Token.objects.create(user=user).key
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")

    def invoke():
        r = client.post("/api/v1/invoke", {"capability": "order.query", "payload": {"order_id": "42"},
                                           "request_id": uuid.uuid4().hex}, format="json")
        assert r.status_code == 200, r.content

    for _ in range(30):  # warm-up: connections, snapshot, caches
        invoke()
    pg, threads, rds, batches, agent = Meter(), Meter(), Meter(), Meter(), Meter()
    try:
        with mock.patch.object(rowsql, "afetch", pg.timed(rowsql.afetch)), \
                mock.patch.object(engine, "db", threads.timed(engine.db)), \
                mock.patch.object(aioredis.Redis, "execute_command", rds.timed(aioredis.Redis.execute_command)), \
                mock.patch.object(engine._Pipeliner, "send", batches.timed(engine._Pipeliner.send)), \
                mock.patch.object(engine, "post_json", agent.timed(engine.post_json)):
            t0 = time.perf_counter()
            for _ in range(args.requests):
                invoke()
            wall = time.perf_counter() - t0
        if args.cprofile:
            import cProfile
            import pstats

            profile = cProfile.Profile()
            profile.enable()
            for _ in range(args.requests):
                invoke()
            profile.disable()
            pstats.Stats(profile).sort_stats(os.environ.get("PROFILE_SORT", "cumulative")).print_stats(args.cprofile)
    finally:
        agents.terminate()
    n = args.requests
    meters = {"postgres_loop": pg, "db_threads": threads, "redis": rds, "redis_pipelined": batches,
              "agent_http": agent}
    parts = {"total_ms": wall / n * 1000, **{f"{name}_ms": m.seconds / n * 1000 for name, m in meters.items()}}
    parts["rest_ms"] = parts["total_ms"] - sum(m.seconds for m in meters.values()) / n * 1000
    figures: dict = {k: round(v, 2) for k, v in parts.items()}
    figures.update({f"{name}_calls": round(m.calls / n, 2) for name, m in meters.items()}, requests=n)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
