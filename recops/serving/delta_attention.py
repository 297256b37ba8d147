"""The attention of a request's new rows against a user's cached ones: recops' delta ops
(``torch.ops.recops.hstu_delta_attention`` / ``fuxi_delta_attention``) reading the keys, values
and timestamps of every layer in place, through the page tables, with the models' relative time
and position bias fused.

User b's new rows are its rows ``lengths[b] .. lengths[b] + new_rows[b] - 1``; their keys, values
and timestamps are in the pages already (written before attending, as vLLM does).
"""

from __future__ import annotations

import torch

from recops.serving.paged_cache import PageTables

ops = torch.ops.recops


def delta_attention(
    model: str,
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    timestamps: torch.Tensor,
    tables: PageTables,
    max_seq_len: int,
    ts_w: torch.Tensor,
    pos_w: torch.Tensor,
) -> torch.Tensor:
    """``model`` ("hstu" or "fuxi") attention of the new rows ``q [R, H, Dqk]`` against the
    pages (one layer's ``keys [pages, page_rows, H, Dqk]`` / ``values``, ``timestamps [pages,
    page_rows]`` float64). Returns ``[R, H * Dv]`` for HSTU, ``[R, H * 3 * Dv]`` (per head position,
    time, semantic) for FuXi-alpha, as the models' attention returns them, in q's dtype; the
    attention runs in the pages' dtype (bf16 pages: the bf16 tiles)."""
    args = (
        q.to(keys.dtype),
        keys,
        values,
        tables.delta_offsets,
        None,
        tables.pages,
        tables.seq_lengths,
        max_seq_len,
    )
    bias = {"timestamps": timestamps, "ts_w": ts_w, "pos_w": pos_w}
    if model == "hstu":
        out = ops.hstu_delta_attention(*args, **bias).flatten(1)
    else:
        out = ops.fuxi_delta_attention(*args, **bias, reference_layout=True)
    return out.to(q.dtype)
