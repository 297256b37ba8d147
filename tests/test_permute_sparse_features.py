"""permute_sparse_features, permute_2D_sparse_data_input1D, permute_2D_sparse_preallocated_out
(the permute_2D_sparse_data forms torchrec and FBGEMM's callers use) and
expand_into_jagged_permute (docs/ops.md section 1): against plain-PyTorch references written here
and against fbgemm-gpu-cpu where it is installed."""

import pytest
import torch
from test_sparse import ref_permute
from threads import num_threads
from torch.autograd import gradcheck
from torch.library import opcheck

ops = torch.ops.recops
I32, I64 = torch.int32, torch.int64
INDEX_DTYPES = [I32, I64]
WEIGHT_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
SHAPES = [(1, 1), (5, 3), (40, 7), (6, 0), (0, 4)]  # (features, batch)


def assert_same(actual, expected):
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected, strict=True):
        if e is None:
            assert a is None
            continue
        assert a.dtype == e.dtype
        torch.testing.assert_close(a, e, rtol=0, atol=0)


def sparse_case(features, batch, dtype, weight_dtype=torch.float32, kind="random"):
    """(permute int32, lengths [T, B] with a zero-length bag, indices of the lengths' dtype,
    weights)."""
    lengths = torch.randint(0, 5, (features, batch), dtype=dtype)
    if lengths.numel() > 1:
        lengths.view(-1)[1] = 0
    total = int(lengths.sum())
    if kind == "random":
        permute = torch.randperm(features)
    elif kind == "repeats_drops":
        permute = torch.randint(0, max(features, 1), (features + 2,) if features else (0,))
    else:
        permute = torch.zeros(0, dtype=I64)
    indices = torch.randint(-(2**30), 2**30, (total,), dtype=dtype)
    return permute.to(I32), lengths, indices, torch.randn(total).to(weight_dtype)


# ------------------------------------------------------------------- permute_sparse_features
@pytest.mark.parametrize("features, batch", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", INDEX_DTYPES, ids=str)
@pytest.mark.parametrize("weight_dtype", WEIGHT_DTYPES, ids=str)
@pytest.mark.parametrize("kind", ["random", "repeats_drops", "empty"])
def test_permute_sparse_features_matches_reference(features, batch, dtype, weight_dtype, kind):
    permute, lengths, indices, weights = sparse_case(features, batch, dtype, weight_dtype, kind)
    for w in (weights, None):
        got = ops.permute_sparse_features(permute, lengths, indices, w)
        assert_same(got, ref_permute(permute, lengths, indices, w))


@pytest.mark.parametrize("features, batch", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", INDEX_DTYPES, ids=str)
@pytest.mark.parametrize("kind", ["random", "repeats_drops"])
def test_permute_sparse_features_matches_fbgemm(fbgemm_ops, features, batch, dtype, kind):
    permute, lengths, indices, weights = sparse_case(features, batch, dtype, torch.float32, kind)
    if permute.numel() == 0:
        pytest.skip("nothing to permute")
    for w in (weights, weights.double(), None):
        want = fbgemm_ops.permute_sparse_features(permute, lengths, indices, w)
        assert_same(ops.permute_sparse_features(permute, lengths, indices, w), want)


def test_permute_sparse_features_non_contiguous_and_int64_permute():
    permute, lengths, indices, weights = sparse_case(6, 4, I64)
    lengths_t = lengths.t().contiguous().t()  # same values, column-major
    want = ref_permute(permute, lengths, indices, weights)
    assert_same(ops.permute_sparse_features(permute.long(), lengths_t, indices, weights), want)


def test_expand_leaves_uncovered_output_zero():
    """FBGEMM writes only the entries output_offset covers (here 1..4 of 6) and leaves the others
    unwritten; recops zeroes them."""
    permute = torch.tensor([1, 0])
    input_offset = torch.tensor([0, 1, 4])
    output_offset = torch.tensor([1, 4, 5])
    got = ops.expand_into_jagged_permute(permute, input_offset, output_offset, 6)
    assert got.tolist() == [0, 1, 2, 3, 0, 0]


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(indices=torch.zeros(12, dtype=I32)), "lengths and indices must share one dtype"),
        (dict(lengths=torch.ones(12, dtype=I64)), "lengths must be 2-D"),
        (dict(permute=torch.tensor([0, 3], dtype=I32)), r"permute entries must be in \[0, 3\)"),
        (dict(lengths=-torch.ones(3, 4, dtype=I64)), "lengths must be >= 0"),
        (dict(indices=torch.zeros(5, dtype=I64)), "values has 5 rows but lengths sum to 12"),
    ],
)
def test_permute_sparse_features_bad_input(change, match):
    a = dict(
        permute=torch.tensor([2, 0], dtype=I32),
        lengths=torch.ones(3, 4, dtype=I64),
        indices=torch.zeros(12, dtype=I64),
    )
    with pytest.raises((RuntimeError, ValueError), match=match):
        ops.permute_sparse_features(**{**a, **change})


def test_permute_sparse_features_opcheck():
    permute, lengths, indices, weights = sparse_case(5, 3, I64)
    opcheck(ops.permute_sparse_features.default, (permute, lengths, indices, weights))
    opcheck(ops.permute_sparse_features.default, (permute, lengths, indices, None))


# --------------------------------------------------------------------------- input1D
@pytest.mark.parametrize("features, batch", [(1, 1), (5, 3), (40, 7), (0, 4)], ids=str)
@pytest.mark.parametrize("dtype", INDEX_DTYPES, ids=str)
@pytest.mark.parametrize("kind", ["random", "repeats_drops"])
def test_input1d_matches_reference_and_fbgemm(request, features, batch, dtype, kind):
    permute, lengths, values, weights = sparse_case(features, batch, dtype, kind=kind)
    values = values.long()
    want_lengths, want_values, want_weights = ref_permute(permute, lengths, values, weights)
    want = (want_lengths.reshape(-1), want_values, want_weights)
    got = ops.permute_2D_sparse_data_input1D(permute, lengths.flatten(), values, batch, weights)
    assert_same(got, want)
    total = int(want_lengths.sum())
    got = ops.permute_2D_sparse_data_input1D(permute, lengths.flatten(), values, batch, None, total)
    assert_same(got, (want[0], want[1], None))
    import recops

    if recops.fbgemm_loaded and permute.numel() > 0:
        fbgemm = torch.ops.fbgemm.permute_2D_sparse_data_input1D
        assert_same(got, fbgemm(permute, lengths.flatten(), values, batch, None, total))
        w = weights.double()
        assert_same(
            ops.permute_2D_sparse_data_input1D(permute, lengths.flatten(), values, batch, w),
            fbgemm(permute, lengths.flatten(), values, batch, w),
        )


def test_input1d_reads_lengths_of_any_shape_flat():
    permute, lengths, values, weights = sparse_case(4, 6, I64)
    flat = ops.permute_2D_sparse_data_input1D(permute, lengths.flatten(), values, 6, weights)
    assert_same(ops.permute_2D_sparse_data_input1D(permute, lengths, values, 6, weights), flat)
    # Non-contiguous lengths hold the same values.
    strided = torch.stack([lengths.flatten(), lengths.flatten()], 1)[:, 0]
    assert_same(ops.permute_2D_sparse_data_input1D(permute, strided, values, 6, weights), flat)


@pytest.mark.parametrize(
    "stride, match",
    [(0, "stride must be >= 1"), (-2, "stride must be >= 1"), (5, "multiple of stride = 5")],
)
def test_input1d_bad_stride(stride, match):
    lengths = torch.ones(12, dtype=I64)
    with pytest.raises(ValueError, match=match):
        ops.permute_2D_sparse_data_input1D(
            torch.tensor([0], dtype=I32), lengths, torch.zeros(12), stride
        )


def test_input1d_gradcheck_and_opcheck():
    permute = torch.tensor([2, 0, 1], dtype=I32)
    lengths = torch.tensor([1, 0, 2, 3, 1, 1], dtype=I64)
    values = torch.randn(8, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(8, dtype=torch.float64, requires_grad=True)

    def f(v, w):
        _, pv, pw = ops.permute_2D_sparse_data_input1D(permute, lengths, v, 2, w)
        return pv, pw

    assert gradcheck(f, (values, weights))
    # Inputs that do not require grad: opcheck's aot_dispatch test sums every output, the integer
    # lengths among them, into one floating-point scalar.
    values, weights = values.detach(), weights.detach()
    opcheck(ops.permute_2D_sparse_data_input1D.default, (permute, lengths, values, 2, weights))
    opcheck(ops.permute_2D_sparse_data_input1D.default, (permute, lengths, values, 2, None, 8))


# --------------------------------------------------------------------------- preallocated out
def preallocated_case(features=5, batch=3, dtype=I64):
    permute, lengths, values, weights = sparse_case(features, batch, dtype, kind="repeats_drops")
    return permute, lengths, values.long(), weights


def test_preallocated_writes_into_the_given_outputs():
    permute, lengths, values, weights = preallocated_case()
    want = ref_permute(permute, lengths, values, weights)
    out_lengths = torch.empty_like(want[0])
    out_values = torch.full((want[1].numel() + 3,), -7, dtype=values.dtype)  # room to spare
    out_weights = torch.empty(want[2].numel(), dtype=weights.dtype)
    got = ops.permute_2D_sparse_preallocated_out(
        permute, lengths, values, weights, None, out_lengths, out_values, out_weights
    )
    assert got[0] is out_lengths and got[1] is out_values and got[2] is out_weights
    assert_same((out_lengths, out_values[: want[1].numel()], out_weights), want)
    assert out_values[want[1].numel() :].tolist() == [-7] * 3  # the rest untouched


@pytest.mark.parametrize("given", [(), ("lengths",), ("values",), ("weights",)])
def test_preallocated_allocates_the_outputs_not_given(given):
    permute, lengths, values, weights = preallocated_case()
    want = ref_permute(permute, lengths, values, weights)
    outs = {
        "permuted_lengths_out": torch.empty_like(want[0]) if "lengths" in given else None,
        "permuted_indices_out": torch.empty_like(want[1]) if "values" in given else None,
        "permuted_weights_out": torch.empty_like(want[2]) if "weights" in given else None,
    }
    got = ops.permute_2D_sparse_preallocated_out(permute, lengths, values, weights, **outs)
    assert_same(got, want)


def test_preallocated_ignores_a_weights_output_without_weights():
    permute, lengths, values, _ = preallocated_case()
    got = ops.permute_2D_sparse_preallocated_out(
        permute, lengths, values, None, permuted_weights_out=torch.empty(3)
    )
    assert got[2] is None


@pytest.mark.parametrize("dtype", INDEX_DTYPES, ids=str)
def test_preallocated_matches_fbgemm(fbgemm_ops, dtype):
    permute, lengths, values, weights = preallocated_case(6, 4, dtype)
    want = ref_permute(permute, lengths, values, weights)
    for op in (fbgemm_ops, ops):
        outs = [torch.zeros_like(t) for t in want]
        op.permute_2D_sparse_preallocated_out(permute, lengths, values, weights, None, *outs)
        assert_same(outs, want)


@pytest.mark.parametrize(
    "name, out, match",
    [
        ("permuted_lengths_out", torch.empty(3, dtype=I64), "must hold at least"),
        ("permuted_lengths_out", torch.empty(15, dtype=I32), "must have dtype"),
        ("permuted_lengths_out", torch.empty(30, dtype=I64)[::2], "must be contiguous"),
        ("permuted_indices_out", torch.empty(0, dtype=I64), "must hold at least"),
        ("permuted_indices_out", torch.empty(100), "must have dtype"),
        ("permuted_weights_out", torch.empty(1), "must hold at least"),
        ("permuted_weights_out", torch.empty(100, dtype=torch.float64), "must have dtype"),
    ],
)
def test_preallocated_bad_outputs(name, out, match):
    permute = torch.tensor([1, 0, 2, 2, 4], dtype=I32)
    lengths = torch.ones(5, 3, dtype=I64)
    values, weights = torch.arange(15), torch.rand(15)
    with pytest.raises((RuntimeError, ValueError), match=name + " " + match):
        ops.permute_2D_sparse_preallocated_out(permute, lengths, values, weights, **{name: out})


def test_preallocated_output_may_not_overlap_an_input():
    permute = torch.tensor([1, 0], dtype=I32)
    lengths = torch.ones(2, 3, dtype=I64)
    values = torch.arange(6)
    with pytest.raises(RuntimeError, match="permuted_indices_out must not overlap values"):
        ops.permute_2D_sparse_preallocated_out(
            permute, lengths, values, None, permuted_indices_out=values
        )


def test_preallocated_opcheck():
    permute, lengths, values, weights = preallocated_case()
    want = ref_permute(permute, lengths, values, weights)
    outs = tuple(torch.empty_like(t) for t in want)
    # Not test_aot_dispatch_*: functionalization does not take a custom op whose outputs alias
    # its inputs (FBGEMM's schema says they do), so this op cannot be compiled with autograd.
    opcheck(
        ops.permute_2D_sparse_preallocated_out.default,
        (permute, lengths, values, weights, None, *outs),
        test_utils=("test_schema", "test_autograd_registration", "test_faketensor"),
    )


# --------------------------------------------------------------------------- expand
def ref_expand(permute, input_offset, output_offset):
    out = []
    for t, p in enumerate(permute.tolist()):
        start, n = int(input_offset[p]), int(output_offset[t + 1] - output_offset[t])
        out.extend(range(start, start + n))
    return torch.tensor(out, dtype=input_offset.dtype)


def expand_case(segments, perm_dtype, offset_dtype, max_length=5):
    lengths = torch.randint(0, max_length + 1, (segments,))
    permute = torch.randperm(segments)
    input_offset = torch.cat([torch.zeros(1, dtype=I64), lengths.cumsum(0)])
    output_offset = torch.cat([torch.zeros(1, dtype=I64), lengths[permute].cumsum(0)])
    return permute.to(perm_dtype), input_offset.to(offset_dtype), output_offset.to(offset_dtype)


@pytest.mark.parametrize("segments", [0, 1, 7, 300])
@pytest.mark.parametrize("perm_dtype", INDEX_DTYPES, ids=str)
@pytest.mark.parametrize("offset_dtype", INDEX_DTYPES, ids=str)
@pytest.mark.parametrize("threads", [1, 2])
def test_expand_matches_reference(segments, perm_dtype, offset_dtype, threads):
    permute, input_offset, output_offset = expand_case(segments, perm_dtype, offset_dtype)
    size = int(output_offset[-1])
    with num_threads(threads):
        got = ops.expand_into_jagged_permute(permute, input_offset, output_offset, size)
    assert got.dtype == offset_dtype
    torch.testing.assert_close(got, ref_expand(permute, input_offset, output_offset))


@pytest.mark.parametrize("segments", [1, 7, 300])
@pytest.mark.parametrize("dtype", INDEX_DTYPES, ids=str)
def test_expand_matches_fbgemm(fbgemm_ops, segments, dtype):
    permute, input_offset, output_offset = expand_case(segments, dtype, dtype)
    size = int(output_offset[-1])
    want = fbgemm_ops.expand_into_jagged_permute(permute, input_offset, output_offset, size)
    got = ops.expand_into_jagged_permute(permute, input_offset, output_offset, size)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_expand_output_lengths_need_not_match_input_lengths():
    """Each output segment counts up from its input segment's start, however long it is (as
    FBGEMM computes it); the input offsets need not be a cumulative sum either."""
    permute = torch.tensor([1, 0])
    input_offset = torch.tensor([10, -5, 0])
    output_offset = torch.tensor([0, 3, 4])
    got = ops.expand_into_jagged_permute(permute, input_offset, output_offset, 4)
    assert got.tolist() == [-5, -4, -3, 10]


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(permute=torch.tensor([0, 2])), r"permute entries must be in \[0, 2\)"),
        (dict(output_offset=torch.tensor([0, 3])), "must hold permute.numel\\(\\) \\+ 1 = 3"),
        (dict(output_offset=torch.tensor([0, 3, 2])), "output_offset must be non-decreasing"),
        (dict(output_offset=torch.tensor([-1, 3, 4])), r"output_offset must be >= 0"),
        (dict(output_size=3), r"output_offset must stay within \[0, output_size = 3\]"),
        (dict(output_size=-1), r"output_offset must stay within \[0, output_size = -1\]"),
        (dict(output_offset=torch.tensor([0, 3, 4], dtype=I32)), "must share one dtype"),
        (dict(permute=torch.tensor([1.0, 0.0])), "permute must be int32 or int64"),
        (
            dict(input_offset=torch.tensor([0, 2**31 - 2, 0], dtype=I32)),
            "segment 0 runs from input_offset\\[1\\] = 2147483646 for 3 entries",
        ),
    ],
)
def test_expand_bad_input(change, match):
    a = dict(
        permute=torch.tensor([1, 0]),
        input_offset=torch.tensor([0, 1, 4]),
        output_offset=torch.tensor([0, 3, 4]),
        output_size=4,
    )
    a = {**a, **change}
    if "input_offset" in change:
        a["output_offset"] = a["output_offset"].to(a["input_offset"].dtype)
    with pytest.raises((RuntimeError, ValueError), match=match):
        ops.expand_into_jagged_permute(**a)


def test_expand_opcheck():
    permute, input_offset, output_offset = expand_case(9, I32, I32)
    args = (permute, input_offset, output_offset, int(output_offset[-1]))
    opcheck(ops.expand_into_jagged_permute.default, args)


# --------------------------------------------------------------------------- torch.compile
def test_compile_fullgraph_dynamic():
    """The data-dependent output sizes come from the fake kernels' unbacked sizes."""
    torch._dynamo.reset()

    def fn(permute, lengths, indices, weights, stride, input_offset, output_offset):
        a = ops.permute_sparse_features(permute, lengths, indices, weights)
        b = ops.permute_2D_sparse_data_input1D(permute, lengths.flatten(), indices, stride)
        c = ops.expand_into_jagged_permute(
            permute, input_offset, output_offset, output_offset.shape[0] - 1
        )
        return a, b, c

    compiled = torch.compile(fn, fullgraph=True, dynamic=True, backend="aot_eager")
    for features, batch in ((4, 3), (6, 2)):
        permute, lengths, indices, weights = sparse_case(features, batch, I64)
        # Unit segments: output_size is the graph's own size of output_offset.
        input_offset = torch.arange(features + 1)
        args = (permute, lengths, indices, weights, batch, input_offset, input_offset)
        got, want = compiled(*args), fn(*args)
        assert_same(got[0], want[0])
        assert_same(got[1], want[1])
        torch.testing.assert_close(got[2], want[2], rtol=0, atol=0)
    torch._dynamo.reset()
