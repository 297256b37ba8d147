"""FuXi-alpha attention and its delta step: Python entry points and fake kernels (autograd,
which calls the backward op: csrc/recops/hstu/ops.cpp; kernels:
csrc/recops/hstu/kernels/hstu_attention.h). The op's arguments are declared once, in its schema
(csrc/recops/hstu/options.h): the code here reads them by name."""

from __future__ import annotations

import torch

from recops._autograd import named_arguments
from recops._fake import register_fake
from recops.operators.hstu import (
    SequenceLayout,
    contiguous_like,
    delta_step,
    split_mask,
)

ops = torch.ops.recops
_FORWARD, _BACKWARD = ops.hstu_dense_forward_fuxi.default, ops.hstu_dense_backward_fuxi.default
# The differentiable optional inputs, in the backward's result order after grad_q, grad_k, grad_v.
_BIAS_INPUTS = ("ts_bias", "pos_bias", "ts_w", "pos_w")


def _channels(ts_bias, pos_bias, ts_w, pos_w):
    return (
        1 + (ts_bias is not None or ts_w is not None) + (pos_bias is not None or pos_w is not None)
    )


@register_fake("recops::hstu_dense_forward_fuxi")
def _fuxi_forward_fake(*args, **kwargs):
    a = named_arguments(_FORWARD, args, kwargs)
    q, v = a["q"], a["v"]
    width = _channels(*(a[name] for name in _BIAS_INPUTS)) * q.shape[1] * v.shape[2]
    return q.new_empty((q.shape[0], width))


@register_fake("recops::fuxi_delta_attention")
def _fuxi_delta_fake(*args, **kwargs):
    a = named_arguments(ops.fuxi_delta_attention.default, args, kwargs)
    q, v = a["q"], a["v"]
    width = _channels(None, None, a["ts_w"], a["pos_w"]) * q.shape[1] * v.shape[-1]
    return q.new_empty((q.shape[0], width))


@register_fake("recops::hstu_dense_backward_fuxi")
def _fuxi_backward_fake(*args, **kwargs):
    a = named_arguments(_BACKWARD, args, kwargs)
    return tuple(contiguous_like(a[name]) for name in ("q", "k", "v", *_BIAS_INPUTS))


def fuxi_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    seq_offsets: torch.Tensor | None = None,
    max_seq_len: int | None = None,
    *,
    lengths: torch.Tensor | None = None,
    mask: str | torch.Tensor = "causal",
    **options,
) -> torch.Tensor:
    """FuXi-alpha attention (docs/ops.md section 5): three channels sharing v and the mask M,
    semantic ``silu(alpha q.k) * silu_scale * M @ v``, temporal ``(M * bias_ts) @ v`` and
    positional ``(M * bias_pos) @ v`` (the bias channels are shared by the heads, with no
    activation or scale).

    Layouts as :func:`recops.hstu_attention` (jagged ``[L, H, D]`` with ``seq_offsets`` and
    ``max_seq_len``, or dense ``[B, N, H, D]`` with optional ``lengths``); masks likewise.

    ``options`` go to ``torch.ops.recops.hstu_dense_forward_fuxi`` by name; its schema declares
    them with their defaults: HSTU's (``alpha``, ``silu_scale``, the causal-mask options, the
    fused ``timestamps``, ``ts_w``, ``pos_w``, ``query_time_shift``, ``bucket_divisor``; no
    ``attn_bias``), and the bias channels: the time bias a dense ``ts_bias [B, N, N]`` or fused
    from ``timestamps`` and ``ts_w [num_buckets + 1]``, the position bias a dense ``pos_bias
    [1, N, N]`` or fused from ``pos_w [2 N - 1]``; an absent bias drops its channel. Output
    ``[..., C * H * Dv]``: channel-major ``[semantic | time | position]``, or per head
    ``[position, time, semantic]`` when ``reference_layout=True`` (the FuXi-alpha code's layout).
    Differentiable in q, k, v and the biases.
    """
    layout = SequenceLayout(q, k, v, seq_offsets, max_seq_len)
    mask_type, custom_mask = split_mask(mask, options)
    out = ops.hstu_dense_forward_fuxi(
        *layout.qkv,
        layout.seq_offsets,
        lengths,
        layout.max_seq_len,
        mask_type=mask_type,
        custom_mask=custom_mask,
        **options,
    )
    return layout.restore(out)


def delta_fuxi_attention(
    max_seq_len: int,
    delta_q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    seq_offsets: torch.Tensor | None,
    *,
    delta_offsets: torch.Tensor | None = None,
    **options,
) -> torch.Tensor:
    """A delta step of FuXi-alpha attention, forward only: the newest rows ``delta_q`` of each
    sequence against all of its keys, as :func:`recops.delta_hstu_mha` (equal deltas unless
    ``delta_offsets`` is given; jagged keys with ``seq_offsets`` or pages with ``page_table`` and
    ``seq_lengths``), with :func:`recops.fuxi_attention`'s channels and layouts. ``options`` go to
    ``torch.ops.recops.fuxi_delta_attention`` by name."""
    return delta_step(
        ops.fuxi_delta_attention, max_seq_len, delta_q, k, v, seq_offsets, delta_offsets, options
    )
