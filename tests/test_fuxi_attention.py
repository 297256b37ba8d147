"""FuXi-alpha attention (docs/ops.md section 5) against a float64 reference of the three einsums."""

import pytest
import torch
from accuracy import assert_close
from hstu_reference import fuxi_reference, relative_bias, table_biases

import recops

HEADS, DIM = 2, 8


def _jagged(lengths, dtype=torch.float64, heads=HEADS, dqk=DIM, dv=DIM):
    lengths = torch.tensor(lengths)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    total = int(offsets[-1])
    q, k = (torch.randn(total, heads, dqk, dtype=dtype) for _ in range(2))
    v = torch.randn(total, heads, dv, dtype=dtype)
    return q, k, v, offsets


def _dense_biases(batch, n, dtype=torch.float64):
    return torch.randn(batch, n, n, dtype=dtype), torch.randn(1, n, n, dtype=dtype)


@pytest.mark.parametrize("channels", ["semantic", "time", "position", "all"])
@pytest.mark.parametrize("reference_layout", [False, True])
@pytest.mark.parametrize(
    "mask_options",
    [
        {},
        {"num_targets": [1, 0, 3, 2]},
        {"contextual_seq_len": 2, "max_attn_len": 9},
        {"mask": "none"},
    ],
)
def test_matches_reference_with_dense_biases(channels, reference_layout, mask_options):
    n = 140  # several 64-row query blocks
    lengths = [5, 0, 140, 71]
    q, k, v, offsets = _jagged(lengths)
    ts_bias, pos_bias = _dense_biases(len(lengths), n)
    kwargs = dict(mask_options)
    if "num_targets" in kwargs:
        kwargs["num_targets"] = torch.tensor(kwargs["num_targets"])
    if channels in ("time", "all"):
        kwargs["ts_bias"] = ts_bias
    if channels in ("position", "all"):
        kwargs["pos_bias"] = pos_bias
    leaves = [q, k, v] + [kwargs[b] for b in ("ts_bias", "pos_bias") if b in kwargs]
    for t in leaves:
        t.requires_grad_()
    ref = fuxi_reference(q, k, v, offsets, n, reference_layout=reference_layout, **kwargs)
    got = recops.fuxi_attention(q, k, v, offsets, n, reference_layout=reference_layout, **kwargs)
    torch.testing.assert_close(got, ref)
    grad = torch.randn_like(ref)
    expected = torch.autograd.grad(ref, leaves, grad)
    actual = torch.autograd.grad(got, leaves, grad)
    for a, e in zip(actual, expected, strict=True):
        torch.testing.assert_close(a, e)


@pytest.mark.parametrize("query_time_shift", [True, False])
def test_fused_tables_match_dense_biases(query_time_shift):
    n = 130
    lengths = [1, 130, 64, 0, 17]
    q, k, v, offsets = _jagged(lengths)
    timestamps = torch.randint(0, 10**7, (int(offsets[-1]),))
    timestamps[3:6] = timestamps[3]  # dt = 0
    ts_w = torch.randn(129, dtype=torch.float64, requires_grad=True)
    pos_w = torch.randn(2 * n - 1, dtype=torch.float64, requires_grad=True)
    ts_bias, pos_bias = table_biases(timestamps, offsets, ts_w, pos_w, n, query_time_shift)
    ref = fuxi_reference(q, k, v, offsets, n, ts_bias=ts_bias, pos_bias=pos_bias)
    got = recops.fuxi_attention(
        q,
        k,
        v,
        offsets,
        n,
        timestamps=timestamps,
        ts_w=ts_w,
        pos_w=pos_w,
        query_time_shift=query_time_shift,
    )
    torch.testing.assert_close(got, ref)
    grad = torch.randn_like(ref)
    torch.testing.assert_close(
        torch.autograd.grad(got, [ts_w, pos_w], grad), torch.autograd.grad(ref, [ts_w, pos_w], grad)
    )


@pytest.mark.parametrize("order", ["chronological", "shuffled", "one time", "saturating"])
@pytest.mark.parametrize(
    "mask_options",
    [
        {},
        {"num_targets": [2, 0, 3, 1, 0], "target_group_size": 2},
        {"contextual_seq_len": 3, "max_attn_len": 250},
        {"mask": "none"},
    ],
)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_time_table_alone_under_every_mask(order, mask_options, dtype):
    # The time channel alone under a structured mask is summed over runs of keys of one time bucket
    # where a block sees kTimeRunMinKeys = 192 keys or more (csrc/recops/hstu/kernels/time_runs.h),
    # on its tile elsewhere: long runs for chronological timestamps, runs of one key for shuffled
    # ones, one run for equal times, and the top bucket's (whose upper threshold is NaN) for deltas
    # past the last threshold. Output and every gradient against the dense float64 reference.
    n, lengths = 300, [300, 0, 211, 1, 40]
    q, k, v, offsets = _jagged(lengths)
    total = int(offsets[-1])
    timestamps = torch.cumsum(torch.randint(0, 3000, (total,)), 0)
    if order == "shuffled":
        timestamps = timestamps[torch.randperm(total)]
    elif order == "one time":
        timestamps = torch.full((total,), 7)
    elif order == "saturating":
        # Floating times: integer ones this large would overflow int64 in the reference.
        timestamps = torch.cumsum(torch.randint(0, 3, (total,)), 0).double() * 1e17
    ts_w = torch.randn(129, dtype=torch.float64)
    kwargs = dict(mask_options)
    if "num_targets" in kwargs:
        kwargs["num_targets"] = torch.tensor(kwargs["num_targets"])
    leaves = [t.to(dtype).requires_grad_() for t in (q, k, v, ts_w)]
    got = recops.fuxi_attention(
        *leaves[:3], offsets, n, timestamps=timestamps, ts_w=leaves[3], **kwargs
    )
    masters = [t.detach().double().requires_grad_() for t in leaves]
    ts_bias, _ = table_biases(timestamps, offsets, masters[3], torch.zeros(2 * n - 1), n)
    ref = fuxi_reference(*masters[:3], offsets, n, ts_bias=ts_bias, **kwargs)
    # fp32: sums of up to 300 terms as large as 60 (one bucket's weight over every key), whose
    # error follows their terms.
    long_sums = dtype == torch.float32
    assert_close(got, ref, relative_to_max=long_sums)
    grad = torch.randn_like(ref)
    for a, e in zip(
        torch.autograd.grad(got, leaves, grad.to(dtype)),
        torch.autograd.grad(ref, masters, grad),
        strict=True,
    ):
        assert_close(a, e, relative_to_max=long_sums)


@pytest.mark.parametrize(
    "mask_options",
    [
        {},
        {"num_targets": [0, 2, 0, 0, 1, 0]},
        {"contextual_seq_len": 3},
        {"max_attn_len": 300},
        {"mask": "none"},
    ],
)
@pytest.mark.parametrize("with_time", [False, True])
@pytest.mark.parametrize("dv", [50, 7])
def test_position_table_by_fft(mask_options, with_time, dv):
    # Under a plain causal mask the fp32 position channel of a sequence of kPositionFftMinKeys =
    # 256 keys or more is a convolution by FFT (csrc/recops/hstu/kernels/position_fft.h), on
    # its tile elsewhere: here sequences of 600 (transform size 2048), 300, 256 (512) keys and
    # shorter ones, sequences with targets beside ones without, the masks that keep every tile,
    # two groups of value column pairs (50) and an odd width (7). Output and every gradient
    # against the dense float64 reference.
    n, lengths = 600, [600, 300, 0, 256, 255, 40]
    q, k, v, offsets = _jagged(lengths, dv=dv)
    total = int(offsets[-1])
    timestamps = torch.cumsum(torch.randint(0, 3000, (total,)), 0)
    tables = [torch.randn(2 * n - 1, dtype=torch.float64)]
    if with_time:
        tables.append(torch.randn(129, dtype=torch.float64))
    kwargs = dict(mask_options)
    if "num_targets" in kwargs:
        kwargs["num_targets"] = torch.tensor(kwargs["num_targets"])
    leaves = [t.float().requires_grad_() for t in (q, k, v, *tables)]
    fused = {"pos_w": leaves[3]}
    if with_time:
        fused.update(timestamps=timestamps, ts_w=leaves[4])
    got = recops.fuxi_attention(*leaves[:3], offsets, n, **fused, **kwargs)
    masters = [t.detach().double().requires_grad_() for t in leaves]
    ts_w = masters[4] if with_time else torch.zeros(129, dtype=torch.float64)
    ts_bias, pos_bias = table_biases(timestamps, offsets, ts_w, masters[3], n)
    if with_time:
        kwargs["ts_bias"] = ts_bias
    ref = fuxi_reference(*masters[:3], offsets, n, pos_bias=pos_bias, **kwargs)
    # fp32: sums of up to 600 terms (the table's gradient: of every pair at one distance).
    assert_close(got, ref, relative_to_max=True)
    grad = torch.randn_like(ref)
    for a, e in zip(
        torch.autograd.grad(got, leaves, grad.float()),
        torch.autograd.grad(ref, masters, grad),
        strict=True,
    ):
        assert_close(a, e, relative_to_max=True)


def test_relative_bias_helper_is_consistent():
    # The HSTU reference's relative_bias is ts bias + pos bias; FuXi keeps them apart.
    ts = torch.randint(0, 1000, (9,))
    ts_w, pos_w = torch.randn(129, dtype=torch.float64), torch.randn(17, dtype=torch.float64)
    offsets = torch.tensor([0, 9])
    ts_bias, pos_bias = table_biases(ts, offsets, ts_w, pos_w, 9, True)
    torch.testing.assert_close(ts_bias[0] + pos_bias[0], relative_bias(ts, ts_w, pos_w, 9))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_low_precision_dtypes(dtype):
    n = 100
    q, k, v, offsets = _jagged([100, 37], dtype=torch.float64, dqk=16, dv=24)
    ts_bias, pos_bias = _dense_biases(2, n)
    ref = fuxi_reference(q, k, v, offsets, n, ts_bias=ts_bias, pos_bias=pos_bias)
    got = recops.fuxi_attention(
        *(t.to(dtype) for t in (q, k, v)),
        offsets,
        n,
        ts_bias=ts_bias.to(dtype),
        pos_bias=pos_bias.to(dtype),
    )
    assert got.dtype == dtype
    assert_close(got, ref, dtype, relative_to_max=True)


def test_brgemm_tile_products():
    # fp32 products whose sizes and leading dimensions are multiples of 16 run on oneDNN's brgemm
    # micro-kernel; the ragged lengths (100, 37) leave last blocks to sgemm in the same call.
    n = 256
    q, k, v, offsets = _jagged([256, 192, 100, 0, 37, 64], dtype=torch.float64, dqk=32, dv=32)
    ts_bias, pos_bias = _dense_biases(6, n)
    leaves = [q, k, v, ts_bias, pos_bias]
    ref = fuxi_reference(q, k, v, offsets, n, ts_bias=ts_bias, pos_bias=pos_bias)
    low = [t.float().requires_grad_() for t in leaves]
    got = recops.fuxi_attention(*low[:3], offsets, n, ts_bias=low[3], pos_bias=low[4])
    scale = ref.abs().max().item()
    torch.testing.assert_close(got.double(), ref, atol=2e-5 * scale, rtol=1e-4)
    grad = torch.randn_like(ref)
    for t in leaves:
        t.requires_grad_()
    ref = fuxi_reference(*leaves[:3], offsets, n, ts_bias=leaves[3], pos_bias=leaves[4])
    expected = torch.autograd.grad(ref, leaves, grad)
    actual = torch.autograd.grad(got, low, grad.float())
    for a, e in zip(actual, expected, strict=True):
        torch.testing.assert_close(a.double(), e, atol=2e-5 * e.abs().max().item(), rtol=1e-4)


def test_dense_layout_with_lengths_and_custom_mask():
    batch, n = 3, 20
    q, k, v = (torch.randn(batch, n, HEADS, DIM, dtype=torch.float64) for _ in range(3))
    lengths = torch.tensor([20, 7, 0])
    custom = torch.rand(batch, 1, n, n) > 0.3
    ts_bias, pos_bias = _dense_biases(batch, n)
    got = recops.fuxi_attention(
        q, k, v, lengths=lengths, mask=custom, ts_bias=ts_bias, pos_bias=pos_bias
    )
    assert got.shape == (batch, n, 3 * HEADS * DIM)
    for b in range(batch):
        length = int(lengths[b])
        offsets = torch.tensor([0, length])
        ref = fuxi_reference(
            q[b, :length],
            k[b, :length],
            v[b, :length],
            offsets,
            n,
            ts_bias=ts_bias[b : b + 1],
            pos_bias=pos_bias,
            mask=custom[b : b + 1],
        )
        torch.testing.assert_close(got[b, :length], ref)
        assert not got[b, length:].any()


def test_gradcheck_float64():
    q, k, v, offsets = _jagged([3, 0, 4], heads=2, dqk=3, dv=2)
    ts_bias, pos_bias = _dense_biases(3, 4)
    leaves = [t.requires_grad_() for t in (q, k, v, ts_bias, pos_bias)]

    def fn(q, k, v, ts_bias, pos_bias):
        return recops.fuxi_attention(
            q,
            k,
            v,
            offsets,
            4,
            ts_bias=ts_bias,
            pos_bias=pos_bias,
            reference_layout=True,
            alpha=0.7,
        )

    assert torch.autograd.gradcheck(fn, leaves)
    timestamps = torch.randint(0, 10**5, (7,))
    ts_w = torch.randn(129, dtype=torch.float64, requires_grad=True)
    pos_w = torch.randn(7, dtype=torch.float64, requires_grad=True)

    def fused(q, k, v, ts_w, pos_w):
        return recops.fuxi_attention(
            q, k, v, offsets, 4, timestamps=timestamps, ts_w=ts_w, pos_w=pos_w
        )

    assert torch.autograd.gradcheck(fused, [q, k, v, ts_w, pos_w])


def test_compile_fullgraph():
    q, k, v, offsets = _jagged([5, 9], dtype=torch.float32)
    ts_bias, pos_bias = _dense_biases(2, 9, torch.float32)

    def fn(q, k, v):
        return recops.fuxi_attention(q, k, v, offsets, 9, ts_bias=ts_bias, pos_bias=pos_bias)

    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(q, k, v), fn(q, k, v))


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"ts_bias": torch.zeros(2, 6, 5)}, "ts_bias"),
        ({"pos_bias": torch.zeros(6, 6)}, "pos_bias must be 3-D"),
        ({"pos_bias": torch.zeros(1, 6, 6), "pos_w": torch.zeros(11)}, "either pos_bias or pos_w"),
        ({"ts_w": torch.zeros(129)}, "ts_w needs timestamps"),
        ({"pos_w": torch.zeros(10)}, "pos_w must have 2 \\* max_seq_len - 1"),
        ({"mask": "diagonal"}, "mask_type"),
        ({"pos_bias": torch.zeros(1, 6, 6, dtype=torch.long)}, "pos_bias must be float32"),
        ({"pos_bias": torch.zeros(2, 6, 6)}, r"pos_bias must be 3-D \[1, N, N\], got shape \[2"),
        ({"ts_bias": torch.zeros(2, 6, 6, dtype=torch.int32)}, "ts_bias must be float32"),
        ({"timestamps": torch.zeros(2, 6)}, "timestamps are used only with ts_w"),
        ({"timestamps": torch.zeros(2, 6), "ts_bias": torch.zeros(2, 6, 6)}, "used only with ts_w"),
        ({"alpha": float("nan")}, "alpha must be a finite number"),
        ({"alpha": float("inf")}, "alpha must be a finite number"),
        ({"silu_scale": float("-inf")}, "silu_scale must be a finite number"),
        (
            {"ts_w": torch.zeros(129), "timestamps": torch.zeros(2, 6), "bucket_divisor": 1e400},
            "bucket_divisor must be a positive finite number",
        ),
    ],
)
def test_bad_input(kwargs, match):
    q, k, v, offsets = _jagged([5, 1], dtype=torch.float32)
    with pytest.raises((RuntimeError, ValueError), match=match):
        recops.fuxi_attention(q, k, v, offsets, 6, **kwargs)
