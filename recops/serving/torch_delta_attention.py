"""The cached reference: the attention of a request's new rows against a user's cached ones in
plain PyTorch, for HSTU and FuXi-alpha with the models' relative time and position bias. It
stands for generative-recommenders' ``pytorch_cached_hstu_mha`` and costs what it costs, or less:
the same materialisations (each user's keys and values copied out into a padded ``[B, rows, H, D]``
as ``jagged_to_padded_dense`` pads them, ``[B, H, new rows, rows]`` scores by ``einsum``, a dense
mask, ``einsum`` back), padded to the batch's longest user instead of ``max_seq_len`` and with the
mask and bias built for the new rows only instead of the whole ``[B, N, N]``. The served path runs
recops' fused op instead (delta_attention.py); benchmarks/serving.py runs both.

User b's new rows are its rows ``lengths[b] .. lengths[b] + new_rows[b] - 1``; their keys, values
and timestamps are in the pages already (written before attending, as vLLM does), so every key is
read from one place.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from recops.models.torch_backend import BUCKET_DIVISOR
from recops.serving.paged_cache import PageTables


def _paged(pool: torch.Tensor, pages: torch.Tensor, rows: int) -> torch.Tensor:
    """``[B, rows, ...]``: each user's first ``rows`` rows of ``pool [pages, page_rows, ...]``
    (rows past a user's pages are garbage, masked by the caller)."""
    return pool[pages.clamp(min=0).long()].flatten(1, 2)[:, :rows]


def _padded_queries(q: torch.Tensor, new_rows: torch.Tensor, width: int) -> torch.Tensor:
    """Jagged ``[R, ...]`` (user b's ``new_rows[b]`` rows one after another) to
    ``[B, width, ...]``, and each row's slot in it."""
    batch = new_rows.numel()
    first = torch.cumsum(new_rows, 0) - new_rows
    user = torch.repeat_interleave(torch.arange(batch), new_rows, output_size=q.shape[0])
    slot = user * width + torch.arange(q.shape[0]) - first[user]
    dense = q.new_zeros(batch * width, *q.shape[1:]).index_copy(0, slot, q)
    return dense.view(batch, width, *q.shape[1:]), slot


def _biases(times, lengths, new_rows, max_seq_len, ts_w, pos_w, num_buckets, width, rows):
    """Time bias, position bias and the mask, each ``[B, width, rows]``: query row r of user b is
    at position ``i = lengths[b] + r``, measured from the next row's time (its own for the last);
    key j sees query i when ``j <= i``."""
    total = lengths + new_rows
    position = lengths[:, None] + torch.arange(width)[None, :]  # [B, width]
    query_time_at = torch.minimum(position + 1, (total - 1).clamp(min=0)[:, None])
    query_time = times.gather(1, query_time_at.clamp(max=rows - 1))
    delta = (query_time[:, :, None] - times[:, None, :]).abs().clamp(min=1).double()
    bucket = (torch.log(delta) / BUCKET_DIVISOR).long().clamp(0, num_buckets)
    key = torch.arange(rows)[None, None, :]
    mask = (key <= position[:, :, None]) & (
        torch.arange(width)[None, :, None] < new_rows[:, None, None]
    )
    relative = (max_seq_len - 1 + key - position[:, :, None]).clamp(0, 2 * max_seq_len - 2)
    return ts_w[bucket], pos_w[relative], mask.to(ts_w.dtype)


def torch_delta_attention(
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
    page_rows]``). Returns ``[R, H * Dv]`` for HSTU, ``[R, H * 3 * Dv]`` (per head position, time,
    semantic) for FuXi-alpha, as the models' attention returns them."""
    new_rows = tables.new_rows
    width = int(new_rows.max()) if new_rows.numel() else 0
    rows = int((tables.lengths + new_rows).max()) if new_rows.numel() else 0
    if width == 0:
        out_width = values.shape[-2] * values.shape[-1] * (3 if model == "fuxi" else 1)
        return q.new_zeros(q.shape[0], out_width)
    qp, slot = _padded_queries(q, new_rows, width)  # [B, width, H, Dqk]
    kp = _paged(keys, tables.pages, rows).to(q.dtype)
    vp = _paged(values, tables.pages, rows).to(q.dtype)
    times = _paged(timestamps, tables.pages, rows)
    num_buckets = ts_w.numel() - 1
    time_bias, position_bias, mask = _biases(
        times, tables.lengths, new_rows, max_seq_len, ts_w, pos_w, num_buckets, width, rows
    )
    scores = torch.einsum("bnhd,bmhd->bhnm", qp, kp)
    if model == "hstu":
        scores = scores + (time_bias + position_bias).unsqueeze(1)
        attn = F.silu(scores) / max_seq_len * mask.unsqueeze(1)
        out = torch.einsum("bhnm,bmhd->bnhd", attn, vp)
    else:
        semantic = F.silu(scores) / max_seq_len * mask.unsqueeze(1)
        out = torch.cat(
            [
                torch.einsum("bnm,bmhd->bnhd", position_bias * mask, vp),
                torch.einsum("bnm,bmhd->bnhd", time_bias * mask, vp),
                torch.einsum("bhnm,bmhd->bnhd", semantic, vp),
            ],
            dim=-1,
        )
    return out.flatten(2).flatten(0, 1).index_select(0, slot)
