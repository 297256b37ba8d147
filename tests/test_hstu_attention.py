"""HSTU attention (docs/ops.md section 4): torch.ops.recops.hstu_dense_forward / hstu_dense_backward
through recops.hstu_attention, against the float64 plain-PyTorch reference in hstu_reference.py.

Every comparison feeds both sides the same values (inputs are rounded to the tested dtype first,
the reference then runs in float64), so the tolerances only cover the kernel's fp32 accumulation
and the final rounding to the output dtype.
"""

import math

import pytest
import torch
from accuracy import assert_close as check_close
from hstu_reference import hstu_mask, hstu_reference, relative_bias, time_buckets
from threads import num_threads
from torch.autograd import gradcheck
from torch.library import opcheck

import recops

ops = torch.ops.recops
F64 = torch.float64
DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]


# --------------------------------------------------------------------------- helpers
def offsets_of(lengths):
    lengths = torch.as_tensor(lengths, dtype=torch.int64)
    return torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])


def jagged_qkv(lengths, heads=2, dqk=16, dv=16):
    rows = int(sum(lengths))
    return {
        "q": torch.randn(rows, heads, dqk, dtype=F64),
        "k": torch.randn(rows, heads, dqk, dtype=F64),
        "v": torch.randn(rows, heads, dv, dtype=F64),
    }


def assert_close(actual, expected, dtype, what):
    """Within TOLERANCE[dtype], atol a fraction of the reference's largest magnitude."""
    assert actual.shape == expected.shape, what
    check_close(
        actual, expected, dtype, relative_to_max=True, msg=lambda m: f"{what} ({dtype}): {m}"
    )


def reference(q, k, v, seq_offsets=None, max_seq_len=None, *, lengths=None, **options):
    """hstu_reference for both layouts: the dense [B, N, H, D] one is flattened to rows."""
    if q.dim() == 3:
        return hstu_reference(q, k, v, seq_offsets, max_seq_len, lengths=lengths, **options)
    batch, n, heads = q.shape[:3]
    if lengths is None:
        lengths = torch.full((batch,), n, dtype=torch.int64)
    flat = [t.reshape(batch * n, heads, t.shape[3]) for t in (q, k, v)]
    out = hstu_reference(
        *flat,
        offsets_of([n] * batch),
        n if max_seq_len is None else max_seq_len,
        lengths=lengths,
        **options,
    )
    return out.reshape(batch, n, heads, v.shape[3])


def compare(tensors, dtype=torch.float32, *, grads=True, **options):
    """Runs recops.hstu_attention in `dtype` and the float64 reference on the same values,
    forward and (if grads) backward, and compares the output and the gradient of every tensor
    in `tensors` (q, k, v and optionally attn_bias, ts_w, pos_w). Returns recops' leaves/output."""
    master = {name: t.to(dtype).to(F64) for name, t in tensors.items()}
    ref_in = {name: t.clone().requires_grad_(grads) for name, t in master.items()}
    got_in = {name: t.to(dtype).requires_grad_(grads) for name, t in master.items()}
    ref_options, got_options = dict(options), dict(options)
    mask = options.get("mask")
    if isinstance(mask, torch.Tensor) and mask.is_floating_point():
        got_options["mask"] = mask.to(dtype)
        ref_options["mask"] = mask.to(dtype).to(F64)
    ref = reference(**ref_in, **ref_options)
    got = recops.hstu_attention(**got_in, **got_options)
    assert got.dtype == dtype
    assert_close(got, ref, dtype, "output")
    if grads:
        grad_out = torch.randn_like(ref).to(dtype)
        if ref.requires_grad:  # not when every sequence is empty
            ref.backward(grad_out.to(F64))
        got.backward(grad_out)
        for name in tensors:
            grad, expected = got_in[name].grad, ref_in[name].grad
            assert grad is not None and grad.dtype == dtype, name
            expected = torch.zeros_like(master[name]) if expected is None else expected
            assert_close(grad, expected, dtype, f"grad of {name}")
    return got_in, got


def dense_bias(shape):
    return torch.randn(shape, dtype=F64)


def sizes(code, batch, heads, n):
    """A shape spelt with B, H, N and 1, e.g. "B1NN" -> [batch, 1, n, n]."""
    return [{"B": batch, "H": heads, "N": n, "1": 1}[c] for c in code]


def relative_tables(max_seq_len, num_buckets=128):
    return {
        "ts_w": torch.randn(num_buckets + 1, dtype=F64),
        "pos_w": torch.randn(2 * max_seq_len - 1, dtype=F64),
    }


# Lengths 0, 1, odd, exactly max_seq_len, and long enough that several 64-row query blocks,
# windows, context and target groups cross block boundaries.
LENGTHS = [5, 0, 1, 130, 67, 200, 64, 129]
MAX_LEN = 200
TARGETS = [2, 0, 1, 9, 67, 70, 0, 64]  # 67 of 67 and 64 of 64: a sequence of only targets

MASKS = {
    "causal": {},
    "context": dict(contextual_seq_len=3),
    "context_past_blocks": dict(contextual_seq_len=70),
    "targets": dict(num_targets=TARGETS),
    "target_groups": dict(num_targets=TARGETS, target_group_size=3),
    "target_groups_context": dict(num_targets=TARGETS, target_group_size=8, contextual_seq_len=5),
    "window": dict(max_attn_len=5),
    "window_past_blocks": dict(max_attn_len=80),
    "context_targets_window": dict(contextual_seq_len=4, num_targets=TARGETS, max_attn_len=10),
    "all_long": dict(
        contextual_seq_len=70, num_targets=TARGETS, target_group_size=4, max_attn_len=70
    ),
    "none": dict(mask="none"),
    "none_window": dict(mask="none", max_attn_len=7),
    "none_window_past_blocks": dict(mask="none", max_attn_len=70),
    "none_context": dict(mask="none", contextual_seq_len=3),
    "none_targets_groups": dict(mask="none", num_targets=TARGETS, target_group_size=3),
    "none_context_targets_window": dict(
        mask="none", contextual_seq_len=4, num_targets=TARGETS, max_attn_len=10
    ),
}


def mask_options(name):
    options = dict(MASKS[name])
    if "num_targets" in options:
        options["num_targets"] = torch.tensor(options["num_targets"])
    return options


# --------------------------------------------------------------------------- the reference itself
def genrec_valid_mask(n, causal, num_targets, max_attn_len, contextual_seq_len):
    """generative-recommenders' _get_valid_attn_mask for one sequence, transcribed with its
    branches (no target groups); an independent check of hstu_reference.hstu_mask."""
    ids = torch.arange(n).view(1, n)
    max_ids = torch.tensor(n).view(1, 1)
    if contextual_seq_len > 0:
        ids = torch.clamp(ids - contextual_seq_len + 1, min=0)
        max_ids = max_ids - contextual_seq_len + 1
    if num_targets is not None:
        max_ids = max_ids - num_targets
        ids = torch.minimum(ids, max_ids)
    row_ids, col_ids = ids.view(n, 1).expand(n, n), ids.view(1, n).expand(n, n)
    dist = row_ids - col_ids
    if not causal:
        dist = torch.where(dist > 0, dist, -dist)
    valid = torch.eye(n, dtype=torch.bool) | (dist > 0)
    if max_attn_len > 0:
        valid &= dist <= max_attn_len
    if contextual_seq_len > 0:
        valid |= (row_ids == 0) & (col_ids < max_ids)
    return valid


@pytest.mark.parametrize("causal", [True, False])
def test_reference_mask_matches_generative_recommenders(causal):
    for n in (0, 1, 2, 7, 20):
        for c in (0, 1, 3):
            for t in sorted({0, 1, 4, n}):
                for w in (0, 1, 3):
                    if t > n:
                        continue
                    expected = genrec_valid_mask(n, causal, t if t else None, w, c)
                    got = hstu_mask(n, c, t, 1, w, causal=causal)
                    assert torch.equal(got, expected), (n, c, t, w)


def test_reference_mask_by_hand():
    # n = 5, c = 2 (ids 0, 0), one history item (id 1), t = 2 targets (ids top = 2).
    expected = torch.tensor(
        [[1, 1, 1, 0, 0], [1, 1, 1, 0, 0], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 0, 1]],
        dtype=torch.bool,
    )
    assert torch.equal(hstu_mask(5, contextual_seq_len=2, num_targets=2), expected)
    # Three targets in groups of 2 ({2, 3}, {4}): target 3 also sees target 2, not the reverse.
    expected = torch.tensor(
        [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 0, 0, 1]],
        dtype=torch.bool,
    )
    assert torch.equal(hstu_mask(5, num_targets=3, target_group_size=2), expected)
    # Causal window of 2 and its two-sided version.
    causal = (
        torch.tril(torch.ones(5, 5, dtype=torch.bool)) & ~torch.tril(torch.ones(5, 5), -3).bool()
    )
    assert torch.equal(hstu_mask(5, max_attn_len=2), causal)
    assert torch.equal(hstu_mask(5, max_attn_len=2, causal=False), causal | causal.T)


def test_reference_time_buckets():
    ts = torch.tensor([0, 0, 1, 2, 10**6, -(10**6), 4 * 10**18])
    got = time_buckets(torch.zeros(1, dtype=torch.int64), ts, 0.301, 128)[0]
    # floor(ln(max(|dt|, 1)) / 0.301): |dt| = 0 and 1 give 0, 2 gives 2, 1e6 gives 45, a huge
    # |dt| clamps to the last bucket.
    assert got.tolist() == [0, 0, 0, 2, 45, 45, 128]
    # Query time shift: query i uses the next item's time, the last one its own.
    ts = torch.tensor([0, 10, 1000])
    ts_w, pos_w = torch.arange(129.0), torch.zeros(5)
    shifted = relative_bias(ts, ts_w, pos_w, 3)
    assert shifted[0].tolist() == time_buckets(ts[1:2], ts)[0].float().tolist()
    assert shifted[2].tolist() == time_buckets(ts[2:3], ts)[0].float().tolist()
    plain = relative_bias(ts, ts_w, pos_w, 3, query_time_shift=False)
    assert torch.equal(torch.diagonal(plain), torch.zeros(3))
    pos = relative_bias(ts, torch.zeros(129), torch.arange(5.0), 3)
    assert pos.tolist() == [[2, 3, 4], [1, 2, 3], [0, 1, 2]]  # pos_w[N - 1 + j - i]


# --------------------------------------------------------------------------- masks
@pytest.mark.parametrize("mask", list(MASKS))
def test_masks(mask):
    compare(
        jagged_qkv(LENGTHS),
        seq_offsets=offsets_of(LENGTHS),
        max_seq_len=MAX_LEN,
        alpha=0.7,
        **mask_options(mask),
    )


@pytest.mark.parametrize("mask", ["causal", "context_targets_window", "none_window_past_blocks"])
def test_masks_with_relative_bias(mask):
    """The fused bias indexes its tables at the first key a block can see (key ranges shrink under
    windows and context), so it is checked under masks that move that first key."""
    compare(
        {**jagged_qkv(LENGTHS), **relative_tables(MAX_LEN)},
        seq_offsets=offsets_of(LENGTHS),
        max_seq_len=MAX_LEN,
        timestamps=torch.randint(0, 10**7, (sum(LENGTHS),)).sort().values,
        **mask_options(mask),
    )


@pytest.mark.parametrize("dtype", [torch.bool, torch.float32], ids=str)
@pytest.mark.parametrize("shape", ["B1NN", "1HNN", "BHNN", "11NN"])
def test_custom_mask(dtype, shape):
    lengths, n, heads = [70, 0, 1, 33, 64], 70, 3
    size = sizes(shape, len(lengths), heads, n)
    if dtype == torch.bool:
        mask = torch.rand(size) < 0.6
    else:
        mask = torch.rand(size, dtype=F64) * (torch.rand(size) < 0.7)  # zeros and weights
    compare(
        {**jagged_qkv(lengths, heads), "attn_bias": dense_bias([1, heads, n, n])},
        seq_offsets=offsets_of(lengths),
        max_seq_len=n,
        mask=mask,
    )


def test_custom_mask_equals_structured_mask():
    """A custom mask equal to the structured one gives the same result (bitwise in float64)."""
    lengths, n = [40, 7, 0], 40
    targets = torch.tensor([5, 2, 0])
    options = dict(contextual_seq_len=2, num_targets=targets, max_attn_len=9)
    mask = torch.zeros(len(lengths), 1, n, n, dtype=torch.bool)
    for b, length in enumerate(lengths):
        mask[b, 0, :length, :length] = hstu_mask(length, 2, int(targets[b]), 1, 9)
    qkv = jagged_qkv(lengths)
    structured = recops.hstu_attention(
        **qkv, seq_offsets=offsets_of(lengths), max_seq_len=n, **options
    )
    custom = recops.hstu_attention(**qkv, seq_offsets=offsets_of(lengths), max_seq_len=n, mask=mask)
    torch.testing.assert_close(custom, structured, rtol=1e-12, atol=1e-14)


# --------------------------------------------------------------------------- dtypes and shapes
@pytest.mark.parametrize("bias", ["none", "dense", "relative"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dtypes(dtype, bias):
    lengths, n = [0, 1, 7, 90, 130], 130
    tensors = jagged_qkv(lengths, heads=2, dqk=24, dv=16)
    options = dict(seq_offsets=offsets_of(lengths), max_seq_len=n, **mask_options("all_long"))
    options["num_targets"] = torch.tensor([0, 1, 3, 20, 9])
    if bias == "dense":
        tensors["attn_bias"] = dense_bias([len(lengths), 1, n, n])
    elif bias == "relative":
        tensors.update(relative_tables(n))
        options["timestamps"] = torch.randint(0, 10**6, (sum(lengths),)).sort().values
    compare(tensors, dtype, **options)


@pytest.mark.parametrize("heads", [1, 2, 3, 4])
@pytest.mark.parametrize("dqk, dv", [(16, 16), (5, 7), (24, 40), (32, 8), (1, 3)])
def test_head_counts_and_dims(heads, dqk, dv):
    lengths = [33, 0, 100, 1, 64]
    compare(
        {**jagged_qkv(lengths, heads, dqk, dv), "attn_bias": dense_bias([1, heads, 100, 100])},
        seq_offsets=offsets_of(lengths),
        max_seq_len=100,
        silu_scale=0.05,
        num_targets=torch.tensor([3, 0, 10, 1, 0]),
    )


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("lengths, max_len", [([], 0), ([], 8), ([0, 0, 0], 8), ([1], 1)])
def test_empty_and_tiny(lengths, max_len, dtype):
    """B = 0, only empty sequences, one sequence of one item: shapes right, gradients zero."""
    tensors = {**jagged_qkv(lengths, 3, 5, 4), "attn_bias": dense_bias([max_len, max_len])}
    got_in, got = compare(
        tensors,
        dtype,
        seq_offsets=offsets_of(lengths),
        max_seq_len=max_len,
        num_targets=torch.tensor(lengths, dtype=torch.int64),
    )
    assert got.shape == (sum(lengths), 3, 4)
    if sum(lengths) == 0:
        assert torch.count_nonzero(got_in["attn_bias"].grad) == 0


def test_empty_batch_relative_bias_and_dense_layout():
    q = torch.randn(0, 9, 2, 4, requires_grad=True)
    out = recops.hstu_attention(q, q, q, lengths=torch.zeros(0, dtype=torch.int64))
    assert out.shape == (0, 9, 2, 4)
    out.sum().backward()
    assert q.grad.shape == q.shape
    tables = {n: t.float().requires_grad_() for n, t in relative_tables(9).items()}
    empty = torch.zeros(0, 2, 4, requires_grad=True)
    out = recops.hstu_attention(
        empty, empty, empty, offsets_of([]), 9, timestamps=torch.zeros(0, 9), **tables
    )
    out.sum().backward()
    assert out.shape == (0, 2, 4)
    for t in tables.values():
        assert torch.count_nonzero(t.grad) == 0


# --------------------------------------------------------------------------- layouts
def test_non_contiguous_inputs():
    """q, k, v sliced from one packed projection (strided rows and heads), a transposed bias."""
    lengths, heads, dqk, dv, n = [50, 0, 70, 3], 2, 12, 20, 70
    rows = sum(lengths)
    packed = torch.randn(rows, heads, 2 * dqk + dv, dtype=torch.float32)
    q, k, v = packed.split([dqk, dqk, dv], dim=-1)
    bias = torch.randn(heads, n, n).transpose(1, 2)
    assert not (q.is_contiguous() or k.is_contiguous() or v.is_contiguous())
    options = dict(seq_offsets=offsets_of(lengths), max_seq_len=n, contextual_seq_len=2)
    compare({"q": q, "k": k, "v": v, "attn_bias": bias}, **options)
    # Same numbers as the contiguous copies, through autograd too.
    packed.requires_grad_()
    q, k, v = packed.split([dqk, dqk, dv], dim=-1)
    out = recops.hstu_attention(q, k, v, attn_bias=bias, **options)
    expected = recops.hstu_attention(
        q.contiguous(), k.contiguous(), v.contiguous(), attn_bias=bias.contiguous(), **options
    )
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    out.sum().backward()
    assert packed.grad.shape == packed.shape
    # Heads-first storage ([H, L, D] transposed to [L, H, D]) too.
    q, k, v = (torch.randn(heads, rows, d).transpose(0, 1) for d in (dqk, dqk, dv))
    compare({"q": q, "k": k, "v": v}, **options)


@pytest.mark.parametrize("op", ["hstu", "fuxi"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_projection_slices_read_in_place(op, dtype):
    """q, k, v as an HSTU layer makes them: column slices of one projection [L, U | V | Q | K],
    viewed as [L, H, D] (rows contiguous, far apart). The kernels read them in place; outputs
    and every gradient equal those from contiguous copies exactly."""
    lengths, heads, dqk, dv, n = [50, 0, 70, 3], 2, 12, 20, 70
    rows = sum(lengths)
    widths = [heads * dv, heads * dv, heads * dqk, heads * dqk]  # u, v, q, k
    projection = torch.randn(rows, sum(widths)).to(dtype)
    timestamps = torch.randint(0, 10**6, (len(lengths), n)).sort(dim=1).values
    options = dict(seq_offsets=offsets_of(lengths), max_seq_len=n, timestamps=timestamps)
    attention = recops.hstu_attention if op == "hstu" else recops.fuxi_attention
    ts_w, pos_w = (0.1 * t.to(dtype) for t in relative_tables(n).values())

    def run(in_place):
        leaf = projection.clone().requires_grad_()
        _, v, q, k = leaf.split(widths, dim=1)
        q, k, v = q.view(rows, heads, dqk), k.view(rows, heads, dqk), v.view(rows, heads, dv)
        if not in_place:
            q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        else:
            assert not q.is_contiguous() and q.stride(0) == sum(widths)
        out = attention(q, k, v, ts_w=ts_w, pos_w=pos_w, **options)
        out.backward(torch.ones_like(out))
        return out, leaf.grad

    for got, want in zip(run(in_place=True), run(in_place=False), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("rows", [1, 5])
def test_rows_closer_than_their_width(rows):
    """Broadcast rows (row stride 0) and a single row of any stride: the same as contiguous."""
    row = torch.randn(2, 8)
    q = row.unsqueeze(0).expand(rows, 2, 8)
    single = torch.as_strided(torch.randn(16), (1, 2, 8), (0, 8, 1))
    for t, n in ((q, rows), (single, 1)):
        offsets = torch.tensor([0, n])
        out = recops.hstu_attention(t, t, t, offsets, n)
        expected = recops.hstu_attention(*(t.contiguous() for _ in range(3)), offsets, n)
        torch.testing.assert_close(out, expected, rtol=0, atol=0)


@pytest.mark.parametrize("with_lengths", [False, True])
@pytest.mark.parametrize("bias", ["none", "dense", "relative"])
def test_dense_layout(with_lengths, bias):
    batch, n, heads, dqk, dv = 4, 70, 2, 16, 8
    tensors = {
        "q": torch.randn(batch, n, heads, dqk, dtype=F64),
        "k": torch.randn(batch, n, heads, dqk, dtype=F64),
        "v": torch.randn(batch, n, heads, dv, dtype=F64),
    }
    lengths = torch.tensor([70, 0, 33, 1]) if with_lengths else None
    options = dict(lengths=lengths, num_targets=torch.tensor([4, 0, 2, 1]), contextual_seq_len=2)
    if bias == "dense":
        tensors["attn_bias"] = dense_bias([batch, 1, n, n])
    elif bias == "relative":
        tensors.update(relative_tables(n))
        options["timestamps"] = torch.randint(0, 10**6, (batch, n)).sort(dim=1).values
    got_in, got = compare(tensors, **options)
    assert got.shape == (batch, n, heads, dv)
    if with_lengths:
        for b, length in enumerate(lengths.tolist()):
            assert torch.count_nonzero(got[b, length:]) == 0
            for name in ("q", "k", "v"):
                assert torch.count_nonzero(got_in[name].grad[b, length:]) == 0, name


def test_dense_layout_ignores_padding_values():
    """Keys beyond a sequence's length never contribute, even when the padding holds NaN."""
    batch, n, heads, d = 3, 70, 2, 8
    lengths = torch.tensor([5, 70, 0])
    q, k, v = (torch.randn(batch, n, heads, d) for _ in range(3))
    expected = recops.hstu_attention(q, k, v, lengths=lengths)
    for t in (q, k, v):
        for b, length in enumerate(lengths.tolist()):
            t[b, length:] = float("nan")
    got = recops.hstu_attention(q, k, v, lengths=lengths)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_jagged_lengths_leave_gaps():
    """Jagged layout with explicit lengths shorter than the offsets' spans: rows in the gaps get
    zero output and zero gradients."""
    offsets, lengths = offsets_of([10, 80, 3]), torch.tensor([4, 80, 0])
    tensors = jagged_qkv([10, 80, 3])
    got_in, got = compare(tensors, seq_offsets=offsets, max_seq_len=80, lengths=lengths)
    gaps = torch.cat([torch.arange(4, 10), torch.arange(90, 93)])
    assert torch.count_nonzero(got[gaps]) == 0
    for name in ("q", "k", "v"):
        assert torch.count_nonzero(got_in[name].grad[gaps]) == 0


# --------------------------------------------------------------------------- biases
BIAS_SHAPES = ["NN", "11NN", "B1NN", "1HNN", "BHNN", "1NN", "H1N", "B11N"]


@pytest.mark.parametrize("shape", BIAS_SHAPES)
def test_dense_bias_broadcast(shape):
    lengths, heads, n = [70, 33, 0, 1], 3, 70
    bias = dense_bias(sizes(shape, len(lengths), heads, n))
    got_in, _ = compare(
        {**jagged_qkv(lengths, heads), "attn_bias": bias},
        seq_offsets=offsets_of(lengths),
        max_seq_len=n,
        max_attn_len=40,
    )
    assert got_in["attn_bias"].grad.shape == got_in["attn_bias"].shape


TIMESTAMPS = ["sorted", "equal", "unsorted", "huge", "float"]


def make_timestamps(kind, size):
    if kind == "sorted":
        return torch.randint(0, 10**7, size).sort(dim=-1).values
    if kind == "equal":  # dt = 0 everywhere
        return torch.full(size, 1234567, dtype=torch.int64)
    if kind == "unsorted":  # negative dt
        return torch.randint(0, 10**5, size)
    if kind == "huge":  # |dt| up to 4e18: log buckets clamp to the last one
        return torch.randint(0, 4 * 10**18, size, dtype=torch.int64)
    return torch.rand(size, dtype=F64) * 1e4  # fractional seconds


@pytest.mark.parametrize("kind", TIMESTAMPS)
@pytest.mark.parametrize("query_time_shift", [True, False])
@pytest.mark.parametrize("layout", ["jagged", "dense"])
def test_relative_bias(layout, query_time_shift, kind):
    lengths, n = [5, 0, 1, 70, 130], 130
    rows = sum(lengths)
    size = (rows,) if layout == "jagged" else (len(lengths), n)
    compare(
        {**jagged_qkv(lengths), **relative_tables(n)},
        seq_offsets=offsets_of(lengths),
        max_seq_len=n,
        timestamps=make_timestamps(kind, size),
        query_time_shift=query_time_shift,
        num_targets=torch.tensor([1, 0, 0, 5, 3]),
    )


@pytest.mark.parametrize("relative", [False, True])
def test_brgemm_tile_products(relative):
    # fp32 products whose sizes and leading dimensions are multiples of 16 (max_seq_len 256,
    # head dims 32, lengths 256, 192, 64, 96) run on oneDNN's brgemm micro-kernel; ragged
    # lengths (100, 37) leave last blocks to sgemm in the same call.
    lengths, n = [256, 192, 64, 100, 0, 37, 96], 256
    extra = {}
    if relative:
        extra = dict(timestamps=make_timestamps("sorted", (sum(lengths),)))
    compare(
        {**jagged_qkv(lengths, heads=2, dqk=32, dv=32), **(relative_tables(n) if relative else {})},
        seq_offsets=offsets_of(lengths),
        max_seq_len=n,
        **extra,
    )


def test_cache_aliased_leading_dimensions():
    # The models' head dims (50, off the brgemm) with the longest sequence and some blocks' keys a
    # multiple of 256: K^T / V^T are laid out one granule wider (unaliased_ld) and the tiles'
    # transposed products copy their B panels (small_gemm_tn).
    lengths, n = [512, 300, 0, 37], 512
    compare(
        {**jagged_qkv(lengths, heads=1, dqk=50, dv=50), **relative_tables(n)},
        seq_offsets=offsets_of(lengths),
        max_seq_len=n,
        timestamps=make_timestamps("sorted", (sum(lengths),)),
    )


@pytest.mark.parametrize("num_buckets, divisor", [(10, 0.301), (128, 0.5), (0, 0.301)])
def test_relative_bias_table_sizes(num_buckets, divisor):
    lengths, n = [70, 20], 70
    compare(
        {**jagged_qkv(lengths), **relative_tables(n, num_buckets)},
        seq_offsets=offsets_of(lengths),
        max_seq_len=n,
        timestamps=torch.randint(0, 10**9, (sum(lengths),)),
        bucket_divisor=divisor,
    )


def test_fused_relative_bias_equals_materialised_dense_bias():
    """Module-level: the fused bias gives what passing the materialised [B, 1, N, N] relative bias
    as attn_bias gives, outputs and (through autograd of the materialisation) ts_w / pos_w grads."""
    lengths, n, heads = [5, 130, 0, 67], 130, 2
    offsets = offsets_of(lengths)
    timestamps = torch.randint(0, 10**8, (sum(lengths),)).sort().values
    qkv = {name: t.float().requires_grad_() for name, t in jagged_qkv(lengths, heads).items()}
    tables = {name: t.float() for name, t in relative_tables(n).items()}
    options = dict(seq_offsets=offsets, max_seq_len=n, **mask_options("context_targets_window"))
    options["num_targets"] = torch.tensor([1, 10, 0, 3])
    results = []
    for fused in (True, False):
        ts_w, pos_w = (tables[name].clone().requires_grad_() for name in ("ts_w", "pos_w"))
        if fused:
            out = recops.hstu_attention(
                **qkv, timestamps=timestamps, ts_w=ts_w, pos_w=pos_w, **options
            )
        else:
            rows = []
            for b, length in enumerate(lengths):
                ts = timestamps[int(offsets[b]) : int(offsets[b]) + length]
                bias = relative_bias(ts, ts_w, pos_w, n)
                rows.append(torch.nn.functional.pad(bias, (0, n - length, 0, n - length)))
            out = recops.hstu_attention(**qkv, attn_bias=torch.stack(rows)[:, None], **options)
        grads = torch.autograd.grad(out, [*qkv.values(), ts_w, pos_w], torch.ones_like(out))
        results.append((out, grads))
    (fused_out, fused_grads), (dense_out, dense_grads) = results
    torch.testing.assert_close(fused_out, dense_out, rtol=1e-5, atol=1e-6)
    for name, a, b in zip(["q", "k", "v", "ts_w", "pos_w"], fused_grads, dense_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4, msg=lambda m, name=name: name + m)


@pytest.mark.parametrize("threads", [1, 3])
def test_thread_counts(threads):
    """Per-thread partial sums (dK, dV, bias gradients) and work splitting at other thread
    counts; 3 threads on a 2-core machine still exercise three slots."""
    lengths, n = [150, 3, 64, 0, 65], 150
    with num_threads(threads):
        for bias in ("dense", "relative"):
            tensors = jagged_qkv(lengths)
            options = dict(seq_offsets=offsets_of(lengths), max_seq_len=n, mask="none")
            if bias == "dense":
                tensors["attn_bias"] = dense_bias([1, 1, n, n])
            else:
                tensors.update(relative_tables(n))
                options["timestamps"] = torch.randint(0, 10**6, (sum(lengths),))
            compare(tensors, **options)


# --------------------------------------------------------------------------- gradcheck, opcheck
GRADCHECK_CASES = {
    "causal_targets_context_relative": dict(
        bias="relative", contextual_seq_len=1, num_targets=[1, 0, 2, 0], target_group_size=2
    ),
    "none_window_dense_bias": dict(bias="BHNN", mask="none", max_attn_len=2),
    "custom_float_mask_broadcast_bias": dict(bias="1H1N", mask="custom"),
}


@pytest.mark.parametrize("case", list(GRADCHECK_CASES))
def test_gradcheck(case):
    lengths, n, heads = [3, 0, 4, 1], 4, 2
    options = dict(GRADCHECK_CASES[case])
    bias = options.pop("bias")
    if "num_targets" in options:
        options["num_targets"] = torch.tensor(options["num_targets"])
    if options.get("mask") == "custom":
        options["mask"] = torch.rand(1, heads, n, n, dtype=F64)
    tensors = jagged_qkv(lengths, heads, dqk=3, dv=2)
    if bias == "relative":
        tensors.update(relative_tables(n, num_buckets=5))
        options["timestamps"] = torch.tensor([0, 3, 9, 9, 30, 100, 170, 171])
    else:
        tensors["attn_bias"] = dense_bias(sizes(bias, len(lengths), heads, n))
    names = list(tensors)

    def fn(*args):
        return recops.hstu_attention(
            **dict(zip(names, args, strict=True)),
            seq_offsets=offsets_of(lengths),
            max_seq_len=n,
            alpha=0.9,
            **options,
        )

    inputs = [t.requires_grad_() for t in tensors.values()]
    assert gradcheck(fn, inputs, eps=1e-6, atol=1e-8, rtol=1e-6)


def test_gradcheck_dense_layout():
    lengths = torch.tensor([3, 0, 2])
    q, k = torch.randn(2, 3, 4, 2, 3, dtype=F64).unbind(0)
    v = torch.randn(3, 4, 2, 2, dtype=F64)
    bias = torch.randn(1, 2, 4, 4, dtype=F64)

    def fn(q, k, v, bias):
        return recops.hstu_attention(q, k, v, lengths=lengths, attn_bias=bias, mask="none")

    assert gradcheck(fn, [t.requires_grad_() for t in (q, k, v, bias)], eps=1e-6, atol=1e-8)


def op_args(case, dtype=torch.float32, requires_grad=True):
    """Positional arguments of hstu_dense_forward for a small jagged problem."""
    lengths, n, heads = [3, 0, 70, 5], 70, 2
    q, k = (torch.randn(sum(lengths), heads, 8, dtype=dtype) for _ in range(2))
    v = torch.randn(sum(lengths), heads, 6, dtype=dtype)
    num_targets = custom = bias = timestamps = ts_w = pos_w = None
    mask_type, context, group, window = "causal", 0, 1, 0
    if case == "targets_dense_bias":
        num_targets, context, group, window = torch.tensor([1, 0, 9, 2]), 2, 3, 20
        bias = torch.randn(len(lengths), 1, n, n, dtype=dtype)
    elif case == "relative_none":
        mask_type, window = "none", 9
        timestamps = torch.randint(0, 10**6, (sum(lengths),))
        ts_w, pos_w = torch.randn(129, dtype=dtype), torch.randn(2 * n - 1, dtype=dtype)
    elif case == "custom":
        mask_type, custom = "custom", torch.rand(1, heads, n, n) < 0.5
    tensors = [q, k, v, bias, ts_w, pos_w]
    for t in tensors:
        if t is not None:
            t.requires_grad_(requires_grad)
    return [
        q,
        k,
        v,
        offsets_of(lengths),
        None,
        n,
        0.8,
        1.0 / n,
        mask_type,
        context,
        num_targets,
    ] + [group, window, custom, bias, timestamps, ts_w, pos_w, True, 0.301]


# Configurations op_cases' calls (test_opcheck.py) may not draw.
OPCHECK_CASES = ["targets_dense_bias", "relative_none", "custom"]


@pytest.mark.parametrize("case", OPCHECK_CASES)
def test_opcheck_forward(case):
    opcheck(ops.hstu_dense_forward.default, op_args(case))


@pytest.mark.parametrize("case", ["targets_dense_bias", "relative_none"])
def test_opcheck_backward(case):
    args = op_args(case, requires_grad=False)
    grad_out = torch.randn(args[0].shape[0], args[0].shape[1], args[2].shape[2])
    opcheck(ops.hstu_dense_backward.default, [grad_out, *args])


def test_opcheck_dense_lengths_bf16():
    args = op_args("targets_dense_bias", torch.bfloat16)
    args[4] = torch.tensor([3, 0, 60, 5])
    opcheck(ops.hstu_dense_forward.default, args)


def test_compile_fullgraph_forward_backward():
    torch._dynamo.reset()
    lengths, n = [5, 70, 0, 33], 70
    offsets, targets = offsets_of(lengths), torch.tensor([1, 4, 0, 2])
    timestamps = torch.randint(0, 10**6, (sum(lengths),)).sort().values

    def fn(q, k, v, ts_w, pos_w):
        out = recops.hstu_attention(
            q,
            k,
            v,
            offsets,
            n,
            num_targets=targets,
            max_attn_len=30,
            timestamps=timestamps,
            ts_w=ts_w,
            pos_w=pos_w,
        )
        return out.square().sum()

    tensors = {**jagged_qkv(lengths), **relative_tables(n)}
    eager_in = [t.float().requires_grad_() for t in tensors.values()]
    compiled_in = [t.float().requires_grad_() for t in tensors.values()]
    expected = fn(*eager_in)
    expected.backward()
    try:
        got = torch.compile(fn, fullgraph=True, backend="aot_eager")(*compiled_in)
        got.backward()
    finally:
        torch._dynamo.reset()
    torch.testing.assert_close(got, expected)
    for a, b in zip(compiled_in, eager_in, strict=True):
        torch.testing.assert_close(a.grad, b.grad)


# --------------------------------------------------------------------------- bad input
def bad_input_cases():
    lengths, n = [3, 5], 6
    base = {name: t.float() for name, t in jagged_qkv(lengths, 2, 4, 3).items()}
    base.update(seq_offsets=offsets_of(lengths), max_seq_len=n)
    q, k = base["q"], base["k"]
    dense = dict(q=torch.randn(2, n, 2, 4), k=torch.randn(2, n, 2, 4), v=torch.randn(2, n, 2, 3))
    tables = dict(timestamps=torch.arange(8), ts_w=torch.randn(129), pos_w=torch.randn(2 * n - 1))
    return {
        "k_rows": ({**base, "k": k[:-1]}, r"q, k and v must have the same number of rows"),
        "v_rows": ({**base, "v": torch.randn(9, 2, 3)}, r"q, k and v must have the same number"),
        "offsets_vs_rows": ({**base, "seq_offsets": offsets_of([3, 4])}, r"seq_offsets\[-1\] = 7"),
        "offsets_decreasing": (
            {**base, "seq_offsets": torch.tensor([0, 5, 3, 8])},
            r"seq_offsets must be non-decreasing",
        ),
        "offsets_float": ({**base, "seq_offsets": torch.tensor([0.0, 8.0])}, r"seq_offsets must"),
        "no_offsets": ({**base, "seq_offsets": None}, r"seq_offsets and max_seq_len"),
        "lengths_above_max": (
            {**base, "lengths": torch.tensor([3, 7])},
            r"length 7 \(from seq_lengths\) > max_seq_len = 6",
        ),
        "offsets_above_max": (
            {**base, "max_seq_len": 4},
            r"length 5 \(from seq_offsets\) > max_seq_len = 4",
        ),
        "dense_lengths_above_n": (
            {**dense, "lengths": torch.tensor([2, 7])},
            r"length 7 \(from seq_lengths\) > max_seq_len = 6",
        ),
        "negative_lengths": (
            {**dense, "lengths": torch.tensor([2, -1])},
            r"seq_lengths must be >= 0",
        ),
        "lengths_count": ({**dense, "lengths": torch.tensor([2])}, r"seq_lengths must have B = 2"),
        "dense_k_shape": ({**dense, "k": torch.randn(2, n - 1, 2, 4)}, r"\bk must be"),
        "dense_v_rank": ({**dense, "v": torch.randn(2 * n, 2, 3)}, r"\bv must be"),
        "targets_too_long": (
            {**base, "num_targets": torch.tensor([4, 1])},
            r"num_targets\[0\] = 4 exceeds the length of sequence 0",
        ),
        "targets_count": ({**base, "num_targets": torch.tensor([1])}, r"num_targets must have B"),
        "targets_negative": ({**base, "num_targets": torch.tensor([1, -1])}, r"num_targets must"),
        "bias_not_broadcastable": (
            {**base, "attn_bias": torch.randn(3, 1, n, n)},
            r"attn_bias of shape \[3, 1, 6, 6\] is not broadcastable",
        ),
        "bias_wrong_n": ({**base, "attn_bias": torch.randn(n, n + 1)}, r"attn_bias of shape"),
        "bias_rank": ({**base, "attn_bias": torch.randn(1, 2, 1, n, n)}, r"attn_bias must be"),
        "head_dims": ({**base, "k": torch.randn(8, 2, 5)}, r"q and k must have the same head dim"),
        "heads": ({**base, "v": torch.randn(8, 3, 3)}, r"same number of heads"),
        "qk_dtype": ({**base, "k": k.double()}, r"q and k"),
        "int_q": ({**base, "q": q.int()}, r"q must be float32"),
        "q_rank": ({**base, "q": q[:, 0]}, r"q must be 3-D"),
        "pos_w_size": (
            {**base, **tables, "pos_w": torch.randn(2 * n)},
            r"pos_w must have 2 \* max_seq_len - 1 = 11 entries, got 12",
        ),
        "ts_w_rank": ({**base, **tables, "ts_w": torch.randn(1, 129)}, r"ts_w must be 1-D"),
        "timestamps_size": ({**base, **tables, "timestamps": torch.arange(7)}, r"timestamps"),
        "timestamps_batch": ({**base, **tables, "timestamps": torch.zeros(3, n)}, r"timestamps"),
        "timestamps_columns": (
            {**base, **tables, "timestamps": torch.zeros(2, 4)},
            r"timestamps has 4 columns",
        ),
        "fused_incomplete": ({**base, "ts_w": tables["ts_w"]}, r"needs all of timestamps"),
        "bias_and_fused": (
            {**base, **tables, "attn_bias": torch.randn(n, n)},
            r"either attn_bias or the fused",
        ),
        "mask_type": ({**base, "mask": "casual"}, r"mask_type must be .*'casual'"),
        "custom_mask_shape": (
            {**base, "mask": torch.ones(2, 2, n, n + 1, dtype=torch.bool)},
            r"custom_mask must have shape",
        ),
        "custom_mask_heads": ({**base, "mask": torch.ones(1, 3, n, n)}, r"custom_mask must have"),
        "custom_mask_rank": ({**base, "mask": torch.ones(n, n)}, r"custom_mask must have shape"),
        "context_negative": (
            {**base, "contextual_seq_len": -1},
            r"contextual_seq_len must be >= 0",
        ),
        "window_negative": ({**base, "max_attn_len": -2}, r"max_attn_len must be >= 0"),
        "group_zero": ({**base, "target_group_size": 0}, r"target_group_size must be >= 1"),
        "divisor": ({**base, **tables, "bucket_divisor": 0.0}, r"bucket_divisor must be a pos"),
        "divisor_inf": ({**base, **tables, "bucket_divisor": math.inf}, r"bucket_divisor must"),
        "timestamps_alone": ({**base, "timestamps": tables["timestamps"]}, r"needs all of"),
        # Scalars where the reference formula would give NaN (the kernel gave -inf or 0).
        "alpha_nan": ({**base, "alpha": math.nan}, r"alpha must be a finite number.*, got nan"),
        "alpha_inf": ({**base, "alpha": -math.inf}, r"alpha must be a finite number.*, got -inf"),
        "alpha_float_range": ({**base, "alpha": 1e39}, r"alpha must be a finite number in float32"),
        "silu_scale_nan": ({**base, "silu_scale": math.nan}, r"silu_scale must be a finite"),
    }


BAD_INPUT = bad_input_cases()


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_input(case):
    kwargs, match = BAD_INPUT[case]
    with pytest.raises((RuntimeError, ValueError), match=match):
        recops.hstu_attention(**kwargs)


def test_custom_mask_contradicting_mask_type():
    args = op_args("causal", requires_grad=False)
    n = args[5]
    args[13] = torch.ones(1, 1, n, n, dtype=torch.bool)  # custom_mask, with mask_type "causal"
    match = r"custom_mask contradicts mask_type 'causal'"
    with pytest.raises(RuntimeError, match=match):
        ops.hstu_dense_forward(*args)
    with pytest.raises(RuntimeError, match=match):
        ops.hstu_dense_backward(torch.zeros(args[0].shape[0], 2, 6), *args)


def test_bad_grad_output():
    args = op_args("causal", requires_grad=False)
    with pytest.raises(RuntimeError, match=r"grad_output must have the output's shape"):
        ops.hstu_dense_backward(torch.randn(args[0].shape[0], 2, 7), *args)
