"""Jagged <-> dense ops and offsets_range (docs/ops.md section 1)."""

import itertools

import pytest
import torch
from op_cases import dense_to_jagged, ints, jagged_to_dense, offsets_range
from torch.autograd import gradcheck
from torch.library import opcheck

import recops

ops = torch.ops.recops

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64]
# FBGEMM's CPU jagged kernels lack float64.
FBGEMM_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64]
INDEX_DTYPES = [torch.int32, torch.int64]


# --------------------------------------------------------------------------- helpers
def random_offsets(num_rows, max_length, index_dtype, first=0):
    """Offsets of `num_rows` rows with lengths in [0, max_length] (zero-length rows included)."""
    lengths = torch.randint(0, max_length + 1, (num_rows,))
    if num_rows > 1:
        lengths[0] = 0
    return torch.cat([torch.tensor([0]), lengths.cumsum(0)]).add(first).to(index_dtype)


def random_jagged(batch, max_lengths, index_dtype, overshoot=2):
    """Offsets of a K-level jagged tensor (K = len(max_lengths)): offsets[0] has batch + 1
    entries and offsets[d] has offsets[d-1][-1] + 1. Row lengths go up to max_length + overshoot,
    so that some rows are truncated by the dense view."""
    offsets = []
    rows = batch
    for max_length in max_lengths:
        level = random_offsets(rows, max_length + overshoot, index_dtype)
        offsets.append(level)
        rows = int(level[-1])
    return offsets, rows


def random_values(shape, dtype):
    if dtype.is_floating_point:
        return torch.randn(shape).to(dtype)
    return torch.randint(-100, 100, shape, dtype=dtype)


def ref_jagged_to_dense(values, offsets, max_lengths, padding_value):
    padding = torch.tensor(padding_value, dtype=torch.float64).to(values.dtype)
    return jagged_to_dense(values, [ints(level) for level in offsets], max_lengths, padding)


def ref_dense_to_jagged(dense, offsets, total_L=None):
    levels = [ints(level) for level in offsets]
    return dense_to_jagged(dense, levels, levels[-1][-1] if total_L is None else total_L)


def assert_equal(actual, expected):
    assert actual.dtype == expected.dtype
    torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True)


# (batch, max_lengths) for 1..5 jagged dims, small enough for the python reference.
JAGGED_CASES = {
    1: (5, [4]),
    2: (4, [3, 2]),
    3: (3, [2, 3, 2]),
    4: (3, [2, 2, 2, 3]),
    5: (2, [2, 2, 1, 2, 3]),
}


# --------------------------------------------------------------------------- jagged_to_padded_dense
@pytest.mark.parametrize("num_dims", sorted(JAGGED_CASES))
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=str)
@pytest.mark.parametrize("inner", [None, 3], ids=["1d_values", "2d_values"])
def test_jagged_to_padded_dense_random(num_dims, index_dtype, inner):
    batch, max_lengths = JAGGED_CASES[num_dims]
    offsets, total = random_jagged(batch, max_lengths, index_dtype)
    values = torch.randn((total,) if inner is None else (total, inner))
    for op in (ops.jagged_to_padded_dense, ops.jagged_to_padded_dense_forward):
        out = op(values, offsets, max_lengths, -1.5)
        assert_equal(out, ref_jagged_to_dense(values, offsets, max_lengths, -1.5))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=str)
@pytest.mark.parametrize("num_dims", [1, 2])
def test_jagged_to_padded_dense_dtypes(dtype, index_dtype, num_dims):
    batch, max_lengths = JAGGED_CASES[num_dims]
    offsets, total = random_jagged(batch, max_lengths, index_dtype)
    values = random_values((total, 2), dtype)
    out = ops.jagged_to_padded_dense(values, offsets, max_lengths, 7.0)
    assert_equal(out, ref_jagged_to_dense(values, offsets, max_lengths, 7.0))


@pytest.mark.parametrize(
    "dtype, padding_value",
    [
        (torch.float32, float("-inf")),
        (torch.float32, float("nan")),
        (torch.float16, 1e5),  # out of half range: inf, as a torch conversion gives
        (torch.bfloat16, 0.1),
        (torch.float64, -1e300),
        (torch.int32, -7.0),
        (torch.int64, 2.0**40),
    ],
    ids=str,
)
def test_jagged_to_padded_dense_padding_values(dtype, padding_value):
    offsets, total = random_jagged(4, [3], torch.int64)
    values = random_values((total, 2), dtype)
    out = ops.jagged_to_padded_dense(values, offsets, [3], padding_value)
    assert_equal(out, ref_jagged_to_dense(values, offsets, [3], padding_value))


def test_jagged_1d_to_dense_integer_padding_is_exact():
    # jagged_1d_to_dense's padding_value is an int: int64 values get it exactly (it used to pass
    # through double, which rounds 2^60 + 1), and a padding int32 cannot hold raises.
    offsets = torch.tensor([0, 2, 5])
    out = ops.jagged_1d_to_dense(torch.arange(5), offsets, 4, 2**60 + 1)
    assert out.tolist() == [[0, 1, 2**60 + 1, 2**60 + 1], [2, 3, 4, 2**60 + 1]]
    with pytest.raises(ValueError, match=r"padding_value = 1099511627776 cannot be represented"):
        ops.jagged_1d_to_dense(torch.arange(5, dtype=torch.int32), offsets, 4, 2**40)
    # A negative padding never wraps into an unsigned dtype (-1 would be 255), even when no
    # position is padded.
    for values in (torch.arange(5, dtype=torch.uint8), torch.zeros(0, dtype=torch.uint8)):
        with pytest.raises(ValueError, match=r"padding_value = -1 cannot be represented"):
            ops.jagged_1d_to_dense(values, offsets[: 1 + len(values) // 3], 4, -1)


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=str)
def test_jagged_to_padded_dense_edge_cases(index_dtype):
    def check(values, offsets, max_lengths, padding_value=0.0):
        out = ops.jagged_to_padded_dense(values, offsets, max_lengths, padding_value)
        assert_equal(out, ref_jagged_to_dense(values, offsets, max_lengths, padding_value))
        return out

    def idx(x):
        return torch.tensor(x, dtype=index_dtype)

    # Empty batch: [0, max_length, D], for one and several jagged dims.
    assert check(torch.zeros(0, 3), [idx([0])], [4]).shape == (0, 4, 3)
    assert check(torch.zeros(0, 3), [idx([0]), idx([0])], [2, 4]).shape == (0, 2, 4, 3)
    # Only zero-length rows: all padding.
    out = check(torch.zeros(0, 3), [idx([0, 0, 0])], [4], 5.0)
    assert (out == 5).all()
    # Zero max length: nothing copied; an outer zero max length empties the dense view.
    values = torch.randn(6, 2)
    assert check(values, [idx([0, 2, 6])], [0]).shape == (2, 0, 2)
    assert check(values, [idx([0, 2, 3]), idx([0, 1, 5, 6])], [0, 3]).shape == (2, 0, 3, 2)
    # Truncation: rows longer than max_length keep their first max_length elements.
    out = check(torch.arange(6.0), [idx([0, 5, 6])], [2], -1.0)
    assert out.tolist() == [[0.0, 1.0], [5.0, -1.0]]
    # values longer than offsets[-1][-1]: the extra rows are ignored.
    check(torch.randn(9, 2), [idx([0, 2, 6])], [3])
    # offsets not starting at zero: rows before offsets[0] are ignored.
    check(torch.randn(9, 2), [idx([3, 5, 9])], [3])
    # Zero-width rows [L, 0].
    assert check(torch.zeros(6, 0), [idx([0, 2, 6])], [3]).shape == (2, 3, 0)


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=str)
def test_jagged_to_padded_dense_non_contiguous(index_dtype):
    offsets, total = random_jagged(4, [3, 2], index_dtype)
    values = torch.randn(3, total).t()  # [total, 3], column-major
    strided = [torch.stack([o, o], dim=1)[:, 0] for o in offsets]  # stride 2
    assert not values.is_contiguous() and not strided[0].is_contiguous()
    out = ops.jagged_to_padded_dense(values, strided, [3, 2], 1.0)
    assert_equal(out, ref_jagged_to_dense(values, offsets, [3, 2], 1.0))
    values_1d = torch.randn(total, 2)[:, 1]
    out = ops.jagged_to_padded_dense(values_1d, offsets, [3, 2], 1.0)
    assert_equal(out, ref_jagged_to_dense(values_1d, offsets, [3, 2], 1.0))


# --------------------------------------------------------------------------- dense_to_jagged
@pytest.mark.parametrize("num_dims", sorted(JAGGED_CASES))
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=str)
@pytest.mark.parametrize("inner", [None, 3], ids=["1d_values", "2d_values"])
def test_dense_to_jagged_random(num_dims, index_dtype, inner):
    batch, max_lengths = JAGGED_CASES[num_dims]
    offsets, total = random_jagged(batch, max_lengths, index_dtype)
    dense = torch.randn((batch, *max_lengths) + (() if inner is None else (inner,)))
    expected = ref_dense_to_jagged(dense, offsets)
    values, out_offsets = ops.dense_to_jagged(dense, offsets)
    assert_equal(values, expected)
    assert len(out_offsets) == num_dims
    for got, given in zip(out_offsets, offsets, strict=True):
        assert_equal(got, given)
    assert_equal(ops.dense_to_jagged_forward(dense, offsets), expected)
    # The backward of jagged_to_padded_dense is the same gather, into total_L rows.
    backward = ops.jagged_to_padded_dense_backward(dense, offsets, total + 3)
    assert_equal(backward, ref_dense_to_jagged(dense, offsets, total + 3))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=str)
@pytest.mark.parametrize("num_dims", [1, 2])
def test_dense_to_jagged_dtypes(dtype, index_dtype, num_dims):
    batch, max_lengths = JAGGED_CASES[num_dims]
    offsets, total = random_jagged(batch, max_lengths, index_dtype)
    dense = random_values((batch, *max_lengths, 2), dtype)
    values, _ = ops.dense_to_jagged(dense, offsets, None)
    assert_equal(values, ref_dense_to_jagged(dense, offsets))
    values = ops.jagged_to_padded_dense_backward(dense, offsets, total)
    assert_equal(values, ref_dense_to_jagged(dense, offsets))


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=str)
def test_dense_to_jagged_edge_cases(index_dtype):
    def idx(x):
        return torch.tensor(x, dtype=index_dtype)

    def check(dense, offsets, total_L=None):
        values, _ = ops.dense_to_jagged(dense, offsets, total_L)
        assert_equal(values, ref_dense_to_jagged(dense, offsets, total_L))
        return values

    # Empty batch, with and without total_L.
    assert check(torch.zeros(0, 4, 3), [idx([0])]).shape == (0, 3)
    assert check(torch.zeros(0, 4, 3), [idx([0])], 0).shape == (0, 3)
    assert check(torch.zeros(0, 2, 4, 3), [idx([0]), idx([0])]).shape == (0, 3)
    # total_L larger than the last offset: the extra rows are zero.
    values = check(torch.randn(2, 3, 2) + 10, [idx([0, 2, 3])], 6)
    assert values.shape == (6, 2) and (values[3:] == 0).all() and (values[:3] != 0).all()
    # Zero-length rows and a zero dense extent.
    check(torch.randn(3, 4, 2), [idx([0, 0, 0, 0])])
    values = check(torch.randn(2, 0, 2), [idx([0, 2, 5])], 5)
    assert values.shape == (5, 2) and (values == 0).all()
    # Truncated rows (longer than the dense extent) are zero past the extent.
    values = check(torch.ones(2, 2), [idx([0, 5, 6])], 6)
    assert values.tolist() == [1.0, 1.0, 0.0, 0.0, 0.0, 1.0]
    # Truncated outer rows leave whole inner runs at zero.
    values = check(torch.ones(1, 1, 2), [idx([0, 2]), idx([0, 1, 3])], 3)
    assert values.tolist() == [1.0, 0.0, 0.0]
    # Offsets not starting at zero: rows before offsets[0] are zero.
    values = check(torch.ones(2, 3, 2), [idx([2, 3, 5])])
    assert (values[:2] == 0).all() and (values[2:] == 1).all()


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=str)
def test_dense_to_jagged_non_contiguous(index_dtype):
    offsets, total = random_jagged(3, [4], index_dtype)
    dense = torch.randn(2, 4, 3).permute(2, 1, 0)  # [3, 4, 2], non-contiguous
    strided = [offsets[0].repeat_interleave(2)[::2]]
    assert not dense.is_contiguous() and not strided[0].is_contiguous()
    values, _ = ops.dense_to_jagged(dense, strided, total + 2)
    assert_equal(values, ref_dense_to_jagged(dense, offsets, total + 2))


# --------------------------------------------------------------------------- large (parallel)
def ref_jagged_to_dense_1level(values, offsets, max_length, padding_value):
    """Vectorised one-level reference, for inputs too large for the python loops."""
    batch = offsets.numel() - 1
    lengths = offsets.diff().long()
    row_batch = torch.repeat_interleave(torch.arange(batch), lengths)
    rows = torch.arange(int(offsets[0]), int(offsets[-1]))
    position = rows - offsets[:-1].long()[row_batch]
    keep = position < max_length
    dense = torch.full((batch, max_length, *values.shape[1:]), padding_value, dtype=values.dtype)
    dense[row_batch[keep], position[keep]] = values[rows[keep]]
    return dense, (row_batch[keep], position[keep], rows[keep])


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=str)
@pytest.mark.parametrize("inner", [None, 16], ids=["1d_values", "2d_values"])
def test_jagged_dense_large_batch(index_dtype, inner):
    # Enough slabs for at::parallel_for to split the work into several tasks.
    offsets = random_offsets(3000, 12, index_dtype)
    total = int(offsets[-1])
    row = () if inner is None else (inner,)
    values = torch.randn((total, *row))
    expected, (row_batch, position, rows) = ref_jagged_to_dense_1level(values, offsets, 8, 0.5)
    assert_equal(ops.jagged_to_padded_dense(values, [offsets], [8], 0.5), expected)
    dense = torch.randn((3000, 8, *row))
    jagged = torch.zeros((total, *row))
    jagged[rows] = dense[row_batch, position]
    assert_equal(ops.dense_to_jagged(dense, [offsets])[0], jagged)
    assert_equal(ops.jagged_to_padded_dense_backward(dense, [offsets], total), jagged)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64], ids=str)
@pytest.mark.parametrize("inner", [1, 13, 100])
@pytest.mark.parametrize("padding_value", [0.0, -1.5])
def test_jagged_dense_streamed(dtype, inner, padding_value, monkeypatch):
    # Outputs larger than the last-level cache are written with streaming stores: whole 64-byte
    # lines streamed, the partial lines at both ends of every run with normal stores. The threshold
    # is forced to 0 so these small outputs take that path, with runs at every alignment.
    monkeypatch.setenv("RECOPS_STREAM_ABOVE_BYTES", "0")
    offsets = random_offsets(300, 70, torch.int64)
    total = int(offsets[-1])
    values = random_values((total, inner), dtype)
    expected, (row_batch, position, rows) = ref_jagged_to_dense_1level(values, offsets, 60, 0)
    if padding_value != 0.0:
        expected = ref_jagged_to_dense(values, [offsets], [60], padding_value)
    assert_equal(ops.jagged_to_padded_dense(values, [offsets], [60], padding_value), expected)
    dense = random_values((300, 60, inner), dtype)
    jagged = torch.zeros((total, inner), dtype=dtype)
    jagged[rows] = dense[row_batch, position]
    assert_equal(ops.dense_to_jagged(dense, [offsets])[0], jagged)


def test_offsets_range_large():
    starts = random_offsets(20000, 9, torch.int64)[:-1]
    range_size = int(starts[-1]) + 5
    positions = torch.arange(range_size)
    segment = torch.searchsorted(starts, positions, right=True) - 1
    assert_equal(ops.offsets_range(starts, range_size), positions - starts[segment])


# --------------------------------------------------------------------------- 1-D / 2-D wrappers
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=str)
@pytest.mark.parametrize("batch", [0, 1, 6])
def test_jagged_2d_to_dense(dtype, index_dtype, batch):
    offsets = random_offsets(batch, 5, index_dtype)
    values = random_values((int(offsets[-1]) + 1, 3), dtype)  # one extra, unaddressed row
    out = ops.jagged_2d_to_dense(values, offsets, 3)
    assert_equal(out, ref_jagged_to_dense(values, [offsets], [3], 0.0))
    out = ops.jagged_2d_to_dense(values.t().contiguous().t(), offsets, 0)
    assert out.shape == (batch, 0, 3)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=str)
@pytest.mark.parametrize("batch", [0, 1, 6])
def test_jagged_1d_to_dense(dtype, index_dtype, batch):
    offsets = random_offsets(batch, 5, index_dtype)
    values = random_values((int(offsets[-1]),), dtype)
    for padding_value in (0, -1, 3):
        out = ops.jagged_1d_to_dense(values, offsets, 3, padding_value)
        assert_equal(out, ref_jagged_to_dense(values, [offsets], [3], padding_value))
    strided = random_values((int(offsets[-1]), 2), dtype)[:, 1]
    out = ops.jagged_1d_to_dense(strided, offsets, 4, -1)
    assert_equal(out, ref_jagged_to_dense(strided, [offsets], [4], -1))


# --------------------------------------------------------------------------- offsets_range
def ref_offsets_range(offsets, range_size):
    return offsets_range(ints(offsets), range_size, offsets.dtype)


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=str)
@pytest.mark.parametrize(
    "num_segments, extra, first", [(1, 0, 0), (7, 0, 0), (300, 5, 0), (4, 2, 3)]
)
def test_offsets_range(index_dtype, num_segments, extra, first):
    offsets = random_offsets(num_segments, 6, index_dtype, first)[:-1]  # segment starts
    range_size = int(offsets[-1]) + 4 + extra
    out = ops.offsets_range(offsets, range_size)
    assert_equal(out, ref_offsets_range(offsets, range_size))
    out = ops.offsets_range(offsets.repeat_interleave(2)[::2], range_size)  # non-contiguous
    assert_equal(out, ref_offsets_range(offsets, range_size))


def test_offsets_range_edge_cases():
    # No segments: every position belongs to none and is 0 (FBGEMM leaves them uninitialised).
    assert ops.offsets_range(torch.zeros(0, dtype=torch.int64), 3).tolist() == [0, 0, 0]
    assert ops.offsets_range(torch.zeros(0, dtype=torch.int32), 0).shape == (0,)
    # Zero-length segments and a last segment ending exactly at range_size.
    out = ops.offsets_range(torch.tensor([0, 0, 2, 2], dtype=torch.int32), 5)
    assert out.tolist() == [0, 1, 0, 1, 2]
    assert ops.offsets_range(torch.tensor([0, 3]), 3).tolist() == [0, 1, 2]


# --------------------------------------------------------------------------- gradients
def f64_values(shape):
    return torch.randn(shape, dtype=torch.float64, requires_grad=True)


@pytest.mark.parametrize("num_dims", [1, 2, 3])
@pytest.mark.parametrize("inner", [None, 2], ids=["1d_values", "2d_values"])
def test_jagged_to_padded_dense_gradcheck(num_dims, inner):
    batch, max_lengths = JAGGED_CASES[num_dims]
    offsets, total = random_jagged(batch, max_lengths, torch.int64)
    # Two extra values rows, addressed by no offset: their gradient must be zero.
    values = f64_values((total + 2,) if inner is None else (total + 2, inner))
    for op in (ops.jagged_to_padded_dense_forward, ops.jagged_to_padded_dense):
        assert gradcheck(lambda v, op=op: op(v, offsets, max_lengths, 1.5), (values,))


def test_jagged_to_padded_dense_truncated_rows_get_zero_gradient():
    offsets = torch.tensor([0, 4, 5])
    values = torch.arange(6.0, requires_grad=True)
    dense = ops.jagged_to_padded_dense(values, [offsets], [2], -1.0)
    dense.backward(torch.full_like(dense, 3.0))
    assert values.grad.tolist() == [3.0, 3.0, 0.0, 0.0, 3.0, 0.0]


@pytest.mark.parametrize("num_dims", [1, 2, 3])
@pytest.mark.parametrize("inner", [None, 2], ids=["1d_values", "2d_values"])
def test_dense_to_jagged_gradcheck(num_dims, inner):
    batch, max_lengths = JAGGED_CASES[num_dims]
    offsets, total = random_jagged(batch, max_lengths, torch.int64)
    dense = f64_values((batch, *max_lengths) + (() if inner is None else (inner,)))
    for total_L in (None, total + 2):
        assert gradcheck(lambda d, t=total_L: ops.dense_to_jagged_forward(d, offsets, t), (dense,))
        assert gradcheck(lambda d, t=total_L: ops.dense_to_jagged(d, offsets, t)[0], (dense,))


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=str)
def test_jagged_2d_1d_to_dense_gradcheck(index_dtype):
    offsets = torch.tensor([0, 3, 3, 7, 8], dtype=index_dtype)  # rows of 3, 0, 4 (truncated), 1
    values_2d = f64_values((9, 2))
    assert gradcheck(lambda v: ops.jagged_2d_to_dense(v, offsets, 3), (values_2d,))
    values_1d = f64_values((9,))
    assert gradcheck(lambda v: ops.jagged_1d_to_dense(v, offsets, 3, -2), (values_1d,))


# --------------------------------------------------------------------------- opcheck
def opcheck_both(op_name, args):
    """opcheck on torch.ops.recops.<op>, and on torch.ops.fbgemm.<op> when FBGEMM is hidden (then
    it is recops' own definition)."""
    opcheck(getattr(ops, op_name).default, args)
    if not recops.fbgemm_loaded:
        opcheck(getattr(torch.ops.fbgemm, op_name).default, args)


OPCHECK_CASES = [(1, None, torch.int64), (1, 3, torch.int32), (3, 2, torch.int64)]


@pytest.mark.parametrize("num_dims, inner, index_dtype", OPCHECK_CASES, ids=str)
def test_opcheck_jagged_dense(num_dims, inner, index_dtype):
    batch, max_lengths = JAGGED_CASES[num_dims]
    offsets, total = random_jagged(batch, max_lengths, index_dtype)
    row = () if inner is None else (inner,)
    values = f64_values((total, *row))
    dense = f64_values((batch, *max_lengths, *row))
    for name in ("jagged_to_padded_dense", "jagged_to_padded_dense_forward"):
        opcheck_both(name, (values, offsets, max_lengths, 0.5))
    opcheck_both("jagged_to_padded_dense_backward", (dense.detach(), offsets, total + 1))
    for name in ("dense_to_jagged", "dense_to_jagged_forward"):
        opcheck_both(name, (dense, offsets, None))
        opcheck_both(name, (dense, offsets, total + 1))


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=str)
def test_opcheck_wrappers_and_offsets_range(index_dtype):
    offsets = torch.tensor([0, 3, 3, 7, 8], dtype=index_dtype)
    opcheck_both("jagged_2d_to_dense", (f64_values((8, 2)), offsets, 3))
    opcheck_both("jagged_1d_to_dense", (f64_values((8,)), offsets, 3, -1))
    opcheck_both("jagged_1d_to_dense", (torch.arange(8, dtype=index_dtype), offsets, 3, -1))
    opcheck_both("offsets_range", (offsets, 10))


def test_opcheck_empty_batch():
    offsets = [torch.zeros(1, dtype=torch.int64)]
    opcheck_both("jagged_to_padded_dense_forward", (f64_values((0, 2)), offsets, [3], 0.0))
    opcheck_both("dense_to_jagged_forward", (f64_values((0, 3, 2)), offsets))


# --------------------------------------------------------------------------- FBGEMM side by side
@pytest.mark.parametrize("num_dims", sorted(JAGGED_CASES))
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=str)
@pytest.mark.parametrize("inner", [None, 3], ids=["1d_values", "2d_values"])
def test_jagged_dense_matches_fbgemm_random(fbgemm_ops, num_dims, index_dtype, inner):
    batch, max_lengths = JAGGED_CASES[num_dims]
    offsets, total = random_jagged(batch, max_lengths, index_dtype)
    row = () if inner is None else (inner,)
    values = torch.randn((total + 1, *row))
    dense = torch.randn((batch, *max_lengths, *row))
    for name in ("jagged_to_padded_dense", "jagged_to_padded_dense_forward"):
        args = (values, offsets, max_lengths, -3.0)
        assert_equal(getattr(ops, name)(*args), getattr(fbgemm_ops, name)(*args))
    args = (dense, offsets, total + 2)
    assert_equal(
        ops.jagged_to_padded_dense_backward(*args),
        fbgemm_ops.jagged_to_padded_dense_backward(*args),
    )
    if inner is None:
        # FBGEMM's dense_to_jagged requires a trailing dim D (dense [B, N..., D]); docs/ops.md's
        # values [total_L, D] does too, and recops additionally accepts dense [B, N...].
        return
    for total_L in (None, total + 2):
        args = (dense, offsets, total_L)
        assert_equal(ops.dense_to_jagged_forward(*args), fbgemm_ops.dense_to_jagged_forward(*args))
        assert_equal(ops.dense_to_jagged(*args)[0], fbgemm_ops.dense_to_jagged(*args)[0])


@pytest.mark.parametrize("dtype", FBGEMM_DTYPES, ids=str)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=str)
@pytest.mark.parametrize("batch", [0, 1, 6])
def test_jagged_dense_matches_fbgemm_dtypes(fbgemm_ops, dtype, index_dtype, batch):
    offsets = random_offsets(batch, 5, index_dtype)
    total = int(offsets[-1])
    values = random_values((total, 2), dtype)
    dense = random_values((batch, 3, 2), dtype)

    def both(name, *args):
        assert_equal(getattr(ops, name)(*args), getattr(fbgemm_ops, name)(*args))

    both("jagged_to_padded_dense", values, [offsets], [3], 2.0)
    both("jagged_to_padded_dense", values[:, 0], [offsets], [3], 0.0)
    both("jagged_2d_to_dense", values.t().contiguous().t(), offsets, 3)
    both("jagged_1d_to_dense", values[:, 1], offsets, 3, -1)
    both("dense_to_jagged_forward", dense, [offsets], None)
    strided_dense = dense.transpose(1, 2).contiguous().transpose(1, 2)
    both("dense_to_jagged_forward", strided_dense, [offsets], total + 3)
    both("jagged_to_padded_dense_backward", dense, [offsets], total + 1)


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=str)
def test_jagged_dense_matches_fbgemm_edge_cases(fbgemm_ops, index_dtype):
    def idx(x):
        return torch.tensor(x, dtype=index_dtype)

    def both(name, *args):
        assert_equal(getattr(ops, name)(*args), getattr(fbgemm_ops, name)(*args))

    values = torch.randn(9, 2)
    for offsets, max_lengths in [
        ([idx([0])], [3]),
        ([idx([0, 0, 0])], [3]),
        ([idx([0, 2, 6])], [0]),
        ([idx([0, 5, 6])], [2]),
        ([idx([3, 5, 9])], [3]),
        ([idx([0, 2, 3]), idx([0, 1, 5, 6])], [2, 3]),
        ([idx([0, 2, 3]), idx([0, 1, 5, 6])], [0, 3]),
    ]:
        both("jagged_to_padded_dense", values, offsets, max_lengths, -1.0)
        dense = torch.randn(len(offsets[0]) - 1, *max_lengths, 2)
        both("dense_to_jagged_forward", dense, offsets, None)
        both("dense_to_jagged_forward", dense, offsets, 12)


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=str)
@pytest.mark.parametrize("num_segments", [1, 7, 300])
def test_offsets_range_matches_fbgemm(fbgemm_ops, index_dtype, num_segments):
    # Not compared: empty offsets, and offsets[0] > 0. FBGEMM leaves the positions that belong to
    # no segment uninitialised; recops sets them to 0 (test_offsets_range_edge_cases).
    offsets = random_offsets(num_segments, 6, index_dtype)[:-1]
    range_size = int(offsets[-1]) + 4
    assert_equal(
        ops.offsets_range(offsets, range_size), fbgemm_ops.offsets_range(offsets, range_size)
    )


def test_jagged_gradients_match_fbgemm(fbgemm_ops):
    offsets, total = random_jagged(3, [2, 3], torch.int64)
    grads = []
    for namespace in (ops, fbgemm_ops):
        values = torch.randn(total + 1, 2, generator=torch.Generator().manual_seed(1))
        values.requires_grad_(True)
        dense = torch.randn(3, 2, 3, 2, generator=torch.Generator().manual_seed(2))
        dense.requires_grad_(True)
        out = namespace.jagged_to_padded_dense(values, offsets, [2, 3], 0.0)
        jagged, _ = namespace.dense_to_jagged(dense, offsets)
        (out.square().sum() + jagged.square().sum()).backward()
        grads.append((values.grad, dense.grad))
    for ours, theirs in zip(*grads, strict=True):
        assert_equal(ours, theirs)


# --------------------------------------------------------------------------- FBGEMM's own cases
def fbgemm_style_jagged(num_dims, outer, inner, dtype, gen):
    """A jagged tensor drawn as FBGEMM's dense_to_jagged tests draw it: max_lengths in [1, 9] and
    row lengths in [0, 2 * max_length), so jagged_to_padded_dense truncates some rows."""
    max_lengths = torch.randint(1, 10, (num_dims,), generator=gen).tolist()
    offsets, rows = [], outer
    for max_length in max_lengths:
        lengths = torch.randint(0, 2 * max_length, (rows,), generator=gen)
        offsets.append(torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]))
        rows = int(offsets[-1][-1])
    values = torch.rand(rows, inner, generator=gen).to(dtype)
    return values, offsets, max_lengths


@pytest.mark.parametrize("num_dims", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("with_total_L", [False, True], ids=["offsets_rows", "total_L"])
def test_dense_to_jagged_truncated_rows(num_dims, dtype, with_total_L):
    """FBGEMM's test_dense_to_jagged: jagged -> dense (truncating) -> jagged -> dense gives the
    same dense tensor; the jagged result has the last offset's rows (or total_L), the truncated
    ones zero; its gradient is the dense gradient of the kept rows."""
    gen = torch.Generator().manual_seed(num_dims)
    for outer, inner in itertools.product((0, 1, 5), (0, 1, 5)):
        values, offsets, max_lengths = fbgemm_style_jagged(num_dims, outer, inner, dtype, gen)
        dense = ops.jagged_to_padded_dense(values, offsets, max_lengths).requires_grad_(True)
        total_L = values.shape[0] if with_total_L else None
        jagged, jagged_offsets = ops.dense_to_jagged(dense, offsets, total_L)
        assert jagged.shape == values.shape
        assert_equal(jagged.detach(), ref_dense_to_jagged(dense.detach(), offsets))
        again = ops.jagged_to_padded_dense(jagged, jagged_offsets, max_lengths)
        assert_equal(again, dense)
        upstream = torch.rand(jagged.shape, generator=gen).to(dtype)
        jagged.backward(upstream)
        assert_equal(dense.grad, ref_jagged_to_dense(upstream, offsets, max_lengths, 0.0))


def test_dense_to_jagged_truncated_rows_match_fbgemm(fbgemm_ops):
    gen = torch.Generator().manual_seed(7)
    for num_dims in range(1, 6):
        values, offsets, max_lengths = fbgemm_style_jagged(num_dims, 5, 3, torch.float32, gen)
        dense = ops.jagged_to_padded_dense(values, offsets, max_lengths)
        for total_L in (None, values.shape[0], values.shape[0] + 2):
            for name in ("dense_to_jagged_forward", "dense_to_jagged"):
                ours = getattr(ops, name)(dense, offsets, total_L)
                theirs = getattr(fbgemm_ops, name)(dense, offsets, total_L)
                if name == "dense_to_jagged":
                    ours, theirs = ours[0], theirs[0]
                assert_equal(ours, theirs)


def test_opcheck_dense_to_jagged_truncated_rows():
    gen = torch.Generator().manual_seed(3)
    for num_dims in (1, 3):
        values, offsets, max_lengths = fbgemm_style_jagged(num_dims, 4, 2, torch.float64, gen)
        dense = ops.jagged_to_padded_dense(values, offsets, max_lengths).requires_grad_(True)
        opcheck_both("dense_to_jagged", (dense, offsets))
        opcheck_both("dense_to_jagged_forward", (dense, offsets))


@pytest.mark.parametrize("namespace", ["recops", "fbgemm"])
def test_dense_to_jagged_dynamic_shapes(namespace):
    """FBGEMM's test_dense_to_jagged_dynamic_shape: compiled with dynamic batch and row width,
    with and without total_L, on inputs with truncated rows."""
    torch._dynamo.reset()
    ns = getattr(torch.ops, namespace)

    def no_total(dense, offsets):
        return ns.dense_to_jagged(dense, offsets)

    def with_total(dense, offsets, total_L):
        return ns.dense_to_jagged(dense, offsets, total_L)

    compiled = [torch.compile(f, fullgraph=True, dynamic=True) for f in (no_total, with_total)]
    gen = torch.Generator().manual_seed(11)
    for outer, inner in ((3, 2), (5, 4)):
        values, offsets, max_lengths = fbgemm_style_jagged(2, outer, inner, torch.float32, gen)
        dense = ops.jagged_to_padded_dense(values, offsets, max_lengths)
        expected = ref_dense_to_jagged(dense, offsets)
        assert_equal(compiled[0](dense, offsets)[0], expected)
        assert_equal(compiled[1](dense, offsets, values.shape[0])[0], expected)
    torch._dynamo.reset()
