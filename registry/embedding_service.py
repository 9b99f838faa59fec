"""Embedding capability versions into pgvector."""

from __future__ import annotations

import numpy as np
from django.db import transaction

from registry.choices import VectorKind
from registry.embedding import Embedder, get_embedder, normalize_text
from registry.models import CapabilityVector, CapabilityVersion
from registry.vectors import ensure_hnsw_index


def version_texts(version: CapabilityVersion) -> list[tuple[str, int, str]]:
    texts: list[tuple[str, int, str]] = []
    texts += [(VectorKind.EXAMPLE, i, str(t)) for i, t in enumerate(version.examples)]
    texts += [(VectorKind.NEGATIVE, i, str(t)) for i, t in enumerate(version.negative_cases)]
    if version.description:
        texts.append((VectorKind.DESCRIPTION, 0, version.description))
    return texts


def capability_version_embed(*, version: CapabilityVersion, embedder: Embedder | None = None) -> int:
    """(Re)build every vector of one version for the embedder: examples, negatives, description and the centroid
    of the examples. Returns the number of rows written."""
    embedder = embedder or get_embedder()
    texts = version_texts(version)
    matrix = embedder.encode([normalize_text(t) for _, _, t in texts])
    rows = [
        CapabilityVector(version=version, embedder=embedder.name, dim=embedder.dim, kind=kind, position=pos,
                         text=text, embedding=matrix[i])
        for i, (kind, pos, text) in enumerate(texts)
    ]
    example_rows = [i for i, (kind, _, _) in enumerate(texts) if kind == VectorKind.EXAMPLE]
    if example_rows:
        centroid = matrix[example_rows].mean(axis=0)
        centroid /= max(float(np.linalg.norm(centroid)), 1e-12)
        rows.append(CapabilityVector(version=version, embedder=embedder.name, dim=embedder.dim,
                                     kind=VectorKind.CENTROID, position=0, text="", embedding=centroid))
    ensure_hnsw_index(embedder.dim)
    with transaction.atomic():
        CapabilityVector.objects.filter(version=version, embedder=embedder.name).delete()
        CapabilityVector.objects.bulk_create(rows, batch_size=500)
        CapabilityVersion.objects.filter(pk=version.pk).update(embedded_with=embedder.name)
    return len(rows)
