"""Binds recops' kernels to ``torch.ops.fbgemm`` (DESIGN.md, "FBGEMM binding").

If ``fbgemm_gpu`` is installed it is imported first and recops only adds kernels for dispatch keys
that FBGEMM leaves empty; a schema FBGEMM defined is never redefined. Without FBGEMM, recops defines
FBGEMM's schemas itself and routes each op to its ``torch.ops.recops`` twin, which carries the
kernels, fake kernel and autograd. ``RECOPS_FBGEMM_CPU_OVERRIDE=1`` additionally routes FBGEMM's
own CPU kernels to recops.
"""

import importlib.util
import os

import torch

# FBGEMM's schema strings, verbatim (OPS.md section 1).
FBGEMM_SCHEMAS = {
    "asynchronous_complete_cumsum": "asynchronous_complete_cumsum(Tensor t_in) -> Tensor",
    "asynchronous_exclusive_cumsum": "asynchronous_exclusive_cumsum(Tensor t_in) -> Tensor",
    "asynchronous_inclusive_cumsum": "asynchronous_inclusive_cumsum(Tensor t_in) -> Tensor",
    "jagged_to_padded_dense": "jagged_to_padded_dense(Tensor values, Tensor[] offsets, "
    "SymInt[] max_lengths, float padding_value = 0) -> Tensor",
    "jagged_to_padded_dense_forward": "jagged_to_padded_dense_forward(Tensor values, "
    "Tensor[] offsets, SymInt[] max_lengths, float padding_value = 0) -> Tensor",
    "jagged_to_padded_dense_backward": "jagged_to_padded_dense_backward(Tensor grad_output, "
    "Tensor[] offsets, SymInt total_L) -> Tensor",
    "dense_to_jagged": "dense_to_jagged(Tensor dense, Tensor[] x_offsets, "
    "SymInt? total_L=None) -> (Tensor, Tensor[])",
    "dense_to_jagged_forward": "dense_to_jagged_forward(Tensor dense, Tensor[] x_offsets, "
    "SymInt? total_L=None) -> Tensor",
    "jagged_2d_to_dense": "jagged_2d_to_dense(Tensor values, Tensor offsets, "
    "SymInt max_sequence_length) -> Tensor",
    "jagged_1d_to_dense": "jagged_1d_to_dense(Tensor values, Tensor offsets, "
    "SymInt max_sequence_length, int padding_value) -> Tensor",
    "permute_2D_sparse_data": "permute_2D_sparse_data(Tensor permute, Tensor lengths, "
    "Tensor values, Tensor? weights=None, SymInt? permuted_lengths_sum=None) "
    "-> (Tensor, Tensor, Tensor?)",
    "permute_1D_sparse_data": "permute_1D_sparse_data(Tensor permute, Tensor lengths, "
    "Tensor values, Tensor? weights=None, SymInt? permuted_lengths_sum=None) "
    "-> (Tensor, Tensor, Tensor?)",
    "invert_permute": "invert_permute(Tensor permute) -> Tensor",
    "offsets_range": "offsets_range(Tensor offsets, SymInt range_size) -> Tensor",
}

# Backend keys recops may fill in for an FBGEMM-defined op.
_BACKEND_KEYS = ("CPU", "CUDA")

_library = None  # the torch.library.Library holding recops' fbgemm registrations
bound = {}  # op name -> how it was bound: "defined" or the list of keys recops filled in


def import_fbgemm() -> bool:
    """Imports fbgemm_gpu when it is installed; returns whether it is loaded."""
    if importlib.util.find_spec("fbgemm_gpu") is None:
        return False
    import fbgemm_gpu  # noqa: F401

    return True


def _has_schema(qualname: str) -> bool:
    return torch._C._dispatch_has_kernel(qualname) or any(
        s.name == qualname for s in torch._C._jit_get_all_schemas()
    )


def _has_kernel(qualname: str, key: str) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(qualname, key)


def bind() -> dict:
    global _library
    if _library is not None:
        return bound
    _library = torch.library.Library("fbgemm", "FRAGMENT")
    override_cpu = os.environ.get("RECOPS_FBGEMM_CPU_OVERRIDE") == "1"
    defined = {s.name for s in torch._C._jit_get_all_schemas()}
    for name, schema in FBGEMM_SCHEMAS.items():
        qualname = f"fbgemm::{name}"
        recops_op = getattr(torch.ops.recops, name).default
        if qualname not in defined:
            _library.define(schema, tags=(torch.Tag.pt2_compliant_tag,))
            _library.impl(name, recops_op, "CompositeImplicitAutograd")
            bound[name] = "defined"
            continue
        if _has_kernel(qualname, "CompositeImplicitAutograd"):
            continue
        keys = []
        for key in _BACKEND_KEYS:
            if not _has_kernel(f"recops::{name}", key):
                continue
            if _has_kernel(qualname, key) and not (override_cpu and key == "CPU"):
                continue
            _library.impl(name, recops_op, key, allow_override=True)
            keys.append(key)
        if keys:
            bound[name] = keys
    return bound
