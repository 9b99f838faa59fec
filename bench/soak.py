"""Soak: mixed sync, async (with callbacks) and resolve traffic at a steady rate for --minutes, against the
example registry (embedded, calibrated) with the order agent answering after --latency-ms.

python bench/soak.py [--minutes 10] [--rps 40] [--latency-ms 200]

Samples the resident memory of every gateway and worker process after the warm-up (a tenth of the run, at least
30 s), in the middle and at the end. Last line: JSON with each process's three readings, the largest growth
after warm-up (target, issue 11: <= 10 %), the requests sent by kind, their errors and what each error was.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import time
import uuid
from collections import Counter
from pathlib import Path

import httpx
from _common import (
    group_pids,
    register_descriptor_folder,
    rss_mb,
    serve_gateway,
    setup_django,
    start_order_agent,
    start_worker,
)
from _load import http_sink

BASE = Path(__file__).resolve().parent.parent
TEXTS = ["where is my order 12345", "summarize this quarterly report for me", "send a message to the on-call team",
         "generate the weekly sales report", "write a python function that parses dates", "查询我的订单物流"]


def _sample(groups: dict[str, int]) -> dict[str, float]:
    return {f"{name}:{pid}": value for name, pgid in groups.items() for pid in group_pids(pgid)
            if (value := rss_mb(pid)) is not None and value > 50}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--rps", type=float, default=40)
    parser.add_argument("--latency-ms", type=int, default=200)
    parser.add_argument("--port", type=int, default=8769)
    args = parser.parse_args()

    setup_django("reach_bench_soak")
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    register_descriptor_folder(BASE / "examples/descriptors")
    agents, _ = start_order_agent(port_offset=20500, faults={"latency_ms": args.latency_ms})
    token = Token.objects.create(user=get_user_model().objects.create_user("bench-caller")).key
    env = dict(REACH_CALLER_MAX_QPS="100000", REACH_CALLER_MAX_CONCURRENCY="100000",
               REACH_CALLBACK_ALLOWED_NETWORKS="127.0.0.0/8")
    web, gateway = serve_gateway("reach_bench_soak", args.port, **env)
    worker = start_worker("reach_bench_soak", **env)
    seconds = args.minutes * 60
    warm_up = max(30.0, seconds / 10)
    groups = {"web": web.pid, "worker": worker.pid}
    samples: dict[str, dict[str, float]] = {}
    sent = {"sync": 0, "async": 0, "resolve": 0}
    errors = {"sync": 0, "async": 0, "resolve": 0}
    failures: Counter[str] = Counter()  # "kind status" (or the exception's name) -> count

    async def scenario():
        sink = await asyncio.start_server(http_sink(), "127.0.0.1", 0, backlog=1024)
        hook = f"http://127.0.0.1:{sink.sockets[0].getsockname()[1]}/hook"
        rng = random.Random(0)
        limits = httpx.Limits(max_connections=256)
        async with httpx.AsyncClient(timeout=60, limits=limits,
                                     headers={"Authorization": f"Token {token}"}) as client:
            async def one(kind: str):
                sent[kind] += 1
                try:
                    if kind == "resolve":
                        r = await client.post(f"{gateway}/api/v1/resolve", json={"task": rng.choice(TEXTS)})
                        ok = r.status_code == 200
                    else:
                        body = {"capability": "order.query", "payload": {"order_id": str(rng.randint(1, 10**6))},
                                "request_id": uuid.uuid4().hex}
                        if kind == "async":
                            body.update(mode="async", callback_url=hook)
                        r = await client.post(f"{gateway}/api/v1/invoke", json=body)
                        ok = r.status_code in (200, 202)
                    why = str(r.status_code)
                except httpx.HTTPError as exc:
                    ok, why = False, type(exc).__name__
                errors[kind] += not ok
                if not ok:
                    failures[f"{kind} {why}"] += 1

            t0 = time.perf_counter()
            marks = {"warm_up": t0 + warm_up, "middle": t0 + warm_up + (seconds - warm_up) / 2}
            pending: set[asyncio.Task] = set()
            n = 0
            while (now := time.perf_counter()) < t0 + seconds:
                for name, at in list(marks.items()):
                    if now >= at:
                        samples[name] = _sample(groups)
                        del marks[name]
                kind = rng.choices(["sync", "async", "resolve"], weights=[6, 2, 2])[0]
                task = asyncio.create_task(one(kind))
                pending.add(task)
                task.add_done_callback(pending.discard)
                n += 1
                await asyncio.sleep(max(0.0, t0 + n / args.rps - time.perf_counter()))
            await asyncio.gather(*pending)
            samples["end"] = _sample(groups)
        sink.close()

    try:
        asyncio.run(scenario())
    finally:
        for proc in (web, agents, worker):
            os.killpg(proc.pid, signal.SIGTERM)
    per_process = {key: {phase: samples.get(phase, {}).get(key) for phase in ("warm_up", "middle", "end")}
                   for key in samples.get("end", {})}
    growth = {key: round((v["end"] - v["warm_up"]) / v["warm_up"], 3) for key, v in per_process.items()
              if v["warm_up"] and v["end"]}
    print(json.dumps({"minutes": args.minutes, "rps": args.rps, "rss_mb": per_process, "growth": growth,
                      "max_growth": max(growth.values()) if growth else None, "sent": sent, "errors": errors,
                      "failures": dict(failures)}))


if __name__ == "__main__":
    main()
