"""The rest of an HSTU / FuXi-alpha layer (docs/ops.md §8): a dropout whose mask is regenerated
from a counter-based hash instead of stored, the fused input projection of a layer,
``silu(norm(x) @ weight + bias)``, its fused output,
``x + dropout(u * norm(attn)) @ weight.T + bias``, FuXi-alpha's fused feed-forward stage, the
models' input features (scaled embeddings plus position embeddings, dropout) and the row-wise L2
normalisation of their states.
Python entry points, fake kernels and the dropout's autograd; the other ops' autograd calls their
backward ops from C++ (csrc/recops/layer/ops.cpp; kernels: csrc/recops/layer/kernels/).

Seeds: each call with a nonzero rate draws its seed, a one-element int64 tensor, from torch's
default generator, so ``torch.manual_seed`` makes a run reproducible and a compiled graph draws a
new one each step (an int drawn in Python would be a constant of the graph); the backward
regenerates the mask from that seed, and the mask does not depend on the thread count."""

from __future__ import annotations

import torch
from torch.library import register_autograd

from recops._autograd import input_grads, named_arguments
from recops._fake import register_fake

ops = torch.ops.recops
_DROPOUT = ops.counter_dropout.default
_OUTPUT, _OUTPUT_BACKWARD = ops.hstu_layer_output.default, ops.hstu_layer_output_backward.default
_INPUT, _INPUT_BACKWARD = ops.hstu_layer_input.default, ops.hstu_layer_input_backward.default
_INPUT_GRADS = ("x", "weight", "bias")


def draw_seed() -> torch.Tensor:
    """A dropout seed from torch's default generator: a 0-d int64 tensor."""
    return torch.randint(0, 2**62, (), dtype=torch.int64)


def _contiguous_like(t):
    return None if t is None else torch.empty_like(t, memory_format=torch.contiguous_format)


@register_fake("recops::counter_dropout")
def _dropout_fake(x, p, seed, offset=0):
    return _contiguous_like(x)


def _dropout_setup(ctx, inputs, output):
    a = named_arguments(_DROPOUT, inputs)
    ctx.p, ctx.offset = a["p"], a["offset"]
    ctx.save_for_backward(a["seed"])


def _dropout_backward(ctx, grad_output):
    # The mask times the scale is the Jacobian: the same op on the gradient.
    (seed,) = ctx.saved_tensors
    grad = ops.counter_dropout(grad_output, ctx.p, seed, ctx.offset)
    return input_grads(ctx, grad, None, None, None)


register_autograd("recops::counter_dropout", _dropout_backward, setup_context=_dropout_setup)


@register_fake("recops::hstu_layer_input")
def _input_fake(*args, **kwargs):
    a = named_arguments(_INPUT, args, kwargs)
    widths = list(a["split"]) or [a["weight"].shape[1]]
    return [a["x"].new_empty((a["x"].shape[0], cols)) for cols in widths]


@register_fake("recops::hstu_layer_input_backward")
def _input_backward_fake(*args, **kwargs):
    a = named_arguments(_INPUT_BACKWARD, args, kwargs)
    return tuple(_contiguous_like(a[name]) for name in _INPUT_GRADS)


# Under CPU autocast (bf16) the projection runs in bf16 as the composition's matmul does, so the
# attention that reads its output gets the same dtype either way.
torch.library.register_autocast("recops::hstu_layer_input", "cpu", torch.bfloat16)


@register_fake("recops::hstu_layer_output")
def _output_fake(*args, **kwargs):
    return _contiguous_like(named_arguments(_OUTPUT, args, kwargs)["x"])


@register_fake("recops::hstu_layer_output_backward")
def _output_backward_fake(*args, **kwargs):
    a = named_arguments(_OUTPUT_BACKWARD, args, kwargs)
    return tuple(_contiguous_like(a[name]) for name in ("u", "attn", "weight", "bias"))


# Under autocast the operands arrive in mixed dtypes (u and attn from bf16 products, x and the
# weights fp32): the op computes in fp32, as the composition's norm does, and returns fp32 like
# the composition's residual sum.
torch.library.register_autocast("recops::hstu_layer_output", "cpu", torch.float32)


_FEATURES = ops.positional_input_features.default
_FEATURES_BACKWARD = ops.positional_input_features_backward.default


@register_fake("recops::positional_input_features")
def _features_fake(*args, **kwargs):
    return _contiguous_like(named_arguments(_FEATURES, args, kwargs)["x"])


@register_fake("recops::positional_input_features_backward")
def _features_backward_fake(*args, **kwargs):
    a = named_arguments(_FEATURES_BACKWARD, args, kwargs)
    return _contiguous_like(a["x"]), _contiguous_like(a["position_weight"])


@register_fake("recops::l2_normalize")
def _normalize_fake(x, eps=1e-6):
    return _contiguous_like(x)


@register_fake("recops::l2_normalize_backward")
def _normalize_backward_fake(grad_output, x, eps=1e-6):
    return _contiguous_like(x)


_FFN, _FFN_BACKWARD = ops.fuxi_layer_ffn.default, ops.fuxi_layer_ffn_backward.default


@register_fake("recops::fuxi_layer_ffn")
def _ffn_fake(*args, **kwargs):
    return _contiguous_like(named_arguments(_FFN, args, kwargs)["x"])


@register_fake("recops::fuxi_layer_ffn_backward")
def _ffn_backward_fake(*args, **kwargs):
    a = named_arguments(_FFN_BACKWARD, args, kwargs)
    return tuple(_contiguous_like(a[name]) for name in ("x", "gate", "up", "down"))


# Under autocast: fp32, as the output op (the residual stream stays fp32).
torch.library.register_autocast("recops::fuxi_layer_ffn", "cpu", torch.float32)


def counter_dropout(
    x: torch.Tensor, p: float = 0.5, training: bool = True, *, offset: int = 0
) -> torch.Tensor:
    """``F.dropout`` with a mask drawn from a counter-based hash of (seed, ``offset``, element)
    instead of a stored Bernoulli tensor: kept elements are scaled by ``1 / (1 - p)``. Returns
    ``x`` itself when not training or ``p == 0``. ``offset`` tells apart dropouts that share a
    seed (callers passing ``seed`` to the op themselves)."""
    if not training or p == 0:
        return x
    return ops.counter_dropout(x, p, draw_seed(), offset)


def hstu_layer_input(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    norm: str = "layer_norm",
    eps: float = 1e-6,
    split: list[int] | None = None,
) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """``silu(norm(x) @ weight + bias)`` in one fused op: an HSTU (``norm="layer_norm"``) or
    FuXi-alpha (``norm="rms_norm"``) layer's input projection. ``x [L, D]``, ``weight [D, N]``,
    ``bias [N]`` or None; one floating dtype (bf16 / fp16 compute in fp32). The backward
    recomputes the normalised rows and the pre-activation instead of storing them.

    With ``split`` (column counts summing to N) the result is ``torch.split(out, split, dim=1)``
    as separate tensors (a layer's u, v, q, k): the op writes each piece and its backward reads
    each piece's gradient where it lies, so no split's backward concatenates them. Without it, the
    ``[L, N]`` tensor."""
    pieces = ops.hstu_layer_input(x, weight, bias, norm, eps, split or [])
    return pieces[0] if split is None else tuple(pieces)


def positional_input_features(
    x: torch.Tensor,
    positions: torch.Tensor,
    position_weight: torch.Tensor,
    scale: float,
    dropout_p: float = 0.0,
    training: bool = True,
    *,
    offset: int = 0,
) -> torch.Tensor:
    """``counter_dropout(scale * x + position_weight[positions], dropout_p)`` in one op: a
    sequence model's input features (generative-recommenders' learnable positional embedding
    preprocessor: item embeddings times sqrt(d) plus each row's position embedding, then
    dropout). ``x [L, D]``, ``positions [L]`` int64 in ``[0, position_weight.shape[0])``,
    ``position_weight [N, D]``. The mask is ``counter_dropout``'s with the seed this call draws
    from torch's generator (none when not training or ``dropout_p == 0``); the backward
    regenerates it and sums the table's gradient over rows in fixed chunks."""
    if not training or dropout_p == 0:
        return ops.positional_input_features(x, positions, position_weight, scale)
    return ops.positional_input_features(
        x, positions, position_weight, scale, dropout_p, draw_seed(), offset
    )


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / x.norm(dim=-1, keepdim=True).clamp(min=eps)`` for ``x [L, D]`` in one op (the
    models' unit-norm states; ``F.normalize(x, dim=-1, eps=eps)``): each row's length in double,
    the backward recomputing it from ``x``. One floating dtype (bf16 / fp16 compute in fp32)."""
    return ops.l2_normalize(x, eps)


def hstu_layer_output(
    x: torch.Tensor,
    u: torch.Tensor,
    attn: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    norm: str = "layer_norm",
    eps: float = 1e-6,
    dropout_p: float = 0.0,
    offset: int = 0,
) -> torch.Tensor:
    """``x + counter_dropout(u * norm(attn), dropout_p) @ weight.T + bias`` in one fused op: the
    output of an HSTU layer (``norm="layer_norm"``) or FuXi-alpha's AMS output
    (``norm="rms_norm"``), norms without affine weights.

    Args:
        x: ``[L, D]`` residual rows; u, attn: ``[L, K]``; weight: ``[D, K]`` (``nn.Linear``'s);
            bias: ``[D]`` or None. One floating dtype (bf16 / fp16 compute in fp32).
        eps: the norm's epsilon. dropout_p: the gated values' dropout (pass 0 in eval mode).
    """
    seed = draw_seed() if dropout_p > 0 else None
    return ops.hstu_layer_output(x, u, attn, weight, bias, norm, eps, dropout_p, seed, offset)


def fuxi_layer_ffn(
    x: torch.Tensor,
    gate: torch.Tensor,
    up: torch.Tensor,
    down: torch.Tensor,
    *,
    norm: str = "rms_norm",
    eps: float = 1e-6,
    dropout_p: float = 0.0,
    offset: int = 0,
) -> torch.Tensor:
    """FuXi-alpha's feed-forward stage (MFFN stage 2, SwiGLU) in one fused op:
    ``x + (silu(h @ gate.T) * (h @ up.T)) @ down.T`` with ``h = counter_dropout(norm(x),
    dropout_p)``; ``gate, up [hidden, D]``, ``down [D, hidden]`` (``nn.Linear``'s weights, no
    biases), ``x [L, D]``. The backward recomputes h, the products and the gate, and regenerates
    the mask, instead of storing them."""
    seed = draw_seed() if dropout_p > 0 else None
    return ops.fuxi_layer_ffn(x, gate, up, down, norm, eps, dropout_p, seed, offset)
