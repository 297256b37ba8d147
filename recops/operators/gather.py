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


# ------------------------------------------------ FBGEMM's index_select_dim0 family (row gathers)
def _row_selected(input, index):
    if input.dim() == 0:  # index_select on a scalar: one index, a scalar out
        torch._check(index.numel() == 1, lambda: "a 0-D input takes exactly one index")
        return input.new_empty(())
    return input.new_empty((index.numel(), *input.shape[1:]))


def _check_group_sizes(inputs, indices):
    torch._check(
        len(inputs) >= len(indices),
        lambda: "input_group must hold one tensor per entry of indices_group",
    )


@register_fake("recops::group_index_select_dim0")
def _group_index_select_dim0_fake(input_group, indices_group):
    _check_group_sizes(input_group, indices_group)
    return [_row_selected(x, i) for x, i in zip(input_group, indices_group, strict=False)]


def _saved_data():
    # FBGEMM's CPU path returns its CUDA kernel's two extra tensors (arguments, saved data) empty.
    return [torch.empty(0, dtype=torch.int64), torch.empty(0, dtype=torch.int64)]


@register_fake("recops::group_index_select_dim0_gpu_impl")
def _group_index_select_dim0_gpu_impl_fake(inputs, group_size):
    indices, tables = inputs[:group_size], inputs[group_size : 2 * group_size]
    return [_row_selected(x, i) for x, i in zip(tables, indices, strict=True)] + _saved_data()


@register_fake("recops::group_index_select_dim0_gpu_backward")
def _group_index_select_dim0_gpu_backward_fake(inputs, output_shape_group):
    group_size = (len(inputs) - 3) // 2
    first = inputs[2 * group_size + 2]
    dim = first.dim()
    torch._check(len(output_shape_group) == group_size * dim, lambda: "output_shape_group size")
    grads = [
        first.new_empty(output_shape_group[g * dim : (g + 1) * dim]) for g in range(group_size)
    ]
    return [torch.empty(0, dtype=torch.int64) for _ in range(group_size)] + grads


def _batch_output_numel(inputs, num_indices, columns):
    if inputs.numel() == 0:
        return 0
    return sum(n * c for n, c in zip(num_indices, columns, strict=True))


@register_fake("recops::batch_index_select_dim0")
def _batch_index_select_dim0_fake(
    inputs, indices, input_num_indices, input_rows, input_columns, permute_output_dim_0_1=False
):
    torch._check(
        inputs.dim() >= 1 and inputs.numel() == inputs.shape[0],
        lambda: "inputs must be 1-D, or [N, 1, ...]",
    )
    return inputs.new_empty(_batch_output_numel(inputs, input_num_indices, input_columns))


@register_fake("recops::batch_index_select_dim0_tensor")
def _batch_index_select_dim0_tensor_fake(
    inputs, indices, input_num_indices, input_rows, input_columns, permute_output_dim_0_1=False
):
    if inputs.numel() == 0:
        return inputs.new_empty(0)
    return inputs.new_empty(torch.library.get_ctx().new_dynamic_size())


@register_fake("recops::batch_index_select_dim0_backward")
def _batch_index_select_dim0_backward_fake(
    grad_output, indices, input_num_indices, input_rows, input_columns, permute_output_dim_0_1
):
    return grad_output.new_empty(sum(r * c for r, c in zip(input_rows, input_columns, strict=True)))


@register_fake("recops::batch_index_select_dim0_backward_cpu_impl")
def _batch_index_select_dim0_backward_cpu_impl_fake(
    grad_output,
    indices,
    indices_numels,
    input_num_indices,
    input_rows,
    input_columns,
    permute_output_dim_0_1,
    saved_tensor,
):
    return grad_output.new_empty(torch.library.get_ctx().new_dynamic_size())


def _batch_setup(ctx, inputs, output):
    (table, indices, num_indices, rows, columns, *rest) = inputs
    ctx.permute = bool(rest[0]) if rest else False
    ctx.sizes = (num_indices, rows, columns)
    ctx.inputs_shape = table.shape
    ctx.inputs_numel = table.numel()
    ctx.save_for_backward(indices, *(t for t in ctx.sizes if isinstance(t, torch.Tensor)))


def _batch_backward(ctx, grad):
    if ctx.inputs_numel == 0:
        return input_grads(ctx, grad.new_zeros(ctx.inputs_shape), None, None, None, None, None)
    indices, *tensors = ctx.saved_tensors
    if tensors:  # the _tensor form: FBGEMM's backward op with the sizes as tensors
        num, rows, columns = tensors
        saved = torch.full((1,), ctx.inputs_numel, dtype=torch.int64)
        grad_input = ops.batch_index_select_dim0_backward_cpu_impl(
            grad, indices, num, num, rows, columns, ctx.permute, saved
        )
    else:
        num, rows, columns = ctx.sizes
        grad_input = ops.batch_index_select_dim0_backward(
            grad, indices, num, rows, columns, ctx.permute
        )
    return input_grads(ctx, grad_input.view(ctx.inputs_shape), None, None, None, None, None)


for _name in ("batch_index_select_dim0", "batch_index_select_dim0_tensor"):
    register_autograd(f"recops::{_name}", _batch_backward, setup_context=_batch_setup)


def _batch_backward_setup(ctx, inputs, output):
    grad_output, indices, num, rows, columns, permute = inputs
    ctx.args = (indices, num, rows, columns, permute)


def _batch_backward_backward(ctx, grad):
    # Linear in grad_output: its gradient is the forward gather of grad.
    indices, num, rows, columns, permute = ctx.args
    return input_grads(
        ctx,
        ops.batch_index_select_dim0(grad, indices, num, rows, columns, permute),
        None,
        None,
        None,
        None,
        None,
    )


register_autograd(
    "recops::batch_index_select_dim0_backward",
    _batch_backward_backward,
    setup_context=_batch_backward_setup,
)
