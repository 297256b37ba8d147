"""torch.library.opcheck on every op with the valid calls op_cases.CASES draws (schema, fake kernel,
autograd registration, AOT dispatch), with and without inputs that require grad; torch.ops.fbgemm's
definition too where recops serves it (FBGEMM hidden); and gradcheck in float64 of every
differentiable op on a small call op_cases draws in float64. Tests of special inputs (empty
batches, hints, non-contiguous views) stay with their op's suite."""

import pytest
import torch
from op_cases import CASES
from torch.library import opcheck

import recops

SEEDS = range(2)
# Draws tried for a float64 call small enough for gradcheck (one forward pass per input element).
GRADCHECK_DRAWS = range(40)
GRADCHECK_MAX_ELEMENTS = 400
ALL_TESTS = (
    "test_schema",
    "test_autograd_registration",
    "test_faketensor",
    "test_aot_dispatch_dynamic",
)


def differentiable(case):
    return any(
        torch._C._dispatch_has_kernel_for_dispatch_key(case.op.default.name(), key)
        for key in ("Autograd", "CompositeImplicitAutograd")
    )


def written(case):
    """Arguments the op writes in place (Tensor(a!)): never leaves that require grad."""
    schema = case.op.default._schema
    return {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}


def map_floats(value, fn):
    """value with fn applied to each floating-point tensor in it (lists and tuples walked)."""
    if isinstance(value, torch.Tensor):
        return fn(value) if value.is_floating_point() else value
    if isinstance(value, list | tuple):
        return type(value)(map_floats(item, fn) for item in value)
    return value


def float_tensors(value):
    found = []
    map_floats(value, found.append)
    return found


def with_grad(args, skip):
    """args with every floating-point tensor outside `skip` a fresh leaf that requires grad."""

    def leaf(t):
        return t.detach().clone().requires_grad_()

    return {n: v if n in skip else map_floats(v, leaf) for n, v in args.items()}


def outputs(result):
    return list(result) if isinstance(result, list | tuple) else [result]


def opcheck_tests(case, args):
    """What opcheck runs: its AOT dispatch test cannot take an op whose outputs alias its inputs
    (out= ops), nor, once inputs require grad, integer outputs (it sums every output into the
    loss)."""
    schema = case.op.default._schema
    if any(r.alias_info is not None for r in schema.returns):
        return ALL_TESTS[:3]
    needs_grad = any(t.requires_grad for v in args.values() for t in float_tensors(v))
    if needs_grad:
        result = case.op(
            **{n: v.detach() if isinstance(v, torch.Tensor) else v for n, v in args.items()}
        )
        if any(isinstance(t, torch.Tensor) and not t.is_floating_point() for t in outputs(result)):
            return ALL_TESTS[:3]
    return ALL_TESTS


def namespaces(case):
    """recops' op, and torch.ops.fbgemm's of the same schema when recops defines it (FBGEMM
    hidden or absent)."""
    found = [case.op.default]
    fbgemm = getattr(torch.ops.fbgemm, case.op_name, None)
    if not recops.fbgemm_loaded and fbgemm is not None:
        names = [a.name for a in fbgemm.default._schema.arguments]
        if names == case.arg_names():
            found.append(fbgemm.default)
    return found


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("case", CASES, ids=lambda case: case.op_name)
def test_opcheck(case, seed):
    args = case.call(seed)
    for op in namespaces(case):
        opcheck(op, (), args, test_utils=opcheck_tests(case, args))


@pytest.mark.parametrize("case", [c for c in CASES if differentiable(c)], ids=lambda c: c.op_name)
def test_opcheck_with_grad(case):
    args = with_grad(case.call(0), written(case))
    for op in namespaces(case):
        opcheck(op, (), args, test_utils=opcheck_tests(case, args))


def float64_call(case):
    """The first drawn call whose floating-point tensors are all float64 and small; None if none."""
    for seed in GRADCHECK_DRAWS:
        args = case.call(seed)
        floats = [t for n, v in args.items() if n not in written(case) for t in float_tensors(v)]
        if (
            floats
            and all(t.dtype == torch.float64 for t in floats)
            and 0 < sum(t.numel() for t in floats) <= GRADCHECK_MAX_ELEMENTS
        ):
            return args
    return None


@pytest.mark.parametrize("case", [c for c in CASES if differentiable(c)], ids=lambda c: c.op_name)
def test_gradcheck(case):
    args = float64_call(case)
    if args is None:
        pytest.skip("op_cases draws no small float64 call of this op")
    args = with_grad(args, written(case))
    names = [n for n, v in args.items() if n not in written(case) and float_tensors(v)]
    leaves = [t for n in names for t in float_tensors(args[n])]

    def rebuild(flat):
        """args with the leaves replaced, in order, by gradcheck's perturbed tensors."""
        it = iter(flat)
        return {n: map_floats(v, lambda _: next(it)) if n in names else v for n, v in args.items()}

    def fn(*flat):
        result = outputs(case.op(**rebuild(flat)))
        return tuple(t for t in result if isinstance(t, torch.Tensor) and t.is_floating_point())

    assert torch.autograd.gradcheck(fn, leaves)
