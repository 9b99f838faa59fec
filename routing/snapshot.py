"""A per-process view of what routing needs from the registry, reloaded when the registry generation changes.

Redis holds a generation counter that every change relevant to routing bumps (activation, embedding, calibration,
registration, liveness). Each resolve reads it (one GET); when it moved, the snapshot is rebuilt from PostgreSQL.
Version vectors are immutable per (version, embedder) and cached separately, loaded on demand.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
from django.conf import settings

from registry.choices import ROUTABLE_LIVENESS, VectorKind, VersionState
from registry.generation import GENERATION_KEY, bump_generation, redis_client  # noqa: F401
from registry.models import CapabilityVector, CapabilityVersion, Instance


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
    instances: list[InstanceInfo] = field(default_factory=list)


@dataclass
class Snapshot:
    generation: int
    versions: dict[int, VersionInfo]
    by_capability: dict[str, list[VersionInfo]]
    calibration: object
    keyword_index: dict[str, set[int]]
    head: object = None              # routing.calibration.Head, when fitted
    head_rows: dict[int, int] = field(default_factory=dict)  # version id -> row of head.W


_lock = threading.Lock()
_snapshot: Snapshot | None = None
_vectors: OrderedDict[tuple[int, str], tuple[np.ndarray, np.ndarray]] = OrderedDict()
_VECTOR_CACHE_MAX = 20000


def _generation() -> int:
    raw = redis_client().get(GENERATION_KEY)
    return int(raw or 0)


def current() -> Snapshot:
    global _snapshot
    generation = _generation()
    snap = _snapshot
    if snap is not None and snap.generation == generation:
        return snap
    with _lock:
        if _snapshot is None or _snapshot.generation != generation:
            _snapshot = _build(generation)
        return _snapshot


def _build(generation: int) -> Snapshot:
    from registry.embedding import get_embedder
    from routing.calibration import Calibration, Head, default_calibration
    from routing.models import RoutingCalibration

    versions: dict[int, VersionInfo] = {}
    qs = (CapabilityVersion.objects.filter(state=VersionState.ACTIVE, capability__agent__status="active")
          .select_related("capability", "capability__agent"))
    for v in qs:
        versions[v.pk] = VersionInfo(
            id=v.pk, capability=v.capability.name, version=v.version, agent=v.capability.agent.endpoint_id,
            agent_id=v.capability.agent_id, action=v.action, domains=list(v.domains),
            keywords=[k.lower() for k in v.keywords], tags=[t.lower() for t in v.tags],
            input_schema=v.input_schema or {}, output_schema=v.output_schema or {},
            reject_conditions=v.reject_conditions or [], idempotent=v.idempotent,
            confidence_weight=v.confidence_weight, timeout_ms=v.timeout_ms, max_retries=v.max_retries,
            p95_latency_ms=v.p95_latency_ms, cost_per_call=float(v.cost_per_call), is_canary=v.is_canary,
            canary_share=v.canary_share,
        )
    by_agent: dict[int, list[InstanceInfo]] = {}
    for i in Instance.objects.filter(deregistered_at__isnull=True, liveness__in=ROUTABLE_LIVENESS):
        by_agent.setdefault(i.agent_id, []).append(InstanceInfo(
            id=i.pk, instance_id=i.instance_id, url=i.url, transport=i.transport, status_url=i.status_url,
            weight=i.weight, max_concurrency=i.max_concurrency, max_qps=i.max_qps, liveness=i.liveness))
    by_capability: dict[str, list[VersionInfo]] = {}
    keyword_index: dict[str, set[int]] = {}
    for info in versions.values():
        info.instances = by_agent.get(info.agent_id, [])
        by_capability.setdefault(info.capability, []).append(info)
        for kw in set(info.keywords) | set(info.tags):
            keyword_index.setdefault(kw, set()).add(info.id)
    row = RoutingCalibration.objects.filter(embedder=get_embedder().name).first()
    bands = settings.REACH
    calibration = (Calibration.from_json(row.params, bands["EXECUTE_AT"], bands["CONFIRM_AT"]) if row
                   else default_calibration())
    head = Head.from_bytes(row.head) if row and row.head else None
    head_rows = {int(vid): i for i, vid in enumerate(head.version_ids)} if head is not None else {}
    return Snapshot(generation=generation, versions=versions, by_capability=by_capability,
                    calibration=calibration, keyword_index=keyword_index, head=head, head_rows=head_rows)


def version_vectors(version_ids: list[int], embedder: str) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """(examples, negatives) matrices per version, from the cache or one query for the missing ones."""
    out, missing = {}, []
    for vid in version_ids:
        hit = _vectors.get((vid, embedder))
        if hit is None:
            missing.append(vid)
        else:
            out[vid] = hit
    if missing:
        rows: dict[int, dict[str, list]] = {vid: {"example": [], "negative": []} for vid in missing}
        for vid, kind, emb in (CapabilityVector.objects.filter(
                version_id__in=missing, embedder=embedder, kind__in=[VectorKind.EXAMPLE, VectorKind.NEGATIVE])
                .values_list("version_id", "kind", "embedding")):
            rows[vid][kind].append(np.asarray(emb, dtype=np.float32))
        for vid, kinds in rows.items():
            dim = len(kinds["example"][0]) if kinds["example"] else 1
            pair = (np.stack(kinds["example"]) if kinds["example"] else np.zeros((0, dim), np.float32),
                    np.stack(kinds["negative"]) if kinds["negative"] else np.zeros((0, dim), np.float32))
            _vectors[(vid, embedder)] = pair
            out[vid] = pair
        while len(_vectors) > _VECTOR_CACHE_MAX:
            _vectors.popitem(last=False)
    return out


def clear_caches() -> None:
    global _snapshot
    _snapshot = None
    _vectors.clear()

