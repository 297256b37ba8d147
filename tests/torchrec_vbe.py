"""torchrec's variable-batch path, run by tests/test_torchrec_vbe.py in spawned gloo processes: a
sharded EmbeddingBagCollection with fused rowwise Adagrad (table-wise) fed KeyedJaggedTensors
whose batch size varies per feature (stride_per_key_per_rank, with the inverse indices torchrec
needs to expand the pooled output back to the batch). torchrec's fused kernel then passes
batch_size_per_feature_per_rank to the TBE module: FBGEMM's, or recops' (recops.operators.torchrec
enabled for the whole run: torchrec recognises the TBE class at every forward)."""

import os

import torch

TABLES = [("t0", 40, 8, ["f0", "f1"]), ("t1", 25, 8, ["f2"])]
FEATURE_ROWS = [40, 40, 25]
KEYS = ["f0", "f1", "f2"]
STEPS = 4
FINAL_BATCH = 6
LEARNING_RATE = 0.1


def build(world, pg):
    import torchrec
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.embedding_types import EmbeddingComputeKernel
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import (
        EmbeddingShardingPlanner,
        ParameterConstraints,
        Topology,
    )
    from torchrec.distributed.types import ShardingEnv

    configs = [
        torchrec.EmbeddingBagConfig(
            name=name, num_embeddings=rows, embedding_dim=dim, feature_names=features
        )
        for name, rows, dim, features in TABLES
    ]
    ebc = torchrec.EmbeddingBagCollection(tables=configs, device=torch.device("meta"))
    sharder = EmbeddingBagCollectionSharder(
        fused_params={
            "optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD,
            "learning_rate": LEARNING_RATE,
        }
    )
    constraints = {
        name: ParameterConstraints(
            sharding_types=["table_wise"], compute_kernels=[EmbeddingComputeKernel.FUSED.value]
        )
        for name, *_ in TABLES
    }
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=world, compute_device="cpu", local_world_size=world),
        constraints=constraints,
    )
    plan = planner.collective_plan(ebc, [sharder], pg)
    model = DistributedModelParallel(
        ebc,
        env=ShardingEnv.from_process_group(pg),
        plan=plan,
        sharders=[sharder],
        device=torch.device("cpu"),
    )
    with torch.no_grad():
        for value in model.state_dict().values():
            for shard in getattr(value, "local_shards", list)():
                n = shard.tensor.numel()
                shard.tensor.copy_(torch.linspace(-1, 1, n).view_as(shard.tensor))
    return model


def vbe_batch(step, rank):
    """A KJT of this rank whose features have 1..5 bags each, with inverse indices."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    g = torch.Generator().manual_seed(100 * step + rank)
    sizes = [[int(torch.randint(1, 6, (1,), generator=g))] for _ in KEYS]
    lengths = torch.randint(0, 4, (sum(s[0] for s in sizes),), generator=g)
    per_feature = torch.split(lengths, [s[0] for s in sizes])
    values = torch.cat(
        [
            torch.randint(0, rows, (int(n.sum()),), generator=g)
            for rows, n in zip(FEATURE_ROWS, per_feature, strict=True)
        ]
    )
    inverse = torch.stack([torch.randint(0, s[0], (FINAL_BATCH,), generator=g) for s in sizes])
    return KeyedJaggedTensor(
        keys=KEYS,
        values=values,
        lengths=lengths,
        stride_per_key_per_rank=sizes,
        inverse_indices=(KEYS, inverse),
    )


def worker(rank, world, port, out_dir, kernels):
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    import recops
    import recops.operators.torchrec

    if kernels == "recops":
        recops.operators.torchrec.enable()
    model = build(world, dist.group.WORLD)
    from torchrec_dlrm import _submodules

    tbe_classes = {
        type(m).__module__ for m in _submodules(model) if "TableBatched" in type(m).__name__
    }
    outputs = []
    for step in range(STEPS):
        values = model(vbe_batch(step, rank)).values()
        weights = torch.arange(values.numel(), dtype=values.dtype).view_as(values)
        (values * weights).sum().backward()
        outputs.append(values.detach())
    shards = {
        key: [s.tensor.clone() for s in value.local_shards()]
        for key, value in model.state_dict().items()
        if hasattr(value, "local_shards")
    }
    torch.save(
        {"outputs": outputs, "shards": shards, "tbe_classes": sorted(tbe_classes)},
        os.path.join(out_dir, f"{kernels}-w{world}-rank{rank}.pt"),
    )
    dist.destroy_process_group()
