"""The HSTU block (generative-recommenders' SequentialTransductionUnitJagged, research code):

u, v, q, k = split(silu(layer_norm(x) @ W_uvqk))
a = hstu_attention(q, k, v)            # causal, relative time + position bias, silu / N
x = x + W_o(dropout(u * layer_norm(a)))
"""

from __future__ import annotations

import torch
from torch import nn

from recops.models.model_config import ModelConfig
from recops.operators.relative_bias import RelativeBucketedTimeAndPositionBasedBias

LAYER_NORM_EPS = 1e-6


class HSTUBlock(nn.Module):
    uses_time_bias = True

    def __init__(self, config: ModelConfig, backend):
        super().__init__()
        h, dqk, dv, d = config.num_heads, config.attention_dim, config.linear_dim, config.dim
        self.backend = backend
        self.split_sizes = [h * dv, h * dv, h * dqk, h * dqk]
        self.head_shapes = [(h, dqk), (h, dqk), (h, dv)]  # q, k, v
        self.dropout = config.dropout
        self.uvqk = nn.Parameter(torch.empty(d, sum(self.split_sizes)).normal_(mean=0, std=0.02))
        # Its tables (ts_w, pos_w) only: the backend's attention adds the bias itself.
        self.relative_bias = RelativeBucketedTimeAndPositionBasedBias(
            config.max_seq_len, config.num_buckets
        )
        self.output = nn.Linear(h * dv, d)
        nn.init.xavier_uniform_(self.output.weight)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``u [L, H * Dv]`` and the heads ``q, k [L, H, Dqk]``, ``v [L, H, Dv]`` of rows ``x``."""
        u, v, q, k = self.backend.layer_input(
            x, self.uvqk, "layer_norm", LAYER_NORM_EPS, self.split_sizes
        )
        q, k, v = (t.view(-1, *shape) for t, shape in zip((q, k, v), self.head_shapes, strict=True))
        return u, q, k, v

    def combine(self, x: torch.Tensor, u: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """The block's output rows from its input rows, ``u`` and the attention ``[L, H * Dv]``:
        ``x + W_o(dropout(u * layer_norm(attn)))``."""
        return self.backend.layer_output(
            x, u, attn, self.output, "layer_norm", LAYER_NORM_EPS, self.dropout, self.training
        )

    def forward(self, x: torch.Tensor, layout) -> torch.Tensor:
        u, q, k, v = self.project(x)
        attn = self.backend.hstu_attention(
            q, k, v, layout, self.relative_bias.ts_w, self.relative_bias.pos_w
        )
        return self.combine(x, u, attn)
