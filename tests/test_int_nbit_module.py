"""recops.IntNBitTableBatchedEmbeddingBagsCodegen, FBGEMM's quantized inference TBE module: against
a float64 dequantize-and-pool reference written in the tests (tests/test_int_nbit_lookup.py's), and
against fbgemm-gpu-cpu's module holding the same bytes (skipped when FBGEMM is hidden or absent)."""

import pytest
import torch
from accuracy import assert_close
from test_int_nbit_lookup import (
    MIXED,
    SAME_DIM,
    decode_rows,
    fp8_values,
    lookup_reference,
    random_batch,
)

import recops
from recops import BoundsCheckMode, EmbeddingLocation, PoolingMode, SparseType
from recops.embedding.quantized_layout import row_bytes

Module = recops.IntNBitTableBatchedEmbeddingBagsCodegen
HOST = EmbeddingLocation.HOST
FP32, FP16, INT8, INT4, INT2, FP8 = (
    SparseType.FP32,
    SparseType.FP16,
    SparseType.INT8,
    SparseType.INT4,
    SparseType.INT2,
    SparseType.FP8,
)
TYPES = (FP32, FP16, INT8, INT4, INT2, FP8)
OUTPUTS = {
    SparseType.FP32: torch.float32,
    SparseType.FP16: torch.float16,
    SparseType.BF16: torch.bfloat16,
}
FP8_FORMAT = (4, 7)  # FBGEMM's default exponent bits and bias

# (rows, dim, type) per table: test_int_nbit_lookup.py's tables (every type, mixed dims; one dim
# for PoolingMode.NONE) with recops' SparseType members.
MIXED, SAME_DIM = ([(r, d, SparseType(ty)) for r, d, ty in tables] for tables in (MIXED, SAME_DIM))
POOLINGS = [PoolingMode.SUM, PoolingMode.MEAN, PoolingMode.NONE]
# Features 0 and 3 share table 1, feature 2 and 5 table 0: every table is read by some feature.
SHARED_MAP = [1, 2, 0, 1, 3, 0, 4, 5]


def specs_of(tables):
    return [(f"t{i}", rows, dim, ty, HOST) for i, (rows, dim, ty) in enumerate(tables)]


def random_rows(rows, dim, ty, gen):
    """Finite random rows of one table as assign_embedding_weights takes them, (values,
    scale_bias or None) uint8, and their float64 values [rows, dim]."""
    if ty in (FP32, FP16):
        values = torch.randn(rows, dim, generator=gen).to(
            torch.float32 if ty == FP32 else torch.float16
        )
        return (values.view(torch.uint8), None), values.double()
    if ty == FP8:
        codes = torch.randint(0, 256, (rows, dim), generator=gen, dtype=torch.uint8)
        return (codes, None), fp8_values(codes, *FP8_FORMAT)
    bits = ty.bit_rate()
    scale = (torch.rand(rows, 1, generator=gen) * 0.1 + 0.01).half()
    bias = (torch.rand(rows, 1, generator=gen) - 0.5).half()
    codes = torch.randint(0, 1 << bits, (rows, dim), generator=gen, dtype=torch.uint8)
    per_byte = 8 // bits
    packed = torch.zeros(rows, dim // per_byte, dtype=torch.uint8)
    for k in range(per_byte):  # element d: bits (d % per_byte) * bits of byte d / per_byte
        packed |= codes[:, k::per_byte] << (k * bits)
    scale_bias = torch.cat([scale, bias], 1).view(torch.uint8)
    return (packed, scale_bias), scale.double() * codes.double() + bias.double()


def filled_module(tables, gen, **kwargs):
    """A recops module of `tables` with random finite rows assigned; the tables' float64 values."""
    module = Module(specs_of(tables), **kwargs)
    module.initialize_weights()
    weights, values = zip(*(random_rows(r, d, ty, gen) for r, d, ty in tables), strict=True)
    module.assign_embedding_weights(list(weights))
    return module, list(values)


def reference(module, indices, offsets, per_sample_weights=None):
    """The module's lookup in float64 (tests/test_int_nbit_lookup.py's reference) on its buffers."""
    op = torch.ops.recops.int_nbit_split_embedding_codegen_lookup_function
    names = [a.name for a in op.default._schema.arguments]
    m = module
    values = dict(
        dev_weights=m.weights_host, uvm_weights=m.weights_uvm,
        weights_placements=m.weights_placements, weights_offsets=m.weights_offsets,
        weights_tys=m.weights_tys, D_offsets=m.D_offsets, total_D=m.total_D,
        max_int2_D=m.max_int2_D, max_int4_D=m.max_int4_D, max_int8_D=m.max_int8_D,
        max_float16_D=m.max_float16_D, max_float32_D=m.max_float32_D, indices=indices,
        offsets=offsets, pooling_mode=int(m.pooling_mode), indice_weights=per_sample_weights,
        output_dtype=m.output_dtype, row_alignment=m.row_alignment, max_float8_D=m.max_float8_D,
        fp8_exponent_bits=m.fp8_exponent_bits, fp8_exponent_bias=m.fp8_exponent_bias,
    )  # fmt: skip
    assert set(values) <= set(names)
    return lookup_reference(values, dtype=torch.float64)


def tables_for(pooling_mode):
    """Every row type; one dim for PoolingMode.NONE."""
    return SAME_DIM if pooling_mode == PoolingMode.NONE else MIXED


def feature_batch(tables, feature_table_map, B, gen, **kwargs):
    return random_batch([tables[t] for t in feature_table_map], B, gen, **kwargs)


# --------------------------------------------------------------------------- float64 reference
def test_assigned_rows_are_stored_in_fbgemm_layout():
    """Each table's rows sit at weights_offsets in FBGEMM's byte layout: decoding them with the
    test's own decoder gives the assigned values, and the padding stays zero."""
    gen = torch.Generator().manual_seed(0)
    module, values = filled_module(MIXED, gen, row_alignment=16)
    for t, (rows, dim, ty) in enumerate(MIXED):
        stride, begin = row_bytes(dim, ty, 16), module.weights_physical_offsets[t]
        assert begin % 128 == 0
        table = module.weights_host[begin : begin + rows * stride].view(rows, stride)
        torch.testing.assert_close(decode_rows(table, ty, dim, FP8_FORMAT), values[t])
        used = dim * ty.bit_rate() // 8 + (0 if ty.is_float() else 4)
        assert not table[:, used:].any()


@pytest.mark.parametrize("pooling_mode", POOLINGS)
@pytest.mark.parametrize("output_dtype", list(OUTPUTS))
@pytest.mark.parametrize("weighted", [False, True])
def test_matches_dequantized_reference(pooling_mode, output_dtype, weighted):
    """Every row type in one module, shared tables, empty bags and pruned (-1) indices."""
    gen = torch.Generator().manual_seed(1)
    tables = tables_for(pooling_mode)
    module, _ = filled_module(
        tables,
        gen,
        feature_table_map=SHARED_MAP,
        pooling_mode=pooling_mode,
        output_dtype=output_dtype,
        row_alignment=8,
    )
    indices, offsets = feature_batch(tables, SHARED_MAP, 5, gen)
    weights = torch.rand(indices.numel(), generator=gen) if weighted else None
    expected = reference(module, indices, offsets, weights)
    out = module(indices, offsets, weights)
    assert out.dtype == OUTPUTS[output_dtype] and out.shape == expected.shape
    if pooling_mode != PoolingMode.NONE:
        assert out.shape == (5, sum(tables[t][1] for t in SHARED_MAP))
    assert_close(out, expected)


def test_empty_batch_and_empty_bags():
    gen = torch.Generator().manual_seed(2)
    module, _ = filled_module(MIXED, gen, output_dtype=SparseType.FP32)
    out = module(torch.empty(0, dtype=torch.int32), torch.zeros(1, dtype=torch.int32))
    assert out.shape == (0, module.total_D)
    out = module(
        torch.empty(0, dtype=torch.int64), torch.zeros(len(MIXED) * 4 + 1, dtype=torch.int64)
    )
    assert out.shape == (4, module.total_D) and not out.any()


def test_index_remapping_array_and_hash():
    """Pruning: original row r of a remapped table reads row mapping[r] (-1: nothing), through
    the array and through the hash table alike; a table without mapping is read as is."""
    tables = [(4, 8, INT8), (3, 4, FP16)]
    mapping = torch.tensor([2, -1, 0, -1, 3, 1, -1, -1])  # 8 original rows onto 4
    outputs = []
    for use_array in (True, False):
        module, values = filled_module(
            tables,
            torch.Generator().manual_seed(3),  # the same rows both times
            index_remapping=[mapping, None],
            use_array_for_index_remapping=use_array,
            output_dtype=SparseType.FP32,
        )
        assert module.original_rows_per_table.tolist() == [8, 3]
        indices = torch.tensor([0, 1, 2, 7, 4, 5, 2, 0], dtype=torch.int32)
        offsets = torch.tensor([0, 3, 6, 7, 8], dtype=torch.int32)  # 2 features x 2 bags
        out = module(indices, offsets)
        kept = [values[0][mapping[r]] if mapping[r] >= 0 else 0.0 for r in range(8)]
        expected = torch.stack(
            [
                torch.cat([kept[0] + kept[1] + kept[2], values[1][2]]),
                torch.cat([kept[7] + kept[4] + kept[5], values[1][0]]),
            ]
        )
        assert_close(out, expected)
        outputs.append(out)
    torch.testing.assert_close(outputs[0], outputs[1], rtol=0, atol=0)


def test_bounds_check_warning_repairs_and_fatal_raises():
    gen = torch.Generator().manual_seed(4)
    module, values = filled_module([(5, 4, FP32)], gen, output_dtype=SparseType.FP32)
    out = module(torch.tensor([1, 9]), torch.tensor([0, 2]))
    assert module.bounds_check_warning.item() == 1
    assert_close(out, (values[0][1] + values[0][0])[None])  # 9 is repaired to row 0
    fatal, _ = filled_module([(5, 4, FP32)], gen, bounds_check_mode=BoundsCheckMode.FATAL)
    with pytest.raises((IndexError, ValueError, RuntimeError), match="indices|offsets"):
        fatal(torch.tensor([1, 9]), torch.tensor([0, 2]))


def test_split_and_assign_round_trip():
    gen = torch.Generator().manual_seed(5)
    source, _ = filled_module(MIXED, gen, row_alignment=16)
    target = Module(specs_of(MIXED), row_alignment=16)
    target.initialize_weights()
    target.assign_embedding_weights(source.split_embedding_weights())
    assert torch.equal(target.weights_host, source.weights_host)
    for (values, scale_bias), (rows, dim, ty) in zip(
        target.split_embedding_weights(), MIXED, strict=True
    ):
        assert values.shape == (rows, dim * ty.bit_rate() // 8)
        assert (scale_bias is None) == ty.is_float()
        assert scale_bias is None or scale_bias.shape == (rows, 4)
    whole = target.split_embedding_weights(split_scale_shifts=False)
    assert [w.shape for w, s in whole] == [(r, row_bytes(d, ty, 16)) for r, d, ty in MIXED]
    assert all(s is None for _, s in whole)
    for (values, scale, bias), (pair_values, scale_bias) in zip(
        target.split_embedding_weights_with_scale_bias(2),
        target.split_embedding_weights(),
        strict=True,
    ):
        assert torch.equal(values, pair_values)
        if scale_bias is not None:
            assert torch.equal(torch.cat([scale, bias], 1).view(torch.uint8), scale_bias)
    # weight_lists in the constructor is assign_embedding_weights.
    built = Module(specs_of(MIXED), row_alignment=16, weight_lists=source.split_embedding_weights())
    assert torch.equal(built.weights_host, source.weights_host)


# --------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "specs, kwargs, error, message",
    [
        ([], {}, ValueError, "embedding_specs"),
        ([("t", 4, 8, SparseType.BF16, HOST)], {}, NotImplementedError, "weights type"),
        ([("t", 4, 8, FP32, EmbeddingLocation.DEVICE)], {}, NotImplementedError, "location"),
        ([("t", 4, 5, INT4, HOST)], {}, ValueError, "multiple of 2"),
        ([("t", 4, 6, INT2, HOST)], {}, ValueError, "multiple of 4"),
        ([("t", -1, 8, FP32, HOST)], {}, ValueError, "rows >= 0"),
        ([("t", 4, 0, FP32, HOST)], {}, ValueError, "dim >= 1"),
        ([("t", 4, 8, FP32)], {}, ValueError, "embedding_specs"),
        (specs_of(MIXED), dict(pooling_mode=PoolingMode.NONE), ValueError, "one embedding dim"),
        (specs_of(MIXED), dict(feature_table_map=[0, 1]), ValueError, "feature_table_map"),
        (specs_of(MIXED), dict(output_dtype=SparseType.INT8), NotImplementedError, "output_dtype"),
        (specs_of(MIXED), dict(pooling_mode=7), NotImplementedError, "pooling_mode"),
        (specs_of(MIXED), dict(bounds_check_mode=9), NotImplementedError, "bounds_check_mode"),
        (specs_of(MIXED), dict(row_alignment=0), ValueError, "row_alignment"),
        (specs_of(MIXED), dict(device="cuda"), NotImplementedError, "device"),
        (specs_of(MIXED), dict(reverse_qparam=True), NotImplementedError, "reverse_qparam"),
        (specs_of(MIXED), dict(scale_bias_size_in_bytes=8), NotImplementedError, "scale_bias"),
        (specs_of(MIXED), dict(indices_dtype=torch.float32), ValueError, "indices_dtype"),
        (specs_of(MIXED), dict(cache_tiers=2), TypeError, "cache_tiers"),
        (specs_of(MIXED), dict(index_remapping=[torch.arange(3)]), ValueError, "index_remapping"),
        (
            specs_of(MIXED[:1]),
            dict(index_remapping=[torch.ones(3)]),
            ValueError,
            r"index_remapping\[0\]",
        ),
        (
            specs_of(MIXED[:1]),
            dict(
                index_remapping=[torch.arange(3)],
                use_array_for_index_remapping=False,
                pruning_hash_load_factor=0.0,
            ),
            ValueError,
            "pruning_hash_load_factor",
        ),  # fmt: skip
    ],
)
def test_bad_constructor_arguments(specs, kwargs, error, message):
    with pytest.raises(error, match=message):
        Module(specs, **kwargs)


def test_fbgemm_cache_arguments_are_accepted_and_ignored():
    module = Module(specs_of(MIXED), cache_load_factor=0.5, cache_assoc=64, uvm_host_mapped=True)
    plain = Module(specs_of(MIXED))
    assert module.host_size == plain.host_size
    assert torch.equal(module.weights_offsets, plain.weights_offsets)


def test_uninitialized_weights_raise():
    module = Module(specs_of(MIXED))
    with pytest.raises(RuntimeError, match="initialize_weights"):
        module(torch.tensor([0]), torch.tensor([0, 1]))
    with pytest.raises(RuntimeError, match="not initialized"):
        module.split_embedding_weights()


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda w: w[:-1], "one .* pair per table"),
        (lambda w: [(w[0][0], None), *w[1:]], r"q_weight_list\[0\] scale_bias must be a tensor"),
        (lambda w: [w[0], (w[1][0], w[0][1]), *w[2:]], r"q_weight_list\[1\] .*does not fit"),
        (lambda w: [*w[:2], (w[2][0], torch.zeros(5, 4)), *w[3:]],
         r"q_weight_list\[2\] scale_bias must be None"),
        (lambda w: [*w[:-1], (w[-1][0][:, :3],)], r"q_weight_list\[5\] must be a"),
    ],
)  # fmt: skip
def test_bad_assign_names_the_table_and_writes_nothing(change, message):
    gen = torch.Generator().manual_seed(6)
    module, _ = filled_module(MIXED, gen)
    other, _ = filled_module(MIXED, gen)
    before = module.weights_host.clone()
    with pytest.raises(ValueError, match=message):
        module.assign_embedding_weights(change(other.split_embedding_weights()))
    assert torch.equal(module.weights_host, before)


def test_bad_forward_input_names_the_argument():
    gen = torch.Generator().manual_seed(7)
    module, _ = filled_module(MIXED, gen, bounds_check_mode=BoundsCheckMode.NONE)
    indices, offsets = random_batch(MIXED, 2, gen, pruned=0.0)
    with pytest.raises(RuntimeError, match="indice_weights"):
        module(indices, offsets, torch.ones(indices.numel() + 1))
    with pytest.raises(RuntimeError, match="indices"):
        module(indices.float(), offsets)
    with pytest.raises(IndexError, match="indices"):
        module(indices + 100, offsets)


# --------------------------------------------------------------------------- against FBGEMM
def fbgemm_pair(tables, gen, **kwargs):
    """FBGEMM's module and recops' built from the same specs (FBGEMM's enums, which recops
    accepts); FBGEMM's filled with random finite rows and its bytes copied into recops' module.
    Asserts the layouts are the same."""
    from fbgemm_gpu.split_embedding_configs import SparseType as FbgemmSparseType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import (
        BoundsCheckMode as FbgemmBoundsCheckMode,
    )
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import (
        EmbeddingLocation as FbgemmLocation,
    )
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import (
        PoolingMode as FbgemmPoolingMode,
    )
    from fbgemm_gpu.split_table_batched_embeddings_ops_inference import (
        IntNBitTableBatchedEmbeddingBagsCodegen,
    )

    fbgemm_enums = {
        "output_dtype": FbgemmSparseType,
        "pooling_mode": FbgemmPoolingMode,
        "bounds_check_mode": FbgemmBoundsCheckMode,
    }
    kwargs = {k: fbgemm_enums[k][v.name] if k in fbgemm_enums else v for k, v in kwargs.items()}
    specs = [
        (f"t{i}", rows, dim, FbgemmSparseType[ty.name], FbgemmLocation.HOST)
        for i, (rows, dim, ty) in enumerate(tables)
    ]
    fbgemm = IntNBitTableBatchedEmbeddingBagsCodegen(specs, device="cpu", **kwargs)
    fbgemm.initialize_weights()
    fbgemm.assign_embedding_weights([random_rows(r, d, ty, gen)[0] for r, d, ty in tables])
    ours = Module(specs, device="cpu", **kwargs)
    ours.initialize_weights()
    ours.weights_host.copy_(fbgemm.weights_host)
    for name in (
        "weights_offsets",
        "weights_placements",
        "weights_tys",
        "D_offsets",
        "rows_per_table",
    ):
        assert torch.equal(getattr(ours, name), getattr(fbgemm, name)), name
    for name in ("total_D", "host_size", "row_alignment", "output_dtype", "fp8_exponent_bits",
                 "fp8_exponent_bias", "max_int2_D", "max_int4_D", "max_int8_D", "max_float8_D",
                 "max_float16_D", "max_float32_D", "weights_physical_offsets"):  # fmt: skip
        assert getattr(ours, name) == getattr(fbgemm, name), name
    return fbgemm, ours


def assert_same_output(fbgemm, ours, indices, offsets, weights=None):
    expected = fbgemm(indices.clone(), offsets.clone(), weights)
    out = ours(indices.clone(), offsets.clone(), weights)
    assert out.dtype == expected.dtype and out.shape == expected.shape
    assert_close(out, expected)


@pytest.mark.parametrize("pooling_mode", POOLINGS)
@pytest.mark.parametrize("output_dtype", list(OUTPUTS))
@pytest.mark.parametrize("row_alignment", [None, 16])
def test_matches_fbgemm(fbgemm_ops, pooling_mode, output_dtype, row_alignment):
    """Every row type, shared tables, weighted and unweighted, empty bags, int32 and int64."""
    gen = torch.Generator().manual_seed(8)
    tables = tables_for(pooling_mode)
    fbgemm, ours = fbgemm_pair(
        tables,
        gen,
        feature_table_map=SHARED_MAP,
        pooling_mode=pooling_mode,
        output_dtype=output_dtype,
        row_alignment=row_alignment,
    )
    for index_dtype in (torch.int32, torch.int64):
        # FBGEMM's FP8 kernel reads row -1 of a pruned index (tests/test_int_nbit_lookup.py).
        indices, offsets = feature_batch(
            tables, SHARED_MAP, 4, gen, index_dtype=index_dtype, pruned=0.0
        )
        for weights in (None, torch.rand(indices.numel(), generator=gen)):
            assert_same_output(fbgemm, ours, indices, offsets, weights)


@pytest.mark.parametrize("ty", TYPES)
def test_each_type_matches_fbgemm(fbgemm_ops, ty):
    gen = torch.Generator().manual_seed(9)
    tables = [(20, 64, ty), (3, 200, ty)]
    fbgemm, ours = fbgemm_pair(tables, gen, output_dtype=SparseType.FP32)
    indices, offsets = random_batch(tables, 6, gen, max_len=12, pruned=0.0)
    assert_same_output(fbgemm, ours, indices, offsets, torch.rand(indices.numel(), generator=gen))
    assert_same_output(fbgemm, ours, indices, offsets)


def test_fill_random_weights_draws_fbgemms_bytes(fbgemm_ops):
    gen = torch.Generator().manual_seed(10)
    fbgemm, ours = fbgemm_pair(MIXED, gen, row_alignment=16)
    for module in (fbgemm, ours):
        torch.manual_seed(11)
        module.fill_random_weights()  # only the values: the scale and bias stay
    assert torch.equal(ours.weights_host, fbgemm.weights_host)


def test_split_weights_are_fbgemms(fbgemm_ops):
    gen = torch.Generator().manual_seed(12)
    fbgemm, ours = fbgemm_pair(MIXED, gen, row_alignment=8)
    for mode in (0, 1, 2):
        pairs = zip(
            ours.split_embedding_weights_with_scale_bias(mode),
            fbgemm.split_embedding_weights_with_scale_bias(mode),
            strict=True,
        )
        for a, b in pairs:
            for x, y in zip(a, b, strict=True):
                assert (x is None and y is None) or (x.dtype == y.dtype and torch.equal(x, y))
    # FBGEMM's split weights assigned to a fresh recops module give FBGEMM's bytes.
    fresh = Module(ours.embedding_specs, row_alignment=8)
    fresh.initialize_weights()
    fresh.assign_embedding_weights(fbgemm.split_embedding_weights())
    assert torch.equal(fresh.weights_host, fbgemm.weights_host)


@pytest.mark.parametrize("use_array", [True, False])
def test_index_remapping_matches_fbgemm(fbgemm_ops, use_array):
    gen = torch.Generator().manual_seed(13)
    tables = [(6, 8, INT8), (4, 16, INT4), (5, 4, FP32)]
    mappings = [
        torch.tensor([3, -1, 0, 5, -1, 1, 2, -1, 4, -1]),
        None,
        torch.tensor([4, -1, 0, 1, 2, 3]),
    ]
    fbgemm, ours = fbgemm_pair(
        tables,
        gen,
        index_remapping=mappings,
        use_array_for_index_remapping=use_array,
        output_dtype=SparseType.FP32,
    )
    assert torch.equal(ours.original_rows_per_table, fbgemm.original_rows_per_table)
    original = [(10, 8, INT8), (4, 16, INT4), (6, 4, FP32)]
    indices, offsets = random_batch(original, 5, gen, pruned=0.0)
    for index_dtype in (torch.int32, torch.int64):
        assert_same_output(fbgemm, ours, indices.to(index_dtype), offsets.to(index_dtype))


def test_bounds_check_repairs_as_fbgemm(fbgemm_ops):
    gen = torch.Generator().manual_seed(14)
    tables = [(5, 8, INT8), (3, 4, FP16)]
    fbgemm, ours = fbgemm_pair(
        tables, gen, bounds_check_mode=BoundsCheckMode.IGNORE, output_dtype=SparseType.FP32
    )
    indices = torch.tensor([1, 7, 4, 2, 9, 0], dtype=torch.int32)  # 7, 9 out of range
    offsets = torch.tensor([0, 2, 3, 5, 6], dtype=torch.int32)
    assert_same_output(fbgemm, ours, indices, offsets)
    bad_offsets = torch.tensor([0, 2, 9, 5, 6], dtype=torch.int32)  # repaired into range
    assert_same_output(fbgemm, ours, indices, bad_offsets)


def test_non_contiguous_inputs():
    gen = torch.Generator().manual_seed(15)
    module, _ = filled_module(MIXED, gen, output_dtype=SparseType.FP32)
    indices, offsets = random_batch(MIXED, 3, gen)
    weights = torch.rand(indices.numel(), generator=gen)
    expected = reference(module, indices, offsets, weights)
    spread = torch.stack([indices, torch.zeros_like(indices)], 1)[:, 0]  # stride 2
    spread_weights = torch.stack([weights, weights], 1)[:, 1]
    assert not spread.is_contiguous() and not spread_weights.is_contiguous()
    assert_close(module(spread, offsets, spread_weights), expected)


def test_torch_export():
    """torch.export traces the module (its ops have fake kernels): the exported program's graph
    calls recops' bounds check and lookup and gives the module's output."""
    gen = torch.Generator().manual_seed(16)
    module, _ = filled_module(MIXED[:3], gen, output_dtype=SparseType.FP32)
    indices, offsets = random_batch(MIXED[:3], 2, gen, pruned=0.0)
    program = torch.export.export(module, (indices, offsets))
    code = program.graph_module.code
    assert "recops.int_nbit_split_embedding_codegen_lookup_function" in code
    assert "recops.bounds_check_indices" in code
    torch.testing.assert_close(program.module()(indices, offsets), module(indices, offsets))


def inplace_update(tables, gen):
    """Updates of rows of tables 2 and 0 (whole stored rows, random bytes)."""
    updates = ([], [], [])
    for t, rows in ((2, [4, 0]), (0, [7])):
        _, dim, ty = tables[t]
        updates[0].append(t)
        updates[1].append(rows)
        updates[2].append(
            torch.randint(
                0, 256, (len(rows), row_bytes(dim, ty, 1)), generator=gen, dtype=torch.uint8
            )
        )
    return updates


def test_embedding_inplace_update_writes_whole_rows():
    gen = torch.Generator().manual_seed(17)
    module, _ = filled_module(MIXED, gen)
    before = [w.clone() for w, _ in module.split_embedding_weights(split_scale_shifts=False)]
    tables, rows, weights = inplace_update(MIXED, gen)
    module.embedding_inplace_update(tables, rows, weights)
    after = [w for w, _ in module.split_embedding_weights(split_scale_shifts=False)]
    for t, (old, new) in enumerate(zip(before, after, strict=True)):
        for i, (table, table_rows) in enumerate(zip(tables, rows, strict=True)):
            if table == t:
                assert torch.equal(new[table_rows], weights[i])
                old[table_rows] = weights[i]
        assert torch.equal(new, old)


@pytest.mark.parametrize(
    "change, error, message",
    [
        (lambda u: (u[0][:1], u[1], u[2]), ValueError, "one entry per update"),
        (lambda u: ([6, 0], u[1], u[2]), ValueError, r"update_table_indices\[0\]"),
        (lambda u: (u[0], [[4, 5], [7]], u[2]), IndexError, r"update_row_indices\[0\]"),
        (lambda u: (u[0], [[4, 0], [-1]], u[2]), IndexError, r"update_row_indices\[1\]"),
        (lambda u: (u[0], u[1], [u[2][0], u[2][1].int()]), ValueError, r"update_weights\[1\]"),
        (lambda u: (u[0], u[1], [u[2][0][:, 1:], u[2][1]]), ValueError, r"update_weights\[0\]"),
    ],
)
def test_bad_inplace_update_names_the_argument_and_writes_nothing(change, error, message):
    gen = torch.Generator().manual_seed(18)
    module, _ = filled_module(MIXED, gen)
    before = module.weights_host.clone()
    with pytest.raises(error, match=message):
        module.embedding_inplace_update(*change(inplace_update(MIXED, gen)))
    assert torch.equal(module.weights_host, before)


def test_embedding_inplace_update_matches_fbgemm(fbgemm_ops):
    gen = torch.Generator().manual_seed(19)
    fbgemm, ours = fbgemm_pair(MIXED, gen)
    updates = inplace_update(MIXED, gen)
    fbgemm.embedding_inplace_update(*updates)
    ours.embedding_inplace_update(*updates)
    assert torch.equal(ours.weights_host, fbgemm.weights_host)


@pytest.mark.parametrize("cacheline_alignment", [True, False])
def test_empty_table_and_unaligned_tables_match_fbgemm(fbgemm_ops, cacheline_alignment):
    gen = torch.Generator().manual_seed(20)
    tables = [(3, 8, INT8), (0, 8, INT4), (5, 4, FP16)]
    fbgemm, ours = fbgemm_pair(
        tables, gen, cacheline_alignment=cacheline_alignment, output_dtype=SparseType.FP32
    )
    indices = torch.tensor([2, 0, 1, 4, 4], dtype=torch.int32)
    offsets = torch.tensor([0, 2, 3, 3, 3, 4, 5], dtype=torch.int32)  # table 1's bags are empty
    assert_same_output(fbgemm, ours, indices, offsets)


@pytest.mark.parametrize("use_array", [True, False])
def test_remapping_int32_cannot_hold_raises_and_changes_nothing(use_array):
    module = Module(specs_of(MIXED[:1]))
    with pytest.raises(IndexError, match="index_remapping"):
        module.set_index_remappings(
            [torch.tensor([0, 2**40, -1])], use_array_for_index_remapping=use_array
        )
    for name in ("index_remappings_array", "index_remapping_hash_table", "original_rows_per_table"):
        assert getattr(module, name).numel() == 0
