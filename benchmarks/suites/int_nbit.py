"""Quantized inference TBE (docs/embedding.md): recops.IntNBitTableBatchedEmbeddingBagsCodegen
vs fbgemm-gpu-cpu's module of the same class holding the same bytes (the module torchrec's
quantized EmbeddingBagCollection builds), forward with FBGEMM's default bounds check (WARNING)
into an fp16 output (FBGEMM's default output_dtype).

FBGEMM's CPU forward runs on one thread unless told otherwise (FBGEMM_TBE_MAX_NUM_THREADS,
default 1, and FBGEMM_TBE_MIN_TABLES_PER_THREAD, default 16, read once per process): this suite
measures it at that default; the suite int_nbit_threaded runs the same cases with FBGEMM on every
thread torch has and one table per thread at the least, its best setting on this machine.

Cases (B = 512 bags per table): 26 tables of 20,000 rows at D = 64 / 128 / 256 with bags of 1,
20 and 100 indices (SUM), INT8 and INT4; a skewed set of 300 tables (rows log-uniform in
100..200,000, D in {32, 64, 128, 256}, bag lengths log-uniform in 1..100: a few tables do most of
the work); and a sequence (NONE) lookup, 26 tables of D = 128, 20 indices a bag. Byte model: the
rows read (row bytes with the fp16 scale and bias) plus the fp16 output.
"""

import math
import os
from dataclasses import dataclass

import torch
from harness import Row, check_matches, measure_case, print_speedups
from memory import peak_extra_bytes

import recops

SUITE = "int_nbit"
IMPLS = ("recops", "fbgemm")
BATCH = 512


@dataclass
class Case:
    name: str
    fns: dict  # impl name -> zero-argument callable running one forward
    bytes_moved: float


def fbgemm_classes():
    from fbgemm_gpu.split_embedding_configs import SparseType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
    from fbgemm_gpu.split_table_batched_embeddings_ops_inference import (
        IntNBitTableBatchedEmbeddingBagsCodegen,
    )

    return SparseType, EmbeddingLocation, PoolingMode, IntNBitTableBatchedEmbeddingBagsCodegen


def module_pair(tables, weight_type: str, pooling: str):
    """FBGEMM's module over `tables` ((rows, dim) each) of `weight_type`, filled with random
    rows, and recops' module holding the same bytes."""
    SparseType, Location, Pooling, FbgemmModule = fbgemm_classes()
    specs = [
        (f"t{i}", rows, dim, SparseType[weight_type], Location.HOST)
        for i, (rows, dim) in enumerate(tables)
    ]
    kwargs = {"pooling_mode": Pooling[pooling], "output_dtype": SparseType.FP16}
    fbgemm = FbgemmModule(specs, device="cpu", **kwargs)
    fbgemm.fill_random_weights()
    ours = recops.IntNBitTableBatchedEmbeddingBagsCodegen(specs, device="cpu", **kwargs)
    ours.initialize_weights()
    ours.assign_embedding_weights(fbgemm.split_embedding_weights())
    return ours, fbgemm


def batch_of(tables, bag_lengths, gen):
    """Indices and offsets of BATCH bags per table, bag_lengths[t] indices each, uniform rows."""
    indices, lengths = [], []
    for (rows, _), length in zip(tables, bag_lengths, strict=True):
        indices.append(torch.randint(0, rows, (BATCH * length,), generator=gen))
        lengths += [length] * BATCH
    offsets = torch.cumsum(torch.tensor([0] + lengths), 0)
    return torch.cat(indices), offsets


def bytes_read(tables, bag_lengths, weight_type, pooled: bool):
    bits = {"INT8": 8, "INT4": 4}[weight_type]
    total = 0
    for (_, dim), length in zip(tables, bag_lengths, strict=True):
        row_bytes = dim * bits // 8 + 4
        output_rows = BATCH if pooled else BATCH * length
        total += BATCH * length * row_bytes + 2 * dim * output_rows
    return total


def make_case(name, tables, bag_lengths, weight_type, pooling="SUM", seed=0):
    gen = torch.Generator().manual_seed(seed)
    ours, fbgemm = module_pair(tables, weight_type, pooling)
    indices, offsets = batch_of(tables, bag_lengths, gen)
    fns = {
        "recops": lambda: ours(indices, offsets),
        "fbgemm": lambda: fbgemm(indices, offsets),
    }
    return Case(name, fns, bytes_read(tables, bag_lengths, weight_type, pooling == "SUM"))


def skewed_tables(count=300, seed=1):
    gen = torch.Generator().manual_seed(seed)
    rows = torch.empty(count).uniform_(math.log(100), math.log(200_000), generator=gen).exp()
    dims = torch.tensor([32, 64, 128, 256])[torch.randint(0, 4, (count,), generator=gen)]
    lengths = torch.empty(count).uniform_(0, math.log(100), generator=gen).exp().round()
    tables = list(zip(rows.long().tolist(), dims.tolist(), strict=True))
    return tables, lengths.long().clamp(min=1).tolist()


def cases():
    for weight_type in ("INT8", "INT4"):
        for dim, length in ((64, 1), (128, 20), (256, 100)):
            tables = [(20_000, dim)] * 26
            yield lambda w=weight_type, t=tables, d=dim, n=length: make_case(
                f"{w.lower()} 26 tables D={d} L={n}", t, [n] * 26, w
            )
    for weight_type in ("INT8", "INT4"):
        tables, lengths = skewed_tables()
        yield lambda w=weight_type, t=tables, n=lengths: make_case(
            f"{w.lower()} 300 skewed tables", t, n, w
        )
    yield lambda: make_case(
        "int8 sequence 26 tables D=128 L=20", [(20_000, 128)] * 26, [20] * 26, "INT8", "NONE"
    )


def fbgemm_threads_label() -> str:
    threads = os.environ.get("FBGEMM_TBE_MAX_NUM_THREADS", "1")
    return f"FBGEMM {threads} thread{'s' if threads != '1' else ''}"


def run(limits) -> list[Row]:
    rows = []
    label = fbgemm_threads_label()
    for make in cases():
        case = make()
        name = f"{case.name} ({label})"
        check_matches(case.fns["fbgemm"], case.fns["recops"], torch.float16, name)
        with torch.no_grad():
            case_rows = measure_case(SUITE, name, case.fns, case.bytes_moved, IMPLS)
            for r in case_rows:
                r.peak_bytes = peak_extra_bytes(case.fns[r.impl])
        rows += case_rows
        del case
    print_speedups(SUITE, rows)
    return rows
