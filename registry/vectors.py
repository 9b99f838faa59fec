"""pgvector storage: per-dimension partial HNSW indexes and nearest-neighbour queries.

The ``embedding`` column has no fixed dimension so that vectors of several embedders coexist. HNSW needs a fixed
dimension, so each dimension gets a partial expression index ``(embedding::vector(D)) WHERE dim = D``; queries use
the same expression so the planner can take the index.
"""

from __future__ import annotations

import numpy as np
from django.db import connection

KNOWN_DIMS = (384, 512, 768)


_indexed_dims: set[int] = set()


def ensure_hnsw_index(dim: int) -> None:
    """Create the partial HNSW index for ``dim`` unless it exists (migrations create 384/512/768)."""
    dim = int(dim)
    if dim in _indexed_dims:
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_indexes WHERE indexname = %s", [f"registry_capvec_hnsw_{dim}"])
        if cursor.fetchone():
            _indexed_dims.add(dim)
            return
        cursor.execute(
            f"CREATE INDEX IF NOT EXISTS registry_capvec_hnsw_{dim} ON registry_capabilityvector "
            f"USING hnsw ((embedding::vector({dim})) vector_cosine_ops) WHERE dim = {dim}"
        )
    _indexed_dims.add(dim)


def vector_literal(vector: np.ndarray) -> str:
    return "[" + ",".join(f"{x:.6f}" for x in vector.tolist()) + "]"


def nearest_versions(*, query: np.ndarray, embedder: str, kind: str = "centroid", limit: int = 10,
                     active_only: bool = True) -> list[tuple[int, float]]:
    """(version_id, cosine similarity) of the nearest vectors of ``kind``, best first, through the HNSW index."""
    dim = int(query.shape[0])
    state_join = (" JOIN registry_capabilityversion v ON v.id = cv.version_id AND v.state = 'active'"
                  if active_only else "")
    sql = (
        f"SELECT cv.version_id, 1 - (cv.embedding::vector({dim}) <=> %s::vector({dim})) AS sim "
        f"FROM registry_capabilityvector cv{state_join} "
        f"WHERE cv.dim = %s AND cv.embedder = %s AND cv.kind = %s "
        f"ORDER BY cv.embedding::vector({dim}) <=> %s::vector({dim}) LIMIT %s"
    )
    literal = vector_literal(query)
    with connection.cursor() as cursor:
        cursor.execute(sql, [literal, dim, embedder, kind, literal, limit])
        return [(row[0], float(row[1])) for row in cursor.fetchall()]
