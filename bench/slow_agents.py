"""Slow agents: the example order agent answering after --latency-ms, called by N concurrent callers for D seconds
directly and through POST /api/v1/invoke (sync), in one run.

python bench/slow_agents.py [--latency-ms 2000] [--concurrency 256] [--seconds 20]

The gateway is served as production serves it (reach_platform.serving: uvicorn, WEB_WORKERS processes) on its
own database (reach_bench_slow). Last line: JSON with direct_rps, gateway_rps, ratio, added_p50_ms, added_p95_ms,
errors, the peak RSS (MB) of each gateway process, the CPU milliseconds per request of the gateway phase by process
group (gateway, PostgreSQL, Redis, agent, load generator), and the added p50 of the first, second and last wave of
answers, and of every wave (``all``: all callers start at once, so the first waves show the burst; the last
wave has no new requests behind it, so the middle waves show the steady state). Targets
(issue 11): ratio >= 0.9 and added p50 <= 30 ms at 256 callers, ratio >= 0.8 at 1,024, no errors.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import uuid

from _common import CpuMeter, interpreter, peak_rss_mb, serve_gateway, setup_django, start_order_agent
from _load import load


def _by_wave(through, direct, size: int) -> dict:
    base = direct.pct(0.5)
    waves = [through.latencies_ms[i:i + size] for i in range(0, len(through.latencies_ms), size)]
    waves = [w for w in waves if len(w) == size]

    def p50(values):
        return round(sorted(values)[len(values) // 2] - base, 1)

    return {"first": p50(waves[0]), "second": p50(waves[1]), "last": p50(waves[-1]),
            "all": [p50(w) for w in waves]} if len(waves) >= 3 else {}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--latency-ms", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--port", type=int, default=8766)
    args = parser.parse_args()

    setup_django("reach_bench_slow")
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    agents, agent_url = start_order_agent(port_offset=20100, faults={"latency_ms": args.latency_ms})
    token = Token.objects.create(user=get_user_model().objects.create_user("bench-caller")).key
    web, gateway = serve_gateway("reach_bench_slow", args.port, REACH_CALLER_MAX_QPS="100000",
                                 REACH_CALLER_MAX_CONCURRENCY="100000", REACH_WARM_UP="0")
    try:
        body = lambda: {"capability": "order.query", "payload": {"order_id": "42"},  # noqa: E731
                        "request_id": uuid.uuid4().hex}
        auth = {"Authorization": f"Token {token}"}
        load(f"{gateway}/api/v1/invoke", body, headers=auth, concurrency=min(args.concurrency, 64), seconds=3)
        direct = load(f"{agent_url}/invoke", body, concurrency=args.concurrency, seconds=args.seconds)
        meter = CpuMeter(load_generator=CpuMeter.pid(os.getpid()), gateway=CpuMeter.process_groups(web.pid),
                         agent=CpuMeter.process_groups(agents.pid), postgres=CpuMeter.named("postgres"),
                         redis=CpuMeter.named("redis-server"))
        meter.start()
        through = load(f"{gateway}/api/v1/invoke", body, headers=auth, concurrency=args.concurrency,
                       seconds=args.seconds)
        cpu = meter.stop(len(through.latencies_ms) + through.errors)
        rss = peak_rss_mb(web.pid)
    finally:
        for proc in (web, agents):
            os.killpg(proc.pid, signal.SIGTERM)
    figures = {
        "latency_ms": args.latency_ms, "concurrency": args.concurrency, "seconds": args.seconds,
        "direct_rps": round(direct.rps, 1), "gateway_rps": round(through.rps, 1),
        "ratio": round(through.rps / direct.rps, 3) if direct.rps else None,
        "direct_p50_ms": round(direct.pct(0.5), 1), "gateway_p50_ms": round(through.pct(0.5), 1),
        "added_p50_ms": round(through.pct(0.5) - direct.pct(0.5), 1),
        "added_p95_ms": round(through.pct(0.95) - direct.pct(0.95), 1),
        "errors": direct.errors + through.errors, "direct_errors": direct.errors, "gateway_errors": through.errors,
        "gateway_statuses": through.statuses, "gateway_peak_rss_mb": rss,
        # the answers in the order they came, by wave of N: all N callers start at once, so the first waves queue
        # behind each other (how long the gateway takes to absorb that burst), the middle ones show the steady state
        # (the last has no new requests behind it)
        "added_p50_ms_by_wave": _by_wave(through, direct, args.concurrency),
        # CPU per request through the gateway, by process group: steadier than the rates on a machine whose speed
        # drifts, and what caps them once the cores are full
        "cpu_ms_per_request_gateway": cpu,
    }
    print(f"direct  {figures['direct_rps']:>8} rps  p50 {figures['direct_p50_ms']} ms")
    print(f"gateway {figures['gateway_rps']:>8} rps  p50 {figures['gateway_p50_ms']} ms  ratio {figures['ratio']}")
    figures["interpreter"] = interpreter()
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
