"""HSTU attention and its delta step (serving over cached keys): Python entry points and fake
kernels (autograd, which calls the backward op: csrc/recops/hstu/ops.cpp; kernels:
csrc/recops/hstu/kernels/hstu_attention.h). The ops' arguments are declared once, in their
schemas (csrc/recops/hstu/options.h): the code here reads them by name."""

from __future__ import annotations

import torch

from recops._autograd import named_arguments
from recops._fake import register_fake

ops = torch.ops.recops
_BACKWARD = ops.hstu_dense_backward.default
# The differentiable optional inputs, in the backward's result order after grad_q, grad_k, grad_v.
_BIAS_INPUTS = ("attn_bias", "ts_w", "pos_w")


def contiguous_like(t):
    return None if t is None else torch.empty_like(t, memory_format=torch.contiguous_format)


@register_fake("recops::hstu_dense_forward")
def _hstu_forward_fake(q, k, v, *args, **kwargs):
    return q.new_empty((q.shape[0], q.shape[1], v.shape[2]))


@register_fake("recops::hstu_dense_backward")
def _hstu_backward_fake(*args, **kwargs):
    a = named_arguments(_BACKWARD, args, kwargs)
    return tuple(contiguous_like(a[name]) for name in ("q", "k", "v", *_BIAS_INPUTS))


@register_fake("recops::hstu_delta_attention")
def _hstu_delta_fake(q, k, v, *args, **kwargs):
    return q.new_empty((q.shape[0], q.shape[1], v.shape[-1]))


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


def split_mask(mask, options):
    """(mask_type, custom_mask) of the HSTU-family ops from ``mask`` (a name or a mask tensor), or
    from the op's own ``mask_type`` / ``custom_mask`` options, which are taken out of ``options``.
    A ``custom_mask`` under another mask type is passed on for the op to reject, never dropped."""
    mask_type = options.pop("mask_type", None)
    custom_mask = options.pop("custom_mask", None)
    if isinstance(mask, torch.Tensor):
        if custom_mask is not None:
            raise ValueError("mask is a tensor and custom_mask is given: pass the custom mask once")
        return mask_type or "custom", mask
    return mask_type or mask, custom_mask


def hstu_attention(
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
    """HSTU attention (docs/ops.md section 4): ``O_i = sum_j silu(alpha q_i.k_j + bias_ij) *
    silu_scale * M_ij * v_j``, fused and tiled; differentiable in q, k, v, attn_bias, ts_w, pos_w.

    Layouts: jagged ``q, k [L, H, Dqk]``, ``v [L, H, Dv]`` with ``seq_offsets [B + 1]`` and
    ``max_seq_len``; or dense ``[B, N, H, D]`` with optional ``lengths [B]`` (positions past a
    length are ignored and give zero output). ``mask``: "causal" (default; with
    ``contextual_seq_len``, ``num_targets``, ``target_group_size``, ``max_attn_len``), "none"
    (two-sided), or a tensor ``[B|1, H|1, N, N]`` (bool or multiplicative float).

    ``options`` go to ``torch.ops.recops.hstu_dense_forward`` by name; its schema declares them
    with their defaults: ``alpha=1.0``, ``silu_scale`` (default ``1 / max_seq_len``),
    ``contextual_seq_len=0``, ``num_targets``, ``target_group_size=1``, ``max_attn_len=0``, a
    dense ``attn_bias`` broadcastable to ``[B, H, N, N]``, or the fused relative time + position
    bias from ``timestamps`` ([B, N], or [L] jagged), ``ts_w [num_buckets + 1]`` and
    ``pos_w [2 N - 1]`` with ``query_time_shift=True`` and ``bucket_divisor=0.301``.
    """
    layout = SequenceLayout(q, k, v, seq_offsets, max_seq_len)
    mask_type, custom_mask = split_mask(mask, options)
    out = ops.hstu_dense_forward(
        *layout.qkv,
        layout.seq_offsets,
        lengths,
        layout.max_seq_len,
        mask_type=mask_type,
        custom_mask=custom_mask,
        **options,
    )
    return layout.restore(out)


def delta_step(op, max_seq_len, delta_q, k, v, seq_offsets, delta_offsets, options):
    """``op`` (a delta attention op) on new rows ``delta_q`` of sequences whose keys are jagged
    rows (``seq_offsets``) or pages (``page_table`` and ``seq_lengths`` in ``options``); without
    ``delta_offsets`` the rows split equally among the sequences (generative-recommenders' delta
    layout), or raise."""
    page_table = options.pop("page_table", None)
    if delta_offsets is None:
        batch = seq_offsets.shape[0] - 1 if seq_offsets is not None else page_table.shape[0]
        rows = delta_q.shape[0]
        if batch < 1 or rows % batch != 0:
            raise ValueError(
                f"delta_q's {rows} rows must split equally among the B = {batch} sequences "
                "(or pass delta_offsets)"
            )
        delta_offsets = torch.arange(batch + 1, dtype=torch.int64) * (rows // batch)
    seq_lengths = options.pop("seq_lengths", None)
    return op(
        delta_q, k, v, delta_offsets, seq_offsets, page_table, seq_lengths, max_seq_len, **options
    )


def delta_hstu_mha(
    max_seq_len: int,
    alpha: float,
    delta_q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    seq_offsets: torch.Tensor,
    num_targets: torch.Tensor | None = None,
    max_attn_len: int = 0,
    contextual_seq_len: int = 0,
    *,
    delta_offsets: torch.Tensor | None = None,
    **options,
) -> torch.Tensor:
    """A delta step of HSTU attention, forward only: generative-recommenders' ``delta_hstu_mha``
    (its signature and semantics; ``pytorch_cached_hstu_mha`` is its reference) as one fused CPU
    op. ``delta_q [R, H, Dqk]`` holds the newest rows of each sequence of ``k, v [L, H, D]``
    (``seq_offsets [B + 1]``); they attend to every key of their sequence under the causal
    structured mask (``num_targets``, ``max_attn_len``, ``contextual_seq_len``) with the
    normaliser ``1 / max_seq_len``. Returns ``[R, H, Dv]``.

    By default the R rows are the last ``R // B`` of every sequence, as upstream; ``delta_offsets
    [B + 1]`` gives each sequence its own number of new rows. ``options`` go to
    ``torch.ops.recops.hstu_delta_attention`` by name: ``silu_scale``, ``target_group_size``,
    the fused relative bias (``timestamps`` aligned with k's rows, ``ts_w``, ``pos_w``,
    ``query_time_shift``, ``bucket_divisor``), or, instead of ``seq_offsets``, pages of a cache:
    ``k, v [pages, page_rows, H, D]`` with ``page_table [B, max_pages]`` and ``seq_lengths [B]``
    (pass ``seq_offsets=None``).
    """
    options.update(
        alpha=alpha,
        num_targets=num_targets,
        max_attn_len=max_attn_len,
        contextual_seq_len=contextual_seq_len,
    )
    return delta_step(
        ops.hstu_delta_attention, max_seq_len, delta_q, k, v, seq_offsets, delta_offsets, options
    )
