"""Fit and store the resolver's calibration from the ACTIVE capability versions' vectors."""

from __future__ import annotations

import numpy as np

from registry.choices import VectorKind, VersionState
from registry.embedding import embedder_name
from registry.models import CapabilityVector
from routing.calibration import HEAD_MAX_CAPABILITIES, fit_calibration, fit_head_calibration
from routing.models import RoutingCalibration
from routing.snapshot import bump_generation


def calibration_refresh(*, embedder: str | None = None) -> dict:
    name = embedder or embedder_name()
    examples: dict[int, list] = {}
    negatives: dict[int, list] = {}
    rows = CapabilityVector.objects.filter(embedder=name, version__state=VersionState.ACTIVE,
                                           kind__in=[VectorKind.EXAMPLE, VectorKind.NEGATIVE])
    # ordered: the cross-fitting folds follow each example's position, so the fit is reproducible
    ordered = rows.order_by("version_id", "kind", "position")
    for vid, kind, emb in ordered.values_list("version_id", "kind", "embedding").iterator(chunk_size=5000):
        (examples if kind == VectorKind.EXAMPLE else negatives).setdefault(vid, []).append(emb)
    ids = sorted(examples)
    ex = [np.asarray(examples[i], dtype=np.float32) for i in ids]
    dim = ex[0].shape[1] if ex else 1
    neg = [np.asarray(negatives.get(i, np.zeros((0, dim))), dtype=np.float32).reshape(-1, dim) for i in ids]
    head = None
    if 3 <= len(ids) <= HEAD_MAX_CAPABILITIES and all(len(e) >= 2 for e in ex):
        calibration, head = fit_head_calibration(ex, neg, ids)
    else:
        calibration = fit_calibration(ex, neg)
    RoutingCalibration.objects.update_or_create(embedder=name, defaults={
        "params": calibration.to_json(), "capabilities": len(ids), "head": head.to_bytes() if head else None})
    bump_generation()
    return {"embedder": name, "capabilities": len(ids), **calibration.to_json()}
