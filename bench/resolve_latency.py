"""Resolve latency with 100, 1,000 and 10,000 registered capabilities (10 examples each).

python bench/resolve_latency.py [--data ../shared/data/clinc150/data_full.json] [--sizes 100,1000,10000]
                                [--queries 200]

Capabilities are registered through the real import, embedding and calibration path (a database of their own,
reach_bench_latency). Example texts are CLINC150 training utterances, each capability drawing 10 of them with a
capability-specific suffix so that no two capabilities share a text. Queries are CLINC150 test utterances:
"cold" = the query embedding is computed (process and Redis caches flushed), "warm" = the same queries again.
Last line: JSON with p50_ms_<N>, p95_ms_<N> (cold), warm_p50/p95_ms_<N> and, for each N, ``setup_s_<N>``: the seconds
to import, activate, embed and calibrate the N capabilities (issue 15 item 5: setup_s_10000 <= 300), split into
setup_import_s_<N>, setup_embed_s_<N> and setup_calibrate_s_<N>.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

from _common import register_capabilities, setup_django

DEFAULT_DATA = Path(__file__).resolve().parent.parent.parent / "shared/data/clinc150/data_full.json"
WORDS = ("please", "now", "today", "quickly", "for me", "again", "asap", "kindly", "if you can", "thanks")


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * (len(values) - 1)))], 2)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default=str(DEFAULT_DATA))
    parser.add_argument("--sizes", default="100,1000,10000")
    parser.add_argument("--queries", type=int, default=200)
    args = parser.parse_args()
    data = json.loads(Path(args.data).read_text())
    train = [t for t, _ in data["train"]]
    queries = [t for t, _ in data["test"]]
    rng = random.Random(0)
    rng.shuffle(queries)
    figures: dict[str, float] = {}
    first = True
    for size in [int(s) for s in args.sizes.split(",")]:
        if first:
            setup_django("reach_bench_latency")
            first = False
        else:
            from django.db import connection

            from registry.models import Agent, AllowlistEntry, AuditLog, Capability, Team

            with connection.cursor() as cursor:
                cursor.execute("TRUNCATE registry_capabilityvector, registry_capabilityversion, registry_capability, "
                               "registry_instance, registry_agent, registry_allowlistentry, registry_auditlog, "
                               "routing_routingcalibration CASCADE")
            assert not (Agent.objects.exists() or Capability.objects.exists() or AllowlistEntry.objects.exists()
                        or AuditLog.objects.exists() or not Team.objects.exists())
        from routing import resolver, snapshot

        caps = {}
        for i in range(size):
            picks = rng.sample(train, 10)
            caps[f"cap.{i:05d}"] = [f"{t} {WORDS[(i + k) % len(WORDS)]} #{i}" for k, t in enumerate(picks)]
        t0 = time.time()
        steps: dict[str, float] = {}
        register_capabilities(caps, timings=steps)
        setup_s = time.time() - t0
        resolver.resolve(task="warm up the snapshot and the connection")
        sample = queries[: args.queries]

        def run(sample: list[str]) -> list[float]:
            out = []
            for text in sample:
                t = time.perf_counter()
                resolver.resolve(task=text)
                out.append((time.perf_counter() - t) * 1000)
            return out

        resolver._EMBED_CACHE.clear()
        for key in snapshot.redis_client().scan_iter("reach:emb:*"):
            snapshot.redis_client().delete(key)
        cold = run(sample)
        warm = run(sample)
        figures[f"p50_ms_{size}"] = percentile(cold, 0.5)
        figures[f"p95_ms_{size}"] = percentile(cold, 0.95)
        figures[f"warm_p50_ms_{size}"] = percentile(warm, 0.5)
        figures[f"warm_p95_ms_{size}"] = percentile(warm, 0.95)
        figures[f"setup_s_{size}"] = round(setup_s, 1)
        for step, seconds in steps.items():  # import_s, embed_s, calibrate_s: where the set-up time goes
            figures[f"setup_{step}_{size}"] = round(seconds, 1)
        print(f"{size:>6} capabilities: cold p50 {figures[f'p50_ms_{size}']} ms, p95 {figures[f'p95_ms_{size}']} ms;"
              f" warm p50 {figures[f'warm_p50_ms_{size}']} ms, p95 {figures[f'warm_p95_ms_{size}']} ms"
              f" (set-up {setup_s:.0f} s: " + ", ".join(f"{k} {v:.1f}" for k, v in steps.items()) + ")", flush=True)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
