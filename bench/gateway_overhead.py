"""Gateway overhead: the same local example agent (answering after a fixed 20 ms), called directly with httpx and
through POST /api/v1/invoke (sync), by N concurrent clients for D seconds each way, in one run.

python bench/gateway_overhead.py [--concurrency 16] [--seconds 30] [--workers 2]

The gateway is served as production serves it (reach_platform.serving: uvicorn, --workers processes) on its
own database (reach_bench_gateway). Last line: JSON with direct_rps, gateway_rps, ratio, added_p50_ms,
added_p95_ms, concurrency, and the CPU milliseconds per request of each process group in each phase (load
generator, gateway, agent, PostgreSQL, Redis): where the cores go.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
import time
import uuid
from pathlib import Path

import httpx
from _common import CpuMeter, interpreter, serve_gateway, setup_django, start_order_agent

BASE = Path(__file__).resolve().parent.parent


def load(url: str, body_for, headers: dict, concurrency: int, seconds: float) -> tuple[float, list[float], int]:
    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()
    stop_at = time.perf_counter() + seconds

    def worker():
        with httpx.Client(timeout=30, headers=headers) as client:
            mine, bad = [], 0
            while time.perf_counter() < stop_at:
                t = time.perf_counter()
                r = client.post(url, json=body_for())
                if r.status_code == 200:
                    mine.append((time.perf_counter() - t) * 1000)
                else:
                    bad += 1
            with lock:
                latencies.extend(mine)
                errors[0] += bad

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    elapsed = time.perf_counter() - t0
    return len(latencies) / elapsed, sorted(latencies), errors[0]


def pct(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * (len(values) - 1)))] if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args()

    setup_django("reach_bench_gateway")
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    agents, agent_url = start_order_agent(port_offset=20000, faults={"latency_ms": 20})
    user = get_user_model().objects.create_user("bench-caller")
    token = Token.objects.create(user=user).key
    web, gateway = serve_gateway("reach_bench_gateway", args.port, WEB_WORKERS=str(args.workers),
                                 REACH_WARM_UP="0", REACH_CALLER_MAX_QPS="100000",
                                 REACH_CALLER_MAX_CONCURRENCY="10000")
    try:
        payload = {"order_id": "42"}
        direct_body = lambda: {"capability": "order.query", "payload": payload,  # noqa: E731
                               "request_id": uuid.uuid4().hex}
        gateway_body = lambda: {"capability": "order.query", "payload": payload,  # noqa: E731
                                "request_id": uuid.uuid4().hex}
        auth = {"Authorization": f"Token {token}"}
        load(f"{gateway}/api/v1/invoke", gateway_body, auth, args.concurrency, 3)  # warm-up: connections, caches
        meter = CpuMeter(load_generator=CpuMeter.pid(os.getpid()), gateway=CpuMeter.process_groups(web.pid),
                         agent=CpuMeter.process_groups(agents.pid), postgres=CpuMeter.named("postgres"),
                         redis=CpuMeter.named("redis-server"))
        meter.start()
        direct_rps, direct_lat, direct_err = load(f"{agent_url}/invoke", direct_body, {}, args.concurrency,
                                                  args.seconds)
        direct_cpu = meter.stop(len(direct_lat) + direct_err)
        meter.start()
        gw_rps, gw_lat, gw_err = load(f"{gateway}/api/v1/invoke", gateway_body, auth, args.concurrency,
                                      args.seconds)
        gateway_cpu = meter.stop(len(gw_lat) + gw_err)
    finally:
        for proc in (web, agents):
            os.killpg(proc.pid, signal.SIGTERM)
    figures = {
        "direct_rps": round(direct_rps, 1), "gateway_rps": round(gw_rps, 1),
        "ratio": round(gw_rps / direct_rps, 3) if direct_rps else None,
        "direct_p50_ms": round(pct(direct_lat, 0.5), 2), "direct_p95_ms": round(pct(direct_lat, 0.95), 2),
        "gateway_p50_ms": round(pct(gw_lat, 0.5), 2), "gateway_p95_ms": round(pct(gw_lat, 0.95), 2),
        "added_p50_ms": round(pct(gw_lat, 0.5) - pct(direct_lat, 0.5), 2),
        "added_p95_ms": round(pct(gw_lat, 0.95) - pct(direct_lat, 0.95), 2),
        "errors": direct_err + gw_err, "concurrency": args.concurrency,
        # CPU milliseconds per request by process group, all threads (2 cores give 2,000 ms per second)
        "cpu_ms_per_request_direct": direct_cpu, "cpu_ms_per_request_gateway": gateway_cpu,
        "workers": args.workers,
    }
    print(f"direct  {figures['direct_rps']:>8} rps  p50 {figures['direct_p50_ms']} ms  p95 {figures['direct_p95_ms']} ms")
    print(f"gateway {figures['gateway_rps']:>8} rps  p50 {figures['gateway_p50_ms']} ms  p95 {figures['gateway_p95_ms']} ms")
    for phase in ("direct", "gateway"):
        cpu = figures[f"cpu_ms_per_request_{phase}"]
        print(f"CPU ms per request, {phase:7}: " + ", ".join(f"{k} {v}" for k, v in cpu.items())
              + f" (total {sum(cpu.values()):.2f})")
    figures["interpreter"] = interpreter()
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
