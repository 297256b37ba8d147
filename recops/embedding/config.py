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
    string such as "fp32"). INT4, INT2 and FP8 are the quantized inference module's row types
    (quantized_module.py); the training module stores FP32, FP16, BF16 and INT8."""

    FP32 = 0
    FP16 = 1
    INT8 = 2
    INT4 = 3
    INT2 = 4
    BF16 = 5
    FP8 = 6

    def as_int(self) -> int:
        return int(self)

    def as_dtype(self) -> torch.dtype:
        return _SPARSE_DTYPES[self]

    def bit_rate(self) -> int:
        """Bits per stored element."""
        return _BIT_RATES[self]

    def is_float(self) -> bool:
        """Whether an element is a float of its own (no per-row scale and bias)."""
        return self in (SparseType.FP32, SparseType.FP16, SparseType.BF16, SparseType.FP8)


_SPARSE_DTYPES = {
    SparseType.FP32: torch.float32,
    SparseType.FP16: torch.float16,
    SparseType.INT8: torch.uint8,
    SparseType.BF16: torch.bfloat16,
}
# The training module's weight types (stored as torch dtypes), and the outputs of both modules.
WEIGHTS_PRECISIONS = (SparseType.FP32, SparseType.FP16, SparseType.BF16, SparseType.INT8)
FLOAT_OUTPUT_DTYPES = (SparseType.FP32, SparseType.FP16, SparseType.BF16)
_BIT_RATES = {
    SparseType.FP32: 32,
    SparseType.FP16: 16,
    SparseType.INT8: 8,
    SparseType.INT4: 4,
    SparseType.INT2: 2,
    SparseType.BF16: 16,
    SparseType.FP8: 8,
}


class WeightDecayMode(enum.IntEnum):
    NONE = 0
    L2 = 1
    DECOUPLE = 2
    COUNTER = 3  # rowwise Adagrad with counter (see counter.py)
    COWCLIP = 4  # rowwise Adagrad with counter, CowClip's gradient clipping


class BoundsCheckMode(enum.IntEnum):
    FATAL = 0  # raise on an out-of-range index or malformed offsets
    WARNING = 1  # repair (index -> 0, offsets clamped into range) and warn once
    IGNORE = 2  # repair silently
    NONE = 3  # trust the input


def coerce(cls, value, arg, owner="recops.SplitTableBatchedEmbeddingBagsCodegen", supported=None):
    """``value`` as a member of ``cls``: itself, a same-named member of another enum (FBGEMM's),
    or a value; anything else, or a member outside ``supported`` (default: every member), is a
    feature ``owner`` does not support."""
    member = _as_member(cls, value)
    supported = tuple(cls) if supported is None else supported
    if member not in supported:
        names = ", ".join(m.name for m in supported)
        raise NotImplementedError(f"{owner} does not support {arg}={value!r} (supported: {names})")
    return member


def _as_member(cls, value):
    """``value`` as a member of ``cls``, or None."""
    if isinstance(value, cls):
        return value
    name = getattr(value, "name", None)
    if isinstance(name, str) and name in cls.__members__:
        return cls[name]
    try:
        return cls(value)
    except ValueError:
        return None


# The arguments of FBGEMM's modules (training and inference) about its GPU cache and UVM
# placement: on the host, where every table lives in weights_host, FBGEMM's CPU modules ignore
# them, and so does recops.
CACHE_ARGS = frozenset(
    {
        "cache_algorithm",
        "cache_load_factor",
        "cache_sets",
        "cache_reserved_memory",
        "enforce_hbm",
        "record_cache_metrics",
        "gather_uvm_cache_stats",
        "uvm_host_mapped",
    }
)
# The training module ignores those, its optimizer state's UVM placement, prefetching and
# reporting, and max_norm (FBGEMM's CPU kernels never renormalise rows).
IGNORED_ARGS = CACHE_ARGS | frozenset(
    {
        "max_norm",
        "uvm_non_rowwise_momentum",
        "use_experimental_tbe",
        "prefetch_pipeline",
        "multipass_prefetch_config",
        "stats_reporter_config",
    }
)
# FBGEMM's configuration objects for features recops does not implement: None, or an object whose
# every field has its default (which FBGEMM treats as None), asks for nothing.
CONFIG_ARGS = frozenset(
    {
        "ensemble_mode",
        "emainplace_mode",
        "global_weight_decay",
        "tbe_input_multiplexer_config",
    }
)
# Features recops does not implement, with FBGEMM's default (the only value accepted).
UNSUPPORTED_ARGS = {
    "optimizer_state_dtypes": None,
    "enable_raw_embedding_streaming": False,
}
# The fields of extra_optimizer_config (FBGEMM's UserEnabledConfigDefinition) recops implements;
# precompute_writeback only moves FBGEMM's work into forward, so any value is accepted.
WRITEBACK_FIELDS = ("use_writeback_bwd_prehook", "writeback_first_feature_only")
_ANY_VALUE_FIELDS = ("precompute_writeback",)


def is_default_config(value) -> bool:
    """None, or a configuration object equal to its class's default instance."""
    if value is None:
        return True
    try:
        return bool(value == type(value)())
    except TypeError:  # a class whose fields have no defaults always asks for something
        return False


def check_fbgemm_only_args(fbgemm_only):
    """Raises TypeError for an argument FBGEMM does not have either, NotImplementedError naming an
    argument that asks for a feature recops does not implement; accepts the rest (see above)."""
    cache_algorithm = getattr(fbgemm_only.get("cache_algorithm"), "name", "LRU")
    if fbgemm_only.get("prefetch_pipeline") and cache_algorithm != "LRU":
        raise ValueError("prefetch_pipeline needs cache_algorithm LRU (FBGEMM's rule)")
    if fbgemm_only.get("multipass_prefetch_config") and not fbgemm_only.get("prefetch_pipeline"):
        raise ValueError("multipass_prefetch_config needs prefetch_pipeline=True (FBGEMM's rule)")
    for name, value in fbgemm_only.items():
        if name in IGNORED_ARGS or (name in CONFIG_ARGS and is_default_config(value)):
            continue
        if name in UNSUPPORTED_ARGS and value == UNSUPPORTED_ARGS[name]:
            continue
        if name not in IGNORED_ARGS | CONFIG_ARGS | UNSUPPORTED_ARGS.keys():
            raise TypeError(f"__init__() got an unexpected keyword argument '{name}'")
        raise NotImplementedError(
            f"recops.SplitTableBatchedEmbeddingBagsCodegen does not support {name}={value!r} "
            "(only None or FBGEMM's default)"
        )


def writeback_settings(extra_optimizer_config, optimizer):
    """(use_writeback_bwd_prehook, writeback_first_feature_only) from FBGEMM's
    UserEnabledConfigDefinition (None: both off); its other fields must keep their defaults."""
    if extra_optimizer_config is None:
        return False, False
    defaults = type(extra_optimizer_config)()
    for field, default in vars(defaults).items():
        value = getattr(extra_optimizer_config, field)
        if field not in WRITEBACK_FIELDS + _ANY_VALUE_FIELDS and value != default:
            raise NotImplementedError(
                "recops.SplitTableBatchedEmbeddingBagsCodegen does not support "
                f"extra_optimizer_config.{field}={value!r}"
            )
    writeback, first_feature_only = (
        bool(getattr(extra_optimizer_config, field)) for field in WRITEBACK_FIELDS
    )
    if writeback and optimizer.name != "EXACT_SGD":
        raise ValueError(
            "extra_optimizer_config.use_writeback_bwd_prehook is only supported for "
            f"OptimType.EXACT_SGD (as in FBGEMM), got {optimizer.name}"
        )
    return writeback, first_feature_only
