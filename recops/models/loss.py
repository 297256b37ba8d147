"""Sampled softmax loss with uniformly sampled negatives (generative-recommenders'
SampledSoftmaxLoss with item L2 normalisation and temperature 0.05)."""

from __future__ import annotations

import torch

from recops.models.encoder import l2_normalize

# The logit of a sampled negative that is the positive itself (generative-recommenders' value).
_NOT_A_NEGATIVE = -5e4


def sample_negatives(num_items: int, count: int, generator: torch.Generator) -> torch.Tensor:
    """``count`` item ids drawn uniformly from 1..num_items."""
    return torch.randint(1, num_items + 1, (count,), generator=generator)


def sampled_softmax_loss(
    queries: torch.Tensor,
    positives: torch.Tensor,
    positive_ids: torch.Tensor,
    negatives: torch.Tensor,
    negative_ids: torch.Tensor,
    temperature: float,
    counts: torch.Tensor,
) -> torch.Tensor:
    """Mean over the queries that ``counts`` ([M] bool) of
    ``-log softmax([q.p, q.n_1, ..., q.n_R] / temperature)[0]``.

    ``queries [M, d]`` are unit-norm states, ``positives [M, d]`` and ``negatives [R, d]`` item
    embeddings (L2-normalised here). The R negatives are shared by every query of the batch, as
    TensorFlow's sampled softmax shares its sampled classes: their logits are one ``[M, d] x
    [d, R]`` product, where drawing R per query (generative-recommenders' "local" sampler)
    would gather M x R embeddings, 280 MB per ML-100K batch. A negative equal to a query's
    positive is masked out of that query's softmax. The loss is computed as
    ``logaddexp(p, logsumexp(n)) - p``, the same value without concatenating the logits."""
    positives, negatives = l2_normalize(positives), l2_normalize(negatives)
    positive_logits = (queries * positives).sum(-1) / temperature
    negative_logits = (queries @ negatives.T) / temperature
    same = positive_ids.unsqueeze(1) == negative_ids.unsqueeze(0)
    negative_logits = negative_logits.masked_fill(same, _NOT_A_NEGATIVE)
    normaliser = torch.logsumexp(negative_logits.to(positive_logits.dtype), dim=1)
    losses = torch.logaddexp(positive_logits, normaliser) - positive_logits
    weights = counts.to(losses.dtype)
    return (losses * weights).sum() / weights.sum()
