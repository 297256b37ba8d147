"""A DLRM trained under torchrec's DistributedModelParallel on local gloo processes, for
tests/test_torchrec_sharded.py: each process runs `worker` and saves what it trained to a file.

Every run sees the same global batches (GLOBAL_BATCH samples a step), rank r training on its
slice. The embedding tables start from one deterministic table whatever the sharding, the dense
layers from one seed. Each rank's loss is a mean over its slice; DDP averages the dense
gradients over the ranks, and torchrec's embedding communication divides the embedding gradients
by the world size (its default gradient division), so W ranks train as one process on the global
batch.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch

# name, rows, features; every table has dim DIM (DLRM's interaction needs one dim).
TABLES = (("t0", 60, ("f0", "f1")), ("t1", 45, ("f2",)), ("t2", 30, ("f3",)))
DIM = 16
DENSE_IN = 5
GLOBAL_BATCH = 16
STEPS = 3
MAX_BAG = 3  # bag lengths are 0 .. MAX_BAG: empty bags included
LEARNING_RATE = 0.1
SHARDING_TYPES = ("table_wise", "row_wise", "column_wise")
# The fused optimizers trained here, by FBGEMM's EmbOptimType names (lower case). FBGEMM has CPU
# kernels for Adagrad only; the Adam family runs on recops' kernels alone. Elementwise optimizers
# are exact under every sharding; a rowwise state, or LAMB's row norms, is per column shard, so
# those are not column-wise exact.
OPTIMIZERS = ("exact_adagrad", "adam", "partial_rowwise_adam", "lamb")


@dataclass(frozen=True)
class Run:
    """One training: tables sharded `sharding`-wise; `kernels` "recops" (recops.operators.torchrec
    enabled) or "fbgemm"; the tables' fused `optimizer` one of OPTIMIZERS."""

    sharding: str
    kernels: str
    optimizer: str = "exact_adagrad"

    @property
    def tag(self) -> str:
        return f"{self.sharding}-{self.kernels}-{self.optimizer}"


def feature_names() -> list[str]:
    return [f for _, _, features in TABLES for f in features]


def feature_rows() -> list[int]:
    return [rows for _, rows, features in TABLES for _ in features]


def batch(step: int):
    """The global batch of `step`: dense [G, DENSE_IN], labels [G], and per feature the bag
    lengths [G] and ids (power-law over the table's rows)."""
    g = torch.Generator().manual_seed(1000 + step)
    dense = torch.randn(GLOBAL_BATCH, DENSE_IN, generator=g)
    labels = torch.randint(0, 2, (GLOBAL_BATCH,), generator=g).float()
    sparse = []
    for rows in feature_rows():
        lengths = torch.randint(0, MAX_BAG + 1, (GLOBAL_BATCH,), generator=g)
        u = torch.rand(int(lengths.sum()), generator=g)
        ids = (rows * u.pow(3)).long().clamp_(max=rows - 1)  # skewed to low ids: duplicates
        sparse.append((lengths, ids))
    return dense, labels, sparse


def local_batch(step: int, rank: int, world: int):
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    dense, labels, sparse = batch(step)
    per_rank = GLOBAL_BATCH // world
    lo, hi = rank * per_rank, (rank + 1) * per_rank
    lengths, values = [], []
    for feature_lengths, ids in sparse:
        starts = torch.cat([torch.zeros(1, dtype=torch.long), feature_lengths.cumsum(0)])
        lengths.append(feature_lengths[lo:hi])
        values.append(ids[starts[lo] : starts[hi]])
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=feature_names(), values=torch.cat(values), lengths=torch.cat(lengths)
    )
    return dense[lo:hi], kjt, labels[lo:hi]


def initial_table(name: str, rows: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(sum(map(ord, name)))
    return torch.rand(rows, DIM, generator=g) * 0.2 - 0.1


def _table_shards(model):
    """{table: [(row offset, column offset, local shard)]} of this rank's shards."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    shards = {}
    for key, value in model.state_dict().items():
        if not isinstance(value, ShardedTensor):
            continue
        name = key.split(".")[-2]
        shards[name] = [
            (*s.metadata.shard_offsets, s.tensor) for s in value.local_shards() if s.tensor.numel()
        ]
    return shards


def _cpu_sharder():
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.types import ShardingType

    class CpuSharder(EmbeddingBagCollectionSharder):
        """torchrec's sharder, offering row-wise sharding on CPU too (torchrec offers it on CUDA,
        TPU and MTIA only; its CPU path has every kernel it needs)."""

        def sharding_types(self, compute_device_type: str) -> list[str]:
            types = super().sharding_types(compute_device_type)
            return [*types, ShardingType.ROW_WISE.value] if compute_device_type == "cpu" else types

    return CpuSharder


def build(run: Run, world: int, pg):
    import torchrec
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.embedding_types import EmbeddingComputeKernel
    from torchrec.distributed.planner import (
        EmbeddingShardingPlanner,
        ParameterConstraints,
        Topology,
    )
    from torchrec.distributed.types import ShardingEnv
    from torchrec.models.dlrm import DLRM
    from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    configs = [
        torchrec.EmbeddingBagConfig(
            name=name, embedding_dim=DIM, num_embeddings=rows, feature_names=list(features)
        )
        for name, rows, features in TABLES
    ]
    torch.manual_seed(0)
    model = DLRM(
        embedding_bag_collection=torchrec.EmbeddingBagCollection(
            tables=configs, device=torch.device("meta")
        ),
        dense_in_features=DENSE_IN,
        dense_arch_layer_sizes=[8, DIM],
        over_arch_layer_sizes=[8, 1],
        dense_device=torch.device("cpu"),
    )
    sharder = _cpu_sharder()(
        fused_params={
            "optimizer": EmbOptimType[run.optimizer.upper()],
            "learning_rate": LEARNING_RATE,
        }
    )
    constraints = {
        name: ParameterConstraints(
            sharding_types=[run.sharding],
            compute_kernels=[EmbeddingComputeKernel.FUSED.value],
            min_partition=4,
        )
        for name, _, _ in TABLES
    }
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=world, compute_device="cpu", local_world_size=world),
        constraints=constraints,
    )
    plan = planner.collective_plan(model, [sharder], pg)
    model = DistributedModelParallel(
        model,
        env=ShardingEnv.from_process_group(pg),
        plan=plan,
        sharders=[sharder],
        device=torch.device("cpu"),
    )
    with torch.no_grad():
        for name, shards in _table_shards(model).items():
            full = initial_table(name, dict((t, r) for t, r, _ in TABLES)[name])
            for row, col, shard in shards:
                shard.copy_(full[row : row + shard.shape[0], col : col + shard.shape[1]])
    dense = KeyedOptimizerWrapper(
        dict(in_backward_optimizer_filter(model.named_parameters())),
        lambda params: torch.optim.SGD(params, lr=LEARNING_RATE),
    )
    return model, CombinedOptimizer([model.fused_optimizer, dense])


def _ops_of_a_step(step_fn) -> list[str]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        step_fn()
    names = {e.name for e in prof.events()}
    return sorted(n for n in names if n.startswith(("fbgemm::", "recops::")))


def _submodules(model):
    """Every module under `model`, the sharded kernels included (sharded modules hide them from
    named_modules(); torchrec itself walks their children and `_lookups`)."""
    seen, stack = set(), [model]
    while stack:
        module = stack.pop()
        if id(module) in seen:
            continue
        seen.add(id(module))
        yield module
        stack.extend(module.children())
        stack.extend(getattr(module, "_lookups", []))


def train(run: Run, rank: int, world: int, pg) -> dict:
    """Trains `run` for STEPS steps; returns this rank's tables and dense parameters, the losses,
    the FBGEMM / recops ops of the last step and the modules the TBEs came from."""
    import recops.operators.torchrec

    loss_fn = torch.nn.BCEWithLogitsLoss()
    losses = []
    with (
        recops.operators.torchrec.enabled() if run.kernels == "recops" else contextlib.nullcontext()
    ):
        model, optimizer = build(run, world, pg)
        for step in range(STEPS):
            dense, kjt, labels = local_batch(step, rank, world)

            def one_step(dense=dense, kjt=kjt, labels=labels):
                optimizer.zero_grad()
                loss = loss_fn(model(dense, kjt).squeeze(-1), labels)
                loss.backward()
                optimizer.step()
                losses.append(loss.detach())

            if step == STEPS - 1:
                ops = _ops_of_a_step(one_step)
            else:
                one_step()
        # The FBGEMM ops whose CPU kernel was routed to recops' during the run (a routed op runs
        # recops' kernel under FBGEMM's name: the profiler records only the fbgemm:: call); not
        # the CPU keys recops fills because FBGEMM has no CPU kernel there.
        routed = sorted(
            name
            for name, keys in recops.fbgemm_bindings.items()
            if keys == "defined" or ("CPU" in keys and (name, "CPU") not in recops._fbgemm.filled)
        )
    dense_params = {
        k: v.detach().clone() for k, v in model.state_dict().items() if type(v) is torch.Tensor
    }
    tbe_modules = {
        type(m).__module__ for m in _submodules(model) if "TableBatched" in type(m).__name__
    }
    return {
        "tables": _table_shards(model),
        "dense": dense_params,
        "losses": torch.stack(losses),
        "ops": ops,
        "tbe_modules": sorted(tbe_modules),
        "routed": routed,
    }


def worker(rank: int, world: int, port: int, out_dir: str, runs: list[Run]) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        pg = dist.group.WORLD
        for run in runs:
            result = train(run, rank, world, pg)
            torch.save(result, os.path.join(out_dir, f"{run.tag}-w{world}-rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def assemble(results: list[dict]) -> dict[str, torch.Tensor]:
    """The full tables from every rank's shards."""
    tables = {name: torch.full((rows, DIM), float("nan")) for name, rows, _ in TABLES}
    for result in results:
        for name, shards in result["tables"].items():
            for row, col, shard in shards:
                tables[name][row : row + shard.shape[0], col : col + shard.shape[1]] = shard
    return tables
