"""``SplitTableBatchedEmbeddingBagsCodegen``: FBGEMM's TBE module for CPU training over recops'
lookup ops (their autograd applies the optimizer in place)."""

import torch
from torch import nn

from recops.embedding import int8, layout
from recops.embedding.config import (
    FLOAT_OUTPUT_DTYPES,
    WEIGHTS_PRECISIONS,
    BoundsCheckMode,
    ComputeDevice,
    EmbeddingLocation,
    PoolingMode,
    SparseType,
    WeightDecayMode,
    check_fbgemm_only_args,
    coerce,
    writeback_settings,
)
from recops.embedding.counter import COUNTER_MODES, CounterWeightDecayMode, counter_settings
from recops.embedding.ops import index_as
from recops.embedding.optimizers import OPTIMIZERS, WITH_COUNTER, OptimType
from recops.embedding.writeback import writeback_hook

ops = torch.ops.recops


class SplitTableBatchedEmbeddingBagsCodegen(nn.Module):
    """FBGEMM's ``SplitTableBatchedEmbeddingBagsCodegen`` for CPU training (docs/ops.md section 7).

    ``embedding_specs`` lists ``(rows, dim, EmbeddingLocation.HOST, ComputeDevice.CPU)`` per table;
    ``feature_table_map[f]`` is the table of feature f (several features may share one). Weights
    live in one flat buffer ``weights_host`` (zeros until initialised), optimizer state in
    ``momentum1_host`` (and ``momentum2_host`` for the Adam family, ``prev_iter_host`` for rowwise
    RMSprop-AR); large buffers are backed by
    transparent huge pages (``RECOPS_HUGE_PAGES=0`` turns that off). ``forward(indices, offsets,
    per_sample_weights=None, feature_requires_grad=None, batch_size_per_feature_per_rank=None)``
    takes feature-major bags (``offsets`` has T * B + 1 entries) and returns ``[B, sum of dims]``
    (``[len(indices), dim]`` for ``PoolingMode.NONE``; flat with a variable batch size, see
    ``forward``); its backward applies ``optimizer`` to the weights in place and returns no weight
    gradient.

    Arguments after ``feature_table_map`` are keyword-only. FBGEMM's cache, UVM, prefetch and
    reporting arguments (``cache_algorithm``, ``cache_load_factor``, ``prefetch_pipeline``,
    ``max_norm``, ... see ``config.IGNORED_ARGS``) are accepted and ignored, as FBGEMM's CPU module
    ignores them; its configuration objects are accepted when None or all-default; any other
    setting recops does not implement raises ``NotImplementedError`` naming it.
    ``extra_optimizer_config`` may ask for SGD's writeback pre-hook (``use_writeback_bwd_prehook``,
    ``writeback_first_feature_only``; see recops/embedding/writeback.py).
    ``OptimType.EXACT_ROWWISE_ADAGRAD`` with ``weight_decay_mode`` COUNTER (and
    ``counter_based_regularization``) or COWCLIP (and ``cowclip_regularization``) is FBGEMM's
    rowwise Adagrad with counter, with the states ``momentum1``, ``prev_iter`` and ``row_counter``
    and the step-count buffer ``max_counter`` (see recops/embedding/counter.py). ``momentum`` and
    ``eta`` belong to other optimizers and are ignored (``beta1`` and ``beta2`` too but for the Adam
    family, ``ar_alpha``, ``ema_beta`` and ``min_shrinkage`` but for rowwise RMSprop-AR), and
    ``stochastic_rounding`` too (fp16/bf16 weights round to nearest, as FBGEMM's CPU kernels do).
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
        ar_alpha=0.0,
        ema_beta=0.99,
        min_shrinkage=0.1,
        pooling_mode=PoolingMode.SUM,
        device=None,
        bounds_check_mode=BoundsCheckMode.WARNING,
        table_names=None,
        embedding_table_index_type=torch.int64,
        embedding_table_offset_type=torch.int64,
        cache_precision=None,
        embedding_shard_info=None,
        res_params=None,
        extra_optimizer_config=None,
        counter_based_regularization=None,
        cowclip_regularization=None,
        **fbgemm_only,
    ):
        super().__init__()
        check_fbgemm_only_args(fbgemm_only)
        if device is not None and torch.device(device).type != "cpu":
            raise NotImplementedError(f"recops' TBE runs on CPU only, got device={device!r}")
        if embedding_table_index_type not in (torch.int32, torch.int64):
            raise ValueError("embedding_table_index_type must be torch.int32 or torch.int64")
        self.embedding_specs = _checked_specs(embedding_specs)
        rows = [spec[0] for spec in self.embedding_specs]
        dims = [spec[1] for spec in self.embedding_specs]
        self.feature_table_map = layout.checked_feature_table_map(feature_table_map, len(rows))
        self._set_modes(
            optimizer,
            pooling_mode,
            weights_precision,
            output_dtype,
            weight_decay_mode,
            bounds_check_mode,
            cache_precision,
            dims,
        )
        self._set_optimizer_spec(counter_based_regularization, cowclip_regularization)
        state_layouts = self._optimizer_spec.state_layouts
        if fbgemm_only.get("uvm_non_rowwise_momentum") and "elementwise" in state_layouts:
            # It would place the elementwise state in UVM, which FBGEMM's CPU module refuses.
            raise NotImplementedError(
                "recops.SplitTableBatchedEmbeddingBagsCodegen keeps optimizer state on the host: "
                f"uvm_non_rowwise_momentum=True with {self.optimizer.name}"
            )
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
        self.ar_alpha = ar_alpha
        self.ema_beta = ema_beta
        self.min_shrinkage = min_shrinkage
        self.weight_decay = weight_decay
        self.learning_rate_tensor = torch.tensor(learning_rate, dtype=torch.float32)
        self._register_layout(rows, dims)
        self._allocate_storage(rows, dims)
        self.use_writeback_bwd_prehook, self.writeback_first_feature_only = writeback_settings(
            extra_optimizer_config, self.optimizer
        )
        if self.use_writeback_bwd_prehook:
            self.register_full_backward_pre_hook(writeback_hook)

    def _set_modes(
        self,
        optimizer,
        pooling_mode,
        weights_precision,
        output_dtype,
        weight_decay_mode,
        bounds_check_mode,
        cache_precision,
        dims,
    ):
        """The enum arguments as recops' enums, refusing the settings recops does not implement."""
        self.optimizer = coerce(OptimType, optimizer, "optimizer")
        self.pooling_mode = coerce(PoolingMode, pooling_mode, "pooling_mode")
        # INT8 weights are FBGEMM's quantized rows, looked up only (see int8.py); the output is
        # floating point.
        self.weights_precision = coerce(
            SparseType, weights_precision, "weights_precision", supported=WEIGHTS_PRECISIONS
        )
        self.output_dtype = coerce(
            SparseType, output_dtype, "output_dtype", supported=FLOAT_OUTPUT_DTYPES
        )
        self.weight_decay_mode = coerce(WeightDecayMode, weight_decay_mode, "weight_decay_mode")
        self.bounds_check_mode = coerce(BoundsCheckMode, bounds_check_mode, "bounds_check_mode")
        # No cache on the host: a cache precision other than the weights' would ask for one.
        if cache_precision is not None and (
            coerce(SparseType, cache_precision, "cache_precision") != self.weights_precision
        ):
            raise NotImplementedError(
                "recops.SplitTableBatchedEmbeddingBagsCodegen has no cache: cache_precision must "
                f"be None or weights_precision, got {cache_precision!r}"
            )
        if self.pooling_mode == PoolingMode.NONE and len(set(dims)) > 1:
            raise ValueError("PoolingMode.NONE needs one embedding dim for all tables")

    def _set_optimizer_spec(self, counter_based_regularization, cowclip_regularization):
        """The optimizer table's row for the optimizer and the weight_decay_mode its ops take: for
        EXACT_ROWWISE_ADAGRAD under COUNTER or COWCLIP, rowwise Adagrad with counter and the
        counter's own mode."""
        spec = OPTIMIZERS[self.optimizer]
        self._counter = None
        if (
            self.weight_decay_mode in COUNTER_MODES
            or counter_based_regularization is not None
            or cowclip_regularization is not None
        ):
            if self.optimizer != OptimType.EXACT_ROWWISE_ADAGRAD:
                raise NotImplementedError(
                    "rowwise Adagrad with counter (weight_decay_mode COUNTER or COWCLIP, "
                    "counter_based_regularization, cowclip_regularization) needs "
                    f"OptimType.EXACT_ROWWISE_ADAGRAD, got {self.optimizer.name} with "
                    f"weight_decay_mode={self.weight_decay_mode.name}"
                )
            self._counter = counter_settings(
                self.weight_decay_mode, counter_based_regularization, cowclip_regularization
            )
            spec = WITH_COUNTER
        self._optimizer_spec = spec
        if self._counter is not None:
            self._op_weight_decay_mode = int(self._counter.weight_decay_mode)
        elif spec.weight_decay_mode is not None:
            self._op_weight_decay_mode = spec.weight_decay_mode
        else:
            self._op_weight_decay_mode = int(self.weight_decay_mode)

    def _register_layout(self, rows, dims):
        """FBGEMM's layout: tables back to back in one buffer, described per feature."""
        buffers = layout.feature_buffers(rows, dims, self.feature_table_map, self._row_widths(dims))
        for name, (values, dtype) in buffers.items():
            self._register_index_buffer(name, values, dtype)
        self._register_index_buffer("bounds_check_warning", [0], torch.int64)
        self._feature_dim_list = buffers["feature_dims"][0]
        self.total_D = sum(self._feature_dim_list)
        self.max_D = max(dims)
        self._table_offsets = layout.block_offsets(rows, self._row_widths(dims))
        self.weights_physical_offsets = self._table_offsets[:-1]

    def _row_widths(self, dims):
        """Elements per stored weights row: the dim, plus an INT8 row's scale and bias."""
        return int8.stored_widths(dims, self.weights_precision == SparseType.INT8)

    def _register_index_buffer(self, name, values, dtype):
        self.register_buffer(name, torch.tensor(values, dtype=dtype), persistent=False)

    def _allocate_storage(self, rows, dims):
        """The weights, the optimizer's state buffers with their per-feature offsets, and the step
        count."""
        dtype = self.weights_precision.as_dtype()
        # INT8 rows are integers: a parameter, as in FBGEMM, that cannot require a gradient.
        self.weights_host = nn.Parameter(
            ops.embedding_host_zeros(self._table_offsets[-1], dtype),
            requires_grad=dtype.is_floating_point,
        )
        spec = self._optimizer_spec
        for name, state_layout in zip(spec.state_buffers, spec.state_layouts, strict=True):
            state_offsets = layout.block_offsets(rows, layout.state_widths(state_layout, dims))
            self._register_index_buffer(
                f"{name}_offsets",
                layout.per_feature(state_offsets, self.feature_table_map),
                torch.int64,
            )
            self.register_buffer(
                f"{name}_host", ops.embedding_host_zeros(state_offsets[-1], torch.float32)
            )
        # FBGEMM's step count: forward passes so far; saved by the optimizers that read it (the
        # Adam family's bias correction, RMSprop-AR's staleness).
        self.register_buffer(
            "iter", torch.zeros(1, dtype=torch.int64), persistent="iter" in spec.hyper_parameters
        )
        if self._counter is not None:
            # The largest count + 1, updated every max_counter_update_freq steps (FBGEMM's buffer).
            self.register_buffer("max_counter", torch.ones(1, dtype=torch.float32))
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
        """Looks up every feature's bags. With ``batch_size_per_feature_per_rank`` (FBGEMM's
        variable batch size, pooled only), feature t has ``sum(batch_size_per_feature_per_rank[t])``
        bags, rank by rank, and the output is flat: for each rank r, for each feature t, the rows
        (of dim D_t) of its ``batch_size_per_feature_per_rank[t][r]`` bags from r.
        ``total_unique_indices`` (an FBGEMM hint for ``OptimType.NONE``) and
        ``hash_zch_identities`` / ``hash_zch_runtime_meta`` (read by FBGEMM only with raw embedding
        streaming, which recops refuses) are ignored."""
        # A preallocated VBE output: FBGEMM's CPU module refuses it too.
        for name, value in (("vbe_output", vbe_output), ("vbe_output_offsets", vbe_output_offsets)):
            if value is not None:
                raise NotImplementedError(f"recops' TBE forward does not support {name}")
        batch_sizes, vbe_output_size = self._variable_batch(batch_size_per_feature_per_rank)
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
                None,  # FBGEMM passes per_sample_weights for a size check; the lookup checks them
                *self._batch_offsets(batch_sizes),
            )
        if self.use_writeback_bwd_prehook:
            self._writeback_batch = (indices, offsets)
        spec = self._optimizer_spec
        state = {}
        for name in spec.state_buffers:
            state[name] = getattr(self, f"{name}_host")
            state[f"{name}_offsets"] = getattr(self, f"{name}_offsets")
        step = int(self.iter.item()) + 1
        state.update(self._hyper_parameters(step))
        lookup = getattr(ops, f"split_embedding_codegen_lookup_{spec.name}_function")
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
            weight_decay_mode=self._op_weight_decay_mode,
            gradient_clipping=self.gradient_clipping,
            max_gradient=self.max_gradient,
            output_dtype=self.output_dtype.as_int(),
            batch_size_per_feature_per_rank=batch_sizes,
            vbe_output_size=vbe_output_size,
            **state,
        )
        # The step is taken: its step count and max_counter are kept.
        self.iter.fill_(step)
        if "max_counter" in state:
            self.max_counter.fill_(state["max_counter"])
        return output

    def _hyper_parameters(self, step):
        """The optimizer's hyper-parameters for taking step ``step``: its module attributes of
        those names, the counter's settings, and for COUNTER a max_counter that follows the
        counts every max_counter_update_freq steps (as FBGEMM's GPU module does; its CPU module
        reads the counts from its device buffer, empty on the host, so its max_counter stays 1)."""
        values = {}
        for name in self._optimizer_spec.hyper_parameters:
            if name == "iter":
                values[name] = step
            elif name == "max_counter":
                values[name] = self._max_counter(step)
            elif self._counter is not None and name in self._counter.hyper_parameters:
                values[name] = self._counter.hyper_parameters[name]
            else:
                values[name] = getattr(self, name)
        return values

    def _max_counter(self, step):
        """max_counter for step ``step``: the largest count + 1 every max_counter_update_freq
        steps, else the buffer's value."""
        freq = self._counter.max_counter_update_freq
        if freq > 0 and step % freq == 0:
            counts = self.row_counter_host
            return counts.max().item() + 1 if counts.numel() else 1.0
        return self.max_counter.item()

    def _variable_batch(self, batch_size_per_feature_per_rank):
        """FBGEMM's batch_size_per_feature_per_rank as the ops take it, an int64 [T, R] tensor
        (the ops check it), and the size of the flat output it lays out; (None, -1) for a fixed
        batch size."""
        if batch_size_per_feature_per_rank is None:
            return None, -1
        if self.use_writeback_bwd_prehook:
            raise NotImplementedError(
                "batch_size_per_feature_per_rank cannot be combined with "
                "use_writeback_bwd_prehook (as in FBGEMM)"
            )
        try:
            batch_sizes = torch.tensor(batch_size_per_feature_per_rank, dtype=torch.int64)
        except (TypeError, ValueError, RuntimeError) as e:
            raise ValueError(
                "batch_size_per_feature_per_rank must be a list of T lists of R batch sizes "
                f"(T = {len(self.feature_table_map)} features): {e}"
            ) from None
        if batch_sizes.dim() != 2 or batch_sizes.shape[0] != len(self.feature_table_map):
            raise ValueError(
                "batch_size_per_feature_per_rank must be int64 [T, R] for T = "
                f"{len(self.feature_table_map)} features, got {list(batch_sizes.shape)}"
            )
        output_size = sum(
            dim * sum(sizes)
            for dim, sizes in zip(
                self._feature_dim_list, batch_size_per_feature_per_rank, strict=False
            )
        )
        return batch_sizes, output_size

    @staticmethod
    def _batch_offsets(batch_sizes):
        """FBGEMM's (B_offsets, max_B) of a variable batch size (feature t's bags are
        B_offsets[t]:B_offsets[t + 1]), or (None, -1)."""
        if batch_sizes is None:
            return None, -1
        per_feature = batch_sizes.sum(dim=1)
        B_offsets = torch.cat([per_feature.new_zeros(1), per_feature.cumsum(0)])
        return B_offsets, int(per_feature.max()) if per_feature.numel() else 0

    def _index_tensors(self, indices, offsets):
        """indices and offsets in one dtype, as FBGEMM's forward casts them: indices to
        embedding_table_index_type, offsets to the indices' dtype. Narrowing to int32 is checked
        (an index of 2^32 raises IndexError instead of becoming row 0); other dtypes are left to
        the ops to reject."""
        if self.embedding_table_index_type == torch.int32:
            indices = index_as(indices, torch.int32, "indices")
        offsets = index_as(offsets, indices.dtype, "offsets")
        return indices.contiguous(), offsets.contiguous()

    # ----------------------------------------------------------------------- FBGEMM accessors
    def split_embedding_weights(self) -> list[torch.Tensor]:
        """Per-table ``[rows, dim]`` views of the weights."""
        rows, dims = self._table_shapes()
        widths = self._row_widths(dims)
        return layout.table_views(self.weights_host.detach(), rows, widths, as_matrix=True)

    def _table_shapes(self):
        """(rows per table, dim per table)."""
        specs = self.embedding_specs
        return [spec[0] for spec in specs], [spec[1] for spec in specs]

    def split_optimizer_states(self) -> list[list[torch.Tensor]]:
        """Per table, the list of its optimizer-state views, FBGEMM's layout: ``momentum1``
        ``[rows, dim]`` for Adagrad, ``[rows]`` for rowwise Adagrad; ``momentum1`` and
        ``momentum2`` ``[rows, dim]`` for Adam, ``[rows, dim]`` and ``[rows]`` for partial rowwise
        Adam; ``momentum1`` and ``prev_iter`` ``[rows]`` for rowwise RMSprop-AR, and
        ``row_counter`` too for rowwise Adagrad with counter; empty for SGD."""
        rows, dims = self._table_shapes()
        spec = self._optimizer_spec
        per_buffer = [
            layout.table_views(
                getattr(self, f"{name}_host").detach(),
                rows,
                layout.state_widths(state_layout, dims),
                as_matrix=state_layout == "elementwise",
            )
            for name, state_layout in zip(spec.state_buffers, spec.state_layouts, strict=True)
        ]
        return [list(states) for states in zip(*per_buffer, strict=True)]

    def get_optimizer_state(self) -> list[dict[str, torch.Tensor]]:
        """Per table, its state under ``torch.optim``'s names: ``{"sum"}`` for the Adagrads,
        ``{"exp_avg", "exp_avg_sq"}`` for the Adam family, ``{"sum", "prev_iter", "iter"}`` for
        rowwise RMSprop-AR; empty for SGD (FBGEMM's)."""
        names = self._optimizer_spec.state_names
        # FBGEMM lists the step count beside the state that dates rows by it, for the counter
        # optimizer only where it decays lazily by it (COUNTER with ADAGRADW).
        lists_step = "prev_iter" in names
        if self._counter is not None:
            lists_step = (
                self.weight_decay_mode == WeightDecayMode.COUNTER
                and self._counter.weight_decay_mode == CounterWeightDecayMode.ADAGRADW
            )
        step = {"iter": self.iter} if lists_step else {}
        return [
            dict(zip(names, states, strict=True)) | step for states in self.split_optimizer_states()
        ]

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
        """Uniform weights; INT8 tables get them quantized (FBGEMM's rule, see int8.py)."""
        for weights in self.split_embedding_weights():
            if self.weights_precision == SparseType.INT8:
                values = torch.empty(weights.shape[0], weights.shape[1] - int8.ROW_TAIL)
                weights.copy_(int8.quantize_rows(values.uniform_(min_val, max_val)))
            else:
                weights.uniform_(min_val, max_val)


def _checked_specs(embedding_specs):
    """``embedding_specs`` as a list, each table on the host, with rows >= 0 and dim >= 1."""
    specs = list(embedding_specs)
    if not specs:
        raise ValueError("embedding_specs must list at least one table")
    for i, (rows, dim, location, compute_device) in enumerate(specs):
        location = coerce(EmbeddingLocation, location, f"embedding_specs[{i}] location")
        compute = coerce(ComputeDevice, compute_device, f"embedding_specs[{i}] compute_device")
        if location != EmbeddingLocation.HOST or compute != ComputeDevice.CPU:
            raise NotImplementedError(
                f"embedding_specs[{i}]: recops supports EmbeddingLocation.HOST with "
                f"ComputeDevice.CPU only, got {location.name} / {compute.name}"
            )
        if rows < 0 or dim < 1:
            raise ValueError(f"embedding_specs[{i}] needs rows >= 0 and dim >= 1")
    return specs
