"""Table-batched embedding bags with fused optimizer (docs/ops.md section 7), side by side with
FBGEMM's CPU SplitTableBatchedEmbeddingBagsCodegen (SGD, Adagrad, rowwise Adagrad: it has no CPU
Adam or LAMB) and with nn.EmbeddingBag + torch.optim (sparse SGD / Adagrad / SparseAdam, which
updates only the rows in the batch, as the fused Adam does). Rowwise Adagrad with counter runs
twice (COUNTER_CASES: counter-based regularization and CowClip), beside FBGEMM only.

Workload: FBGEMM's TBE benchmark scaled to a small machine: T = 8 tables of 1e5 rows, D = 128,
B = 512, bags of L = 20, fp32, indices uniform or Zipf(1.15) (FBGEMM's generator: distinct
within a bag, hashed over the rows). Byte model: FBGEMM's, B * T * D * L * 4 bytes of weights
read per forward (plus the output), three times that for forward + backward. Timing: the
harness's interleaved rounds, retried while other processes load the machine
(BENCH_PATIENCE=<s> to insist). About 30-60 s on this 2-core machine.
"""

import gc
from functools import partial

import numpy as np
import torch
from harness import Row, measure_quietly

import recops
from recops.embedding.optimizers import OPTIMIZERS

T, ROWS, D, B, L = 8, 100_000, 128, 512, 20
ZIPF_ALPHA = 1.15
LEARNING_RATE = 0.01
# Rowwise RMSprop-AR's staleness decay, on (FBGEMM's default 0 turns it off); the other
# optimizers ignore it, in both modules.
AR_ALPHA = 0.5
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


# Rowwise Adagrad with counter, two ways: counter-based regularization (decaying counts, decoupled
# decay scaled by them, the learning rate of frequent rows lowered) and CowClip (L2 decay).
COUNTER_CASES = {
    "rowwise_adagrad_counter": (
        "COUNTER",
        "counter_based_regularization",
        "CounterBasedRegularizationDefinition",
        dict(
            counter_weight_decay_mode="DECOUPLE",
            counter_halflife=100,
            learning_rate_mode="TAIL_ID_LR_DECREASE",
            adjustment_ub=0.5,
        ),
    ),
    "rowwise_adagrad_cowclip": (
        "COWCLIP",
        "cowclip_regularization",
        "CowClipDefinition",
        dict(counter_weight_decay_mode="L2", weight_norm_coefficient=0.1, lower_bound=1e-3),
    ),
}
WEIGHT_DECAY = 1e-4  # read by the counter cases only


def counter_kwargs(case, config):
    """The constructor arguments of a COUNTER_CASES entry, built from `config`, the module holding
    the enums and definition classes (recops.embedding, or FBGEMM's optimizer_config)."""
    mode, argument, definition, fields = COUNTER_CASES[case]
    fields = dict(fields)
    for name, enum in (
        ("counter_weight_decay_mode", "CounterWeightDecayMode"),
        ("learning_rate_mode", "LearningRateMode"),
    ):
        if name in fields:
            fields[name] = getattr(config, enum)[fields[name]]
    return {
        "optimizer_name": "EXACT_ROWWISE_ADAGRAD",
        "weight_decay": WEIGHT_DECAY,
        "weight_decay_mode": config.WeightDecayMode[mode],
        argument: getattr(config, definition)(**fields),
    }


def recops_module(optimizer_name, **kwargs):
    host = (recops.EmbeddingLocation.HOST, recops.ComputeDevice.CPU)
    module = recops.SplitTableBatchedEmbeddingBagsCodegen(
        [(ROWS, D, *host)] * T,
        optimizer=recops.OptimType[optimizer_name],
        learning_rate=LEARNING_RATE,
        ar_alpha=AR_ALPHA,
        **kwargs,
    )
    module.init_embedding_weights_uniform(-0.01, 0.01)
    return module


def fbgemm_module(weights, optimizer_name, **kwargs):
    """FBGEMM's CPU module with the same tables and the same initial weights."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    module = SplitTableBatchedEmbeddingBagsCodegen(
        [(ROWS, D, EmbeddingLocation.HOST, ComputeDevice.CPU)] * T,
        optimizer=EmbOptimType[optimizer_name],
        learning_rate=LEARNING_RATE,
        ar_alpha=AR_ALPHA,
        **kwargs,
    )
    with torch.no_grad():
        module.weights_host.copy_(weights)
    return module


class TorchBags:
    """nn.EmbeddingBag per table with sparse gradients and a torch.optim sparse optimizer (none
    for rowwise Adagrad, partial rowwise Adam and the LAMBs, which torch.optim lacks)."""

    def __init__(self, optimizer):
        self.bags = [torch.nn.EmbeddingBag(ROWS, D, mode="sum", sparse=True) for _ in range(T)]
        params = [p for bag in self.bags for p in bag.parameters()]
        self.optimizer = None
        if optimizer == recops.OptimType.EXACT_SGD:
            self.optimizer = torch.optim.SGD(params, lr=LEARNING_RATE)
        elif optimizer == recops.OptimType.EXACT_ADAGRAD:
            self.optimizer = torch.optim.Adagrad(params, lr=LEARNING_RATE, eps=1e-8)
        elif optimizer == recops.OptimType.ADAM:
            self.optimizer = torch.optim.SparseAdam(params, lr=LEARNING_RATE)

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


def check_forward(impls, indices, offsets):
    """recops' forward matches FBGEMM's on the benchmark input before anything is timed."""
    if "fbgemm" in impls:
        with torch.no_grad():
            torch.testing.assert_close(
                impls["recops"](indices, offsets), impls["fbgemm"](indices, offsets)
            )


def run(limits):
    rows = []
    rng = np.random.default_rng(0)
    batches = {dist: make_batch(dist, rng) for dist in ("zipf", "uniform")}
    grad = torch.randn(B, T * D)
    weight_bytes = B * T * D * L * 4

    def measure(case, fns, bytes_moved):
        times, load = measure_quietly(fns)
        if load > 0.3:
            print(f"  noisy: {case} measured while others used {load:.1f} cores; rerun it")
        for impl, seconds in times.items():
            compare = [i for i in ("fbgemm", "torch") if i in times and i != impl]
            extra = {
                "compare_to": compare if impl == "recops" else [],
                "others_load": round(load, 2),
            }
            rows.append(Row(SUITE, case, impl, seconds, bytes_moved=bytes_moved, extra=extra))

    cases = [
        (optimizer.name.removeprefix("EXACT_").lower(), {"optimizer_name": optimizer.name})
        for optimizer in recops.OptimType
    ]
    cases += [(case, counter_kwargs(case, recops.embedding)) for case in COUNTER_CASES]
    for short, kwargs in cases:
        optimizer = recops.OptimType[kwargs["optimizer_name"]]
        impls = {"recops": recops_module(**kwargs)}
        if recops.fbgemm_loaded and OPTIMIZERS[optimizer].fbgemm_cpu:
            if short in COUNTER_CASES:
                import fbgemm_gpu.tbe.config.optimizer_config as fbgemm_config

                kwargs = counter_kwargs(short, fbgemm_config)
            impls["fbgemm"] = fbgemm_module(impls["recops"].weights_host, **kwargs)
        torch_bags = TorchBags(optimizer if short not in COUNTER_CASES else None)
        for dist, (indices, offsets) in batches.items():
            if short == "sgd":  # the forward, once
                check_forward(impls, indices, offsets)
                with torch.no_grad():
                    fns = forward_fns(impls, torch_bags, indices, offsets)
                    measure(f"fwd {dist}", fns, weight_bytes + B * T * D * 4)
            fns = training_fns(impls, torch_bags, indices, offsets, grad)
            measure(f"fwd+bwd {short} {dist}", fns, 3 * weight_bytes)
        impls.clear()
        gc.collect()
    return rows
