"""The layer family (docs/ops.md §8): counter_dropout (a dropout whose mask is a pure function of
seed, offset and element, regenerated in backward) and hstu_layer_output (an HSTU / FuXi-alpha
layer's output, fused), against plain PyTorch compositions written here."""

import math

import pytest
import torch
import torch.nn.functional as F
from accuracy import F32, F64, assert_close, assert_errors_within_rule
from threads import num_threads
from torch.library import opcheck

import recops

ops = torch.ops.recops
BF16, F16 = torch.bfloat16, torch.float16
NORMS = {"layer_norm": F.layer_norm, "rms_norm": F.rms_norm}
EPS = 1e-6


M32, M64 = 2**32 - 1, 2**64 - 1
GOLDEN = 0x9E3779B97F4A7C15


def mix64(x):
    """SplitMix64's finaliser on Python ints (the contract's row key)."""
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & M64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def mul32(x, c):
    """x * c mod 2^32 on int64 tensors of 32-bit values, in 16-bit halves (no int64 overflow)."""
    return (x * (c & 0xFFFF) + (((x * (c >> 16)) & 0xFFFF) << 16)) & M32


def mix32(x):
    x = x ^ (x >> 16)
    x = mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def reference_keep(shape, p, seed, offset=0):
    """The contract's keep decisions (docs/ops.md §8), written from it: element (r, j) of the
    [rows, last dim] view is kept iff mix32(mix32(j + lo_r) ^ hi_r) >> 8 >= round(p 2^24), where
    (hi_r, lo_r) = mix64(mix64(stream) + r * golden) and stream = mix64(seed ^ mix64(offset +
    golden)), all modulo 2^64."""
    cols = shape[-1] if len(shape) else 1
    rows = math.prod(shape) // cols if cols else 0
    stream = mix64((seed & M64) ^ mix64(((offset & M64) + GOLDEN) & M64))
    keys = [mix64((mix64(stream) + r * GOLDEN) & M64) for r in range(rows)]
    lo = torch.tensor([k & M32 for k in keys], dtype=torch.int64)[:, None]
    hi = torch.tensor([k >> 32 for k in keys], dtype=torch.int64)[:, None]
    bits = mix32(mix32((torch.arange(cols) + lo) & M32) ^ hi)
    return ((bits >> 8) >= int(p * 2**24 + 0.5)).reshape(shape)


def seed_tensor(seed):
    return torch.tensor(seed, dtype=torch.int64)


def mask_of(shape, p, seed, offset=0, dtype=F64):
    """The op's keep factors (0 or 1 / (1 - p)) for a tensor of `shape`."""
    return ops.counter_dropout(torch.ones(shape, dtype=dtype), p, seed_tensor(seed), offset)


# --------------------------------------------------------------------------- counter_dropout
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_dropout_keeps_one_minus_p_and_scales_kept_values(p):
    kept = mask_of((1000, 300), p, seed=11, dtype=F32)
    n = kept.numel()
    dropped = (kept == 0).double().mean().item()
    assert abs(dropped - p) < 5 * math.sqrt(p * (1 - p) / n)
    assert torch.equal(kept[kept != 0], torch.full_like(kept[kept != 0], 1 / (1 - p)))


def correlation(a, b):
    a, b = a.double().flatten(), b.double().flatten()
    return torch.corrcoef(torch.stack([a, b]))[0, 1].item()


@pytest.mark.parametrize("seed,offset", [(0, 0), (12345, 3), (-(2**63), 2**62), (-1, -7)])
def test_dropout_mask_follows_the_contract(seed, offset):
    for shape, p in (((37, 70), 0.3), ((3, 4, 5), 0.9), ((), 0.5), ((0, 4), 0.5)):
        expected = reference_keep(shape, p, seed, offset)
        assert torch.equal(mask_of(shape, p, seed, offset) != 0, expected), (shape, p)


def test_dropout_decisions_are_independent_across_elements_and_calls():
    p, shape = 0.5, (1000, 300)
    keep = mask_of(shape, p, seed=3) != 0
    bound = 5 / math.sqrt(keep.numel() / 2)
    assert abs(correlation(keep[:, 1:], keep[:, :-1])) < bound  # neighbours in a row
    assert abs(correlation(keep[1:], keep[:-1])) < bound  # neighbours in a column
    # Another seed, or another offset of the same seed: an unrelated mask.
    assert abs(correlation(keep, mask_of(shape, p, seed=4) != 0)) < bound
    assert abs(correlation(keep, mask_of(shape, p, seed=3, offset=1) != 0)) < bound
    assert torch.equal(keep, mask_of(shape, p, seed=3) != 0)


def test_dropout_mask_does_not_depend_on_thread_count_or_dtype():
    x = torch.randn(700, 130)
    with num_threads(1):
        one = ops.counter_dropout(x, 0.3, seed_tensor(7), 2)
    with num_threads(2):
        two = ops.counter_dropout(x, 0.3, seed_tensor(7), 2)
    assert torch.equal(one, two)
    keep = one != 0
    for dtype in (F64, BF16, F16):
        assert torch.equal(mask_of(x.shape, 0.3, 7, 2, dtype) != 0, keep), dtype


def test_dropout_gradient_is_mask_times_scale():
    x = torch.randn(40, 33, dtype=F64, requires_grad=True)
    out = ops.counter_dropout(x, 0.4, seed_tensor(5), 0)
    factors = mask_of(x.shape, 0.4, 5)
    assert torch.equal(out, x * factors)
    grad = torch.randn_like(out)
    out.backward(grad)
    assert torch.equal(x.grad, grad * factors)


def test_dropout_edge_rates_shapes_and_layouts():
    x = torch.randn(6, 9)
    assert torch.equal(ops.counter_dropout(x, 0.0, seed_tensor(1), 0), x)
    assert torch.equal(ops.counter_dropout(x, 1.0, seed_tensor(1), 0), torch.zeros_like(x))
    assert ops.counter_dropout(torch.empty(0, 5), 0.5, seed_tensor(1), 0).shape == (0, 5)
    scalar = ops.counter_dropout(torch.tensor(2.0), 0.5, seed_tensor(1), 0)
    assert scalar.shape == () and scalar.item() in (0.0, 4.0)
    # A view is read in its logical order: as its contiguous copy.
    t, seed = torch.randn(9, 6).t(), seed_tensor(8)
    assert torch.equal(
        ops.counter_dropout(t, 0.5, seed, 0), ops.counter_dropout(t.contiguous(), 0.5, seed, 0)
    )
    # Rows are the leading dimensions flattened.
    cube = torch.randn(3, 4, 5)
    flat = ops.counter_dropout(cube.view(12, 5), 0.5, seed, 0)
    assert torch.equal(ops.counter_dropout(cube, 0.5, seed, 0), flat.view(3, 4, 5))


def test_dropout_seeds_follow_torch_manual_seed():
    x = torch.randn(50, 20)
    torch.manual_seed(5)
    first = recops.counter_dropout(x, 0.5)
    second = recops.counter_dropout(x, 0.5)
    torch.manual_seed(5)
    assert torch.equal(recops.counter_dropout(x, 0.5), first)
    assert not torch.equal(first, second)
    assert recops.counter_dropout(x, 0.5, training=False) is x


@pytest.mark.parametrize("p", [-0.1, 1.5, float("nan")])
def test_dropout_rejects_a_rate_outside_0_1(p):
    with pytest.raises(ValueError, match=r"p must be in \[0, 1\]"):
        ops.counter_dropout(torch.randn(3, 3), p, seed_tensor(1), 0)
    with pytest.raises(ValueError, match=r"p must be in \[0, 1\]"):
        recops.counter_dropout(torch.randn(3, 3), p)


def test_dropout_rejects_non_floating_x_and_a_malformed_seed():
    with pytest.raises(RuntimeError, match="x must be float"):
        ops.counter_dropout(torch.ones(3, dtype=torch.int64), 0.5, seed_tensor(1), 0)
    for seed in (torch.tensor(1, dtype=torch.int32), seed_tensor([1, 2])):
        with pytest.raises(ValueError, match="seed must be an int64 tensor of one element"):
            ops.counter_dropout(torch.ones(3), 0.5, seed, 0)


def test_dropout_opcheck():
    x = torch.randn(5, 7, requires_grad=True)
    opcheck(ops.counter_dropout, (x, 0.3, seed_tensor(9), 1))


# --------------------------------------------------------------------------- hstu_layer_output
def composition(x, u, attn, weight, bias, norm, p=0.0, seed=0, offset=0, eps=EPS):
    """The models' combine written in PyTorch, with the contract's dropout mask."""
    gated = u * NORMS[norm](attn, attn.shape[-1:], eps=eps)
    if p > 0:
        keep = reference_keep(tuple(gated.shape), p, seed, offset)
        gated = gated * keep.to(gated.dtype) * (1 / (1 - p) if p < 1 else 0.0)
    out = gated @ weight.T + x
    return out + bias if bias is not None else out


def make_inputs(rows, width, dim, dtype, bias=True):
    gen = torch.Generator().manual_seed(rows * 31 + width)
    x, u, attn = (torch.randn(rows, n, generator=gen) for n in (dim, width, width))
    attn = attn * 3 + 1  # a mean and a scale for the norm to remove
    weight = torch.randn(dim, width, generator=gen) / math.sqrt(width)
    b = torch.randn(dim, generator=gen) if bias else None
    return [t if t is None else t.to(dtype) for t in (x, u, attn, weight, b)]


def leaves(tensors, dtype=None):
    return [
        None if t is None else t.detach().to(dtype or t.dtype).requires_grad_() for t in tensors
    ]


def forward_and_grads(fn, inputs, grad):
    out = fn(*inputs)
    present = [t for t in inputs if t is not None]
    grads = torch.autograd.grad(out, present, grad)
    return [out.detach(), *grads]


def op_call(norm, p=0.0, seed=0, offset=0):
    def call(x, u, attn, weight, bias):
        key = seed_tensor(seed) if p > 0 else None
        return ops.hstu_layer_output(x, u, attn, weight, bias, norm, EPS, p, key, offset)

    return call


def reference_call(norm, p=0.0, seed=0, offset=0):
    return lambda *inputs: composition(*inputs, norm, p, seed, offset)


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("p", [0.0, 0.3])
@pytest.mark.parametrize("bias", [True, False])
def test_output_equals_composition_in_float64(norm, p, bias):
    inputs = make_inputs(130, 24, 20, F64, bias)  # two full row blocks and a tail
    grad = torch.randn(130, 20, dtype=F64)
    actual = forward_and_grads(op_call(norm, p, 17, 2), leaves(inputs), grad)
    expected = forward_and_grads(reference_call(norm, p, 17, 2), leaves(inputs), grad)
    for a, e in zip(actual, expected, strict=True):
        assert_close(a, e)


@pytest.mark.parametrize("norm", NORMS)
def test_output_fp32_to_rounding(norm):
    inputs = make_inputs(100, 48, 32, F32)
    grad = torch.randn(100, 32)
    actual = forward_and_grads(op_call(norm, 0.2, 3), leaves(inputs), grad)
    expected = forward_and_grads(reference_call(norm, 0.2, 3), leaves(inputs, F64), grad.double())
    # The weight gradient sums over the 100 rows.
    for a, e in zip(actual, expected, strict=True):
        assert_close(a, e, F32, atol_factor=10)


@pytest.mark.parametrize("norm", NORMS)
def test_output_bf16_within_the_low_precision_rule(norm):
    inputs = make_inputs(90, 32, 16, BF16)
    grad = torch.randn(90, 16).to(BF16)
    names = ["out", "x", "u", "attn", "weight", "bias"]
    actual = forward_and_grads(op_call(norm, 0.25, 4), leaves(inputs), grad)
    exact = forward_and_grads(reference_call(norm, 0.25, 4), leaves(inputs, F64), grad.double())
    low = forward_and_grads(reference_call(norm, 0.25, 4), leaves(inputs), grad)
    assert all(a.dtype == BF16 for a in actual)
    assert_errors_within_rule(names, exact, low, [a.double() for a in actual])


def test_output_masks_and_results_do_not_depend_on_thread_count():
    inputs = make_inputs(300, 24, 20, F64)
    grad = torch.randn(300, 20, dtype=F64)
    with num_threads(1):
        one = forward_and_grads(op_call("layer_norm", 0.5, 21), leaves(inputs), grad)
    with num_threads(2):
        two = forward_and_grads(op_call("layer_norm", 0.5, 21), leaves(inputs), grad)
    # Per row the same operations in the same order; the sums over rows in fixed chunks.
    for name, a, b in zip(["out", "x", "u", "attn", "weight", "bias"], one, two, strict=True):
        assert torch.equal(a, b), name


def test_output_of_no_rows():
    inputs = make_inputs(0, 8, 6, F32)
    out = forward_and_grads(op_call("rms_norm", 0.5, 1), leaves(inputs), torch.randn(0, 6))
    assert [t.shape for t in out] == [(0, 6), (0, 6), (0, 8), (0, 8), (6, 8), (6,)]
    assert not out[4].any() and not out[5].any()


def test_output_reads_strided_inputs():
    x, u, attn, weight, bias = make_inputs(70, 12, 10, F64)
    wide = torch.cat([u, torch.randn(70, 5, dtype=F64)], dim=1)
    strided = [
        torch.randn(10, 70, dtype=F64).t().copy_(x),  # column-major
        wide[:, :12],  # rows of a wider tensor, as torch.split leaves u
        attn.t().contiguous().t(),
        weight.t().contiguous().t(),
        torch.stack([bias, bias], dim=1)[:, 0],
    ]
    assert not any(t.is_contiguous() for t in strided)
    grad = torch.randn(10, 70, dtype=F64).t()
    actual = forward_and_grads(op_call("layer_norm", 0.4, 6), leaves(strided), grad)
    expected = forward_and_grads(reference_call("layer_norm", 0.4, 6), leaves(strided), grad)
    for a, e in zip(actual, expected, strict=True):
        assert_close(a, e)


def test_output_entry_point_draws_its_seed_from_torch():
    inputs = make_inputs(20, 8, 6, F32)
    torch.manual_seed(1)
    first = recops.hstu_layer_output(*inputs, dropout_p=0.5)
    torch.manual_seed(1)
    assert torch.equal(recops.hstu_layer_output(*inputs, dropout_p=0.5), first)
    no_dropout = recops.hstu_layer_output(*inputs)
    assert_close(no_dropout, composition(*inputs, "layer_norm"), atol_factor=10)


def test_output_gradcheck():
    inputs = leaves(make_inputs(5, 4, 3, F64))
    call = op_call("layer_norm", 0.3, 2)
    assert torch.autograd.gradcheck(call, tuple(inputs))
    assert torch.autograd.gradcheck(op_call("rms_norm"), tuple(inputs))


def test_output_opcheck():
    inputs = make_inputs(9, 6, 5, F32)
    opcheck(ops.hstu_layer_output, (*leaves(inputs), "rms_norm", EPS, 0.3, seed_tensor(4), 1))
    args = (torch.randn(9, 5), *inputs, "layer_norm", EPS, 0.3, seed_tensor(4), 1)
    opcheck(ops.hstu_layer_output_backward, args)


def bad_calls():
    x, u, attn, weight, bias = make_inputs(6, 4, 3, F32)
    ok = {"x": x, "u": u, "attn": attn, "weight": weight, "bias": bias}
    yield {"x": x.long()}, "x must be float"
    yield {"x": x[0]}, "x must be 2-D"
    yield {"u": u.double()}, "u and x must share one dtype"
    yield {"u": u[:5]}, "u must have x's rows"
    yield {"attn": attn[:, :3]}, "attn must have u's shape"
    yield {"weight": weight.t()}, r"weight must be \[x.size\(1\), u.size\(1\)\]"
    yield {"bias": bias[:2]}, r"bias must be \[x.size\(1\)\]"
    yield {"bias": bias.half()}, "bias and x must share one dtype"
    for name, value in ok.items():
        if value is not None:
            yield {name: value.to("meta")}, name
    yield {"norm": "batch_norm"}, "norm must be"
    yield {"eps": float("nan")}, "eps must be a finite number"
    yield {"dropout_p": 1.5}, r"dropout_p must be in \[0, 1\]"
    yield {"seed": None}, "seed must be given when dropout_p > 0"
    yield {"seed": seed_tensor([1, 2])}, "seed must be an int64 tensor of one element"
    yield {"seed": torch.tensor(1.0)}, "seed must be an int64 tensor of one element"


@pytest.mark.parametrize("change,message", list(bad_calls()))
def test_output_bad_input_names_the_argument(change, message):
    x, u, attn, weight, bias = make_inputs(6, 4, 3, F32)
    args = {"x": x, "u": u, "attn": attn, "weight": weight, "bias": bias, "norm": "layer_norm"}
    args.update(eps=EPS, dropout_p=0.1, seed=seed_tensor(1), offset=0)
    args.update(change)
    with pytest.raises((RuntimeError, ValueError), match=message):
        ops.hstu_layer_output(**args)
    with pytest.raises((RuntimeError, ValueError), match=message):
        ops.hstu_layer_output_backward(torch.randn(6, 3), **args)


def test_output_backward_rejects_a_misshapen_grad_output():
    x, u, attn, weight, bias = make_inputs(6, 4, 3, F32)
    with pytest.raises(ValueError, match="grad_output must have x's shape"):
        ops.hstu_layer_output_backward(torch.randn(6, 4), x, u, attn, weight, bias)


def test_output_under_autocast_computes_in_fp32():
    x, u, attn, weight, bias = leaves(make_inputs(12, 8, 6, F32))
    with torch.autocast("cpu", dtype=BF16):
        out = ops.hstu_layer_output(x, u.to(BF16), attn.to(BF16), weight, bias)
    assert out.dtype == F32
    expected = composition(x, u.to(BF16).float(), attn.to(BF16).float(), weight, bias, "layer_norm")
    assert_close(out, expected, atol_factor=10)
    out.sum().backward()
    assert all(t.grad is not None and t.grad.dtype == F32 for t in (x, u, attn, weight, bias))


# --------------------------------------------------------------------------- hstu_layer_input
def input_composition(x, weight, bias, norm, eps=EPS):
    """The models' project written in PyTorch (before the split)."""
    pre = NORMS[norm](x, x.shape[-1:], eps=eps) @ weight
    return F.silu(pre + bias if bias is not None else pre)


def make_input_args(rows, dim, width, dtype, bias=True):
    gen = torch.Generator().manual_seed(rows * 17 + width)
    x = torch.randn(rows, dim, generator=gen) * 2 + 1
    weight = torch.randn(dim, width, generator=gen) / math.sqrt(dim)
    b = torch.randn(width, generator=gen) if bias else None
    return [t if t is None else t.to(dtype) for t in (x, weight, b)]


def input_call(norm):
    return lambda x, weight, bias: ops.hstu_layer_input(x, weight, bias, norm, EPS)[0]


def input_reference(norm):
    return lambda x, weight, bias: input_composition(x, weight, bias, norm)


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("bias", [True, False])
def test_input_equals_composition_in_float64(norm, bias):
    inputs = make_input_args(130, 20, 36, F64, bias)
    grad = torch.randn(130, 36, dtype=F64)
    actual = forward_and_grads(input_call(norm), leaves(inputs), grad)
    expected = forward_and_grads(input_reference(norm), leaves(inputs), grad)
    for a, e in zip(actual, expected, strict=True):
        assert_close(a, e)


@pytest.mark.parametrize("norm", NORMS)
def test_input_fp32_to_rounding_and_bf16_within_the_rule(norm):
    inputs = make_input_args(100, 32, 48, F32)
    grad = torch.randn(100, 48)
    actual = forward_and_grads(input_call(norm), leaves(inputs), grad)
    exact = forward_and_grads(input_reference(norm), leaves(inputs, F64), grad.double())
    for a, e in zip(actual, exact, strict=True):  # sums over 100 rows or 48 columns
        assert_close(a, e, F32, atol_factor=10)
    inputs, grad = [t.to(BF16) for t in inputs], grad.to(BF16)
    actual = forward_and_grads(input_call(norm), leaves(inputs), grad)
    exact = forward_and_grads(input_reference(norm), leaves(inputs, F64), grad.double())
    low = forward_and_grads(input_reference(norm), leaves(inputs), grad)
    assert all(a.dtype == BF16 for a in actual)
    assert_errors_within_rule(
        ["out", "x", "weight", "bias"], exact, low, [a.double() for a in actual]
    )


def test_input_fp32_rows_with_a_small_spread_beside_their_mean():
    # Rows 1000 + 0.01 * noise: in fp32, a - mean keeps ~3 of its digits; the statistics, taken
    # about each row's first value, and the normalised values must not lose them (a plain fp32
    # layer norm is off by ~1e-2 here).
    # So must the backward, which recomputes them (the gradient of x checked too).
    gen = torch.Generator().manual_seed(5)
    x = 1000 + 0.01 * torch.randn(64, 50, generator=gen)
    weight = torch.randn(50, 40, generator=gen) / math.sqrt(50)
    grad = torch.randn(64, 40, generator=gen)
    x32, x64 = x.clone().requires_grad_(), x.double().requires_grad_()
    out = recops.hstu_layer_input(x32, weight, norm="layer_norm", eps=EPS, split=[40])[0]
    exact = input_composition(x64, weight.double(), None, "layer_norm")
    assert_close(out, exact, F32, atol_factor=10)
    out.backward(grad)
    exact.backward(grad.double())
    assert_close(x32.grad, x64.grad, F32, atol_factor=10)


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("split", [[7, 0, 10, 19], [36]])
def test_input_pieces_equal_the_split_composition_in_float64(norm, split):
    # The pieces and every gradient against torch.split of the composition; a zero-width piece;
    # gradients of the pieces arriving non-contiguous; one piece unused (autograd's zeros).
    x, weight, bias = leaves(make_input_args(130, 20, 36, F64))
    pieces = recops.hstu_layer_input(x, weight, bias, norm=norm, eps=EPS, split=split)
    assert isinstance(pieces, tuple) and [p.shape[1] for p in pieces] == split
    assert all(p.is_contiguous() for p in pieces)
    expected = torch.split(input_composition(x, weight, bias, norm), split, dim=1)
    for p, e in zip(pieces, expected, strict=True):
        assert_close(p, e)
    gen = torch.Generator().manual_seed(5)
    grads = [torch.randn(cols, 130, generator=gen, dtype=F64).t() for cols in split]
    used = range(len(split) - 1) if len(split) > 1 else range(1)

    def grads_of(outputs):
        loss = sum((outputs[i] * grads[i]).sum() for i in used)
        return torch.autograd.grad(loss, (x, weight, bias))

    for a, e in zip(grads_of(pieces), grads_of(expected), strict=True):
        assert_close(a, e)


def test_input_does_not_depend_on_thread_count():
    inputs = make_input_args(300, 20, 24, F64)
    grad = torch.randn(300, 24, dtype=F64)
    with num_threads(1):
        one = forward_and_grads(input_call("rms_norm"), leaves(inputs), grad)
    with num_threads(2):
        two = forward_and_grads(input_call("rms_norm"), leaves(inputs), grad)
    for a, b in zip(one, two, strict=True):  # rows alike; sums over rows in fixed chunks
        assert torch.equal(a, b)


def test_input_of_no_rows_and_strided_operands():
    x, weight, bias = make_input_args(0, 6, 8, F32)
    out = forward_and_grads(input_call("layer_norm"), leaves([x, weight, bias]), torch.randn(0, 8))
    assert [t.shape for t in out] == [(0, 8), (0, 6), (6, 8), (8,)]
    assert not out[2].any() and not out[3].any()
    x, weight, bias = make_input_args(70, 10, 12, F64)
    strided = [
        torch.cat([x, x], dim=1)[:, :10],
        weight.t().contiguous().t(),
        torch.stack([bias, bias], dim=1)[:, 0],
    ]
    assert not any(t.is_contiguous() for t in strided)
    grad = torch.randn(12, 70, dtype=F64).t()
    actual = forward_and_grads(input_call("layer_norm"), leaves(strided), grad)
    expected = forward_and_grads(input_reference("layer_norm"), leaves(strided), grad)
    for a, e in zip(actual, expected, strict=True):
        assert_close(a, e)


def test_input_gradcheck_opcheck_and_autocast():
    inputs = leaves(make_input_args(5, 4, 6, F64))
    for norm in NORMS:
        assert torch.autograd.gradcheck(input_call(norm), tuple(inputs))
    x, weight, bias = make_input_args(9, 5, 7, F32)
    opcheck(ops.hstu_layer_input, (*leaves([x, weight, bias]), "rms_norm", EPS))
    opcheck(ops.hstu_layer_input, (*leaves([x, weight, bias]), "layer_norm", EPS, [3, 0, 4]))
    opcheck(
        ops.hstu_layer_input_backward, ([torch.randn(9, 7)], x, weight, bias, "layer_norm", EPS)
    )
    grads = [torch.randn(9, 3), torch.randn(9, 0), torch.randn(9, 4)]
    opcheck(ops.hstu_layer_input_backward, (grads, x, weight, bias, "layer_norm", EPS, [3, 0, 4]))
    with torch.autocast("cpu", dtype=BF16):
        out = recops.hstu_layer_input(x, weight, bias)
    assert out.dtype == BF16
    expected = input_composition(*(t.to(BF16).double() for t in (x, weight, bias)), "layer_norm")
    assert_close(out, expected)


def bad_input_calls():
    x, weight, bias = make_input_args(6, 4, 5, F32)
    yield {"x": x.long()}, "x must be float"
    yield {"x": x[0]}, "x must be 2-D"
    yield {"weight": weight.double()}, "weight and x must share one dtype"
    yield {"weight": weight[:3]}, "weight must have x.size"
    yield {"bias": bias[:2]}, r"bias must be \[weight.size\(1\)\]"
    yield {"bias": bias.to("meta")}, "bias"
    yield {"norm": "group_norm"}, "norm must be"
    yield {"eps": float("inf")}, "eps must be a finite number"
    yield {"split": [2, 2]}, "split must be sizes >= 0 that sum to weight.size"
    yield {"split": [-1, 6]}, "split must be sizes >= 0"
    yield {"split": [2**62, 2**62, 2**62, 2**62 - 5]}, "split must be sizes >= 0"


@pytest.mark.parametrize("change,message", list(bad_input_calls()))
def test_input_bad_input_names_the_argument(change, message):
    x, weight, bias = make_input_args(6, 4, 5, F32)
    args = {"x": x, "weight": weight, "bias": bias, "norm": "layer_norm", "eps": EPS}
    args.update(change)
    with pytest.raises((RuntimeError, ValueError), match=message):
        ops.hstu_layer_input(**args)
    with pytest.raises((RuntimeError, ValueError), match=message):
        ops.hstu_layer_input_backward([torch.randn(6, 5)], **args)


def test_input_backward_bad_gradients_name_the_argument():
    x, weight, bias = make_input_args(6, 4, 5, F32)
    with pytest.raises(ValueError, match=r"grad_output\[0\] must be \[x.size\(0\), 5\]"):
        ops.hstu_layer_input_backward([torch.randn(6, 4)], x, weight, bias)
    with pytest.raises(ValueError, match=r"grad_output\[1\] must be \[x.size\(0\), 3\]"):
        ops.hstu_layer_input_backward(
            [torch.randn(6, 2), torch.randn(5, 3)], x, weight, bias, split=[2, 3]
        )
    with pytest.raises(ValueError, match="grad_output must hold one gradient per piece"):
        ops.hstu_layer_input_backward([torch.randn(6, 5)], x, weight, bias, split=[2, 3])
    with pytest.raises(RuntimeError, match="grad_output"):
        ops.hstu_layer_input_backward([torch.randn(6, 5).double()], x, weight, bias)


def test_compiled_graphs_draw_a_fresh_seed_each_call():
    # The seed is a tensor drawn inside the graph: a seed drawn as a Python int would be a
    # constant of the compiled graph (the same mask every step) or break the graph.
    x, u, attn, weight, bias = make_inputs(20, 8, 6, F32)

    def layer(x, u, attn):
        h = recops.counter_dropout(x, 0.5)
        return recops.hstu_layer_output(h, u, attn, weight, bias, dropout_p=0.5)

    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    torch.manual_seed(3)
    first, second = compiled(x, u, attn), compiled(x, u, attn)
    assert not torch.equal(first, second)
    torch.manual_seed(3)
    assert torch.equal(layer(x, u, attn), first)


# --------------------------------------------------------------------------- fuxi_layer_ffn
def ffn_composition(x, gate, up, down, norm, p=0.0, seed=0, offset=0, eps=EPS):
    """FuXi-alpha's MFFN stage 2 written in PyTorch, with the contract's dropout mask on h."""
    h = NORMS[norm](x, x.shape[-1:], eps=eps)
    if p > 0:
        keep = reference_keep(tuple(h.shape), p, seed, offset)
        h = h * keep.to(h.dtype) * (1 / (1 - p) if p < 1 else 0.0)
    return x + (F.silu(h @ gate.T) * (h @ up.T)) @ down.T


def ffn_inputs(rows, dim, hidden, dtype):
    gen = torch.Generator().manual_seed(rows + 7 * hidden)
    x = torch.randn(rows, dim, generator=gen) * 2 + 0.5
    gate, up = (torch.randn(hidden, dim, generator=gen) / math.sqrt(dim) for _ in range(2))
    down = torch.randn(dim, hidden, generator=gen) / math.sqrt(hidden)
    return [t.to(dtype) for t in (x, gate, up, down)]


def ffn_op(norm, p=0.0, seed=0, offset=0):
    def call(x, gate, up, down):
        key = seed_tensor(seed) if p > 0 else None
        return ops.fuxi_layer_ffn(x, gate, up, down, norm, EPS, p, key, offset)

    return call


def ffn_reference(norm, p=0.0, seed=0, offset=0):
    return lambda *inputs: ffn_composition(*inputs, norm, p, seed, offset)


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("p", [0.0, 0.3])
def test_ffn_equals_composition_in_float64(norm, p):
    inputs = ffn_inputs(130, 20, 36, F64)  # two full row blocks and a tail
    grad = torch.randn(130, 20, dtype=F64)
    actual = forward_and_grads(ffn_op(norm, p, 5, 1), leaves(inputs), grad)
    expected = forward_and_grads(ffn_reference(norm, p, 5, 1), leaves(inputs), grad)
    for a, e in zip(actual, expected, strict=True):
        assert_close(a, e)


def test_ffn_fp32_to_rounding_and_bf16_within_the_rule():
    inputs = ffn_inputs(100, 50, 50, F32)  # the main job's sizes: not multiples of 16
    grad = torch.randn(100, 50)
    actual = forward_and_grads(ffn_op("rms_norm", 0.2, 3), leaves(inputs), grad)
    expected = forward_and_grads(
        ffn_reference("rms_norm", 0.2, 3), leaves(inputs, F64), grad.double()
    )
    for a, e in zip(actual, expected, strict=True):
        assert_close(a, e, F32, atol_factor=10)
    inputs = [t.to(BF16) for t in ffn_inputs(90, 24, 40, F32)]
    grad = torch.randn(90, 24).to(BF16)
    names = ["out", "x", "gate", "up", "down"]
    actual = forward_and_grads(ffn_op("rms_norm", 0.25, 4), leaves(inputs), grad)
    exact = forward_and_grads(
        ffn_reference("rms_norm", 0.25, 4), leaves(inputs, F64), grad.double()
    )
    low = forward_and_grads(ffn_reference("rms_norm", 0.25, 4), leaves(inputs), grad)
    assert all(a.dtype == BF16 for a in actual)
    assert_errors_within_rule(names, exact, low, [a.double() for a in actual])


def test_ffn_does_not_depend_on_thread_count_and_reads_strided_rows():
    x, gate, up, down = ffn_inputs(300, 20, 30, F64)
    wide = torch.zeros(300, 33, dtype=F64)
    wide[:, 5:25] = x
    wide.requires_grad_()
    grad = torch.randn(300, 20, dtype=F64)
    results = []
    for threads in (1, 2):
        with num_threads(threads):
            results.append(
                forward_and_grads(ffn_op("rms_norm", 0.3, 9), leaves([x, gate, up, down]), grad)
            )
    strided = forward_and_grads(
        ffn_op("rms_norm", 0.3, 9), [wide[:, 5:25], *leaves([gate, up, down])], grad
    )
    for one, two in zip(*results, strict=True):
        assert torch.equal(one, two)
    assert torch.equal(strided[0], results[0][0])


def test_ffn_of_no_rows_gradcheck_and_opcheck():
    x, gate, up, down = ffn_inputs(0, 5, 3, F64)
    out = ops.fuxi_layer_ffn(x, gate, up, down, "layer_norm", EPS, 0.0, None, 0)
    assert out.shape == (0, 5)
    inputs = leaves(ffn_inputs(9, 4, 3, F64))
    assert torch.autograd.gradcheck(ffn_op("layer_norm", 0.4, 2), inputs)
    opcheck(
        ops.fuxi_layer_ffn.default,
        (*ffn_inputs(9, 4, 3, F32), "rms_norm", EPS, 0.4, seed_tensor(1), 0),
    )


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda a: a.update(gate=a["gate"][:, :-1]), "gate must be"),
        (lambda a: a.update(up=a["up"][:-1]), "up must have gate's shape"),
        (lambda a: a.update(down=a["down"].T.contiguous()), "down must be"),
        (lambda a: a.update(norm="batch_norm"), "norm must be"),
        (lambda a: a.update(dropout_p=0.5, seed=None), "seed must be given"),
        (lambda a: a.update(gate=a["gate"].double()), "gate"),
    ],
)
def test_ffn_bad_input_names_the_argument(change, message):
    x, gate, up, down = ffn_inputs(6, 4, 5, F32)
    a = {
        "x": x,
        "gate": gate,
        "up": up,
        "down": down,
        "norm": "rms_norm",
        "dropout_p": 0.0,
        "seed": None,
    }
    change(a)
    with pytest.raises((ValueError, RuntimeError), match=message):
        ops.fuxi_layer_ffn(
            a["x"], a["gate"], a["up"], a["down"], a["norm"], EPS, a["dropout_p"], a["seed"], 0
        )


# --------------------------------------------------------------------------- l2_normalize
def l2_composition(x, eps=EPS):
    """The models' l2_normalize as generative-recommenders writes it."""
    return x / x.norm(dim=-1, keepdim=True).clamp(min=eps)


def l2_rows(rows, cols, dtype=F64, seed=0):
    """Rows of every magnitude: zero rows and rows shorter than eps (the clamped branch), unit
    scale and large rows."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=gen, dtype=F64)
    scales = torch.tensor([0.0, 1e-8, 3e-7, 1.0, 40.0], dtype=F64)
    x *= scales[torch.arange(rows) % len(scales)].unsqueeze(1)
    return x.to(dtype)


def l2_call(x):
    return recops.l2_normalize(x, EPS)


def test_l2_normalize_equals_composition_in_float64():
    x, grad = l2_rows(60, 50), l2_rows(60, 50, seed=1) + 1.0  # grad rows not along x's
    actual = forward_and_grads(l2_call, leaves([x]), grad)
    expected = forward_and_grads(l2_composition, leaves([x]), grad)
    for a, e in zip(actual, expected, strict=True):
        assert_close(a, e)
    assert torch.autograd.gradcheck(l2_call, (torch.randn(6, 5, dtype=F64, requires_grad=True),))


def test_l2_normalize_fp32_to_rounding_and_bf16_within_the_rule():
    x, grad = l2_rows(60, 50, F32), l2_rows(60, 50, F32, seed=1) + 1.0
    actual = forward_and_grads(l2_call, leaves([x]), grad)
    exact = forward_and_grads(l2_composition, leaves([x], F64), grad.double())
    for a, e in zip(actual, exact, strict=True):
        assert_close(a, e, F32)
    x, grad = x.to(BF16), grad.to(BF16)
    actual = forward_and_grads(l2_call, leaves([x]), grad)
    exact = forward_and_grads(l2_composition, leaves([x], F64), grad.double())
    low = forward_and_grads(l2_composition, leaves([x]), grad)
    assert all(a.dtype == BF16 for a in actual)
    assert_errors_within_rule(["out", "x"], exact, low, [a.double() for a in actual])


def test_l2_normalize_of_no_rows_strided_rows_and_any_thread_count():
    out = forward_and_grads(l2_call, leaves([torch.empty(0, 7)]), torch.empty(0, 7))
    assert [t.shape for t in out] == [(0, 7), (0, 7)]
    x = l2_rows(70, 12)
    strided, grad = torch.cat([x, x], dim=1)[:, :12], torch.randn(12, 70, dtype=F64).t()
    assert not strided.is_contiguous() and not grad.is_contiguous()
    actual = forward_and_grads(l2_call, leaves([strided]), grad)
    expected = forward_and_grads(l2_composition, leaves([strided]), grad)
    for a, e in zip(actual, expected, strict=True):
        assert_close(a, e)
    x = l2_rows(3000, 9)
    with num_threads(1):
        one = forward_and_grads(l2_call, leaves([x]), grad.new_ones(3000, 9))
    with num_threads(2):
        two = forward_and_grads(l2_call, leaves([x]), grad.new_ones(3000, 9))
    assert all(torch.equal(a, b) for a, b in zip(one, two, strict=True))


def test_l2_normalize_opcheck_and_bad_input():
    x = torch.randn(9, 5)
    opcheck(ops.l2_normalize, (x.requires_grad_(), EPS))
    opcheck(ops.l2_normalize_backward, (torch.randn(9, 5), x.detach(), EPS))
    with pytest.raises((RuntimeError, ValueError), match="x must be 2-D"):
        ops.l2_normalize(torch.randn(4))
    with pytest.raises(RuntimeError, match="x must be float"):
        ops.l2_normalize(torch.ones(3, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="eps must be >= 0"):
        ops.l2_normalize(x, -1.0)
    with pytest.raises((RuntimeError, ValueError), match="eps must be a finite number"):
        ops.l2_normalize(x, float("nan"))
    with pytest.raises(ValueError, match="grad_output must have x's shape"):
        ops.l2_normalize_backward(torch.randn(9, 4), x, EPS)
    with pytest.raises(RuntimeError, match="grad_output"):
        ops.l2_normalize_backward(torch.randn(9, 5).double(), x, EPS)


# --------------------------------------------------------------------------- positional features
def features_composition(x, positions, table, scale, p=0.0, seed=0, offset=0):
    """The models' input features written in PyTorch, with the contract's dropout mask."""
    out = x * scale + F.embedding(positions, table)
    if p > 0:
        keep = reference_keep(tuple(out.shape), p, seed, offset)
        out = out * keep.to(out.dtype) * (1 / (1 - p) if p < 1 else 0.0)
    return out


def features_inputs(rows, cols, table_rows, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=gen).to(dtype)
    positions = torch.randint(0, table_rows, (rows,), generator=gen)
    positions[: min(rows, 3)] = table_rows - 1  # the last row and repeats
    table = torch.randn(table_rows, cols, generator=gen).to(dtype)
    return x, positions, table


def features_call(scale, p=0.0, seed=0, offset=0):
    def call(x, table, positions):
        if p == 0:
            return ops.positional_input_features(x, positions, table, scale)
        return ops.positional_input_features(
            x, positions, table, scale, p, seed_tensor(seed), offset
        )

    return call


def features_reference(scale, p=0.0, seed=0, offset=0):
    return lambda x, table, positions: features_composition(
        x, positions, table, scale, p, seed, offset
    )


@pytest.mark.parametrize("p", [0.0, 0.3])
def test_features_equal_composition_in_float64(p):
    x, positions, table = features_inputs(130, 50, 40, F64)
    grad = torch.randn(130, 50, dtype=F64)
    run = lambda fn: forward_and_grads(lambda a, b: fn(a, b, positions), leaves([x, table]), grad)  # noqa: E731
    actual = run(features_call(7.07, p, seed=5, offset=2))
    expected = run(features_reference(7.07, p, seed=5, offset=2))
    for a, e in zip(actual, expected, strict=True):
        assert_close(a, e)


def test_features_mask_is_counter_dropouts_and_entry_point_draws_the_seed():
    x, positions, table = features_inputs(64, 16, 10, F32)
    torch.manual_seed(3)
    fused = recops.positional_input_features(x, positions, table, 2.0, 0.4)
    torch.manual_seed(3)
    composed = recops.counter_dropout(x * 2.0 + F.embedding(positions, table), 0.4)
    assert_close(fused, composed, F32)
    assert torch.equal(fused == 0, composed == 0)
    assert recops.positional_input_features(x, positions, table, 2.0, 0.4, training=False).equal(
        x * 2.0 + F.embedding(positions, table)
    )


def test_features_fp32_bf16_empty_strided_and_any_thread_count():
    x, positions, table = features_inputs(100, 24, 30, F32)
    grad = torch.randn(100, 24)
    run = lambda fn, dtype=None: forward_and_grads(  # noqa: E731
        lambda a, b: fn(a, b, positions), leaves([x, table], dtype), grad.to(dtype or F32)
    )
    for a, e in zip(
        run(features_call(3.0, 0.2)), run(features_reference(3.0, 0.2), F64), strict=True
    ):
        assert_close(a, e, F32, atol_factor=10)  # the table's gradient sums up to 100 rows
    x, table, grad = x.to(BF16), table.to(BF16), grad.to(BF16)
    actual = run(features_call(3.0, 0.2))
    exact = run(features_reference(3.0, 0.2), F64)
    low = run(features_reference(3.0, 0.2))
    assert all(a.dtype == BF16 for a in actual)
    assert_errors_within_rule(["out", "x", "table"], exact, low, [a.double() for a in actual])

    empty = ops.positional_input_features(
        torch.empty(0, 5), torch.empty(0, dtype=torch.long), table[:, :5].float(), 1.0
    )
    assert empty.shape == (0, 5)
    x, positions, table = features_inputs(70, 12, 9, F64)
    strided = torch.cat([x, x], dim=1)[:, :12]
    grad = torch.randn(12, 70, dtype=F64).t()
    actual = forward_and_grads(
        lambda a, b: features_call(1.5, 0.5)(a, b, positions), leaves([strided, table]), grad
    )
    expected = forward_and_grads(
        lambda a, b: features_reference(1.5, 0.5)(a, b, positions), leaves([strided, table]), grad
    )
    for a, e in zip(actual, expected, strict=True):
        assert_close(a, e)
    x, positions, table = features_inputs(3000, 8, 50, F64)
    grad = torch.randn(3000, 8, dtype=F64)
    call = lambda a, b: features_call(2.0, 0.3)(a, b, positions)  # noqa: E731
    with num_threads(1):
        one = forward_and_grads(call, leaves([x, table]), grad)
    with num_threads(2):
        two = forward_and_grads(call, leaves([x, table]), grad)
    assert all(torch.equal(a, b) for a, b in zip(one, two, strict=True))


def test_features_opcheck_and_bad_input():
    x, positions, table = features_inputs(9, 5, 4, F32)
    opcheck(
        ops.positional_input_features,
        (x.requires_grad_(), positions, table.requires_grad_(), 2.0, 0.5, seed_tensor(1)),
    )
    opcheck(
        ops.positional_input_features_backward,
        (torch.randn(9, 5), x.detach(), positions, table.detach(), 2.0),
    )
    bad = [
        ({"positions": positions.clone().fill_(4)}, "positions must be in \\[0, 4\\)"),
        ({"positions": positions.clone().fill_(-1)}, "positions must be in"),
        ({"positions": positions.int()}, "positions must be int64"),
        ({"positions": positions[:5]}, "positions must have x.size\\(0\\)"),
        ({"position_weight": table[:, :3]}, "position_weight must have x.size\\(1\\)"),
        ({"position_weight": table.double()}, "position_weight and x must share one dtype"),
        ({"scale": float("inf")}, "scale must be a finite number"),
        ({"dropout_p": 1.5}, "dropout_p"),
        ({"dropout_p": 0.5}, "seed must be given"),
    ]
    for change, message in bad:
        args = {
            "x": x.detach(),
            "positions": positions,
            "position_weight": table.detach(),
            "scale": 2.0,
        }
        args.update(change)
        with pytest.raises((RuntimeError, ValueError), match=message):
            ops.positional_input_features(**args)
        with pytest.raises((RuntimeError, ValueError), match=message):
            ops.positional_input_features_backward(torch.randn(9, 5), **args)
    with pytest.raises(ValueError, match="grad_output must have x's shape"):
        ops.positional_input_features_backward(
            torch.randn(9, 4), x.detach(), positions, table.detach(), 2.0
        )
