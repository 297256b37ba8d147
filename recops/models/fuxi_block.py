"""The FuXi-alpha block (Ye et al., "FuXi-alpha: Scaling Recommendation Model with Feature
Interaction Enhanced Transformer", WWW'25): adaptive multi-channel self-attention (AMS), then the
multi-stage feed-forward network (MFFN), with RMS norms as in the paper's code:

    u, v, q, k = split(silu(rms_norm(x) @ W_uvqk))        # u is 3 H Dv wide
    a = fuxi_attention(q, k, v)                           # per head [position, time, semantic]
    x = x + W_0(dropout(u * rms_norm(a)))                 # MFFN stage 1: back to d, residual
    h = dropout(rms_norm(x))
    x = x + W_2(silu(W_1 h) * W_3 h)                      # MFFN stage 2: SwiGLU, residual
"""

from __future__ import annotations

import torch
from torch import nn

from recops.models.model_config import ModelConfig
from recops.operators.relative_bias import RelativeBucketedTimeAndPositionBasedBias

RMS_NORM_EPS = 1e-6


class FuXiBlock(nn.Module):
    uses_time_bias = True

    def __init__(self, config: ModelConfig, backend):
        super().__init__()
        h, dqk, dv, d = config.num_heads, config.attention_dim, config.linear_dim, config.dim
        hidden = config.ffn_hidden_dim
        self.backend = backend
        self.split_sizes = [3 * h * dv, h * dv, h * dqk, h * dqk]
        self.head_shapes = [(h, dqk), (h, dqk), (h, dv)]  # q, k, v
        self.dropout = config.dropout
        self.uvqk = nn.Parameter(torch.empty(d, sum(self.split_sizes)).normal_(mean=0, std=0.02))
        # Its tables (ts_w, pos_w) only: the backend's attention adds the bias itself.
        self.relative_bias = RelativeBucketedTimeAndPositionBasedBias(
            config.max_seq_len, config.num_buckets
        )
        self.ams_output = nn.Linear(3 * h * dv, d)
        self.ffn_gate = nn.Linear(d, hidden, bias=False)
        self.ffn_up = nn.Linear(d, hidden, bias=False)
        self.ffn_down = nn.Linear(hidden, d, bias=False)
        for linear in (self.ams_output, self.ffn_gate, self.ffn_up, self.ffn_down):
            nn.init.xavier_uniform_(linear.weight)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``u [L, 3 H Dv]`` and the heads ``q, k [L, H, Dqk]``, ``v [L, H, Dv]`` of rows ``x``."""
        u, v, q, k = self.backend.layer_input(
            x, self.uvqk, "rms_norm", RMS_NORM_EPS, self.split_sizes
        )
        q, k, v = (t.view(-1, *shape) for t, shape in zip((q, k, v), self.head_shapes, strict=True))
        return u, q, k, v

    def forward(self, x: torch.Tensor, layout) -> torch.Tensor:
        u, q, k, v = self.project(x)
        attn = self.backend.fuxi_attention(
            q, k, v, layout, self.relative_bias.ts_w, self.relative_bias.pos_w
        )
        return self.combine(x, u, attn)

    def combine(self, x: torch.Tensor, u: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """The block's output rows from its input rows, ``u`` and the three channels'
        attention ``[L, H * 3 * Dv]``: the AMS output, then the MFFN."""
        x = self.backend.layer_output(
            x, u, attn, self.ams_output, "rms_norm", RMS_NORM_EPS, self.dropout, self.training
        )
        return self.backend.feed_forward(
            x,
            (self.ffn_gate, self.ffn_up, self.ffn_down),
            "rms_norm",
            RMS_NORM_EPS,
            self.dropout,
            self.training,
        )
