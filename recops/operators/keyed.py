"""Fake kernels, autograd and module classes of the keyed family (kernels live in
csrc/recops/keyed): the pooled embeddings of several features side by side, as torchrec's
KeyedTensor holds them (docs/keyed.md).

- ``merge_pooled_embeddings``: concatenation along ``cat_dim``, moved to ``target_device``;
- ``kt_regroup_arguments`` / ``permute_multi_embedding``: the regroup of several keyed tensors into
  groups of keys, as arguments then as moves; ``regroup_keyed_tensor`` does both in one call;
- :class:`PermutePooledEmbeddings` and :class:`PermutePooledEmbeddingsSplit`: FBGEMM's module
  classes (``fbgemm_gpu.permute_pooled_embedding_modules[_split]``) over recops'
  ``permute_pooled_embs_auto_grad[_split]``.
"""

from __future__ import annotations

from itertools import accumulate

import torch
from torch import nn
from torch.library import register_autograd

from recops._autograd import input_grads
from recops._fake import register_fake

ops = torch.ops.recops

# The family's FBGEMM ops. FBGEMM's autograd kernels of permute_multi_embedding and
# regroup_keyed_tensor call its kt_regroup_arguments and permute_multi_embedding_function, so
# recops.use_for_fbgemm routes them together.
KEYED_OPS = (
    "merge_pooled_embeddings",
    "permute_multi_embedding_function",
    "permute_multi_embedding",
    "kt_regroup_arguments",
    "regroup_keyed_tensor",
)


# --------------------------------------------------------------------------- merge
def _concatenation_dim(tensors, cat_dim):
    rank = tensors[0].dim()
    return cat_dim + rank if -rank <= cat_dim < 0 else cat_dim


@register_fake("recops::merge_pooled_embeddings")
def _merge_pooled_embeddings_fake(pooled_embeddings, uncat_dim_size, target_device, cat_dim=1):
    torch._check(len(pooled_embeddings) > 0, lambda: "pooled_embeddings must hold a tensor")
    first = pooled_embeddings[0]
    shape = torch.cat(pooled_embeddings, cat_dim).shape  # torch.cat's shape rules
    device = first.device if target_device.type == "cpu" else target_device
    return first.new_empty(shape, device=device)


def _merge_setup(ctx, inputs, output):
    pooled_embeddings, cat_dim = inputs[0], inputs[3] if len(inputs) > 3 else 1
    ctx.dim = _concatenation_dim(pooled_embeddings, cat_dim)
    rank = pooled_embeddings[0].dim()
    # torch.cat skips 1-D empty tensors among tensors of higher rank (its legacy rule).
    ctx.parts = [
        (t.shape, t.dtype, t.device, t.dim() == 1 and rank != 1 and t.numel() == 0)
        for t in pooled_embeddings
    ]


def _merge_backward(ctx, grad):
    sizes = [0 if skipped else shape[ctx.dim] for shape, _, _, skipped in ctx.parts]
    pieces = grad.split(sizes, ctx.dim)
    grads = [
        grad.new_zeros(shape, dtype=dtype, device=device)
        if skipped
        else piece.to(device=device, dtype=dtype)
        for piece, (shape, dtype, device, skipped) in zip(pieces, ctx.parts, strict=True)
    ]
    return input_grads(ctx, grads, None, None, None)


register_autograd("recops::merge_pooled_embeddings", _merge_backward, setup_context=_merge_setup)


# ------------------------------------------------------------------- permute_multi_embedding
def _outputs_fake(pooled_embs, out_lengths):
    torch._check(len(pooled_embs) > 0, lambda: "pooled_embs must hold at least one tensor")
    first = pooled_embs[0]
    for i, t in enumerate(pooled_embs):
        torch._check(t.dim() == 2, lambda i=i: f"pooled_embs[{i}] must be 2-D")
    for j, length in enumerate(out_lengths):
        torch._check(length >= 0, lambda j=j: f"out_lengths[{j}] must be >= 0")
    return [first.new_empty((first.shape[0], length)) for length in out_lengths]


@register_fake("recops::permute_multi_embedding_function")
def _permute_multi_embedding_function_fake(
    pooled_embs, permutes, in_shapes, out_shapes, out_lengths, reverse=False
):
    torch._check(
        permutes.dim() == 2 and permutes.shape[1] == 6, lambda: "permutes must be [moves, 6]"
    )
    return _outputs_fake(pooled_embs, out_lengths)


@register_fake("recops::permute_multi_embedding")
def _permute_multi_embedding_fake(pooled_embs, permutes, in_shapes, out_shapes, out_lengths):
    return _permute_multi_embedding_function_fake(
        pooled_embs, permutes, in_shapes, out_shapes, out_lengths
    )


def _filled(grads, like, out_lengths):
    """The output gradients, zeros for the outputs no loss reached (None)."""
    rows = like.shape[0]
    return [
        like.new_zeros((rows, length)) if g is None else g
        for g, length in zip(grads, out_lengths, strict=True)
    ]


def _permute_multi_setup(ctx, inputs, output):
    pooled_embs, permutes, in_shapes, out_shapes, out_lengths = inputs
    ctx.moves = (permutes, in_shapes, out_shapes)
    ctx.in_lengths = [t.shape[1] for t in pooled_embs]
    ctx.out_lengths = list(out_lengths)
    ctx.like = pooled_embs[0].new_empty((pooled_embs[0].shape[0], 0))


def _permute_multi_backward(ctx, grads):
    permutes, in_shapes, out_shapes = ctx.moves
    grad_inputs = ops.permute_multi_embedding_function(
        _filled(grads, ctx.like, ctx.out_lengths),
        permutes,
        out_shapes,
        in_shapes,
        ctx.in_lengths,
        True,
    )
    return input_grads(ctx, grad_inputs, None, None, None, None)


register_autograd(
    "recops::permute_multi_embedding", _permute_multi_backward, setup_context=_permute_multi_setup
)


# --------------------------------------------------------------------------- regroup
def regroup_widths(keys, lengths, groups):
    """The column count of each output of a regroup (a key listed twice resolves to its first
    place, as in FBGEMM); raises IndexError for a group key that is not one of the keys."""
    torch._check(len(keys) == len(lengths), lambda: "keys and lengths must have one entry each")
    width_of = {}
    for i, (tensor_keys, tensor_lengths) in enumerate(zip(keys, lengths, strict=True)):
        torch._check(
            len(tensor_keys) == len(tensor_lengths),
            lambda i=i: f"keys[{i}] and lengths[{i}] must have one entry per key",
        )
        for key, length in zip(tensor_keys, tensor_lengths, strict=True):
            width_of.setdefault(key, length)
    widths = []
    for j, group in enumerate(groups):
        for k, key in enumerate(group):
            if key not in width_of:
                raise IndexError(f"groups[{j}][{k}] = '{key}' is not one of the keys")
        widths.append(sum(width_of[key] for key in group))
    return widths


@register_fake("recops::kt_regroup_arguments")
def _kt_regroup_arguments_fake(embs, keys, lengths, groups):
    out_lengths = regroup_widths(keys, lengths, groups)
    moves = sum(len(group) for group in groups)
    int32 = dict(dtype=torch.int32, device=embs.device)
    return (
        embs.new_empty((moves, 6), **int32),
        embs.new_empty((len(keys),), **int32),
        embs.new_empty((len(groups),), **int32),
        out_lengths,
    )


@register_fake("recops::regroup_keyed_tensor")
def _regroup_keyed_tensor_fake(pooled_embs, keys, lengths, groups):
    return _outputs_fake(pooled_embs, regroup_widths(keys, lengths, groups))


def _regroup_setup(ctx, inputs, output):
    pooled_embs, keys, lengths, groups = inputs
    ctx.plan = (keys, lengths, groups)
    ctx.in_lengths = [t.shape[1] for t in pooled_embs]
    ctx.out_lengths = [o.shape[1] for o in output]
    ctx.like = pooled_embs[0].new_empty((pooled_embs[0].shape[0], 0))


def _regroup_backward(ctx, grads):
    grads = _filled(grads, ctx.like, ctx.out_lengths)
    permutes, in_shapes, out_shapes, _ = ops.kt_regroup_arguments(ctx.like, *ctx.plan)
    grad_inputs = ops.permute_multi_embedding_function(
        grads, permutes, out_shapes, in_shapes, ctx.in_lengths, True
    )
    return input_grads(ctx, grad_inputs, None, None, None)


register_autograd("recops::regroup_keyed_tensor", _regroup_backward, setup_context=_regroup_setup)


# --------------------------------------------------------------------------- module classes
def _permute_lists(embs_dims, permute, device):
    """FBGEMM's four lists of permute_pooled_embs for features of widths ``embs_dims`` moved so
    that output feature i is input feature ``permute[i]``."""
    inverse = [0] * len(permute)
    for i, p in enumerate(permute):
        inverse[p] = i
    inv_dims = [embs_dims[p] for p in permute]

    def as_tensor(values):
        return torch.tensor(values, device=device, dtype=torch.int64)

    return (
        as_tensor([0, *accumulate(embs_dims)]),
        as_tensor(permute),
        as_tensor([0, *accumulate(inv_dims)]),
        as_tensor(inverse),
    )


class PermutePooledEmbeddings:
    """FBGEMM's ``fbgemm_gpu.permute_pooled_embedding_modules.PermutePooledEmbeddings``: permutes
    the features of pooled embeddings ``[B, sum(embs_dims)]`` along dim 1 so that output feature
    ``i`` is input feature ``permute[i]``; differentiable
    (``torch.ops.recops.permute_pooled_embs_auto_grad``)."""

    def __init__(
        self,
        embs_dims: list[int],
        permute: list[int],
        device: torch.device | None = None,
    ) -> None:
        (
            self._offset_dim_list,
            self._permute,
            self._inv_offset_dim_list,
            self._inv_permute,
        ) = _permute_lists(embs_dims, permute, device)

    def __call__(self, pooled_embs: torch.Tensor) -> torch.Tensor:
        device = pooled_embs.device
        return ops.permute_pooled_embs_auto_grad(
            pooled_embs,
            self._offset_dim_list.to(device=device),
            self._permute.to(device=device),
            self._inv_offset_dim_list.to(device=device),
            self._inv_permute.to(device=device),
        )


@torch.fx.wrap
def _to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A leaf of torch.fx traces (as in FBGEMM's module), not a traced ``.to`` call."""
    return t.to(device=device)


class PermutePooledEmbeddingsSplit(nn.Module):
    """FBGEMM's ``fbgemm_gpu.permute_pooled_embedding_modules_split.PermutePooledEmbeddingsSplit``:
    :class:`PermutePooledEmbeddings` as an ``nn.Module`` whose lists are buffers
    (``torch.ops.recops.permute_pooled_embs_auto_grad_split``)."""

    def __init__(
        self,
        embs_dims: list[int],
        permute: list[int],
        device: torch.device | None = None,
    ) -> None:
        super().__init__()
        offsets, permutation, inv_offsets, inverse = _permute_lists(embs_dims, permute, device)
        # FBGEMM's buffer order, so that state dicts load either way.
        self.register_buffer("_offset_dim_list", offsets)
        self.register_buffer("_permute", permutation)
        self.register_buffer("_inv_permute", inverse)
        self.register_buffer("_inv_offset_dim_list", inv_offsets)

    def forward(self, pooled_embs: torch.Tensor) -> torch.Tensor:
        device = pooled_embs.device
        return ops.permute_pooled_embs_auto_grad_split(
            pooled_embs,
            _to_device(self._offset_dim_list, device),
            _to_device(self._permute, device),
            _to_device(self._inv_offset_dim_list, device),
            _to_device(self._inv_permute, device),
        )
