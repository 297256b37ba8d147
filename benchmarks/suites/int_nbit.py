"""Quantized inference TBE lookup (docs/quantize.md): recops vs FBGEMM's CPU
int_nbit_split_embedding_codegen_lookup_function, the lookup of its
IntNBitTableBatchedEmbeddingBagsCodegen and of torchrec's quantized EmbeddingBagCollection.

Workload: the training TBE suite's (benchmarks/suites/embedding.py) in inference form: T = 8
tables of 1e5 rows, D = 128, B = 512 bags of L = 20 uniform indices each, SUM pooling into an
fp16 output (FBGEMM's default output_dtype), the tables stored INT8 or INT4 (an fp16 scale and
bias in front of each row's codes, FBGEMM's layout, 128-byte table alignment). Byte model: the
rows read, B * T * L * row bytes, plus the output. Each case first checks recops agrees with
FBGEMM, then times them.
"""

from dataclasses import dataclass

import torch
from harness import Row, check_matches, measure_case, print_speedups

SUITE = "int_nbit"
T, ROWS, D, B, L = 8, 100_000, 128, 512, 20
IMPLS = ("recops", "fbgemm")
INT8, INT4 = 2, 3  # SparseType codes
BITS = {INT8: 8, INT4: 4}
FP16_OUTPUT = 1
OP = "int_nbit_split_embedding_codegen_lookup_function"


@dataclass
class Case:
    name: str
    fns: dict  # impl name -> zero-argument callable running the op once
    bytes_moved: float


def lookup_arguments(weight_type, rows, dim, tables, batch, bag, gen):
    """The op's arguments for `tables` tables of `rows` x `dim` stored as weight_type."""
    row_bytes = dim * BITS[weight_type] // 8 + 4
    table_bytes = (rows * row_bytes + 127) // 128 * 128
    weights = torch.randint(0, 256, (tables * table_bytes,), generator=gen, dtype=torch.uint8)
    for t in range(tables):
        table = weights[t * table_bytes : t * table_bytes + rows * row_bytes].view(rows, row_bytes)
        scale_bias = torch.stack([torch.rand(rows, generator=gen) * 0.01, torch.randn(rows)], 1)
        table[:, :4] = scale_bias.half().view(torch.uint8)
    indices = torch.randint(0, rows, (tables * batch * bag,), generator=gen)
    offsets = torch.arange(0, tables * batch * bag + 1, bag)
    max_D = {INT8: 0, INT4: 0}
    max_D[weight_type] = dim
    args = (
        weights, torch.empty(0, dtype=torch.uint8), torch.full((tables,), 3, dtype=torch.int32),
        torch.arange(tables) * table_bytes, torch.full((tables,), weight_type, dtype=torch.uint8),
        torch.arange(tables + 1, dtype=torch.int32) * dim, tables * dim,
        0, max_D[INT4], max_D[INT8], 0, 0, indices, offsets, 0, None, FP16_OUTPUT,
    )  # fmt: skip
    bytes_moved = tables * batch * bag * row_bytes + batch * tables * dim * 2
    return args, bytes_moved


def cases(rows=ROWS, dim=D, tables=T, batch=B, bag=L, seed=0):
    gen = torch.Generator().manual_seed(seed)
    for weight_type, label in ((INT8, "int8"), (INT4, "int4")):
        args, bytes_moved = lookup_arguments(weight_type, rows, dim, tables, batch, bag, gen)
        fns = {
            "recops": lambda a=args: getattr(torch.ops.recops, OP)(*a),
            "fbgemm": lambda a=args: getattr(torch.ops.fbgemm, OP)(*a),
        }
        yield Case(f"{label} pooled SUM", fns, bytes_moved)


def run(limits) -> list[Row]:
    rows = []
    for case in cases():
        check_matches(case.fns["fbgemm"], case.fns["recops"], torch.float16, case.name)
        rows += measure_case(SUITE, case.name, case.fns, case.bytes_moved, IMPLS)
    print_speedups(SUITE, rows)
    return rows
