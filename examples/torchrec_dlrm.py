"""DLRM on synthetic Criteo-shaped data, sharded by torchrec over local processes, on recops'
kernels (docs/torchrec.md).

    .venv-torchrec/bin/python examples/torchrec_dlrm.py                  # 2 processes, recops
    .venv-torchrec/bin/python examples/torchrec_dlrm.py --kernels fbgemm # FBGEMM's CPU kernels
    .venv-torchrec/bin/python examples/torchrec_dlrm.py --bench          # steps/s of both, on
                                                                         # 2 processes and on 1

Each sample has 13 dense features (log-normal, as Criteo's counts) and 26 categorical ones, one
id each, drawn from a power law over the table's rows; the label depends on a few ids and dense
features, so the loss falls. Tables are sharded by torchrec's planner; the embedding optimizer is
fused rowwise Adagrad, the dense one SGD. Rank 0 shows a progress bar and a throughput line.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time

import torch

# recops built in place in this checkout (make build), unless it is installed.
sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

NUM_DENSE = 13
NUM_SPARSE = 26


def synthetic_batch(step: int, rank: int, args) -> tuple:
    """Rank `rank`'s slice of global batch `step`: (dense [B, 13], KJT of 26 features, labels)."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    g = torch.Generator().manual_seed(step * 1000 + rank)
    B = args.batch_size
    dense = torch.randn(B, NUM_DENSE, generator=g).exp_().log1p_()
    u = torch.rand(NUM_SPARSE, B, generator=g)
    ids = (args.rows * u.pow(args.skew)).long().clamp_(max=args.rows - 1)  # power law: hot rows
    signal = (ids[:3] % 7 == 0).float().sum(0) + dense[:, 0] - 1.0
    labels = torch.bernoulli(torch.sigmoid(signal), generator=g)
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=[f"cat_{i}" for i in range(NUM_SPARSE)],
        values=ids.reshape(-1),
        lengths=torch.ones(NUM_SPARSE * B, dtype=torch.long),
    )
    return dense, kjt, labels


def build_model(args, world: int, pg):
    import torchrec
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.distributed.types import ShardingEnv
    from torchrec.models.dlrm import DLRM
    from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    tables = [
        torchrec.EmbeddingBagConfig(
            name=f"t_cat_{i}",
            embedding_dim=args.dim,
            num_embeddings=args.rows,
            feature_names=[f"cat_{i}"],
        )
        for i in range(NUM_SPARSE)
    ]
    torch.manual_seed(0)
    model = DLRM(
        embedding_bag_collection=torchrec.EmbeddingBagCollection(
            tables=tables, device=torch.device("meta")
        ),
        dense_in_features=NUM_DENSE,
        dense_arch_layer_sizes=[64, args.dim],
        over_arch_layer_sizes=[64, 1],
        dense_device=torch.device("cpu"),
    )
    sharder = EmbeddingBagCollectionSharder(
        fused_params={"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.05}
    )
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=world, compute_device="cpu", local_world_size=world),
        batch_size=args.batch_size,
    )
    plan = planner.collective_plan(model, [sharder], pg)
    model = DistributedModelParallel(
        model,
        env=ShardingEnv.from_process_group(pg),
        plan=plan,
        sharders=[sharder],
        device=torch.device("cpu"),
    )
    dense_optimizer = KeyedOptimizerWrapper(
        dict(in_backward_optimizer_filter(model.named_parameters())),
        lambda params: torch.optim.SGD(params, lr=0.05),
    )
    return model, CombinedOptimizer([model.fused_optimizer, dense_optimizer])


def train(rank: int, world: int, kernels: str, args, pg) -> float:
    """Trains args.steps steps; returns steps/s after args.warmup steps (rank 0 reports)."""
    import recops.operators.torchrec

    if kernels == "recops":
        recops.operators.torchrec.enable()
    try:
        model, optimizer = build_model(args, world, pg)
        loss_fn = torch.nn.BCEWithLogitsLoss()
        batches = [synthetic_batch(s, rank, args) for s in range(args.distinct_batches)]
        steps = range(args.warmup + args.steps)
        if rank == 0 and not args.bench:
            from tqdm import tqdm

            steps = tqdm(steps, desc=f"DLRM {kernels} x{world}", unit="step")
        start = time.perf_counter()
        for step in steps:
            if step == args.warmup:
                torch.distributed.barrier(pg)
                start = time.perf_counter()
            dense, kjt, labels = batches[step % len(batches)]
            optimizer.zero_grad()
            loss = loss_fn(model(dense, kjt).squeeze(-1), labels)
            loss.backward()
            optimizer.step()
            if rank == 0 and not args.bench and step % 10 == 0:
                steps.set_postfix(loss=f"{loss.item():.4f}")
        torch.distributed.barrier(pg)
        rate = args.steps / (time.perf_counter() - start)
    finally:
        recops.operators.torchrec.disable()
    if rank == 0:
        print(
            f"{kernels} kernels, {world} process(es): {rate:.2f} steps/s, "
            f"{rate * args.batch_size * world:.0f} samples/s "
            f"(batch {args.batch_size} per process, {args.threads} thread(s) each)",
            flush=True,
        )
    return rate


def worker(rank: int, world: int, port: int, args, kernel_list: list[str], out=None) -> None:
    """Trains once per entry of kernel_list; rank 0 appends (kernels, steps/s) to `out` (a JSON
    lines file) when one is given."""
    import torch.distributed as dist

    torch.set_num_threads(args.threads)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        for kernels in kernel_list:
            rate = train(rank, world, kernels, args, dist.group.WORLD)
            if rank == 0 and out is not None:
                with open(out, "a") as f:
                    f.write(json.dumps([kernels, rate]) + "\n")
    finally:
        dist.destroy_process_group()


def launch(world: int, args, kernel_list: list[str], out=None) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.multiprocessing.start_processes(
        worker, args=(world, port, args, kernel_list, out), nprocs=world, start_method="spawn"
    )


def best_rates(world: int, args, rounds: int = 2) -> dict[str, float]:
    """Steps/s of each kernel set on `world` processes: FBGEMM and recops trained alternately
    `rounds` times each, the best of each kept (interference from elsewhere only slows a run)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rates.jsonl")
        launch(world, args, ["fbgemm", "recops"] * rounds, out)
        with open(out) as f:
            rates = [json.loads(line) for line in f]
    return {k: max(rate for kernels, rate in rates if kernels == k) for k in ("fbgemm", "recops")}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--world", type=int, default=2, help="processes (default 2)")
    parser.add_argument("--kernels", choices=("recops", "fbgemm"), default="recops")
    parser.add_argument("--bench", action="store_true", help="steps/s of both, sharded and not")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=512, help="per process")
    parser.add_argument("--rows", type=int, default=100_000, help="rows of each of the 26 tables")
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--skew", type=float, default=4.0, help="id = rows * u^skew")
    parser.add_argument("--distinct-batches", type=int, default=8)
    parser.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    if args.bench:
        for world in sorted({args.world, 1}, reverse=True):
            rates = best_rates(world, args)
            print(
                f"{world} process(es), best of 2: FBGEMM {rates['fbgemm']:.2f} steps/s, "
                f"recops {rates['recops']:.2f} steps/s: {rates['recops'] / rates['fbgemm']:.2f}x"
            )
    else:
        launch(args.world, args, [args.kernels])


if __name__ == "__main__":
    main()
