"""recops.serving.CachedRecommender: the cached path equals the full recompute
(recops.models.recommend.recommend on the whole history) after any interleaving of observe,
recommend and eviction, for HSTU and FuXi-alpha, within and past the encoded window, from several
threads."""

import threading

import pytest
import torch

from recops.models import ModelConfig, SequentialRecommender
from recops.models.recommend import recommend
from recops.serving import CachedRecommender, CacheFull, CacheLayout

MAX_SEQ_LEN = 24
# A page of 4 rows of the models below (2 layers, 2 heads, 8 + 8 wide), fp32.
PAGE_BYTES = CacheLayout(num_layers=2, num_heads=2, key_dim=8, value_dim=8, page_rows=4).page_bytes


def make_model(name: str, dim: int = 16) -> SequentialRecommender:
    torch.manual_seed(0)
    config = ModelConfig(
        model=name,
        num_items=200,
        max_seq_len=MAX_SEQ_LEN,
        dim=dim,
        num_layers=2,
        num_heads=2,
        attention_dim=8,
        linear_dim=8,
        ffn_hidden_dim=16,
        dropout=0.0,
        num_buckets=16,
    )
    return SequentialRecommender(config).eval()


class Stream:
    """Random events of returning users, and their whole histories for the recompute."""

    def __init__(self, seed: int):
        self.gen = torch.Generator().manual_seed(seed)
        self.histories: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def events(self, users, most: int = 4):
        out = []
        for u in users:
            n = int(torch.randint(1, most + 1, (1,), generator=self.gen))
            items, times = self.histories.get(u, (torch.zeros(0).long(), torch.zeros(0).long()))
            last = int(times[-1]) if times.numel() else 0
            new_items = torch.randint(1, 201, (n,), generator=self.gen)
            # Gaps of 0 (equal times) up to ~1e5 reach many time buckets.
            new_times = last + torch.cumsum(torch.randint(0, 100_000, (n,), generator=self.gen), 0)
            out.append((new_items, new_times))
            self.histories[u] = (torch.cat([items, new_items]), torch.cat([times, new_times]))
        return out

    def request_times(self, users):
        extra = torch.randint(0, 50_000, (len(users),), generator=self.gen)
        return [int(self.histories[u][1][-1]) + int(e) for u, e in zip(users, extra, strict=True)]


def assert_recompute(served, model, stream, users, times, exclude=True):
    got_items, got_scores = served.recommend(
        users, 10, request_times=times, exclude_seen_items=exclude
    )
    want_items, want_scores = recommend(
        model, [stream.histories[u] for u in users], 10, request_times=times,
        exclude_seen_items=exclude,
    )  # fmt: skip
    torch.testing.assert_close(got_scores, want_scores, rtol=1e-5, atol=1e-6)
    assert torch.equal(got_items, want_items)


@pytest.mark.parametrize("attention", ["recops", "torch"])
@pytest.mark.parametrize("name", ["hstu", "fuxi"])
def test_cached_equals_recompute_through_observe_recommend_and_eviction(name, attention):
    model = make_model(name)
    # Room for about three users' rows: users are evicted and re-encoded all the time.
    served = CachedRecommender(model, cache_bytes=9 * PAGE_BYTES, page_rows=4, attention=attention)
    stream = Stream(seed=1)
    gen = torch.Generator().manual_seed(2)
    users = list(range(6))
    served.observe(users, stream.events(users))
    for step in range(12):
        batch = torch.randperm(6, generator=gen)[: int(torch.randint(1, 4, (1,), generator=gen))]
        batch = batch.tolist()
        action = step % 3
        if action == 0:
            served.observe(batch, stream.events(batch))
        elif action == 1:
            served.cache.evict(batch[0])
        times = stream.request_times(batch)
        assert_recompute(served, model, stream, batch, times, exclude=step % 4 != 3)
        assert served.cache.nbytes <= served.cache.capacity_bytes
    # Histories now run past the window of MAX_SEQ_LEN - 1 items: encoded whole, not cached.
    for _ in range(3):
        served.observe(users, stream.events(users, most=8))
    assert any(stream.histories[u][0].numel() >= MAX_SEQ_LEN for u in users)
    assert_recompute(served, model, stream, users, stream.request_times(users))
    long = [u for u in users if stream.histories[u][0].numel() >= MAX_SEQ_LEN]
    assert all(served.cache.cached_rows(u) == 0 for u in long)


def test_the_cache_holds_all_history_rows_but_the_last():
    """The last row's upper-layer keys and values depend on the next event's time: a request at
    another time must not see them cached (this is what a cache of every row would get wrong)."""
    model = make_model("hstu")
    served = CachedRecommender(model, cache_bytes=1 << 20, page_rows=4)
    stream = Stream(seed=3)
    served.observe([7], stream.events([7], most=1) + [])
    served.observe([7], stream.events([7], most=5))
    n = stream.histories[7][0].numel()
    assert served.cache.cached_rows(7) == n - 1
    for delay in (0, 10, 10**6):  # request times far apart put the last row in other buckets
        times = [int(stream.histories[7][1][-1]) + delay]
        assert_recompute(served, model, stream, [7], times)
        assert served.cache.cached_rows(7) == n - 1


def test_concurrent_requests_match_the_recompute():
    model = make_model("fuxi")
    served = CachedRecommender(model, cache_bytes=1 << 20, page_rows=4)
    stream = Stream(seed=4)
    users = list(range(8))
    served.observe(users, stream.events(users))
    times = stream.request_times(users)
    want = recommend(model, [stream.histories[u] for u in users], 5, request_times=times)
    results, errors = {}, []

    def worker(part):
        try:
            for _ in range(3):
                results[part] = served.recommend(users[part::2], 5, request_times=times[part::2])
        except Exception as error:  # noqa: BLE001  (reported below)
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(p,)) for p in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors
    for part in (0, 1):
        assert torch.equal(results[part][0], want[0][part::2])


def test_bf16_storage_halves_the_cache_and_stays_close():
    model = make_model("hstu")
    fp32 = CachedRecommender(model, cache_bytes=1 << 20, page_rows=4)
    bf16 = CachedRecommender(model, cache_bytes=1 << 20, dtype=torch.bfloat16, page_rows=4)
    assert bf16.cache.layout.row_bytes - 8 == (fp32.cache.layout.row_bytes - 8) // 2
    stream = Stream(seed=5)
    users = [0, 1, 2]
    events = stream.events(users, most=10)
    for served in (fp32, bf16):
        served.observe(users, events)
    times = stream.request_times(users)
    _, want = fp32.recommend(users, 10, request_times=times)
    _, got = bf16.recommend(users, 10, request_times=times)
    torch.testing.assert_close(got, want, rtol=0, atol=0.05)


def test_bad_requests_raise_and_change_nothing():
    with pytest.raises(ValueError, match="model must be one of"):
        CachedRecommender(make_model("sasrec"), cache_bytes=1 << 20)
    with pytest.raises(ValueError, match="attention must be one of"):
        CachedRecommender(make_model("hstu"), cache_bytes=1 << 20, attention="cuda")
    served = CachedRecommender(make_model("hstu"), cache_bytes=1 << 20, page_rows=4)
    with pytest.raises(KeyError, match="user 3 has no observed events"):
        served.recommend([3])
    with pytest.raises(ValueError, match="one timestamp per item"):
        served.observe([1], [([1, 2], [5])])
    with pytest.raises(ValueError, match=r"item ids must be in \[1, 200\]"):
        served.observe([1], [([0], [5])])
    with pytest.raises(KeyError):
        served.history(1)
    served.observe([1], [([3, 4, 5], [1, 2, 3])])
    with pytest.raises(ValueError, match="request_times must hold one time per user"):
        served.recommend([1], request_times=[1, 2])
    tiny = CachedRecommender(make_model("hstu"), cache_bytes=PAGE_BYTES, page_rows=4)
    tiny.observe([1], [(torch.arange(1, 4), torch.arange(3))])
    with pytest.raises(CacheFull):
        tiny.observe([1], [(torch.arange(1, 6), torch.arange(3, 8))])
    assert tiny.cache.cached_rows(1) == 2


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("dim", [16, 18])
def test_quantized_item_table(bits, dim):
    """The served table keeps the rowwise-quantized rows only; each read row is within half a
    quantization step of the model's (plus the fp16 scale's rounding for int4), and the scores
    follow the fp32 table's."""
    model = make_model("hstu", dim)
    kind = f"int{bits}"
    served = CachedRecommender(model, cache_bytes=1 << 20, page_rows=4, item_table=kind)
    fp32 = CachedRecommender(model, cache_bytes=1 << 20, page_rows=4)
    weight = model.item_table.weight.detach().float()
    ids = torch.tensor([0, 1, 5, 200, 5])
    rows = served.items.rows(ids)
    step = (weight.max(1).values - weight.min(1).values)[ids] / (2**bits - 1)
    slack = 0.51 * step + (2e-3 * weight[ids].abs().max(1).values if bits == 4 else 1e-6)
    assert ((rows - weight[ids]).abs() <= slack[:, None]).all()
    dim = weight.shape[1]
    rows_bytes = dim + 8 if bits == 8 else -(-dim // 4) * 2 + 4  # FBGEMM's rows
    assert served.items.nbytes == weight.shape[0] * rows_bytes
    stream = Stream(seed=6)
    users = [0, 1, 2]
    events = stream.events(users, most=10)
    for s in (served, fp32):
        s.observe(users, events)
    times = stream.request_times(users)
    got = served.scores(users, request_times=times)
    want = fp32.scores(users, request_times=times)
    torch.testing.assert_close(got, want, rtol=0, atol=0.02 if bits == 8 else 0.3)
    with pytest.raises(ValueError, match="item_table must be one of"):
        CachedRecommender(model, cache_bytes=1 << 20, item_table="int3")


@pytest.mark.parametrize("name", ["hstu", "fuxi"])
def test_long_histories_observed_in_pieces_equal_the_recompute(name):
    """Hundreds of events, observed in pieces of uneven sizes (pages of 16 rows filled across
    requests), then asked for: the recompute's top-k and scores."""
    torch.manual_seed(0)
    config = ModelConfig(
        model=name, num_items=500, max_seq_len=640, dim=16, num_layers=2, num_heads=2,
        attention_dim=8, linear_dim=8, ffn_hidden_dim=16, dropout=0.0, num_buckets=32,
    )  # fmt: skip
    model = SequentialRecommender(config).eval()
    served = CachedRecommender(model, cache_bytes=1 << 22, page_rows=16)
    gen = torch.Generator().manual_seed(8)
    items = torch.randint(1, 501, (600,), generator=gen)
    times = torch.cumsum(torch.randint(0, 10_000, (600,), generator=gen), 0)
    start = 0
    for size in (1, 250, 37, 16, 200, 95):
        served.observe([3], [(items[start : start + size], times[start : start + size])])
        start += size
    assert served.cache.cached_rows(3) == start - 1
    request = [int(times[start - 1]) + 77]
    got_items, got_scores = served.recommend([3], 10, request_times=request)
    want_items, want_scores = recommend(
        model, [(items[:start], times[:start])], 10, request_times=request
    )
    assert torch.equal(got_items, want_items)
    torch.testing.assert_close(got_scores, want_scores, rtol=1e-5, atol=1e-6)
