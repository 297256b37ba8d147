"""recops' kernels inside torchrec (docs/torchrec.md).

torchrec builds its fused CPU embedding kernels from FBGEMM's
``SplitTableBatchedEmbeddingBagsCodegen``: the unsharded ``FusedEmbeddingBagCollection``
(``torchrec.modules.fused_embedding_modules``) and the ``BatchedFusedEmbeddingBag`` that
``DistributedModelParallel`` creates for every sharding but data-parallel
(``torchrec.distributed.batched_embedding_kernel``). torchrec offers no registration point for that
class (its ``CUSTOMIZED_KERNEL`` needs a sharded module of one's own), so :func:`enable` replaces
the name in those two modules, :data:`PATCH_SITES`, and nowhere else; :func:`disable` puts FBGEMM's
class back. It also routes the FBGEMM ops recops implements (the jagged / sparse ops behind
``KeyedJaggedTensor`` and ``KeyedTensor``) to recops' CPU kernels with
:func:`recops.use_for_fbgemm`, and gives back those it routed.

Modules built while enabled keep recops' TBE after :func:`disable`; modules built before keep
FBGEMM's. Importing this module does not import torchrec; :func:`enable` does, and raises
``ImportError`` when it is not installed (``make setup-torchrec``).
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator

from recops import _fbgemm
from recops.embedding import SplitTableBatchedEmbeddingBagsCodegen

__all__ = ["PATCH_SITES", "enable", "disable", "enabled", "is_enabled"]

# Where torchrec looks FBGEMM's TBE class up when it builds a fused CPU kernel.
PATCH_SITES = (
    ("torchrec.modules.fused_embedding_modules", "SplitTableBatchedEmbeddingBagsCodegen"),
    ("torchrec.distributed.batched_embedding_kernel", "SplitTableBatchedEmbeddingBagsCodegen"),
)
FBGEMM_TBE = (
    "fbgemm_gpu.split_table_batched_embeddings_ops_training",
    "SplitTableBatchedEmbeddingBagsCodegen",
)

_saved: dict[tuple[str, str], type] = {}  # patch site -> FBGEMM's class, while enabled
_routed: list[str] = []  # FBGEMM ops enable() routed to recops (and disable() gives back)


def _fbgemm_tbe() -> type:
    module, name = FBGEMM_TBE
    return getattr(importlib.import_module(module), name)


def _site_module(module_name: str, name: str):
    module = importlib.import_module(module_name)
    if not hasattr(module, name):
        raise RuntimeError(
            f"{module_name} no longer has {name}: this torchrec builds its fused embedding kernels "
            "elsewhere, and recops.operators.torchrec must be updated for it"
        )
    return module


def is_enabled() -> bool:
    return bool(_saved)


def enable() -> None:
    """Makes torchrec build its fused CPU embedding kernels on recops' TBE and run the FBGEMM
    ops recops implements on recops' kernels. Idempotent."""
    if _saved:
        return
    fbgemm_tbe = _fbgemm_tbe()
    modules = [(_site_module(*site), site) for site in PATCH_SITES]
    for module, (module_name, name) in modules:
        current = getattr(module, name)
        if current is not fbgemm_tbe:
            raise RuntimeError(
                f"{module_name}.{name} is {current!r}, not FBGEMM's class: something else "
                "replaced it, and recops.operators.torchrec will not replace it again"
            )
    for module, site in modules:
        _saved[site] = getattr(module, site[1])
        setattr(module, site[1], SplitTableBatchedEmbeddingBagsCodegen)
    before = {name for name in _fbgemm.bound if _fbgemm.serves(name)}
    _fbgemm.use_for_fbgemm()
    _routed[:] = [name for name in _fbgemm._kernel_ops(None) if name not in before]


def disable() -> None:
    """Undoes :func:`enable`: FBGEMM's class at every patch site, and the FBGEMM ops that
    :func:`enable` routed back on FBGEMM's kernels."""
    for (module_name, name), cls in _saved.items():
        setattr(importlib.import_module(module_name), name, cls)
    _saved.clear()
    if _routed:
        _fbgemm.use_for_fbgemm(_routed, enable=False)
        _routed.clear()


@contextlib.contextmanager
def enabled() -> Iterator[None]:
    """``with recops.operators.torchrec.enabled():`` — :func:`enable` for the block, then
    :func:`disable` (unless it was enabled before the block)."""
    was_enabled = is_enabled()
    enable()
    try:
        yield
    finally:
        if not was_enabled:
            disable()
