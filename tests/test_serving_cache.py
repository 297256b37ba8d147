"""The paged key / value cache of recops.serving: page layout, capacity, LRU eviction of whole
users, all-or-nothing reservations, and concurrent requests."""

import random
import threading

import pytest
import torch

from recops.serving import CacheFull, CacheLayout, PagedKVCache

LAYOUT = CacheLayout(num_layers=2, num_heads=2, key_dim=3, value_dim=5, page_rows=4)


def cache_of(pages: int, layout: CacheLayout = LAYOUT) -> PagedKVCache:
    return PagedKVCache(layout, pages * layout.page_bytes + layout.page_bytes - 1)


def append(cache, users, new_rows, gen=None):
    """Appends random rows to every user; returns what was written, per user and layer."""
    written = {}
    rows = [cache.cached_rows(u) + n for u, n in zip(users, new_rows, strict=True)]
    with cache.hold(users, rows) as tables:
        slots = cache.slots(tables)
        total = int(tables.new_rows.sum())
        times = torch.randint(0, 1000, (total,), generator=gen)
        for layer in range(cache.layout.num_layers):
            k = torch.randn(total, 2, 3, generator=gen)
            v = torch.randn(total, 2, 5, generator=gen)
            cache.write(layer, slots, k, v, times if layer == 0 else None)
            for b, part in enumerate(torch.arange(total).split(tables.new_rows.tolist())):
                written[(users[b], layer)] = (k[part], v[part], times[part])
    return written


def read(cache, user):
    with cache.hold([user], [cache.cached_rows(user)]) as tables:
        return [cache.gather(layer, tables, 0) for layer in range(cache.layout.num_layers)]


def test_capacity_is_never_exceeded():
    for pages in (1, 3, 10):
        capacity = pages * LAYOUT.page_bytes + 17
        cache = PagedKVCache(LAYOUT, capacity)
        assert cache.num_pages == pages and cache.nbytes <= capacity
    bf16 = CacheLayout(2, 2, 3, 5, dtype=torch.bfloat16, page_rows=4)
    assert bf16.row_bytes - 8 == (LAYOUT.row_bytes - 8) // 2
    with pytest.raises(ValueError, match="capacity_bytes must hold at least one page"):
        PagedKVCache(LAYOUT, LAYOUT.page_bytes - 1)
    with pytest.raises(ValueError, match="page_rows must be >= 1"):
        CacheLayout(1, 1, 1, 1, page_rows=0)
    with pytest.raises(ValueError, match="dtype must be"):
        CacheLayout(1, 1, 1, 1, dtype=torch.int8)


def test_appended_rows_read_back_across_pages():
    cache = cache_of(8)
    gen = torch.Generator().manual_seed(0)
    expected = {}
    for step_rows in ([3, 0], [2, 5], [4, 1], [0, 0], [7, 2]):  # crosses page boundaries
        new = append(cache, [10, 20], step_rows, gen)
        for key, (k, v, t) in new.items():
            old = expected.get(key)
            expected[key] = (
                new[key]
                if old is None
                else tuple(torch.cat([a, b]) for a, b in zip(old, (k, v, t), strict=True))
            )
    for user in (10, 20):
        assert cache.cached_rows(user) == expected[(user, 0)][0].shape[0]
        for layer, got in enumerate(read(cache, user)):
            for a, b in zip(got, expected[(user, layer)], strict=True):
                assert torch.equal(a, b)


def test_lru_users_are_evicted_whole_and_held_users_never():
    cache = cache_of(4)
    append(cache, [1], [8])  # 2 pages
    append(cache, [2], [4])  # 1 page
    append(cache, [3], [4])  # 1 page: full
    read(cache, 1)  # 1 is now the most recently used: 2 is the least
    append(cache, [4], [3])
    assert cache.cached_rows(2) == 0 and cache.cached_rows(1) == 8
    # Held, user 3 is the most recently used; another request needs two pages: user 1 (two
    # pages, the least recently used) goes, 4 stays. Four pages cannot be freed with 3 held; one
    # page evicts 4, the least recently used now.
    with cache.hold([3], [4]):
        append(cache, [5], [8])
        assert cache.cached_rows(3) == 4 and cache.cached_rows(5) == 8
        assert cache.cached_rows(1) == 0 and cache.cached_rows(4) == 3
        with pytest.raises(CacheFull):
            append(cache, [6], [16])
        append(cache, [6], [4])
        assert cache.cached_rows(4) == 0 and cache.cached_rows(3) == 4


def test_a_request_that_cannot_fit_changes_nothing():
    cache = cache_of(3)
    append(cache, [1], [5])
    append(cache, [2], [2])
    before = (cache.free_pages, cache.cached_rows(1), cache.cached_rows(2), len(cache))
    with pytest.raises(
        CacheFull, match="needs 3 more pages of 4 rows; 1 of the cache.s 3 can be freed"
    ):
        with cache.hold([1, 3], [8, 9]):
            pass
    assert (cache.free_pages, cache.cached_rows(1), cache.cached_rows(2), len(cache)) == before
    with pytest.raises(ValueError, match="users must be distinct"):
        with cache.hold([1, 1], [1, 1]):
            pass
    with pytest.raises(ValueError, match="rows must hold one count >= 0 per user"):
        with cache.hold([1], [-1]):
            pass
    with pytest.raises(ValueError, match=r"keep_rows must be in \[0, rows\]"):
        with cache.hold([1], [3], [4]):
            pass


def test_a_failed_request_discards_its_rows():
    cache = cache_of(4)
    append(cache, [1], [3])
    free = cache.free_pages
    with pytest.raises(KeyError):
        with cache.hold([1, 2], [9, 2]):
            raise KeyError("the model failed")
    assert cache.cached_rows(1) == 3 and cache.cached_rows(2) == 0 and len(cache) == 1
    assert cache.free_pages == free


def test_rows_past_keep_rows_are_replaced_and_only_kept_rows_stay():
    cache = cache_of(6)
    gen = torch.Generator().manual_seed(1)
    append(cache, [1], [9], gen)
    (before, _, _), _ = read(cache, 1)
    # 11 rows, 10 kept: the 9 cached stay, rows 9 and 10 are written, row 9 is kept.
    with cache.hold([1], [11], [10]) as tables:
        assert tables.lengths.tolist() == [9] and tables.new_rows.tolist() == [2]
        k = torch.arange(2 * 6.0).view(2, 2, 3)
        for layer in range(2):
            cache.write(layer, cache.slots(tables), k, torch.zeros(2, 2, 5), torch.arange(2))
    assert cache.cached_rows(1) == 10 and cache.free_pages == 6 - 3
    (keys, _, times), _ = read(cache, 1)
    assert torch.equal(keys[:9], before) and torch.equal(keys[9], k[0]) and times[9] == 0
    # 7 rows, 4 kept: cached rows 4.. are stale, rows 4..6 are rewritten and dropped.
    with cache.hold([1], [7], [4]) as tables:
        assert tables.lengths.tolist() == [4] and tables.new_rows.tolist() == [3]
    assert cache.cached_rows(1) == 4 and cache.free_pages == 6 - 1
    (keys, _, _), _ = read(cache, 1)
    assert torch.equal(keys, before[:4])


def test_concurrent_requests_keep_pages_consistent():
    cache = cache_of(12)
    errors = []

    def worker(seed):
        rng = random.Random(seed)
        gen = torch.Generator().manual_seed(seed)
        try:
            for _ in range(40):
                users = rng.sample(range(8), rng.randint(1, 3))
                rows = [rng.randint(0, 6) for _ in users]
                if rng.random() < 0.1:
                    cache.evict(users[0])
                    continue
                try:
                    append(cache, users, rows, gen)
                except CacheFull:
                    pass
        except Exception as error:  # noqa: BLE001  (reported below)
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors and not any(t.is_alive() for t in threads)
    pages = [p for entry in cache._users.values() for p in entry.pages]
    assert len(pages) == len(set(pages))
    assert sorted(pages + cache._free) == list(range(cache.num_pages))
    for entry in cache._users.values():
        assert len(entry.pages) == -(-entry.length // LAYOUT.page_rows)
