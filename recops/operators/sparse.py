"""Fake kernels and autograd of the sparse family (kernels live in csrc/recops/sparse)."""

import torch
from torch.fx.experimental.symbolic_shapes import guard_or_false
from torch.library import register_autograd

from recops._autograd import input_grads, named_arguments
from recops._fake import register_fake

ops = torch.ops.recops


def _permute_fake(permute, lengths, values, weights, permuted_lengths_sum, lengths_shape):
    total = permuted_lengths_sum
    if total is None:
        total = torch.library.get_ctx().new_dynamic_size()
    torch._check(total >= 0, lambda: f"permuted_lengths_sum must be >= 0, got {total}")
    permuted_lengths = lengths.new_empty(lengths_shape)
    permuted_values = values.new_empty((total, *values.shape[1:]))
    permuted_weights = None if weights is None else weights.new_empty((total, *weights.shape[1:]))
    return permuted_lengths, permuted_values, permuted_weights


@register_fake("recops::permute_2D_sparse_data")
def _permute_2d_fake(permute, lengths, values, weights=None, permuted_lengths_sum=None):
    shape = (permute.shape[0], lengths.shape[1])
    return _permute_fake(permute, lengths, values, weights, permuted_lengths_sum, shape)


@register_fake("recops::permute_1D_sparse_data")
def _permute_1d_fake(permute, lengths, values, weights=None, permuted_lengths_sum=None):
    shape = (permute.shape[0],)
    return _permute_fake(permute, lengths, values, weights, permuted_lengths_sum, shape)


@register_fake("recops::permute_sparse_features")
def _permute_sparse_features_fake(permute, lengths, indices, weights=None):
    torch._check(lengths.dtype == indices.dtype, lambda: "lengths and indices share one dtype")
    shape = (permute.shape[0], lengths.shape[1])
    return _permute_fake(permute, lengths, indices, weights, None, shape)


@register_fake("recops::permute_2D_sparse_data_input1D")
def _permute_input1d_fake(
    permute, lengths, values, stride, weights=None, permuted_lengths_sum=None
):
    shape = (permute.shape[0] * stride,)
    return _permute_fake(permute, lengths, values, weights, permuted_lengths_sum, shape)


@register_fake("recops::permute_2D_sparse_preallocated_out")
def _permute_preallocated_fake(
    permute,
    lengths,
    values,
    weights=None,
    permuted_lengths_sum=None,
    permuted_lengths_out=None,
    permuted_indices_out=None,
    permuted_weights_out=None,
):
    shape = (permute.shape[0], lengths.shape[1])
    new_lengths, new_values, new_weights = _permute_fake(
        permute, lengths, values, weights, permuted_lengths_sum, shape
    )
    # The outputs given are written and returned as they are.
    if permuted_lengths_out is not None:
        new_lengths = permuted_lengths_out
    if permuted_indices_out is not None:
        new_values = permuted_indices_out
    if weights is not None and permuted_weights_out is not None:
        new_weights = permuted_weights_out
    return new_lengths, new_values, new_weights


@register_fake("recops::expand_into_jagged_permute")
def _expand_into_jagged_permute_fake(permute, input_offset, output_offset, output_size):
    torch._check(output_size >= 0, lambda: f"output_size must be >= 0, got {output_size}")
    return input_offset.new_empty((output_size,))


@register_fake("recops::invert_permute")
def _invert_permute_fake(permute):
    return torch.empty_like(permute, memory_format=torch.contiguous_format)


def _block_bucketize_outputs(op, args, kwargs, mapping):
    a = named_arguments(op, args, kwargs)
    ids, weights = a["indices"], a["weights"]

    def like(t, wanted=True):
        return torch.empty_like(t, memory_format=torch.contiguous_format) if wanted else None

    outputs = (
        a["lengths"].new_empty((a["my_size"] * a["lengths"].shape[0],)),
        like(ids),
        like(weights, weights is not None),
        like(ids, a["bucketize_pos"]),
        like(ids, a["sequence"]),
    )
    return (*outputs, like(ids, a["return_bucket_mapping"])) if mapping else outputs


@register_fake("recops::block_bucketize_sparse_features")
def _block_bucketize_fake(*args, **kwargs):
    return _block_bucketize_outputs(
        ops.block_bucketize_sparse_features.default, args, kwargs, False
    )


@register_fake("recops::block_bucketize_sparse_features_inference")
def _block_bucketize_inference_fake(*args, **kwargs):
    op = ops.block_bucketize_sparse_features_inference.default
    return _block_bucketize_outputs(op, args, kwargs, True)


def _permute_setup(ctx, inputs, output):
    a = named_arguments(ctx.op, inputs)
    values, weights = a["values"], a["weights"]
    ctx.permute = a["permute"]
    ctx.stride = a.get("stride")
    ctx.permuted_lengths = output[0]
    ctx.num_rows = (values.shape[0], None if weights is None else weights.shape[0])


def _pad_rows(t, rows):
    """``t`` with zero rows appended up to ``rows``: the gradient of input rows that no segment
    addresses (values or weights longer than the lengths' sum)."""
    if guard_or_false(t.shape[0] == rows):
        return t
    torch._check(t.shape[0] <= rows)
    return torch.cat([t, t.new_zeros((rows - t.shape[0], *t.shape[1:]))])


def _make_permute_backward(op):
    # Valid when `permute` is a true permutation: the gradient of each output segment goes back to
    # the input segment it came from, i.e. the same op applied with the inverse permutation. The
    # segments then hold as many rows in the output as in the input (grad.shape[0]).
    def backward(ctx, grad_lengths, grad_values, grad_weights):
        inverse = ops.invert_permute(ctx.permute)
        grads = {}
        for name, grad, rows in zip(
            ("values", "weights"), (grad_values, grad_weights), ctx.num_rows, strict=True
        ):
            if grad is None or rows is None:
                grads[name] = None
                continue
            call = {"permute": inverse, "lengths": ctx.permuted_lengths, "values": grad}
            if ctx.stride is not None:
                call["stride"] = ctx.stride
            _, restored, _ = op(**call, weights=None, permuted_lengths_sum=grad.shape[0])
            grads[name] = _pad_rows(restored, rows)
        names = [a.name for a in op._schema.arguments]
        return input_grads(ctx, *(grads.get(n) for n in names))

    return backward


def _permute_setup_for(op):
    def setup(ctx, inputs, output):
        ctx.op = op
        _permute_setup(ctx, inputs, output)

    return setup


# The differentiable permutations (permute_2D_sparse_data_input1D has FBGEMM's formula, which
# FBGEMM itself leaves unregistered).
for _name in ("permute_2D_sparse_data", "permute_1D_sparse_data", "permute_2D_sparse_data_input1D"):
    _op = getattr(ops, _name).default
    register_autograd(
        f"recops::{_name}", _make_permute_backward(_op), setup_context=_permute_setup_for(_op)
    )


# permute_pooled_embs and its FBGEMM twins: one kernel; the _auto_grad ones are differentiable,
# their backward the same permutation with the inverse lists.
PERMUTE_POOLED_EMBS = (
    "permute_pooled_embs",
    "permute_pooled_embs_split",
    "permute_pooled_embs_auto_grad",
    "permute_pooled_embs_auto_grad_split",
)


def _permute_pooled_embs_fake(
    pooled_embs, offset_dim_list, permute_list, inv_offset_dim_list, inv_permute_list
):
    torch._check(pooled_embs.dim() == 2, lambda: "pooled_embs must be 2-D")
    return torch.empty_like(pooled_embs, memory_format=torch.contiguous_format)


def _permute_pooled_setup(ctx, inputs, output):
    ctx.lists = inputs[1:]


def _permute_pooled_backward(ctx, grad):
    offset_dim_list, permute_list, inv_offset_dim_list, inv_permute_list = ctx.lists
    grad_input = ops.permute_pooled_embs(
        grad, inv_offset_dim_list, inv_permute_list, offset_dim_list, permute_list
    )
    return input_grads(ctx, grad_input, None, None, None, None)


for _name in PERMUTE_POOLED_EMBS:
    register_fake(f"recops::{_name}")(_permute_pooled_embs_fake)
for _name in ("permute_pooled_embs_auto_grad", "permute_pooled_embs_auto_grad_split"):
    register_autograd(
        f"recops::{_name}", _permute_pooled_backward, setup_context=_permute_pooled_setup
    )
