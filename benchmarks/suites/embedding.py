"""Table-batched embedding bags with fused optimizer (OPS.md section 7), side by side with
FBGEMM's CPU SplitTableBatchedEmbeddingBagsCodegen and with nn.EmbeddingBag + torch.optim
(sparse SGD / Adagrad).

Workload: FBGEMM's TBE benchmark scaled to a small machine: T = 8 tables of 1e5 rows, D = 128,
B = 512, bags of L = 20, fp32, indices uniform or Zipf(1.15) (FBGEMM's generator: distinct
within a bag, hashed over the rows). Byte model: FBGEMM's, B * T * D * L * 4 bytes of weights
read per forward (plus the output), three times that for forward + backward.
"""

import gc
import time
from functools import partial

import numpy as np
import torch
from harness import Row

import recops

T, ROWS, D, B, L = 8, 100_000, 128, 512, 20
ZIPF_ALPHA = 1.15
LEARNING_RATE = 0.01
ROUNDS = 15
SUITE = "embedding"


def zipf_bags(rng):
    """FBGEMM's Zipf requests: per bag, the first L distinct draws of Zipf(alpha) - 1 (mod rows),
    then one random permutation of the rows so hot rows are spread over the table."""
    draws = (rng.zipf(ZIPF_ALPHA, size=(T * B, 3 * L)) - 1) % ROWS
    bags = np.empty((T * B, L), dtype=np.int64)
    for i, row in enumerate(draws):
        _, first = np.unique(row, return_index=True)
        distinct = row[np.sort(first)]
        if distinct.size < L:  # rare: pad with uniform draws
            distinct = np.concatenate([distinct, rng.integers(0, ROWS, L - distinct.size)])
        bags[i] = distinct[:L]
    return rng.permutation(ROWS)[bags]


def make_batch(distribution, rng):
    if distribution == "zipf":
        bags = zipf_bags(rng)
    else:
        bags = rng.integers(0, ROWS, size=(T * B, L))
    indices = torch.from_numpy(bags.reshape(-1))
    offsets = torch.arange(0, T * B * L + 1, L, dtype=torch.int64)
    return indices, offsets


def interleaved_medians(fns, rounds=ROUNDS, warmup=2):
    """Median seconds of each fn, timing them in turn each round so that they share the
    machine's conditions (other processes, frequency) as evenly as possible."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: float(np.median(t)) for name, t in times.items()}


def recops_module(optimizer):
    host = (recops.EmbeddingLocation.HOST, recops.ComputeDevice.CPU)
    module = recops.SplitTableBatchedEmbeddingBagsCodegen(
        [(ROWS, D, *host)] * T, optimizer=optimizer, learning_rate=LEARNING_RATE
    )
    module.init_embedding_weights_uniform(-0.01, 0.01)
    return module


def fbgemm_module(optimizer):
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    module = SplitTableBatchedEmbeddingBagsCodegen(
        [(ROWS, D, EmbeddingLocation.HOST, ComputeDevice.CPU)] * T,
        optimizer=EmbOptimType[optimizer.name],
        learning_rate=LEARNING_RATE,
    )
    module.init_embedding_weights_uniform(-0.01, 0.01)
    return module


class TorchBags:
    """nn.EmbeddingBag per table with sparse gradients and a torch.optim sparse optimizer (none
    for rowwise Adagrad, which torch.optim lacks)."""

    def __init__(self, optimizer):
        self.bags = [torch.nn.EmbeddingBag(ROWS, D, mode="sum", sparse=True) for _ in range(T)]
        params = [p for bag in self.bags for p in bag.parameters()]
        self.optimizer = None
        if optimizer == recops.OptimType.EXACT_SGD:
            self.optimizer = torch.optim.SGD(params, lr=LEARNING_RATE)
        elif optimizer == recops.OptimType.EXACT_ADAGRAD:
            self.optimizer = torch.optim.Adagrad(params, lr=LEARNING_RATE, eps=1e-8)

    def __call__(self, indices, offsets):
        outs = []
        for t, bag in enumerate(self.bags):
            begin, end = int(offsets[t * B]), int(offsets[(t + 1) * B])
            outs.append(bag(indices[begin:end], offsets[t * B : (t + 1) * B] - begin))
        return torch.cat(outs, dim=1)

    def step(self, indices, offsets, grad):
        self.optimizer.zero_grad(set_to_none=True)
        self(indices, offsets).backward(grad)
        self.optimizer.step()


def forward_fns(impls, torch_bags, indices, offsets):
    fns = {name: partial(module, indices, offsets) for name, module in impls.items()}
    fns["torch"] = partial(torch_bags, indices, offsets)
    return fns


def training_fns(impls, torch_bags, indices, offsets, grad):
    def step(module):
        module(indices, offsets).backward(grad)

    fns = {name: partial(step, module) for name, module in impls.items()}
    if torch_bags.optimizer is not None:
        fns["torch"] = partial(torch_bags.step, indices, offsets, grad)
    return fns


def run(limits):
    rows = []
    rng = np.random.default_rng(0)
    batches = {dist: make_batch(dist, rng) for dist in ("zipf", "uniform")}
    grad = torch.randn(B, T * D)
    weight_bytes = B * T * D * L * 4

    def add_rows(case, medians, bytes_moved):
        for impl, seconds in medians.items():
            compare = [i for i in ("fbgemm", "torch") if i in medians and i != impl]
            extra = {"compare_to": compare} if impl == "recops" else {}
            rows.append(Row(SUITE, case, impl, seconds, bytes_moved=bytes_moved, extra=extra))

    for optimizer in recops.OptimType:
        impls = {"recops": recops_module(optimizer)}
        if recops.fbgemm_loaded:
            impls["fbgemm"] = fbgemm_module(optimizer)
        torch_bags = TorchBags(optimizer)
        short = optimizer.name.removeprefix("EXACT_").lower()
        for dist, (indices, offsets) in batches.items():
            if optimizer == recops.OptimType.EXACT_SGD:  # the forward, once
                with torch.no_grad():
                    medians = interleaved_medians(forward_fns(impls, torch_bags, indices, offsets))
                add_rows(f"fwd {dist}", medians, weight_bytes + B * T * D * 4)
            fns = training_fns(impls, torch_bags, indices, offsets, grad)
            add_rows(f"fwd+bwd {short} {dist}", interleaved_medians(fns), 3 * weight_bytes)
        impls.clear()
        gc.collect()
    return rows
