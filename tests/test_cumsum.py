"""asynchronous_{complete,exclusive,inclusive}_cumsum (docs/ops.md section 1, "cumsum")."""

import pytest
import torch
from accuracy import TOLERANCE
from op_cases import ref_complete_cumsum, ref_flat_cumsum
from threads import num_threads
from torch.library import opcheck

import recops

ops = torch.ops.recops

CUMSUM_OPS = [
    "asynchronous_complete_cumsum",
    "asynchronous_exclusive_cumsum",
    "asynchronous_inclusive_cumsum",
]
REFERENCES = {
    "asynchronous_complete_cumsum": ref_complete_cumsum,
    "asynchronous_exclusive_cumsum": ref_flat_cumsum(inclusive=False),
    "asynchronous_inclusive_cumsum": ref_flat_cumsum(inclusive=True),
}
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64]
FLOAT_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
# FBGEMM's CPU cumsum kernels lack float64.
FBGEMM_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64]
# Shapes every op accepts; 1 << 17 + 3 elements take the chunked parallel scan.
SHAPES = [(0,), (1,), (7,), (1000,), ((1 << 17) + 3,), (0, 4), (4, 0), (1, 6), (3, 5), (2, 70000)]


def reference(name, t):
    """Plain-PyTorch cumsum in float64 (int64 for integers), cast back to the input dtype."""
    return REFERENCES[name]({"t_in": t})


def small_ints(shape, dtype):
    # Integer-valued inputs whose partial sums stay far below 2**24: every dtype, bf16 included,
    # computes them exactly in its fp32 (or wider) accumulator, so the outputs are exactly the
    # float64 reference rounded once to the output dtype.
    return torch.randint(-3, 4, shape).to(dtype)


@pytest.mark.parametrize("name", CUMSUM_OPS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_cumsum_exact(name, dtype, shape):
    t = small_ints(shape, dtype)
    out = getattr(ops, name)(t)
    assert out.dtype == dtype
    torch.testing.assert_close(out, reference(name, t), rtol=0, atol=0)


@pytest.mark.parametrize("name", CUMSUM_OPS)
@pytest.mark.parametrize("threads", [1, 2, 3, 4])
def test_cumsum_thread_counts(name, threads):
    # 300 007 elements: the parallel scan's head, summed pieces and tail on up to 4 threads.
    t = torch.randint(-(2**40), 2**40, (300_007,))
    with num_threads(threads):
        out = getattr(ops, name)(t)
    torch.testing.assert_close(out, reference(name, t), rtol=0, atol=0)


@pytest.mark.parametrize("name", CUMSUM_OPS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(257,), ((1 << 17) + 3,), (3, 129)], ids=str)
def test_cumsum_random_floats(name, dtype, shape):
    t = torch.randn(shape, dtype=torch.float64).to(dtype)
    out = getattr(ops, name)(t)
    expected = reference(name, t).to(torch.float64)
    # Rounding error of a running sum is bounded relative to the running sum of magnitudes;
    # half/bf16 add one rounding of each output to their own precision.
    scale = reference(name, t.abs()).to(torch.float64).clamp(min=1)
    tol, _ = TOLERANCE[dtype]
    assert ((out.to(torch.float64) - expected).abs() / scale).max() <= tol


@pytest.mark.parametrize("name", CUMSUM_OPS)
def test_cumsum_empty_shapes(name):
    empty = torch.zeros(0, dtype=torch.int64)
    out = getattr(ops, name)(empty)
    if name == "asynchronous_complete_cumsum":
        assert out.tolist() == [0]  # [0] -> one zero
    else:
        assert out.shape == (0,)


def test_complete_cumsum_rowwise():
    t = torch.tensor([[1, 2, 3], [4, 5, 6]], dtype=torch.int32)
    out = ops.asynchronous_complete_cumsum(t)
    assert out.tolist() == [[0, 1, 3, 6], [0, 4, 9, 15]]
    assert ops.asynchronous_inclusive_cumsum(t).tolist() == [[1, 3, 6], [10, 15, 21]]
    assert ops.asynchronous_exclusive_cumsum(t).tolist() == [[0, 1, 3], [6, 10, 15]]


@pytest.mark.parametrize("name", CUMSUM_OPS)
@pytest.mark.parametrize("dtype", [torch.int32, torch.float32], ids=str)
def test_cumsum_non_contiguous(name, dtype):
    base = small_ints((6, 10), dtype)
    for t in (base[:, ::2], base.t(), base[1:, 3]):
        assert not t.is_contiguous()
        out = getattr(ops, name)(t)
        assert out.is_contiguous()
        torch.testing.assert_close(out, reference(name, t), rtol=0, atol=0)


@pytest.mark.parametrize("name", CUMSUM_OPS)
@pytest.mark.parametrize("dtype", FBGEMM_DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(0,), (7,), ((1 << 17) + 3,), (3, 5), (0, 4)], ids=str)
def test_cumsum_matches_fbgemm(fbgemm_ops, name, dtype, shape):
    if dtype in (torch.float16, torch.bfloat16) and shape[-1] > 1000:
        # FBGEMM accumulates half/bf16 in their own precision (a run of ones saturates at 2048 /
        # 256); recops accumulates in fp32 (docs/design.md, "Precision"), as torch.cumsum does.
        pytest.skip("FBGEMM accumulates half/bf16 cumsums in half/bf16")
    t = torch.randn(shape).to(dtype) if dtype.is_floating_point else small_ints(shape, dtype)
    if t.dim() == 2 and name != "asynchronous_complete_cumsum":
        t = t.t()  # also compare on a non-contiguous input
    out = getattr(ops, name)(t)
    expected = getattr(fbgemm_ops, name)(t)
    assert out.dtype == expected.dtype and out.shape == expected.shape
    if dtype.is_floating_point:
        # Same accumulator width, but the parallel scan may associate the sum differently.
        tol = 1e-4 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(out, expected, rtol=tol, atol=tol)
    else:
        torch.testing.assert_close(out, expected, rtol=0, atol=0)


@pytest.mark.parametrize("name", CUMSUM_OPS)
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.float32], ids=str)
@pytest.mark.parametrize("shape", [(0,), (5,), (3, 4)], ids=str)
def test_cumsum_opcheck(name, dtype, shape):
    t = small_ints(shape, dtype)
    opcheck(getattr(ops, name).default, (t,))
    if not recops.fbgemm_loaded:
        # FBGEMM hidden: torch.ops.fbgemm.* are recops' own definitions.
        opcheck(getattr(torch.ops.fbgemm, name).default, (t,))
