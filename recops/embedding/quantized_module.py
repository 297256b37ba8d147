"""``IntNBitTableBatchedEmbeddingBagsCodegen``: FBGEMM's quantized inference TBE module on the host,
over recops' lookup, index remapping and bounds check ops (docs/embedding.md)."""

import operator

import torch
from torch import nn

from recops.embedding import layout
from recops.embedding.config import (
    CACHE_ARGS,
    FLOAT_OUTPUT_DTYPES,
    BoundsCheckMode,
    EmbeddingLocation,
    PoolingMode,
    SparseType,
    coerce,
)
from recops.embedding.ops import index_as
from recops.embedding.quantized_layout import (
    SCALE_BIAS_BYTES,
    round_up,
    row_bytes,
    table_offsets,
    unpadded_row_bytes,
)

ops = torch.ops.recops

OWNER = "recops.IntNBitTableBatchedEmbeddingBagsCodegen"

# FBGEMM's cache and UVM arguments (and the cache's associativity), which its CPU module ignores.
IGNORED_ARGS = CACHE_ARGS | {"cache_assoc"}
# The row types the lookup reads (FBGEMM's inference module has no BF16 rows either), each with the
# module attribute (and lookup argument) holding its largest dim.
MAX_D_ATTRS = {
    SparseType.FP32: "max_float32_D",
    SparseType.FP16: "max_float16_D",
    SparseType.FP8: "max_float8_D",
    SparseType.INT8: "max_int8_D",
    SparseType.INT4: "max_int4_D",
    SparseType.INT2: "max_int2_D",
}
# FBGEMM's bounds_check_version on CPU (get_bounds_check_version_for_platform()).
BOUNDS_CHECK_VERSION = 1
# FBGEMM's FP8 defaults (SparseType.FP8.default_config()).
FP8_EXPONENT_BITS = 4
FP8_EXPONENT_BIAS = 7


class IntNBitTableBatchedEmbeddingBagsCodegen(nn.Module):
    """FBGEMM's ``IntNBitTableBatchedEmbeddingBagsCodegen`` on the host: table-batched embedding
    bags over quantized rows, for inference.

    ``embedding_specs`` lists ``(name, rows, dim, SparseType, EmbeddingLocation.HOST)`` per table
    (recops' or FBGEMM's enums); row types FP32, FP16, FP8, INT8, INT4 and INT2, with INT4 / INT2
    dims a multiple of 2 / 4. The tables live in FBGEMM's byte layout (recops/embedding/
    quantized_layout.py) in one uint8 buffer ``weights_host``, described per feature by
    ``weights_offsets``, ``weights_tys``, ``weights_placements`` and ``D_offsets`` exactly as in
    FBGEMM's module, so its buffer copied byte for byte gives the same outputs. The buffer is empty
    until ``initialize_weights()`` (zeros), ``fill_random_weights()`` or ``weight_lists``.

    ``forward(indices, offsets, per_sample_weights=None)`` takes feature-major bags (``offsets`` has
    T * B + 1 entries) and returns ``[B, total_D]`` in ``output_dtype`` (FP32, FP16 or BF16;
    ``[len(indices), dim]`` for ``PoolingMode.NONE``, where every table has one dim). An index of
    -1 is a pruned row and adds nothing. ``index_remapping`` (one tensor or None per table: the
    new row of each original row, -1 where pruned) remaps indices first, through an array or, with
    ``use_array_for_index_remapping=False``, a hash table (``pruning_hash_load_factor``).

    Arguments after ``output_dtype`` are keyword-only. FBGEMM's cache and UVM arguments
    (``IGNORED_ARGS``) are accepted and ignored, as FBGEMM's CPU module ignores them;
    ``scale_bias_size_in_bytes`` must be 4 and ``reverse_qparam`` False (the layout the lookup
    reads). ``embedding_specs`` keeps recops' enums.
    """

    def __init__(
        self,
        embedding_specs,
        feature_table_map=None,
        index_remapping=None,
        pooling_mode=PoolingMode.SUM,
        device=None,
        bounds_check_mode=BoundsCheckMode.WARNING,
        weight_lists=None,
        pruning_hash_load_factor=0.5,
        use_array_for_index_remapping=True,
        output_dtype=SparseType.FP16,
        *,
        row_alignment=None,
        fp8_exponent_bits=None,
        fp8_exponent_bias=None,
        scale_bias_size_in_bytes=SCALE_BIAS_BYTES,
        cacheline_alignment=True,
        reverse_qparam=False,
        feature_names_per_table=None,
        indices_dtype=torch.int32,
        **fbgemm_only,
    ):
        super().__init__()
        _check_fbgemm_only_args(fbgemm_only, device, scale_bias_size_in_bytes, reverse_qparam)
        if indices_dtype not in (torch.int32, torch.int64):
            raise ValueError(
                f"indices_dtype must be torch.int32 or torch.int64, got {indices_dtype}"
            )
        self.current_device = torch.device("cpu")
        self.use_cpu = True
        self.scale_bias_size_in_bytes = SCALE_BIAS_BYTES
        self.reverse_qparam = False
        self.embedding_specs = _checked_specs(embedding_specs)
        self.feature_names = [spec[0] for spec in self.embedding_specs]
        self.feature_names_per_table = feature_names_per_table
        self.indices_dtype = indices_dtype
        rows, dims, tys = ([spec[k] for spec in self.embedding_specs] for k in (1, 2, 3))
        self.feature_table_map = layout.checked_feature_table_map(feature_table_map, len(rows))
        self.pooling_mode = coerce(PoolingMode, pooling_mode, "pooling_mode", OWNER)
        if self.pooling_mode == PoolingMode.NONE and len(set(dims)) > 1:
            raise ValueError("PoolingMode.NONE needs one embedding dim for all tables")
        mode = coerce(BoundsCheckMode, bounds_check_mode, "bounds_check_mode", OWNER)
        self.bounds_check_mode_int = int(mode)
        self.bounds_check_version = BOUNDS_CHECK_VERSION
        output = coerce(SparseType, output_dtype, "output_dtype", OWNER, FLOAT_OUTPUT_DTYPES)
        self.output_dtype = output.as_int()  # an int, as FBGEMM keeps it
        self.row_alignment = _checked_row_alignment(row_alignment)
        self._register_layout(rows, dims, tys, cacheline_alignment)
        self._set_fp8_format(fp8_exponent_bits, fp8_exponent_bias)
        if weight_lists:
            self.initialize_weights()
            self.assign_embedding_weights(weight_lists)
        self._register_remapping_buffers()
        if index_remapping:
            self.set_index_remappings(
                index_remapping, pruning_hash_load_factor, use_array_for_index_remapping
            )

    def _register_layout(self, rows, dims, tys, cacheline_alignment):
        """FBGEMM's buffers: per feature, its dim's columns, rows, row type, and where its table
        starts in ``weights_host``; per type, the largest dim."""
        ftm = self.feature_table_map
        feature_dims = layout.per_feature(dims, ftm)
        self.total_D = sum(feature_dims)
        for ty, name in MAX_D_ATTRS.items():
            setattr(
                self, name, max((d for d, t in zip(dims, tys, strict=True) if t == ty), default=0)
            )
        self._register("D_offsets", layout.running_offsets(feature_dims), torch.int32)
        self._register("rows_per_table", layout.per_feature(rows, ftm), torch.int64)
        self._register("bounds_check_warning", [0], torch.int64)
        self._register(
            "weights_tys", [t.as_int() for t in layout.per_feature(tys, ftm)], torch.uint8
        )
        specs = list(zip(rows, dims, tys, strict=True))
        offsets = table_offsets(specs, self.row_alignment, cacheline_alignment)
        self.weights_physical_offsets = offsets[:-1]
        self.weights_physical_placements = [int(EmbeddingLocation.HOST)] * len(specs)
        self.host_size, self.dev_size, self.uvm_size = offsets[-1], 0, 0
        self.weights_offsets = torch.tensor(layout.per_feature(offsets, ftm), dtype=torch.int64)
        self.weights_placements = torch.tensor(
            layout.per_feature(self.weights_physical_placements, ftm), dtype=torch.int32
        )
        self.weight_initialized = False
        self.weights_host = torch.zeros(0, dtype=torch.uint8)
        # FBGEMM's device and UVM buffers, empty on the host as in FBGEMM's CPU module.
        self.weights_dev = torch.zeros(0, dtype=torch.uint8)
        self.weights_uvm = torch.empty(0, dtype=torch.uint8)

    def _register(self, name, values, dtype):
        self.register_buffer(name, torch.tensor(values, dtype=dtype))

    def _set_fp8_format(self, exponent_bits, exponent_bias):
        """FBGEMM's: the FP8 format's defaults where a table is FP8, else -1 (unused)."""
        if self.max_float8_D > 0:
            self.fp8_exponent_bits = FP8_EXPONENT_BITS if exponent_bits is None else exponent_bits
            self.fp8_exponent_bias = FP8_EXPONENT_BIAS if exponent_bias is None else exponent_bias
        else:
            self.fp8_exponent_bits = self.fp8_exponent_bias = -1

    def _register_remapping_buffers(self):
        """Empty index remapping buffers (no pruning); int64 offsets, tables in indices_dtype."""
        for name, dtype in (
            ("index_remappings_array_offsets", torch.int64),
            ("index_remappings_array", self.indices_dtype),
            ("index_remapping_hash_table_offsets", torch.int64),
            ("index_remapping_hash_table", self.indices_dtype),
            ("original_rows_per_table", torch.int64),
        ):
            self.register_buffer(name, torch.empty(0, dtype=dtype))
        # FBGEMM's CPU module keeps its hash remapping in this object; recops' is in the
        # index_remapping_hash_table buffers (as FBGEMM's GPU module keeps it), so it stays None.
        self.index_remapping_hash_table_cpu = None

    # ----------------------------------------------------------------------- forward
    def forward(
        self,
        indices: torch.Tensor,
        offsets: torch.Tensor,
        per_sample_weights: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Pooled bags ``[B, total_D]`` (rows ``[len(indices), dim]`` for PoolingMode.NONE). With
        index remapping, indices are checked against the tables' original rows, remapped, then
        checked against the stored rows; without, checked once (unless BoundsCheckMode.NONE)."""
        if not self.weight_initialized:
            raise RuntimeError(
                f"{OWNER}: the weights are not initialized; call initialize_weights(), "
                "fill_random_weights() or assign_embedding_weights() first"
            )
        if self.index_remapping_hash_table.numel() > 0 or self.index_remappings_array.numel() > 0:
            indices, offsets = self._remapped(indices, offsets)
        self._bounds_check(self.rows_per_table, indices, offsets)
        return ops.int_nbit_split_embedding_codegen_lookup_function(
            dev_weights=self.weights_host,
            uvm_weights=self.weights_uvm,
            weights_placements=self.weights_placements,
            weights_offsets=self.weights_offsets,
            weights_tys=self.weights_tys,
            D_offsets=self.D_offsets,
            total_D=self.total_D,
            max_int2_D=self.max_int2_D,
            max_int4_D=self.max_int4_D,
            max_int8_D=self.max_int8_D,
            max_float16_D=self.max_float16_D,
            max_float32_D=self.max_float32_D,
            indices=indices,
            offsets=offsets,
            pooling_mode=int(self.pooling_mode),
            indice_weights=per_sample_weights,
            output_dtype=self.output_dtype,
            row_alignment=self.row_alignment,
            max_float8_D=self.max_float8_D,
            fp8_exponent_bits=self.fp8_exponent_bits,
            fp8_exponent_bias=self.fp8_exponent_bias,
        )

    def _remapped(self, indices, offsets):
        """indices checked against the tables' original rows, then remapped (-1: pruned), and the
        offsets in their dtype (the remapping ops take one index dtype). The hash table is probed
        with a hash of the key's dtype, so indices are looked up in the dtype its keys were
        inserted in (``indices_dtype``; narrowing to int32 checked)."""
        if self.index_remapping_hash_table.numel() > 0:
            indices = index_as(indices, self.index_remapping_hash_table.dtype, "indices")
        offsets = index_as(offsets, indices.dtype, "offsets")
        self._bounds_check(self.original_rows_per_table, indices, offsets)
        if self.index_remapping_hash_table.numel() > 0:
            indices = ops.pruned_hashmap_lookup(
                indices,
                offsets,
                self.index_remapping_hash_table,
                self.index_remapping_hash_table_offsets,
            )
        else:
            indices = ops.pruned_array_lookup(
                indices, offsets, self.index_remappings_array, self.index_remappings_array_offsets
            )
        return indices, offsets

    def _bounds_check(self, rows_per_table, indices, offsets):
        """FBGEMM's bounds_check_indices in the module's mode (repairs indices and offsets in place
        under WARNING / IGNORE); the per-sample weights are left to the lookup, which checks them,
        as in the training module."""
        if self.bounds_check_mode_int != BoundsCheckMode.NONE:
            ops.bounds_check_indices(
                rows_per_table,
                indices,
                offsets,
                self.bounds_check_mode_int,
                self.bounds_check_warning,
                None,
                bounds_check_version=self.bounds_check_version,
            )

    # ----------------------------------------------------------------------- weights
    def initialize_weights(self) -> None:
        """Allocates ``weights_host`` (zeros), once."""
        if not self.weight_initialized:
            self.weights_host = torch.zeros(self.host_size, dtype=torch.uint8)
            self.weight_initialized = True

    def split_embedding_weights_with_scale_bias(
        self, split_scale_bias_mode: int = 1
    ) -> list[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]]:
        """Per table, views of its rows in ``weights_host``: mode 0, ``(rows with their padding,
        None, None)``; 1, ``(values, scale_bias, None)`` (scale_bias ``[rows, 4]`` uint8 for the
        integer types, else None); 2, ``(values, scale, bias)`` with float16 ``[rows, 1]`` scale and
        bias for the integer types. Values are ``[rows, bytes]`` uint8 without the row padding."""
        if split_scale_bias_mode not in (0, 1, 2):
            raise ValueError(
                f"split_scale_bias_mode must be 0, 1 or 2, got {split_scale_bias_mode}"
            )
        self._require_initialized("split_embedding_weights")
        splits = []
        weights = self.weights_host.detach()
        for (_, rows, dim, ty, _), offset in zip(
            self.embedding_specs, self.weights_physical_offsets, strict=True
        ):
            stride = row_bytes(dim, ty, self.row_alignment)
            table = weights[offset : offset + rows * stride].view(rows, stride)
            if split_scale_bias_mode == 0:
                splits.append((table, None, None))
                continue
            table = table[:, : unpadded_row_bytes(dim, ty)]
            if ty.is_float():
                splits.append((table, None, None))
            elif split_scale_bias_mode == 1:
                splits.append((table[:, SCALE_BIAS_BYTES:], table[:, :SCALE_BIAS_BYTES], None))
            else:
                half = SCALE_BIAS_BYTES // 2
                scale, bias = table[:, :half], table[:, half:SCALE_BIAS_BYTES]
                splits.append(
                    (
                        table[:, SCALE_BIAS_BYTES:],
                        scale.view(torch.float16),
                        bias.view(torch.float16),
                    )
                )
        return splits

    def split_embedding_weights(
        self, split_scale_shifts: bool = True
    ) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        """Per table, ``(values, scale_bias)`` views (``split_embedding_weights_with_scale_bias``'s
        mode 1), or with ``split_scale_shifts=False`` ``(whole rows, None)`` (mode 0)."""
        splits = self.split_embedding_weights_with_scale_bias(1 if split_scale_shifts else 0)
        return [(values, scale_bias) for values, scale_bias, _ in splits]

    def fill_random_weights(self) -> None:
        """Initializes the weights and fills each table's value bytes with random bytes in
        [0, 255) from torch's generator, drawn as FBGEMM draws them (the same seed gives FBGEMM's
        bytes); the scale and bias of integer rows stay as they are (zero when just initialized),
        and random FP16 / FP32 bytes may be inf or NaN."""
        self.initialize_weights()
        for values, _ in self.split_embedding_weights():
            torch.randint(0, 255, values.shape, out=values, dtype=torch.uint8)

    @torch.no_grad()
    def assign_embedding_weights(self, q_weight_list) -> None:
        """Copies ``(values, scale_bias)`` per table into ``split_embedding_weights()``'s views
        (scale_bias None exactly where the table's type has none). Every pair is checked before
        anything is written."""
        destinations = self.split_embedding_weights()
        pairs = list(q_weight_list)
        if len(pairs) != len(destinations):
            raise ValueError(
                f"q_weight_list must hold one (weights, scale_bias) pair per table "
                f"({len(destinations)}), got {len(pairs)}"
            )
        for t, (destination, pair) in enumerate(zip(destinations, pairs, strict=True)):
            if len(pair) != 2:
                raise ValueError(f"q_weight_list[{t}] must be a (weights, scale_bias) pair")
            for part, target, source in zip(
                ("weights", "scale_bias"), destination, pair, strict=True
            ):
                if (target is None) != (source is None):
                    raise ValueError(
                        f"q_weight_list[{t}] {part} must be "
                        f"{'None' if target is None else 'a tensor'} for table {t}'s type "
                        f"{self.embedding_specs[t][3].name}"
                    )
                if source is not None and not _broadcasts_to(source, target.shape):
                    raise ValueError(
                        f"q_weight_list[{t}] {part} of shape {list(source.shape)} does not fit "
                        f"table {t}'s {list(target.shape)}"
                    )
        for destination, pair in zip(destinations, pairs, strict=True):
            for target, source in zip(destination, pair, strict=True):
                if source is not None:
                    target.copy_(source)

    @torch.no_grad()
    def embedding_inplace_update(
        self, update_table_indices, update_row_indices, update_weights
    ) -> None:
        """Overwrites whole stored rows: rows ``update_row_indices[i]`` of table
        ``update_table_indices[i]`` become the rows of ``update_weights[i]``, uint8
        ``[len(rows), row bytes]`` laid out as ``split_embedding_weights(split_scale_shifts=False)``
        gives them (padding included). Every update is checked before any row is written."""
        tables = self.split_embedding_weights(split_scale_shifts=False)
        updates = (list(update_table_indices), list(update_row_indices), list(update_weights))
        if len({len(u) for u in updates}) != 1:
            raise ValueError(
                "update_table_indices, update_row_indices and update_weights must have one entry "
                f"per update, got {[len(u) for u in updates]}"
            )
        checked = []
        for i, (t, rows, weights) in enumerate(zip(*updates, strict=True)):
            if not 0 <= t < len(tables):
                raise ValueError(f"update_table_indices[{i}] = {t} is not a table index")
            target = tables[t][0]
            rows = torch.as_tensor(rows, dtype=torch.int64)
            if rows.dim() != 1 or (
                rows.numel() and not 0 <= rows.min() <= rows.max() < target.shape[0]
            ):
                raise IndexError(
                    f"update_row_indices[{i}] must list rows of table {t}, in [0, "
                    f"{target.shape[0]})"
                )
            shape = (rows.numel(), target.shape[1])
            if weights.dtype != torch.uint8 or tuple(weights.shape) != shape:
                raise ValueError(
                    f"update_weights[{i}] must be uint8 {list(shape)} (whole rows of table {t}), "
                    f"got {weights.dtype} {list(weights.shape)}"
                )
            checked.append((target, rows, weights))
        for target, rows, weights in checked:
            target.index_copy_(0, rows, weights)

    def _require_initialized(self, what):
        if not self.weight_initialized:
            raise RuntimeError(f"{OWNER}.{what}: the weights are not initialized")

    # ----------------------------------------------------------------------- pruning
    def set_index_remappings_array(self, index_remapping) -> None:
        """Array remapping: table t's original row r reads row ``index_remapping[t][r]`` (-1:
        pruned); a table whose mapping is None is not remapped."""
        rows = [spec[1] for spec in self.embedding_specs]
        mappings = self._checked_remappings(index_remapping)
        original_rows = [rows[t] if m is None else m.numel() for t, m in enumerate(mappings)]
        sizes = [0 if m is None else m.numel() for m in mappings]
        given = [m.long() for m in mappings if m is not None]
        remappings = torch.cat(given) if given else torch.empty(0, dtype=torch.int64)
        # Checked first: a mapping int32 indices_dtype cannot hold raises and changes nothing.
        remappings = index_as(remappings, self.indices_dtype, "index_remapping")
        self.index_remappings_array = remappings
        self.index_remappings_array_offsets = torch.tensor(
            layout.running_offsets(sizes), dtype=torch.int64
        )
        self._set_original_rows(original_rows)

    def set_index_remappings(
        self,
        index_remapping,
        pruning_hash_load_factor: float = 0.5,
        use_array_for_index_remapping: bool = True,
    ) -> None:
        """Index remapping as an array (``set_index_remappings_array``) or as a hash table of each
        remapped table's kept rows, with ``rows / pruning_hash_load_factor`` slots rounded up to
        32 (FBGEMM's sizes); either way an index outside its table's original rows is the bounds
        check's, a pruned one becomes -1."""
        if use_array_for_index_remapping:
            self.set_index_remappings_array(index_remapping)
            return
        if not pruning_hash_load_factor > 0:
            raise ValueError(
                f"pruning_hash_load_factor must be > 0, got {pruning_hash_load_factor}"
            )
        rows = [spec[1] for spec in self.embedding_specs]
        mappings = self._checked_remappings(index_remapping)
        capacities = [
            0 if m is None else round_up(int(r / pruning_hash_load_factor), 32)
            for m, r in zip(mappings, rows, strict=True)
        ]
        dense = [
            torch.arange(r) if m is None else m.long() for m, r in zip(mappings, rows, strict=True)
        ]
        original_rows = [d.numel() for d in dense]
        hash_table = torch.full((sum(capacities), 2), -1, dtype=self.indices_dtype)
        hash_offsets = torch.tensor(layout.running_offsets(capacities), dtype=torch.int64)
        # Every original row of each table is inserted (one bag per table) with its dense row,
        # all in indices_dtype: the hash of a key depends on its dtype, and forward probes with
        # indices of indices_dtype.
        keys = torch.cat([torch.arange(n) for n in original_rows])
        key_offsets = torch.tensor(layout.running_offsets(original_rows))
        ops.pruned_hashmap_insert(
            index_as(keys, self.indices_dtype, "index_remapping rows"),
            index_as(torch.cat(dense), self.indices_dtype, "index_remapping"),
            index_as(key_offsets, self.indices_dtype, "index_remapping rows"),
            hash_table,
            hash_offsets,
        )
        self.index_remapping_hash_table = hash_table
        self.index_remapping_hash_table_offsets = hash_offsets
        self._set_original_rows(original_rows)

    def _checked_remappings(self, index_remapping):
        """``index_remapping`` as a list of one 1-D integer tensor or None per table."""
        mappings = list(index_remapping)
        if len(mappings) != len(self.embedding_specs):
            raise ValueError(
                f"index_remapping must hold one tensor or None per table "
                f"({len(self.embedding_specs)}), got {len(mappings)}"
            )
        for t, m in enumerate(mappings):
            if m is not None and (
                not isinstance(m, torch.Tensor)
                or m.dim() != 1
                or m.dtype.is_floating_point
                or m.dtype.is_complex
                or m.dtype == torch.bool
            ):
                raise ValueError(f"index_remapping[{t}] must be None or a 1-D integer tensor")
        return mappings

    def _set_original_rows(self, original_rows):
        self.original_rows_per_table = torch.tensor(
            layout.per_feature(original_rows, self.feature_table_map), dtype=torch.int64
        )


def _check_fbgemm_only_args(fbgemm_only, device, scale_bias_size_in_bytes, reverse_qparam):
    """TypeError for an argument FBGEMM does not have either; NotImplementedError naming a setting
    recops does not implement (a device other than the CPU, another row layout)."""
    for name in fbgemm_only:
        if name not in IGNORED_ARGS:
            raise TypeError(f"__init__() got an unexpected keyword argument '{name}'")
    if device is not None and torch.device(device).type != "cpu":
        raise NotImplementedError(f"{OWNER} runs on CPU only, got device={device!r}")
    if scale_bias_size_in_bytes != SCALE_BIAS_BYTES:
        raise NotImplementedError(
            f"{OWNER} supports scale_bias_size_in_bytes={SCALE_BIAS_BYTES} only (a float16 scale "
            f"and bias), got {scale_bias_size_in_bytes}"
        )
    if reverse_qparam:
        raise NotImplementedError(
            f"{OWNER} supports reverse_qparam=False only (scale and bias before the codes)"
        )


def _checked_specs(embedding_specs):
    """``embedding_specs`` as ``(name, rows, dim, SparseType, EmbeddingLocation)`` tuples of
    recops' enums: on the host, rows >= 0, dim >= 1, a row type the lookup reads, and whole bytes
    of codes per row."""
    specs = []
    for i, spec in enumerate(embedding_specs):
        if len(spec) != 5:
            raise ValueError(
                f"embedding_specs[{i}] must be (name, rows, dim, SparseType, EmbeddingLocation)"
            )
        name, rows, dim, ty, location = spec
        ty = coerce(SparseType, ty, f"embedding_specs[{i}] weights type", OWNER, tuple(MAX_D_ATTRS))
        location = coerce(
            EmbeddingLocation,
            location,
            f"embedding_specs[{i}] location",
            OWNER,
            (EmbeddingLocation.HOST,),
        )
        try:
            rows, dim = operator.index(rows), operator.index(dim)
        except TypeError:
            rows = dim = -1
        if rows < 0 or dim < 1:
            raise ValueError(f"embedding_specs[{i}] needs integers rows >= 0 and dim >= 1")
        per_byte = 8 // min(8, ty.bit_rate())
        if dim % per_byte:
            raise ValueError(
                f"embedding_specs[{i}]: a {ty.name} row packs {per_byte} values a byte, so dim "
                f"must be a multiple of {per_byte}, got {dim}"
            )
        specs.append((name, rows, dim, ty, location))
    if not specs:
        raise ValueError("embedding_specs must list at least one table")
    return specs


def _checked_row_alignment(row_alignment):
    """FBGEMM's default on the host (1), or a positive byte count below 2^31 (the lookup's)."""
    if row_alignment is None:
        return 1
    if not isinstance(row_alignment, int) or not 1 <= row_alignment < 2**31:
        raise ValueError(f"row_alignment must be an integer in [1, 2^31), got {row_alignment!r}")
    return row_alignment


def _broadcasts_to(source, shape):
    try:
        return torch.broadcast_shapes(source.shape, shape) == shape
    except RuntimeError:
        return False
