"""Recommendation with a trained sequential recommender: the catalogue's scores for a batch of
users, ``recommend`` (top-k unseen items), and its throughput."""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Sequence

import torch

from recops.data.batches import JaggedBatch, request_batch, seen_pairs
from recops.data.sequences import complete_offsets


@contextlib.contextmanager
def evaluating(model: torch.nn.Module):
    """``model`` in eval mode without autograd, its previous mode restored afterwards."""
    was_training = model.training
    if was_training:  # (eval() walks every module: a served model, already in eval, skips it)
        model.eval()
    try:
        with torch.no_grad():
            yield model
    finally:
        if was_training:
            model.train()


def catalogue_scores(model, batch: JaggedBatch) -> torch.Tensor:
    """``[M, num_items + 1]`` float32 dot products of each query state with every unit-norm
    item embedding (generative-recommenders' brute-force MIPS); item 0 (none) scores -inf."""
    return state_scores(model, model.query_states(batch))


def state_scores(model, states: torch.Tensor, candidates: torch.Tensor | None = None):
    """catalogue_scores of query states ``[M, d]`` already encoded (against ``candidates``, unit-
    norm ``[num_items + 1, d]``, when given instead of the model's own)."""
    if candidates is None:
        candidates = model.candidate_embeddings()
    scores = states.float() @ candidates.float().T
    scores[:, 0] = float("-inf")
    return scores


def exclude_seen(scores: torch.Tensor, batch: JaggedBatch) -> torch.Tensor:
    """Sets the scores of the items each query's user has seen (``batch.seen``) to -inf."""
    if batch.seen is not None:
        scores[seen_pairs(batch.seen)] = float("-inf")
    return scores


def top_items(model, states: torch.Tensor, k: int, seen=None, candidates=None):
    """``(items [M, k], scores [M, k])``: the k best items for each query state ``[M, d]`` over
    the catalogue (``candidates``, unit-norm ``[num_items + 1, d]``, or the model's own), best
    first, never item 0 and the ``seen`` ones (jagged, as ``JaggedBatch.seen``) only when no
    other is left; on the model's backend (recops: one op, the catalogue's scores never
    stored)."""
    if candidates is None:
        candidates = model.candidate_embeddings()
    return model.backend.top_items(states, candidates, k, seen)


def _as_history_batch(model, histories, request_times, exclude):
    items = [torch.as_tensor(h[0], dtype=torch.int64) for h in histories]
    times = [torch.as_tensor(h[1], dtype=torch.int64) for h in histories]
    lengths = torch.tensor([t.numel() for t in items])
    if request_times is None:  # asked right after the last interaction
        request_times = torch.stack([t[-1] for t in times])
    return request_batch(
        torch.cat(items),
        torch.cat(times),
        complete_offsets(lengths),
        torch.as_tensor(request_times, dtype=torch.int64),
        model.config.max_seq_len,
        exclude_seen=exclude,
    )


def recommend(
    model,
    user_histories: Sequence[tuple[Sequence[int], Sequence[int]]],
    k: int = 10,
    *,
    request_times: Sequence[int] | torch.Tensor | None = None,
    exclude_seen_items: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k next items over the whole catalogue for each user.

    ``user_histories[u]`` is ``(item_ids, timestamps)``, oldest first (item ids 1..num_items;
    only the last ``max_seq_len - 1`` are encoded), ``request_times[u]`` the time the
    recommendation is for (default: the last timestamp). Returns ``(items [U, k], scores
    [U, k])``, best first; items the user has seen are excluded unless told otherwise."""
    batch = _as_history_batch(model, user_histories, request_times, exclude_seen_items)
    with evaluating(model):
        return top_items(model, model.query_states(batch), k, batch.seen)


def recommend_all(model, user_histories, k: int = 10, batch_size: int = 256) -> None:
    """``recommend`` for every history, ``batch_size`` users at a time (results dropped: what
    throughput measurements run)."""
    for start in range(0, len(user_histories), batch_size):
        recommend(model, user_histories[start : start + batch_size], k)


def recommend_throughput(
    model, user_histories, k: int = 10, batch_size: int = 256, repeats: int = 3
) -> float:
    """Users per second of ``recommend`` over ``user_histories`` in batches of ``batch_size``
    (median of ``repeats`` passes after one warm-up pass)."""
    recommend_all(model, user_histories, k, batch_size)
    seconds = []
    for _ in range(repeats):
        begin = time.perf_counter()
        recommend_all(model, user_histories, k, batch_size)
        seconds.append(time.perf_counter() - begin)
    return len(user_histories) / statistics.median(seconds)
