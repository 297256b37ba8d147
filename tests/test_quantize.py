"""The quantize family: FBGEMM's fused 8-bit and N-bit row-wise (de)quantization and the
pruned-index remaps of quantized inference, bit for bit against FBGEMM's CPU kernels and against
the plain-PyTorch references of quantize_reference.py."""

import math

import pytest
import torch
from quantize_reference import (
    array_lookup,
    dequantize_8bit,
    dequantize_nbit,
    hashmap_insert,
    hashmap_lookup,
    quantize_8bit,
    quantize_nbit,
)

import recops  # noqa: F401

ops = torch.ops.recops
F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
I32, I64 = torch.int32, torch.int64

QUANTIZE_8BIT = {
    F32: ("FloatToFused8BitRowwiseQuantized", "FloatOrHalfToFused8BitRowwiseQuantized"),
    F16: ("HalfToFused8BitRowwiseQuantized", "FloatOrHalfToFused8BitRowwiseQuantized"),
}
QUANTIZE_NBIT = {
    F32: ("FloatToFusedNBitRowwiseQuantizedSBHalf", "FloatOrHalfToFusedNBitRowwiseQuantizedSBHalf"),
    F16: ("HalfToFusedNBitRowwiseQuantizedSBHalf", "FloatOrHalfToFusedNBitRowwiseQuantizedSBHalf"),
}
SPARSE_TYPE = {F32: 0, F16: 1, BF16: 5}


@pytest.fixture
def fbgemm_or_none():
    """FBGEMM's CPU ops to compare with, or None where FBGEMM is absent (the references still
    run)."""
    return torch.ops.fbgemm if recops.fbgemm_loaded else None


def _rows(shape, dtype, kind="randn"):
    """Rows to quantize: random normal values with some of the hard rows FBGEMM meets."""
    x = torch.randn(shape) * 3 + 1
    rows = x.reshape(math.prod(shape[:-1]), shape[-1])
    if kind == "special" and rows.shape[0] >= 6 and rows.shape[1] >= 2:
        rows[0] = 2.5  # constant row
        rows[1, 0] = float("inf")
        rows[2, -1] = float("-inf")
        rows[3] *= 1e30  # a range beyond fp16
        rows[4] *= 1e-30  # a range below fp16's smallest step
        rows[5] += 6e4  # a minimum that rounds up in fp16
    return x.to(dtype)


def _shapes():
    return [(0, 4), (1, 1), (3, 5), (6, 32), (9, 33), (7, 72), (2, 3, 17), (4, 0)]


@pytest.mark.parametrize("dtype", [F32, F16])
@pytest.mark.parametrize("shape", _shapes())
@pytest.mark.parametrize("kind", ["randn", "special"])
def test_8bit_quantize_matches_fbgemm_and_reference(dtype, shape, kind, fbgemm_or_none):
    x = _rows(shape, dtype, kind)
    expected = quantize_8bit(x)
    for name in QUANTIZE_8BIT[dtype]:
        q = getattr(ops, name)(x)
        assert torch.equal(q, expected), name
        # FBGEMM leaves the scale and bias of rows without columns unwritten.
        if fbgemm_or_none is not None and shape[-1] > 0:
            assert torch.equal(q, getattr(fbgemm_or_none, name)(x)), name


@pytest.mark.parametrize("cols", [1, 7, 8, 31, 40])
def test_nan_rows_match_fbgemm(cols, fbgemm_ops):
    x = torch.randn(16, cols)
    x[torch.rand(16, cols) < 0.2] = float("nan")
    x[3] = float("nan")
    for name in ("FloatToFused8BitRowwiseQuantized",):
        assert torch.equal(getattr(ops, name)(x), getattr(fbgemm_ops, name)(x))
    x = torch.randn(16, 8 * cols)
    x[torch.rand(16, 8 * cols) < 0.2] = float("nan")
    for bit_rate in (2, 4, 8):
        got = ops.FloatToFusedNBitRowwiseQuantizedSBHalf(x, bit_rate)
        want = fbgemm_ops.FloatToFusedNBitRowwiseQuantizedSBHalf(x, bit_rate)
        assert torch.equal(got, want), bit_rate


def _quantized_8bit(shape, float_scale_bias=True):
    """Random fused 8-bit rows: any codes, a random scale and bias."""
    *lead, cols = shape
    padding = 4 if float_scale_bias else 2
    codes = torch.randint(0, 256, (*lead, cols), dtype=torch.uint8)
    sb_dtype = F32 if float_scale_bias else F16
    scale_bias = (torch.randn((*lead, 2)) * torch.tensor([0.1, 3.0])).to(sb_dtype)
    return codes, scale_bias.view(torch.uint8).reshape(*lead, 2 * padding)


@pytest.mark.parametrize("dtype", [F32, F16, BF16])
@pytest.mark.parametrize("shape", [(0, 3), (1, 1), (3, 5), (5, 8), (9, 37), (2, 3, 17), (4, 0)])
@pytest.mark.parametrize("layout", [(True, True), (False, True), (False, False)])
def test_8bit_dequantize_matches_fbgemm_and_reference(dtype, shape, layout, fbgemm_or_none):
    scale_bias_last, float_scale_bias = layout
    codes, scale_bias = _quantized_8bit(shape, float_scale_bias)
    parts = [codes, scale_bias] if scale_bias_last else [scale_bias, codes]
    q = torch.cat(parts, -1)
    out = ops.Fused8BitRowwiseQuantizedToFloatOrHalf(
        q, SPARSE_TYPE[dtype], scale_bias_last, float_scale_bias
    )
    assert out.dtype == dtype
    expected = dequantize_8bit(q, dtype, scale_bias_last, float_scale_bias)
    assert torch.equal(out, expected)
    if fbgemm_or_none is not None:
        fbgemm = fbgemm_or_none.Fused8BitRowwiseQuantizedToFloatOrHalf(
            q, SPARSE_TYPE[dtype], scale_bias_last, float_scale_bias
        )
        assert torch.equal(out, fbgemm)
    if layout == (True, True) and dtype != BF16:
        name = {F32: "Fused8BitRowwiseQuantizedToFloat", F16: "Fused8BitRowwiseQuantizedToHalf"}
        assert torch.equal(getattr(ops, name[dtype])(q), out)


def test_8bit_round_trip_is_within_half_a_step():
    x = torch.randn(50, 37)
    q = ops.FloatToFused8BitRowwiseQuantized(x)
    back = ops.Fused8BitRowwiseQuantizedToFloat(q)
    step = (x.amax(1) - x.amin(1)) / 255
    assert ((back - x).abs() <= step[:, None] * 0.5001 + 1e-6).all()


def _nbit_shapes(bit_rate):
    step = 2 * (8 // bit_rate)
    return [(0, step), (1, step), (3, 2 * step), (7, 64), (5, 96 + step), (4, 0)]


@pytest.mark.parametrize("bit_rate", range(1, 9))
@pytest.mark.parametrize("dtype", [F32, F16])
@pytest.mark.parametrize("kind", ["randn", "special"])
def test_nbit_quantize_matches_fbgemm_and_reference(bit_rate, dtype, kind, fbgemm_or_none):
    for shape in _nbit_shapes(bit_rate):
        x = _rows(shape, dtype, kind)
        expected = quantize_nbit(x, bit_rate)
        for name in QUANTIZE_NBIT[dtype]:
            q = getattr(ops, name)(x, bit_rate)
            assert torch.equal(q, expected), (name, shape)
            if fbgemm_or_none is not None and shape[1] > 0:
                assert torch.equal(q, getattr(fbgemm_or_none, name)(x, bit_rate)), (name, shape)


@pytest.mark.parametrize("bit_rate", range(1, 9))
@pytest.mark.parametrize("dtype", [F32, F16])
def test_nbit_dequantize_matches_fbgemm_and_reference(bit_rate, dtype, fbgemm_or_none):
    for rows, data_bytes in [(0, 2), (1, 1), (3, 4), (6, 33), (5, 0)]:
        codes = torch.randint(0, 256, (rows, data_bytes), dtype=torch.uint8)
        scale_bias = (torch.randn(rows, 2) * torch.tensor([0.1, 3.0])).half().view(torch.uint8)
        q = torch.cat([codes, scale_bias], 1)
        out = ops.FusedNBitRowwiseQuantizedSBHalfToFloatOrHalf(q, bit_rate, SPARSE_TYPE[dtype])
        assert torch.equal(out, dequantize_nbit(q, bit_rate, dtype))
        if fbgemm_or_none is not None:
            fbgemm = fbgemm_or_none.FusedNBitRowwiseQuantizedSBHalfToFloatOrHalf(
                q, bit_rate, SPARSE_TYPE[dtype]
            )
            assert torch.equal(out, fbgemm)
        name = {
            F32: "FusedNBitRowwiseQuantizedSBHalfToFloat",
            F16: "FusedNBitRowwiseQuantizedSBHalfToHalf",
        }
        assert torch.equal(getattr(ops, name[dtype])(q, bit_rate), out)
        # FBGEMM's CPU kernel reads the scale and bias behind the codes whatever the flag says.
        flag_ignored = ops.FusedNBitRowwiseQuantizedSBHalfToFloatOrHalf(
            q, bit_rate, SPARSE_TYPE[dtype], False
        )
        assert torch.equal(flag_ignored, out)


def test_nbit_round_trip_is_within_half_a_step():
    x = torch.randn(20, 64)
    for bit_rate in (2, 4, 8):
        back = ops.FusedNBitRowwiseQuantizedSBHalfToFloat(
            ops.FloatToFusedNBitRowwiseQuantizedSBHalf(x, bit_rate), bit_rate
        )
        step = (x.amax(1) - x.amin(1)) / ((1 << bit_rate) - 1)
        assert ((back - x).abs() <= step[:, None] * 0.51 + 2e-3).all()


def test_non_contiguous_inputs_read_their_values():
    x = torch.randn(16, 40).t()
    assert torch.equal(ops.FloatToFused8BitRowwiseQuantized(x), quantize_8bit(x.contiguous()))
    assert torch.equal(
        ops.FloatToFusedNBitRowwiseQuantizedSBHalf(x, 4), quantize_nbit(x.contiguous(), 4)
    )
    q = ops.FloatToFused8BitRowwiseQuantized(torch.randn(5, 12))
    wide = torch.cat([q, q], 1)[:, ::2]
    assert torch.equal(
        ops.Fused8BitRowwiseQuantizedToFloat(wide), dequantize_8bit(wide.contiguous())
    )
    qn = ops.FloatToFusedNBitRowwiseQuantizedSBHalf(torch.randn(5, 16), 4)
    wide = torch.cat([qn, qn], 1)[:, ::2]
    assert torch.equal(
        ops.FusedNBitRowwiseQuantizedSBHalfToFloat(wide, 4), dequantize_nbit(wide.contiguous(), 4)
    )


def test_every_isa_variant_gives_the_same_bits(monkeypatch):
    x = torch.randn(33, 72)
    x[::5, ::3] = float("nan")
    results = []
    for isa in ("baseline", "avx2"):
        monkeypatch.setenv("RECOPS_CPU_ISA", isa)
        q8 = ops.FloatOrHalfToFused8BitRowwiseQuantized(x)
        q4 = ops.FloatToFusedNBitRowwiseQuantizedSBHalf(x, 4)
        results.append(
            [q8, q4]
            + [ops.Fused8BitRowwiseQuantizedToFloatOrHalf(q8, d) for d in (0, 1, 5)]
            + [ops.FusedNBitRowwiseQuantizedSBHalfToFloatOrHalf(q4, 4, d) for d in (0, 1)]
        )
    for a, b in zip(*results, strict=True):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))


BAD_INPUTS = [
    (lambda: ops.FloatToFused8BitRowwiseQuantized(torch.randn(5)), "at least 2 dimensions"),
    (lambda: ops.FloatToFused8BitRowwiseQuantized(torch.randn(2, 5).half()), "t must be float32"),
    (lambda: ops.HalfToFused8BitRowwiseQuantized(torch.randn(2, 5)), "t must be float16"),
    (
        lambda: ops.FloatOrHalfToFused8BitRowwiseQuantized(torch.randn(2, 5).bfloat16()),
        "float32 or float16",
    ),
    (
        lambda: ops.Fused8BitRowwiseQuantizedToFloat(torch.zeros(2, 7, dtype=torch.uint8)),
        "at least 8 bytes",
    ),
    (lambda: ops.Fused8BitRowwiseQuantizedToFloat(torch.zeros(2, 9)), "input must be uint8"),
    (
        lambda: ops.Fused8BitRowwiseQuantizedToFloatOrHalf(torch.zeros(2, 9, dtype=torch.uint8), 3),
        "output_dtype must be 0 (FP32), 1 (FP16) or 5 (BF16)",
    ),
    (
        lambda: ops.Fused8BitRowwiseQuantizedToFloatOrHalf(
            torch.zeros(2, 9, dtype=torch.uint8), 0, True, False
        ),
        "needs scale_bias_last=False",
    ),
    (
        lambda: ops.FloatToFusedNBitRowwiseQuantizedSBHalf(torch.randn(2, 8), 0),
        "bit_rate must be between 1 and 8",
    ),
    (
        lambda: ops.FloatToFusedNBitRowwiseQuantizedSBHalf(torch.randn(2, 8), 16),
        "bit_rate must be between 1 and 8",
    ),
    (
        lambda: ops.FloatToFusedNBitRowwiseQuantizedSBHalf(torch.randn(2, 6), 4),
        "multiple of 2 * (8 / bit_rate) = 4",
    ),
    (
        lambda: ops.FloatToFusedNBitRowwiseQuantizedSBHalf(torch.randn(2, 2, 8), 4),
        "input must be 2-D",
    ),
    (
        lambda: ops.FusedNBitRowwiseQuantizedSBHalfToFloat(torch.zeros(2, 3, dtype=torch.uint8), 4),
        "at least 4 bytes",
    ),
    (
        lambda: ops.FusedNBitRowwiseQuantizedSBHalfToFloatOrHalf(
            torch.zeros(2, 6, dtype=torch.uint8), 4, 5
        ),
        "output_dtype must be 0 (FP32), 1 (FP16), got 5",
    ),
]


@pytest.mark.parametrize("call, message", BAD_INPUTS)
def test_bad_input_names_the_argument_and_rule(call, message):
    with pytest.raises((RuntimeError, ValueError)) as error:
        call()
    assert message in str(error.value)


# --------------------------------------------------------------------------- pruned tables
def _bags(num_tables, batch, index_dtype, max_index=60, max_length=5):
    lengths = torch.randint(0, max_length + 1, (num_tables * batch,))
    offsets = torch.cat([torch.zeros(1, dtype=I64), lengths.cumsum(0)]).to(index_dtype)
    indices = torch.randint(-3 if index_dtype == I64 else 0, max_index, (int(offsets[-1]),))
    return indices.to(index_dtype), offsets


def _hash_tables(key_offsets, num_tables, batch, hash_dtype):
    """Empty slices: table 0 not pruned (no slice), the others with room to spare for their
    keys (FBGEMM's probe never ends in a full slice)."""
    bounds = key_offsets[::batch].long()
    keys_per_table = bounds[1:] - bounds[:-1]
    sizes = keys_per_table + torch.randint(1, 20, (num_tables,))
    sizes[0] = 0
    offsets = torch.cat([torch.zeros(1, dtype=I64), sizes.cumsum(0)])
    return torch.full((int(offsets[-1]), 2), -1, dtype=hash_dtype), offsets


@pytest.mark.parametrize("index_dtype", [I32, I64])
@pytest.mark.parametrize("hash_dtype", [I32, I64])
@pytest.mark.parametrize("seed", range(3))
def test_pruned_hashmap_insert_and_lookup(index_dtype, hash_dtype, seed, fbgemm_or_none):
    torch.manual_seed(seed)
    num_tables, batch = 4, 3
    keys, key_offsets = _bags(num_tables, batch, index_dtype, max_length=6)
    dense = torch.randint(-1, 1000, keys.shape, dtype=index_dtype)
    table, table_offsets = _hash_tables(key_offsets, num_tables, batch, hash_dtype)
    expected = table.clone()
    hashmap_insert(keys, dense, key_offsets, expected, table_offsets)
    ops.pruned_hashmap_insert(keys, dense, key_offsets, table, table_offsets)
    assert torch.equal(table, expected)
    indices, offsets = _bags(num_tables, batch, index_dtype)
    got = ops.pruned_hashmap_lookup(indices, offsets, table, table_offsets)
    assert torch.equal(got, hashmap_lookup(indices, offsets, table, table_offsets).to(got.dtype))
    if fbgemm_or_none is not None:
        fbgemm_table = torch.full_like(table, -1)
        fbgemm_or_none.pruned_hashmap_insert(keys, dense, key_offsets, fbgemm_table, table_offsets)
        assert torch.equal(table, fbgemm_table)
        fbgemm = fbgemm_or_none.pruned_hashmap_lookup(indices, offsets, table, table_offsets)
        assert torch.equal(got, fbgemm)


def test_pruned_hashmap_full_table_raises_and_changes_nothing():
    keys = torch.tensor([1, 2, 3], dtype=I64)
    table = torch.full((2, 2), -1, dtype=I64)
    offsets = torch.tensor([0, 3], dtype=I64)
    with pytest.raises(ValueError, match="slice is full"):
        ops.pruned_hashmap_insert(keys, keys, offsets, table, torch.tensor([0, 2]))
    assert (table == -1).all()
    # Keys already in a full table update their dense index.
    ops.pruned_hashmap_insert(keys[:2], keys[:2], torch.tensor([0, 2]), table, torch.tensor([0, 2]))
    ops.pruned_hashmap_insert(
        keys[:2], keys[:2] + 10, torch.tensor([0, 2]), table, torch.tensor([0, 2])
    )
    assert sorted(table[:, 1].tolist()) == [11, 12]
    # A lookup in a full table without the key ends (FBGEMM's probe would not).
    lookup = ops.pruned_hashmap_lookup(
        torch.tensor([7]), torch.tensor([0, 1]), table, torch.tensor([0, 2])
    )
    assert lookup.tolist() == [-1]


def test_pruned_hashmap_insert_rejects_values_beyond_the_table_dtype():
    table = torch.full((4, 2), -1, dtype=I32)
    keys = torch.tensor([5, 2**40], dtype=I64)
    with pytest.raises(ValueError, match="does not fit"):
        ops.pruned_hashmap_insert(keys, keys, torch.tensor([0, 2]), table, torch.tensor([0, 4]))
    assert (table == -1).all()


@pytest.mark.parametrize("index_dtype", [I32, I64])
@pytest.mark.parametrize("remap_dtype", [I32, I64])
def test_pruned_array_lookup(index_dtype, remap_dtype, fbgemm_or_none):
    num_tables, batch = 5, 4
    sizes = torch.randint(1, 50, (num_tables,))
    sizes[2] = 0  # not pruned: indices pass through
    remap_offsets = torch.cat([torch.zeros(1, dtype=I64), sizes.cumsum(0)])
    remappings = torch.randint(-1, 10**6, (int(remap_offsets[-1]),), dtype=remap_dtype)
    lengths = torch.randint(0, 6, (num_tables * batch,))
    offsets = torch.cat([torch.zeros(1, dtype=I64), lengths.cumsum(0)]).to(index_dtype)
    table_of = torch.arange(num_tables).repeat_interleave(batch).repeat_interleave(lengths)
    bound = torch.where(sizes[table_of] > 0, sizes[table_of], 1000)
    indices = (torch.rand(len(table_of)) * bound).long().to(index_dtype)
    got = ops.pruned_array_lookup(indices, offsets, remappings, remap_offsets)
    assert torch.equal(got, array_lookup(indices, offsets, remappings, remap_offsets))
    if fbgemm_or_none is not None:
        fbgemm = fbgemm_or_none.pruned_array_lookup(indices, offsets, remappings, remap_offsets)
        assert torch.equal(got, fbgemm)


def test_pruned_lookups_read_the_first_t_times_b_bags(fbgemm_or_none):
    """FBGEMM takes B = floor(bags / T) and reads the first T * B bags; the indices of the bags past
    them (FBGEMM leaves their outputs unwritten) come out -1."""
    indices = torch.tensor([0, 1, 2, 0, 1], dtype=I32)
    offsets = torch.tensor([0, 2, 3, 5], dtype=I32)  # three bags, two tables: B = 1
    remappings = torch.arange(5, 11, dtype=I32)
    remap_offsets = torch.tensor([0, 3, 6])
    got = ops.pruned_array_lookup(indices, offsets, remappings, remap_offsets)
    assert got.tolist() == [5, 6, 10, -1, -1]
    if fbgemm_or_none is not None:
        fbgemm = fbgemm_or_none.pruned_array_lookup(indices, offsets, remappings, remap_offsets)
        assert torch.equal(got[:3], fbgemm[:3])


PRUNED_BAD_INPUTS = [
    (
        lambda: ops.pruned_array_lookup(
            torch.tensor([3]), torch.tensor([0, 1]), torch.arange(3), torch.tensor([0, 3])
        ),
        "within its table's index_remappings slice",
    ),
    (
        lambda: ops.pruned_array_lookup(
            torch.tensor([0]), torch.tensor([0, 1]), torch.arange(3), torch.tensor([0])
        ),
        "index_remappings_offsets must hold T + 1 >= 2",
    ),
    (
        lambda: ops.pruned_array_lookup(
            torch.tensor([0]), torch.tensor([0, 1, 1]), torch.arange(3), torch.tensor([0, 1, 2, 3])
        ),
        "offsets must hold at least T + 1 = 4 entries",
    ),
    (
        lambda: ops.pruned_array_lookup(
            torch.tensor([0]), torch.tensor([0, 2]), torch.arange(3), torch.tensor([0, 3])
        ),
        "offsets must end within indices",
    ),
    (
        lambda: ops.pruned_array_lookup(
            torch.tensor([0]), torch.tensor([0, 1]), torch.arange(3), torch.tensor([0, 4])
        ),
        "must end within index_remappings",
    ),
    (
        lambda: ops.pruned_hashmap_lookup(
            torch.tensor([0]),
            torch.tensor([0, 1], dtype=I32),
            torch.zeros(2, 2, dtype=I64),
            torch.tensor([0, 2]),
        ),
        "indices and offsets must share one dtype",
    ),
    (
        lambda: ops.pruned_hashmap_lookup(
            torch.tensor([0]),
            torch.tensor([0, 1]),
            torch.zeros(2, 3, dtype=I64),
            torch.tensor([0, 2]),
        ),
        "hash_table must be 2-D with rows of [index, dense index]",
    ),
    (
        lambda: ops.pruned_hashmap_lookup(
            torch.tensor([0]),
            torch.tensor([0, 1]),
            torch.zeros(2, 2, dtype=I64),
            torch.tensor([0, 2], dtype=I32),
        ),
        "hash_table_offsets must be int64",
    ),
]


@pytest.mark.parametrize("call, message", PRUNED_BAD_INPUTS)
def test_pruned_bad_input_names_the_argument_and_rule(call, message):
    with pytest.raises((RuntimeError, ValueError)) as error:
        call()
    assert message in str(error.value)


def test_opcheck():
    x = torch.randn(6, 16)
    q8 = ops.FloatToFused8BitRowwiseQuantized(x)
    q4 = ops.FloatToFusedNBitRowwiseQuantizedSBHalf(x, 4)
    table = torch.full((8, 2), -1, dtype=I64)
    indices, offsets = torch.tensor([1, 5, 9]), torch.tensor([0, 1, 3])
    table_offsets = torch.tensor([0, 8])
    ops.pruned_hashmap_insert(indices, indices * 2, offsets, table, table_offsets)
    calls = [
        ("FloatToFused8BitRowwiseQuantized", (x,)),
        ("HalfToFused8BitRowwiseQuantized", (x.half(),)),
        ("FloatOrHalfToFused8BitRowwiseQuantized", (x,)),
        ("Fused8BitRowwiseQuantizedToFloat", (q8,)),
        ("Fused8BitRowwiseQuantizedToHalf", (q8,)),
        ("Fused8BitRowwiseQuantizedToFloatOrHalf", (q8, 5)),
        ("FloatToFusedNBitRowwiseQuantizedSBHalf", (x, 4)),
        ("HalfToFusedNBitRowwiseQuantizedSBHalf", (x.half(), 2)),
        ("FloatOrHalfToFusedNBitRowwiseQuantizedSBHalf", (x, 8)),
        ("FusedNBitRowwiseQuantizedSBHalfToFloat", (q4, 4)),
        ("FusedNBitRowwiseQuantizedSBHalfToHalf", (q4, 4)),
        ("FusedNBitRowwiseQuantizedSBHalfToFloatOrHalf", (q4, 4, 1)),
        ("pruned_hashmap_lookup", (indices, offsets, table, table_offsets)),
        ("pruned_hashmap_insert", (indices, indices, offsets, table.clone(), table_offsets)),
        ("pruned_array_lookup", (indices, offsets, torch.arange(10), torch.tensor([0, 10]))),
    ]
    for name, args in calls:
        torch.library.opcheck(getattr(ops, name).default, args)
