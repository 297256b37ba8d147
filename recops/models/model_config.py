"""Model sizes (defaults: generative-recommenders' ML-1M configurations, which the HSTU paper
also uses for its SASRec baseline: 2 layers, 1 head, d = 50, max length 200, dropout 0.2)."""

from __future__ import annotations

import dataclasses

MODELS = ("hstu", "fuxi", "sasrec")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    model: str  # "hstu", "fuxi" (FuXi-alpha) or "sasrec"
    num_items: int  # item ids 1..num_items; row 0 of the table is "no item"
    max_seq_len: int = 200
    dim: int = 50
    num_layers: int = 2
    num_heads: int = 1
    attention_dim: int = 50  # per head: q, k (HSTU, FuXi-alpha)
    linear_dim: int = 50  # per head: u, v (HSTU, FuXi-alpha)
    ffn_hidden_dim: int = 50  # FuXi-alpha's multi-stage FFN, SASRec's FFN
    dropout: float = 0.2
    num_buckets: int = 128  # relative time bias buckets (HSTU, FuXi-alpha)

    def __post_init__(self):
        if self.model not in MODELS:
            raise ValueError(f"model must be one of {MODELS}, got {self.model!r}")
        if self.model == "sasrec" and self.dim % self.num_heads:
            raise ValueError("SASRec needs dim divisible by num_heads")
