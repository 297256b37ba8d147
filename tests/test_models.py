"""recops.models: the recops and torch op backends compute the same model (float64 outputs,
every parameter gradient, the item table's fused Adagrad step), and a request token changes
nothing but the query time of the history's last item."""

import dataclasses

import pytest
import torch

from recops.data import eval_batches, synthetic_sequences, train_batches
from recops.models import (
    MODELS,
    ModelConfig,
    SequentialRecommender,
    sample_negatives,
    sampled_softmax_loss,
)
from recops.models.recops_backend import RecopsBackend
from recops.models.torch_backend import TorchBackend

NUM_ITEMS = 48


def config(model, max_seq_len, **overrides):
    sizes = dict(dim=12, num_heads=2, attention_dim=4, linear_dim=6, ffn_hidden_dim=10)
    sizes.update(overrides)
    return ModelConfig(model, NUM_ITEMS, max_seq_len=max_seq_len, dropout=0.0, **sizes)


def batch_of(max_seq_len, seed=0):
    # Lengths 3..30 against N = 16 (most sequences cut to N) or N = 40 (all shorter than N).
    data = synthetic_sequences(10, NUM_ITEMS, 5, 32, num_groups=4, seed=seed)
    return next(train_batches(data, 10, max_seq_len, torch.Generator().manual_seed(seed)))


def one_step(model_config, backend, batch, negatives):
    """float64 model, one training step: (loss, states, dense grads, table, table state)."""
    torch.manual_seed(0)
    model = SequentialRecommender(model_config, backend)
    model.encoder.double()
    with torch.no_grad():
        states = model(batch)
    loss = model.training_loss(batch, negatives, temperature=0.05)
    loss.backward()
    optimizer = model.item_table.optimizer()
    if optimizer is not None:
        optimizer.step()
    grads = {name: p.grad for name, p in model.encoder.named_parameters()}
    table = model.item_table
    return loss.detach(), states, grads, table.weight.clone(), table.optimizer_state().clone()


@pytest.mark.parametrize("max_seq_len", [16, 40])
@pytest.mark.parametrize("model", MODELS)
def test_backends_agree_in_float64(model, max_seq_len):
    batch = batch_of(max_seq_len)
    negatives = sample_negatives(NUM_ITEMS, 16, torch.Generator().manual_seed(1))
    # A negative that is some position's target: masked out of that position's softmax.
    negatives[0] = batch.targets[0]
    cfg = config(model, max_seq_len)
    loss, states, grads, table, state = one_step(cfg, "recops", batch, negatives)
    ref_loss, ref_states, ref_grads, ref_table, ref_state = one_step(cfg, "torch", batch, negatives)
    assert loss.dtype == torch.float64
    torch.testing.assert_close(loss, ref_loss, rtol=1e-12, atol=0)
    torch.testing.assert_close(states, ref_states, rtol=1e-10, atol=1e-12)
    assert grads.keys() == ref_grads.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], ref_grads[name], rtol=1e-9, atol=1e-12, msg=name)
        assert grads[name].abs().max() > 0, name  # every parameter takes part
    # The table is float32; Adagrad's state is the sum of squared gradients, so matching it and
    # the updated weights matches the table's gradient.
    torch.testing.assert_close(table, ref_table)
    torch.testing.assert_close(state, ref_state)
    touched = torch.unique(torch.cat([batch.item_ids, negatives]))
    assert bool((state[touched].abs().sum(1) > 0).all())
    untouched = torch.ones(NUM_ITEMS + 1, dtype=torch.bool)
    untouched[touched] = False
    assert bool((state[untouched] == 0).all())


@pytest.mark.parametrize("backend", ["recops", "torch"])
@pytest.mark.parametrize("model", MODELS)
def test_request_token_only_sets_the_last_query_time(model, backend):
    # The states at an evaluation batch's history rows equal those of the same sequence with
    # the target in the token's place: causal attention never lets a row see a later one, and
    # the last history row measures time from the next row's timestamp in both.
    data = synthetic_sequences(6, NUM_ITEMS, 4, 14, num_groups=4, seed=5)
    torch.manual_seed(0)
    recommender = SequentialRecommender(config(model, 20), backend).eval()
    request = next(eval_batches(data, "test", 6, 20))
    with_target = request.item_ids.clone()
    with_target[request.seq_offsets[1:] - 1] = request.targets
    target_batch = dataclasses.replace(request, item_ids=with_target)
    with torch.no_grad():
        history = torch.ones(request.item_ids.numel(), dtype=torch.bool)
        history[request.seq_offsets[1:] - 1] = False
        torch.testing.assert_close(
            recommender(request)[history], recommender(target_batch)[history]
        )


def test_sampled_softmax_loss_matches_its_definition():
    gen = torch.Generator().manual_seed(0)
    m, r, d = 7, 5, 4
    queries = torch.nn.functional.normalize(torch.randn(m, d, generator=gen, dtype=torch.float64))
    positives, negatives = (torch.randn(n, d, generator=gen, dtype=torch.float64) for n in (m, r))
    positive_ids = torch.tensor([1, 2, 3, 4, 5, 6, 7])
    negative_ids = torch.tensor([9, 3, 8, 7, 9])  # 3 and 7 are the positives of queries 2, 6
    counts = torch.tensor([True, True, True, False, True, True, True])
    loss = sampled_softmax_loss(
        queries, positives, positive_ids, negatives, negative_ids, 0.05, counts
    )
    p = torch.nn.functional.normalize(positives)
    n = torch.nn.functional.normalize(negatives)
    expected = []
    for i in range(m):
        if counts[i]:
            keep = negative_ids != positive_ids[i]
            logits = torch.cat([(queries[i] @ p[i]).view(1), n[keep] @ queries[i]]) / 0.05
            expected.append(-torch.log_softmax(logits, 0)[0])
    torch.testing.assert_close(loss, torch.stack(expected).mean(), rtol=1e-12, atol=0)


def test_backend_layouts_place_rows_alike():
    batch = batch_of(40)
    rows = batch.item_ids.numel()
    features = torch.arange(rows * 3, dtype=torch.float64).view(rows, 3)
    recops_backend, torch_backend = RecopsBackend(), TorchBackend()
    layout = torch_backend.layout(batch, torch.float64, num_buckets=128)
    assert torch.equal(recops_backend.positions(batch), torch_backend.positions(layout))
    padded = torch_backend.pad(features, layout)
    assert torch.equal(recops_backend.pad(features, batch), padded)
    assert torch.equal(torch_backend.unpad(padded, layout), features)
    assert torch.equal(recops_backend.unpad(padded, batch), features)


def test_invalid_model_or_backend():
    with pytest.raises(ValueError, match="model must be one of"):
        ModelConfig("bert4rec", NUM_ITEMS)
    with pytest.raises(ValueError, match="backend must be one of"):
        SequentialRecommender(config("hstu", 8), "cuda")
