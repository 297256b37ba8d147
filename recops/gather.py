"""Fake kernels and autograd of the gather family (kernels live in csrc/recops/gather)."""

import torch
from torch.library import register_autograd

from recops._autograd import input_grads
from recops._fake import register_fake

ops = torch.ops.recops


@register_fake("recops::gather_for_rank1")
def _gather_for_rank1_fake(x, index):
    torch._check(x.dim() == 1, lambda: f"x must be 1-D, got shape {tuple(x.shape)}")
    torch._check(index.dim() == 1, lambda: f"index must be 1-D, got shape {tuple(index.shape)}")
    return x.new_empty(index.shape)


@register_fake("recops::index_select_for_rank1_backward")
def _index_select_for_rank1_backward_fake(grad, x, index):
    torch._check(x.dim() == 1, lambda: f"x must be 1-D, got shape {tuple(x.shape)}")
    return grad.new_empty(x.shape)


def _gather_setup(ctx, inputs, output):
    x, index = inputs
    ctx.save_for_backward(x, index)


def _gather_backward(ctx, grad):
    x, index = ctx.saved_tensors
    return input_grads(ctx, ops.index_select_for_rank1_backward(grad, x, index), None)


register_autograd("recops::gather_for_rank1", _gather_backward, setup_context=_gather_setup)


def _scatter_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[2])


def _scatter_backward(ctx, grad_out):
    # The backward is linear in `grad`: its own gradient is the gather again.
    (index,) = ctx.saved_tensors
    return input_grads(ctx, ops.gather_for_rank1(grad_out, index), None, None)


register_autograd(
    "recops::index_select_for_rank1_backward", _scatter_backward, setup_context=_scatter_setup
)
