"""HSTU attention: Python entry point, fake kernels and autograd
(kernels: csrc/recops/attention/kernels/hstu_attention.h)."""

from __future__ import annotations

import torch
from torch.library import register_autograd

from recops._autograd import input_grads
from recops._fake import register_fake

ops = torch.ops.recops

# Positions of the differentiable optional inputs in hstu_dense_forward's argument list.
_ATTN_BIAS, _TS_W, _POS_W = 14, 16, 17


@register_fake("recops::hstu_dense_forward")
def _hstu_forward_fake(q, k, v, seq_offsets, seq_lengths, *options):
    return q.new_empty((q.shape[0], q.shape[1], v.shape[2]))


@register_fake("recops::hstu_dense_backward")
def _hstu_backward_fake(grad_output, *forward_args):
    # hstu_dense_backward takes grad_output followed by hstu_dense_forward's arguments.
    q, k, v = forward_args[:3]
    attn_bias, ts_w, pos_w = (forward_args[i] for i in (_ATTN_BIAS, _TS_W, _POS_W))
    return (
        torch.empty_like(q, memory_format=torch.contiguous_format),
        torch.empty_like(k, memory_format=torch.contiguous_format),
        torch.empty_like(v, memory_format=torch.contiguous_format),
        *(
            None if t is None else torch.empty_like(t, memory_format=torch.contiguous_format)
            for t in (attn_bias, ts_w, pos_w)
        ),
    )


def _hstu_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:3])
    ctx.others = inputs[3:]


def _hstu_backward(ctx, grad_output):
    q, k, v = ctx.saved_tensors
    dq, dk, dv, d_bias, d_ts_w, d_pos_w = ops.hstu_dense_backward(
        grad_output.contiguous(), q, k, v, *ctx.others
    )
    grads = [dq, dk, dv] + [None] * len(ctx.others)
    grads[_ATTN_BIAS], grads[_TS_W], grads[_POS_W] = d_bias, d_ts_w, d_pos_w
    return input_grads(ctx, *grads)


register_autograd("recops::hstu_dense_forward", _hstu_backward, setup_context=_hstu_setup)


class SequenceLayout:
    """q, k, v in the kernels' jagged [rows, H, D] layout: the jagged layout as given (it needs
    seq_offsets and max_seq_len), or the dense [B, N, H, D] layout viewed as B sequences of N rows
    (seq_offsets = arange(B + 1) * N). ``restore`` gives an output the caller's layout back."""

    def __init__(self, q, k, v, seq_offsets, max_seq_len):
        self.dense_shape = None
        if q.dim() == 4:
            batch, n = q.shape[0], q.shape[1]
            for name, t in (("k", k), ("v", v)):
                if t.dim() != 4 or t.shape[:3] != q.shape[:3]:
                    raise ValueError(
                        f"{name} must be [B, N, H, D] with q's B, N, H = {tuple(q.shape[:3])} in "
                        f"the dense layout, got shape {tuple(t.shape)}"
                    )
            self.dense_shape = (batch, n)
            max_seq_len = n if max_seq_len is None else max_seq_len
            seq_offsets = torch.arange(batch + 1, dtype=torch.int64) * n
            q, k, v = (t.reshape(batch * n, *t.shape[2:]) for t in (q, k, v))
        elif seq_offsets is None or max_seq_len is None:
            raise ValueError("the jagged layout [L, H, D] needs seq_offsets and max_seq_len")
        self.qkv = (q, k, v)
        self.seq_offsets = seq_offsets
        self.max_seq_len = max_seq_len

    def restore(self, out):
        if self.dense_shape is None:
            return out
        return out.reshape(*self.dense_shape, *out.shape[1:])


def call_arguments(q, k, v, seq_offsets, max_seq_len, mask, silu_scale):
    """What the HSTU-family wrappers pass on: the SequenceLayout, (mask_type, custom_mask) from a
    mask name or a custom mask tensor, and silu_scale (default 1 / max_seq_len)."""
    layout = SequenceLayout(q, k, v, seq_offsets, max_seq_len)
    mask_type, custom_mask = ("custom", mask) if isinstance(mask, torch.Tensor) else (mask, None)
    if silu_scale is None:
        silu_scale = 1.0 / max(int(layout.max_seq_len), 1)
    return layout, mask_type, custom_mask, silu_scale


def hstu_attention(
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
    attn_bias: torch.Tensor | None = None,
    timestamps: torch.Tensor | None = None,
    ts_w: torch.Tensor | None = None,
    pos_w: torch.Tensor | None = None,
    query_time_shift: bool = True,
    bucket_divisor: float = 0.301,
) -> torch.Tensor:
    """HSTU attention (docs/ops.md section 4): ``O_i = sum_j silu(alpha q_i.k_j + bias_ij) *
    silu_scale * M_ij * v_j``, fused and tiled; differentiable in q, k, v, attn_bias, ts_w, pos_w.

    Layouts: jagged ``q, k [L, H, Dqk]``, ``v [L, H, Dv]`` with ``seq_offsets [B + 1]`` and
    ``max_seq_len``; or dense ``[B, N, H, D]`` with optional ``lengths [B]`` (positions past a
    length are ignored and give zero output). ``mask``: "causal" (default; with
    ``contextual_seq_len``, ``num_targets``, ``target_group_size``, ``max_attn_len``), "none"
    (two-sided), or a tensor ``[B|1, H|1, N, N]`` (bool or multiplicative float). Bias: a dense
    ``attn_bias`` broadcastable to ``[B, H, N, N]``, or the fused relative time + position bias
    from ``timestamps`` ([B, N], or [L] jagged), ``ts_w [num_buckets + 1]`` and
    ``pos_w [2 N - 1]``. ``silu_scale`` defaults to ``1 / max_seq_len``.
    """
    layout, mask_type, custom_mask, silu_scale = call_arguments(
        q, k, v, seq_offsets, max_seq_len, mask, silu_scale
    )
    out = ops.hstu_dense_forward(
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
        attn_bias,
        timestamps,
        ts_w,
        pos_w,
        query_time_shift,
        bucket_divisor,
    )
    return layout.restore(out)
