"""Helpers for the fake kernels and autograd formulas registered from Python: an op call's
arguments by schema name, and a backward op's results as gradients of its forward's inputs, found
by name (a result ``grad_<name>`` is the gradient of the forward's argument ``<name>``). Nothing
here knows an argument's position. Ops whose backward op takes exactly the forward's arguments
bind their autograd in C++ instead (csrc/recops/common/backward_op_autograd.h)."""

from __future__ import annotations

import functools
from typing import Any


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
