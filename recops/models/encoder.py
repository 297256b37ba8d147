"""The sequence encoder shared by the three models: generative-recommenders' input features
(item embedding times sqrt(d) plus a learned absolute position embedding, dropout), a stack of
blocks on the jagged rows, and L2-normalised outputs."""

from __future__ import annotations

import math

import torch
from torch import nn

from recops.data.batches import JaggedBatch
from recops.models.fuxi_block import FuXiBlock
from recops.models.hstu_block import HSTUBlock
from recops.models.model_config import ModelConfig
from recops.models.sasrec_block import SASRecBlock

BLOCKS = {"hstu": HSTUBlock, "fuxi": FuXiBlock, "sasrec": SASRecBlock}
L2_NORM_EPS = 1e-6


def l2_normalize(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(dim=-1, keepdim=True).clamp(min=L2_NORM_EPS)


class SequenceEncoder(nn.Module):
    """``[L, d]`` item embeddings of a jagged batch to ``[L, d]`` unit-norm states; the state of
    row i summarises its sequence up to and including row i."""

    def __init__(self, config: ModelConfig, backend):
        super().__init__()
        block = BLOCKS[config.model]
        self.backend = backend
        self.dropout = config.dropout
        self.num_buckets = config.num_buckets if block.uses_time_bias else None
        self.positions = nn.Embedding(config.max_seq_len, config.dim)
        nn.init.trunc_normal_(self.positions.weight, std=math.sqrt(1.0 / config.dim), a=-2.0, b=2.0)
        self.blocks = nn.ModuleList(block(config, backend) for _ in range(config.num_layers))

    @property
    def dtype(self) -> torch.dtype:
        return self.positions.weight.dtype

    def forward(self, embeddings: torch.Tensor, batch: JaggedBatch) -> torch.Tensor:
        layout = self.backend.layout(batch, self.dtype, self.num_buckets)
        x = self.backend.input_features(
            embeddings,
            self.positions.weight,
            layout,
            math.sqrt(embeddings.shape[-1]),
            self.dropout,
            self.training,
        )
        for block in self.blocks:
            x = block(x, layout)
        return self.backend.l2_normalize(x)
