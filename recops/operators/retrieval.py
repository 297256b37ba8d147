"""Retrieval over a whole candidate table (docs/ops.md §10): each query's top-k candidates by
inner product, some excluded per query (generative-recommenders' brute-force MIPS, as
``torch.topk(q @ c.T)`` with the excluded scores set to -inf), without the ``[M, N]`` scores.
Python entry point and fake kernel (kernel: csrc/recops/retrieval/kernels/)."""

from __future__ import annotations

import torch

from recops._fake import register_fake

ops = torch.ops.recops


@register_fake("recops::mips_topk")
def _mips_topk_fake(queries, candidates, k, excluded_offsets=None, excluded=None):
    shape = (queries.shape[0], k)
    return queries.new_empty(shape), queries.new_empty(shape, dtype=torch.int64)


def mips_topk(
    queries: torch.Tensor,
    candidates: torch.Tensor,
    k: int,
    *,
    excluded_offsets: torch.Tensor | None = None,
    excluded: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(values [M, k], indices [M, k])``: for each row of ``queries [M, d]`` the k rows of
    ``candidates [N, d]`` with the largest inner products, best first (float32 or float64, both
    of one dtype). Candidate j scores -inf for row m when it is one of
    ``excluded[excluded_offsets[m]:excluded_offsets[m + 1]]`` (jagged candidate indices, given
    together or not at all); such candidates come back only when fewer than k others remain.
    Ties go to the lower index and NaN ranks first, so the result is fully determined: what
    ``torch.topk`` returns on the same scores wherever they have no ties. Forward only."""
    return ops.mips_topk(queries, candidates, k, excluded_offsets, excluded)
