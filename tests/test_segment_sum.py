"""segment_sum_csr and asynchronous_batched_complete_cumsum (docs/ops.md section 1)."""

import pytest
import torch
from threads import num_threads
from torch.library import opcheck

import recops

ops = torch.ops.recops
INDEX_DTYPES = [torch.int32, torch.int64]
VALUE_DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int32,
    torch.int64,
]
# FBGEMM's CPU kernels take neither float64 nor integers narrower than int32.
FBGEMM_VALUE_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64]


def opcheck_both(op_name, args):
    opcheck(getattr(ops, op_name).default, args)
    if not recops.fbgemm_loaded:
        opcheck(getattr(torch.ops.fbgemm, op_name).default, args)


def segment_sum_reference(batch_size, csr_seg, values):
    """Sum i covers values.flatten()[csr_seg[i] * batch_size, csr_seg[i + 1] * batch_size), summed
    in float64 (int64 for integers) and cast back."""
    flat = values.reshape(-1)
    wide = flat.double() if flat.is_floating_point() else flat.long()
    bounds = [int(x) * batch_size for x in csr_seg.reshape(-1).tolist()]
    sums = [wide[a:b].sum() for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    return torch.stack(sums).to(values.dtype) if sums else values.new_empty(0)


def small_values(n, dtype, gen=None):
    # Integer-valued: sums stay exact in every dtype's accumulator.
    return torch.randint(-3, 4, (n,), generator=gen).to(dtype)


def random_csr(num_segments, max_length, index_dtype, gen=None):
    lengths = torch.randint(0, max_length + 1, (num_segments,), generator=gen)
    return torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]).to(index_dtype)


SEGMENT_CASES = [(0, 3, 2), (1, 0, 3), (5, 1, 4), (7, 4, 0), (40, 3, 5), (3000, 8, 2), (3, 5000, 3)]


@pytest.mark.parametrize("num_segments, batch_size, max_length", SEGMENT_CASES, ids=str)
@pytest.mark.parametrize("value_dtype", VALUE_DTYPES, ids=str)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=str)
def test_segment_sum_csr(num_segments, batch_size, max_length, value_dtype, index_dtype):
    gen = torch.Generator().manual_seed(num_segments * 31 + batch_size)
    csr = random_csr(num_segments, max_length, index_dtype, gen)
    extra = 3  # values past the last segment are not read
    values = small_values(int(csr[-1]) * batch_size + extra, value_dtype, gen)
    out = ops.segment_sum_csr(batch_size, csr, values)
    assert out.dtype == value_dtype and out.shape == (num_segments,)
    torch.testing.assert_close(out, segment_sum_reference(batch_size, csr, values), rtol=0, atol=0)


def test_segment_sum_csr_random_floats_and_threads():
    gen = torch.Generator().manual_seed(0)
    csr = random_csr(500, 300, torch.int64, gen)
    values = torch.randn(int(csr[-1]) * 4, generator=gen)
    expected = segment_sum_reference(4, csr, values)
    for threads in (1, 2, 3):
        with num_threads(threads):
            # fp32 sums of ~600 values: a few ulps of the sum from the float64 reference.
            out = ops.segment_sum_csr(4, csr, values)
            torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-4)


def test_segment_sum_csr_noncontiguous_and_2d_values():
    csr = torch.tensor([0, 1, 3])
    values = torch.arange(20.0)[::2]  # 0, 2, 4, ...: the op reads the values, not the storage
    torch.testing.assert_close(ops.segment_sum_csr(2, csr, values), torch.tensor([2.0, 28.0]))
    values_2d = torch.arange(12.0).reshape(3, 4)  # read flat
    torch.testing.assert_close(
        ops.segment_sum_csr(2, csr, values_2d), torch.tensor([1.0, 2.0 + 3 + 4 + 5])
    )
    torch.testing.assert_close(
        ops.segment_sum_csr(1, csr.reshape(1, 3), values_2d), torch.tensor([0.0, 3.0])
    )


def test_segment_sum_csr_integer_wraps():
    big = torch.full((4,), 2**30, dtype=torch.int32)
    out = ops.segment_sum_csr(1, torch.tensor([0, 4]), big)
    assert int(out[0]) == 0  # 2^32 wraps in int32, as FBGEMM's int32 sum does


@pytest.mark.parametrize(
    "batch_size, csr, values, error, match",
    [
        (2, [], 4, ValueError, "csr_seg must hold at least one offset"),
        (-1, [0, 1], 4, ValueError, "batch_size must be >= 0"),
        (2, [1, 0], 4, ValueError, "csr_seg must be non-decreasing"),
        (2, [-1, 0], 4, ValueError, r"csr_seg must be >= 0"),
        (
            2,
            [0, 3],
            5,
            ValueError,
            r"csr_seg\[1\] \* batch_size = 3 \* 2 exceeds the number of values, 5",
        ),
        (2**62, [0, 4], 5, ValueError, "exceeds the number of values"),
    ],
)
def test_segment_sum_csr_bad_input(batch_size, csr, values, error, match):
    with pytest.raises(error, match=match):
        ops.segment_sum_csr(batch_size, torch.tensor(csr, dtype=torch.int64), torch.ones(values))


def test_segment_sum_csr_bad_dtypes():
    with pytest.raises(RuntimeError, match="csr_seg must be int32 or int64"):
        ops.segment_sum_csr(1, torch.tensor([0.0, 1.0]), torch.ones(2))
    with pytest.raises(RuntimeError, match="values must be int32, int64, float32"):
        ops.segment_sum_csr(1, torch.tensor([0, 1]), torch.ones(2, dtype=torch.int8))


@pytest.mark.parametrize("value_dtype", FBGEMM_VALUE_DTYPES, ids=str)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=str)
@pytest.mark.parametrize("num_segments, batch_size, max_length", SEGMENT_CASES[1:], ids=str)
def test_segment_sum_csr_matches_fbgemm(
    fbgemm_ops, num_segments, batch_size, max_length, value_dtype, index_dtype
):
    gen = torch.Generator().manual_seed(7)
    csr = random_csr(num_segments, max_length, index_dtype, gen)
    values = small_values(int(csr[-1]) * batch_size, value_dtype, gen)
    expected = fbgemm_ops.segment_sum_csr(batch_size, csr, values)
    torch.testing.assert_close(
        ops.segment_sum_csr(batch_size, csr, values), expected, rtol=0, atol=0
    )


def test_segment_sum_csr_matches_fbgemm_random_floats(fbgemm_ops):
    csr = random_csr(300, 50, torch.int64)
    values = torch.randn(int(csr[-1]) * 3)
    expected = fbgemm_ops.segment_sum_csr(3, csr, values)
    # FBGEMM adds in order, recops in eight lanes: sums agree to a few ulps.
    torch.testing.assert_close(ops.segment_sum_csr(3, csr, values), expected, rtol=1e-5, atol=1e-4)


# --------------------------------------------------------------------------- batched cumsum
def batched_cumsum_reference(values):
    wide = values.double() if values.is_floating_point() else values.long()
    zero = wide.new_zeros(wide.shape[0], 1)
    return torch.cat([zero, wide.cumsum(1)], 1).to(values.dtype)


BATCHED_SHAPES = [(0, 3), (3, 0), (1, 1), (4, 7), (1, 70000), (3, 70000), (200, 33)]


@pytest.mark.parametrize("shape", BATCHED_SHAPES, ids=str)
@pytest.mark.parametrize("dtype", VALUE_DTYPES + [torch.uint8, torch.int8, torch.int16], ids=str)
def test_batched_complete_cumsum(shape, dtype):
    values = small_values(shape[0] * shape[1], dtype).abs().reshape(shape)
    out = ops.asynchronous_batched_complete_cumsum(values)
    assert out.shape == (shape[0], shape[1] + 1) and out.dtype == dtype
    torch.testing.assert_close(out, batched_cumsum_reference(values), rtol=0, atol=0)


def test_batched_complete_cumsum_noncontiguous():
    values = torch.arange(12).reshape(3, 4).t()
    torch.testing.assert_close(
        ops.asynchronous_batched_complete_cumsum(values), batched_cumsum_reference(values)
    )


@pytest.mark.parametrize("shape", [(5,), (2, 3, 4), ()], ids=str)
def test_batched_complete_cumsum_needs_2d(shape):
    with pytest.raises(RuntimeError, match=r"values must be 2-D \[B, N\]"):
        ops.asynchronous_batched_complete_cumsum(torch.zeros(shape, dtype=torch.int64))
    with pytest.raises(RuntimeError, match="values must be an integer"):
        ops.asynchronous_batched_complete_cumsum(torch.zeros(2, 2, dtype=torch.bool))


@pytest.mark.parametrize("shape", BATCHED_SHAPES, ids=str)
@pytest.mark.parametrize("dtype", FBGEMM_VALUE_DTYPES, ids=str)
def test_batched_complete_cumsum_matches_fbgemm(fbgemm_ops, shape, dtype):
    if dtype in (torch.float16, torch.bfloat16) and shape[1] > 100:
        # Partial sums past 2^8 / 2^11 round; FBGEMM rounds differently (compared exactly with
        # the float64 reference in test_batched_complete_cumsum on short rows).
        shape = (shape[0], 100)
    values = small_values(shape[0] * shape[1], dtype).reshape(shape)
    expected = fbgemm_ops.asynchronous_batched_complete_cumsum(values)
    torch.testing.assert_close(
        ops.asynchronous_batched_complete_cumsum(values), expected, rtol=0, atol=0
    )


def test_batched_complete_cumsum_opcheck():
    opcheck_both("asynchronous_batched_complete_cumsum", (torch.randint(0, 5, (3, 4)),))
    opcheck_both("asynchronous_batched_complete_cumsum", (torch.randn(2, 0),))
