"""The item embedding table with its optimizer, Adagrad, on either backend.

Sequences look up one row per position, so the recops table is
``SplitTableBatchedEmbeddingBagsCodegen`` with ``PoolingMode.NONE`` (one output row per index)
and ``EXACT_ADAGRAD`` fused into its backward: the backward sums the gradient of every
occurrence of a row (positions of all sequences, sampled negatives) and updates each touched
row and its Adagrad state in place, never building a dense ``[rows, dim]`` gradient. The torch
table is the same math in plain PyTorch: ``nn.Embedding`` (the per-position form of
``nn.EmbeddingBag``) and ``torch.optim.Adagrad``, ``m += g^2; w -= lr * g / (sqrt(m) + eps)``.
Its gradient is dense: zero on the rows no index touched, which Adagrad then leaves as they are,
so the update is the TBE's. (A sparse gradient would spare the dense ``[rows, dim]`` passes, but
inductor cannot compile a graph that produces one.)

Tables are float32 whatever the model's dtype (the TBE stores fp32, fp16 or bf16); lookups are
cast to the model's dtype by the caller.
"""

from __future__ import annotations

import torch
from torch import nn

from recops.embedding import (
    BoundsCheckMode,
    ComputeDevice,
    EmbeddingLocation,
    OptimType,
    PoolingMode,
    SplitTableBatchedEmbeddingBagsCodegen,
)


class TbeItemTable(nn.Module):
    """Items through recops' TBE: the optimizer step happens in backward."""

    def __init__(self, weights: torch.Tensor, learning_rate: float, eps: float):
        super().__init__()
        rows, dim = weights.shape
        self.tbe = SplitTableBatchedEmbeddingBagsCodegen(
            [(rows, dim, EmbeddingLocation.HOST, ComputeDevice.CPU)],
            optimizer=OptimType.EXACT_ADAGRAD,
            learning_rate=learning_rate,
            eps=eps,
            pooling_mode=PoolingMode.NONE,
            # FATAL raises on a bad id and, unlike the default WARNING, reads no flag back to
            # Python, so torch.compile traces the lookup without a graph break.
            bounds_check_mode=BoundsCheckMode.FATAL,
        )
        with torch.no_grad():
            self.weight.copy_(weights)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        # One bag per id: with PoolingMode.NONE the output is one row per index either way.
        offsets = torch.arange(ids.numel() + 1, dtype=ids.dtype)
        return self.tbe(ids, offsets)

    @property
    def weight(self) -> torch.Tensor:
        """The ``[rows, dim]`` table (a view of the TBE's flat weights)."""
        return self.tbe.split_embedding_weights()[0]

    def optimizer_state(self) -> torch.Tensor:
        """Adagrad's ``[rows, dim]`` sum of squared gradients."""
        return self.tbe.split_optimizer_states()[0][0]

    def optimizer(self) -> None:
        """None: the update is fused into backward."""
        return None


class TorchItemTable(nn.Module):
    """Items through ``nn.Embedding``, updated by ``torch.optim.Adagrad``."""

    def __init__(self, weights: torch.Tensor, learning_rate: float, eps: float):
        super().__init__()
        self.embedding = nn.Embedding(*weights.shape, _weight=weights.clone())
        self._optimizer = torch.optim.Adagrad([self.embedding.weight], lr=learning_rate, eps=eps)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embedding(ids)

    @property
    def weight(self) -> torch.Tensor:
        return self.embedding.weight.detach()

    def optimizer_state(self) -> torch.Tensor:
        state = self._optimizer.state[self.embedding.weight]
        return state["sum"] if state else torch.zeros_like(self.weight)

    def optimizer(self) -> torch.optim.Optimizer:
        """The Adagrad the trainer steps after backward."""
        return self._optimizer
