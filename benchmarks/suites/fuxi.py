"""FuXi-alpha attention (issue 5): recops' fused three-channel kernel vs a reference that follows
the FuXi-alpha code op for op (generative_recommenders/modeling/sequential/fuxi.py of
USTC-StarTeam/FuXi-alpha), both with the fused relative time/position tables, in the input dtype,
autograd for the reference's backward.

- The attention follows `_adaptive_multichannel_attention_maybe_from_cache`: jagged_to_padded_dense,
  einsum to [B, H, N, N], `silu(.) / N`, times the float causal mask; the position [1, N, N] and
  time [B, N, N] biases (shared by the heads) times the mask; three einsums with the padded v (the
  bias channels without a head axis), concatenated per head as [position, time, semantic] and
  dense_to_jagged.
- The biases follow `SeperatedRelativeBucketedTimeAndPositionBasedBias` (the same position and
  time construction as HSTU's research bias: suites/hstu.py).
- The float mask `1 - triu(ones(N, N), 1)` is built once per model call upstream, shared by the
  layers, so here outside the timed region.

How the cost was checked: the upstream function itself (imported from a checkout of FuXi-alpha)
and `reference` were timed interleaved in one process, fp32 and bf16, fwd and fwd+bwd, at both
shapes; docs/fuxi_attention.md gives the ratios and conditions."""

import functools

import torch
import torch.nn.functional as F
from harness import measure_fwd_bwd

import recops
from suites.hstu import (
    HEAD_DIM,
    HEADS,
    SHAPES,
    _inputs,
    _leaves,
    in_dtype,
    position_bias,
    time_bias,
)


def causal_float_mask(n, dtype):
    """[N, N] in `dtype`: 1 where j <= i (FuXi-alpha's `1.0 - triu(ones, diagonal=1)`)."""
    return 1.0 - torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=1).to(dtype)


def reference(q, k, v, offsets, n, timestamps, ts_w, pos_w, mask):
    batch = offsets.numel() - 1
    rows, heads, dim = q.shape
    qp, kp, vp = (
        torch.ops.fbgemm.jagged_to_padded_dense(
            values=t.reshape(rows, heads * dim), offsets=[offsets], max_lengths=[n]
        ).view(batch, n, heads, dim)
        for t in (q, k, v)
    )
    semantic = F.silu(torch.einsum("bnhd,bmhd->bhnm", qp, kp)) / n
    semantic = semantic * mask.unsqueeze(0).unsqueeze(0)
    position = position_bias(pos_w, n) * mask.unsqueeze(0)
    time = time_bias(timestamps, ts_w, n) * mask.unsqueeze(0)
    out_position = torch.einsum("bnm,bmhd->bnhd", position, vp)
    out_time = torch.einsum("bnm,bmhd->bnhd", time, vp)
    out_semantic = torch.einsum("bhnm,bmhd->bnhd", semantic, vp)
    combined = torch.concat([out_position, out_time, out_semantic], dim=-1).reshape(
        batch, n, heads * dim * 3
    )
    return torch.ops.fbgemm.dense_to_jagged(combined, [offsets])[0]


def fused(q, k, v, offsets, n, timestamps, ts_w, pos_w, mask):
    del mask  # recops builds its causal mask in-tile
    return recops.fuxi_attention(
        q, k, v, offsets, n, timestamps=timestamps, ts_w=ts_w, pos_w=pos_w, reference_layout=True
    )


def run(limits):
    torch.manual_seed(0)
    rows = []
    for batch, n in SHAPES:
        inputs, offsets, lengths, extras = _inputs(batch, n, True)
        # Semantic FLOPs as HSTU's, plus the two bias channels' products with V.
        fwd_flops = 2 * HEADS * 4 * HEAD_DIM * float((lengths.double() ** 2).sum()) / 2
        fp32_case = None
        for dtype in (torch.float32, torch.bfloat16):
            qkv, extra = in_dtype(inputs, extras, dtype)
            mask = causal_float_mask(n, dtype)
            case = f"B={batch} N={n} {str(dtype).split('.')[-1]} +rel-bias"
            impls = {
                name: functools.partial(fn, *qkv, offsets, n, **extra, mask=mask)
                for name, fn in (("reference", reference), ("recops", fused))
            }
            leaves = _leaves(qkv, extra)
            rows += measure_fwd_bwd(
                "fuxi", case, impls, leaves, dtype, fwd_flops, 2, fp32_case=fp32_case
            )
            fp32_case = fp32_case or case
    return rows
