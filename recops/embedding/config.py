"""The TBE module's configuration types: FBGEMM's enums (names and integer values), the coercion
that accepts members of FBGEMM's own enums by name, and the FBGEMM constructor arguments recops
accepts only at their defaults."""

import enum

import torch


class PoolingMode(enum.IntEnum):
    SUM = 0
    MEAN = 1
    NONE = 2

    def do_pooling(self) -> bool:
        return self is not PoolingMode.NONE


class EmbeddingLocation(enum.IntEnum):
    DEVICE = 0
    MANAGED = 1
    MANAGED_CACHING = 2
    HOST = 3


class ComputeDevice(enum.IntEnum):
    CPU = 0
    CUDA = 1


class SparseType(enum.IntEnum):
    """Storage precision; values are FBGEMM's ``SparseType.as_int()`` (FBGEMM's ``.value`` is a
    string such as "fp32")."""

    FP32 = 0
    FP16 = 1
    INT8 = 2
    BF16 = 5

    def as_int(self) -> int:
        return int(self)

    def as_dtype(self) -> torch.dtype:
        return _SPARSE_DTYPES[self]


_SPARSE_DTYPES = {
    SparseType.FP32: torch.float32,
    SparseType.FP16: torch.float16,
    SparseType.INT8: torch.uint8,
    SparseType.BF16: torch.bfloat16,
}


class WeightDecayMode(enum.IntEnum):
    NONE = 0
    L2 = 1
    DECOUPLE = 2


class BoundsCheckMode(enum.IntEnum):
    FATAL = 0  # raise on an out-of-range index or malformed offsets
    WARNING = 1  # repair (index -> 0, offsets clamped into range) and warn once
    IGNORE = 2  # repair silently
    NONE = 3  # trust the input


def coerce(cls, value, arg):
    """``value`` as a member of ``cls``: itself, a same-named member of another enum (FBGEMM's),
    or a value; anything else is a feature recops does not support."""
    if isinstance(value, cls):
        return value
    name = getattr(value, "name", None)
    if isinstance(name, str) and name in cls.__members__:
        return cls[name]
    try:
        return cls(value)
    except ValueError:
        supported = ", ".join(cls.__members__)
        raise NotImplementedError(
            f"recops.SplitTableBatchedEmbeddingBagsCodegen does not support {arg}={value!r} "
            f"(supported: {supported})"
        ) from None


# FBGEMM constructor arguments recops does not implement, with FBGEMM's defaults: passing the
# default is accepted (it asks for nothing), anything else raises NotImplementedError.
UNSUPPORTED_ARGS = {
    "cache_algorithm": "LRU",
    "cache_load_factor": 0.2,
    "cache_sets": 0,
    "cache_reserved_memory": 0.0,
    "enforce_hbm": False,
    "record_cache_metrics": None,
    "gather_uvm_cache_stats": False,
    "max_norm": 0.0,
    "ensemble_mode": None,
    "emainplace_mode": None,
    "counter_based_regularization": None,
    "cowclip_regularization": None,
    "uvm_non_rowwise_momentum": False,
    "use_experimental_tbe": False,
    "prefetch_pipeline": False,
    "stats_reporter_config": None,
    "optimizer_state_dtypes": None,
    "multipass_prefetch_config": None,
    "global_weight_decay": None,
    "uvm_host_mapped": False,
    "extra_optimizer_config": None,
    "tbe_input_multiplexer_config": None,
    "enable_raw_embedding_streaming": False,
}


def _is_default(value, default):
    if value is None or default is None:
        return value is default
    return getattr(value, "name", value) == default


def check_fbgemm_only_args(fbgemm_only):
    """Raises unless every FBGEMM-only constructor argument is one recops knows, at FBGEMM's
    default."""
    for name, value in fbgemm_only.items():
        if name not in UNSUPPORTED_ARGS:
            raise TypeError(f"__init__() got an unexpected keyword argument '{name}'")
        if not _is_default(value, UNSUPPORTED_ARGS[name]):
            raise NotImplementedError(
                f"recops.SplitTableBatchedEmbeddingBagsCodegen does not support {name}="
                f"{value!r} (only FBGEMM's default {UNSUPPORTED_ARGS[name]!r})"
            )
