"""A sequence lookup (one output row per index, ``PoolingMode.NONE``): the item table of the
sequential recommenders (recops/models/item_table.py), side by side with FBGEMM's CPU
``SplitTableBatchedEmbeddingBagsCodegen`` in the same mode and with ``Tensor.index_select`` of the
same rows (the gather alone, no bounds check or offsets).

Workload: ML-100K's first training batch at N=200 (10214 item ids over a table of 84150 rows;
FBGEMM's TBE needs a width that is a multiple of 4, so 48 columns, beside the models' 50), fp32,
forward only, 2 threads. Each module runs in its own process, so FBGEMM's runs with FBGEMM's
kernels (importing recops routes FBGEMM ops that lack a CPU kernel to recops). Prints median
microseconds of interleaved rounds and GB/s of rows read and written.

    python benchmarks/sequence_lookup.py [--rounds 5]
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROWS, INDICES, WIDTH = 84150, 10214, 48


def time_module(which: str, repeats: int = 300) -> None:
    """Prints '<module us> <index_select us>' for `which` (fbgemm or recops), in this process."""
    import torch

    torch.set_num_threads(2)
    if which == "fbgemm":
        from fbgemm_gpu.split_embedding_configs import EmbOptimType
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import (
            EmbeddingLocation,
            PoolingMode,
        )
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
            ComputeDevice,
            SplitTableBatchedEmbeddingBagsCodegen,
        )
    else:
        sys.path.insert(0, os.path.dirname(HERE))  # the repository root: recops built in place
        from recops.embedding import (
            ComputeDevice,
            EmbeddingLocation,
            EmbOptimType,
            PoolingMode,
            SplitTableBatchedEmbeddingBagsCodegen,
        )
    torch.manual_seed(0)
    ids = torch.randint(0, ROWS, (INDICES,))
    offsets = torch.arange(INDICES + 1)
    tbe = SplitTableBatchedEmbeddingBagsCodegen(
        [(ROWS, WIDTH, EmbeddingLocation.HOST, ComputeDevice.CPU)],
        optimizer=EmbOptimType.EXACT_ADAGRAD,
        pooling_mode=PoolingMode.NONE,
    )
    table = tbe.split_embedding_weights()[0].detach().clone()

    def microseconds(fn):
        for _ in range(20):
            fn()
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        return (time.perf_counter() - start) / repeats * 1e6

    with torch.no_grad():
        module = microseconds(lambda: tbe(ids, offsets))
        print(module, microseconds(lambda: table.index_select(0, ids)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", choices=("fbgemm", "recops"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.only:
        time_module(args.only)
        return
    sys.path[:0] = [HERE, os.path.dirname(HERE)]  # the harness imports recops
    from harness import cpu_description

    times = {"fbgemm": [], "recops": [], "index_select": []}
    for _ in range(args.rounds):
        for which in ("fbgemm", "recops"):
            out = subprocess.run(
                [sys.executable, __file__, "--only", which], capture_output=True, text=True
            )
            if out.returncode != 0:
                sys.exit(f"{which} failed:\n{out.stderr[-2000:]}")
            module, gather = map(float, out.stdout.split()[-2:])
            times[which].append(module)
            times["index_select"].append(gather)
    traffic = INDICES * WIDTH * 4 * 2  # rows read and written
    print(f"machine: {cpu_description()}, 2 threads")
    shape = f"{INDICES} ids of a {ROWS} x {WIDTH} fp32 table"
    print(f"sequence lookup, {shape}, medians of {args.rounds} rounds:")
    for name, values in times.items():
        us = statistics.median(values)
        print(f"  {name:12s} {us:7.1f} us  {traffic / us / 1e3:5.1f} GB/s")
    ratio = statistics.median(times["fbgemm"]) / statistics.median(times["recops"])
    print(f"  recops vs FBGEMM: {ratio:.2f}x")


if __name__ == "__main__":
    main()
