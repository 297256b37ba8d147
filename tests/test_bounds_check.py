"""bounds_check_indices with FBGEMM's schema and CPU semantics, side by side with fbgemm-gpu-cpu's
op: the repaired indices and offsets and the WARNING counter equal FBGEMM's in every mode, with
fixed and variable batch sizes (B_offsets), pruned rows (-1), offsets of another dtype than the
indices (checked in a copy, as FBGEMM does), and FATAL raising where FBGEMM's raises."""

import pytest
import torch

ops = torch.ops.recops
FATAL, WARNING, IGNORE, NONE = range(4)


def random_batch(gen, T, B, rows, index_dtype, corrupt):
    """A batch of T features of B bags; `corrupt` breaks some indices (too large, negative, -1)
    and offsets (out of order, past the end, the last one wrong)."""
    lengths = torch.randint(0, 5, (T * B,), generator=gen)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    n = int(offsets[-1])
    indices = torch.cat(
        [
            torch.randint(
                0, int(rows[t]), (int(lengths[t * B : (t + 1) * B].sum()),), generator=gen
            )
            for t in range(T)
        ]
    )
    if corrupt and n > 0:
        positions = torch.randint(0, n, (3,), generator=gen)
        indices[positions[0]] = int(rows.max()) + 3
        indices[positions[1]] = -1  # a pruned row: left alone
        indices[positions[2]] = -5
        bag = int(torch.randint(0, T * B, (1,), generator=gen))
        offsets[bag] = n + 2
        offsets[-1] = n - 1
    return indices.to(index_dtype), offsets.to(index_dtype)


def run_both(fbgemm, args, offsets_dtype=None):
    """Runs recops' and FBGEMM's op on copies; returns both (indices, offsets, warning) or the
    exception types they raised."""
    results = []
    for op in (ops.bounds_check_indices, fbgemm.bounds_check_indices):
        rows, indices, offsets, mode, kwargs = args
        indices = indices.clone()
        offsets = offsets.clone().to(offsets_dtype or offsets.dtype)
        warning = torch.full((1,), 7, dtype=torch.long)
        try:
            op(rows, indices, offsets, mode, warning, **kwargs)
        except (RuntimeError, ValueError, IndexError):
            results.append("raised")
            continue
        results.append((indices, offsets, warning))
    return results


@pytest.mark.parametrize("vbe", [False, True], ids=["fixed", "vbe"])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize("mode", [FATAL, WARNING, IGNORE, NONE])
def test_matches_fbgemm(fbgemm_ops, mode, index_dtype, vbe):
    gen = torch.Generator().manual_seed(mode * 4 + vbe * 2 + (index_dtype == torch.int64))
    for trial in range(12):
        T, B = 3, int(torch.randint(1, 5, (1,), generator=gen))
        rows = torch.randint(1, 20, (T,), generator=gen)
        indices, offsets = random_batch(gen, T, B, rows, index_dtype, corrupt=trial % 2 == 1)
        kwargs = {}
        if vbe:  # the same bags, split unevenly between the features
            cut = sorted(torch.randint(0, T * B + 1, (T - 1,), generator=gen).tolist())
            kwargs["B_offsets"] = torch.tensor([0, *cut, T * B], dtype=torch.int32)
            kwargs["max_B"] = T * B
        ours, theirs = run_both(fbgemm_ops, (rows, indices, offsets, mode, kwargs))
        if theirs == "raised":
            assert ours == "raised", (trial, indices, offsets)
            continue
        assert ours != "raised", (trial, indices, offsets)
        for mine, expected in zip(ours, theirs, strict=True):
            assert torch.equal(mine, expected), (trial, mine, expected)


def test_offsets_of_another_dtype_are_checked_in_a_copy(fbgemm_ops):
    """FBGEMM converts offsets to the indices' dtype: its repairs of them stay in the copy."""
    rows = torch.tensor([10])
    indices, offsets = torch.tensor([1, 12, 3]), torch.tensor([0, 2, 5], dtype=torch.int32)
    ours, theirs = run_both(fbgemm_ops, (rows, indices, offsets, IGNORE, {}))
    for mine, expected in zip(ours, theirs, strict=True):
        assert torch.equal(mine, expected)
    assert ours[0].tolist() == [1, 0, 3] and ours[1].tolist() == [0, 2, 5]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(B_offsets=torch.tensor([0, 1, 5], dtype=torch.int32), max_B=2), "B_offsets"),
        (dict(B_offsets=torch.tensor([0, 2, 1], dtype=torch.int32), max_B=2), "non-decreasing"),
        (dict(B_offsets=torch.tensor([0, 4], dtype=torch.int32), max_B=4), r"\[T \+ 1\]"),
        (dict(B_offsets=torch.tensor([0, 2, 4], dtype=torch.int32), max_B=-1), "max_B"),
        (dict(weights=torch.ones(3)), "weights must have one entry per index"),
    ],
)
def test_bad_arguments_raise_and_write_nothing(kwargs, match):
    rows, indices = torch.tensor([10, 10]), torch.tensor([1, 12, 3, 4])
    offsets = torch.tensor([0, 1, 2, 3, 3])
    warning = torch.zeros(1, dtype=torch.long)
    before = (indices.clone(), offsets.clone())
    with pytest.raises((RuntimeError, ValueError), match=match):
        ops.bounds_check_indices(rows, indices, offsets, WARNING, warning, **kwargs)
    assert torch.equal(indices, before[0]) and torch.equal(offsets, before[1])
    assert warning.item() == 0


def test_fbgemm_only_arguments_are_accepted_and_ignored():
    """b_t_map, info_B_num_bits / mask, bounds_check_version and prefetch_pipeline, which
    FBGEMM's CPU kernel ignores."""
    rows, indices = torch.tensor([5]), torch.tensor([1, 9, -1])
    offsets, warning = torch.tensor([0, 3]), torch.zeros(1, dtype=torch.long)
    ops.bounds_check_indices(
        rows, indices, offsets, IGNORE, warning, None, None, -1, None, 3, 7, 2, True
    )
    assert indices.tolist() == [1, 0, -1] and warning.item() == 0


@pytest.mark.parametrize("mode", [WARNING, IGNORE])
def test_strided_views_are_repaired_in_place(mode):
    """Non-contiguous indices and offsets (every other element of larger tensors) are checked
    and their repairs land in the caller's views, as FBGEMM's do; the elements between them are
    untouched."""
    rows = torch.tensor([10, 4])
    index_base = torch.tensor([1, -9, 12, -9, 3, -9, 2, -9, 7, -9])
    offset_base = torch.tensor([0, -9, 2, -9, 3, -9, 9, -9, 5])
    indices, offsets = index_base[::2], offset_base[::2]
    ops.bounds_check_indices(rows, indices, offsets, mode, torch.zeros(1, dtype=torch.long))
    dense_i, dense_o = indices.contiguous(), offsets.contiguous()
    expected_i, expected_o = torch.tensor([1, 12, 3, 2, 7]), torch.tensor([0, 2, 3, 9, 5])
    ops.bounds_check_indices(rows, expected_i, expected_o, mode, torch.zeros(1, dtype=torch.long))
    assert torch.equal(dense_i, expected_i) and torch.equal(dense_o, expected_o)
    assert (index_base[1::2] == -9).all() and (offset_base[1::2] == -9).all()
    assert not torch.equal(expected_i, torch.tensor([1, 12, 3, 2, 7]))  # something was repaired
