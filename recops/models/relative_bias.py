"""The relative attention bias tables of HSTU and FuXi-alpha."""

from __future__ import annotations

import torch
from torch import nn


class RelativeBiasTables(nn.Module):
    """``ts_w [num_buckets + 1]`` (one weight per bucket of the time to the next item) and
    ``pos_w [2 N - 1]`` (one per relative position ``j - i``), normal with std 0.02 as in
    generative-recommenders. Each backend turns them into the bias its attention adds."""

    def __init__(self, max_seq_len: int, num_buckets: int):
        super().__init__()
        self.ts_w = nn.Parameter(torch.empty(num_buckets + 1).normal_(mean=0, std=0.02))
        self.pos_w = nn.Parameter(torch.empty(2 * max_seq_len - 1).normal_(mean=0, std=0.02))
