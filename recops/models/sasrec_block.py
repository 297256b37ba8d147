"""The SASRec block (Kang and McAuley, ICDM'18), as generative-recommenders runs it for the
baseline of the HSTU paper: the query is the layer-normed input, keys and values the input;
softmax attention (``scaled_dot_product_attention``, causal); a ReLU feed-forward network on the
layer norm of query + attention, with its own residual:

    q = layer_norm(x);  a = W_o softmax_attention(W_q q, W_k x, W_v x)
    h = layer_norm(q + a);  x = h + dropout(W_2 dropout(relu(W_1 h)))

The attention runs on the batch padded to its longest sequence (the backend's pad / unpad), the
rest on the jagged rows.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from recops.models.model_config import ModelConfig

LAYER_NORM_EPS = 1e-8


class SASRecBlock(nn.Module):
    uses_time_bias = False

    def __init__(self, config: ModelConfig, backend):
        super().__init__()
        d = config.dim
        self.backend = backend
        self.num_heads = config.num_heads
        self.dropout = config.dropout
        self.query = nn.Linear(d, d)
        self.key_value = nn.Linear(d, 2 * d)
        self.attention_output = nn.Linear(d, d)
        self.ffn_in = nn.Linear(d, config.ffn_hidden_dim)
        self.ffn_out = nn.Linear(config.ffn_hidden_dim, d)
        # generative-recommenders' SASRec: xavier-normal weights (biases keep their init).
        for linear in (
            self.query,
            self.key_value,
            self.attention_output,
            self.ffn_in,
            self.ffn_out,
        ):
            nn.init.xavier_normal_(linear.weight)

    def _heads(self, x: torch.Tensor, layout) -> torch.Tensor:
        dense = self.backend.pad(x, layout)  # [B, n, d]
        return dense.unflatten(-1, (self.num_heads, -1)).transpose(1, 2)  # [B, H, n, d / H]

    def forward(self, x: torch.Tensor, layout) -> torch.Tensor:
        normed = F.layer_norm(x, x.shape[-1:], eps=LAYER_NORM_EPS)
        k, v = self.key_value(x).chunk(2, dim=-1)
        q, k, v = (self._heads(t, layout) for t in (self.query(normed), k, v))
        # Causal alone is exact for every real position: a sequence's row i sees keys j <= i,
        # all inside the sequence; the padded rows' outputs are dropped by unpad.
        attn = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )
        attn = self.backend.unpad(attn.transpose(1, 2).flatten(2), layout)
        h = F.layer_norm(normed + self.attention_output(attn), x.shape[-1:], eps=LAYER_NORM_EPS)
        hidden = F.dropout(F.relu(self.ffn_in(h)), p=self.dropout, training=self.training)
        return h + F.dropout(self.ffn_out(hidden), p=self.dropout, training=self.training)
