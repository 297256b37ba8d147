"""Relative attention bias of HSTU / FuXi-alpha (docs/ops.md §3): fake kernels, autograd and the
RelativeBucketedTimeAndPositionBasedBias module (kernels: csrc/recops/hstu)."""

import math

import torch
from torch.library import register_autograd

from recops._autograd import input_grads
from recops._fake import register_fake

ops = torch.ops.recops


def _time_bias_shape(timestamps, ts_w, seq_offsets, max_seq_len):
    if seq_offsets is None:
        torch._check(
            timestamps.dim() == 2,
            lambda: "timestamps must be 2-D [B, N] (or 1-D jagged values with seq_offsets)",
        )
        batch, n = timestamps.shape
    else:
        torch._check(max_seq_len is not None, lambda: "max_seq_len is required with seq_offsets")
        batch, n = seq_offsets.shape[0] - 1, max_seq_len
    shape = (batch, n, n)
    return shape if ts_w.dim() == 1 else (ts_w.shape[0], *shape)


# relative_attn_bias_time and relative_attn_bias_time_with_index are C++ composites of this op.
@register_fake("recops::relative_attn_bias_time_forward")
def _time_forward_fake(
    timestamps,
    ts_w,
    pos_w,
    seq_offsets,
    max_seq_len,
    bucket_divisor,
    query_time_shift,
    index_dtype,
):
    shape = _time_bias_shape(timestamps, ts_w, seq_offsets, max_seq_len)
    return ts_w.new_empty(shape), ts_w.new_empty(shape[-3:], dtype=index_dtype)


@register_fake("recops::relative_attn_bias_pos")
def _pos_fake(pos_w, max_seq_len=None):
    n = (pos_w.shape[-1] + 1) // 2
    return pos_w.new_empty((1, n, n) if pos_w.dim() == 1 else (pos_w.shape[0], 1, n, n))


@register_fake("recops::relative_attn_bias_backward")
def _backward_fake(
    grad_bias,
    timestamps=None,
    bucket_index=None,
    seq_offsets=None,
    num_buckets=128,
    bucket_divisor=0.301,
    query_time_shift=True,
    pos_grad=False,
):
    torch._check(num_buckets >= 0, lambda: f"num_buckets must be >= 0, got {num_buckets}")
    layers = (grad_bias.shape[0],) if grad_bias.dim() == 4 else ()
    n = grad_bias.shape[-1]
    has_time = timestamps is not None or bucket_index is not None
    grad_ts = grad_bias.new_empty((*layers, num_buckets + 1)) if has_time else None
    grad_pos = grad_bias.new_empty((*layers, 2 * n - 1)) if pos_grad else None
    return grad_ts, grad_pos


def _time_setup(ctx, inputs, output):
    ts_w, pos_w, seq_offsets = inputs[1], inputs[2], inputs[3]
    ctx.save_for_backward(output[1], seq_offsets)
    ctx.num_buckets = ts_w.shape[-1] - 1
    ctx.has_pos = pos_w is not None


def _time_backward(ctx, grad_bias, grad_index):
    # The forward's bucket index (uint8 for HSTU's 129-entry table) spares recomputing buckets.
    bucket_index, seq_offsets = ctx.saved_tensors
    grad_ts, grad_pos = ops.relative_attn_bias_backward(
        grad_bias,
        None,
        bucket_index if ctx.needs_input_grad[1] else None,
        seq_offsets,
        ctx.num_buckets,
        pos_grad=ctx.has_pos and ctx.needs_input_grad[2],
    )
    return input_grads(ctx, None, grad_ts, grad_pos, None, None, None, None, None)


register_autograd(
    "recops::relative_attn_bias_time_forward", _time_backward, setup_context=_time_setup
)


def _pos_backward(ctx, grad_bias):
    _, grad_pos = ops.relative_attn_bias_backward(grad_bias, num_buckets=0, pos_grad=True)
    return input_grads(ctx, grad_pos, None)


register_autograd("recops::relative_attn_bias_pos", _pos_backward)


# --------------------------------------------------------------------------- module
def _probe_deltas(bucket_divisor, num_buckets):
    """Integer time deltas, positive and negative, two per bucket boundary (2% of a bucket on
    either side) plus one mid-bucket, up to past the last bucket, kept only where ln|dt| / divisor
    is at least 1e-3 from an integer: any float32 or float64 evaluation of the log bucketing
    agrees on them, while a different divisor, clamp or sign rule shows up."""
    k = torch.arange(num_buckets + 3, dtype=torch.float64)
    offsets = torch.tensor([-0.02, 0.02, 0.5], dtype=torch.float64)
    log_d = ((k[:, None] + offsets) * bucket_divisor).flatten()
    log_d = log_d[log_d < math.log(2.0**62)]
    d = torch.exp(log_d).round().clamp(min=1)
    q = torch.log(d) / bucket_divisor
    d = d[(q - q.round()).abs() > 1e-3].to(torch.int64)
    return torch.cat([torch.tensor([0]), d, -d])


def _is_log_bucketization(bucketization_fn, bucket_divisor, num_buckets):
    """Whether bucketization_fn agrees with clamp(floor(ln(max(|dt|, 1)) / divisor), 0, nb) on the
    probe deltas (it then gets the fused kernel)."""
    d = _probe_deltas(bucket_divisor, num_buckets)
    expected = (torch.log(d.abs().clamp(min=1).double()) / bucket_divisor).floor()
    expected = expected.clamp(0, num_buckets).to(torch.int64)
    got = torch.clamp(bucketization_fn(d), min=0, max=num_buckets)
    return got.shape == d.shape and torch.equal(got.to(torch.int64), expected)


class RelativeBucketedTimeAndPositionBasedBias(torch.nn.Module):
    """Relative time + position attention bias of HSTU / FuXi-alpha, computed by recops' fused ops.

    A drop-in for ``RelativeBucketedTimeAndPositionBasedBias`` of generative-recommenders
    (research/modeling/sequential/hstu.py): same constructor, parameters ``_ts_w``
    ``[num_buckets + 1]`` and ``_pos_w`` ``[2 * max_seq_len - 1]`` (normal, std 0.02, created in
    the same order, so a seeded model initialises identically and state dicts load both ways), and
    ``forward(all_timestamps [B, N]) -> [B, N, N]`` =
    ``pos_w[N - 1 + j - i] + ts_w[bucket(ts[i + 1] - ts[j])]`` (the last position using its own
    timestamp). ``N`` may also be shorter than ``max_seq_len`` (the centre of ``pos_w`` is used).

    ``bucketization_fn=None`` means HSTU's log bucketing, ``floor(ln(max(|dt|, 1)) /
    bucket_divisor)`` clamped to ``[0, num_buckets]``, fused into one kernel. A callable is checked
    once, on probe deltas around every bucket boundary, against that bucketing with
    ``bucket_divisor``; HSTU's ``lambda x: (torch.log(torch.abs(x).clamp(min=1)) / 0.301).long()``
    passes and gets the fused kernel (which evaluates the formula in float64, see
    docs/gather_and_relative_bias.md). Any other callable is applied as given to the ``[B, N, N]``
    deltas and its buckets looked up with ``gather_for_rank1``.
    """

    def __init__(
        self,
        max_seq_len,
        num_buckets,
        bucketization_fn=None,
        *,
        bucket_divisor=0.301,
        query_time_shift=True,
    ):
        super().__init__()
        self._max_seq_len = max_seq_len
        self._ts_w = torch.nn.Parameter(torch.empty(num_buckets + 1).normal_(mean=0, std=0.02))
        self._pos_w = torch.nn.Parameter(torch.empty(2 * max_seq_len - 1).normal_(mean=0, std=0.02))
        self._num_buckets = num_buckets
        self._bucketization_fn = bucketization_fn
        self._bucket_divisor = bucket_divisor
        self._query_time_shift = query_time_shift
        self.fused = bucketization_fn is None or _is_log_bucketization(
            bucketization_fn, bucket_divisor, num_buckets
        )

    @property
    def ts_w(self) -> torch.Tensor:
        return self._ts_w

    @property
    def pos_w(self) -> torch.Tensor:
        return self._pos_w

    def forward(self, all_timestamps: torch.Tensor) -> torch.Tensor:
        n = all_timestamps.shape[1]
        if n > self._max_seq_len:
            raise ValueError(
                f"all_timestamps has {n} positions, more than max_seq_len {self._max_seq_len}"
            )
        pos_w = self._pos_w[self._max_seq_len - n : self._max_seq_len + n - 1]
        if self.fused:
            return ops.relative_attn_bias_time(
                all_timestamps,
                self._ts_w,
                pos_w,
                bucket_divisor=self._bucket_divisor,
                query_time_shift=self._query_time_shift,
            )
        query = all_timestamps
        if self._query_time_shift:
            query = torch.cat([all_timestamps[:, 1:], all_timestamps[:, n - 1 : n]], dim=1)
        buckets = torch.clamp(
            self._bucketization_fn(query.unsqueeze(2) - all_timestamps.unsqueeze(1)),
            min=0,
            max=self._num_buckets,
        ).detach()
        ts_bias = ops.gather_for_rank1(self._ts_w, buckets.reshape(-1)).view(buckets.shape)
        return ops.relative_attn_bias_pos(pos_w) + ts_bias
