"""FBGEMM's quantized inference TBE lookup, int_nbit_split_embedding_codegen_lookup_function:
against fbgemm-gpu-cpu's own op on the buffers of its IntNBitTableBatchedEmbeddingBagsCodegen,
and against a float64 dequantize-and-pool reference written here."""

import math

import pytest
import torch
from accuracy import assert_close

import recops  # noqa: F401  (registers the ops)

# SparseType codes (SparseType.as_int()) of the storage types FBGEMM's CPU lookup reads.
FP32, FP16, INT8, INT4, INT2, FP8 = 0, 1, 2, 3, 4, 6
TYPES = (FP32, FP16, INT8, INT4, INT2, FP8)
BITS = {FP32: 32, FP16: 16, INT8: 8, INT4: 4, INT2: 2, FP8: 8}
HOST = 3  # PlacementType.HOST
SUM, MEAN, NONE = 0, 1, 2
OUT_DTYPES = {0: torch.float32, 1: torch.float16, 5: torch.bfloat16}
FP8_PARAMS = (4, 7)  # exponent bits, exponent bias

op = torch.ops.recops.int_nbit_split_embedding_codegen_lookup_function


def row_bytes(ty, D, row_alignment):
    scale_bias = 4 if ty in (INT8, INT4, INT2) else 0
    r = D * BITS[ty] // 8 + scale_bias
    return (r + row_alignment - 1) // row_alignment * row_alignment


def fp8_values(codes, exponent_bits, exponent_bias):
    """FBGEMM's hfp8 in float64: sign, exponent_bits of biased exponent, the rest mantissa."""
    mantissa_bits = 7 - exponent_bits
    codes = codes.long()
    exponent = (codes >> mantissa_bits) & ((1 << exponent_bits) - 1)
    fraction = (codes & ((1 << mantissa_bits) - 1)).double() / (1 << mantissa_bits)
    magnitude = torch.where(
        exponent == 0,
        fraction * 2.0 ** (1 - exponent_bias),
        (1 + fraction) * torch.pow(2.0, (exponent - exponent_bias).double()),
    )
    return torch.where((codes & 0x80) != 0, -magnitude, magnitude)


class Tables:
    """A buffer of tables in FBGEMM's inference layout, filled with well-conditioned random rows,
    and their float64 values."""

    def __init__(self, specs, row_alignment=1, gen=None, fp8=FP8_PARAMS, buffer=None, offsets=None):
        gen = gen or torch.Generator().manual_seed(0)
        self.specs, self.row_alignment, self.fp8 = specs, row_alignment, fp8
        if offsets is None:  # FBGEMM's: each table padded to 128 bytes
            offsets, size = [], 0
            for rows, D, ty in specs:
                offsets.append(size)
                size += math.ceil(rows * row_bytes(ty, D, row_alignment) / 128) * 128
            buffer = torch.zeros(size, dtype=torch.uint8)
        self.weights = buffer
        self.weights_offsets = torch.tensor(offsets, dtype=torch.int64)
        self.weights_tys = torch.tensor([ty for _, _, ty in specs], dtype=torch.uint8)
        self.placements = torch.full((len(specs),), HOST, dtype=torch.int32)
        dims = [D for _, D, _ in specs]
        self.D_offsets = torch.tensor([0] + list(torch.tensor(dims).cumsum(0)), dtype=torch.int32)
        self.total_D = sum(dims)
        self.max_D = {ty: 0 for ty in TYPES}
        for _, D, ty in specs:
            self.max_D[ty] = max(self.max_D[ty], D)
        self.values = [self._fill(t, gen) for t in range(len(specs))]

    def _fill(self, t, gen):
        rows, D, ty = self.specs[t]
        stride = row_bytes(ty, D, self.row_alignment)
        begin = int(self.weights_offsets[t])
        table = self.weights[begin : begin + rows * stride].view(rows, stride)
        if ty in (FP32, FP16):
            dtype = torch.float32 if ty == FP32 else torch.float16
            values = torch.randn(rows, D, generator=gen).to(dtype)
            table[:, : D * BITS[ty] // 8] = values.view(torch.uint8).view(rows, -1)
            return values.double()
        if ty == FP8:
            codes = torch.randint(0, 256, (rows, D), generator=gen, dtype=torch.uint8)
            table[:, :D] = codes
            return fp8_values(codes, *self.fp8)
        scale = (torch.rand(rows, 1, generator=gen) * 0.1 + 0.01).half()
        bias = (torch.rand(rows, 1, generator=gen) - 0.5).half()
        table[:, :4] = torch.cat([scale, bias], 1).view(torch.uint8)
        per_byte = 8 // BITS[ty]
        codes = torch.randint(0, 1 << BITS[ty], (rows, D), generator=gen, dtype=torch.uint8)
        packed = torch.zeros(rows, D // per_byte, dtype=torch.uint8)
        for k in range(
            per_byte
        ):  # element d sits in bits (d % per_byte) * bits of byte d / per_byte
            packed |= codes[:, k::per_byte] << (k * BITS[ty])
        table[:, 4 : 4 + D // per_byte] = packed
        return scale.double() * codes.double() + bias.double()

    def args(self, indices, offsets, pooling_mode=SUM, indice_weights=None, output_dtype=0):
        m = self.max_D
        return (
            self.weights, torch.empty(0, dtype=torch.uint8), self.placements,
            self.weights_offsets, self.weights_tys, self.D_offsets, self.total_D,
            m[INT2], m[INT4], m[INT8], m[FP16], m[FP32], indices, offsets, pooling_mode,
            indice_weights, output_dtype, None, None, self.row_alignment, m[FP8], *self.fp8,
        )  # fmt: skip

    def reference(self, indices, offsets, pooling_mode=SUM, indice_weights=None):
        names = [a.name for a in op.default._schema.arguments]
        values = self.args(indices, offsets, pooling_mode, indice_weights)
        args = dict(zip(names, values, strict=True))
        return lookup_reference(args, dtype=torch.float64)


class Invalid(Exception):
    """lookup_reference rejects the call (tests/op_cases.py turns it into its Invalid)."""


def require(condition, why):
    if not condition:
        raise Invalid(why)


def cpu_tensor(a, name, dtypes, ranks=None):
    t = a[name]
    require(isinstance(t, torch.Tensor) and t.device.type == "cpu", f"{name}: a CPU tensor")
    require(t.dtype in dtypes and (ranks is None or t.dim() in ranks), f"{name}: dtype / rank")
    return t


def decode_rows(table, ty, D, fp8):
    """Table bytes [rows, row bytes] -> float64 values [rows, D]."""
    rows = table.shape[0]
    if ty in (FP32, FP16):
        dtype = torch.float32 if ty == FP32 else torch.float16
        return table[:, : D * BITS[ty] // 8].contiguous().view(dtype).double()
    if ty == FP8:
        return fp8_values(table[:, :D], *fp8)
    scale_bias = table[:, :4].contiguous().view(torch.float16).double()
    per_byte = 8 // BITS[ty]
    packed = table[:, 4 : 4 + D // per_byte].long()
    shifts = torch.arange(per_byte) * BITS[ty]
    codes = ((packed[:, :, None] >> shifts) & ((1 << BITS[ty]) - 1)).reshape(rows, D)
    return scale_bias[:, :1] * codes.double() + scale_bias[:, 1:]


def lookup_reference(a, dtype=None):
    """The op on an argument dict, in float64 from the bytes, raising Invalid where FBGEMM's
    contract (as recops keeps it) rejects the call. Per table, its bags pooled (a -1 index adds
    nothing, MEAN divides by the whole bag's length); NONE: a row of max(max_*_D) per index, zero
    for -1, indice_weights not read."""
    pooling = a["pooling_mode"]
    require(pooling in (SUM, MEAN, NONE), "pooling_mode")
    require(a["output_dtype"] in OUT_DTYPES, "output_dtype")
    for name in ("lxu_cache_weights", "lxu_cache_locations"):
        require(a.get(name) is None or a[name].numel() == 0, name)
    alignment = 1 if a.get("row_alignment") is None else a["row_alignment"]
    require(1 <= alignment < 2**31, "row_alignment")
    w_off = cpu_tensor(a, "weights_offsets", (torch.int64,), (1,))
    if pooling != NONE:
        D_offsets = cpu_tensor(a, "D_offsets", (torch.int32,), (1,))
        T = D_offsets.numel() - 1
        require(T >= 1, "D_offsets")
        dims = D_offsets.tolist()
        require(a["total_D"] >= 1 and dims[0] >= 0 and dims[T] <= a["total_D"], "D_offsets")
    else:
        T = w_off.numel()
        require(T >= 1, "weights_offsets")
        names = ("max_int2_D", "max_int4_D", "max_int8_D", "max_float16_D", "max_float32_D")
        D = max([a[n] for n in names] + [a.get("max_float8_D") or 0])
        require(1 <= D <= (2**31 - 1) // T, "max_*_D")
        dims = [t * D for t in range(T + 1)]
    require(w_off.numel() == T, "weights_offsets")
    place = cpu_tensor(a, "weights_placements", (torch.int32,), (1,)).tolist()
    tys = cpu_tensor(a, "weights_tys", (torch.uint8,), (1,)).tolist()
    require(len(place) == T and len(tys) == T, "per table")
    for t in range(T):
        require(place[t] in (1, 2, 3) and tys[t] in TYPES, "placement / type")
        D_t = dims[t + 1] - dims[t]
        require(D_t >= 1 and D_t % (8 // min(8, BITS[tys[t]])) == 0, "dim")
    buffers = {3: cpu_tensor(a, "dev_weights", (torch.uint8,)).reshape(-1)}
    if any(p != HOST for p in place):
        buffers[1] = buffers[2] = cpu_tensor(a, "uvm_weights", (torch.uint8,)).reshape(-1)
    fp8 = (a.get("fp8_exponent_bits"), a.get("fp8_exponent_bias"))
    if FP8 in tys:
        require(fp8[0] is not None and 1 <= fp8[0] <= 7, "fp8_exponent_bits")
        require(fp8[1] is not None and 1 <= fp8[1] <= 253, "fp8_exponent_bias")
    starts = sorted(w_off.tolist())
    values = []
    for t in range(T):
        buffer, begin = buffers[place[t]], int(w_off[t])
        require(0 <= begin <= buffer.numel(), "weights_offsets")
        end = min([s for s in starts if s > begin] + [buffer.numel()])
        stride = row_bytes(tys[t], dims[t + 1] - dims[t], alignment)
        rows = (end - begin) // stride
        table = buffer[begin : begin + rows * stride].view(rows, stride)
        values.append(decode_rows(table, tys[t], dims[t + 1] - dims[t], fp8))

    indices = cpu_tensor(a, "indices", (torch.int32, torch.int64), (1,))
    offsets = cpu_tensor(a, "offsets", (torch.int32, torch.int64), (1,))
    require(offsets.numel() >= 1, "offsets")
    B = (offsets.numel() - 1) // T
    offsets = offsets[: B * T + 1].tolist()
    require(offsets[0] >= 0 and offsets[-1] <= indices.numel(), "offsets within indices")
    increasing = all(x <= y for x, y in zip(offsets[:-1], offsets[1:], strict=True))
    require(increasing, "offsets non-decreasing")
    weights = a.get("indice_weights")
    if pooling == NONE or weights is None or weights.numel() == 0:
        weights = None
    else:
        # Read as a flat array, whatever its shape (torchrec passes [N, 1]).
        weights = cpu_tensor(a, "indice_weights", (torch.float32,)).reshape(-1)
        require(weights.numel() == indices.numel(), "indice_weights")
    out_dtype = dtype or OUT_DTYPES[a["output_dtype"]]
    if pooling == NONE:
        out = torch.zeros(indices.numel(), dims[1], dtype=torch.float64)
    else:
        out = torch.zeros(B, a["total_D"], dtype=torch.float64)
    for t in range(T):
        d0, d1 = dims[t], dims[t + 1]
        for b in range(B):
            begin, end = offsets[t * B + b], offsets[t * B + b + 1]
            acc = torch.zeros(d1 - d0, dtype=torch.float64)
            for p in range(begin, end):
                r = int(indices[p])
                if r == -1:
                    continue
                require(0 <= r < values[t].shape[0], "index within its table")
                if pooling == NONE:
                    out[p, : d1 - d0] = values[t][r]
                else:
                    acc += (1.0 if weights is None else float(weights[p])) * values[t][r]
            if pooling == MEAN and end > begin:
                acc /= end - begin
            if pooling != NONE:
                out[b, d0:d1] = acc
    return out.to(out_dtype)


def random_batch(specs, B, gen, index_dtype=torch.int64, max_len=5, pruned=0.2):
    """Bags of random lengths (some empty), indices within their tables, a fraction -1."""
    lengths = torch.randint(0, max_len + 1, (len(specs) * B,), generator=gen)
    lengths[1::3] = 0
    offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64)
    offsets[1:] = lengths.cumsum(0)
    indices = []
    for t, (rows, _, _) in enumerate(specs):
        n = int(lengths[t * B : (t + 1) * B].sum())
        idx = torch.randint(0, rows, (n,), generator=gen)
        idx[torch.rand(n, generator=gen) < pruned] = -1
        indices.append(idx)
    return torch.cat(indices).to(index_dtype), offsets.to(index_dtype)


MIXED = [(13, 8, INT4), (7, 16, INT8), (5, 4, FP16), (9, 12, FP32), (6, 8, INT2), (11, 20, FP8)]
SAME_DIM = [
    (13, 16, INT4),
    (7, 16, INT8),
    (5, 16, FP16),
    (9, 16, FP32),
    (6, 16, INT2),
    (4, 16, FP8),
]


# --------------------------------------------------------------------------- float64 reference
@pytest.mark.parametrize("pooling_mode", [SUM, MEAN])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("row_alignment", [1, 16])
def test_pooled_matches_dequantized_reference(pooling_mode, weighted, row_alignment):
    gen = torch.Generator().manual_seed(1)
    tables = Tables(MIXED, row_alignment, gen)
    indices, offsets = random_batch(MIXED, 6, gen)
    weights = torch.rand(indices.numel(), generator=gen) if weighted else None
    out = op(*tables.args(indices, offsets, pooling_mode, weights))
    assert out.dtype == torch.float32 and out.shape == (6, tables.total_D)
    assert_close(out, tables.reference(indices, offsets, pooling_mode, weights))


def test_per_sample_weights_of_any_shape_are_read_flat():
    """torchrec passes indice_weights as [N, 1]; FBGEMM reads them as a flat array."""
    gen = torch.Generator().manual_seed(11)
    tables = Tables(MIXED, 1, gen)
    indices, offsets = random_batch(MIXED, 4, gen)
    weights = torch.rand(indices.numel(), generator=gen)
    flat = op(*tables.args(indices, offsets, SUM, weights))
    column = op(*tables.args(indices, offsets, SUM, weights[:, None]))
    assert torch.equal(column, flat)


@pytest.mark.parametrize("ty", TYPES)
@pytest.mark.parametrize("D", [4, 8, 36, 200, 468])  # column blocks of every width
def test_each_type_and_dim(ty, D):
    gen = torch.Generator().manual_seed(D)
    specs = [(10, D, ty)]
    tables = Tables(specs, 1, gen)
    indices, offsets = random_batch(specs, 5, gen, torch.int32)
    out = op(*tables.args(indices, offsets))
    assert_close(out, tables.reference(indices, offsets), atol_factor=10)


@pytest.mark.parametrize("row_alignment", [1, 8])
def test_decoded_rows_are_the_generated_values(row_alignment):
    tables = Tables(MIXED, row_alignment, torch.Generator().manual_seed(9))
    for t, (rows, D, ty) in enumerate(MIXED):
        stride, begin = row_bytes(ty, D, row_alignment), int(tables.weights_offsets[t])
        table = tables.weights[begin : begin + rows * stride].view(rows, stride)
        torch.testing.assert_close(decode_rows(table, ty, D, FP8_PARAMS), tables.values[t])


@pytest.mark.parametrize("output_dtype", [0, 1, 5])
def test_output_dtypes(output_dtype):
    gen = torch.Generator().manual_seed(2)
    tables = Tables(MIXED, 8, gen)
    indices, offsets = random_batch(MIXED, 4, gen)
    out = op(*tables.args(indices, offsets, output_dtype=output_dtype))
    assert out.dtype == OUT_DTYPES[output_dtype]
    assert_close(out, tables.reference(indices, offsets))


@pytest.mark.parametrize("streamed", [False, True])
@pytest.mark.parametrize("weighted", [False, True])
def test_sequence_output(weighted, streamed, monkeypatch):
    """NONE: one row of the largest dim per index, per-sample weights not read; written by
    streaming stores too (used above the cache size, forced here)."""
    if streamed:
        monkeypatch.setenv("RECOPS_STREAM_ABOVE_BYTES", "0")
    gen = torch.Generator().manual_seed(3)
    tables = Tables(SAME_DIM, 4, gen)
    indices, offsets = random_batch(SAME_DIM, 3, gen)
    weights = torch.rand(indices.numel(), generator=gen) if weighted else None
    out = op(*tables.args(indices, offsets, NONE, weights))
    assert out.shape == (indices.numel(), 16)
    assert_close(out, tables.reference(indices, offsets, NONE))


def test_empty_batch_and_no_indices():
    tables = Tables(MIXED)
    out = op(*tables.args(torch.empty(0, dtype=torch.int64), torch.zeros(1, dtype=torch.int64)))
    assert out.shape == (0, tables.total_D)
    offsets = torch.zeros(len(MIXED) * 3 + 1, dtype=torch.int64)
    out = op(*tables.args(torch.empty(0, dtype=torch.int64), offsets))
    assert out.shape == (3, tables.total_D) and not out.any()


def test_rows_run_to_the_next_table():
    """A table's rows are counted up to the next table's offset, as FBGEMM does: an index into the
    128-byte padding after the last real row is read, one past it raises."""
    tables = Tables([(3, 4, FP32), (2, 4, FP32)])  # 48 bytes then padding up to 128: 8 rows
    offsets = torch.tensor([0, 1, 1])
    op(*tables.args(torch.tensor([7]), offsets))
    with pytest.raises(IndexError, match="indices"):
        op(*tables.args(torch.tensor([8]), offsets))


# --------------------------------------------------------------------------- bad input
def bad_call(**changes):
    gen = torch.Generator().manual_seed(4)
    tables = Tables(MIXED, 1, gen)
    indices, offsets = random_batch(MIXED, 3, gen, pruned=0.0)
    args = list(tables.args(indices, offsets))
    names = [a.name for a in op.default._schema.arguments]
    for name, value in changes.items():
        args[names.index(name)] = value(args[names.index(name)]) if callable(value) else value
    return args


@pytest.mark.parametrize(
    "name, change, error, message",
    [
        ("weights_tys", lambda t: t.clone().fill_(5), ValueError, "weights_tys"),
        ("weights_tys", lambda t: t.int(), RuntimeError, "weights_tys"),
        ("weights_placements", lambda t: t.clone().fill_(0), ValueError, "weights_placements"),
        ("weights_offsets", lambda t: t[:-1], RuntimeError, "weights_offsets"),
        ("weights_offsets", lambda t: t + 10**6, ValueError, "weights_offsets"),
        ("D_offsets", lambda t: t.flip(0), ValueError, "D_offsets"),
        ("D_offsets", lambda t: t.long(), RuntimeError, "D_offsets"),
        ("total_D", 1, ValueError, "total_D"),
        ("offsets", lambda t: t.flip(0), ValueError, "offsets"),
        ("offsets", lambda t: t + 1000, ValueError, "offsets"),
        ("indices", lambda t: t.float(), RuntimeError, "indices"),
        ("indices", lambda t: t + 1000, IndexError, "indices"),
        ("indices", lambda t: t - 3, IndexError, "indices"),
        ("indice_weights", lambda _: torch.ones(2), RuntimeError, "indice_weights"),
        ("output_dtype", 2, RuntimeError, "output_dtype"),
        ("lxu_cache_weights", torch.ones(2, 2), ValueError, "lxu_cache_weights"),
        (
            "lxu_cache_locations",
            torch.ones(2, dtype=torch.int32),
            ValueError,
            "lxu_cache_locations",
        ),
        ("row_alignment", 0, ValueError, "row_alignment"),
        ("row_alignment", 2**62, ValueError, "row_alignment"),
        ("fp8_exponent_bits", -1, ValueError, "fp8_exponent_bits"),
        ("fp8_exponent_bias", 0, ValueError, "fp8_exponent_bias"),
        ("dev_weights", lambda t: t.float(), RuntimeError, "dev_weights"),
        ("pooling_mode", 3, ValueError, "pooling_mode"),
    ],
)
def test_bad_input_names_the_argument(name, change, error, message):
    args = bad_call(**{name: change})
    before = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    with pytest.raises(error, match=message):
        op(*args)
    for a, b in zip(args, before, strict=True):  # nothing written
        assert not isinstance(a, torch.Tensor) or torch.equal(a, b)


def test_odd_int4_dim_is_rejected():
    tables = Tables([(4, 4, INT4)])
    args = list(tables.args(torch.tensor([0]), torch.tensor([0, 1])))
    args[5] = torch.tensor([0, 3], dtype=torch.int32)  # D_offsets: dim 3 of INT4
    args[6] = 3
    with pytest.raises(ValueError, match="multiple of 2"):
        op(*args)


def test_opcheck():
    gen = torch.Generator().manual_seed(5)
    tables = Tables(MIXED, 1, gen)
    indices, offsets = random_batch(MIXED, 3, gen)
    torch.library.opcheck(op, tables.args(indices, offsets, MEAN, output_dtype=1))
    tables = Tables(SAME_DIM, 1, gen)
    indices, offsets = random_batch(SAME_DIM, 2, gen)
    torch.library.opcheck(op, tables.args(indices, offsets, NONE))


# --------------------------------------------------------------------------- against FBGEMM
def fbgemm_module_tables(specs, row_alignment, pooling_mode, output_dtype, gen):
    """FBGEMM's module lays the tables out and fill_random_weights() fills them; the rows are
    then overwritten in place with finite values (random fp16 / fp32 bytes hold NaN and inf, and
    its int rows have a zero scale and bias) through Tables, which checks the layout is FBGEMM's."""
    from fbgemm_gpu.split_embedding_configs import SparseType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
    from fbgemm_gpu.split_table_batched_embeddings_ops_inference import (
        IntNBitTableBatchedEmbeddingBagsCodegen,
    )

    sparse = {FP32: "fp32", FP16: "fp16", INT8: "int8", INT4: "int4", INT2: "int2", FP8: "fp8"}
    out_types = {0: "fp32", 1: "fp16", 5: "bf16"}
    embedding_specs = [
        (f"t{i}", r, D, SparseType(sparse[ty]), EmbeddingLocation.HOST)
        for i, (r, D, ty) in enumerate(specs)
    ]
    module = IntNBitTableBatchedEmbeddingBagsCodegen(
        embedding_specs,
        device="cpu",
        pooling_mode=pooling_mode,
        output_dtype=SparseType(out_types[output_dtype]),
        row_alignment=row_alignment,
        fp8_exponent_bits=FP8_PARAMS[0],
        fp8_exponent_bias=FP8_PARAMS[1],
    )
    module.fill_random_weights()
    tables = Tables(
        specs,
        row_alignment,
        gen,
        buffer=module.weights_host,
        offsets=module.weights_offsets.tolist(),
    )
    assert torch.equal(module.weights_tys, tables.weights_tys)
    assert torch.equal(module.D_offsets, tables.D_offsets)
    assert torch.equal(module.weights_placements, tables.placements)
    return tables


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("pooling_mode", [SUM, MEAN, NONE])
@pytest.mark.parametrize("output_dtype", [0, 1, 5])
@pytest.mark.parametrize("row_alignment", [1, 16])
def test_matches_fbgemm(fbgemm_ops, index_dtype, pooling_mode, output_dtype, row_alignment):
    gen = torch.Generator().manual_seed(6)
    specs = SAME_DIM if pooling_mode == NONE else MIXED
    tables = fbgemm_module_tables(specs, row_alignment, pooling_mode, output_dtype, gen)
    indices, offsets = random_batch(specs, 5, gen, index_dtype)
    for weights in (None, torch.rand(indices.numel(), generator=gen)):
        args = tables.args(indices, offsets, pooling_mode, weights, output_dtype)
        expected = fbgemm_ops.int_nbit_split_embedding_codegen_lookup_function(*args)
        out = op(*args)
        assert out.dtype == expected.dtype and out.shape == expected.shape
        assert_close(out, expected)


@pytest.mark.parametrize("ty", TYPES)
def test_each_type_matches_fbgemm(fbgemm_ops, ty):
    gen = torch.Generator().manual_seed(7)
    specs = [(20, 64, ty), (3, 200, ty)]
    tables = fbgemm_module_tables(specs, 1, SUM, 0, gen)
    # FBGEMM's FP8 kernel does not skip a pruned index: it reads the bytes before the table as
    # row -1 (recops skips it as for every other type), so FP8 is compared without pruned rows.
    pruned = 0.0 if ty == FP8 else 0.2
    indices, offsets = random_batch(specs, 8, gen, max_len=12, pruned=pruned)
    weights = torch.rand(indices.numel(), generator=gen)
    args = tables.args(indices, offsets, SUM, weights)
    assert_close(op(*args), fbgemm_ops.int_nbit_split_embedding_codegen_lookup_function(*args))


def test_fbgemm_namespace_is_served(fbgemm_ops):
    """torch.ops.fbgemm's op on recops (use_for_fbgemm) gives recops' result."""
    gen = torch.Generator().manual_seed(8)
    tables = Tables(MIXED, 1, gen)
    indices, offsets = random_batch(MIXED, 3, gen)
    args = tables.args(indices, offsets)
    name = "int_nbit_split_embedding_codegen_lookup_function"
    recops.use_for_fbgemm([name])
    try:
        torch.testing.assert_close(getattr(fbgemm_ops, name)(*args), op(*args))
    finally:
        recops.use_for_fbgemm([name], enable=False)
