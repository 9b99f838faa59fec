"""pgvector storage: per-dimension partial HNSW indexes over the centroids, and nearest-neighbour queries.

The ``embedding`` column has no fixed dimension so that vectors of several embedders coexist. HNSW needs a fixed
dimension, so each dimension gets a partial expression index ``(embedding::vector(D)) WHERE dim = D AND kind =
'centroid'``; queries use the same expression and predicate so the planner can take the index.

Why centroids only: the nearest-capability search is over centroids (one row per version); examples, negative cases
and descriptions are only ever compared within a few candidate versions, found by ``version_id``. An index over
every text row cost most of a large import: the embedding step of 10,000 capabilities (110,000 rows of 896 numbers)
took 317 s with it and 146 s with the index over their 10,000 centroids alone (the two encoders are ~120 s of it).
"""

from __future__ import annotations

import struct
import threading

import numpy as np
from django.db import connection
from django.db.models import BinaryField, F, Func

KNOWN_DIMS = (384, 512, 768)


_indexed_dims: set[int] = set()


def _cpu_has_avx512() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and " avx512f" in line for line in f)
    except OSError:
        return False


def pgvector_compute_enabled() -> bool:
    """Whether PostgreSQL computes similarities and builds HNSW indexes (settings.REACH["PGVECTOR_COMPUTE"]);
    "auto" turns it off on the embedded server when the CPU lacks AVX-512, where its pgvector build crashes."""
    from django.conf import settings

    choice = settings.REACH.get("PGVECTOR_COMPUTE", "auto")
    if choice in ("on", "off"):
        return choice == "on"
    return not settings.EMBEDDED_POSTGRES or _cpu_has_avx512()



def embedding_bytes() -> Func:
    """The ``embedding`` column in pgvector's binary form (``vector_send``), for ``values_list``: the ORM field
    parses the text form number by number in Python, 0.3 ms for one 896-number vector (a cold resolve's scoring,
    a snapshot's centroids and the calibration's every text read it); ``vector_from_bytes`` reads it 8x faster."""
    return Func(F("embedding"), function="vector_send", output_field=BinaryField())


def vector_from_bytes(raw: bytes | memoryview) -> np.ndarray:
    """A vector from pgvector's binary form (``vector_send``): two 16-bit words (the dimension, unused), then
    big-endian float4s."""
    return np.frombuffer(raw, dtype=">f4", offset=4).astype(np.float32)


def vectors_from_bytes(raws: list) -> list[np.ndarray]:
    """``vector_from_bytes`` of many, decoded in one pass when they have one length (one embedder's vectors)."""
    if not raws:
        return []
    size = len(raws[0])
    if any(len(raw) != size for raw in raws):
        return [vector_from_bytes(raw) for raw in raws]
    matrix = np.frombuffer(b"".join(raws), dtype=">f4").reshape(len(raws), size // 4)[:, 1:].astype(np.float32)
    return list(matrix)


def vector_to_bytes(vector: np.ndarray) -> bytes:
    """A vector in pgvector's binary form, as a binary COPY sends it (``vector_from_bytes`` reads it back)."""
    return struct.pack(">HH", len(vector), 0) + np.asarray(vector, dtype=">f4").tobytes()


class VectorCache:
    """Stored vectors of some kinds per (version, embedder), unit-normalised, for in-process similarity; least
    recently used versions are dropped past ``max_bytes`` (``REACH_VECTOR_CACHE_MB``).

    A version's vectors change only when it is re-embedded by a new revision of the embedder (``reach_reembed
    --missing`` after an upgrade), which changes its ``embedded_with``. Each routing snapshot passes every
    version's ``embedded_with`` to ``restamp``: a version held under another one is dropped, and read again."""

    def __init__(self, kinds: tuple[str, ...], max_bytes: int | None = None):
        from collections import OrderedDict

        self.kinds = kinds
        self._max_bytes = max_bytes
        self._bytes = 0
        self._rows: OrderedDict[tuple[int, str], dict[str, np.ndarray]] = OrderedDict()
        self._stamps: dict[int, str] = {}   # version -> its embedded_with, as the last snapshot read it
        self._held_as: dict[tuple[int, str], str] = {}  # key -> the stamp its vectors were read under
        self._lock = threading.Lock()  # the resolver's threads share one cache

    @property
    def max_bytes(self) -> int:
        if self._max_bytes is not None:
            return self._max_bytes
        from django.conf import settings

        return int(settings.REACH["VECTOR_CACHE_MB"] * 2 ** 20)

    def _fetch(self, version_ids: list[int], embedder: str) -> dict[tuple[int, str], dict[str, np.ndarray]]:
        """One SQL statement, its rows decoded as one matrix (``vectors_from_bytes``): read through the ORM, a cold
        resolve's five versions (55 vectors of 896 numbers, 10,000 capabilities registered) took 4.1-4.7 ms at
        p50, against 2.7-3.1 ms this way (same session, in turns)."""
        if not version_ids:
            return {}
        with connection.cursor() as cursor:  # a version with no vectors stored yet is not cached as such
            cursor.execute("SELECT version_id, kind, vector_send(embedding) FROM registry_capabilityvector "
                           "WHERE version_id = ANY(%s) AND embedder = %s AND kind = ANY(%s) "
                           "ORDER BY version_id, kind, position", [list(version_ids), embedder, list(self.kinds)])
            rows = cursor.fetchall()
        vectors = vectors_from_bytes([raw for _, _, raw in rows])
        out: dict[tuple[int, str], dict[str, np.ndarray]] = {}
        start = 0
        for end in range(1, len(rows) + 1):  # rows come grouped by (version, kind)
            if end == len(rows) or rows[end][:2] != rows[start][:2]:
                mat = np.stack(vectors[start:end])
                out.setdefault((rows[start][0], embedder), {})[rows[start][1]] = \
                    mat / np.maximum(np.linalg.norm(mat, axis=1, keepdims=True), 1e-12)
                start = end
        return out

    @staticmethod
    def _size(mats: dict[str, np.ndarray]) -> int:
        return sum(m.nbytes for m in mats.values())

    def _add(self, key: tuple[int, str], mats: dict[str, np.ndarray], stamp: str) -> None:
        if key not in self._rows:
            self._rows[key] = mats
            self._held_as[key] = stamp
            self._bytes += self._size(mats)

    def _drop(self, key: tuple[int, str]) -> None:
        mats = self._rows.pop(key)
        self._held_as.pop(key, None)
        self._bytes -= self._size(mats)

    def _trim(self) -> None:
        while self._bytes > self.max_bytes and self._rows:
            self._drop(next(iter(self._rows)))

    def restamp(self, stamps: dict[int, str]) -> int:
        """Record each version's ``embedded_with`` and drop the versions held under another one (re-embedded since
        they were read). Returns how many were dropped."""
        with self._lock:
            self._stamps = dict(stamps)
            stale = [key for key, held in self._held_as.items() if key[0] in stamps and stamps[key[0]] != held]
            for key in stale:
                self._drop(key)
        return len(stale)

    def get(self, version_ids: list[int], embedder: str, fetch: bool = True) -> dict[int, dict[str, np.ndarray]]:
        """The vectors of ``version_ids``: those not cached are read from the database (one query) when
        ``fetch``, else left out."""
        with self._lock:
            missing = [vid for vid in version_ids if (vid, embedder) not in self._rows]
            stamps = self._stamps  # read before the vectors: a re-embedding in between is caught by the next restamp
        fetched = self._fetch(missing, embedder) if missing and fetch else {}
        out = {}
        with self._lock:
            for key, mats in fetched.items():
                self._add(key, mats, stamps.get(key[0], ""))
            for vid in version_ids:
                held = self._rows.get((vid, embedder))
                if held is not None:
                    self._rows.move_to_end((vid, embedder))
                    out[vid] = held
            self._trim()
        return out

    def preload(self, version_ids: list[int], embedder: str, chunk: int = 500) -> None:
        """Read the vectors of ``version_ids`` not cached yet, as far as the budget goes (a registry that fits is
        held whole; of a bigger one, the versions that fit). Nothing cached is dropped for them."""
        with self._lock:
            missing = [vid for vid in version_ids if (vid, embedder) not in self._rows]
        while missing:
            with self._lock:
                room = self.max_bytes - self._bytes
                average = self._bytes / len(self._rows) if self._rows else 0.0
                stamps = self._stamps
            # as many versions as look like fitting: a full cache reads nothing on a rebuild
            take = min(chunk, int(room // average)) if average else chunk
            if room <= 0 or take <= 0:
                return
            fetched = self._fetch(missing[:take], embedder)
            missing = missing[take:]
            with self._lock:
                for key, mats in fetched.items():
                    if self._bytes + self._size(mats) > self.max_bytes:
                        return
                    self._add(key, mats, stamps.get(key[0], ""))
                    self._rows.move_to_end(key, last=False)  # behind what requests read: dropped first

    def clear(self) -> None:
        with self._lock:
            self._rows.clear()
            self._held_as.clear()
            self._stamps = {}
            self._bytes = 0


def create_hnsw_index_sql(dim: int) -> str:
    return (f"CREATE INDEX IF NOT EXISTS registry_capvec_hnsw_{int(dim)} ON registry_capabilityvector "
            f"USING hnsw ((embedding::vector({int(dim)})) vector_cosine_ops) "
            f"WHERE dim = {int(dim)} AND kind = 'centroid'")


def ensure_hnsw_index(dim: int) -> None:
    """Create the partial HNSW index for ``dim`` unless it exists (migrations create 384/512/768)."""
    dim = int(dim)
    if dim in _indexed_dims or not pgvector_compute_enabled():
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_indexes WHERE indexname = %s", [f"registry_capvec_hnsw_{dim}"])
        if cursor.fetchone():
            _indexed_dims.add(dim)
            return
        cursor.execute(create_hnsw_index_sql(dim))
    _indexed_dims.add(dim)


def vector_literal(vector: np.ndarray) -> str:
    return "[" + ",".join(f"{x:.6f}" for x in vector.tolist()) + "]"


def nearest_versions(*, query: np.ndarray, embedder: str, kind: str = "centroid", limit: int = 10,
                     active_only: bool = True) -> list[tuple[int, float]]:
    """(version_id, cosine similarity) of the nearest vectors of ``kind``, best first: pgvector (through the HNSW
    index for centroids, an exact scan for other kinds), or an exact scan in numpy where PostgreSQL does not compute
    similarity."""
    dim = int(query.shape[0])
    if not pgvector_compute_enabled():
        return _nearest_in_process(query=query, embedder=embedder, kind=kind, limit=limit, active_only=active_only)
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


def _nearest_in_process(*, query: np.ndarray, embedder: str, kind: str, limit: int,
                        active_only: bool) -> list[tuple[int, float]]:
    from registry.models import CapabilityVector

    qs = CapabilityVector.objects.filter(embedder=embedder, kind=kind, dim=int(query.shape[0]))
    if active_only:
        qs = qs.filter(version__state="active")
    rows = list(qs.values_list("version_id", embedding_bytes()))
    if not rows:
        return []
    mat = np.stack([vector_from_bytes(raw) for _, raw in rows])
    sims = (mat @ query) / np.maximum(np.linalg.norm(mat, axis=1) * np.linalg.norm(query), 1e-12)
    order = np.argsort(-sims)[:limit]
    return [(rows[i][0], float(sims[i])) for i in order]
