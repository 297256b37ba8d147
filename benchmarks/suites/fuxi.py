"""FuXi-alpha attention (issue 5): recops' fused three-channel kernel vs the reference
formulation of the FuXi-alpha code (three materialised [B, H, N, N] weight tensors and einsums),
both with the fused relative time/position tables, in the input dtype, autograd for backward."""

import functools

import torch
from harness import measure_fwd_bwd

import recops
from suites.hstu import (
    HEAD_DIM,
    HEADS,
    SHAPES,
    _inputs,
    _leaves,
    time_and_position_bias,
)


def reference(q, k, v, offsets, n, timestamps, ts_w, pos_w):
    batch = offsets.numel() - 1
    qp, kp, vp = (
        torch.ops.fbgemm.jagged_to_padded_dense(t.flatten(1), [offsets], [n]).view(
            batch, n, HEADS, -1
        )
        for t in (q, k, v)
    )
    lengths = offsets[1:] - offsets[:-1]
    valid = torch.arange(n)[None, :] < lengths[:, None]
    mask = (torch.tril(torch.ones(n, n, dtype=torch.bool))[None] & valid[:, None, :]).unsqueeze(1)
    mask = mask.to(q.dtype)
    ts_bias, pos_bias = time_and_position_bias(timestamps, lengths, ts_w, pos_w, n)
    semantic = torch.nn.functional.silu(torch.einsum("bnhd,bmhd->bhnm", qp, kp)) / n * mask
    time = ts_bias.unsqueeze(1) * mask
    position = pos_bias.unsqueeze(0).unsqueeze(0) * mask
    out = torch.cat(
        [
            torch.einsum("bhnm,bmhd->bnhd", w.expand_as(semantic), vp)
            for w in (semantic, time, position)
        ],
        dim=-1,
    )  # per head [semantic, time, position] channels, flattened below
    return torch.ops.fbgemm.dense_to_jagged(out.flatten(2), [offsets])[0]


def fused(q, k, v, offsets, n, timestamps, ts_w, pos_w):
    out = recops.fuxi_attention(
        q, k, v, offsets, n, timestamps=timestamps, ts_w=ts_w, pos_w=pos_w
    )  # channel-major [semantic | time | position]
    rows = out.shape[0]
    return out.view(rows, 3, HEADS, HEAD_DIM).transpose(1, 2).reshape(rows, -1)


def run(limits):
    torch.manual_seed(0)
    rows = []
    for batch, n in SHAPES:
        for dtype in (torch.float32, torch.bfloat16):
            qkv, offsets, lengths, extra = _inputs(batch, n, dtype, True, True)
            # Semantic FLOPs as HSTU's, plus the two bias channels' products with V.
            fwd_flops = 2 * HEADS * 4 * HEAD_DIM * float((lengths.double() ** 2).sum()) / 2
            case = f"B={batch} N={n} {str(dtype).split('.')[-1]} +rel-bias"
            impls = {
                name: functools.partial(fn, *qkv, offsets, n, **extra)
                for name, fn in (("reference", reference), ("recops", fused))
            }
            rows += measure_fwd_bwd("fuxi", case, impls, _leaves(qkv, extra), dtype, fwd_flops, 2)
    return rows
