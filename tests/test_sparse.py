"""permute_2D_sparse_data, permute_1D_sparse_data, invert_permute (docs/ops.md section 1)."""

import pytest
import torch
from threads import num_threads
from torch.autograd import gradcheck
from torch.library import opcheck

import recops

ops = torch.ops.recops

VALUE_DTYPES = [
    torch.int32,
    torch.int64,
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.float64,
]
WEIGHT_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
INDEX_DTYPES = [torch.int32, torch.int64]
# FBGEMM's CPU kernels: values without float64, weights only float32/float64, permute int32 only.
FBGEMM_VALUE_DTYPES = [torch.int32, torch.int64, torch.float32, torch.float16, torch.bfloat16]
FBGEMM_WEIGHT_DTYPES = [torch.float32, torch.float64]
PERMUTE_OPS = ["permute_1D_sparse_data", "permute_2D_sparse_data"]


# --------------------------------------------------------------------------- helpers
def random_values(shape, dtype):
    shape = (shape,) if isinstance(shape, int) else shape
    if dtype.is_floating_point:
        return torch.randn(shape).to(dtype)
    return torch.randint(-1000, 1000, shape, dtype=dtype)


def make_permute(kind, num_segments):
    if kind == "identity":
        perm = torch.arange(num_segments)
    elif kind == "random":
        perm = torch.randperm(num_segments)
    elif kind == "repeats_drops":  # some segments twice, others never
        perm = torch.randint(0, num_segments, (num_segments + 2,))
    elif kind == "subset":
        perm = torch.randperm(num_segments)[: max(num_segments // 2, 1)]
    elif kind == "runs":  # shuffled runs of consecutive segments, as a feature-major permute
        cuts = torch.randperm(max(num_segments - 1, 0))[: num_segments // 3].add(1).sort().values
        bounds = [0, *cuts.tolist(), num_segments]
        runs = [torch.arange(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
        perm = torch.cat([runs[i] for i in torch.randperm(len(runs))])
    elif kind == "empty":
        perm = torch.zeros(0, dtype=torch.int64)
    else:
        raise ValueError(kind)
    return perm.to(torch.int32)


def ref_permute(permute, lengths, values, weights):
    """Python reference: segment t of the input is row t of lengths (2-D: [T, B], its B bags are
    contiguous in values) or entry t of lengths (1-D)."""
    lengths_2d = lengths.unsqueeze(1) if lengths.dim() == 1 else lengths
    seg_sizes = [int(s) for s in lengths_2d.sum(1)]
    starts = [sum(seg_sizes[:t]) for t in range(len(seg_sizes))]
    order = [int(p) for p in permute]
    out_lengths = lengths_2d[order].reshape((len(order), *lengths.shape[1:]))

    def gather(src):
        if src is None:
            return None
        pieces = [src[starts[p] : starts[p] + seg_sizes[p]] for p in order]
        if not pieces:
            return src[:0].clone()
        return torch.cat(pieces)

    return out_lengths, gather(values), gather(weights)


def assert_equal(actual, expected):
    if expected is None:
        assert actual is None
        return
    assert actual.dtype == expected.dtype
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)


def assert_all_equal(actual, expected):
    assert len(actual) == len(expected) == 3
    for a, e in zip(actual, expected, strict=True):
        assert_equal(a, e)


def sparse_input(op_name, num_features, batch, lengths_dtype, max_length=4):
    """lengths for the op's layout: [T, B] (2-D op) or [T * B] segments (1-D op)."""
    lengths = torch.randint(0, max_length + 1, (num_features, batch), dtype=lengths_dtype)
    if lengths.numel() > 1:
        lengths.view(-1)[1] = 0  # always one zero-length bag
    if op_name == "permute_1D_sparse_data":
        lengths = lengths.flatten()
    num_segments = lengths.shape[0]
    return lengths, int(lengths.sum()), num_segments


def random_permute_case(op_name, kind, lengths_dtype, num_features, batch):
    """(lengths, permute, values, weights): int64 ids and float weights for a random KJT."""
    lengths, total, num_segments = sparse_input(op_name, num_features, batch, lengths_dtype)
    if num_segments == 0 and kind != "empty":
        pytest.skip("nothing to permute")
    permute = make_permute(kind, num_segments)
    return lengths, permute, torch.randint(0, 10**6, (total,)), torch.randn(total)


PERMUTE_KINDS = ["identity", "random", "runs", "repeats_drops", "subset", "empty"]


# --------------------------------------------------------------------------- permute: random
@pytest.mark.parametrize("op_name", PERMUTE_OPS)
@pytest.mark.parametrize("kind", PERMUTE_KINDS)
@pytest.mark.parametrize("lengths_dtype", INDEX_DTYPES, ids=str)
@pytest.mark.parametrize("num_features, batch", [(1, 1), (5, 3), (40, 7), (6, 0)], ids=str)
def test_permute_random(op_name, kind, lengths_dtype, num_features, batch):
    op = getattr(ops, op_name)
    lengths, permute, values, weights = random_permute_case(
        op_name, kind, lengths_dtype, num_features, batch
    )
    expected = ref_permute(permute, lengths, values, weights)
    assert_all_equal(op(permute, lengths, values, weights), expected)
    assert_all_equal(op(permute, lengths, values, None), (*expected[:2], None))
    # The correct size hint gives the same result.
    hint = expected[1].shape[0]
    assert_all_equal(op(permute, lengths, values, weights, hint), expected)
    # int64 permute is accepted as well (FBGEMM takes int32 only).
    assert_all_equal(op(permute.long(), lengths, values, weights), expected)


@pytest.mark.parametrize("op_name", PERMUTE_OPS)
@pytest.mark.parametrize("values_dtype", VALUE_DTYPES, ids=str)
@pytest.mark.parametrize("weights_dtype", WEIGHT_DTYPES, ids=str)
def test_permute_dtypes(op_name, values_dtype, weights_dtype):
    op = getattr(ops, op_name)
    lengths, total, num_segments = sparse_input(op_name, 6, 3, torch.int64)
    permute = make_permute("repeats_drops", num_segments)
    values = random_values(total, values_dtype)
    weights = random_values(total, weights_dtype)
    assert_all_equal(
        op(permute, lengths, values, weights), ref_permute(permute, lengths, values, weights)
    )


@pytest.mark.parametrize("op_name", PERMUTE_OPS)
@pytest.mark.parametrize("kind", ["random", "repeats_drops", "empty"])
def test_permute_2d_values_and_weights(op_name, kind):
    op = getattr(ops, op_name)
    lengths, total, num_segments = sparse_input(op_name, 5, 3, torch.int32)
    permute = make_permute(kind, num_segments)
    values = torch.randn(total, 4)
    weights = torch.randn(total, 2).to(torch.bfloat16)
    out = op(permute, lengths, values, weights)
    assert_all_equal(out, ref_permute(permute, lengths, values, weights))
    assert out[1].shape[1:] == (4,) and out[2].shape[1:] == (2,)


@pytest.mark.parametrize("op_name", PERMUTE_OPS)
def test_permute_non_contiguous(op_name):
    op = getattr(ops, op_name)
    lengths, total, num_segments = sparse_input(op_name, 6, 4, torch.int64)
    permute = make_permute("repeats_drops", num_segments)
    strided_lengths = torch.stack([lengths, lengths], -1)[..., 0]
    strided_permute = torch.stack([permute, permute], 1)[:, 0]
    values = torch.randn(total, 3)[:, 1]
    weights = torch.randn(3, total).t()  # 2-D, column-major
    for t in (strided_lengths, strided_permute, values, weights):
        assert not t.is_contiguous()
    out = op(strided_permute, strided_lengths, values, weights)
    assert_all_equal(out, ref_permute(permute, lengths, values, weights))
    assert all(t.is_contiguous() for t in out)


@pytest.mark.parametrize("op_name", PERMUTE_OPS)
def test_permute_edge_cases(op_name):
    op = getattr(ops, op_name)
    one_d = op_name == "permute_1D_sparse_data"
    # Empty permute selects nothing: lengths [0, B] (1-D: [0]) and empty values / weights.
    lengths = torch.tensor([3, 1, 2]) if one_d else torch.tensor([[1, 2], [0, 1], [2, 0]])
    perm_lengths, perm_values, perm_weights = op(
        torch.zeros(0, dtype=torch.int32), lengths, torch.arange(6), torch.ones(6, 2)
    )
    assert perm_lengths.shape == ((0,) if one_d else (0, 2))
    assert perm_values.shape == (0,) and perm_weights.shape == (0, 2)
    # Empty batch / no segments at all.
    lengths = torch.zeros(0, dtype=torch.int32) if one_d else torch.zeros(0, 4, dtype=torch.int32)
    out = op(torch.zeros(0, dtype=torch.int32), lengths, torch.zeros(0), None)
    assert_all_equal(out, (lengths.clone(), torch.zeros(0), None))
    # All bags empty.
    lengths = torch.zeros(4, dtype=torch.int64) if one_d else torch.zeros(4, 3, dtype=torch.int64)
    permute = torch.tensor([3, 1, 1], dtype=torch.int32)
    values, weights = torch.zeros(0, dtype=torch.int32), torch.zeros(0)
    out = op(permute, lengths, values, weights)
    assert_all_equal(out, ref_permute(permute, lengths, values, weights))
    # values with more rows than the lengths sum: the extra rows are not addressed.
    lengths = torch.tensor([2, 1]) if one_d else torch.tensor([[2], [1]])
    values = torch.arange(5)
    out = op(torch.tensor([1, 0], dtype=torch.int32), lengths, values, None)
    assert out[1].tolist() == [2, 0, 1]


@pytest.mark.parametrize("op_name", PERMUTE_OPS)
@pytest.mark.parametrize("row_shape", [(), (3,), (40,)], ids=str)
@pytest.mark.parametrize("values_dtype", [torch.float32, torch.float16, torch.int64], ids=str)
def test_permute_streamed(op_name, row_shape, values_dtype, monkeypatch):
    # Outputs larger than the last-level cache are written with streaming stores (threshold forced
    # to 0 here): runs longer than 512 bytes at every alignment, next to short ones.
    monkeypatch.setenv("RECOPS_STREAM_ABOVE_BYTES", "0")
    op = getattr(ops, op_name)
    num_features, batch = (30, 20) if op_name == "permute_2D_sparse_data" else (600, 1)
    lengths, total, num_segments = sparse_input(op_name, num_features, batch, torch.int32, 300)
    for kind in ("identity", "random", "runs", "repeats_drops"):
        permute = make_permute(kind, num_segments)
        values = random_values((total, *row_shape), values_dtype)
        weights = torch.randn(total)
        out = op(permute, lengths, values, weights)
        assert_all_equal(out, ref_permute(permute, lengths, values, weights))


def ref_permute_1d_vectorized(permute, lengths, values, weights):
    """ref_permute for 1-D lengths as whole-tensor ops (the loop reference is quadratic in the
    number of segments): element j of output segment i is element j of input segment permute[i]."""
    perm = permute.long()
    sizes = lengths.long()
    out_sizes = sizes[perm]
    out_starts = torch.cumsum(out_sizes, 0) - out_sizes
    within = torch.arange(int(out_sizes.sum())) - torch.repeat_interleave(out_starts, out_sizes)
    source = torch.repeat_interleave((torch.cumsum(sizes, 0) - sizes)[perm], out_sizes) + within
    return lengths[perm], values[source], weights[source]


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_permute_1d_many_segments(threads):
    # 150 001 segments: the input's and the output's offsets are computed in several chunks on
    # all threads; bad entries deep inside are caught and named.
    small, small_total, _ = sparse_input("permute_1D_sparse_data", 40, 1, torch.int64, 3)
    for kind in ("random", "repeats_drops"):
        args = (make_permute(kind, 40), small, torch.randn(small_total), torch.randn(small_total))
        assert_all_equal(ref_permute_1d_vectorized(*args), ref_permute(*args))
    lengths, total, num_segments = sparse_input(
        "permute_1D_sparse_data", 150_001, 1, torch.int64, 3
    )
    values = torch.randn(total)
    weights = torch.randn(total)
    with num_threads(threads):
        for kind in ("random", "runs", "repeats_drops"):
            permute = make_permute(kind, num_segments)
            out = ops.permute_1D_sparse_data(permute, lengths, values, weights)
            assert_all_equal(out, ref_permute_1d_vectorized(permute, lengths, values, weights))
        permute = make_permute("random", num_segments)
        bad_permute = permute.clone()
        bad_permute[100_000] = num_segments
        with pytest.raises(ValueError, match=rf"got permute\[100000\] = {num_segments}"):
            ops.permute_1D_sparse_data(bad_permute, lengths, values, weights)
        bad_lengths = lengths.clone()
        bad_lengths[120_000] = -2
        with pytest.raises(ValueError, match=r"lengths.flatten\(\)\[120000\] = -2"):
            ops.permute_1D_sparse_data(permute, bad_lengths, values, weights)


@pytest.mark.parametrize("op_name", PERMUTE_OPS)
def test_permute_large(op_name):
    # Enough segments for at::parallel_for to split the copies into several tasks.
    op = getattr(ops, op_name)
    num_features, batch = (300, 64) if op_name == "permute_2D_sparse_data" else (3000, 1)
    lengths, total, num_segments = sparse_input(op_name, num_features, batch, torch.int32, 8)
    for kind in ("identity", "random", "runs", "repeats_drops"):
        permute = make_permute(kind, num_segments)
        values = torch.randn(total, 4)
        weights = torch.randn(total)
        out = op(permute, lengths, values, weights)
        assert_all_equal(out, ref_permute(permute, lengths, values, weights))
    permute = torch.randperm(20000).to(torch.int32)
    expected = torch.empty_like(permute)
    expected[permute.long()] = torch.arange(20000, dtype=torch.int32)
    assert_equal(ops.invert_permute(permute), expected)


# --------------------------------------------------------------------------- invert_permute
# Two kernels: AVX-512 CPUs give each thread a slice of the output (a vector scan of all entries
# per thread); "avx2" caps the instruction set to the portable one, which splits the entries.
INVERT_KERNELS = ["widest", "avx2"]


@pytest.fixture(params=INVERT_KERNELS)
def invert_kernel(request, monkeypatch):
    if request.param != "widest":
        monkeypatch.setenv("RECOPS_CPU_ISA", request.param)


@pytest.mark.parametrize("dtype", INDEX_DTYPES, ids=str)
@pytest.mark.parametrize("n", [0, 1, 5, 17, 1000, 40_001])
def test_invert_permute(dtype, n, invert_kernel):
    permute = torch.randperm(n).to(dtype)
    inverse = ops.invert_permute(permute)
    expected = torch.empty_like(permute)
    expected[permute.long()] = torch.arange(n, dtype=dtype)
    assert_equal(inverse, expected)
    assert_equal(ops.invert_permute(torch.stack([permute, permute], 1)[:, 1]), expected)
    assert_equal(permute[inverse.long()], torch.arange(n, dtype=dtype))


@pytest.mark.parametrize("dtype", INDEX_DTYPES, ids=str)
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_invert_permute_many_chunks(dtype, threads, invert_kernel):
    # 100 003 entries: several chunks (portable kernel) or output slices (AVX-512) per thread count,
    # and a vector tail; a repeat or an out-of-range entry in any of them is caught.
    n = 100_003
    permute = torch.randperm(n).to(dtype)
    expected = torch.empty_like(permute)
    expected[permute.long()] = torch.arange(n, dtype=dtype)
    with num_threads(threads):
        assert_equal(ops.invert_permute(permute), expected)
        for at, source in [(90_000, 10), (n - 1, 0), (0, n - 2)]:
            repeated = permute.clone()
            repeated[at] = permute[source]
            with pytest.raises(ValueError, match=rf"{int(permute[source])} appears twice"):
                ops.invert_permute(repeated)
        for at, value in [(70_000, n), (n - 1, -1), (3, 2**31 - 1)]:
            out_of_range = permute.clone()
            out_of_range[at] = value
            with pytest.raises(ValueError, match=rf"got permute\[{at}\] = {value}"):
                ops.invert_permute(out_of_range)


# --------------------------------------------------------------------------- gradients
@pytest.mark.parametrize("op_name", PERMUTE_OPS)
@pytest.mark.parametrize("values_shape", [(), (2,)], ids=["1d_values", "2d_values"])
def test_permute_gradcheck(op_name, values_shape):
    op = getattr(ops, op_name)
    lengths, total, num_segments = sparse_input(op_name, 4, 3, torch.int64, max_length=2)
    permute = make_permute("random", num_segments)
    values = torch.randn((total, *values_shape), dtype=torch.float64, requires_grad=True)
    weights = torch.randn(total, dtype=torch.float64, requires_grad=True)
    assert gradcheck(lambda v, w: op(permute, lengths, v, w)[1:], (values, weights))
    assert gradcheck(lambda v, w: op(permute, lengths, v, w, total)[1:], (values, weights))
    assert gradcheck(lambda w: op(permute, lengths, values.detach(), w)[2], (weights,))
    assert gradcheck(lambda v: op(permute, lengths, v, None)[1], (values,))


@pytest.mark.parametrize("op_name", PERMUTE_OPS)
def test_permute_gradcheck_unaddressed_rows(op_name):
    # values / weights longer than the lengths sum: the extra rows get zero gradient.
    op = getattr(ops, op_name)
    lengths, total, num_segments = sparse_input(op_name, 4, 2, torch.int32, max_length=2)
    permute = make_permute("random", num_segments)
    values = torch.randn(total + 2, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(total + 1, 2, dtype=torch.float64, requires_grad=True)
    assert gradcheck(lambda v, w: op(permute, lengths, v, w)[1:], (values, weights))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_permute_weights_grad_dtypes(dtype):
    lengths = torch.tensor([[1, 2], [0, 3], [2, 0]])
    permute = torch.tensor([2, 0, 1], dtype=torch.int32)
    weights = torch.randn(8).to(dtype).requires_grad_()
    _, _, out = ops.permute_2D_sparse_data(permute, lengths, torch.arange(8), weights)
    grad_out = torch.randn(8).to(dtype)
    out.backward(grad_out)
    # Output segments (2, 0, 1) hold input rows [6, 7, 0, 1, 2, 3, 4, 5].
    assert_equal(weights.grad, grad_out[[2, 3, 4, 5, 6, 7, 0, 1]])


# --------------------------------------------------------------------------- opcheck
def opcheck_both(op_name, args):
    """opcheck on torch.ops.recops.<op>, and on torch.ops.fbgemm.<op> when FBGEMM is hidden."""
    opcheck(getattr(ops, op_name).default, args)
    if not recops.fbgemm_loaded:
        opcheck(getattr(torch.ops.fbgemm, op_name).default, args)


@pytest.mark.parametrize("op_name", PERMUTE_OPS)
@pytest.mark.parametrize("kind", ["random", "repeats_drops", "empty"])
@pytest.mark.parametrize("with_hint", [False, True])
def test_permute_opcheck(op_name, kind, with_hint):
    # Inputs do not require grad: opcheck's aot_dispatch test sums every output into one scalar,
    # which fails for an int first output (lengths) next to a float input that requires grad.
    # Gradients are covered by gradcheck above.
    lengths, total, num_segments = sparse_input(op_name, 4, 3, torch.int32)
    permute = make_permute(kind, num_segments)
    values = torch.randn(total, 2)
    weights = torch.randn(total)
    hint = (ref_permute(permute, lengths, values, None)[1].shape[0],) if with_hint else ()
    opcheck_both(op_name, (permute, lengths, values, weights, *hint))
    opcheck_both(op_name, (permute, lengths, values.long(), None, *hint))


@pytest.mark.parametrize("dtype", INDEX_DTYPES, ids=str)
def test_invert_permute_opcheck(dtype):
    opcheck_both("invert_permute", (torch.randperm(7).to(dtype),))
    opcheck_both("invert_permute", (torch.zeros(0, dtype=dtype),))


# --------------------------------------------------------------------------- FBGEMM side by side
@pytest.mark.parametrize("op_name", PERMUTE_OPS)
@pytest.mark.parametrize("kind", PERMUTE_KINDS)
@pytest.mark.parametrize("lengths_dtype", INDEX_DTYPES, ids=str)
@pytest.mark.parametrize("num_features, batch", [(1, 1), (5, 3), (40, 7), (6, 0)], ids=str)
def test_permute_matches_fbgemm(fbgemm_ops, op_name, kind, lengths_dtype, num_features, batch):
    lengths, permute, values, weights = random_permute_case(
        op_name, kind, lengths_dtype, num_features, batch
    )
    hint = ref_permute(permute, lengths, values, None)[1].shape[0]
    for args in [(values, weights), (values, None), (values, weights, hint)]:
        ours = getattr(ops, op_name)(permute, lengths, *args)
        theirs = getattr(fbgemm_ops, op_name)(permute, lengths, *args)
        assert_all_equal(ours, theirs)


@pytest.mark.parametrize("op_name", PERMUTE_OPS)
@pytest.mark.parametrize("values_dtype", FBGEMM_VALUE_DTYPES, ids=str)
@pytest.mark.parametrize("weights_dtype", FBGEMM_WEIGHT_DTYPES, ids=str)
def test_permute_matches_fbgemm_dtypes(fbgemm_ops, op_name, values_dtype, weights_dtype):
    # 1-D values / weights only: FBGEMM's CPU permute silently mishandles 2-D ones (it permutes
    # the first rows of the flattened buffer and returns 1-D tensors); docs/ops.md regroups rows.
    lengths, total, num_segments = sparse_input(op_name, 6, 3, torch.int64)
    permute = make_permute("repeats_drops", num_segments)
    values = random_values(total, values_dtype)
    weights = random_values(total, weights_dtype)
    strided_values = torch.stack([values, values], 1)[:, 0]
    ours = getattr(ops, op_name)(permute, lengths, strided_values, weights)
    theirs = getattr(fbgemm_ops, op_name)(permute, lengths, strided_values, weights)
    assert_all_equal(ours, theirs)


@pytest.mark.parametrize("shape", [(6, 3), (2, 3, 3), ()], ids=str)
def test_permute_1d_reads_lengths_flat(shape):
    """permute_1D_sparse_data reads lengths of any shape flat, as FBGEMM does ([T, B] lengths are
    T * B segments); it raised "lengths must be 1-D" on FBGEMM's own tests."""
    lengths = torch.randint(0, 4, shape)
    total = int(lengths.sum())
    permute = make_permute("repeats_drops", lengths.numel())
    values, weights = torch.randint(0, 10**6, (total,)), torch.randn(total)
    expected = ref_permute(permute, lengths.flatten(), values, weights)
    assert_all_equal(ops.permute_1D_sparse_data(permute, lengths, values, weights), expected)


def test_permute_1d_lengths_flat_matches_fbgemm(fbgemm_ops):
    lengths, permute, values, weights = random_permute_case(
        "permute_2D_sparse_data", "repeats_drops", torch.int64, 6, 3
    )
    permute = make_permute("repeats_drops", lengths.numel())
    args = (permute, lengths, values, weights)
    assert_all_equal(ops.permute_1D_sparse_data(*args), fbgemm_ops.permute_1D_sparse_data(*args))


@pytest.mark.parametrize("dtype", INDEX_DTYPES, ids=str)
@pytest.mark.parametrize("n", [0, 1, 5, 1000])
def test_invert_permute_matches_fbgemm(fbgemm_ops, dtype, n):
    permute = torch.randperm(n).to(dtype)
    assert_equal(ops.invert_permute(permute), fbgemm_ops.invert_permute(permute))


def test_permute_gradients_match_fbgemm(fbgemm_ops):
    lengths = torch.randint(0, 4, (5, 3))
    permute = torch.randperm(5).to(torch.int32)
    total = int(lengths.sum())
    grads = []
    for namespace in (ops, fbgemm_ops):
        weights = torch.arange(total, dtype=torch.float32, requires_grad=True)
        _, _, out = namespace.permute_2D_sparse_data(permute, lengths, torch.arange(total), weights)
        out.backward(torch.arange(total, dtype=torch.float32).square())
        grads.append(weights.grad)
    assert_equal(*grads)
