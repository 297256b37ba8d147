"""Helpers for autograd formulas registered with ``torch.library.register_autograd``."""


def input_grads(ctx, *grads):
    """Returns ``grads`` trimmed to the arguments the op was actually called with.

    The dispatcher drops trailing arguments equal to their schema defaults before autograd sees
    them, and autograd wants exactly one gradient per argument it saw; ``ctx.needs_input_grad``
    has one entry per such argument.
    """
    return tuple(grads[: len(ctx.needs_input_grad)])
