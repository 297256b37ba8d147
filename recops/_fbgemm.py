"""Binds recops' kernels to ``torch.ops.fbgemm`` (docs/design.md, "FBGEMM binding").

- **FBGEMM absent** (or ignored with ``RECOPS_HIDE_FBGEMM=1``): recops' library defines FBGEMM's
  schemas when it loads, each one its ``torch.ops.recops`` twin's renamed (one copy of every
  schema), and serves them with the twin's C++ kernels (csrc/recops/binding/fbgemm_schemas.cpp,
  so a process with no Python has them too); :func:`bind` adds the twin's autograd registered
  from Python and its fake kernel. The composites (``jagged_to_padded_dense``,
  ``dense_to_jagged``, ``jagged_index_select``) decompose into ``fbgemm::`` ops, so a graph traced
  through ``torch.ops.fbgemm`` runs wherever FBGEMM is installed.
- **FBGEMM installed**: it is imported first and its schemas and kernels stay; recops only fills
  backend keys FBGEMM leaves empty.
- :func:`use_for_fbgemm` routes FBGEMM's own kernels for a device to recops, on request and
  reversibly (``RECOPS_FBGEMM_CPU_OVERRIDE=1`` does it for every op on CPU at import).

Every registration is a C++ redispatch to the recops twin (csrc/recops/binding/fbgemm_route.cpp):
no Python runs on the call path. :data:`bound` (``recops.fbgemm_bindings``) says what was bound.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import warnings
from collections.abc import Iterable

import torch

# FBGEMM's ops that recops implements with FBGEMM's schemas (docs/ops.md section 1), and the
# composites among them, which call their `_forward` op and hold no kernel of their own to route:
# read from the library by bind() (the list is csrc/recops/binding/fbgemm_ops.h).
FBGEMM_OPS: tuple[str, ...] = ()
COMPOSITES: tuple[str, ...] = ()

# Backend keys recops may fill in for an FBGEMM-defined op, by device.
_BACKEND_KEYS = {"cpu": "CPU", "cuda": "CUDA"}
HIDE_FBGEMM_VARIABLE = "RECOPS_HIDE_FBGEMM"
CPU_OVERRIDE_VARIABLE = "RECOPS_FBGEMM_CPU_OVERRIDE"

_library = None  # the torch.library.Library with the fake kernels of the fbgemm ops recops defined
bound: dict[str, str | list[str]] = {}  # op -> "defined", or the keys recops serves
# (op, key) that recops serves because FBGEMM has no kernel there (e.g. ops FBGEMM implements on
# CUDA only): use_for_fbgemm(enable=False) keeps them, having no FBGEMM kernel to give them to.
filled: set[tuple[str, str]] = set()


def import_fbgemm() -> bool:
    """Imports fbgemm_gpu when it is installed and not hidden; returns whether it is loaded.

    ``RECOPS_HIDE_FBGEMM=1`` makes recops ignore an installed fbgemm_gpu: it defines
    ``torch.ops.fbgemm`` itself, after which fbgemm_gpu cannot be imported into the process. The
    same holds when recops' library was loaded before ``import recops`` (``torch.ops.load_library``)
    and before fbgemm_gpu: it defined FBGEMM's schemas as it loaded, so FBGEMM's library no longer
    can, and recops goes on without it, with a warning.
    """
    if os.environ.get(HIDE_FBGEMM_VARIABLE) == "1":
        return False
    if importlib.util.find_spec("fbgemm_gpu") is None:
        return False
    if "fbgemm_gpu" not in sys.modules and _defined_at_load():
        warnings.warn(
            "recops' library was loaded before fbgemm_gpu, so it defined torch.ops.fbgemm's "
            "schemas and fbgemm_gpu cannot be imported into this process: torch.ops.fbgemm runs "
            "recops' kernels. Import fbgemm_gpu (or recops) before loading recops' library to use "
            "FBGEMM's.",
            stacklevel=2,
        )
        return False
    import fbgemm_gpu  # noqa: F401

    return True


def _defined_at_load() -> list[str]:
    """The fbgemm ops whose schemas recops' library defined as it loaded (none before it is)."""
    if not hasattr(torch.ops.recops, "_fbgemm_binding"):
        return []
    return torch.ops.recops._fbgemm_binding()[2]


def recops_schema(name: str) -> str:
    """The schema of ``torch.ops.recops.<name>`` without its namespace: FBGEMM's, verbatim."""
    return str(getattr(torch.ops.recops, name).default._schema).split("::", 1)[1]


def _has_kernel(qualname: str, key: str) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(qualname, key)


def _has_fbgemm_composite(qualname: str) -> bool:
    """Whether FBGEMM serves every backend of the op with one composite kernel."""
    return any(
        _has_kernel(qualname, key)
        for key in ("CompositeImplicitAutograd", "CompositeExplicitAutograd")
    )


def _route(name: str, key: str, enable: bool = True) -> None:
    torch.ops.recops._route_fbgemm_op(name, key, enable)


def _tensorless(name: str) -> bool:
    """Whether recops' twin is one composite kernel for every key (an op with no tensor argument,
    such as ``create_zch_buffer``): its fbgemm route is at CompositeImplicitAutograd too."""
    return name not in COMPOSITES and _has_kernel(f"recops::{name}", "CompositeImplicitAutograd")


def _route_keys(name: str, key: str) -> list[str]:
    """The keys of ``fbgemm::<name>`` to route so that a call on ``key``'s device runs recops'
    kernel: the backend key, and FBGEMM's autograd kernel for it where FBGEMM has its own (its
    formula calls FBGEMM's helper ops, not the backend kernel); an op with no tensor argument
    dispatches on no backend, so its composite key."""
    if _tensorless(name):
        return ["CompositeImplicitAutograd"]
    keys = [key]
    autograd = f"Autograd{key}"
    if _has_kernel(f"fbgemm::{name}", autograd) and _has_kernel(f"recops::{name}", "Autograd"):
        keys.append(autograd)
    return keys


def _complete(name: str) -> None:
    """Adds to an ``fbgemm::`` op that recops' library defined when it loaded
    (csrc/recops/binding/fbgemm_schemas.cpp) what Python holds: the twin's autograd kernel where it
    is registered from Python (a route registered in C++ already stays as it is), and the fake
    kernel, which calls the twin's."""
    if name in COMPOSITES or _tensorless(name):
        return
    if _has_kernel(f"recops::{name}", "Autograd"):
        _route(name, "Autograd")
    recops_op = getattr(torch.ops.recops, name).default

    def fake(*args, **kwargs):  # the twin's fake kernel, reached through the twin
        return recops_op(*args, **kwargs)

    torch.library.register_fake(f"fbgemm::{name}", fake, lib=_library)


def bind() -> dict[str, str | list[str]]:
    """Completes or fills in ``torch.ops.fbgemm``'s ops once per process; returns :data:`bound`."""
    global _library, FBGEMM_OPS, COMPOSITES
    if _library is not None:
        return bound
    served, composites, defined = torch.ops.recops._fbgemm_binding()
    FBGEMM_OPS, COMPOSITES = tuple(served), tuple(composites)
    _library = torch.library.Library("fbgemm", "FRAGMENT")
    schemas = {s.name for s in torch._C._jit_get_all_schemas()}
    missing = [name for name in FBGEMM_OPS if f"fbgemm::{name}" not in schemas]
    if missing:
        raise ImportError(
            f"recops' library did not define {missing} in torch.ops.fbgemm: its FBGEMM binding "
            "must be linked after the op families (setup.py)"
        )
    for name in FBGEMM_OPS:
        qualname = f"fbgemm::{name}"
        if name in defined:
            _complete(name)
            bound[name] = "defined"
        elif name not in COMPOSITES and not _has_fbgemm_composite(qualname):
            for key in _BACKEND_KEYS.values():
                if _has_kernel(f"recops::{name}", key) and not _has_kernel(qualname, key):
                    _serve(name, [key])
                    filled.add((name, key))
    if os.environ.get(CPU_OVERRIDE_VARIABLE) == "1":
        use_for_fbgemm()
    return bound


def _serve(name: str, keys: list[str], enable: bool = True) -> None:
    served = bound.setdefault(name, [])
    for key in keys:
        _route(name, key, enable)
        if enable and key not in served:
            served.append(key)
        elif not enable and key in served:
            served.remove(key)
    if not served:
        del bound[name]


def serves(name: str, device: str = "cpu") -> bool:
    """Whether ``torch.ops.fbgemm.<name>`` runs recops' kernel on ``device`` now."""
    keys = bound.get(name)
    if keys == "defined":
        return True
    return bool(keys) and all(k in keys for k in _route_keys(name, _device_key(device)))


def _kernel_ops(ops: Iterable[str] | None) -> list[str]:
    names = list(FBGEMM_OPS if ops is None else ops)
    unknown = [n for n in names if n not in FBGEMM_OPS]
    if unknown:
        raise ValueError(f"ops must name FBGEMM ops recops implements {FBGEMM_OPS}, got {unknown}")
    return [n for n in names if n not in COMPOSITES]


def _device_key(device: str) -> str:
    if device not in _BACKEND_KEYS:
        raise ValueError(f"device must be one of {tuple(_BACKEND_KEYS)}, got {device!r}")
    return _BACKEND_KEYS[device]


def use_for_fbgemm(
    ops: Iterable[str] | None = None, device: str = "cpu", enable: bool = True
) -> dict[str, str | list[str]]:
    """Routes FBGEMM's own ``torch.ops.fbgemm.<op>`` kernels for ``device`` to recops' kernels.

    With fbgemm_gpu installed, ``torch.ops.fbgemm.*`` runs FBGEMM's kernels; this call makes the
    given ops (default: every one recops implements; a composite such as
    ``jagged_to_padded_dense`` follows its ``_forward`` op) run recops' instead, with no warning.
    ``enable=False`` gives the kernels back to FBGEMM. Ops that recops defined itself (FBGEMM
    absent) are recops' already and are left as they are. Returns :data:`bound`.
    """
    key = _device_key(device)
    for name in _kernel_ops(ops):
        if bound.get(name) == "defined":
            continue
        if enable and not (_has_kernel(f"recops::{name}", key) or _tensorless(name)):
            raise NotImplementedError(f"recops has no {device} kernel for {name}")
        keys = _route_keys(name, key)
        if not enable:  # keys FBGEMM has no kernel for stay recops'
            keys = [k for k in keys if (name, k) not in filled]
        _serve(name, keys, enable)
    return bound
