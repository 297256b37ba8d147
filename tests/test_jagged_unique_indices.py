"""jagged_unique_indices (docs/ops.md section 1). FBGEMM implements it on CUDA only: the reference
is plain PyTorch written from FBGEMM's CUDA semantics."""

import pytest
import torch
from threads import num_threads

ops = torch.ops.recops
INDEX_DTYPES = [torch.int32, torch.int64]


def unique_indices_reference(hash_size_cumsum, hash_size_offsets, offsets, indices):
    """Feature t's index i is linearized to hash_size_cumsum[t] + i (bag b is feature b // B); the
    distinct linear values, sorted, give each index its reverse position and each position the
    first index that has it; group g of features [hash_size_offsets[g], hash_size_offsets[g + 1])
    counts the distinct values in its hash range (up to the end for the group ending at the last
    feature) and spreads the count over its bags, the first ones taking one more."""
    hsc, hso = hash_size_cumsum.tolist(), hash_size_offsets.tolist()
    num_features, num_bags = len(hsc) - 1, offsets.numel() - 1
    batch = num_bags // num_features
    n = indices.numel()
    bag = torch.searchsorted(offsets[1:].long(), torch.arange(n), right=True)
    linear = torch.tensor(hsc, dtype=torch.long)[bag // batch] + indices.long()
    unique, reverse = torch.unique(linear, sorted=True, return_inverse=True)
    first = torch.full((unique.numel(),), n, dtype=torch.long)
    first.scatter_reduce_(0, reverse, torch.arange(n), "amin")
    unique_indices = indices[first]
    lengths = torch.zeros(num_bags, dtype=offsets.dtype)
    for g in range(num_features):
        begin, end = hso[g], hso[g + 1]
        count = (end - begin) * batch
        if count <= 0:
            continue
        last = end == num_features
        if hsc[begin] == hsc[end] and not last:
            continue
        lo = int(torch.searchsorted(unique, hsc[begin]))
        hi = unique.numel() if last else int(torch.searchsorted(unique, hsc[end]))
        total = hi - lo
        each, extra = divmod(total, count)
        lengths[begin * batch : end * batch] = torch.tensor(
            [each + 1 if i < extra else each for i in range(count)], dtype=offsets.dtype
        )
    out_offsets = torch.cat([lengths.new_zeros(1), lengths.cumsum(0).to(offsets.dtype)])
    return lengths, out_offsets, unique_indices, reverse


def random_case(num_features, batch, max_length, dtype, gen, merged=()):
    hash_sizes = torch.randint(1, 6, (num_features,), generator=gen)
    for t in merged:
        hash_sizes[t] = 0
    hsc = torch.cat([torch.zeros(1, dtype=torch.long), hash_sizes.cumsum(0)])
    # A feature with hash size 0 is merged into the next one: one group over both.
    group_starts = [t for t in range(num_features) if t == 0 or hash_sizes[t - 1] != 0]
    hso = torch.tensor(
        [*group_starts, num_features] + [num_features] * (num_features - len(group_starts))
    )
    lengths = torch.randint(0, max_length + 1, (num_features * batch,), generator=gen)
    pieces = []
    for b, length in enumerate(lengths.tolist()):
        t = b // batch
        size = int(hash_sizes[t]) if hash_sizes[t] > 0 else int(hash_sizes[t + 1])
        pieces.append(torch.randint(0, size, (length,), generator=gen))
    indices = torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.long)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    return [t.to(dtype) for t in (hsc, hso, offsets, indices)]


CASES = [(1, 1, 0, ()), (1, 4, 3, ()), (3, 2, 4, ()), (5, 7, 6, (1,)), (20, 30, 8, (3, 5, 10))]


@pytest.mark.parametrize("num_features, batch, max_length, merged", CASES, ids=str)
@pytest.mark.parametrize("dtype", INDEX_DTYPES, ids=str)
def test_jagged_unique_indices(num_features, batch, max_length, merged, dtype):
    gen = torch.Generator().manual_seed(num_features * 7 + batch)
    args = random_case(num_features, batch, max_length, dtype, gen, merged)
    out = ops.jagged_unique_indices(*args)
    expected = unique_indices_reference(*args)
    for a, e in zip(out, expected, strict=True):
        assert a.dtype == e.dtype
        torch.testing.assert_close(a, e, rtol=0, atol=0)
    lengths, _, unique_indices, reverse = out
    assert int(lengths.sum()) == unique_indices.numel()
    torch.testing.assert_close(unique_indices[reverse], args[3], rtol=0, atol=0)


def test_sparse_hash_range_and_threads():
    # Linear values spread far apart take the sort path; the last feature is unbounded.
    hsc = torch.tensor([0, 10**9, 2 * 10**9])
    hso = torch.tensor([0, 1, 2])
    gen = torch.Generator().manual_seed(0)
    indices = torch.cat(
        [
            torch.randint(0, 10**9, (500,), generator=gen),
            torch.randint(0, 10**12, (500,), generator=gen),
        ]
    )
    offsets = torch.tensor([0, 200, 500, 700, 1000])
    expected = unique_indices_reference(hsc, hso, offsets, indices)
    for threads in (1, 3):
        with num_threads(threads):
            for a, e in zip(
                ops.jagged_unique_indices(hsc, hso, offsets, indices), expected, strict=True
            ):
                torch.testing.assert_close(a, e, rtol=0, atol=0)


GOOD = dict(
    hash_size_cumsum=torch.tensor([0, 3, 5]),
    hash_size_offsets=torch.tensor([0, 1, 2]),
    offsets=torch.tensor([0, 2, 3, 3, 5]),
    indices=torch.tensor([0, 2, 1, 1, 0]),
)


@pytest.mark.parametrize(
    "change, error, match",
    [
        (
            {"hash_size_cumsum": torch.tensor([0])},
            ValueError,
            "hash_size_cumsum must hold at least 2",
        ),
        (
            {"hash_size_offsets": torch.tensor([0, 2])},
            ValueError,
            "hash_size_offsets must hold T \\+ 1 = 3",
        ),
        (
            {"hash_size_offsets": torch.tensor([0, 1, 3])},
            ValueError,
            "hash_size_offsets entries must be in",
        ),
        (
            {"hash_size_cumsum": torch.tensor([0, 5, 3])},
            ValueError,
            "hash_size_cumsum must be non-decreasing",
        ),
        (
            {"offsets": torch.tensor([0, 2, 3, 5])},
            ValueError,
            "offsets must hold T \\* B \\+ 1 entries",
        ),
        (
            {"offsets": torch.tensor([0, 2, 3, 3, 4])},
            ValueError,
            "offsets must run from 0 to indices",
        ),
        ({"offsets": torch.tensor([0, 3, 2, 3, 5])}, ValueError, "offsets must be non-decreasing"),
        (
            {"indices": torch.tensor([0, 3, 1, 1, 0])},
            IndexError,
            r"indices\[1\] = 3 is negative or not below",
        ),
        ({"indices": torch.tensor([0, 2, 1, 1, -1])}, IndexError, r"indices\[4\] = -1"),
        (
            {"offsets": torch.tensor([0, 2, 3, 3, 5], dtype=torch.int32)},
            RuntimeError,
            "must share one dtype",
        ),
    ],
)
def test_bad_input(change, error, match):
    with pytest.raises(error, match=match):
        ops.jagged_unique_indices(**{**GOOD, **change})


def test_last_feature_is_unbounded():
    out = ops.jagged_unique_indices(**{**GOOD, "indices": torch.tensor([0, 2, 1, 9, 0])})
    expected = unique_indices_reference(
        *{**GOOD, "indices": torch.tensor([0, 2, 1, 9, 0])}.values()
    )
    for a, e in zip(out, expected, strict=True):
        torch.testing.assert_close(a, e, rtol=0, atol=0)
