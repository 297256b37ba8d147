"""FBGEMM's SGD "writeback" (``extra_optimizer_config.use_writeback_bwd_prehook``): a backward
pre-hook keeps the gradient of only the first occurrence of each duplicated index, so that an SGD
step with learning rate 1 assigns a row instead of accumulating into it. Which rows of
grad_output count as occurrences is FBGEMM's rule, reproduced here (see ``kept_rows``)."""

import torch

from recops.embedding.config import PoolingMode


def _first_of_each(keys: torch.Tensor) -> torch.Tensor:
    """Positions of the first occurrence of each distinct row of ``keys`` ([n, k]), ascending."""
    _, inverse = torch.unique(keys, dim=0, return_inverse=True)
    positions = torch.arange(keys.shape[0], dtype=torch.long)
    first = torch.full((int(inverse.max()) + 1,), keys.shape[0], dtype=torch.long)
    return first.scatter_reduce_(0, inverse, positions, "amin").sort().values


def kept_rows(indices, offsets, num_features, first_feature_only, nobag):
    """The rows of grad_output that keep their gradient (empty: all of them, as in FBGEMM).

    With ``first_feature_only``: the first position of each distinct index among the first
    feature's positions. Otherwise every non-empty bag k is keyed by its first index and the
    bucket ``offsets[k] // (len(offsets) // T)`` (the feature, when bags hold one index each), and
    the first bag of each key is kept: its bag number when pooled, its rank among the non-empty
    bags for PoolingMode.NONE."""
    if indices.numel() == 0:
        return indices.new_zeros(0, dtype=torch.long)
    if first_feature_only:
        end = int(offsets[(offsets.numel() - 1) // num_features])
        if end == 0:
            return indices.new_zeros(0, dtype=torch.long)
        return _first_of_each(indices[:end].long().view(-1, 1))
    starts = offsets.long()
    non_empty = (starts[1:] > starts[:-1]).nonzero().flatten()
    bucket = starts[non_empty] // (offsets.numel() // num_features)
    kept = _first_of_each(torch.stack([bucket, indices.long()[starts[non_empty]]], dim=1))
    return kept if nobag else non_empty[kept]


def writeback_hook(module, grad_output):
    """The backward pre-hook: grad_output with every row but the kept ones zeroed."""
    (grad,) = grad_output
    indices, offsets = module._writeback_batch
    rows = kept_rows(
        indices,
        offsets,
        len(module.feature_table_map),
        module.writeback_first_feature_only,
        module.pooling_mode == PoolingMode.NONE,
    )
    if rows.numel() == 0:
        return (grad,)
    kept = torch.zeros_like(grad)
    kept[rows] = grad[rows]
    return (kept,)
