"""Fake kernels and autograd of the jagged family (kernels live in csrc/recops/jagged)."""

import torch
from torch.library import register_autograd

from recops._autograd import input_grads, named_arguments
from recops._fake import register_fake

ops = torch.ops.recops


def _check_max_lengths(offsets, max_lengths):
    torch._check(
        len(max_lengths) == len(offsets),
        lambda: f"max_lengths must have one entry per jagged dim ({len(offsets)})",
    )
    for d, length in enumerate(max_lengths):
        _check_size(length, f"max_lengths[{d}]")


def _check_size(size, name):
    """The size rules the fake kernels check without data, as the CPU kernels do."""
    torch._check(size >= 0, lambda: f"{name} must be >= 0, got {size}")


# --------------------------------------------------------------------------- cumsum
@register_fake("recops::asynchronous_complete_cumsum")
def _complete_cumsum_fake(t_in):
    torch._check(t_in.dim() in (1, 2), lambda: "t_in must be 1-D [N] or 2-D [B, N]")
    if t_in.dim() == 1:
        return t_in.new_empty(t_in.shape[0] + 1)
    return t_in.new_empty(t_in.shape[0], t_in.shape[1] + 1)


@register_fake("recops::asynchronous_exclusive_cumsum")
def _exclusive_cumsum_fake(t_in):
    return torch.empty_like(t_in, memory_format=torch.contiguous_format)


@register_fake("recops::asynchronous_inclusive_cumsum")
def _inclusive_cumsum_fake(t_in):
    return torch.empty_like(t_in, memory_format=torch.contiguous_format)


# --------------------------------------------------------------------------- jagged <-> dense
@register_fake("recops::jagged_to_padded_dense_forward")
def _jagged_to_padded_dense_forward_fake(values, offsets, max_lengths, padding_value=0.0):
    _check_max_lengths(offsets, max_lengths)
    batch = offsets[0].shape[0] - 1
    return values.new_empty((batch, *max_lengths, *values.shape[1:]))


@register_fake("recops::jagged_to_padded_dense_backward")
def _jagged_to_padded_dense_backward_fake(grad_output, offsets, total_L):
    _check_size(total_L, "total_L")
    return grad_output.new_empty((total_L, *grad_output.shape[1 + len(offsets) :]))


@register_fake("recops::dense_to_jagged_forward")
def _dense_to_jagged_forward_fake(dense, x_offsets, total_L=None):
    if total_L is None:
        total_L = torch.library.get_ctx().new_dynamic_size()
    _check_size(total_L, "total_L")
    return dense.new_empty((total_L, *dense.shape[1 + len(x_offsets) :]))


@register_fake("recops::jagged_2d_to_dense")
def _jagged_2d_to_dense_fake(values, offsets, max_sequence_length):
    _check_size(max_sequence_length, "max_sequence_length")
    return values.new_empty((offsets.shape[0] - 1, max_sequence_length, values.shape[1]))


@register_fake("recops::jagged_1d_to_dense")
def _jagged_1d_to_dense_fake(values, offsets, max_sequence_length, padding_value):
    _check_size(max_sequence_length, "max_sequence_length")
    return values.new_empty((offsets.shape[0] - 1, max_sequence_length))


# Autograd of jagged_to_padded_dense_forward, dense_to_jagged_forward and jagged_{1d,2d}_to_dense
# is registered in C++ (csrc/recops/jagged/autograd.cpp): those ops take microseconds.


# --------------------------------------------------------------------------- offsets_range
@register_fake("recops::offsets_range")
def _offsets_range_fake(offsets, range_size):
    _check_size(range_size, "range_size")
    return offsets.new_empty(range_size)


# --------------------------------------------------------------------------- jagged: new ops
@register_fake("recops::asynchronous_batched_complete_cumsum")
def _batched_complete_cumsum_fake(values):
    torch._check(values.dim() == 2, lambda: "values must be 2-D [B, N]")
    return values.new_empty(values.shape[0], values.shape[1] + 1)


@register_fake("recops::segment_sum_csr")
def _segment_sum_csr_fake(batch_size, csr_seg, values):
    _check_size(batch_size, "batch_size")
    torch._check(csr_seg.numel() >= 1, lambda: "csr_seg must hold at least one offset")
    return values.new_empty(csr_seg.numel() - 1)


def _rows_of(values, rows):
    torch._check(values.dim() == 2, lambda: "values must be 2-D [rows, columns]")
    return values.new_empty(rows, values.shape[1])


@register_fake("recops::jagged_index_select_2d_forward")
def _jagged_index_select_2d_fake(
    values, indices, input_offsets, output_offsets, num_dense_output_rows
):
    _check_size(num_dense_output_rows, "num_dense_output_rows")
    return _rows_of(values, num_dense_output_rows)


@register_fake("recops::jagged_index_select_2d_forward_v2")
def _jagged_index_select_2d_v2_fake(
    values, indices, input_offsets, output_offsets, num_dense_output_rows=None
):
    if num_dense_output_rows is None:
        num_dense_output_rows = torch.library.get_ctx().new_dynamic_size()
    _check_size(num_dense_output_rows, "num_dense_output_rows")
    return _rows_of(values, num_dense_output_rows)


@register_fake("recops::jagged_index_add_2d_forward")
def _jagged_index_add_2d_fake(
    values, indices, input_offsets, output_offsets, num_dense_input_rows, num_output_rows
):
    _check_size(num_output_rows, "num_output_rows")
    return _rows_of(values, num_output_rows)


@register_fake("recops::jagged_index_add_2d_forward_v2")
def _jagged_index_add_2d_v2_fake(
    values, indices, input_offsets, output_offsets, num_output_rows, num_dense_input_rows
):
    _check_size(num_output_rows, "num_output_rows")
    return _rows_of(values, num_output_rows)


# jagged_index_select is a composite over the two _v2 ops above, bound in C++ as FBGEMM binds it
# (csrc/recops/jagged/jagged_index_select_autograd.cpp).


@register_fake("recops::keyed_jagged_index_select_dim1")
def _keyed_jagged_index_select_dim1_fake(
    values, lengths, offsets, indices, batch_size, weights=None, selected_lengths_sum=None
):
    torch._check(batch_size > 0, lambda: f"batch_size must be > 0, got {batch_size}")
    torch._check(
        offsets.shape[0] == lengths.shape[0] + 1,
        lambda: "offsets must hold lengths.numel() + 1 entries",
    )
    torch._check(
        lengths.shape[0] % batch_size == 0,
        lambda: "lengths.numel() must be a multiple of batch_size",
    )
    total = selected_lengths_sum
    if total is None:
        total = torch.library.get_ctx().new_dynamic_size()
    _check_size(total, "selected_lengths_sum")
    num_batches = lengths.shape[0] // batch_size
    result = [values.new_empty(total), lengths.new_empty(indices.shape[0] * num_batches)]
    if weights is not None:
        result.append(weights.new_empty(total))
    return result


def _keyed_select_setup(ctx, inputs, output):
    a = named_arguments(ops.keyed_jagged_index_select_dim1.default, inputs)
    ctx.layout = (a["offsets"], a["indices"], a["lengths"].shape[0] // a["batch_size"])
    ctx.batch_size = a["batch_size"]
    ctx.num_values = a["values"].shape[0]
    ctx.output_lengths = output[1]


def _keyed_select_backward(ctx, grads):
    # Only the values are differentiable (as in FBGEMM). The gradient of output segment
    # key * len(indices) + j goes back to input segment key * batch_size + indices[j]: the
    # jagged_index_add of the selection, with the values' offsets as its output offsets.
    grad = grads[0]
    if grad is None:
        return input_grads(ctx, None, None, None, None, None, None, None)
    offsets, indices, num_batches = ctx.layout
    keys = torch.arange(num_batches, device=indices.device) * ctx.batch_size
    segments = (keys[:, None] + indices.long()[None, :]).reshape(-1)
    grad_values = ops.jagged_index_add_2d_forward_v2(
        grad.unsqueeze(1),
        segments,
        ctx.output_lengths.long().cumsum(0),
        offsets[1:].long(),
        ctx.num_values,
        grad.shape[0],
    ).squeeze(1)
    return input_grads(ctx, grad_values, None, None, None, None, None, None)


register_autograd(
    "recops::keyed_jagged_index_select_dim1",
    _keyed_select_backward,
    setup_context=_keyed_select_setup,
)


@register_fake("recops::jagged_unique_indices")
def _jagged_unique_indices_fake(hash_size_cumsum, hash_size_offsets, offsets, indices):
    torch._check(offsets.dim() == 1, lambda: "offsets must be 1-D")
    torch._check(offsets.shape[0] >= 1, lambda: "offsets must hold at least one entry")
    num_unique = torch.library.get_ctx().new_dynamic_size()
    return (
        offsets.new_empty(offsets.shape[0] - 1),
        offsets.new_empty(offsets.shape[0]),
        indices.new_empty(num_unique),
        indices.new_empty(indices.shape[0], dtype=torch.int64),
    )
