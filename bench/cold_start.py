"""Cold start under load: a gateway node that has just started (one process, as after a deploy or a restart)
meets a burst of N callers at once as its very first requests; then the same burst again once it is warm.

python bench/cold_start.py [--concurrency 128] [--latency-ms 500] [--rounds 3] [--workers 1]

Each round starts a fresh node (reach_platform.serving: uvicorn, as production serves it) on its own database
(reach_bench_cold), sends the cold burst (N new connections of one caller, one invoke each), then a warm burst.
Last line: JSON with the median over the rounds of the cold and the warm burst's added p50 and max (latency
less the agent's), and each round's figures. What a node opens before its first request
(REACH_WARM_CONNECTIONS, reach_platform.engine.warm_up) shows as the gap between the two; --no-warm-connections
turns it off for the comparison.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import uuid

from _common import interpreter, serve_gateway, setup_django, start_order_agent
from _load import load


def _added(result, latency_ms: int) -> dict:
    return {"p50": round(result.pct(0.5) - latency_ms, 1), "max": round(result.pct(1.0) - latency_ms, 1),
            "errors": result.errors}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--concurrency", type=int, default=128)
    parser.add_argument("--latency-ms", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--no-warm-connections", action="store_true")
    parser.add_argument("--port", type=int, default=8777)
    args = parser.parse_args()

    setup_django("reach_bench_cold")
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    agents, _ = start_order_agent(port_offset=20300, faults={"latency_ms": args.latency_ms})
    token = Token.objects.create(user=get_user_model().objects.create_user("bench-caller")).key
    body = lambda: {"capability": "order.query", "payload": {"order_id": "42"},  # noqa: E731
                    "request_id": uuid.uuid4().hex}
    auth = {"Authorization": f"Token {token}"}
    rounds = []
    try:
        for _ in range(args.rounds):
            web, gateway = serve_gateway(
                "reach_bench_cold", args.port, REACH_CALLER_MAX_QPS="100000", REACH_CALLER_MAX_CONCURRENCY="100000",
                REACH_WARM_UP="0", WEB_WORKERS=str(args.workers),
                REACH_WARM_CONNECTIONS="0" if args.no_warm_connections else "1")
            try:
                burst = [load(f"{gateway}/api/v1/invoke", body, headers=auth, concurrency=args.concurrency,
                              seconds=120, count=args.concurrency) for _ in range(2)]
            finally:
                os.killpg(web.pid, signal.SIGTERM)
                web.wait(30)
            rounds.append({"cold": _added(burst[0], args.latency_ms), "warm": _added(burst[1], args.latency_ms)})
    finally:
        os.killpg(agents.pid, signal.SIGTERM)

    def median(which: str, field: str) -> float:
        return round(statistics.median(r[which][field] for r in rounds), 1)

    figures = {
        "concurrency": args.concurrency, "latency_ms": args.latency_ms, "workers": args.workers,
        "warm_connections": not args.no_warm_connections,
        "cold_added_p50_ms": median("cold", "p50"), "cold_added_max_ms": median("cold", "max"),
        "warm_added_p50_ms": median("warm", "p50"), "warm_added_max_ms": median("warm", "max"),
        "errors": sum(r[w]["errors"] for r in rounds for w in ("cold", "warm")), "rounds": rounds,
        "interpreter": interpreter(),
    }
    print(f"cold burst added p50 {figures['cold_added_p50_ms']} ms, warm {figures['warm_added_p50_ms']} ms")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
