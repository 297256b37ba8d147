"""Table-batched embedding bags with a variable batch size per feature (FBGEMM's "VBE", docs/ops.md
section 7), side by side with FBGEMM's CPU module, which implements it for SGD and rowwise
Adagrad (by padding every feature to the largest batch, then gathering the output).

Workload: the embedding suite's tables (T = 8 of 1e5 rows, D = 128, fp32, bags of L = 20 uniform
indices), each feature's bags coming from R = 4 ranks with batch sizes drawn from 16..256 (the
mean B per feature is the embedding suite's 512). Byte model as the embedding suite: the rows
read per forward plus the output, three times the rows for forward + backward.
"""

import numpy as np
import torch
from harness import Row, measure_quietly

import recops
from suites.embedding import ROWS, D, L, T, fbgemm_module, recops_module

SUITE = "embedding_vbe"
RANKS = 4
MIN_BATCH, MAX_BATCH = 16, 256
OPTIMIZERS = (recops.OptimType.EXACT_SGD, recops.OptimType.EXACT_ROWWISE_ADAGRAD)


def make_vbe_batch(rng):
    """Uniform bags of L indices, feature-major, and their batch_size_per_feature_per_rank."""
    sizes = rng.integers(MIN_BATCH, MAX_BATCH + 1, size=(T, RANKS)).tolist()
    bags = int(np.sum(sizes))
    indices = torch.from_numpy(rng.integers(0, ROWS, size=bags * L))
    offsets = torch.arange(0, bags * L + 1, L, dtype=torch.int64)
    return indices, offsets, sizes


def run(limits):
    rows = []
    rng = np.random.default_rng(0)
    indices, offsets, sizes = make_vbe_batch(rng)
    bags = offsets.numel() - 1
    weight_bytes = bags * D * L * 4
    grad = torch.randn(bags * D)

    def measure(case, fns, bytes_moved):
        times, load = measure_quietly(fns)
        if load > 0.3:
            print(f"  noisy: {case} measured while others used {load:.1f} cores; rerun it")
        for impl, seconds in times.items():
            extra = {"compare_to": ["fbgemm"] if impl == "recops" and "fbgemm" in times else []}
            extra["others_load"] = round(load, 2)
            rows.append(Row(SUITE, case, impl, seconds, bytes_moved=bytes_moved, extra=extra))

    def forward(module):
        return module(indices, offsets, batch_size_per_feature_per_rank=sizes)

    def step(module):
        forward(module).backward(grad)

    for optimizer in OPTIMIZERS:
        impls = {"recops": recops_module(optimizer)}
        if recops.fbgemm_loaded:
            impls["fbgemm"] = fbgemm_module(optimizer, impls["recops"].weights_host)
        short = optimizer.name.removeprefix("EXACT_").lower()
        if optimizer == recops.OptimType.EXACT_SGD:  # the forward, once, checked first
            with torch.no_grad():
                if "fbgemm" in impls:
                    torch.testing.assert_close(forward(impls["recops"]), forward(impls["fbgemm"]))
                fns = {name: (lambda m=m: forward(m)) for name, m in impls.items()}
                measure("vbe fwd uniform", fns, weight_bytes + bags * D * 4)
        fns = {name: (lambda m=m: step(m)) for name, m in impls.items()}
        measure(f"vbe fwd+bwd {short} uniform", fns, 3 * weight_bytes)
    return rows
