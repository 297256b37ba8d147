"""Bad input raises a Python exception naming the argument and the violated rule (docs/ops.md §1,
docs/design.md "Validation"), never a crash or a silent bad write.

Each case runs on torch.ops.recops and, when FBGEMM is hidden, on torch.ops.fbgemm (recops' own
definitions then). FBGEMM's own CPU kernels are not exercised here: on several of these inputs
they read or write out of bounds (garbage output or heap corruption) instead of raising.
The device test at the end covers every op (op_cases.CASES); test_bad_input_properties.py
mutates calls of every op at random.
"""

import re

import pytest
import torch
from op_cases import CASES

import recops

I32, I64 = torch.int32, torch.int64


def idx(values, dtype=I64):
    return torch.tensor(values, dtype=dtype)


@pytest.fixture(params=["recops", "fbgemm"])
def ops(request):
    if request.param == "fbgemm" and recops.fbgemm_loaded:
        pytest.skip("torch.ops.fbgemm is FBGEMM's own implementation in this configuration")
    return getattr(torch.ops, request.param)


# --------------------------------------------------------------------------- offsets
BAD_OFFSETS = [
    # (offsets, exception, match)
    (
        [idx([0, 3, 2, 5])],
        ValueError,
        r"offsets\[0\] must be non-decreasing.*\[1\] = 3 > .*\[2\] = 2",
    ),
    ([idx([-1, 2, 2, 5])], ValueError, r"offsets\[0\] must be >= 0.*= -1"),
    (
        [idx([0, 2, 2, 5]), idx([0, 1, 1])],
        RuntimeError,
        r"offsets\[1\] must have .* 6 entries, got 3",
    ),
    ([idx([0, 1, 2, 3]), idx([0, 2, 1, 3])], ValueError, r"offsets\[1\] must be non-decreasing"),
    ([idx([0, 1, 2, 3], I32), idx([0, 1, 2, 3], I64)], RuntimeError, r"must share one dtype"),
    ([torch.tensor([0.0, 2.0, 2.0, 5.0])], RuntimeError, r"offsets\[0\] must be int32 or int64"),
    ([idx([[0, 2], [2, 5]])], RuntimeError, r"offsets\[0\] must be 1-D"),
    ([idx([])], RuntimeError, r"offsets\[0\] must have at least one entry"),
    ([idx([0, 1, 2, 3])] * 6, RuntimeError, r"must hold 1 to 5 tensors .* got 6"),
    ([], RuntimeError, r"must hold 1 to 5 tensors .* got 0"),
]


@pytest.mark.parametrize("offsets, error, match", BAD_OFFSETS)
def test_jagged_to_padded_dense_bad_offsets(ops, offsets, error, match):
    values = torch.randn(100, 2)
    max_lengths = [2] * len(offsets)
    with pytest.raises(error, match=match):
        ops.jagged_to_padded_dense(values, offsets, max_lengths, 0.0)
    with pytest.raises(error, match=match):
        ops.jagged_to_padded_dense_forward(values, offsets, max_lengths, 0.0)


@pytest.mark.parametrize("offsets, error, match", BAD_OFFSETS)
def test_dense_to_jagged_bad_offsets(ops, offsets, error, match):
    dense = torch.randn(3, *([2] * len(offsets)), 2)
    match = match.replace("offsets", "x_offsets")
    with pytest.raises(error, match=match):
        ops.dense_to_jagged(dense, offsets)
    with pytest.raises(error, match=match):
        ops.dense_to_jagged_forward(dense, offsets, 100)


# The single-tensor cases: non-monotonic, negative, float, 2-D, empty.
@pytest.mark.parametrize("offsets, error, match", BAD_OFFSETS[:2] + BAD_OFFSETS[5:8])
def test_jagged_wrappers_bad_offsets(ops, offsets, error, match):
    with pytest.raises(error, match=match):
        ops.jagged_2d_to_dense(torch.randn(10, 2), offsets[0], 3)
    with pytest.raises(error, match=match):
        ops.jagged_1d_to_dense(torch.randn(10), offsets[0], 3, 0)
    with pytest.raises(error, match=match):
        ops.jagged_to_padded_dense_backward(torch.randn(3, 2, 2), offsets, 10)


# --------------------------------------------------------------------------- jagged <-> dense
def test_values_fewer_rows_than_offsets(ops):
    offsets = [idx([0, 2, 5])]
    match = r"values has 4 rows but offsets\[0\]\[-1\] = 5 rows are addressed"
    with pytest.raises(RuntimeError, match=match):
        ops.jagged_to_padded_dense(torch.randn(4, 2), offsets, [3], 0.0)
    with pytest.raises(RuntimeError, match=match):
        ops.jagged_2d_to_dense(torch.randn(4, 2), offsets[0], 3)
    with pytest.raises(RuntimeError, match=match):
        ops.jagged_1d_to_dense(torch.randn(4), offsets[0], 3, 0)
    match = r"values has 5 rows but offsets\[1\]\[-1\] = 6 rows are addressed"
    with pytest.raises(RuntimeError, match=match):
        ops.jagged_to_padded_dense(torch.randn(5), [idx([0, 1, 3]), idx([0, 2, 2, 6])], [2, 2])


def test_total_L(ops):
    dense = torch.randn(2, 3, 2)
    offsets = [idx([0, 2, 5])]
    for total_L in (-1, -100):
        with pytest.raises(ValueError, match=r"total_L must be >= 0, got -"):
            ops.dense_to_jagged(dense, offsets, total_L)
        with pytest.raises(ValueError, match=r"total_L must be >= 0"):
            ops.dense_to_jagged_forward(dense, offsets, total_L)
        with pytest.raises(ValueError, match=r"total_L must be >= 0"):
            ops.jagged_to_padded_dense_backward(dense, offsets, total_L)
    match = r"total_L = 4 is smaller than x_offsets\[0\]\[-1\] = 5"
    with pytest.raises(RuntimeError, match=match):
        ops.dense_to_jagged(dense, offsets, 4)
    with pytest.raises(RuntimeError, match=r"total_L = 0 is smaller than offsets\[0\]\[-1\] = 5"):
        ops.jagged_to_padded_dense_backward(dense, offsets, 0)


@pytest.mark.parametrize("index_dtype", [I32, I64], ids=str)
def test_rows_from_offsets_past_dense_extent(ops, index_dtype):
    """Without total_L the output has the last offset's rows, as FBGEMM's: rows of runs longer
    than the dense extent (truncated by jagged_to_padded_dense) come back zero, and no check
    rejects offsets FBGEMM accepts. Offsets that could read outside dense still raise."""
    dense = torch.randn(3, 2, 4)
    offsets = [idx([0, 1, 2, 7], index_dtype)]
    expected = torch.cat([dense[0, :1], dense[1, :1], dense[2], torch.zeros(3, 4)])
    for total_L in (None, 7):
        values, _ = ops.dense_to_jagged(dense, offsets, total_L)
        assert torch.equal(values, expected)
        assert torch.equal(ops.dense_to_jagged_forward(dense, offsets, total_L), expected)
    # A negative last offset is a negative size: FBGEMM's message.
    with pytest.raises(ValueError, match=r"must be >= 0"):
        ops.dense_to_jagged(torch.zeros(1, 4), [idx([-5, -1], index_dtype)])


def test_dense_batch_mismatch(ops):
    match = r"dense.size\(0\) = 4 must equal len\(x_offsets\[0\]\) - 1 = 2"
    with pytest.raises(RuntimeError, match=match):
        ops.dense_to_jagged(torch.randn(4, 3, 2), [idx([0, 2, 5])])
    match = r"grad_output.size\(0\) = 1 must equal len\(offsets\[0\]\) - 1 = 2"
    with pytest.raises(RuntimeError, match=match):
        ops.jagged_to_padded_dense_backward(torch.randn(1, 3, 2), [idx([0, 2, 5])], 5)


def test_dense_too_few_dims(ops):
    offsets = [idx([0, 1, 2]), idx([0, 1, 2])]
    with pytest.raises(
        RuntimeError, match=r"dense must have at least 3 dims .* got shape \[2, 3\]"
    ):
        ops.dense_to_jagged(torch.randn(2, 3), offsets)


def test_max_lengths(ops):
    offsets = [idx([0, 2, 5])]
    with pytest.raises(RuntimeError, match=r"max_lengths must have one entry per jagged dim \(1\)"):
        ops.jagged_to_padded_dense(torch.randn(5, 2), offsets, [3, 3], 0.0)
    with pytest.raises(ValueError, match=r"max_lengths\[0\] must be >= 0, got -1"):
        ops.jagged_to_padded_dense(torch.randn(5, 2), offsets, [-1], 0.0)
    with pytest.raises(ValueError, match=r"max_sequence_length must be >= 0, got -2"):
        ops.jagged_2d_to_dense(torch.randn(5, 2), offsets[0], -2)


def test_wrapper_value_ranks(ops):
    offsets = idx([0, 2, 5])
    with pytest.raises(RuntimeError, match=r"values must be 2-D, got shape \[5\]"):
        ops.jagged_2d_to_dense(torch.randn(5), offsets, 3)
    with pytest.raises(RuntimeError, match=r"values must be 1-D, got shape \[5, 2\]"):
        ops.jagged_1d_to_dense(torch.randn(5, 2), offsets, 3, 0)
    with pytest.raises(RuntimeError, match=r"values must be at least 1-D"):
        ops.jagged_to_padded_dense(torch.tensor(1.0), [offsets], [3], 0.0)


# --------------------------------------------------------------------------- cumsum
@pytest.mark.parametrize(
    "name",
    [
        "asynchronous_complete_cumsum",
        "asynchronous_exclusive_cumsum",
        "asynchronous_inclusive_cumsum",
    ],
)
def test_cumsum_bad_input(ops, name):
    op = getattr(ops, name)
    if name == "asynchronous_complete_cumsum":
        with pytest.raises(
            RuntimeError, match=r"t_in must be 1-D \[N\] or 2-D \[B, N\], got shape"
        ):
            op(torch.ones(2, 3, 4, dtype=I64))
        with pytest.raises(RuntimeError, match=r"t_in must be 1-D \[N\] or 2-D"):
            op(torch.tensor(3))
    with pytest.raises(
        RuntimeError, match=r"t_in must be an integer .* or floating tensor, got Bool"
    ):
        op(torch.ones(3, dtype=torch.bool))


# --------------------------------------------------------------------------- permute
PERMUTE_OPS = ["permute_1D_sparse_data", "permute_2D_sparse_data"]


def permute_input(op_name):
    lengths = idx([[1, 2], [0, 3], [2, 0]])  # T = 3 features, B = 2, 8 values
    if op_name == "permute_1D_sparse_data":
        lengths = lengths[:, 0].contiguous()  # 3 segments, 3 values
    return lengths, int(lengths.sum())


@pytest.mark.parametrize("op_name", PERMUTE_OPS)
@pytest.mark.parametrize(
    "permute, match",
    [
        (idx([0, 3, 1], I32), r"permute entries must be in \[0, 3\), got permute\[1\] = 3"),
        (idx([0, 1, -1], I32), r"permute entries must be in \[0, 3\), got permute\[2\] = -1"),
        (idx([7], I64), r"permute entries must be in \[0, 3\), got permute\[0\] = 7"),
    ],
)
def test_permute_out_of_range(ops, op_name, permute, match):
    lengths, total = permute_input(op_name)
    with pytest.raises(ValueError, match=match):
        getattr(ops, op_name)(permute, lengths, torch.arange(total), None)


@pytest.mark.parametrize("op_name", PERMUTE_OPS)
def test_permuted_lengths_sum(ops, op_name):
    op = getattr(ops, op_name)
    lengths, total = permute_input(op_name)
    permute = idx([2, 0, 1], I32)
    values, weights = torch.arange(total), torch.randn(total)
    with pytest.raises(ValueError, match=r"permuted_lengths_sum must be >= 0, got -1"):
        op(permute, lengths, values, weights, -1)
    for wrong in (total - 1, total + 1, 0):
        match = rf"permuted_lengths_sum = {wrong} does not match .* permuted lengths, {total}"
        with pytest.raises(RuntimeError, match=match):
            op(permute, lengths, values, weights, wrong)


@pytest.mark.parametrize("op_name", PERMUTE_OPS)
def test_permute_bad_lengths(ops, op_name):
    op = getattr(ops, op_name)
    lengths, total = permute_input(op_name)
    permute = idx([2, 0, 1], I32)
    negative = lengths.clone()
    negative.view(-1)[2] = -1
    with pytest.raises(
        ValueError, match=r"lengths must be >= 0, got lengths.flatten\(\)\[2\] = -1"
    ):
        op(permute, negative, torch.arange(total), None)
    with pytest.raises(RuntimeError, match=r"lengths must be int32 or int64, got Float"):
        op(permute, lengths.float(), torch.arange(total), None)
    with pytest.raises(
        RuntimeError, match=rf"values has {total - 1} rows but lengths sum to {total}"
    ):
        op(permute, lengths, torch.arange(total - 1), None)
    with pytest.raises(RuntimeError, match=rf"weights has 0 rows but lengths sum to {total}"):
        op(permute, lengths, torch.arange(total), torch.zeros(0))
    with pytest.raises(RuntimeError, match=r"values must be at least 1-D"):
        op(idx([], I32), lengths, torch.tensor(1.0), None)


def test_permute_wrong_ranks(ops):
    lengths_2d, total = permute_input("permute_2D_sparse_data")
    lengths_1d = lengths_2d.flatten()
    permute = idx([2, 0, 1], I32)
    with pytest.raises(RuntimeError, match=r"lengths must be 2-D, got shape \[6\]"):
        ops.permute_2D_sparse_data(permute, lengths_1d, torch.arange(total), None)
    with pytest.raises(RuntimeError, match=r"permute must be 1-D, got shape \[1, 3\]"):
        ops.permute_2D_sparse_data(permute[None], lengths_2d, torch.arange(total), None)
    with pytest.raises(RuntimeError, match=r"permute must be int32 or int64, got Float"):
        ops.permute_2D_sparse_data(permute.float(), lengths_2d, torch.arange(total), None)


@pytest.mark.parametrize(
    "permute, error, match",
    [
        (idx([0, 2, 0], I32), ValueError, r"permute must be a permutation, but 0 appears twice"),
        (idx([1, 1], I64), ValueError, r"1 appears twice \(again at permute\[1\]\)"),
        (idx([0, 3, 1], I32), ValueError, r"permute entries must be in \[0, 3\), got permute\[1\]"),
        (idx([-1], I64), ValueError, r"permute entries must be in \[0, 1\), got permute\[0\] = -1"),
        (idx([[0, 1]], I32), RuntimeError, r"permute must be 1-D"),
        (torch.tensor([0.0]), RuntimeError, r"permute must be int32 or int64"),
    ],
)
def test_invert_permute_bad_input(ops, permute, error, match):
    with pytest.raises(error, match=match):
        ops.invert_permute(permute)


def test_permute_backward_needs_a_permutation():
    # Autograd is defined for true permutations only; with repeats the backward raises.
    lengths, total = permute_input("permute_2D_sparse_data")
    values = torch.randn(total, requires_grad=True)
    _, out, _ = torch.ops.recops.permute_2D_sparse_data(idx([0, 0, 1], I32), lengths, values, None)
    with pytest.raises(ValueError, match=r"permute must be a permutation"):
        out.sum().backward()


# --------------------------------------------------------------------------- offsets_range
def test_offsets_range_bad_input(ops):
    with pytest.raises(RuntimeError, match=r"offsets\[-1\] = 5 must be <= range_size = 4"):
        ops.offsets_range(idx([0, 2, 5]), 4)
    with pytest.raises(ValueError, match=r"range_size must be >= 0, got -1"):
        ops.offsets_range(idx([0]), -1)
    with pytest.raises(ValueError, match=r"offsets must be non-decreasing"):
        ops.offsets_range(idx([0, 3, 2]), 6)
    with pytest.raises(ValueError, match=r"offsets must be >= 0, got offsets\[0\] = -2"):
        ops.offsets_range(idx([-2, 3], I32), 6)
    with pytest.raises(RuntimeError, match=r"offsets must be 1-D"):
        ops.offsets_range(idx([[0, 3]]), 6)
    with pytest.raises(RuntimeError, match=r"offsets must be int32 or int64"):
        ops.offsets_range(torch.tensor([0.0, 3.0]), 6)


# --------------------------------------------------------------------------- fuzz findings
@pytest.mark.parametrize(
    "bucket_index",
    [
        torch.tensor([[[0, 1, 2], [3, 4, -1], [0, 0, 0]]]),  # negative, in the padding rows
        torch.tensor([[[0, 1, 2], [3, 4, 5], [0, 0, 9]]]),  # num_buckets + 1
        torch.full((1, 3, 3), 255, dtype=torch.uint8),
    ],
    ids=["negative", "too_large", "uint8_255"],
)
def test_bias_backward_bucket_index_out_of_range(bucket_index):
    """Every entry of a given bucket index names a bucket of the [num_buckets + 1] table, padding
    positions included (the kernel reads only the valid ones; seq_offsets [0, 1] leaves one)."""
    grad = torch.randn(1, 3, 3)
    for seq_offsets in (None, idx([0, 1])):
        with pytest.raises(ValueError, match=r"bucket_index entries must be in \[0, num_buckets\]"):
            torch.ops.recops.relative_attn_bias_backward(grad, None, bucket_index, seq_offsets, 8)


def test_bias_backward_offsets_past_2_to_the_32_do_not_wrap():
    """Offsets are read in int64: a sequence 2^32 + 1 long is cut at N, as every longer sequence,
    never read as 1 long."""
    grad, index = torch.randn(1, 3, 3), torch.randint(0, 9, (1, 3, 3))

    def grads(offsets):
        backward = torch.ops.recops.relative_attn_bias_backward
        return backward(grad, None, index, idx(offsets), 8, pos_grad=True)

    for ours, full in zip(grads([0, 2**32 + 1]), grads([0, 3]), strict=True):
        assert torch.equal(ours, full)
    for ours, one in zip(grads([2**32, 2**32 + 1]), grads([0, 1]), strict=True):
        assert torch.equal(ours, one)


def test_hstu_wrapper_custom_mask_is_never_ignored():
    q = k = v = torch.randn(5, 1, 4)
    offsets, mask = idx([0, 2, 5]), torch.rand(2, 1, 3, 3) < 0.5
    for attention in (recops.hstu_attention, recops.fuxi_attention):
        with pytest.raises(RuntimeError, match=r"custom_mask contradicts mask_type 'causal'"):
            attention(q, k, v, offsets, 3, custom_mask=mask)
        with pytest.raises(RuntimeError, match=r"custom_mask contradicts mask_type 'none'"):
            attention(q, k, v, offsets, 3, mask="none", custom_mask=mask)
        with pytest.raises(ValueError, match=r"pass the custom mask once"):
            attention(q, k, v, offsets, 3, mask=mask, custom_mask=mask)
        # The op's own names, used consistently, mean mask=<tensor>.
        by_name = attention(q, k, v, offsets, 3, mask_type="custom", custom_mask=mask)
        assert torch.equal(by_name, attention(q, k, v, offsets, 3, mask=mask))


@pytest.mark.parametrize("shape", [(1, 2, 3), (1, 1, 3), (1, 3, 1), (1, 3, 4)])
def test_fuxi_channel_bias_must_be_n_by_n(shape):
    q = k = v = torch.randn(5, 1, 4)
    for name in ("pos_bias", "ts_bias"):
        match = rf"{name} must be 3-D \[.*N, N\], got .* \(N = max_seq_len = 3\)"
        with pytest.raises(RuntimeError, match=match):
            recops.fuxi_attention(q, k, v, idx([0, 2, 5]), 3, **{name: torch.randn(shape)})


# --------------------------------------------------------------------------- devices
def tensor_arguments(args):
    """(label, name, index) of every tensor of a call; index is None outside tensor lists."""
    for name, value in args.items():
        if isinstance(value, torch.Tensor):
            yield name, name, None
        elif isinstance(value, list | tuple):
            for i, item in enumerate(value):
                if isinstance(item, torch.Tensor):
                    yield f"{name}[{i}]", name, i


def on_meta(args, name, index):
    if index is None:
        return {**args, name: args[name].to("meta")}
    items = list(args[name])
    items[index] = items[index].to("meta")
    return {**args, name: items}


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.op_name)
def test_one_tensor_on_another_device(case):
    """One input on the meta device and the rest on CPU dispatches to the fake kernel, which used
    to return an uninitialised CPU tensor; every op's fake kernel checks its tensors share one
    device and names the one that differs (the CPU kernels check each tensor is on CPU)."""
    args = case.call(1)
    tensors = list(tensor_arguments(args))
    if len(tensors) < 2:
        pytest.skip("one tensor argument: nothing to mix")
    for label, name, index in tensors:
        both = rf"(?=.*(?<![\w\[]){re.escape(label)}(?![\w\[]))(?=.* is on meta)"
        with pytest.raises(RuntimeError, match=both):
            case.op(**on_meta(args, name, index))
