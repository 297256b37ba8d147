"""recops.mips_topk (torch.ops.recops.mips_topk): each query's top-k candidates by inner product,
some excluded per query, against the definition (every score in float64, the excluded ones -inf,
sorted NaN first, then by value, ties to the lower index) on the kernel's paths: a few query rows
and blocks of many, one span of candidates and several, chunks and their tails."""

import math

import pytest
import torch

import recops

F32, F64 = torch.float32, torch.float64


def reference_topk(queries, candidates, k, excluded_offsets=None, excluded=None):
    """``(values, indices)`` from the definition, in plain Python over float64 scores."""
    scores = queries.double() @ candidates.double().T
    if excluded_offsets is not None:
        offsets = excluded_offsets.tolist()
        for m in range(queries.shape[0]):
            for j in excluded[offsets[m] : offsets[m + 1]].tolist():
                scores[m, j] = -math.inf
    values, indices = [], []
    for row in scores.tolist():
        order = sorted(
            range(len(row)),
            key=lambda j: (0, 0.0, j) if math.isnan(row[j]) else (1, -row[j], j),
        )[:k]
        indices.append(order)
        values.append([row[j] for j in order])
    shape = (queries.shape[0], k)
    return (
        torch.tensor(values, dtype=F64).reshape(shape).to(queries.dtype),
        torch.tensor(indices, dtype=torch.int64).reshape(shape),
    )


def integer_rows(gen, rows, dim, dtype):
    """Rows of small integers: every score is exact in float32 too, and ties are common."""
    return torch.randint(-3, 4, (rows, dim), generator=gen).to(dtype)


def jagged_exclusions(gen, rows, count, index_dtype=torch.int64, start=0):
    """(offsets [rows + 1] from ``start``, excluded) with 0-5 candidates per row, duplicates
    included, after ``start`` entries no row uses."""
    lengths = torch.randint(0, 6, (rows,), generator=gen) if count else torch.zeros(rows)
    offsets = torch.cat([torch.zeros(1), lengths.cumsum(0)]).long() + start
    excluded = torch.randint(0, max(count, 1), (int(offsets[-1]) + 2,), generator=gen)
    return offsets.to(index_dtype), excluded.to(index_dtype)


# (rows, candidates, dim, k): one row and a few (dot products along d), 16 and more (the
# transposed product), past one block of 48; candidates in one chunk, several, and enough for
# two spans; k from 0 to every candidate.
SHAPES = [
    (1, 7, 3, 7),
    (3, 300, 5, 10),
    (1, 4500, 64, 10),
    (20, 700, 17, 25),
    (50, 4500, 64, 10),
    (100, 333, 1, 333),
    (4, 0, 3, 0),
    (0, 50, 4, 5),
    (6, 40, 0, 12),
]


@pytest.mark.parametrize("rows,count,dim,k", SHAPES)
@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("exclusions", [False, True])
def test_equals_the_definition(rows, count, dim, k, dtype, exclusions):
    gen = torch.Generator().manual_seed(rows * 1000 + count + dim)
    queries = integer_rows(gen, rows, dim, dtype)
    candidates = integer_rows(gen, count, dim, dtype)
    offsets, excluded = jagged_exclusions(gen, rows, count, start=3) if exclusions else (None, None)
    values, indices = recops.mips_topk(
        queries, candidates, k, excluded_offsets=offsets, excluded=excluded
    )
    want_values, want_indices = reference_topk(queries, candidates, k, offsets, excluded)
    assert values.dtype == dtype and indices.dtype == torch.int64
    assert torch.equal(indices, want_indices)
    assert torch.equal(values, want_values)


@pytest.mark.parametrize("rows", [1, 5, 30])
def test_random_float32_is_a_top_k(rows):
    """Random fp32 scores (the kernels' sums in their own order): the candidates returned score,
    in float64, within rounding of the k best, best first."""
    gen = torch.Generator().manual_seed(rows)
    queries, candidates = torch.randn(rows, 64, generator=gen), torch.randn(3000, 64, generator=gen)
    values, indices = recops.mips_topk(queries, candidates, 20)
    exact = queries.double() @ candidates.double().T
    torch.testing.assert_close(values.double(), exact.gather(1, indices), rtol=1e-5, atol=1e-5)
    best = exact.topk(20, dim=1).values
    torch.testing.assert_close(values.double(), best, rtol=1e-5, atol=1e-5)
    assert (values[:, :-1] >= values[:, 1:]).all()


def test_non_contiguous_operands_and_int32_exclusions():
    gen = torch.Generator().manual_seed(7)
    queries = integer_rows(gen, 20, 24, F32)[:, ::2]  # strided columns
    candidates = integer_rows(gen, 900, 12, F32).T.contiguous().T  # column-major
    offsets, excluded = jagged_exclusions(gen, 20, 900, torch.int32)
    got = recops.mips_topk(queries, candidates, 9, excluded_offsets=offsets, excluded=excluded)
    want = reference_topk(queries, candidates, 9, offsets, excluded)
    assert torch.equal(got[1], want[1]) and torch.equal(got[0], want[0])
    rows = recops.mips_topk(queries[::3], candidates[::2], 9)  # strided rows
    want = reference_topk(queries[::3], candidates[::2], 9)
    assert torch.equal(rows[1], want[1])


def test_nan_ranks_first_and_excluded_candidates_fill_last():
    queries = torch.ones(2, 2)
    candidates = torch.tensor([[1.0, 1.0], [math.nan, 0.0], [3.0, 0.0], [1.0, 1.0], [0.0, 0.0]])
    offsets, excluded = torch.tensor([0, 0, 4]), torch.tensor([0, 2, 3, 4])
    values, indices = recops.mips_topk(
        queries, candidates, 5, excluded_offsets=offsets, excluded=excluded
    )
    assert indices.tolist() == [[1, 2, 0, 3, 4], [1, 0, 2, 3, 4]]
    assert math.isnan(values[0, 0]) and values[0, 1:].tolist() == [3.0, 2.0, 2.0, 0.0]
    assert values[1, 1:].tolist() == [-math.inf] * 4


def test_same_result_on_one_and_two_threads():
    """Two threads split the candidates into spans merged at the end."""
    gen = torch.Generator().manual_seed(3)
    queries = integer_rows(gen, 3, 16, F32)
    candidates = integer_rows(gen, 9000, 16, F32)
    offsets, excluded = jagged_exclusions(gen, 3, 9000)
    threads = torch.get_num_threads()
    results = []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            results.append(torch.ops.recops.mips_topk(queries, candidates, 50, offsets, excluded))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(results[0][1], results[1][1]) and torch.equal(results[0][0], results[1][0])


@pytest.mark.parametrize(
    "change,message",
    [
        (dict(k=11), "k must be in"),
        (dict(k=-1), "k must be in"),
        (dict(queries=torch.ones(2, 3, dtype=torch.bfloat16)), "queries must be float32"),
        (dict(candidates=torch.ones(10, 4)), "candidates must have queries' 3 columns"),
        (dict(candidates=torch.ones(10, 3, dtype=F64)), "candidates"),
        (dict(excluded=None), "must be given together"),
        (dict(excluded=torch.tensor([0, 10])), r"excluded\[1\] = 10"),
        (dict(excluded=torch.tensor([0, -1])), r"excluded\[1\] = -1"),
        (dict(excluded_offsets=torch.tensor([0, 2])), "excluded_offsets must have one entry"),
        (dict(excluded_offsets=torch.tensor([0, 2, 1])), "non-decreasing"),
        (dict(excluded_offsets=torch.tensor([0, 1, 3])), r"excluded_offsets\[-1\] = 3"),
        (dict(excluded=torch.tensor([0.0, 1.0])), "excluded"),
    ],
)
def test_bad_input_raises_naming_the_argument(change, message):
    args = dict(
        queries=torch.ones(2, 3),
        candidates=torch.ones(10, 3),
        k=4,
        excluded_offsets=torch.tensor([0, 1, 2]),
        excluded=torch.tensor([0, 9]),
    )
    args.update(change)
    with pytest.raises((ValueError, IndexError, RuntimeError), match=message):
        torch.ops.recops.mips_topk(**args)
