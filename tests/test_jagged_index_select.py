"""jagged_index_select (FBGEMM's composite), its 2-D forwards jagged_index_select_2d_forward(_v2)
and their gradient ops jagged_index_add_2d_forward(_v2), and keyed_jagged_index_select_dim1
(docs/ops.md section 1). Offsets of the 2-D ops are inclusive: lengths.cumsum(0), no leading 0."""

import pytest
import torch
from accuracy import TOLERANCE
from threads import num_threads
from torch.autograd import gradcheck
from torch.library import opcheck

import recops

ops = torch.ops.recops
INDEX_DTYPES = [torch.int32, torch.int64]
FLOAT_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
# FBGEMM's CPU kernels: float32, float16, bfloat16, int32, int64 values (no float64).
FBGEMM_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64]


def opcheck_both(op_name, args, **kwargs):
    opcheck(getattr(ops, op_name).default, args, **kwargs)
    if not recops.fbgemm_loaded:
        opcheck(getattr(torch.ops.fbgemm, op_name).default, args, **kwargs)


# --------------------------------------------------------------------------- references
def starts_of(ends):
    """Segment k of inclusive offsets `ends` starts at ends[k - 1] (0 for k = 0)."""
    return torch.cat([ends.new_zeros(1), ends]).long()


def select_reference(values, indices, input_offsets, output_offsets, num_rows):
    """FBGEMM's row rule: output row r lies in the first output segment k with
    output_offsets[k] > r, at rel = r - its start, and is input row
    start(input segment indices[k]) + rel."""
    rows = torch.arange(num_rows)
    k = torch.searchsorted(output_offsets.long(), rows, right=True)
    rel = rows - starts_of(output_offsets)[k]
    source = starts_of(input_offsets)[indices.long()[k]] + rel
    return values[source]


def add_reference(values, indices, input_offsets, output_offsets, num_output_rows):
    """The transpose of select_reference: every row of values is added into its output row, in
    float64 (int64 for integers)."""
    rows = torch.arange(values.shape[0])
    k = torch.searchsorted(input_offsets.long(), rows, right=True)
    rel = rows - starts_of(input_offsets)[k]
    target = starts_of(output_offsets)[indices.long()[k]] + rel
    wide = values.double() if values.is_floating_point() else values.long()
    out = wide.new_zeros(num_output_rows, values.shape[1])
    out.index_add_(0, target, wide)
    return out.to(values.dtype)


def jagged_index_select_reference(values, lengths, indices):
    output_lengths = lengths[indices.long()]
    starts = starts_of(lengths.cumsum(0))
    pieces = [values[starts[i] : starts[i] + lengths[i]] for i in indices.long().tolist()]
    out = torch.cat(pieces) if pieces else values[:0]
    return out, output_lengths


def keyed_select_reference(values, lengths, offsets, indices, batch_size, weights=None):
    num_batches = lengths.shape[0] // batch_size
    keys = torch.arange(num_batches)[:, None] * batch_size
    segments = (keys + indices.long()[None, :]).reshape(-1)
    out_lengths = lengths[segments]
    starts = [0 if s == 0 else int(offsets[s]) for s in segments.tolist()]

    def gather(t):
        pieces = [t[s : s + n] for s, n in zip(starts, out_lengths.tolist(), strict=True)]
        return torch.cat(pieces) if pieces else t[:0].clone()

    result = [gather(values), out_lengths]
    if weights is not None:
        result.append(gather(weights))
    return result


# --------------------------------------------------------------------------- inputs
def random_jagged(num_segments, max_length, cols, dtype, gen):
    lengths = torch.randint(0, max_length + 1, (num_segments,), generator=gen)
    total = int(lengths.sum())
    if dtype.is_floating_point:
        values = torch.randn(total, cols, generator=gen).to(dtype)
    else:
        values = torch.randint(-100, 100, (total, cols), generator=gen).to(dtype)
    return values, lengths


def random_indices(num_segments, count, dtype, gen):
    if num_segments == 0:
        return torch.zeros(0, dtype=dtype)
    return torch.randint(0, num_segments, (count,), generator=gen).to(dtype)


# (segments, max length, columns, number of indices)
CASES = [(0, 3, 2, 0), (1, 0, 3, 4), (5, 1, 4, 5), (7, 4, 1, 12), (30, 6, 5, 50), (600, 9, 33, 900)]


@pytest.mark.parametrize("num_segments, max_length, cols, count", CASES, ids=str)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES + [torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=str)
def test_jagged_index_select(num_segments, max_length, cols, count, dtype, index_dtype):
    gen = torch.Generator().manual_seed(num_segments + 17 * count)
    values, lengths = random_jagged(num_segments, max_length, cols, dtype, gen)
    indices = random_indices(num_segments, count, index_dtype, gen)
    out, out_lengths = ops.jagged_index_select(values, lengths, indices)
    expected, expected_lengths = jagged_index_select_reference(values, lengths, indices)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    torch.testing.assert_close(out_lengths, expected_lengths, rtol=0, atol=0)
    # The 2-D forwards and the gradient op, with the composite's offsets.
    input_offsets, output_offsets = lengths.cumsum(0), expected_lengths.cumsum(0)
    rows = expected.shape[0]
    for result in (
        ops.jagged_index_select_2d_forward(values, indices, input_offsets, output_offsets, rows),
        ops.jagged_index_select_2d_forward_v2(values, indices, input_offsets, output_offsets),
        ops.jagged_index_select_2d_forward_v2(values, indices, input_offsets, output_offsets, rows),
    ):
        torch.testing.assert_close(result, expected, rtol=0, atol=0)
    grad = expected
    expected_add = add_reference(grad, indices, output_offsets, input_offsets, values.shape[0])
    low = dtype in (torch.float16, torch.bfloat16)  # else torch's defaults, tighter in float32
    tol = dict(zip(("rtol", "atol"), TOLERANCE[dtype], strict=True)) if low else {}
    for result in (
        ops.jagged_index_add_2d_forward(
            grad, indices, output_offsets, input_offsets, rows, values.shape[0]
        ),
        ops.jagged_index_add_2d_forward_v2(
            grad, indices, output_offsets, input_offsets, values.shape[0], rows
        ),
    ):
        torch.testing.assert_close(result, expected_add, **tol)


def test_select_truncates_to_num_dense_output_rows():
    values = torch.arange(10.0).reshape(5, 2)
    input_offsets, output_offsets = torch.tensor([2, 5]), torch.tensor([3, 5])
    indices = torch.tensor([1, 0])
    full = select_reference(values, indices, input_offsets, output_offsets, 5)
    for rows in range(6):
        out = ops.jagged_index_select_2d_forward(
            values, indices, input_offsets, output_offsets, rows
        )
        torch.testing.assert_close(out, full[:rows])


def test_select_reads_past_a_shorter_input_segment():
    # FBGEMM's rule reads input rows from the segment's start on, past its end when the output
    # segment is longer (the offsets need not come from one lengths tensor).
    values = torch.arange(6.0).reshape(6, 1)
    input_offsets, output_offsets = torch.tensor([1, 3]), torch.tensor([4])
    out = ops.jagged_index_select_2d_forward(
        values, torch.tensor([0]), input_offsets, output_offsets, 4
    )
    torch.testing.assert_close(out, values[:4])
    expected = select_reference(values, torch.tensor([0]), input_offsets, output_offsets, 4)
    torch.testing.assert_close(out, expected)


def test_add_with_overlapping_targets_runs_in_input_order():
    # Input segments 0 and 1 target overlapping output rows (the serial path).
    values = torch.arange(12.0).reshape(6, 2)
    input_offsets, output_offsets = torch.tensor([3, 6]), torch.tensor([1, 4])
    indices = torch.tensor([0, 0])
    out = ops.jagged_index_add_2d_forward(values, indices, input_offsets, output_offsets, 6, 4)
    torch.testing.assert_close(
        out, add_reference(values, indices, input_offsets, output_offsets, 4)
    )


def test_noncontiguous_values_and_threads():
    gen = torch.Generator().manual_seed(3)
    values, lengths = random_jagged(400, 7, 9, torch.float32, gen)
    values_t = values.t().contiguous().t()  # columns strided
    indices = random_indices(400, 1000, torch.int64, gen)
    expected = jagged_index_select_reference(values, lengths, indices)[0]
    wide = torch.randn(values.shape[0], 20, generator=gen)
    wide[:, 3:12] = values
    for threads in (1, 2, 4):
        with num_threads(threads):
            for v in (values_t, wide[:, 3:12]):
                torch.testing.assert_close(
                    ops.jagged_index_select(v, lengths, indices)[0], expected
                )
            grad = expected[:, ::1].t().contiguous().t()
            out_offsets = lengths[indices].cumsum(0)
            added = ops.jagged_index_add_2d_forward(
                grad, indices, out_offsets, lengths.cumsum(0), grad.shape[0], values.shape[0]
            )
            torch.testing.assert_close(
                added, add_reference(grad, indices, out_offsets, lengths.cumsum(0), values.shape[0])
            )


def test_jagged_index_select_gradcheck():
    gen = torch.Generator().manual_seed(5)
    values, lengths = random_jagged(6, 3, 2, torch.float64, gen)
    indices = torch.tensor([4, 1, 4, 0, 5, 5, 2])
    values.requires_grad_(True)
    assert gradcheck(lambda v: ops.jagged_index_select(v, lengths, indices)[0], (values,))
    if not recops.fbgemm_loaded:  # recops' own fbgemm:: composite (FBGEMM's lacks float64)
        fbgemm_select = torch.ops.fbgemm.jagged_index_select
        assert gradcheck(lambda v: fbgemm_select(v, lengths, indices)[0], (values,))


def test_jagged_index_select_gradient_matches_fbgemm(fbgemm_ops):
    gen = torch.Generator().manual_seed(8)
    values, lengths = random_jagged(50, 5, 4, torch.float32, gen)
    indices = random_indices(50, 80, torch.int64, gen)
    grads = []
    for namespace in (ops, fbgemm_ops):
        v = values.clone().requires_grad_(True)
        out = namespace.jagged_index_select(v, lengths, indices)[0]
        (out * torch.arange(out.numel()).reshape(out.shape)).sum().backward()
        grads.append((out.detach(), v.grad))
    torch.testing.assert_close(grads[0][0], grads[1][0], rtol=0, atol=0)
    torch.testing.assert_close(grads[0][1], grads[1][1])


@pytest.mark.parametrize("num_segments, max_length, cols, count", CASES[1:], ids=str)
@pytest.mark.parametrize("dtype", FBGEMM_DTYPES, ids=str)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=str)
def test_matches_fbgemm(fbgemm_ops, num_segments, max_length, cols, count, dtype, index_dtype):
    gen = torch.Generator().manual_seed(num_segments)
    values, lengths = random_jagged(num_segments, max_length, cols, dtype, gen)
    indices = random_indices(num_segments, count, index_dtype, gen)
    for r, f in zip(
        ops.jagged_index_select(values, lengths, indices),
        fbgemm_ops.jagged_index_select(values, lengths, indices),
        strict=True,
    ):
        torch.testing.assert_close(r, f, rtol=0, atol=0)
    input_offsets, output_offsets = lengths.cumsum(0), lengths[indices.long()].cumsum(0)
    rows = int(output_offsets[-1]) if count else 0
    args = (values, indices, input_offsets, output_offsets, rows)
    torch.testing.assert_close(
        ops.jagged_index_select_2d_forward(*args),
        fbgemm_ops.jagged_index_select_2d_forward(*args),
        rtol=0,
        atol=0,
    )
    grad = fbgemm_ops.jagged_index_select_2d_forward(*args)
    add_args = (grad, indices, output_offsets, input_offsets, rows, values.shape[0])
    exact = {"rtol": 0, "atol": 0} if not dtype.is_floating_point else {}
    torch.testing.assert_close(
        ops.jagged_index_add_2d_forward(*add_args),
        fbgemm_ops.jagged_index_add_2d_forward(*add_args),
        **exact,
    )


SELECT_ARGS = dict(
    values=torch.zeros(5, 2),
    indices=torch.tensor([1, 0]),
    input_offsets=torch.tensor([2, 5]),
    output_offsets=torch.tensor([3, 5]),
)


@pytest.mark.parametrize(
    "change, error, match",
    [
        ({"values": torch.zeros(5)}, RuntimeError, r"values must be 2-D \[rows, columns\]"),
        ({"indices": torch.tensor([1])}, ValueError, "indices must hold one entry per segment"),
        ({"indices": torch.tensor([2, 0])}, IndexError, r"indices\[0\] = 2 is outside \[0, 2\)"),
        ({"indices": torch.tensor([1.0, 0.0])}, RuntimeError, "indices must be int32 or int64"),
        (
            {"output_offsets": torch.tensor([3, 2])},
            ValueError,
            "output_offsets must be non-decreasing",
        ),
        ({"output_offsets": torch.tensor([[3, 5]])}, RuntimeError, "output_offsets must be 1-D"),
        (
            {"input_offsets": torch.tensor([4, 5])},
            IndexError,
            "segment 0 .* rows outside the 5 rows of values",
        ),
        (
            {"rows": 6},
            ValueError,
            "num_dense_output_rows = 6 exceeds the rows output_offsets covers, 5",
        ),
        ({"rows": -1}, ValueError, "num_dense_output_rows must be >= 0"),
    ],
)
def test_select_bad_input(change, error, match):
    args = {**SELECT_ARGS, "rows": 5, **change}
    rows = args.pop("rows")
    with pytest.raises(error, match=match):
        ops.jagged_index_select_2d_forward(*args.values(), rows)


@pytest.mark.parametrize(
    "change, error, match",
    [
        ({"values": torch.zeros(6, 2)}, ValueError, "values has 6 rows but input_offsets covers 5"),
        ({"indices": torch.tensor([2, 0])}, IndexError, r"indices\[0\] = 2 is outside \[0, 2\)"),
        (
            {"input_offsets": torch.tensor([3, 2])},
            ValueError,
            "input_offsets must be non-decreasing",
        ),
        ({"rows": 4}, IndexError, "rows outside the 4 rows of the output"),
        ({"rows": -2}, ValueError, "num_output_rows must be >= 0"),
        ({"values": torch.zeros(5, 2, dtype=torch.int8)}, RuntimeError, "values must be float32"),
    ],
)
def test_add_bad_input(change, error, match):
    args = {**SELECT_ARGS, "rows": 5, **change}
    rows = args.pop("rows")
    with pytest.raises(error, match=match):
        ops.jagged_index_add_2d_forward(*args.values(), 5, rows)


def test_composite_bad_input():
    with pytest.raises(RuntimeError, match=r"values must be 2-D"):
        ops.jagged_index_select(torch.zeros(3), torch.tensor([3]), torch.tensor([0]))
    with pytest.raises(IndexError):
        ops.jagged_index_select(torch.zeros(3, 1), torch.tensor([3]), torch.tensor([1]))
    with pytest.raises(RuntimeError, match="lengths must be 1-D"):
        ops.jagged_index_select(torch.zeros(3, 1), torch.tensor([[3]]), torch.tensor([0]))


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=str)
def test_opcheck(index_dtype):
    values = torch.randn(5, 3)
    indices = torch.tensor([1, 0, 1], dtype=index_dtype)
    input_offsets, output_offsets = torch.tensor([2, 5]), torch.tensor([3, 5, 8])
    opcheck_both(
        "jagged_index_select_2d_forward", (values, indices, input_offsets, output_offsets, 8)
    )
    opcheck_both(
        "jagged_index_select_2d_forward_v2", (values, indices, input_offsets, output_offsets)
    )
    opcheck_both(
        "jagged_index_select_2d_forward_v2", (values, indices, input_offsets, output_offsets, 8)
    )
    grad = torch.randn(8, 3)
    opcheck_both(
        "jagged_index_add_2d_forward", (grad, indices, output_offsets, input_offsets, 8, 5)
    )
    opcheck_both(
        "jagged_index_add_2d_forward_v2", (grad, indices, output_offsets, input_offsets, 5, 8)
    )


# --------------------------------------------------------------------------- keyed, dim 1
def random_keyed(num_keys, batch_size, max_length, dtype, index_dtype, gen):
    lengths = torch.randint(0, max_length + 1, (num_keys * batch_size,), generator=gen)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    total = int(offsets[-1])
    if dtype.is_floating_point:
        values = torch.randn(total, generator=gen).to(dtype)
    else:
        values = torch.randint(0, 1000, (total,), generator=gen).to(dtype)
    return values, lengths.to(index_dtype), offsets.to(index_dtype)


KEYED_CASES = [
    (0, 3, 2, 2),
    (1, 1, 0, 3),
    (3, 4, 3, 0),
    (3, 4, 3, 6),
    (20, 30, 5, 17),
    (4, 500, 9, 700),
]


@pytest.mark.parametrize("num_keys, batch_size, max_length, count", KEYED_CASES, ids=str)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES + [torch.int32, torch.int64, torch.int8], ids=str)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=str)
@pytest.mark.parametrize("weighted", [False, True])
def test_keyed_jagged_index_select_dim1(
    num_keys, batch_size, max_length, count, dtype, index_dtype, weighted
):
    gen = torch.Generator().manual_seed(num_keys * 100 + count)
    values, lengths, offsets = random_keyed(
        num_keys, batch_size, max_length, dtype, index_dtype, gen
    )
    indices = torch.randint(0, batch_size, (count,), generator=gen).to(index_dtype)
    weights = torch.rand(values.shape[0], generator=gen) if weighted else None
    expected = keyed_select_reference(values, lengths, offsets, indices, batch_size, weights)
    out = ops.keyed_jagged_index_select_dim1(values, lengths, offsets, indices, batch_size, weights)
    assert len(out) == len(expected)
    for a, e in zip(out, expected, strict=True):
        assert a.dtype == e.dtype
        torch.testing.assert_close(a, e, rtol=0, atol=0)
    hinted = ops.keyed_jagged_index_select_dim1(
        values, lengths, offsets, indices, batch_size, weights, expected[0].shape[0]
    )
    torch.testing.assert_close(hinted[0], expected[0], rtol=0, atol=0)


def test_keyed_first_segment_starts_at_zero_and_threads():
    # As in FBGEMM, segment 0 is read from element 0 whatever offsets[0] says.
    values = torch.arange(10)
    lengths, offsets = torch.tensor([2, 3]), torch.tensor([5, 2, 5])
    out = ops.keyed_jagged_index_select_dim1(values, lengths, offsets, torch.tensor([1, 0]), 2)
    torch.testing.assert_close(out[0], torch.tensor([2, 3, 4, 0, 1]))
    gen = torch.Generator().manual_seed(1)
    values, lengths, offsets = random_keyed(8, 1000, 6, torch.float32, torch.int64, gen)
    indices = torch.randint(0, 1000, (3000,), generator=gen)
    expected = keyed_select_reference(values, lengths, offsets, indices, 1000)
    for threads in (1, 2, 3):
        with num_threads(threads):
            out = ops.keyed_jagged_index_select_dim1(values, lengths, offsets, indices, 1000)
            torch.testing.assert_close(out[0], expected[0], rtol=0, atol=0)


def test_keyed_gradcheck():
    gen = torch.Generator().manual_seed(2)
    values, lengths, offsets = random_keyed(3, 4, 3, torch.float64, torch.int64, gen)
    indices = torch.tensor([3, 0, 3, 1])
    weights = torch.rand(values.shape[0], dtype=torch.float64)
    values.requires_grad_(True)
    for fn in (ops.keyed_jagged_index_select_dim1, torch.ops.fbgemm.keyed_jagged_index_select_dim1):
        if fn is torch.ops.fbgemm.keyed_jagged_index_select_dim1 and recops.fbgemm_loaded:
            continue  # FBGEMM's autograd of this op is CUDA-only
        assert gradcheck(lambda v, fn=fn: fn(v, lengths, offsets, indices, 4)[0], (values,))
        assert gradcheck(
            lambda v, fn=fn: fn(v, lengths, offsets, indices, 4, weights)[0], (values,)
        )


@pytest.mark.parametrize(
    "change, error, match",
    [
        ({"batch_size": 0}, ValueError, "batch_size must be > 0"),
        (
            {"batch_size": 4},
            ValueError,
            "lengths.numel\\(\\) = 6 must be a multiple of batch_size = 4",
        ),
        ({"indices": torch.tensor([3])}, IndexError, r"indices must be in \[0, batch_size = 3\)"),
        ({"indices": torch.tensor([-1])}, IndexError, r"indices must be in \[0, batch_size = 3\)"),
        ({"lengths": torch.tensor([1, 1, 1, 1, 1, -1])}, ValueError, "lengths must be >= 0"),
        (
            {"offsets": torch.tensor([0, 1, 2])},
            RuntimeError,
            "offsets must hold lengths.numel\\(\\) \\+ 1 = 7",
        ),
        (
            {"offsets": torch.tensor([0, 1, 2, 3, 9, 5, 6])},
            IndexError,
            "segment 4 .* reaches outside the 6 values",
        ),
        ({"weights": torch.ones(5)}, RuntimeError, "weights must have one entry per value"),
        ({"selected_lengths_sum": 3}, ValueError, "selected_lengths_sum = 3 does not match .* 2"),
        ({"selected_lengths_sum": -1}, ValueError, "selected_lengths_sum must be >= 0"),
        ({"values": torch.ones(6, 1)}, RuntimeError, "values must be 1-D"),
    ],
)
def test_keyed_bad_input(change, error, match):
    args = dict(
        values=torch.arange(6.0),
        lengths=torch.ones(6, dtype=torch.long),
        offsets=torch.arange(7),
        indices=torch.tensor([1]),
        batch_size=3,
        weights=None,
        selected_lengths_sum=None,
    )
    args.update(change)
    with pytest.raises(error, match=match):
        ops.keyed_jagged_index_select_dim1(**args)


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=str)
def test_keyed_opcheck(index_dtype):
    gen = torch.Generator().manual_seed(4)
    values, lengths, offsets = random_keyed(2, 3, 3, torch.float32, index_dtype, gen)
    indices = torch.tensor([2, 0], dtype=index_dtype)
    weights = torch.rand(values.shape[0])
    total = keyed_select_reference(values, lengths, offsets, indices, 3)[0].shape[0]
    for args in [
        (values, lengths, offsets, indices, 3),
        (values, lengths, offsets, indices, 3, weights),
        (values, lengths, offsets, indices, 3, weights, total),
    ]:
        # Inputs without grad: opcheck's aot test sums every output, ints included.
        opcheck_both("keyed_jagged_index_select_dim1", args)


def test_composite_opcheck_and_compile():
    values = torch.randn(5, 3)
    lengths, indices = torch.tensor([2, 3]), torch.tensor([1, 0, 1])
    opcheck_both("jagged_index_select", (values, lengths, indices))
    opcheck_both("jagged_index_select", (values.requires_grad_(), lengths, indices, 8))

    def loss(v, lengths, indices):
        return ops.jagged_index_select(v, lengths, indices)[0].square().sum()

    compiled = torch.compile(loss, dynamic=True, fullgraph=True)
    grad = torch.autograd.grad(compiled(values, lengths, indices), values)[0]
    expected = torch.autograd.grad(loss(values, lengths, indices), values)[0]
    torch.testing.assert_close(grad, expected)
