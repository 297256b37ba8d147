"""The sampled softmax loss over shared negatives, fused (docs/ops.md §9): the training loss of
the sequential recommenders (recops.models.loss.sampled_softmax_loss, which the torch backend
runs as PyTorch ops) without its ``[M, R]`` logits, their masked copy, their exponentials and the
backward's matching tensors; a forward that needs gradients computes them in the same pass
(``sampled_softmax_loss_and_grads``), which the backward scales. Python entry point and fake
kernels (autograd: csrc/recops/loss/ops.cpp; kernels: csrc/recops/loss/kernels/)."""

from __future__ import annotations

import torch

from recops._autograd import named_arguments
from recops._fake import register_fake

ops = torch.ops.recops
_LOSS = ops.sampled_softmax_loss.default
_LOSS_AND_GRADS = ops.sampled_softmax_loss_and_grads.default


@register_fake("recops::sampled_softmax_loss")
def _loss_fake(*args, **kwargs):
    return named_arguments(_LOSS, args, kwargs)["queries"].new_empty(())


@register_fake("recops::sampled_softmax_loss_and_grads")
def _loss_and_grads_fake(*args, **kwargs):
    a = named_arguments(_LOSS_AND_GRADS, args, kwargs)
    return (a["queries"].new_empty(()),) + tuple(
        torch.empty_like(a[name], memory_format=torch.contiguous_format)
        for name in ("queries", "positives", "negatives")
    )


# Under CPU autocast the states arrive in bf16 and the item embeddings in fp32: the loss computes
# in fp32, as its log-sum-exp needs.
torch.library.register_autocast("recops::sampled_softmax_loss", "cpu", torch.float32)


def sampled_softmax_loss(
    queries: torch.Tensor,
    positives: torch.Tensor,
    positive_ids: torch.Tensor,
    negatives: torch.Tensor,
    negative_ids: torch.Tensor,
    temperature: float,
    weights: torch.Tensor,
    *,
    eps: float = 1e-6,
    positive_shift: int = 0,
) -> torch.Tensor:
    """Mean over the rows that ``weights`` ([M], float or bool) weighs of
    ``-log softmax([q.p, q.n_1, ..., q.n_R] / temperature)[0]``, ``queries [M, d]`` against their
    ``positives [M, d]`` and the R shared ``negatives [R, d]``, both L2-normalised here
    (``x / max(|x|, eps)``); a negative whose id equals a row's positive id drops out of that
    row's softmax. The value and gradients of recops.models.loss.sampled_softmax_loss (the
    arguments in its order), computed block by block of rows without the ``[M, R]`` logits.

    ``positive_shift=s`` scores row i of ``queries`` (weight ``weights[i]``) against row ``i + s``
    of ``positives`` and ``positive_ids``, for ``i < M - s``: next-item prediction over a jagged
    batch's rows is ``queries=states, positives=item_embeddings, positive_shift=1`` (the same loss
    as ``states[:-1]`` against ``item_embeddings[1:]``, without the slices, whose backward writes
    each gradient into a zero-filled copy of the whole). The rows no pair reads get zero
    gradients."""
    return ops.sampled_softmax_loss(
        queries,
        positives,
        positive_ids,
        negatives,
        negative_ids,
        weights,
        temperature,
        eps,
        positive_shift,
    )
