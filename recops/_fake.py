"""``register_fake`` for recops' ops: ``torch.library.register_fake`` plus the device rule every
op's real kernel checks (its tensors share one device), checked before the fake kernel's own shape
logic runs. A call with one input on the meta device and the rest on CPU dispatches to the fake
kernel, which would otherwise return an uninitialised CPU tensor instead of an error."""

import functools

import torch


def _tensor_arguments(schema, args, kwargs):
    """(name, tensor) for every tensor a call passes, named as in the schema (``name[i]`` for an
    entry of a tensor list)."""
    for i, argument in enumerate(schema.arguments):
        value = args[i] if i < len(args) else kwargs.get(argument.name)
        if isinstance(value, torch.Tensor):
            yield argument.name, value
        elif isinstance(value, list | tuple):
            for j, item in enumerate(value):
                if isinstance(item, torch.Tensor):
                    yield f"{argument.name}[{j}]", item


def check_one_device(schema, args, kwargs):
    first = None
    for name, tensor in _tensor_arguments(schema, args, kwargs):
        if first is None:
            first = (name, tensor.device)
        elif tensor.device != first[1]:
            raise RuntimeError(
                f"{name} is on {tensor.device} but {first[0]} is on {first[1]}: "
                f"{schema.name}'s tensors must share one device"
            )


def register_fake(qualname):
    """Registers the decorated function as the fake kernel of ``qualname`` ("recops::op"),
    preceded by the one-device check."""
    namespace, name = qualname.split("::")
    schema = getattr(getattr(torch.ops, namespace), name).default._schema

    def decorator(fake):
        @functools.wraps(fake)
        def checked(*args, **kwargs):
            check_one_device(schema, args, kwargs)
            return fake(*args, **kwargs)

        # Registered as if by the module that applies this decorator, which the op's C++
        # m.set_python_module names (torch checks that the two agree).
        torch.library.register_fake(qualname, checked, _stacklevel=2)
        return fake

    return decorator
