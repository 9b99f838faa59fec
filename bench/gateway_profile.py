"""Where the gateway's time goes per sync invoke: wall time split into PostgreSQL, Redis, the agent call and the
rest (Django, DRF, resolver, gateway code), measured in-process over N sequential invokes through the real view.

python bench/gateway_profile.py [--requests 300] [--cprofile 25]

The example order-agent answers at once (no injected latency), so "agent" is the HTTP round trip to it. With
--cprofile K, also prints the K functions with the most cumulative time. Last line: JSON with per-request
milliseconds (mean) for each part and the number of PostgreSQL statements and Redis commands per request.
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
        def wrapper(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
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

    import httpx
    import redis
    from django.contrib.auth import get_user_model
    from django.db import connection
    from rest_framework.authtoken.models import Token
    from rest_framework.test import APIClient


    agents, _ = start_order_agent(port_offset=21000, instance_id="profile")
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
    db, rds, agent = Meter(), Meter(), Meter()

    def db_wrapper(execute, sql, params, many, context):
        t = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            db.seconds += time.perf_counter() - t
            db.calls += 1

    try:
        with connection.execute_wrapper(db_wrapper), \
                mock.patch.object(redis.Redis, "execute_command", rds.timed(redis.Redis.execute_command)), \
                mock.patch.object(httpx.Client, "send", agent.timed(httpx.Client.send)):
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
    parts = {"total_ms": wall / n * 1000, "postgres_ms": db.seconds / n * 1000, "redis_ms": rds.seconds / n * 1000,
             "agent_http_ms": agent.seconds / n * 1000}
    parts["rest_ms"] = parts["total_ms"] - parts["postgres_ms"] - parts["redis_ms"] - parts["agent_http_ms"]
    figures = {k: round(v, 2) for k, v in parts.items()}
    figures.update(postgres_statements=round(db.calls / n, 1), redis_commands=round(rds.calls / n, 1),
                   requests=n)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
