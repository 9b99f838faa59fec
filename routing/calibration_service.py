"""Fit and store the resolver's calibration from the ACTIVE capability versions' vectors."""

from __future__ import annotations

import numpy as np
from django.conf import settings

from registry.choices import VectorKind, VersionState
from registry.embedding import blas_threads, embedder_name, normalize_text
from registry.models import CapabilityVector, CapabilityVersion
from registry.vectors import embedding_bytes, vector_from_bytes
from routing.calibration import (
    HEAD_MAX_CAPABILITIES,
    LEXICAL_MAX_CAPABILITIES,
    RegistryTexts,
    fit_calibration,
    fit_head,
    keyword_hit_matrix,
    keyword_index,
)
from routing.models import RoutingCalibration
from routing.snapshot import bump_generation


def calibration_refresh(*, embedder: str | None = None) -> dict:
    name = embedder or embedder_name()
    kinds = (VectorKind.EXAMPLE, VectorKind.NEGATIVE, VectorKind.DESCRIPTION)
    texts: dict[str, dict[int, list]] = {kind: {} for kind in kinds}
    words: dict[str, dict[int, list[str]]] = {kind: {} for kind in kinds}
    rows = CapabilityVector.objects.filter(embedder=name, version__state=VersionState.ACTIVE, kind__in=kinds)
    # ordered: the cross-fitting folds follow each example's position, so the fit is reproducible
    ordered = rows.order_by("version_id", "kind", "position")
    for vid, kind, raw, text in ordered.values_list("version_id", "kind", embedding_bytes(), "text").iterator(
            chunk_size=5000):
        texts[kind].setdefault(vid, []).append(vector_from_bytes(raw))
        words[kind].setdefault(vid, []).append(normalize_text(text))
    ids = sorted(texts[VectorKind.EXAMPLE])
    keywords = {vid: {k.lower() for k in (kw or []) + (tags or [])} for vid, kw, tags in
                CapabilityVersion.objects.filter(pk__in=ids).values_list("pk", "keywords", "tags")}
    keyword_sets = [keywords.get(i, set()) for i in ids]
    ex = [np.asarray(texts[VectorKind.EXAMPLE][i], dtype=np.float32) for i in ids]
    dim = ex[0].shape[1] if ex else 1

    def matrices(kind: str) -> list[np.ndarray]:
        return [np.asarray(texts[kind].get(i, np.zeros((0, dim))), dtype=np.float32).reshape(-1, dim) for i in ids]

    use_head = 3 <= len(ids) <= HEAD_MAX_CAPABILITIES and all(len(e) >= 2 for e in ex)
    reach = settings.REACH

    index = keyword_index(keyword_sets)  # built once, not once per capability

    def hits(kind: str) -> list:
        """Each capability's rows of one hit matrix over all its texts (a matrix per capability cost 0.4 ms each)."""
        per = [words[kind].get(i, []) for i in ids]
        bounds = np.cumsum([0] + [len(texts) for texts in per])
        matrix = keyword_hit_matrix([text for texts in per for text in texts], keyword_sets, index)
        return [matrix[bounds[c]:bounds[c + 1]] for c in range(len(ids))]

    extra = head_texts(ids, words, matrices(VectorKind.DESCRIPTION)) if use_head else None
    if extra is not None:
        extra.lexical = len(ids) <= LEXICAL_MAX_CAPABILITIES
    with blas_threads():  # a process's BLAS runs on one thread outside batch work (see one_blas_thread)
        calibration = fit_calibration(ex, matrices(VectorKind.NEGATIVE), head=use_head,
                                      max_wrong=reach["EXECUTE_MAX_WRONG"], max_oos=reach["EXECUTE_MAX_OOS"],
                                      example_hits=hits(VectorKind.EXAMPLE), negative_hits=hits(VectorKind.NEGATIVE),
                                      texts=extra, candidates=int(reach["CANDIDATES"]),
                                      oos_coverage=reach["EXECUTE_OOS_COVERAGE"])
        head = fit_head(ex, ids, extra) if use_head else None
    RoutingCalibration.objects.update_or_create(embedder=name, defaults={
        "params": calibration.to_json(), "capabilities": len(ids), "head": head.to_bytes() if head else None})
    bump_generation()
    return {"embedder": name, "capabilities": len(ids), **calibration.to_json()}


def head_texts(ids: list[int], words: dict[str, dict[int, list[str]]], descriptions: list[np.ndarray]
               ) -> RegistryTexts:
    """What the head learns from besides the example vectors: the example and negative-case texts (its lexical
    block), and each version's description as an extra row."""
    return RegistryTexts(examples=[words[VectorKind.EXAMPLE][i] for i in ids],
                         negatives=[words[VectorKind.NEGATIVE].get(i, []) for i in ids],
                         extras=descriptions,
                         extra_texts=[list(words[VectorKind.DESCRIPTION].get(vid, []))[:len(d)]
                                      for vid, d in zip(ids, descriptions, strict=True)])
