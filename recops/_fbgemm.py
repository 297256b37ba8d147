"""Binds recops' kernels to ``torch.ops.fbgemm`` (docs/design.md, "FBGEMM binding").

- **FBGEMM absent** (or ignored with ``RECOPS_HIDE_FBGEMM=1``): recops defines FBGEMM's schemas,
  taking each one's text from its ``torch.ops.recops`` twin (one copy of every schema), and serves
  them with the twin's C++ kernels, autograd and fake kernel. The composites
  (``jagged_to_padded_dense``, ``dense_to_jagged``) decompose into ``fbgemm::`` ops, so a graph
  traced through ``torch.ops.fbgemm`` runs wherever FBGEMM is installed.
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
from collections.abc import Iterable

import torch

# FBGEMM's ops that recops implements with FBGEMM's schemas (docs/ops.md section 1).
FBGEMM_OPS = (
    "asynchronous_complete_cumsum",
    "asynchronous_exclusive_cumsum",
    "asynchronous_inclusive_cumsum",
    "jagged_to_padded_dense",
    "jagged_to_padded_dense_forward",
    "jagged_to_padded_dense_backward",
    "dense_to_jagged",
    "dense_to_jagged_forward",
    "jagged_2d_to_dense",
    "jagged_1d_to_dense",
    "permute_2D_sparse_data",
    "permute_1D_sparse_data",
    "invert_permute",
    "block_bucketize_sparse_features",
    "offsets_range",
    "permute_pooled_embs",
    "permute_pooled_embs_split",
    "permute_pooled_embs_auto_grad",
    "permute_pooled_embs_auto_grad_split",
    # torchrec utilities: managed-collision hashing, feature gates, memory kinds, index select
    "create_zch_buffer",
    "zero_collision_hash",
    "check_feature_gate_key",
    "is_uvm_tensor",
    # sparse: new ops
    "block_bucketize_sparse_features_inference",
    "permute_sparse_features",
    "permute_2D_sparse_data_input1D",
    "permute_2D_sparse_preallocated_out",
    "expand_into_jagged_permute",
    # keyed: pooled embeddings of several features side by side (recops/operators/keyed.py)
    "merge_pooled_embeddings",
    "permute_multi_embedding_function",
    "permute_multi_embedding",
    "kt_regroup_arguments",
    "regroup_keyed_tensor",
    # jagged: index selection, segment sums, batched cumsum
    "asynchronous_batched_complete_cumsum",
    "segment_sum_csr",
    "jagged_index_select",
    "jagged_index_select_2d_forward",
    "jagged_index_select_2d_forward_v2",
    "jagged_index_add_2d_forward",
    "jagged_index_add_2d_forward_v2",
    "keyed_jagged_index_select_dim1",
    "jagged_unique_indices",
    # index select: row gathers of several tables (torchrec's EBC with inverse indices, sharded EBC)
    "group_index_select_dim0",
    "group_index_select_dim0_gpu_impl",
    "group_index_select_dim0_gpu_backward",
    "batch_index_select_dim0",
    "batch_index_select_dim0_tensor",
    "batch_index_select_dim0_backward_cpu_impl",
    # quantize: row-wise quantized embedding tables and pruned-index remapping (inference)
    "FloatToFused8BitRowwiseQuantized",
    "HalfToFused8BitRowwiseQuantized",
    "FloatOrHalfToFused8BitRowwiseQuantized",
    "Fused8BitRowwiseQuantizedToFloat",
    "Fused8BitRowwiseQuantizedToHalf",
    "Fused8BitRowwiseQuantizedToFloatOrHalf",
    "FloatToFusedNBitRowwiseQuantizedSBHalf",
    "HalfToFusedNBitRowwiseQuantizedSBHalf",
    "FloatOrHalfToFusedNBitRowwiseQuantizedSBHalf",
    "FusedNBitRowwiseQuantizedSBHalfToFloat",
    "FusedNBitRowwiseQuantizedSBHalfToHalf",
    "FusedNBitRowwiseQuantizedSBHalfToFloatOrHalf",
    "pruned_hashmap_lookup",
    "pruned_hashmap_insert",
    "pruned_array_lookup",
    # embedding: the TBE modules' index and offset check, the quantized inference TBE lookup
    # (IntNBitTableBatchedEmbeddingBagsCodegen)
    "bounds_check_indices",
    "int_nbit_split_embedding_codegen_lookup_function",
)
# Composites call their `_forward` op; they hold no kernel of their own to route.
COMPOSITES = ("jagged_to_padded_dense", "dense_to_jagged", "jagged_index_select")

# Backend keys recops may fill in for an FBGEMM-defined op, by device.
_BACKEND_KEYS = {"cpu": "CPU", "cuda": "CUDA"}
HIDE_FBGEMM_VARIABLE = "RECOPS_HIDE_FBGEMM"
CPU_OVERRIDE_VARIABLE = "RECOPS_FBGEMM_CPU_OVERRIDE"

_library = None  # the torch.library.Library holding the fbgemm schemas recops defined
bound: dict[str, str | list[str]] = {}  # op -> "defined", or the keys recops serves
# (op, key) that recops serves because FBGEMM has no kernel there (e.g. ops FBGEMM implements on
# CUDA only): use_for_fbgemm(enable=False) keeps them, having no FBGEMM kernel to give them to.
filled: set[tuple[str, str]] = set()


def import_fbgemm() -> bool:
    """Imports fbgemm_gpu when it is installed and not hidden; returns whether it is loaded.

    ``RECOPS_HIDE_FBGEMM=1`` makes recops ignore an installed fbgemm_gpu: it defines
    ``torch.ops.fbgemm`` itself, after which fbgemm_gpu cannot be imported into the process.
    """
    if os.environ.get(HIDE_FBGEMM_VARIABLE) == "1":
        return False
    if importlib.util.find_spec("fbgemm_gpu") is None:
        return False
    import fbgemm_gpu  # noqa: F401

    return True


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


def _define(name: str) -> None:
    _library.define(recops_schema(name), tags=(torch.Tag.pt2_compliant_tag,))
    if name in COMPOSITES or _tensorless(name):
        _route(name, "CompositeImplicitAutograd")
        return
    for key in ("CPU", "CUDA", "Autograd"):
        if _has_kernel(f"recops::{name}", key):
            _route(name, key)
    recops_op = getattr(torch.ops.recops, name).default

    def fake(*args, **kwargs):  # the twin's fake kernel, reached through the twin
        return recops_op(*args, **kwargs)

    torch.library.register_fake(f"fbgemm::{name}", fake, lib=_library)


def bind() -> dict[str, str | list[str]]:
    """Defines or fills in ``torch.ops.fbgemm``'s ops once per process; returns :data:`bound`."""
    global _library
    if _library is not None:
        return bound
    _library = torch.library.Library("fbgemm", "FRAGMENT")
    defined = {s.name for s in torch._C._jit_get_all_schemas()}
    for name in FBGEMM_OPS:
        qualname = f"fbgemm::{name}"
        if qualname not in defined:
            _define(name)
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
