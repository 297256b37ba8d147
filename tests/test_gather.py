"""gather_for_rank1 and index_select_for_rank1_backward (docs/ops.md §2) against index_select /
index_add_."""

import pytest
import torch
from accuracy import assert_close
from threads import num_threads

ops = torch.ops.recops

INDEX_DTYPES = [torch.int32, torch.int64]
FLOAT_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


def reference_scatter_add(grad, x, index):
    return torch.zeros_like(x, dtype=torch.float64).index_add_(0, index.long(), grad.double())


# --------------------------------------------------------------------------- forward
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize(
    "dtype", [*FLOAT_DTYPES, torch.int64, torch.int32, torch.uint8, torch.bool]
)
def test_gather_matches_index_select(dtype, index_dtype):
    x = (torch.randn(129) * 50).to(dtype)
    index = torch.randint(0, 129, (5000,), dtype=index_dtype)
    assert torch.equal(ops.gather_for_rank1(x, index), torch.index_select(x, 0, index))


@pytest.mark.parametrize("n, m", [(1, 7), (129, 0), (0, 0), (20480, 100_000)])
def test_gather_sizes(n, m):
    x = torch.randn(n)
    index = torch.randint(0, max(n, 1), (m,))
    y = ops.gather_for_rank1(x, index)
    assert y.shape == (m,)
    assert torch.equal(y, x[index])


def test_gather_non_contiguous():
    x = torch.randn(300)[::3]
    index = torch.randint(0, 100, (400,))[::2]
    assert torch.equal(ops.gather_for_rank1(x, index), x[index])


def test_gather_many_threads():
    x = torch.randn(129)
    index = torch.randint(0, 129, (300_000,))
    with num_threads(4):
        assert torch.equal(ops.gather_for_rank1(x, index), x[index])


# --------------------------------------------------------------------------- backward
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_backward_matches_index_add(dtype, index_dtype):
    x = torch.randn(129, dtype=dtype)
    index = torch.randint(0, 129, (20_000,), dtype=index_dtype)
    grad = torch.randn(20_000, dtype=dtype)
    out = ops.index_select_for_rank1_backward(grad, x, index)
    assert out.dtype == dtype and out.shape == x.shape
    assert_close(out, reference_scatter_add(grad, x, index), dtype)


# (n, m, threads) picking each strategy: one chunk; per-chunk partial histograms with
# interleaved copies (small n) or single copies (n too large for the copies); owner-computes
# ranges (chunks * n too large for partials), including n not a power of two and a last range
# cut short.
@pytest.mark.parametrize(
    "n, m, threads",
    [
        (129, 1000, 1),
        (129, 1003, 1),
        (129, 300_000, 4),
        (5000, 300_000, 4),
        (20480, 1_000_000, 2),
        (600_001, 1_000_000, 2),
        (100_000, 60_000, 4),
        (7, 60_000, 3),
    ],
)
def test_backward_strategies(n, m, threads):
    x = torch.randn(n, dtype=torch.float64)
    index = torch.randint(0, n, (m,))
    grad = torch.randn(m, dtype=torch.float64)
    with num_threads(threads):
        out = ops.index_select_for_rank1_backward(grad, x, index)
        again = ops.index_select_for_rank1_backward(grad, x, index)
    torch.testing.assert_close(out, reference_scatter_add(grad, x, index))
    assert torch.equal(out, again), "the reduction order must not depend on scheduling"


@pytest.mark.parametrize("threads", [1, 2])
def test_backward_hot_slot_and_runs(threads):
    # All gradients into one slot, and long runs of one slot (bucket ids of sorted timestamps).
    x = torch.zeros(129)
    grad = torch.rand(200_000, dtype=torch.float64)
    hot = torch.full((200_000,), 17)
    runs = torch.randint(0, 129, (2000,)).repeat_interleave(100)
    with num_threads(threads):
        for index in (hot, runs):
            out = ops.index_select_for_rank1_backward(grad, x.double(), index)
            torch.testing.assert_close(
                out, reference_scatter_add(grad, x, index), rtol=1e-12, atol=0
            )


def test_backward_empty():
    x = torch.randn(5)
    out = ops.index_select_for_rank1_backward(torch.empty(0), x, torch.empty(0, dtype=torch.long))
    assert torch.equal(out, torch.zeros(5))


def test_backward_non_contiguous():
    x = torch.randn(40)
    index = torch.randint(0, 40, (600,))[::2]
    grad = torch.randn(600)[::2]
    out = ops.index_select_for_rank1_backward(grad, x, index)
    assert_close(out, reference_scatter_add(grad, x, index), torch.float32)


# --------------------------------------------------------------------------- autograd
def test_autograd_matches_index_select():
    x = torch.randn(129, requires_grad=True)
    index = torch.randint(0, 129, (10_000,))
    grad = torch.randn(10_000)
    ops.gather_for_rank1(x, index).backward(grad)
    x_ref = x.detach().clone().requires_grad_()
    torch.index_select(x_ref, 0, index).backward(grad)
    torch.testing.assert_close(x.grad, x_ref.grad)


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
def test_gradcheck(index_dtype):
    x = torch.randn(13, dtype=torch.float64, requires_grad=True)
    index = torch.randint(0, 13, (40,), dtype=index_dtype)
    assert torch.autograd.gradcheck(lambda t: ops.gather_for_rank1(t, index), (x,))
    assert torch.autograd.gradgradcheck(lambda t: ops.gather_for_rank1(t, index), (x,))


# --------------------------------------------------------------------------- bad input
def test_bad_x_shape():
    with pytest.raises(RuntimeError, match=r"x must be 1-D, got shape \[2, 3\]"):
        ops.gather_for_rank1(torch.randn(2, 3), torch.tensor([0]))
    with pytest.raises(RuntimeError, match=r"x must be 1-D"):
        ops.index_select_for_rank1_backward(torch.randn(1), torch.randn(2, 3), torch.tensor([0]))


def test_bad_index():
    x = torch.randn(10)
    with pytest.raises(RuntimeError, match=r"index must be 1-D"):
        ops.gather_for_rank1(x, torch.zeros(2, 2, dtype=torch.long))
    with pytest.raises(RuntimeError, match=r"index must be int32 or int64, got Float"):
        ops.gather_for_rank1(x, torch.zeros(2))


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("bad_value, position", [(10, 3), (-1, 0), (2**31 - 1, 7)])
def test_index_out_of_range(index_dtype, bad_value, position):
    x = torch.randn(10)
    index = torch.zeros(50_000, dtype=index_dtype)
    index[position] = bad_value
    index[40_000] = -5  # a later bad entry: the first one is reported
    message = rf"index entries must be in \[0, 10\).*got index\[{position}\] = {bad_value}"
    with pytest.raises(IndexError, match=message):
        ops.gather_for_rank1(x, index)
    with pytest.raises(IndexError, match=message):
        ops.index_select_for_rank1_backward(torch.randn(50_000), x, index)


def test_index_out_of_range_in_tail():
    # 13 entries: one group of 8 and a tail of 5; the bad one sits in the tail.
    x = torch.randn(10)
    index = torch.arange(13) % 10
    index[11] = 10
    with pytest.raises(IndexError, match=r"got index\[11\] = 10"):
        ops.index_select_for_rank1_backward(torch.randn(13), x, index)


def test_index_out_of_range_owner_path():
    x = torch.randn(600_000)
    index = torch.randint(0, 600_000, (1_000_000,))
    index[900_000] = 600_000
    with num_threads(2), pytest.raises(IndexError, match=r"got index\[900000\] = 600000"):
        ops.index_select_for_rank1_backward(torch.randn(1_000_000), x, index)


def test_backward_bad_grad():
    x = torch.randn(10)
    index = torch.tensor([1, 2])
    with pytest.raises(
        RuntimeError, match=r"grad must have one entry per index entry \(2\), got 3"
    ):
        ops.index_select_for_rank1_backward(torch.randn(3), x, index)
    with pytest.raises(RuntimeError, match=r"grad and x must share one dtype"):
        ops.index_select_for_rank1_backward(torch.randn(2, dtype=torch.float64), x, index)
    with pytest.raises(RuntimeError, match=r"grad must be float, double, half or bfloat16"):
        ops.index_select_for_rank1_backward(torch.ones(2, dtype=torch.long), x.long(), index)
