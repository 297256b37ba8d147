"""Relative attention bias ops (docs/ops.md §3) and the HSTU drop-in module, against plain-PyTorch
references written here: log bucketing with torch.log (float64), index_select / index_add_, and
the padded-and-sliced position construction."""

import math

import pytest
import torch
from accuracy import assert_close
from hstu_reference import magnitudes, reference_bucket, reference_pos_bias

import recops

ops = torch.ops.recops

DIVISOR = 0.301
NB = 128
TABLE_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
HSTU_BUCKETIZATION = lambda x: (torch.log(torch.abs(x).clamp(min=1)) / 0.301).long()  # noqa: E731


# --------------------------------------------------------------------------- references
def reference_time_buckets(sequences, n, shift=True, divisor=DIVISOR, num_buckets=NB):
    """[B, N, N] buckets of a list of 1-D timestamp sequences; padding 0."""
    out = torch.zeros(len(sequences), n, n, dtype=torch.long)
    for b, ts in enumerate(sequences):
        length = ts.shape[0]
        valid = min(length, n)
        if valid == 0:
            continue
        rows = torch.arange(valid)
        query_pos = torch.where(shift & (rows + 1 < length), rows + 1, rows)
        mags = magnitudes(ts[query_pos], ts[:valid])
        out[b, :valid, :valid] = reference_bucket(mags, divisor, num_buckets)
    return out


def reference_bias(sequences, n, ts_w, pos_w=None, shift=True):
    """ts_w[bucket] (+ pos bias) in float64, zero at padding; ts_w [nb+1] or [L, nb+1]."""
    buckets = reference_time_buckets(sequences, n, shift, num_buckets=ts_w.shape[-1] - 1)
    tables = ts_w.double().reshape(-1, ts_w.shape[-1])
    out = torch.stack(
        [torch.index_select(t, 0, buckets.view(-1)).view(buckets.shape) for t in tables]
    )
    if pos_w is not None:
        pos = pos_w.double().reshape(-1, pos_w.shape[-1])
        out = out + torch.stack([reference_pos_bias(p, n)[0] for p in pos])[:, None]
    mask = torch.zeros(len(sequences), n, n, dtype=torch.bool)
    for b, ts in enumerate(sequences):
        valid = min(ts.shape[0], n)
        mask[b, :valid, :valid] = True
    out = out * mask
    return out if ts_w.dim() == 2 else out[0]


def random_timestamps(batch, n, dtype=torch.int64, sort=True, high=10**9):
    ts = torch.randint(0, high, (batch, n), dtype=torch.int64)
    if sort:
        ts = ts.sort(dim=1).values
    return ts.to(dtype)


def jagged(lengths, dtype=torch.int64, high=10**7):
    sequences = [torch.randint(0, high, (k,)).sort().values.to(dtype) for k in lengths]
    offsets = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    values = torch.cat(sequences) if sequences else torch.empty(0, dtype=dtype)
    return sequences, values, offsets


# --------------------------------------------------------------------------- bucketing
def test_bucket_index_exhaustive_small_deltas():
    # Rows [0, d] put |dt| = d at (0, 0) and (1, 0) of each sequence (shifted queries).
    d = torch.arange(0, 2**16)
    ts = torch.stack([torch.zeros_like(d), d], dim=1)
    _, index = ops.relative_attn_bias_time_with_index(ts, torch.zeros(NB + 1))
    expected = reference_bucket(d)
    assert torch.equal(index[:, 0, 0], expected)
    assert torch.equal(index[:, 1, 0], expected)
    assert torch.equal(index[:, :, 1], torch.zeros(2**16, 2, dtype=torch.long))


def test_bucket_index_large_and_signed_deltas():
    d = torch.cat(
        [
            torch.randint(1, 2**40, (20000,)),
            torch.randint(2**40, 2**62, (20000,)),
            torch.tensor([11455709, 15479070, 2**62, 2**53 + 1]),
        ]
    )
    ts = torch.stack([torch.zeros_like(d), d], dim=1)
    _, index = ops.relative_attn_bias_time_with_index(ts, torch.zeros(NB + 1))
    assert torch.equal(index[:, 0, 0], reference_bucket(d))
    # The pair (1, 1) has dt = 0 and the reversed pair a negative delta of the same size.
    _, index = ops.relative_attn_bias_time_with_index(ts.flip(1), torch.zeros(NB + 1))
    assert torch.equal(index[:, 0, 0], reference_bucket(d))


def test_float64_convention_vs_hstu_float32():
    # HSTU's float32 bucketization differs from the float64 convention only where float32
    # rounding carries ln|dt| / 0.301 across an integer, and then by one bucket.
    d = torch.randint(1, 10**9, (200_000,))
    ts = torch.stack([torch.zeros_like(d), d], dim=1)
    _, index = ops.relative_attn_bias_time_with_index(ts, torch.zeros(NB + 1))
    hstu = HSTU_BUCKETIZATION(d).clamp(0, NB)
    differ = index[:, 0, 0] != hstu
    assert differ.float().mean() < 1e-4
    assert ((index[:, 0, 0] - hstu)[differ].abs() == 1).all()
    # ln(417901) / 0.301 = 42.9999995: bucket 42 (float32 evaluation rounds it to 43).
    _, index = ops.relative_attn_bias_time_with_index(
        torch.tensor([[0, 417901]]), torch.zeros(NB + 1)
    )
    assert index[0, 0, 0] == 42 == math.floor(math.log(417901) / 0.301)


@pytest.mark.parametrize("divisor, num_buckets", [(0.5, 40), (0.05, 300), (1.0, 0), (30.0, 128)])
def test_other_divisors_and_bucket_counts(divisor, num_buckets):
    ts = random_timestamps(3, 70, high=10**12, sort=False)
    _, index = ops.relative_attn_bias_time_with_index(
        ts, torch.zeros(num_buckets + 1), bucket_divisor=divisor
    )
    expected = reference_time_buckets(list(ts), 70, divisor=divisor, num_buckets=num_buckets)
    assert torch.equal(index, expected)


def test_tiny_divisor_float_timestamps():
    # Divisors below ~2.4e-4 put several bucket thresholds in one table cell (the slow path);
    # float deltas just above 1 exercise it.
    ts = (1.0 + torch.rand(4, 50, dtype=torch.float64) * 0.03).cumsum(1)
    _, index = ops.relative_attn_bias_time_with_index(
        ts, torch.zeros(NB + 1), bucket_divisor=1e-4, query_time_shift=False
    )
    expected = reference_time_buckets(list(ts), 50, shift=False, divisor=1e-4)
    assert torch.equal(index, expected)
    assert len(expected.unique()) > 10


@pytest.mark.parametrize("ts_dtype", [torch.int32, torch.int64, torch.float32, torch.float64])
@pytest.mark.parametrize("shift", [True, False])
def test_time_buckets_dtypes_and_shift(ts_dtype, shift):
    high = 2**30 if ts_dtype == torch.int32 else 10**9
    ts = random_timestamps(3, 150, ts_dtype, sort=False, high=high)
    if ts_dtype.is_floating_point:
        ts = ts + torch.rand(3, 150, dtype=ts_dtype)
    _, index = ops.relative_attn_bias_time_with_index(
        ts, torch.zeros(NB + 1), query_time_shift=shift
    )
    assert torch.equal(index, reference_time_buckets(list(ts), 150, shift))


# --------------------------------------------------------------------------- forward
@pytest.mark.parametrize("dtype", TABLE_DTYPES)
@pytest.mark.parametrize("with_pos", [True, False])
@pytest.mark.parametrize("n", [1, 17, 130])
def test_time_bias_dense(dtype, with_pos, n):
    ts = random_timestamps(3, n)
    ts_w = torch.randn(NB + 1, dtype=dtype)
    pos_w = torch.randn(2 * n - 1, dtype=dtype) if with_pos else None
    out = ops.relative_attn_bias_time(ts, ts_w, pos_w)
    assert out.dtype == dtype and out.shape == (3, n, n)
    expected = reference_bias(list(ts), n, ts_w, pos_w)
    assert_close(out, expected, dtype)


def test_time_bias_equal_timestamps_and_huge_deltas():
    ts = torch.tensor([[5, 5, 5, 5], [0, 10**18, 2 * 10**18, 3], [-(10**18), 0, 10**18, 7]])
    ts_w = torch.randn(NB + 1)
    out, index = ops.relative_attn_bias_time_with_index(ts, ts_w)
    assert torch.equal(index[0], torch.zeros(4, 4, dtype=torch.long))
    assert index[1].max() == NB and index[2].max() == NB
    torch.testing.assert_close(out.double(), reference_bias(list(ts), 4, ts_w))


def test_time_bias_stacked_layers():
    ts = random_timestamps(2, 40)
    ts_w = torch.randn(3, NB + 1)
    pos_w = torch.randn(3, 79)
    out = ops.relative_attn_bias_time(ts, ts_w, pos_w)
    assert out.shape == (3, 2, 40, 40)
    torch.testing.assert_close(out.double(), reference_bias(list(ts), 40, ts_w, pos_w))


def test_time_bias_empty_batch():
    ts = torch.empty(0, 16, dtype=torch.long)
    out, index = ops.relative_attn_bias_time_with_index(ts, torch.randn(NB + 1), torch.randn(31))
    assert out.shape == (0, 16, 16) and index.shape == (0, 16, 16)


@pytest.mark.parametrize("shift", [True, False])
def test_time_bias_jagged(shift):
    lengths = [0, 1, 5, 64, 70, 66]
    n = 64
    sequences, values, offsets = jagged(lengths)
    ts_w = torch.randn(NB + 1)
    pos_w = torch.randn(2 * n - 1)
    out, index = ops.relative_attn_bias_time_with_index(
        values, ts_w, pos_w, offsets, n, query_time_shift=shift
    )
    assert out.shape == (6, n, n)
    assert torch.equal(index, reference_time_buckets(sequences, n, shift))
    expected = reference_bias(sequences, n, ts_w, pos_w, shift)
    torch.testing.assert_close(out.double(), expected)


def test_time_bias_jagged_int32_offsets_with_leading_gap():
    sequences, values, offsets = jagged([3, 4])
    values = torch.cat([torch.tensor([7, 8]), values])  # offsets start past unused values
    offsets = (offsets + 2).int()
    out = ops.relative_attn_bias_time(values, torch.arange(NB + 1.0), None, offsets, 4)
    torch.testing.assert_close(out.double(), reference_bias(sequences, 4, torch.arange(NB + 1.0)))


def test_pos_bias():
    for n in (1, 2, 33):
        pos_w = torch.randn(2 * n - 1)
        out = ops.relative_attn_bias_pos(pos_w)
        assert out.shape == (1, n, n)
        assert torch.equal(out, reference_pos_bias(pos_w, n))
    stacked = torch.randn(3, 9)
    out = ops.relative_attn_bias_pos(stacked, 5)
    assert out.shape == (3, 1, 5, 5)
    for layer in range(3):
        assert torch.equal(out[layer], reference_pos_bias(stacked[layer], 5))


# --------------------------------------------------------------------------- backward
def reference_grads(sequences, n, ts_w, pos_w, grad, shift=True):
    ts_w = ts_w.detach().double().requires_grad_()
    pos_w = pos_w.detach().double().requires_grad_()
    reference_bias(sequences, n, ts_w, pos_w, shift).backward(grad.double())
    return ts_w.grad, pos_w.grad


@pytest.mark.parametrize("dtype", TABLE_DTYPES)
def test_autograd_dense(dtype):
    n = 70
    ts = random_timestamps(3, n)
    ts_w = torch.randn(NB + 1, dtype=dtype, requires_grad=True)
    pos_w = torch.randn(2 * n - 1, dtype=dtype, requires_grad=True)
    grad = torch.randn(3, n, n, dtype=dtype)
    ops.relative_attn_bias_time(ts, ts_w, pos_w).backward(grad)
    expected_ts, expected_pos = reference_grads(list(ts), n, ts_w, pos_w, grad)
    assert_close(ts_w.grad, expected_ts, dtype, atol_factor=20)
    assert_close(pos_w.grad, expected_pos, dtype, atol_factor=20)


@pytest.mark.parametrize("shift", [True, False])
def test_autograd_jagged_and_layers(shift):
    n = 20
    sequences, values, offsets = jagged([20, 0, 3, 25, 11])
    ts_w = torch.randn(2, NB + 1, dtype=torch.float64, requires_grad=True)
    pos_w = torch.randn(2, 2 * n - 1, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(2, 5, n, n, dtype=torch.float64)
    ops.relative_attn_bias_time(values, ts_w, pos_w, offsets, n, query_time_shift=shift).backward(
        grad
    )
    ts_ref = ts_w.detach().clone().requires_grad_()
    pos_ref = pos_w.detach().clone().requires_grad_()
    reference_bias(sequences, n, ts_ref, pos_ref, shift).backward(grad)
    torch.testing.assert_close(ts_w.grad, ts_ref.grad)
    torch.testing.assert_close(pos_w.grad, pos_ref.grad)


def test_autograd_only_one_table():
    ts = random_timestamps(2, 9)
    ts_w = torch.randn(NB + 1, requires_grad=True)
    pos_w = torch.randn(17)
    ops.relative_attn_bias_time(ts, ts_w, pos_w).sum().backward()
    assert ts_w.grad is not None and pos_w.grad is None
    ts_w = torch.randn(NB + 1)
    pos_w.requires_grad_()
    ops.relative_attn_bias_time(ts, ts_w, pos_w).sum().backward()
    torch.testing.assert_close(
        pos_w.grad, reference_grads(list(ts), 9, ts_w, pos_w, torch.ones(2, 9, 9))[1].float()
    )


@pytest.mark.parametrize("source", ["timestamps", "uint8", "int32", "int64"])
def test_backward_op_standalone(source):
    n = 90
    ts = random_timestamps(4, n, sort=False)
    grad = torch.randn(4, n, n, dtype=torch.float64)
    ts_w = torch.zeros(NB + 1, dtype=torch.float64)
    pos_w = torch.zeros(2 * n - 1, dtype=torch.float64)
    expected_ts, expected_pos = reference_grads(list(ts), n, ts_w, pos_w, grad)
    if source == "timestamps":
        grad_ts, grad_pos = ops.relative_attn_bias_backward(grad, ts, pos_grad=True)
    else:
        index = reference_time_buckets(list(ts), n).to(getattr(torch, source))
        grad_ts, grad_pos = ops.relative_attn_bias_backward(grad, None, index, pos_grad=True)
    torch.testing.assert_close(grad_ts, expected_ts)
    torch.testing.assert_close(grad_pos, expected_pos)
    grad_ts, grad_pos = ops.relative_attn_bias_backward(grad, ts)
    assert grad_pos is None
    grad_ts, grad_pos = ops.relative_attn_bias_backward(grad, pos_grad=True)
    assert grad_ts is None
    torch.testing.assert_close(grad_pos, expected_pos)


def test_pos_autograd():
    pos_w = torch.randn(15, requires_grad=True)
    grad = torch.randn(1, 8, 8)
    ops.relative_attn_bias_pos(pos_w).backward(grad)
    ref = pos_w.detach().clone().requires_grad_()
    reference_pos_bias(ref, 8).backward(grad)
    torch.testing.assert_close(pos_w.grad, ref.grad)


def test_gradcheck():
    ts = random_timestamps(2, 6, high=1000)
    ts_w = torch.randn(NB + 1, dtype=torch.float64, requires_grad=True)
    pos_w = torch.randn(11, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda a, b: ops.relative_attn_bias_time(ts, a, b), (ts_w, pos_w)
    )
    assert torch.autograd.gradcheck(
        lambda a, b: ops.relative_attn_bias_time_with_index(ts, a, b)[0], (ts_w, pos_w)
    )
    _, values, offsets = jagged([6, 2, 0])
    assert torch.autograd.gradcheck(
        lambda a, b: ops.relative_attn_bias_time(values, a, b, offsets, 6), (ts_w, pos_w)
    )
    assert torch.autograd.gradcheck(ops.relative_attn_bias_pos, (pos_w,))


def test_opcheck():
    ts = random_timestamps(2, 12)
    ts_w = torch.randn(NB + 1, requires_grad=True)
    pos_w = torch.randn(23, requires_grad=True)
    for index_dtype in (torch.uint8, torch.int32, torch.int64):
        torch.library.opcheck(
            ops.relative_attn_bias_time_forward,
            (ts, ts_w, pos_w, None, None, DIVISOR, True, index_dtype),
        )
    _, values, offsets = jagged([5, 12, 0])
    torch.library.opcheck(
        ops.relative_attn_bias_time_forward,
        (values, ts_w, None, offsets, 12, 0.5, False, torch.uint8),
    )
    grad = torch.randn(2, 12, 12)
    torch.library.opcheck(
        ops.relative_attn_bias_backward, (grad, ts, None, None, NB, DIVISOR, True, True)
    )
    index = reference_time_buckets(list(ts), 12)
    torch.library.opcheck(ops.relative_attn_bias_backward, (grad, None, index, None, NB))


# --------------------------------------------------------------------------- bad input
def test_bad_timestamps():
    ts_w = torch.randn(NB + 1)
    with pytest.raises(RuntimeError, match=r"timestamps must be 2-D \[B, N\].*got shape \[5\]"):
        ops.relative_attn_bias_time(torch.arange(5), ts_w)
    with pytest.raises(
        RuntimeError, match=r"timestamps must be 2-D \[B, N\].*got shape \[1, 2, 3\]"
    ):
        ops.relative_attn_bias_time(torch.zeros(1, 2, 3, dtype=torch.long), ts_w)
    with pytest.raises(
        RuntimeError, match=r"timestamps must be int32, int64, float or double, got Half"
    ):
        ops.relative_attn_bias_time(torch.zeros(2, 3, dtype=torch.half), ts_w)
    with pytest.raises(RuntimeError, match=r"max_seq_len is required with jagged timestamps"):
        ops.relative_attn_bias_time(torch.arange(5), ts_w, None, torch.tensor([0, 5]))
    with pytest.raises(RuntimeError, match=r"timestamps must be 1-D jagged values"):
        ops.relative_attn_bias_time(
            torch.zeros(2, 3, dtype=torch.long), ts_w, None, torch.tensor([0, 5]), 3
        )
    with pytest.raises(ValueError, match=r"seq_offsets must be non-decreasing"):
        ops.relative_attn_bias_time(torch.arange(5), ts_w, None, torch.tensor([0, 3, 2]), 3)
    with pytest.raises(
        RuntimeError, match=r"seq_offsets\[-1\] = 9 must be <= the number of timestamps, 5"
    ):
        ops.relative_attn_bias_time(torch.arange(5), ts_w, None, torch.tensor([0, 9]), 3)
    with pytest.raises(RuntimeError, match=r"max_seq_len = 4 must match timestamps' N = 3"):
        ops.relative_attn_bias_time(torch.zeros(2, 3, dtype=torch.long), ts_w, None, None, 4)


def test_bad_tables():
    ts = torch.zeros(2, 4, dtype=torch.long)
    with pytest.raises(
        RuntimeError, match=r"pos_w must have 2N - 1 = 7 entries for sequence length N = 4, got 8"
    ):
        ops.relative_attn_bias_time(ts, torch.randn(NB + 1), torch.randn(8))
    with pytest.raises(
        RuntimeError, match=r"pos_w must have 2N - 1 entries \(an odd number\), got 8"
    ):
        ops.relative_attn_bias_pos(torch.randn(8))
    with pytest.raises(
        RuntimeError, match=r"pos_w must have 2N - 1 = 9 entries for sequence length N = 5, got 7"
    ):
        ops.relative_attn_bias_pos(torch.randn(7), 5)
    with pytest.raises(
        RuntimeError, match=r"ts_w must be 1-D \[entries\] or 2-D \[layers, entries\]"
    ):
        ops.relative_attn_bias_time(ts, torch.randn(1, 2, NB + 1))
    with pytest.raises(RuntimeError, match=r"pos_w and ts_w must share one dtype"):
        ops.relative_attn_bias_time(ts, torch.randn(NB + 1), torch.randn(7, dtype=torch.float64))
    with pytest.raises(RuntimeError, match=r"pos_w must be stacked like ts_w \(2 layers, 2-D\)"):
        ops.relative_attn_bias_time(ts, torch.randn(2, NB + 1), torch.randn(3, 7))
    with pytest.raises(
        RuntimeError, match=r"ts_w must be float, double, half or bfloat16, got Long"
    ):
        ops.relative_attn_bias_time(ts, torch.zeros(NB + 1, dtype=torch.long))
    with pytest.raises(
        ValueError, match=r"bucket_divisor must be a positive finite number, got -1"
    ):
        ops.relative_attn_bias_time(ts, torch.randn(NB + 1), bucket_divisor=-1.0)


def test_bad_backward_inputs():
    grad = torch.randn(2, 4, 4)
    ts = torch.zeros(3, 4, dtype=torch.long)
    with pytest.raises(
        RuntimeError, match=r"grad_bias has batch size 2 but timestamps describe 3 sequences"
    ):
        ops.relative_attn_bias_backward(grad, ts)
    with pytest.raises(
        RuntimeError, match=r"grad_bias has batch size 2 but seq_offsets describe 1 sequences"
    ):
        ops.relative_attn_bias_backward(grad, None, None, torch.tensor([0, 4]), pos_grad=True)
    with pytest.raises(RuntimeError, match=r"grad_bias must be 3-D \[B, N, N\] or 4-D"):
        ops.relative_attn_bias_backward(torch.randn(4, 4))
    with pytest.raises(RuntimeError, match=r"bucket_index must be \[B, N, N\] = \[2, 4, 4\]"):
        ops.relative_attn_bias_backward(grad, None, torch.zeros(2, 4, 5, dtype=torch.long))
    with pytest.raises(RuntimeError, match=r"pass timestamps or bucket_index, not both"):
        ops.relative_attn_bias_backward(grad, ts[:2], torch.zeros(2, 4, 4, dtype=torch.long))
    with pytest.raises(
        RuntimeError, match=r"bucket_index must be uint8, int32 or int64, got Float"
    ):
        ops.relative_attn_bias_backward(grad, None, torch.zeros(2, 4, 4))
    index = torch.zeros(2, 4, 4, dtype=torch.long)
    index[1, 2, 3] = NB + 1
    with pytest.raises(ValueError, match=r"bucket_index.flatten\(\)\[27\] = 129"):
        ops.relative_attn_bias_backward(grad, None, index)


# --------------------------------------------------------------------------- module
class ReferenceModule(torch.nn.Module):
    """The generative-recommenders research module's math, restated: parameters created in the same
    order and initialisation; time deltas between the next item's timestamp (the last item using
    its own) and each key; the position bias by the pad-and-slice construction."""

    def __init__(self, max_seq_len, num_buckets, bucketization_fn):
        super().__init__()
        self._max_seq_len = max_seq_len
        self._ts_w = torch.nn.Parameter(torch.empty(num_buckets + 1).normal_(mean=0, std=0.02))
        self._pos_w = torch.nn.Parameter(torch.empty(2 * max_seq_len - 1).normal_(mean=0, std=0.02))
        self._num_buckets = num_buckets
        self._bucketization_fn = bucketization_fn

    def forward(self, all_timestamps):
        batch, n = all_timestamps.shape[0], self._max_seq_len
        extended = torch.cat([all_timestamps, all_timestamps[:, n - 1 : n]], dim=1)
        deltas = extended[:, 1:].unsqueeze(2) - extended[:, :-1].unsqueeze(1)
        buckets = torch.clamp(self._bucketization_fn(deltas), min=0, max=self._num_buckets).detach()
        ts_bias = torch.index_select(self._ts_w, 0, buckets.view(-1)).view(batch, n, n)
        return reference_pos_bias(self._pos_w, n) + ts_bias


FLOAT64_BUCKETIZATION = lambda x: (torch.log(torch.abs(x).clamp(min=1).double()) / 0.301).long()  # noqa: E731


def assert_module_matches(module, reference, ts):
    """Same output and same parameter gradients as the reference module on timestamps ts."""
    out, expected = module(ts), reference(ts)
    torch.testing.assert_close(out, expected)
    grad = torch.randn_like(out)
    out.backward(grad)
    expected.backward(grad)
    for ours, theirs in zip(module.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(ours.grad, theirs.grad)


def test_module_matches_reference():
    n = 50
    torch.manual_seed(3)
    reference = ReferenceModule(n, NB, FLOAT64_BUCKETIZATION)
    torch.manual_seed(3)
    module = recops.RelativeBucketedTimeAndPositionBasedBias(n, NB, FLOAT64_BUCKETIZATION)
    assert module.fused
    assert [name for name, _ in module.named_parameters()] == ["_ts_w", "_pos_w"]
    for ours, theirs in zip(module.parameters(), reference.parameters(), strict=True):
        assert torch.equal(ours, theirs)
    assert module.ts_w is module._ts_w and module.pos_w is module._pos_w

    assert_module_matches(module, reference, random_timestamps(4, n, sort=False))


def test_module_state_dict_round_trip():
    reference = ReferenceModule(30, NB, HSTU_BUCKETIZATION)
    module = recops.RelativeBucketedTimeAndPositionBasedBias(30, NB)
    module.load_state_dict(reference.state_dict())
    ts = random_timestamps(2, 30)
    torch.testing.assert_close(module(ts), reference(ts))
    reference.load_state_dict(module.state_dict())


def test_module_with_hstu_lambda_is_fused_and_close():
    module = recops.RelativeBucketedTimeAndPositionBasedBias(64, NB, HSTU_BUCKETIZATION)
    assert module.fused
    reference = ReferenceModule(64, NB, HSTU_BUCKETIZATION)
    reference.load_state_dict(module.state_dict())
    ts = random_timestamps(8, 64, high=10**8)
    out, expected = module(ts), reference(ts)
    assert (out - expected).abs().gt(1e-6).float().mean() < 1e-4


def test_module_custom_bucketization_is_not_fused():
    fn = lambda x: torch.div(x.abs(), 1000, rounding_mode="floor")  # noqa: E731
    module = recops.RelativeBucketedTimeAndPositionBasedBias(40, NB, fn)
    assert not module.fused
    reference = ReferenceModule(40, NB, fn)
    reference.load_state_dict(module.state_dict())
    assert_module_matches(module, reference, random_timestamps(3, 40, high=200_000))


@pytest.mark.parametrize("divisor", [0.3, 0.302])
def test_module_detects_other_divisor(divisor):
    fn = lambda x: (torch.log(torch.abs(x).clamp(min=1)) / divisor).long()  # noqa: E731
    assert not recops.RelativeBucketedTimeAndPositionBasedBias(16, NB, fn).fused
    assert recops.RelativeBucketedTimeAndPositionBasedBias(16, NB, fn, bucket_divisor=divisor).fused


def test_module_shorter_sequences():
    module = recops.RelativeBucketedTimeAndPositionBasedBias(32, NB)
    ts = random_timestamps(2, 20)
    out = module(ts)
    pos = module._pos_w.detach()[32 - 20 : 32 + 20 - 1]
    expected = reference_bias(list(ts), 20, module._ts_w.detach(), pos)
    torch.testing.assert_close(out.double(), expected)
    with pytest.raises(
        ValueError, match=r"all_timestamps has 33 positions, more than max_seq_len 32"
    ):
        module(random_timestamps(1, 33))
