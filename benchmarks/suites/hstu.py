"""HSTU attention (issue 4): recops' fused kernel vs the reference formulation of
generative-recommenders (pad to [B, N, H, D], einsum to [B, H, N, N], silu, mask, einsum back),
both in the input dtype, autograd for the reference's backward."""

import functools

import torch
from harness import measure_fwd_bwd

import recops

SHAPES = [(8, 512), (2, 2048)]  # (B, N); H = 2, D = 64, lengths uniform in [N/2, N]
HEADS, HEAD_DIM = 2, 64
NUM_BUCKETS = 128


def time_and_position_bias(ts, lengths, ts_w, pos_w, n):
    # ([B, N, N], [N, N]): ts_w[bucket(t_{i+1} - t_j)] and pos_w[N - 1 + j - i], with torch ops;
    # the last valid position of each sequence uses its own time (docs/ops.md section 3).
    tq = torch.cat([ts[:, 1:], ts[:, -1:]], dim=1)
    last = (lengths - 1).clamp(min=0).unsqueeze(1)
    tq = tq.scatter(1, last, ts.gather(1, last))
    dt = (tq[:, :, None] - ts[:, None, :]).abs().clamp(min=1)
    buckets = (torch.log(dt.double()) / 0.301).long().clamp(0, NUM_BUCKETS)
    pos = torch.arange(n)
    return ts_w[buckets], pos_w[n - 1 + pos[None, :] - pos[:, None]]


def reference(q, k, v, offsets, n, timestamps=None, ts_w=None, pos_w=None):
    batch = offsets.numel() - 1
    qp, kp, vp = (
        torch.ops.fbgemm.jagged_to_padded_dense(t.flatten(1), [offsets], [n]).view(
            batch, n, HEADS, -1
        )
        for t in (q, k, v)
    )
    scores = torch.einsum("bnhd,bmhd->bhnm", qp, kp)
    lengths = offsets[1:] - offsets[:-1]
    if ts_w is not None:
        ts_bias, pos_bias = time_and_position_bias(timestamps, lengths, ts_w, pos_w, n)
        scores = scores + (ts_bias + pos_bias).unsqueeze(1)
    valid = torch.arange(n)[None, :] < lengths[:, None]
    mask = torch.tril(torch.ones(n, n, dtype=torch.bool))[None] & valid[:, None, :]
    attn = torch.nn.functional.silu(scores) / n * mask.unsqueeze(1).to(scores.dtype)
    out = torch.einsum("bhnm,bmhd->bnhd", attn, vp)
    return torch.ops.fbgemm.dense_to_jagged(out.flatten(2), [offsets])[0].view_as(v)


def fused(q, k, v, offsets, n, timestamps=None, ts_w=None, pos_w=None):
    return recops.hstu_attention(q, k, v, offsets, n, timestamps=timestamps, ts_w=ts_w, pos_w=pos_w)


def _inputs(batch, n, dtype, with_bias, requires_grad):
    lengths = torch.randint(n // 2, n + 1, (batch,))
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    total = int(offsets[-1])
    qkv = [
        (0.5 * torch.randn(total, HEADS, HEAD_DIM)).to(dtype).requires_grad_(requires_grad)
        for _ in range(3)
    ]
    extra = {}
    if with_bias:
        ts = torch.randint(0, 10**6, (batch, n)).sort(dim=1).values
        extra = dict(
            timestamps=ts,
            ts_w=(0.02 * torch.randn(NUM_BUCKETS + 1)).to(dtype).requires_grad_(requires_grad),
            pos_w=(0.02 * torch.randn(2 * n - 1)).to(dtype).requires_grad_(requires_grad),
        )
    return qkv, offsets, lengths, extra


def _leaves(qkv, extra):
    return qkv + [t for t in extra.values() if t.requires_grad]


def run(limits):
    torch.manual_seed(0)
    rows = []
    for batch, n in SHAPES:
        for dtype in (torch.float32, torch.bfloat16):
            for with_bias in (False, True):
                qkv, offsets, lengths, extra = _inputs(batch, n, dtype, with_bias, True)
                fwd_flops = 2 * HEADS * 2 * HEAD_DIM * float((lengths.double() ** 2).sum()) / 2
                case = (
                    f"B={batch} N={n} {str(dtype).split('.')[-1]}"
                    f"{' +rel-bias' if with_bias else ''}"
                )
                impls = {
                    name: functools.partial(fn, *qkv, offsets, n, **extra)
                    for name, fn in (("reference", reference), ("recops", fused))
                }
                rows += measure_fwd_bwd(
                    "hstu", case, impls, _leaves(qkv, extra), dtype, fwd_flops, 2.5
                )
    return rows
