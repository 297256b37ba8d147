"""How ops are declared and registered (docs/design.md, "One rule each"): arguments are found by
schema name, never by position; every op names the Python module that holds its fake kernel and
autograd; options pass through the Python entry points by name."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import recops
from recops._autograd import _grad_positions

ops = torch.ops.recops

# (forward, backward) of the ops whose autograd calls a backward op.
AUTOGRAD_PAIRS = [
    ("hstu_dense_forward", "hstu_dense_backward"),
    ("hstu_dense_forward_fuxi", "hstu_dense_backward_fuxi"),
    ("disentangled_attention", "disentangled_attention_backward"),
    ("hstu_layer_input", "hstu_layer_input_backward"),
    ("hstu_layer_output", "hstu_layer_output_backward"),
    ("fuxi_layer_ffn", "fuxi_layer_ffn_backward"),
    ("l2_normalize", "l2_normalize_backward"),
    ("positional_input_features", "positional_input_features_backward"),
]


def recops_op_names():
    return sorted(n for n in torch._C._dispatch_get_all_op_names() if n.startswith("recops::"))


@pytest.mark.parametrize("forward,backward", AUTOGRAD_PAIRS)
def test_backward_results_are_named_after_forward_inputs(forward, backward):
    fwd, bwd = getattr(ops, forward).default, getattr(ops, backward).default
    names = [a.name for a in fwd._schema.arguments]
    positions = _grad_positions(fwd, bwd)
    for result, position in zip(bwd._schema.returns, positions, strict=True):
        assert result.name == f"grad_{names[position]}"
        assert fwd._schema.arguments[position].type.isSubtypeOf(torch._C.OptionalType.ofTensor())
    # Every forward argument the backward shares has the same type there.
    shared = {a.name: a for a in bwd._schema.arguments}
    for a in fwd._schema.arguments:
        if a.name in shared:
            assert str(shared[a.name].type) == str(a.type), a.name


def test_every_op_names_its_python_module():
    """m.set_python_module in each registration file: an op used without `import recops` (its
    fake kernel missing) tells which module to import."""
    for name in recops_op_names():
        if name == "recops::_route_fbgemm_op":  # private, no tensors, no fake kernel
            continue
        stub = torch._C._dispatch_pystub(name, "")
        assert stub is not None, name
        assert stub[0].startswith("recops."), (name, stub)
        __import__(stub[0])


def test_library_alone_points_fake_users_to_the_module():
    library = recops._library.load()
    script = textwrap.dedent(
        f"""
        import torch
        from torch._subclasses.fake_tensor import FakeTensorMode
        torch.ops.load_library({library!r})
        q = torch.randn(4, 1, 8)
        args = (q, q, q, torch.tensor([0, 4]), None, 4)
        def fake(mode, args):
            return [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        try:
            with FakeTensorMode() as mode:
                torch.ops.recops.hstu_dense_forward(*fake(mode, args))
            raise SystemExit("no error without the fake kernel")
        except SystemExit:
            raise
        except Exception as e:
            # FakeTensorMode re-raises torch's error, which names the module, from its own.
            messages = " ".join(str(x) for x in (e, e.__context__, e.__cause__) if x is not None)
            assert "'recops.operators.hstu' Python module" in messages, messages
        import recops.operators.hstu  # noqa: F401
        with FakeTensorMode() as mode:
            out = torch.ops.recops.hstu_dense_forward(*fake(mode, args))
        assert out.shape == (4, 1, 8)
        """
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr[-3000:]


def jagged_qkv():
    torch.manual_seed(0)
    q, k, v = (torch.randn(7, 2, 8, dtype=torch.float64) for _ in range(3))
    return q, k, v, torch.tensor([0, 3, 7]), 4


def test_options_pass_through_by_name():
    q, k, v, offsets, n = jagged_qkv()
    default = recops.hstu_attention(q, k, v, offsets, n, alpha=0.5)
    explicit = recops.hstu_attention(q, k, v, offsets, n, alpha=0.5, silu_scale=1.0 / n)
    torch.testing.assert_close(default, explicit, rtol=0, atol=0)
    scaled = recops.hstu_attention(q, k, v, offsets, n, alpha=0.5, silu_scale=2.0 / n)
    torch.testing.assert_close(scaled, 2 * default)
    for fn in (recops.hstu_attention, recops.fuxi_attention):
        with pytest.raises(Exception, match="no_such_option"):
            fn(q, k, v, offsets, n, no_such_option=1)


# The pairs whose autograd is bound in C++ (csrc/recops/common/backward_op_autograd.h); DeBERTa's
# backward also takes the forward's results, so its autograd stays in Python.
CPP_BOUND_PAIRS = [pair for pair in AUTOGRAD_PAIRS if pair[0] != "disentangled_attention"]


@pytest.mark.parametrize("forward,backward", CPP_BOUND_PAIRS)
def test_cpp_bound_autograd_takes_the_forwards_arguments(forward, backward):
    """The convention the C++ binding relies on: grad_output, then exactly the forward's
    arguments in order."""
    fwd, bwd = getattr(ops, forward).default, getattr(ops, backward).default
    names = [a.name for a in bwd._schema.arguments]
    assert names == ["grad_output"] + [a.name for a in fwd._schema.arguments]


def normalize_call():
    torch.manual_seed(0)
    x = torch.randn(5, 8, dtype=torch.float64, requires_grad=True)
    return x, ops.l2_normalize(x), torch.randn(5, 8, dtype=torch.float64)


def test_cpp_bound_autograd_calls_the_backward_op():
    x, out, g = normalize_call()
    assert out.grad_fn.name() == "recops::l2_normalize_backward"
    expected = ops.l2_normalize_backward(g, x.detach())
    (grad,) = torch.autograd.grad(out, x, g, retain_graph=True)
    torch.testing.assert_close(grad, expected, rtol=0, atol=0)
    # A non-contiguous gradient reaches the backward op as its contiguous copy.
    g_t = g.t().contiguous().t()
    (grad,) = torch.autograd.grad(out, x, g_t)
    torch.testing.assert_close(grad, expected, rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="second time"):
        torch.autograd.grad(out, x, g)
    with torch.no_grad():
        assert ops.l2_normalize(x).grad_fn is None
    assert ops.l2_normalize(x.detach()).grad_fn is None


def test_cpp_bound_autograd_rejects_an_input_changed_in_place():
    x = torch.randn(5, 8, requires_grad=True)
    y = x * 2
    out = ops.l2_normalize(y)
    y.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def layer_input_call():
    torch.manual_seed(0)
    x = torch.randn(6, 4, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, 8, dtype=torch.float64, requires_grad=True)
    b = torch.randn(8, dtype=torch.float64, requires_grad=True)
    return x, w, b


def test_cpp_bound_autograd_gives_zeros_for_an_unused_piece():
    x, w, b = layer_input_call()
    u, v = ops.hstu_layer_input(x, w, b, "layer_norm", 1e-6, [3, 5])
    g = torch.randn_like(u)
    grads = torch.autograd.grad(u, (x, w, b), g)  # v takes no part
    expected = ops.hstu_layer_input_backward(
        [g, torch.zeros_like(v)], x.detach(), w.detach(), b.detach(), "layer_norm", 1e-6, [3, 5]
    )
    for got, want in zip(grads, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_cpp_bound_autograd_passes_the_residual_gradient_through():
    torch.manual_seed(0)
    x, u, attn = (torch.randn(6, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    w = torch.randn(4, 4, dtype=torch.float64, requires_grad=True)
    out = ops.hstu_layer_output(x, u, attn, w, None)
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, (x, u, attn, w), g)
    torch.testing.assert_close(grads[0], g, rtol=0, atol=0)
    detached = (t.detach() for t in (x, u, attn, w))
    expected = ops.hstu_layer_output_backward(g, *detached, None)
    for got, want in zip(grads[1:], expected[:3], strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
