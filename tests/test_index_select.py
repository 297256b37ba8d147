"""FBGEMM's index_select_dim0 family (docs/gather_and_relative_bias.md): group_index_select_dim0
with its helper ops group_index_select_dim0_gpu_impl / _gpu_backward, and batch_index_select_dim0
(_tensor, backward) against fbgemm-gpu-cpu and plain PyTorch (index_select / index_add)."""

import accuracy
import pytest
import torch
from threads import num_threads

import recops

ops = torch.ops.recops

INDEX_DTYPES = [torch.int32, torch.int64]
FLOAT_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


# --------------------------------------------------------------------------- references
def reference_group(inputs, indices):
    return [x.index_select(0, i.long()) for x, i in zip(inputs, indices, strict=False)]


def reference_scatter(grad, index, shape, dtype):
    out = torch.zeros(shape, dtype=torch.float64)
    return out.index_add_(0, index.long(), grad.double()).to(dtype)


def reference_batch(inputs, indices, num, rows, cols, permute):
    tables = torch.split(inputs, [r * c for r, c in zip(rows, cols, strict=True)])
    index = torch.split(indices, num)
    outs = [t.view(r, c)[i.long()] for t, i, r, c in zip(tables, index, rows, cols, strict=True)]
    if permute:
        return torch.cat(outs, dim=1).flatten()
    return torch.cat([o.flatten() for o in outs])


def reference_batch_backward(grad, indices, num, rows, cols, permute):
    index = torch.split(indices, num)
    if permute:
        grads = torch.split(grad.view(num[0], -1), cols, dim=1)
    else:
        grads = [
            g.view(n, c)
            for g, n, c in zip(
                torch.split(grad, [n * c for n, c in zip(num, cols, strict=True)]),
                num,
                cols,
                strict=True,
            )
        ]
    return torch.cat(
        [
            reference_scatter(g, i, (r, c), grad.dtype).flatten()
            for g, i, r, c in zip(grads, index, rows, cols, strict=True)
        ]
    )


def random_group(sizes, dtype=torch.float32, index_dtype=torch.int64, row_shape=(3,)):
    """One table and index per (rows, count), indices drawn with repeats."""
    inputs = [(torch.randn(rows, *row_shape) * 10).to(dtype) for rows, _ in sizes]
    indices = [torch.randint(0, max(rows, 1), (count,), dtype=index_dtype) for rows, count in sizes]
    return inputs, indices


def random_batch(rows, cols, num, dtype=torch.float32, index_dtype=torch.int64):
    inputs = (torch.randn(sum(r * c for r, c in zip(rows, cols, strict=True))) * 10).to(dtype)
    indices = torch.cat(
        [torch.randint(0, r, (n,), dtype=index_dtype) for r, n in zip(rows, num, strict=True)]
    )
    return inputs, indices


GROUP_SIZES = [
    [(10, 7)],
    [(5, 0), (1, 4), (50, 200)],  # an empty selection, a one-row table
    [(0, 0), (3, 3)],  # an empty table
    [(3000, 20000), (7, 9000)],  # many indices, parallel chunks and owned ranges
]


# --------------------------------------------------------------------------- group forward
@pytest.mark.parametrize("sizes", GROUP_SIZES)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("dtype", [*FLOAT_DTYPES, torch.int64, torch.int8, torch.bool])
def test_group_forward_matches_index_select(sizes, index_dtype, dtype):
    inputs, indices = random_group(sizes, dtype, index_dtype)
    actual = ops.group_index_select_dim0(inputs, indices)
    for a, e in zip(actual, reference_group(inputs, indices), strict=True):
        assert torch.equal(a, e)


@pytest.mark.parametrize("row_shape", [(), (4,), (2, 3), (0,)])
def test_group_forward_row_shapes_and_non_contiguous(row_shape):
    x = torch.randn(40, *row_shape).transpose(0, -1).contiguous().transpose(0, -1)
    index = torch.randint(0, 40, (30,))[::2]
    out = ops.group_index_select_dim0([x, x], [index, torch.tensor(3)])
    assert torch.equal(out[0], x.index_select(0, index))
    assert torch.equal(out[1], x.index_select(0, torch.tensor(3)))


def test_group_forward_selects_from_a_scalar_as_index_select_does():
    """A 0-D input is one row of one element, as in FBGEMM's CPU path (torch.index_select)."""
    inputs = [torch.tensor(3.0), torch.tensor(3.0), torch.arange(4.0)]
    indices = [torch.tensor([0]), torch.tensor(0), torch.tensor(2)]
    out = ops.group_index_select_dim0(inputs, indices)
    for a, x, i in zip(out, inputs, indices, strict=True):
        assert torch.equal(a, torch.index_select(x, 0, i))
    if recops.fbgemm_loaded:
        for a, e in zip(
            out, torch.ops.fbgemm.group_index_select_dim0(inputs, indices), strict=True
        ):
            assert torch.equal(a, e)
    with pytest.raises(IndexError, match=r"indices_group\[0\]\[0\] = 1"):
        ops.group_index_select_dim0([inputs[0]], [torch.tensor([1])])


def test_group_forward_mixed_index_dtypes_and_extra_inputs():
    # FBGEMM's group size is the number of index tensors: extra inputs are ignored.
    inputs, indices = random_group([(8, 5), (9, 6)])
    indices[1] = indices[1].int()
    out = ops.group_index_select_dim0([*inputs, torch.randn(2, 3)], indices)
    assert len(out) == 2
    for a, e in zip(out, reference_group(inputs, indices), strict=True):
        assert torch.equal(a, e)


def test_group_many_threads():
    inputs, indices = random_group([(5000, 100_000), (3, 50_000)], row_shape=(16,))
    with num_threads(4):
        out = ops.group_index_select_dim0(inputs, indices)
        grads = [torch.randn_like(o) for o in out]
        back = ops.group_index_select_dim0_gpu_backward(
            [*grads, *indices, torch.empty(0), torch.empty(0), inputs[0]],
            [s for x in inputs for s in x.shape],
        )
    for a, e in zip(out, reference_group(inputs, indices), strict=True):
        assert torch.equal(a, e)
    for g, i, x, b in zip(grads, indices, inputs, back[2:], strict=True):
        # ~17000 float32 additions per row of the small table.
        torch.testing.assert_close(
            b, reference_scatter(g, i, x.shape, x.dtype), rtol=1e-4, atol=1e-2
        )


# --------------------------------------------------------------------------- group backward
@pytest.mark.parametrize("sizes", GROUP_SIZES)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_group_gradients_match_index_add(sizes, index_dtype, dtype):
    inputs, indices = random_group(sizes, dtype, index_dtype)
    inputs = [x.requires_grad_() for x in inputs]
    out = ops.group_index_select_dim0(inputs, indices)
    grads = [torch.randn_like(o) for o in out]
    actual = torch.autograd.grad(out, inputs, grads)
    for a, g, i, x in zip(actual, grads, indices, inputs, strict=True):
        accuracy.assert_close(a, reference_scatter(g, i, x.shape, dtype))


def test_group_gpu_impl_returns_fbgemms_layout_and_gradients():
    inputs, indices = random_group([(6, 4), (5, 9)], torch.float64)
    inputs = [x.requires_grad_() for x in inputs]
    out = ops.group_index_select_dim0_gpu_impl([*indices, *inputs], 2)
    assert len(out) == 4 and out[2].numel() == 0 and out[3].dtype == torch.int64
    grads = torch.autograd.grad(out[:2], inputs, [torch.ones_like(o) for o in out[:2]])
    for g, i, x in zip(grads, indices, inputs, strict=True):
        assert torch.equal(g, reference_scatter(torch.ones(len(i), 3), i, x.shape, x.dtype))


def test_group_gradcheck():
    inputs, indices = random_group([(5, 7), (4, 3)], torch.float64)
    inputs = [x.requires_grad_() for x in inputs]
    torch.autograd.gradcheck(lambda *xs: ops.group_index_select_dim0(list(xs), indices), inputs)
    torch.autograd.gradcheck(
        lambda *xs: ops.group_index_select_dim0_gpu_impl([*indices, *xs], 2)[:2], inputs
    )


# --------------------------------------------------------------------------- batch
BATCH_SIZES = [
    ([5, 7, 3], [4, 2, 3], [6, 6, 6]),
    ([1, 9], [1, 5], [3, 3]),
    ([2000, 40], [16, 8], [30000, 30000]),  # parallel chunks and owned ranges
]


@pytest.mark.parametrize("permute", [False, True])
@pytest.mark.parametrize("sizes", BATCH_SIZES)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_batch_matches_reference(permute, sizes, index_dtype, dtype):
    rows, cols, num = sizes
    inputs, indices = random_batch(rows, cols, num, dtype, index_dtype)
    expected = reference_batch(inputs, indices, num, rows, cols, permute)
    tensor_args = [torch.tensor(v) for v in (num, rows, cols)]
    assert torch.equal(
        ops.batch_index_select_dim0(inputs, indices, num, rows, cols, permute), expected
    )
    assert torch.equal(
        ops.batch_index_select_dim0_tensor(inputs, indices, *tensor_args, permute), expected
    )
    grad = torch.randn(expected.shape).to(dtype)
    ref = reference_batch_backward(grad, indices, num, rows, cols, permute)
    for op, args in [
        (ops.batch_index_select_dim0, (num, rows, cols)),
        (ops.batch_index_select_dim0_tensor, tensor_args),
    ]:
        x = inputs.clone().requires_grad_()
        (actual,) = torch.autograd.grad(op(x, indices, *args, permute), x, grad)
        # Up to 750 rows summed in float32: their cancelling terms round to ~1e-4 (half and
        # bfloat16 round once at the end, float64 stays within its own bound).
        accuracy.assert_close(actual, ref, atol_factor=10 if dtype == torch.float32 else 1)


def test_batch_unequal_counts_and_empty_inputs():
    rows, cols, num = [4, 6], [3, 2], [2, 9]
    inputs, indices = random_batch(rows, cols, num)
    out = ops.batch_index_select_dim0(inputs, indices, num, rows, cols)
    assert torch.equal(out, reference_batch(inputs, indices, num, rows, cols, False))
    # FBGEMM returns an empty output for empty inputs, whatever the sizes say.
    empty = torch.empty(0, requires_grad=True)
    out = ops.batch_index_select_dim0(empty, indices, num, rows, cols)
    assert out.shape == (0,)
    (grad,) = torch.autograd.grad(out, empty, torch.empty(0))
    assert grad.shape == (0,)


def test_batch_inputs_with_trailing_unit_dims():
    """FBGEMM splits inputs along dim 0 and views each piece as [rows, columns], so [N, 1] inputs
    work as [N] does; the gradient keeps the inputs' shape."""
    rows, cols, num = [5, 7], [4, 2], [6, 6]
    flat, indices = random_batch(rows, cols, num)
    inputs = flat.view(-1, 1).requires_grad_()
    out = ops.batch_index_select_dim0(inputs, indices, num, rows, cols)
    assert torch.equal(out, reference_batch(flat, indices, num, rows, cols, False))
    if recops.fbgemm_loaded:
        fbgemm_out = torch.ops.fbgemm.batch_index_select_dim0(inputs, indices, num, rows, cols)
        assert torch.equal(out, fbgemm_out)
    grad = torch.randn_like(out)
    (actual,) = torch.autograd.grad(out, inputs, grad)
    (expected,) = torch.autograd.grad(
        ops.batch_index_select_dim0(flat.requires_grad_(), indices, num, rows, cols), flat, grad
    )
    assert torch.equal(actual, expected.view(-1, 1))
    with pytest.raises(RuntimeError, match=r"inputs must be 1-D, or \[N, 1, ...\]"):
        ops.batch_index_select_dim0(flat.detach().view(-1, 2), indices, num, rows, cols)


def test_batch_backward_cpu_impl_matches_reference():
    rows, cols, num = [5, 7], [4, 2], [6, 6]
    _, indices = random_batch(rows, cols, num)
    for permute in (False, True):
        grad = torch.randn(sum(n * c for n, c in zip(num, cols, strict=True)))
        n, r, c = (torch.tensor(v) for v in (num, rows, cols))
        actual = ops.batch_index_select_dim0_backward_cpu_impl(
            grad, indices, n, n, r, c, permute, torch.tensor([34])
        )
        expected = reference_batch_backward(grad, indices, num, rows, cols, permute)
        torch.testing.assert_close(actual, expected)
    empty = ops.batch_index_select_dim0_backward_cpu_impl(
        grad, indices, n, n, r, c, False, torch.tensor([0])
    )
    assert empty.shape == (0,)


def test_batch_gradcheck():
    rows, cols, num = [5, 3], [2, 3], [4, 4]
    inputs, indices = random_batch(rows, cols, num, torch.float64)
    inputs.requires_grad_()
    for permute in (False, True):

        def select(x, permute=permute):
            return ops.batch_index_select_dim0(x, indices, num, rows, cols, permute)

        torch.autograd.gradcheck(select, inputs)
        torch.autograd.gradgradcheck(select, inputs)


# --------------------------------------------------------------------------- against FBGEMM
@pytest.mark.parametrize("sizes", GROUP_SIZES[:3])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_group_matches_fbgemm(fbgemm_ops, sizes, dtype):
    inputs, indices = random_group(sizes, dtype)
    results = []
    for op in (ops, fbgemm_ops):
        xs = [x.clone().requires_grad_() for x in inputs]
        out = op.group_index_select_dim0(xs, indices)
        grads = torch.autograd.grad(out, xs, [torch.ones_like(o) * 1.5 for o in out])
        impl = op.group_index_select_dim0_gpu_impl([*indices, *inputs], len(indices))
        results.append([*out, *grads, *impl[: len(indices)]])
    for a, e in zip(*results, strict=True):
        assert torch.equal(a, e)


def test_group_backward_matches_fbgemm_dtype_rule(fbgemm_ops):
    # FBGEMM's backward op computes every group's gradient in the first input's dtype.
    x = torch.randn(5, 3)
    index = torch.tensor([0, 3, 3])
    args = (
        [torch.ones(3, 3), torch.ones(3, 3, dtype=torch.float64), index, index]
        + [torch.empty(0), torch.empty(0), x],
        [5, 3, 4, 3],
    )
    actual = ops.group_index_select_dim0_gpu_backward(*args)
    expected = fbgemm_ops.group_index_select_dim0_gpu_backward(*args)
    assert [t.dtype for t in actual] == [t.dtype for t in expected]
    for a, e in zip(actual, expected, strict=True):
        assert torch.equal(a, e)


@pytest.mark.parametrize("permute", [False, True])
@pytest.mark.parametrize("sizes", BATCH_SIZES[:2])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_batch_matches_fbgemm(fbgemm_ops, permute, sizes, dtype):
    rows, cols, num = sizes
    inputs, indices = random_batch(rows, cols, num, dtype)
    tensor_args = [torch.tensor(v) for v in (num, rows, cols)]
    results = []
    for op in (ops, fbgemm_ops):
        row = []
        for fn, args in [
            (op.batch_index_select_dim0, (num, rows, cols)),
            (op.batch_index_select_dim0_tensor, tensor_args),
        ]:
            x = inputs.clone().requires_grad_()
            out = fn(x, indices, *args, permute)
            (grad,) = torch.autograd.grad(out, x, torch.arange(out.numel()).to(dtype))
            row += [out, grad]
        n, r, c = tensor_args
        row.append(
            op.batch_index_select_dim0_backward_cpu_impl(
                torch.ones(out.numel(), dtype=dtype),
                indices,
                n,
                n,
                r,
                c,
                permute,
                torch.tensor([inputs.numel()]),
            )
        )
        results.append(row)
    for a, e in zip(*results, strict=True):
        torch.testing.assert_close(a, e, rtol=0, atol=0)


# --------------------------------------------------------------------------- opcheck
def test_opcheck():
    inputs, indices = random_group([(6, 4), (5, 9)], torch.float64)
    grads_inputs = [x.clone().requires_grad_() for x in inputs]
    torch.library.opcheck(ops.group_index_select_dim0, (grads_inputs, indices))
    torch.library.opcheck(ops.group_index_select_dim0_gpu_impl, ([*indices, *grads_inputs], 2))
    torch.library.opcheck(
        ops.group_index_select_dim0_gpu_backward,
        (
            [
                torch.randn(4, 3),
                torch.randn(9, 3),
                *indices,
                torch.empty(0),
                torch.empty(0),
                inputs[0],
            ],
            [6, 3, 5, 3],
        ),
    )
    rows, cols, num = [5, 7], [4, 2], [6, 6]
    x, index = random_batch(rows, cols, num, torch.float64)
    for permute in (False, True):
        torch.library.opcheck(
            ops.batch_index_select_dim0,
            (x.clone().requires_grad_(), index, num, rows, cols, permute),
        )
        torch.library.opcheck(
            ops.batch_index_select_dim0_backward,
            (torch.randn(36, dtype=torch.float64), index, num, rows, cols, permute),
        )
    n, r, c = (torch.tensor(v) for v in (num, rows, cols))
    # Data-dependent output sizes: no static-shape tests.
    utils = ("test_schema", "test_autograd_registration", "test_faketensor")
    torch.library.opcheck(
        ops.batch_index_select_dim0_tensor,
        (x.clone().requires_grad_(), index, n, r, c),
        test_utils=utils,
    )
    torch.library.opcheck(
        ops.batch_index_select_dim0_backward_cpu_impl,
        (torch.randn(36, dtype=torch.float64), index, n, n, r, c, False, torch.tensor([34])),
        test_utils=utils,
    )


# --------------------------------------------------------------------------- bad input
def test_group_bad_input():
    x = torch.randn(5, 3)
    with pytest.raises(IndexError, match=r"indices_group\[1\] entries must be in \[0, 5\)"):
        ops.group_index_select_dim0([x, x], [torch.tensor([0]), torch.tensor([1, 5])])
    with pytest.raises(IndexError, match=r"indices_group\[0\]\[1\] = -1"):
        ops.group_index_select_dim0([x], [torch.tensor([0, -1])])
    with pytest.raises(RuntimeError, match="input_group must hold one tensor per entry"):
        ops.group_index_select_dim0([x], [torch.tensor([0]), torch.tensor([0])])
    with pytest.raises(RuntimeError, match=r"indices_group\[0\] must be int32 or int64"):
        ops.group_index_select_dim0([x], [torch.tensor([0.0])])
    with pytest.raises(RuntimeError, match=r"indices_group\[0\] must be 1-D"):
        ops.group_index_select_dim0([x], [torch.tensor([[0]])])
    with pytest.raises(IndexError, match=r"indices_group\[0\] must hold exactly one index when "):
        ops.group_index_select_dim0([torch.tensor(1.0)], [torch.tensor([0, 0])])
    with pytest.raises(RuntimeError, match="inputs must hold group_size"):
        ops.group_index_select_dim0_gpu_impl([torch.tensor([0]), x], 2)
    index = torch.tensor([0, 4])
    with pytest.raises(RuntimeError, match="output_shape_group must hold 2 sizes"):
        ops.group_index_select_dim0_gpu_backward(
            [torch.ones(2, 3), index, torch.empty(0), torch.empty(0), x], [5]
        )
    with pytest.raises(IndexError, match=r"entries must be in \[0, 4\)"):
        ops.group_index_select_dim0_gpu_backward(
            [torch.ones(2, 3), index, torch.empty(0), torch.empty(0), x], [4, 3]
        )
    with pytest.raises(RuntimeError, match="must have shape"):
        ops.group_index_select_dim0_gpu_backward(
            [torch.ones(3, 3), index, torch.empty(0), torch.empty(0), x], [5, 3]
        )


def test_batch_bad_input():
    rows, cols, num = [5, 7], [4, 2], [6, 6]
    x, index = random_batch(rows, cols, num)
    with pytest.raises(IndexError, match=r"indices of table 1 must be in \[0, 7\)"):
        ops.batch_index_select_dim0(x, torch.cat([index[:6], index[6:] + 7]), num, rows, cols)
    with pytest.raises(RuntimeError, match="input_rows must have the same length"):
        ops.batch_index_select_dim0(x, index, num, rows[:1], cols)
    with pytest.raises(ValueError, match=r"input_num_indices entries must be > 0"):
        ops.batch_index_select_dim0(x, index, [12, 0], rows, cols)
    with pytest.raises(ValueError, match="must all be equal with permute_output_dim_0_1"):
        ops.batch_index_select_dim0(x, index, [4, 8], rows, cols, True)
    with pytest.raises(RuntimeError, match=r"inputs must hold sum\(input_rows \* input_columns\)"):
        ops.batch_index_select_dim0(x[:-1], index, num, rows, cols)
    with pytest.raises(RuntimeError, match=r"indices must hold sum\(input_num_indices\) = 12"):
        ops.batch_index_select_dim0(x, index[:-1], num, rows, cols)
    with pytest.raises(ValueError, match="overflows int64"):
        ops.batch_index_select_dim0(x, index, num, [2**62, 7], cols)
    with pytest.raises(RuntimeError, match="input_rows must be int64"):
        ops.batch_index_select_dim0_tensor(
            x, index, torch.tensor(num), torch.tensor(rows, dtype=torch.int32), torch.tensor(cols)
        )
    with pytest.raises(RuntimeError, match="grad_output must hold 36 elements"):
        ops.batch_index_select_dim0_backward(torch.ones(35), index, num, rows, cols, False)


def test_fbgemm_batch_select_runs_under_inference_mode():
    # FBGEMM registers batch_index_select_dim0 at AutogradCPU only; inference mode skips autograd
    # keys and reaches the CPU key, which recops fills when FBGEMM is installed (and defines when
    # it is not).
    rows, cols, num = [5, 7], [4, 2], [6, 6]
    x, index = random_batch(rows, cols, num)
    with torch.inference_mode():
        out = torch.ops.fbgemm.batch_index_select_dim0(x, index, num, rows, cols, True)
    assert torch.equal(out, reference_batch(x, index, num, rows, cols, True))
