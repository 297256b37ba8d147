"""Helpers for the fake kernels and autograd formulas registered from Python: an op call's
arguments by schema name, and a backward op's results as gradients of its forward's inputs, found
by name (a result ``grad_<name>`` is the gradient of the forward's argument ``<name>``), and the
binding of an op's autograd to its backward op. Nothing here knows an argument's position."""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch.library import register_autograd


def named_arguments(op, args, kwargs=None) -> dict[str, Any]:
    """The arguments of a call of ``op`` (an OpOverload) by schema name, with the schema's
    defaults for those the call left out."""
    arguments = op._schema.arguments
    bound = dict(zip((a.name for a in arguments), args, strict=False))
    bound.update(kwargs or {})
    for a in arguments:
        if a.name not in bound and a.has_default_value():
            bound[a.name] = a.default_value
    return bound


def input_grads(ctx, *grads):
    """Returns ``grads`` trimmed to the arguments the op was actually called with.

    The dispatcher drops trailing arguments equal to their schema defaults before autograd sees
    them, and autograd wants exactly one gradient per argument it saw; ``ctx.needs_input_grad``
    has one entry per such argument.
    """
    return tuple(grads[: len(ctx.needs_input_grad)])


@functools.cache
def _grad_positions(forward, backward) -> tuple[int, ...]:
    names = [a.name for a in forward._schema.arguments]
    positions = []
    for result in backward._schema.returns:
        if not result.name.startswith("grad_") or result.name[5:] not in names:
            raise AssertionError(f"{backward} returns {result.name!r}, not grad_<an input>")
        positions.append(names.index(result.name[5:]))
    return tuple(positions)


def grads_by_name(ctx, forward, backward, results):
    """The gradients of ``forward``'s inputs (None where ``backward`` gives none) from
    ``backward``'s ``results``, matched by the backward schema's result names."""
    grads = [None] * len(forward._schema.arguments)
    for position, grad in zip(_grad_positions(forward, backward), results, strict=True):
        grads[position] = grad
    return input_grads(ctx, *grads)


def saving_setup(forward, tensors):
    """A setup_context that keeps a call's ``tensors`` (by name) as saved tensors and its other
    arguments by name, for call_backward."""

    def setup(ctx, inputs, output):
        ctx.arguments = named_arguments(forward, inputs)
        ctx.save_for_backward(*(ctx.arguments.pop(name) for name in tensors))

    return setup


def call_backward(ctx, backward, tensors, grad_output):
    """``backward`` called on ``grad_output`` with what saving_setup kept."""
    saved = dict(zip(tensors, ctx.saved_tensors, strict=True))
    return backward(grad_output, **saved, **ctx.arguments)


def bind_backward_op(name, forward, backward, tensors):
    """Registers the autograd of op ``name`` (``forward``, an OpOverload) as a call of its
    ``backward`` op, which takes ``grad_output`` then the forward's arguments and names its
    results ``grad_<input>``: the call's ``tensors`` (by name) saved, its other arguments kept."""

    def backward_fn(ctx, grad_output):
        results = call_backward(ctx, backward, tensors, grad_output)
        return grads_by_name(
            ctx, forward, backward, (results,) if isinstance(results, torch.Tensor) else results
        )

    register_autograd(name, backward_fn, setup_context=saving_setup(forward, tensors))
