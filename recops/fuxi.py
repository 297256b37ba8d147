"""FuXi-alpha attention: Python entry point, fake kernels and autograd
(kernels: csrc/recops/attention/kernels/fuxi_attention.h)."""

from __future__ import annotations

import torch
from torch.library import register_autograd

from recops._autograd import input_grads
from recops._fake import register_fake
from recops.hstu import call_arguments

ops = torch.ops.recops

# Positions of the differentiable optional inputs in hstu_dense_forward_fuxi's argument list.
_TS_BIAS, _POS_BIAS, _TS_W, _POS_W = 14, 15, 17, 18


def _channels(ts_bias, pos_bias, ts_w, pos_w):
    return (
        1 + (ts_bias is not None or ts_w is not None) + (pos_bias is not None or pos_w is not None)
    )


@register_fake("recops::hstu_dense_forward_fuxi")
def _fuxi_forward_fake(q, k, v, seq_offsets, seq_lengths, *options):
    ts_bias, pos_bias, ts_w, pos_w = (options[i - 5] for i in (_TS_BIAS, _POS_BIAS, _TS_W, _POS_W))
    width = _channels(ts_bias, pos_bias, ts_w, pos_w) * q.shape[1] * v.shape[2]
    return q.new_empty((q.shape[0], width))


@register_fake("recops::hstu_dense_backward_fuxi")
def _fuxi_backward_fake(grad_output, q, k, v, seq_offsets, seq_lengths, *options):
    ts_bias, pos_bias, ts_w, pos_w = (options[i - 5] for i in (_TS_BIAS, _POS_BIAS, _TS_W, _POS_W))

    def like(t):
        return None if t is None else torch.empty_like(t, memory_format=torch.contiguous_format)

    return like(q), like(k), like(v), like(ts_bias), like(pos_bias), like(ts_w), like(pos_w)


def _fuxi_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:3])
    ctx.others = inputs[3:]


def _fuxi_backward(ctx, grad_output):
    q, k, v = ctx.saved_tensors
    dq, dk, dv, d_ts_bias, d_pos_bias, d_ts_w, d_pos_w = ops.hstu_dense_backward_fuxi(
        grad_output.contiguous(), q, k, v, *ctx.others
    )
    grads = [dq, dk, dv] + [None] * len(ctx.others)
    grads[_TS_BIAS], grads[_POS_BIAS], grads[_TS_W], grads[_POS_W] = (
        d_ts_bias,
        d_pos_bias,
        d_ts_w,
        d_pos_w,
    )
    return input_grads(ctx, *grads)


register_autograd("recops::hstu_dense_forward_fuxi", _fuxi_backward, setup_context=_fuxi_setup)


def fuxi_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    seq_offsets: torch.Tensor | None = None,
    max_seq_len: int | None = None,
    *,
    lengths: torch.Tensor | None = None,
    alpha: float = 1.0,
    silu_scale: float | None = None,
    mask: str | torch.Tensor = "causal",
    contextual_seq_len: int = 0,
    num_targets: torch.Tensor | None = None,
    target_group_size: int = 1,
    max_attn_len: int = 0,
    ts_bias: torch.Tensor | None = None,
    pos_bias: torch.Tensor | None = None,
    timestamps: torch.Tensor | None = None,
    ts_w: torch.Tensor | None = None,
    pos_w: torch.Tensor | None = None,
    query_time_shift: bool = True,
    bucket_divisor: float = 0.301,
    reference_layout: bool = False,
) -> torch.Tensor:
    """FuXi-alpha attention (docs/ops.md section 5): three channels sharing v and the mask M,
    semantic ``silu(alpha q.k) * silu_scale * M @ v``, temporal ``(M * bias_ts) @ v`` and
    positional ``(M * bias_pos) @ v`` (the bias channels are shared by the heads, with no
    activation or scale).

    Layouts as :func:`recops.hstu_attention` (jagged ``[L, H, D]`` with ``seq_offsets`` and
    ``max_seq_len``, or dense ``[B, N, H, D]`` with optional ``lengths``); masks likewise. The time
    bias is a dense ``ts_bias [B, N, N]`` or fused from ``timestamps`` and ``ts_w
    [num_buckets + 1]``; the position bias a dense ``pos_bias [1, N, N]`` or fused from ``pos_w
    [2 N - 1]``; an absent bias drops its channel. Output ``[..., C * H * Dv]``: channel-major
    ``[semantic | time | position]``, or per head ``[position, time, semantic]`` when
    ``reference_layout`` (the FuXi-alpha code's layout). Differentiable in q, k, v and the biases.
    """
    layout, mask_type, custom_mask, silu_scale = call_arguments(
        q, k, v, seq_offsets, max_seq_len, mask, silu_scale
    )
    out = ops.hstu_dense_forward_fuxi(
        *layout.qkv,
        layout.seq_offsets,
        lengths,
        layout.max_seq_len,
        alpha,
        silu_scale,
        mask_type,
        contextual_seq_len,
        num_targets,
        target_group_size,
        max_attn_len,
        custom_mask,
        ts_bias,
        pos_bias,
        timestamps,
        ts_w,
        pos_w,
        query_time_shift,
        bucket_divisor,
        reference_layout,
    )
    return layout.restore(out)
