"""A per-process view of what routing needs from the registry, reloaded when the registry generation changes.

It holds the centroids of the ACTIVE versions as one matrix: the exact nearest-centroid search is a matrix product
(about 1 ms at 10,000 capabilities), where a pgvector scan of the same rows costs 5 ms at 1,000 because each
512-d vector is TOASTed and the planner prefers an exact scan to the HNSW index at that size.

Redis holds a generation counter that every change relevant to routing bumps (activation, embedding, calibration,
registration, liveness). Each resolve reads it (one GET); when it moved, the snapshot is rebuilt from PostgreSQL.
Centroids are immutable per (version, embedder) and cached separately.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

import numpy as np
from django.conf import settings

from registry.choices import ROUTABLE_LIVENESS, VectorKind, VersionState
from registry.generation import GENERATION_KEY, bump_generation, redis_client  # noqa: F401
from registry.models import CapabilityVector, CapabilityVersion, Instance
from registry.vectors import VectorCache, embedding_bytes, vector_from_bytes

if TYPE_CHECKING:
    from routing.calibration import Calibration, Head


@dataclass
class InstanceInfo:
    id: int
    instance_id: str
    url: str
    transport: str
    status_url: str
    weight: int
    max_concurrency: int
    max_qps: float
    liveness: str
    versions: tuple[str, ...] = ()


@dataclass
class VersionInfo:
    id: int
    capability: str
    version: str
    agent: str
    agent_id: int
    action: str
    domains: list[str]
    keywords: list[str]
    tags: list[str]
    input_schema: dict
    output_schema: dict
    reject_conditions: list
    idempotent: bool
    confidence_weight: float
    timeout_ms: int
    max_retries: int
    p95_latency_ms: float
    cost_per_call: float
    is_canary: bool
    canary_share: float
    negatives: int = 0
    team: str = ""
    model_name: str = ""
    price_in: object = 0   # Decimal, per 1k input tokens
    price_out: object = 0  # Decimal, per 1k output tokens
    avg_tokens: int = 0
    embedded_with: str = ""  # changes when the version is re-embedded (a new revision of the embedder)
    instances: list[InstanceInfo] = field(default_factory=list)


@dataclass
class Snapshot:
    generation: str
    versions: dict[int, VersionInfo]
    by_capability: dict[str, list[VersionInfo]]
    calibration: Calibration
    keyword_index: dict[str, set[int]]
    head: Head | None = None         # when fitted
    head_rows: dict[int, int] = field(default_factory=dict)  # version id -> row of head.W
    centroid_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    centroids: np.ndarray = field(default_factory=lambda: np.zeros((0, 1), dtype=np.float32))


_lock = threading.Lock()
_snapshot: Snapshot | None = None
_centroids: dict[tuple[int, str], tuple[str, np.ndarray]] = {}  # (version, embedder) -> (embedded_with, centroid)
# example and negative-case vectors, for the resolver's in-process scores of its best candidates (read with the
# snapshot as far as REACH_VECTOR_CACHE_MB goes)
TEXT_VECTORS = VectorCache(kinds=(VectorKind.EXAMPLE, VectorKind.NEGATIVE))


def _generation() -> str:
    return cast(bytes, redis_client().get(GENERATION_KEY) or b"").decode()


def current(generation: str | None = None) -> Snapshot:
    """The routing snapshot of ``generation`` (read from Redis when not given: the caller's admission reads it
    in its own round trip, ``routing.admission.caller_acquire``)."""
    global _snapshot
    generation = _generation() if generation is None else generation
    snap = _snapshot
    if snap is not None and snap.generation == generation:
        return snap
    with _lock:
        if _snapshot is None or _snapshot.generation != generation:
            _snapshot = _build(generation)
        return _snapshot


def built() -> Snapshot | None:
    """The snapshot this process built last (None before its first), without asking Redis whether it is current."""
    return _snapshot


def last() -> Snapshot:
    """The snapshot this process built last, without asking Redis whether it is current: for reads after a resolve
    in the same request (prices of the versions just called, whether one is a canary)."""
    return _snapshot or current()


def _build(generation: str) -> Snapshot:
    from registry.embedding import embedder_name
    from routing.calibration import Calibration, Head, default_calibration
    from routing.models import RoutingCalibration

    versions: dict[int, VersionInfo] = {}
    qs = (CapabilityVersion.objects.filter(state=VersionState.ACTIVE, capability__agent__status="active")
          .select_related("capability", "capability__agent", "capability__agent__team"))
    for v in qs:
        versions[v.pk] = VersionInfo(
            id=v.pk, capability=v.capability.name, version=v.version, agent=v.capability.agent.endpoint_id,
            agent_id=v.capability.agent_id, action=v.action, domains=list(v.domains),
            keywords=[k.lower() for k in v.keywords], tags=[t.lower() for t in v.tags],
            input_schema=v.input_schema or {}, output_schema=v.output_schema or {},
            reject_conditions=v.reject_conditions or [], idempotent=v.idempotent,
            confidence_weight=v.confidence_weight, timeout_ms=v.timeout_ms, max_retries=v.max_retries,
            p95_latency_ms=v.p95_latency_ms, cost_per_call=float(v.cost_per_call), is_canary=v.is_canary,
            canary_share=v.canary_share, negatives=len(v.negative_cases or []), team=v.capability.agent.team.slug,
            model_name=v.model_name, price_in=v.price_per_1k_input_tokens, price_out=v.price_per_1k_output_tokens,
            avg_tokens=v.avg_tokens_per_call, embedded_with=v.embedded_with,
        )
    by_agent: dict[int, list[InstanceInfo]] = {}
    for i in Instance.objects.filter(deregistered_at__isnull=True, liveness__in=ROUTABLE_LIVENESS):
        by_agent.setdefault(i.agent_id, []).append(InstanceInfo(
            id=i.pk, instance_id=i.instance_id, url=i.url, transport=i.transport, status_url=i.status_url,
            weight=i.weight, max_concurrency=i.max_concurrency, max_qps=i.max_qps, liveness=i.liveness, versions=tuple(i.versions)))
    by_capability: dict[str, list[VersionInfo]] = {}
    keyword_index: dict[str, set[int]] = {}
    for info in versions.values():
        # an instance that names the versions it serves takes only their traffic (a canary on its own copies)
        info.instances = [i for i in by_agent.get(info.agent_id, []) if not i.versions or info.version in i.versions]
        by_capability.setdefault(info.capability, []).append(info)
        for kw in set(info.keywords) | set(info.tags):
            keyword_index.setdefault(kw, set()).add(info.id)
    row = RoutingCalibration.objects.filter(embedder=embedder_name()).first()
    bands = settings.REACH
    calibration = (Calibration.from_json(row.params, bands["EXECUTE_AT"], bands["CONFIRM_AT"]) if row
                   else default_calibration())
    head = Head.from_bytes(bytes(row.head)) if row and row.head else None
    stamps = {vid: info.embedded_with for vid, info in versions.items()}
    centroid_ids, centroids = _centroid_matrix(stamps, embedder_name())
    TEXT_VECTORS.restamp(stamps)  # versions re-embedded since they were read are read again
    TEXT_VECTORS.preload(list(versions), embedder_name())
    head_rows = {int(vid): i for i, vid in enumerate(head.version_ids)} if head is not None else {}
    return Snapshot(generation=generation, versions=versions, by_capability=by_capability,
                    calibration=calibration, keyword_index=keyword_index, head=head, head_rows=head_rows,
                    centroid_ids=centroid_ids, centroids=centroids)


def _centroid_matrix(stamps: dict[int, str], embedder: str) -> tuple[np.ndarray, np.ndarray]:
    """The centroids of the ACTIVE versions (``stamps``: each one's ``embedded_with``) as one matrix. A version's
    centroid changes only when it is re-embedded, which changes its stamp, so only versions not seen before or
    re-embedded since are read from pgvector (a rebuild after a liveness change reads nothing)."""
    missing = [vid for vid, stamp in stamps.items()
               if (vid, embedder) not in _centroids or _centroids[(vid, embedder)][0] != stamp]
    for start in range(0, len(missing), 2000):
        chunk = missing[start:start + 2000]
        for vid, raw in CapabilityVector.objects.filter(version_id__in=chunk, embedder=embedder,
                                                         kind=VectorKind.CENTROID).values_list("version_id",
                                                                                               embedding_bytes()):
            _centroids[(vid, embedder)] = (stamps[vid], vector_from_bytes(raw))
    have = [vid for vid in stamps if (vid, embedder) in _centroids]
    if not have:
        return np.zeros(0, dtype=np.int64), np.zeros((0, 1), dtype=np.float32)
    return np.array(have, dtype=np.int64), np.stack([_centroids[(vid, embedder)][1] for vid in have])


def clear_caches() -> None:
    global _snapshot
    _snapshot = None
    _centroids.clear()
    TEXT_VECTORS.clear()

