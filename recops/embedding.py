"""Table-batched embedding bags with the optimizer fused into backward (docs/ops.md section 7).

``SplitTableBatchedEmbeddingBagsCodegen`` is FBGEMM's module of that name for CPU training: many
tables looked up in one call, and a backward that sums the gradient of every unique row (across
bags and the features sharing a table) and applies the optimizer to it in place, never building a
dense gradient. Kernels live in csrc/recops/embedding; this module registers their fake kernels and
the autograd formula of the ``split_embedding_codegen_lookup_<optimizer>_function`` ops.
"""

import enum
import itertools

import torch
from torch import nn
from torch.library import register_autograd

from recops._autograd import input_grads, named_arguments
from recops._fake import register_fake

ops = torch.ops.recops

__all__ = [
    "BoundsCheckMode",
    "ComputeDevice",
    "EmbOptimType",
    "EmbeddingLocation",
    "OptimType",
    "PoolingMode",
    "SparseType",
    "SplitTableBatchedEmbeddingBagsCodegen",
    "WeightDecayMode",
]


# --------------------------------------------------------------------------- enums
# FBGEMM's names and integer values; members of FBGEMM's own enums are accepted by name.
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


class OptimType(enum.Enum):
    EXACT_SGD = "exact_sgd"
    EXACT_ADAGRAD = "exact_adagrad"
    EXACT_ROWWISE_ADAGRAD = "exact_row_wise_adagrad"
    ADAM = "adam"
    PARTIAL_ROWWISE_ADAM = "partial_row_wise_adam"
    LAMB = "lamb"
    PARTIAL_ROWWISE_LAMB = "partial_row_wise_lamb"

    def __str__(self) -> str:
        return self.value


EmbOptimType = OptimType


class WeightDecayMode(enum.IntEnum):
    NONE = 0
    L2 = 1
    DECOUPLE = 2


class BoundsCheckMode(enum.IntEnum):
    FATAL = 0  # raise on an out-of-range index or malformed offsets
    WARNING = 1  # repair (index -> 0, offsets clamped into range) and warn once
    IGNORE = 2  # repair silently
    NONE = 3  # trust the input


def _coerce(cls, value, arg):
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


# Lookup op suffix and the layout of each optimizer-state buffer (momentum1, momentum2):
# "elementwise" holds D values per row, "rowwise" one.
_OPTIMIZERS = {
    OptimType.EXACT_SGD: ("sgd", ()),
    OptimType.EXACT_ADAGRAD: ("adagrad", ("elementwise",)),
    OptimType.EXACT_ROWWISE_ADAGRAD: ("rowwise_adagrad", ("rowwise",)),
    OptimType.ADAM: ("adam", ("elementwise", "elementwise")),
    OptimType.PARTIAL_ROWWISE_ADAM: ("partial_rowwise_adam", ("elementwise", "rowwise")),
    OptimType.LAMB: ("lamb", ("elementwise", "elementwise")),
    OptimType.PARTIAL_ROWWISE_LAMB: ("partial_rowwise_lamb", ("elementwise", "rowwise")),
}
# The Adam family: moments with betas, bias-corrected by the step count `iter`. Adam's weight
# decay is decoupled (FBGEMM's); LAMB's is part of its update direction (weight_decay_mode NONE).
_ADAM_FAMILY = (
    OptimType.ADAM,
    OptimType.PARTIAL_ROWWISE_ADAM,
    OptimType.LAMB,
    OptimType.PARTIAL_ROWWISE_LAMB,
)
_LAMB_FAMILY = (OptimType.LAMB, OptimType.PARTIAL_ROWWISE_LAMB)
# get_optimizer_state's names for the state buffers, as torch.optim names them.
_STATE_NAMES = {
    OptimType.EXACT_SGD: (),
    OptimType.EXACT_ADAGRAD: ("sum",),
    OptimType.EXACT_ROWWISE_ADAGRAD: ("sum",),
    OptimType.ADAM: ("exp_avg", "exp_avg_sq"),
    OptimType.PARTIAL_ROWWISE_ADAM: ("exp_avg", "exp_avg_sq"),
    OptimType.LAMB: ("exp_avg", "exp_avg_sq"),
    OptimType.PARTIAL_ROWWISE_LAMB: ("exp_avg", "exp_avg_sq"),
}

_OUTPUT_DTYPES = {0: torch.float32, 1: torch.float16, 5: torch.bfloat16}


# --------------------------------------------------------------------------- fake kernels
def _forward_fake(weights, D_offsets, total_D, max_D, indices, offsets, pooling_mode, output_dtype):
    torch._check(output_dtype in _OUTPUT_DTYPES, lambda: "output_dtype must be 0, 1 or 5")
    dtype = _OUTPUT_DTYPES[output_dtype]
    if pooling_mode == PoolingMode.NONE:
        return weights.new_empty((indices.shape[0], max_D), dtype=dtype)
    num_features = D_offsets.shape[0] - 1
    return weights.new_empty(((offsets.shape[0] - 1) // num_features, total_D), dtype=dtype)


@register_fake("recops::split_embedding_codegen_forward")
def _split_embedding_codegen_forward_fake(
    weights,
    weights_offsets,
    D_offsets,
    total_D,
    max_D,
    rows_per_table,
    indices,
    offsets,
    pooling_mode,
    indice_weights=None,
    output_dtype=0,
):
    return _forward_fake(
        weights, D_offsets, total_D, max_D, indices, offsets, pooling_mode, output_dtype
    )


@register_fake("recops::split_embedding_codegen_grad_indice_weights")
def _grad_indice_weights_fake(
    grad_output,
    weights,
    weights_offsets,
    D_offsets,
    rows_per_table,
    indices,
    offsets,
    pooling_mode,
    feature_requires_grad=None,
    gradient_clipping=False,
    max_gradient=1.0,
):
    return grad_output.new_empty((indices.shape[0],), dtype=torch.float32)


@register_fake("recops::embedding_host_zeros")
def _embedding_host_zeros_fake(numel, dtype):
    return torch.empty(numel, dtype=dtype)


@register_fake("recops::index_to_int32")
def _index_to_int32_fake(t, name):
    torch._check(t.dtype == torch.int64, lambda: f"{name} must be int64 to be narrowed to int32")
    return torch.empty_like(t, dtype=torch.int32, memory_format=torch.contiguous_format)


@register_fake("recops::bounds_check_indices")
def _bounds_check_indices_fake(rows_per_table, indices, offsets, bounds_check_mode, warning):
    return None


def _make_lookup_fake(lookup):
    def fake(*args, **kwargs):
        a = named_arguments(lookup, args, kwargs)
        return _forward_fake(
            a["weights"],
            a["D_offsets"],
            a["total_D"],
            a["max_D"],
            a["indices"],
            a["offsets"],
            a["pooling_mode"],
            a["output_dtype"],
        )

    return fake


def _backward_fake(*args, **kwargs):
    return None


# --------------------------------------------------------------------------- autograd
def _schema_args(op_name):
    return getattr(ops, op_name).default._schema.arguments


_lookup_ops = {
    suffix: getattr(ops, f"split_embedding_codegen_lookup_{suffix}_function").default
    for suffix, _ in _OPTIMIZERS.values()
}


def _make_lookup_autograd(suffix):
    lookup = _lookup_ops[suffix]
    names = [a.name for a in lookup._schema.arguments]
    sample_weights_index = names.index("indice_weights")
    updates = {
        weighted: (
            getattr(ops, f"backward_codegen_{suffix}_{weighted}_exact"),
            [a.name for a in _schema_args(f"backward_codegen_{suffix}_{weighted}_exact")][1:],
        )
        for weighted in ("weighted", "unweighted")
    }

    def setup_context(ctx, inputs, output):
        ctx.args = named_arguments(lookup, inputs)

    def backward(ctx, grad_output):
        a = ctx.args
        weighted = a["indice_weights"] is not None
        grad_sample_weights = None
        if weighted and ctx.needs_input_grad[sample_weights_index]:
            # The gradient at the weights of the forward: taken before the update below.
            grad_sample_weights = ops.split_embedding_codegen_grad_indice_weights(
                grad_output,
                a["weights"],
                a["weights_offsets"],
                a["D_offsets"],
                a["rows_per_table"],
                a["indices"],
                a["offsets"],
                a["pooling_mode"],
                a["feature_requires_grad"],
                a["gradient_clipping"],
                a["max_gradient"],
            )
        update, update_args = updates["weighted" if weighted else "unweighted"]
        update(grad_output, *(a[name] for name in update_args))
        grads = [None] * len(names)
        grads[sample_weights_index] = grad_sample_weights
        return input_grads(ctx, *grads)

    return setup_context, backward


for _suffix, _ in _OPTIMIZERS.values():
    register_fake(f"recops::split_embedding_codegen_lookup_{_suffix}_function")(
        _make_lookup_fake(_lookup_ops[_suffix])
    )
    for _weighted in ("weighted", "unweighted"):
        register_fake(f"recops::backward_codegen_{_suffix}_{_weighted}_exact")(_backward_fake)
    _setup, _backward = _make_lookup_autograd(_suffix)
    register_autograd(
        f"recops::split_embedding_codegen_lookup_{_suffix}_function",
        _backward,
        setup_context=_setup,
    )


# --------------------------------------------------------------------------- module
# FBGEMM constructor arguments recops does not implement, with FBGEMM's defaults: passing the
# default is accepted (it asks for nothing), anything else raises NotImplementedError.
_UNSUPPORTED_ARGS = {
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


class SplitTableBatchedEmbeddingBagsCodegen(nn.Module):
    """FBGEMM's ``SplitTableBatchedEmbeddingBagsCodegen`` for CPU training (docs/ops.md section 7).

    ``embedding_specs`` lists ``(rows, dim, EmbeddingLocation.HOST, ComputeDevice.CPU)`` per table;
    ``feature_table_map[f]`` is the table of feature f (several features may share one). Weights
    live in one flat buffer ``weights_host`` (zeros until initialised), optimizer state in
    ``momentum1_host`` (and ``momentum2_host`` for the Adam family); large buffers are backed by
    transparent huge pages (``RECOPS_HUGE_PAGES=0`` turns that off). ``forward(indices, offsets,
    per_sample_weights=None, feature_requires_grad=None)`` takes feature-major bags (``offsets`` has
    T * B + 1 entries) and returns ``[B, sum of dims]`` (``[len(indices), dim]`` for
    ``PoolingMode.NONE``); its backward applies ``optimizer`` to the weights in place and returns no
    weight gradient.


    Arguments after ``feature_table_map`` are keyword-only. FBGEMM arguments recops does not
    implement raise ``NotImplementedError`` when given anything but FBGEMM's default; ``momentum``
    and ``eta`` belong to other optimizers and are ignored (``beta1`` and ``beta2`` too but for the
    Adam family), and ``stochastic_rounding`` too (fp16/bf16 weights round to nearest, as FBGEMM's
    CPU kernels do).
    """

    def __init__(
        self,
        embedding_specs,
        feature_table_map=None,
        *,
        weights_precision=SparseType.FP32,
        output_dtype=SparseType.FP32,
        optimizer=OptimType.EXACT_SGD,
        stochastic_rounding=True,
        gradient_clipping=False,
        max_gradient=1.0,
        learning_rate=0.01,
        eps=1.0e-8,
        momentum=0.9,
        weight_decay=0.0,
        weight_decay_mode=WeightDecayMode.NONE,
        eta=0.001,
        beta1=0.9,
        beta2=0.999,
        pooling_mode=PoolingMode.SUM,
        device=None,
        bounds_check_mode=BoundsCheckMode.WARNING,
        table_names=None,
        embedding_table_index_type=torch.int64,
        embedding_table_offset_type=torch.int64,
        cache_precision=None,
        embedding_shard_info=None,
        res_params=None,
        **fbgemm_only,
    ):
        super().__init__()
        for name, value in fbgemm_only.items():
            if name not in _UNSUPPORTED_ARGS:
                raise TypeError(f"__init__() got an unexpected keyword argument '{name}'")
            if not _is_default(value, _UNSUPPORTED_ARGS[name]):
                raise NotImplementedError(
                    f"recops.SplitTableBatchedEmbeddingBagsCodegen does not support {name}="
                    f"{value!r} (only FBGEMM's default {_UNSUPPORTED_ARGS[name]!r})"
                )
        if device is not None and torch.device(device).type != "cpu":
            raise NotImplementedError(f"recops' TBE runs on CPU only, got device={device!r}")
        if embedding_table_index_type not in (torch.int32, torch.int64):
            raise ValueError("embedding_table_index_type must be torch.int32 or torch.int64")

        self.embedding_specs = list(embedding_specs)
        if not self.embedding_specs:
            raise ValueError("embedding_specs must list at least one table")
        for i, (rows, dim, location, compute_device) in enumerate(self.embedding_specs):
            location = _coerce(EmbeddingLocation, location, f"embedding_specs[{i}] location")
            compute = _coerce(ComputeDevice, compute_device, f"embedding_specs[{i}] compute_device")
            if location != EmbeddingLocation.HOST or compute != ComputeDevice.CPU:
                raise NotImplementedError(
                    f"embedding_specs[{i}]: recops supports EmbeddingLocation.HOST with "
                    f"ComputeDevice.CPU only, got {location.name} / {compute.name}"
                )
            if rows < 0 or dim < 1:
                raise ValueError(f"embedding_specs[{i}] needs rows >= 0 and dim >= 1")
        rows = [spec[0] for spec in self.embedding_specs]
        dims = [spec[1] for spec in self.embedding_specs]
        num_tables = len(rows)
        self.feature_table_map = (
            list(range(num_tables)) if feature_table_map is None else list(feature_table_map)
        )
        if sorted(set(self.feature_table_map)) != list(range(num_tables)):
            raise ValueError("feature_table_map must name every table, and only tables, in range")

        self.optimizer = _coerce(OptimType, optimizer, "optimizer")
        self.pooling_mode = _coerce(PoolingMode, pooling_mode, "pooling_mode")
        self.weights_precision = _coerce(SparseType, weights_precision, "weights_precision")
        self.output_dtype = _coerce(SparseType, output_dtype, "output_dtype")
        self.weight_decay_mode = _coerce(WeightDecayMode, weight_decay_mode, "weight_decay_mode")
        self.bounds_check_mode = _coerce(BoundsCheckMode, bounds_check_mode, "bounds_check_mode")
        for arg, precision in (
            ("weights_precision", self.weights_precision),
            ("output_dtype", self.output_dtype),
        ):
            if precision == SparseType.INT8:
                raise NotImplementedError(f"recops does not support {arg}=SparseType.INT8")
        # No cache on the host: a cache precision other than the weights' would ask for one.
        if cache_precision is not None and (
            _coerce(SparseType, cache_precision, "cache_precision") != self.weights_precision
        ):
            raise NotImplementedError(
                "recops.SplitTableBatchedEmbeddingBagsCodegen has no cache: cache_precision must "
                f"be None or weights_precision, got {cache_precision!r}"
            )
        if self.pooling_mode == PoolingMode.NONE and len(set(dims)) > 1:
            raise ValueError("PoolingMode.NONE needs one embedding dim for all tables")

        self.table_names = table_names
        # (full rows, full dim, row offset, column offset) of each table's shard, as FBGEMM keeps
        # it for torchrec; metadata only.
        self.embedding_shard_info = embedding_shard_info
        # FBGEMM reads res_params only with enable_raw_embedding_streaming, which recops refuses
        # (torchrec passes a default RESParams() whenever it is off).
        self.res_params = res_params
        self.prefetch_pipeline = False
        self.embedding_table_index_type = embedding_table_index_type
        self.embedding_table_offset_type = embedding_table_offset_type
        self.stochastic_rounding = stochastic_rounding
        self.gradient_clipping = gradient_clipping
        self.max_gradient = max_gradient
        self.eps = eps
        self.beta1 = beta1
        self.beta2 = beta2
        self.weight_decay = weight_decay
        self.learning_rate_tensor = torch.tensor(learning_rate, dtype=torch.float32)

        # FBGEMM's layout: tables back to back in one buffer, described per feature.
        feature_dims = [dims[t] for t in self.feature_table_map]
        table_offsets = [0, *itertools.accumulate(r * d for r, d in zip(rows, dims, strict=True))]
        row_offsets = [0, *itertools.accumulate(rows)]
        self.total_D = sum(feature_dims)
        self.max_D = max(dims)
        ftm = self.feature_table_map

        def buffer(name, values, dtype):
            self.register_buffer(name, torch.tensor(values, dtype=dtype), persistent=False)

        buffer("D_offsets", [0, *itertools.accumulate(feature_dims)], torch.int32)
        buffer("feature_dims", feature_dims, torch.int64)
        buffer("rows_per_table", [rows[t] for t in ftm], torch.int64)
        buffer("weights_offsets", [table_offsets[t] for t in ftm], torch.int64)
        buffer("hash_size_cumsum", [*(row_offsets[t] for t in ftm), row_offsets[-1]], torch.int64)
        buffer("bounds_check_warning", [0], torch.int64)

        dtype = self.weights_precision.as_dtype()
        self.weights_host = nn.Parameter(ops.embedding_host_zeros(table_offsets[-1], dtype))
        self._state_layouts = _OPTIMIZERS[self.optimizer][1]
        for k, layout in enumerate(self._state_layouts, start=1):
            per_row = dims if layout == "elementwise" else [1] * num_tables
            sizes = (r * s for r, s in zip(rows, per_row, strict=True))
            state_offsets = [0, *itertools.accumulate(sizes)]
            buffer(f"momentum{k}_offsets", [state_offsets[t] for t in ftm], torch.int64)
            self.register_buffer(
                f"momentum{k}_host", ops.embedding_host_zeros(state_offsets[-1], torch.float32)
            )
        # FBGEMM's step count: forward passes so far; it bias-corrects the Adam family (and is
        # saved with it).
        self.register_buffer(
            "iter", torch.zeros(1, dtype=torch.int64), persistent=self.optimizer in _ADAM_FAMILY
        )
        self._table_offsets = table_offsets
        self.weights_physical_offsets = table_offsets[:-1]
        # FBGEMM's device and UVM buffers, empty on the host as in FBGEMM's CPU module.
        self.weights_dev = torch.empty(0, dtype=dtype)
        self.weights_uvm = torch.empty(0, dtype=dtype)

    # ----------------------------------------------------------------------- forward
    def forward(
        self,
        indices: torch.Tensor,
        offsets: torch.Tensor,
        per_sample_weights: torch.Tensor | None = None,
        feature_requires_grad: torch.Tensor | None = None,
        batch_size_per_feature_per_rank: list[list[int]] | None = None,
        total_unique_indices: int | None = None,
        hash_zch_identities: torch.Tensor | None = None,
        hash_zch_runtime_meta: torch.Tensor | None = None,
        vbe_output: torch.Tensor | None = None,
        vbe_output_offsets: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Looks up every feature's bags; ``total_unique_indices`` (an FBGEMM hint for
        ``OptimType.NONE``) is ignored."""
        # FBGEMM arguments recops does not implement (variable batch size, ZCH, VBE output), named
        # one by one: torch.compile cannot trace locals() on every supported torch (2.10).
        unsupported = dict(
            batch_size_per_feature_per_rank=batch_size_per_feature_per_rank,
            hash_zch_identities=hash_zch_identities,
            hash_zch_runtime_meta=hash_zch_runtime_meta,
            vbe_output=vbe_output,
            vbe_output_offsets=vbe_output_offsets,
        )
        for name, value in unsupported.items():
            if value is not None:
                raise NotImplementedError(f"recops' TBE forward does not support {name}")
        indices, offsets = self._index_tensors(indices, offsets)
        if per_sample_weights is not None:
            per_sample_weights = per_sample_weights.float()
        if self.bounds_check_mode != BoundsCheckMode.NONE:
            ops.bounds_check_indices(
                self.rows_per_table,
                indices,
                offsets,
                int(self.bounds_check_mode),
                self.bounds_check_warning,
            )
        suffix, state_layouts = _OPTIMIZERS[self.optimizer]
        state = {}
        for k in range(1, len(state_layouts) + 1):
            state[f"momentum{k}"] = getattr(self, f"momentum{k}_host")
            state[f"momentum{k}_offsets"] = getattr(self, f"momentum{k}_offsets")
        if state_layouts:
            state["eps"] = self.eps
        weight_decay_mode = self.weight_decay_mode
        step = int(self.iter.item()) + 1
        if self.optimizer in _ADAM_FAMILY:
            state.update(beta1=self.beta1, beta2=self.beta2, iter=step)
            lamb = self.optimizer in _LAMB_FAMILY
            weight_decay_mode = WeightDecayMode.NONE if lamb else WeightDecayMode.DECOUPLE
        lookup = getattr(ops, f"split_embedding_codegen_lookup_{suffix}_function")
        output = lookup(
            self.weights_host,
            self.weights_offsets,
            self.D_offsets,
            self.total_D,
            self.max_D,
            self.rows_per_table,
            indices,
            offsets,
            int(self.pooling_mode),
            per_sample_weights,
            feature_requires_grad,
            learning_rate_tensor=self.learning_rate_tensor,
            weight_decay=self.weight_decay,
            weight_decay_mode=int(weight_decay_mode),
            gradient_clipping=self.gradient_clipping,
            max_gradient=self.max_gradient,
            output_dtype=self.output_dtype.as_int(),
            **state,
        )
        self.iter.fill_(step)
        return output

    def _index_tensors(self, indices, offsets):
        """indices and offsets in one dtype, as FBGEMM's forward casts them: indices to
        embedding_table_index_type, offsets to the indices' dtype. Narrowing to int32 is checked
        (an index of 2^32 raises IndexError instead of becoming row 0); other dtypes are left to
        the ops to reject."""
        if self.embedding_table_index_type == torch.int32 and indices.dtype == torch.int64:
            indices = ops.index_to_int32(indices, "indices")
        if offsets.dtype == torch.int64 and indices.dtype == torch.int32:
            offsets = ops.index_to_int32(offsets, "offsets")
        elif offsets.dtype == torch.int32 and indices.dtype == torch.int64:
            offsets = offsets.long()
        return indices.contiguous(), offsets.contiguous()

    # ----------------------------------------------------------------------- FBGEMM accessors
    def split_embedding_weights(self) -> list[torch.Tensor]:
        """Per-table ``[rows, dim]`` views of the weights."""
        weights = self.weights_host.detach()
        specs = zip(self._table_offsets, self.embedding_specs, strict=False)
        return [
            weights[offset : offset + rows * dim].view(rows, dim)
            for offset, (rows, dim, *_) in specs
        ]

    def split_optimizer_states(self) -> list[list[torch.Tensor]]:
        """Per table, the list of its optimizer-state views, FBGEMM's layout: ``momentum1``
        ``[rows, dim]`` for Adagrad, ``[rows]`` for rowwise Adagrad; ``momentum1`` and
        ``momentum2`` ``[rows, dim]`` for Adam, ``[rows, dim]`` and ``[rows]`` for partial rowwise
        Adam; empty for SGD."""
        if not self._state_layouts:
            return []
        per_buffer = []
        for k, layout in enumerate(self._state_layouts, start=1):
            state = getattr(self, f"momentum{k}_host").detach()
            views = []
            offset = 0
            for rows, dim, *_ in self.embedding_specs:
                size = rows * dim if layout == "elementwise" else rows
                view = state[offset : offset + size]
                views.append(view.view(rows, dim) if layout == "elementwise" else view)
                offset += size
            per_buffer.append(views)
        return [list(states) for states in zip(*per_buffer, strict=True)]

    def get_optimizer_state(self) -> list[dict[str, torch.Tensor]]:
        """Per table, its state under ``torch.optim``'s names: ``{"sum"}`` for the Adagrads,
        ``{"exp_avg", "exp_avg_sq"}`` for the Adam family; empty for SGD (FBGEMM's)."""
        names = _STATE_NAMES[self.optimizer]
        return [dict(zip(names, states, strict=True)) for states in self.split_optimizer_states()]

    def set_learning_rate(self, lr: float) -> None:
        self.learning_rate_tensor.fill_(lr)

    def get_learning_rate(self) -> float:
        return self.learning_rate_tensor.item()

    def set_optimizer_step(self, step: int) -> None:
        """Sets the step count ``iter``: the Adam family's next step is ``iter + 1``."""
        self.iter.fill_(step)

    def flush(self) -> None:
        """FBGEMM writes its cache back; recops keeps no cache, so there is nothing to do."""

    def reset_cache_states(self) -> None:
        """FBGEMM empties its cache; recops keeps no cache, so there is nothing to do."""

    def update_hyper_parameters(self, params_dict: dict[str, float]) -> None:
        """Sets ``lr``, ``eps``, ``beta1``, ``beta2`` or ``weight_decay``."""
        for name, value in params_dict.items():
            if name == "lr":
                self.set_learning_rate(value)
            elif name in ("eps", "beta1", "beta2", "weight_decay"):
                setattr(self, name, value)
            else:
                raise NotImplementedError(f"Setting hyper-parameter {name} is not supported")

    @torch.no_grad()
    def init_embedding_weights_uniform(self, min_val: float, max_val: float) -> None:
        for weights in self.split_embedding_weights():
            weights.uniform_(min_val, max_val)
