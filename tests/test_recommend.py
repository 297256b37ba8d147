"""recops.models.recommend.recommend: the top-k unseen items of the whole catalogue, by brute force,
the same on both op backends."""

import pytest
import torch

from recops.data import JaggedBatch, synthetic_sequences
from recops.models import ModelConfig, SequentialRecommender
from recops.models.encoder import l2_normalize
from recops.models.recommend import evaluating, recommend, recommend_throughput

NUM_ITEMS = 40


@pytest.fixture(scope="module")
def histories():
    data = synthetic_sequences(5, NUM_ITEMS, 3, 30, num_groups=4, seed=2)
    return [
        (data.items[a:b], data.timestamps[a:b])
        for a, b in zip(data.offsets[:-1].tolist(), data.offsets[1:].tolist(), strict=True)
    ]


def model_on(backend, model="hstu"):
    torch.manual_seed(0)
    config = ModelConfig(model, NUM_ITEMS, max_seq_len=12, dim=8, attention_dim=4, linear_dim=4)
    return SequentialRecommender(config, backend)


def brute_force(model, history, request_time, k):
    """One user alone: the kept window and the request token as a one-sequence batch, every
    item scored by its dot product with the state, seen items struck out."""
    items, times = history
    kept = model.config.max_seq_len - 1
    n = min(kept, items.numel())
    batch = JaggedBatch(
        item_ids=torch.cat([items[-kept:], torch.zeros(1, dtype=torch.int64)]),
        timestamps=torch.cat([times[-kept:], torch.tensor([request_time])]),
        seq_offsets=torch.tensor([0, n + 1]),
        max_seq_len=model.config.max_seq_len,
        padded_len=n + 1,
        query_rows=torch.tensor([n - 1]),
    )
    with evaluating(model):
        state = model.query_states(batch)[0]
        scores = l2_normalize(model.item_table.weight) @ state
    scores[0] = float("-inf")
    scores[items] = float("-inf")
    return torch.topk(scores, k)


@pytest.mark.parametrize("backend", ["recops", "torch"])
def test_recommend_is_the_top_k_unseen_items(histories, backend):
    model = model_on(backend)
    request_times = [int(times[-1]) + 3600 for _, times in histories]
    items, scores = recommend(model, histories, k=5, request_times=request_times)
    assert items.shape == scores.shape == (len(histories), 5)
    assert model.training  # recommend restores the mode it found
    for u, history in enumerate(histories):
        expected = brute_force(model, history, request_times[u], 5)
        torch.testing.assert_close(scores[u], expected.values)
        assert torch.equal(items[u], expected.indices)
        assert not set(items[u].tolist()) & set(history[0].tolist())
        assert 0 not in items[u].tolist()


def test_backends_recommend_alike(histories):
    results = [recommend(model_on(b, "fuxi"), histories, k=8) for b in ("recops", "torch")]
    assert torch.equal(results[0][0], results[1][0])
    torch.testing.assert_close(results[0][1], results[1][1])


def test_seen_items_may_be_kept(histories):
    model = model_on("recops")
    items, _ = recommend(model, histories, k=NUM_ITEMS, exclude_seen_items=False)
    for u, (seen, _) in enumerate(histories):
        assert set(seen.tolist()) <= set(items[u].tolist())


def test_recommend_throughput_counts_users(histories):
    assert recommend_throughput(model_on("recops"), histories, k=3, batch_size=2, repeats=1) > 0
