"""Fake kernels and autograd of the jagged family (kernels live in csrc/recops/jagged)."""

import torch

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
