"""Which ``torch.ops.fbgemm`` ops torchrec calls on CPU, path by path (docs/jagged_sparse.md,
"torchrec's CPU op surface").

Runs each torchrec CPU path once under ``torch.profiler`` on FBGEMM's kernels (recops not
enabled) and prints, per FBGEMM op: the paths that call it, whether FBGEMM has a CPU kernel for
it, and whether recops serves it (``recops._fbgemm.FBGEMM_OPS``). A path that fails on CPU is
reported with its error. Run in the torchrec environment::

    .venv-torchrec/bin/python tests/torchrec_trace.py [--no-sharded] [--markdown]

The sharded paths train tests/torchrec_dlrm.py's DLRM on 2 gloo processes (table-wise,
row-wise, column-wise) and take about a minute.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from collections.abc import Callable

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [HERE, ROOT]
# The spawned sharded workers import torchrec_dlrm (tests/) and recops (the checkout) too.
os.environ["PYTHONPATH"] = os.pathsep.join(
    [HERE, ROOT, *filter(None, [os.environ.get("PYTHONPATH")])]
)

PATHS: dict[str, Callable[[], None]] = {}


def path(name: str):
    def register(fn):
        PATHS[name] = fn
        return fn

    return register


def _kjt(weighted: bool = False):
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    lengths = torch.tensor([2, 0, 1, 1, 3, 1, 0, 2, 1])
    values = torch.randint(0, 20, (int(lengths.sum()),))
    weights = torch.rand(values.numel()) if weighted else None
    return KeyedJaggedTensor.from_lengths_sync(
        keys=["f0", "f1", "f2"], values=values, lengths=lengths, weights=weights
    )


def _tables(dim: int = 8):
    import torchrec

    return [
        torchrec.EmbeddingBagConfig(
            name="t0", num_embeddings=20, embedding_dim=dim, feature_names=["f0", "f1"]
        ),
        torchrec.EmbeddingBagConfig(
            name="t1", num_embeddings=20, embedding_dim=dim, feature_names=["f2"]
        ),
    ]


@path("KJT permute / split / to_dict / concat / to_padded_dense")
def _kjt_ops():
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    kjt = _kjt(weighted=True)
    kjt.permute([2, 0, 1])
    kjt.split([1, 2])
    kjt.to_dict()
    KeyedJaggedTensor.concat([kjt, _kjt(weighted=True)])
    kjt["f0"].to_padded_dense(desired_length=4)
    kjt["f0"].to_dense()
    kjt.offset_per_key()
    kjt.length_per_key()


@path("KJT variable batch (VBE) permute / to_dict")
def _kjt_vbe():
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    lengths = torch.tensor([2, 0, 1, 1, 3, 1])  # f0: 2 samples, f1: 1, f2: 3
    kjt = KeyedJaggedTensor(
        keys=["f0", "f1", "f2"],
        values=torch.arange(int(lengths.sum())),
        lengths=lengths,
        stride_per_key_per_rank=[[2], [1], [3]],
    )
    kjt.permute([2, 0, 1])
    kjt.to_dict()


@path("KeyedTensor.regroup / regroup_as_dict / KTRegroupAsDict")
def _keyed_tensor():
    from torchrec.modules.regroup import KTRegroupAsDict
    from torchrec.sparse.jagged_tensor import KeyedTensor

    kts = [
        KeyedTensor(keys=["a", "b"], length_per_key=[3, 4], values=torch.randn(2, 7)),
        KeyedTensor(keys=["c"], length_per_key=[5], values=torch.randn(2, 5)),
    ]
    groups = [["a", "c"], ["b"]]
    out = KeyedTensor.regroup(kts, groups)
    KeyedTensor.regroup_as_dict(kts, groups, ["x", "y"])
    KTRegroupAsDict(groups, ["x", "y"])(kts)
    kts[0].values().requires_grad_(True)
    sum(o.sum() for o in KeyedTensor.regroup(kts, groups)).backward()
    return out


@path("EmbeddingBagCollection forward / backward")
def _ebc():
    import torchrec

    ebc = torchrec.EmbeddingBagCollection(tables=_tables())
    ebc(_kjt()).values().sum().backward()
    weighted = torchrec.EmbeddingBagCollection(tables=_tables(), is_weighted=True)
    weighted(_kjt(weighted=True)).to_dict()


@path("EmbeddingBagCollection with inverse indices (VBE)")
def _ebc_inverse_indices():
    import torchrec
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    ebc = torchrec.EmbeddingBagCollection(tables=_tables())
    for p in ebc.parameters():
        p.requires_grad_(True)
    lengths = torch.tensor([2, 1, 1, 3, 2, 1])  # 2 deduplicated samples per feature
    kjt = KeyedJaggedTensor(
        keys=["f0", "f1", "f2"],
        values=torch.randint(0, 20, (int(lengths.sum()),)),
        lengths=lengths,
        stride_per_key_per_rank=[[2], [2], [2]],
        inverse_indices=(["f0", "f1", "f2"], torch.tensor([[0, 1, 0], [1, 1, 0], [0, 0, 1]])),
    )
    ebc(kjt).values().sum().backward()


@path("EmbeddingCollection (sequence) forward / backward")
def _ec():
    import torchrec

    ec = torchrec.EmbeddingCollection(
        tables=[
            torchrec.EmbeddingConfig(
                name="t0", num_embeddings=20, embedding_dim=8, feature_names=["f0", "f1", "f2"]
            )
        ]
    )
    out = ec(_kjt())
    sum(jt.values().sum() for jt in out.values()).backward()


@path("FusedEmbeddingBagCollection step")
def _fused_ebc():
    from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection
    from torchrec.optim import RowWiseAdagrad

    fused = FusedEmbeddingBagCollection(
        tables=_tables(), optimizer_type=RowWiseAdagrad, optimizer_kwargs={"lr": 0.1}
    )
    fused(_kjt()).values().sum().backward()


@path("ManagedCollisionCollection (MCH) train + eval")
def _mch():
    import torchrec
    from torchrec.modules.mc_embedding_modules import ManagedCollisionEmbeddingBagCollection
    from torchrec.modules.mc_modules import (
        DistanceLFU_EvictionPolicy,
        ManagedCollisionCollection,
        MCHManagedCollisionModule,
    )

    tables = _tables()
    mcc = ManagedCollisionCollection(
        managed_collision_modules={
            t.name: MCHManagedCollisionModule(
                zch_size=t.num_embeddings,
                device=torch.device("cpu"),
                eviction_policy=DistanceLFU_EvictionPolicy(),
                eviction_interval=1,
                input_hash_size=1000,
            )
            for t in tables
        },
        embedding_configs=tables,
    )
    mc_ebc = ManagedCollisionEmbeddingBagCollection(
        torchrec.EmbeddingBagCollection(tables=tables), mcc, return_remapped_features=True
    )
    for _ in range(2):
        out, _ = mc_ebc(_kjt())
        out.values().sum().backward()
    mc_ebc.eval()
    mc_ebc(_kjt())


def _hash_zch(training: bool):
    from torchrec.modules.hash_mc_modules import HashZchManagedCollisionModule

    module = HashZchManagedCollisionModule(
        zch_size=20, device=torch.device("cpu"), total_num_buckets=2, max_probe=4, name="t0"
    )
    module.train(training)
    features = _kjt().to_dict()
    module.remap({"f0": features["f0"]})


@path("HashZchManagedCollisionModule eval (readonly)")
def _hash_zch_eval():
    _hash_zch(training=False)


@path("HashZchManagedCollisionModule train (insert)")
def _hash_zch_train():
    _hash_zch(training=True)


@path("quantized EmbeddingBagCollection (quantize_embeddings, int8)")
def _quant_ebc():
    import torchrec
    from torchrec.inference.modules import quantize_embeddings

    module = torch.nn.Sequential(torchrec.EmbeddingBagCollection(tables=_tables()))
    quantized = quantize_embeddings(module, dtype=torch.qint8, inplace=False)
    quantized[0](_kjt()).to_dict()


@path("quantized EmbeddingCollection (quantize_embeddings, int8)")
def _quant_ec():
    import torchrec
    from torchrec.inference.modules import quantize_embeddings
    from torchrec.quant.embedding_modules import EmbeddingCollection as QuantEmbeddingCollection

    ec = torchrec.EmbeddingCollection(
        tables=[
            torchrec.EmbeddingConfig(
                name="t0", num_embeddings=20, embedding_dim=8, feature_names=["f0", "f1", "f2"]
            )
        ]
    )
    quantized = quantize_embeddings(
        torch.nn.Sequential(ec),
        dtype=torch.qint8,
        inplace=False,
        additional_qconfig_spec_keys=[torchrec.EmbeddingCollection],
        additional_mapping={torchrec.EmbeddingCollection: QuantEmbeddingCollection},
    )
    assert isinstance(quantized[0], QuantEmbeddingCollection)
    quantized[0](_kjt())


def _profiled(fn) -> tuple[set[str], str | None]:
    error = None
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        try:
            fn()
        except Exception as e:  # a path FBGEMM cannot run on CPU: report it
            error = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
    names = {e.name for e in prof.events() if e.name.startswith("fbgemm::")}
    return {n.split("::", 1)[1] for n in names}, error


def _sharded() -> dict[str, tuple[set[str], str | None]]:
    import torchrec_dlrm as dlrm
    from test_torchrec_sharded import _free_port

    found = {}
    with tempfile.TemporaryDirectory() as out_dir:
        runs = [dlrm.Run(s, "fbgemm") for s in dlrm.SHARDING_TYPES]
        torch.multiprocessing.start_processes(
            dlrm.worker,
            args=(2, _free_port(), out_dir, runs),
            nprocs=2,
            join=True,
            start_method="spawn",
        )
        for run in runs:
            ops = set()
            for rank in range(2):
                result = torch.load(
                    os.path.join(out_dir, f"{run.tag}-w2-rank{rank}.pt"), weights_only=False
                )
                ops |= {op.split("::", 1)[1] for op in result["ops"] if op.startswith("fbgemm::")}
            found[f"DMP {run.sharding.replace('_', '-')} training step (2 gloo processes)"] = (
                ops,
                None,
            )
    return found


def fbgemm_cpu_kernel(name: str) -> bool:
    qualname = f"fbgemm::{name}"
    return any(
        torch._C._dispatch_has_kernel_for_dispatch_key(qualname, key)
        for key in ("CPU", "CompositeImplicitAutograd", "CompositeExplicitAutograd")
    )


def recops_fbgemm_ops() -> tuple[str, ...]:
    """recops._fbgemm.FBGEMM_OPS, read from its source, csrc/recops/binding/fbgemm_ops.h (no
    recops build needed)."""
    source = os.path.join(ROOT, "csrc", "recops", "binding", "fbgemm_ops.h")
    names = tuple(re.findall(r'^\s*\{"(\w+)", k\w+\},$', open(source).read(), re.MULTILINE))
    if not names:
        raise RuntimeError(f"{source} lists no FBGEMM op")
    return names


def trace(sharded: bool = True) -> dict[str, tuple[set[str], str | None]]:
    import fbgemm_gpu  # noqa: F401
    import torchrec  # noqa: F401

    torch.manual_seed(0)
    results = {name: _profiled(fn) for name, fn in PATHS.items()}
    if sharded:
        results.update(_sharded())
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-sharded", action="store_true")
    args = parser.parse_args()
    results = trace(sharded=not args.no_sharded)
    served_ops = recops_fbgemm_ops()
    by_op: dict[str, list[str]] = {}
    for name, (ops, error) in results.items():
        print(f"# {name}: {sorted(ops)}" + (f"  FAILS: {error}" if error else ""))
        for op in ops:
            by_op.setdefault(op, []).append(name)
    print()
    print("| op | called by | FBGEMM CPU kernel | recops |")
    print("|---|---|---|---|")
    for op in sorted(by_op):
        served = "yes" if op in served_ops else "no"
        cpu = "yes" if fbgemm_cpu_kernel(op) else "no"
        print(f"| `{op}` | {'; '.join(by_op[op])} | {cpu} | {served} |")


if __name__ == "__main__":
    main()
