"""Quantize family (docs/quantize.md): recops vs FBGEMM's CPU kernels.

The inputs are quantized inference's embedding tables: 65,536 rows of 128 columns (fp32, fp16)
quantized row-wise to 8-bit (float scale and bias) and to 4- and 2-bit (fp16 scale and bias),
and dequantized back to fp32 / fp16, as torchrec's quantized EmbeddingBagCollection builds and
reads its tables (FloatToFused8BitRowwiseQuantized, FloatToFusedNBitRowwiseQuantizedSBHalf and
their dequantizers); and the pruned-index remaps its lookups start with: 262,144 indices over 8
tables, remapped through a hash table (pruned_hashmap_lookup, load factor 0.5) or an array
(pruned_array_lookup). Each case first checks recops and FBGEMM agree exactly, then times them.
"""

from dataclasses import dataclass

import torch
from harness import Row, measure_case, print_speedups

SUITE = "quantize"
R = torch.ops.recops
FB = torch.ops.fbgemm
IMPLS = ("recops", "fbgemm")


@dataclass
class Case:
    name: str
    fns: dict  # impl name -> zero-argument callable running the op once
    bytes_moved: float


def verify(case: Case) -> None:
    """Exact agreement with FBGEMM, once per case: a wrong fast kernel must never be reported."""
    got, want = case.fns["recops"](), case.fns["fbgemm"]()
    assert got.dtype == want.dtype and got.shape == want.shape, case.name
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), f"{case.name}: differs"


def _nbytes(*tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _pair(name, op, *args):
    out = getattr(R, op)(*args)
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    return Case(
        name,
        {"recops": lambda: getattr(R, op)(*args), "fbgemm": lambda: getattr(FB, op)(*args)},
        _nbytes(*tensors, out),
    )


def rowwise_cases(rows, cols, gen):
    x = torch.randn(rows, cols, generator=gen)
    half = x.half()
    q8 = R.FloatToFused8BitRowwiseQuantized(x)
    yield _pair("8bit quantize fp32", "FloatToFused8BitRowwiseQuantized", x)
    yield _pair("8bit quantize fp16", "HalfToFused8BitRowwiseQuantized", half)
    yield _pair("8bit dequantize fp32", "Fused8BitRowwiseQuantizedToFloat", q8)
    yield _pair("8bit dequantize fp16", "Fused8BitRowwiseQuantizedToHalf", q8)
    for bit_rate in (4, 2):
        qn = R.FloatToFusedNBitRowwiseQuantizedSBHalf(x, bit_rate)
        yield _pair(
            f"{bit_rate}bit quantize fp32", "FloatToFusedNBitRowwiseQuantizedSBHalf", x, bit_rate
        )
        yield _pair(
            f"{bit_rate}bit quantize fp16", "HalfToFusedNBitRowwiseQuantizedSBHalf", half, bit_rate
        )
        yield _pair(
            f"{bit_rate}bit dequantize fp32", "FusedNBitRowwiseQuantizedSBHalfToFloat", qn, bit_rate
        )
        yield _pair(
            f"{bit_rate}bit dequantize fp16", "FusedNBitRowwiseQuantizedSBHalfToHalf", qn, bit_rate
        )


def pruned_cases(num_indices, num_tables, gen):
    rows = 100_000  # original rows per table, of which a quarter are kept
    batch = 64
    lengths = torch.multinomial(torch.ones(num_tables * batch), num_indices, True, generator=gen)
    lengths = torch.bincount(lengths, minlength=num_tables * batch)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    indices = torch.randint(0, rows, (num_indices,), generator=gen)
    kept = rows // 4
    # Hash tables: each table's kept rows, at load factor 0.5.
    keys = torch.cat([torch.randperm(rows, generator=gen)[:kept] for _ in range(num_tables)])
    key_offsets = torch.arange(num_tables + 1) * kept  # one bag per table
    table_offsets = torch.arange(num_tables + 1) * 2 * kept
    table = torch.full((2 * kept * num_tables, 2), -1, dtype=torch.int64)
    dense = torch.arange(kept).repeat(num_tables)
    R.pruned_hashmap_insert(keys, dense, key_offsets, table, table_offsets)
    yield _pair(
        "pruned_hashmap_lookup", "pruned_hashmap_lookup", indices, offsets, table, table_offsets
    )
    remap = torch.where(torch.rand(num_tables * rows, generator=gen) < 0.25, 0, -1)
    remap = torch.where(remap == 0, torch.arange(num_tables * rows) % rows, remap).int()
    remap_offsets = torch.arange(num_tables + 1) * rows
    yield _pair(
        "pruned_array_lookup", "pruned_array_lookup", indices, offsets, remap, remap_offsets
    )


def cases(rows=65_536, cols=128, num_indices=262_144, num_tables=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    yield from rowwise_cases(rows, cols, gen)
    yield from pruned_cases(num_indices, num_tables, gen)


def run(limits) -> list[Row]:
    rows = []
    for case in cases():
        verify(case)
        rows += measure_case(SUITE, case.name, case.fns, case.bytes_moved, IMPLS)
    print_speedups(SUITE, rows)
    return rows
