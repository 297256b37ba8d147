"""torchrec's utility ops (docs/jagged_sparse.md, "Zero-collision hashing"): recops vs FBGEMM's
CPU kernel. zero_collision_hash is the read-only lookup torchrec's HashZchManagedCollisionModule
runs in eval mode (torchrec.modules.hash_mc_modules.HashZchManagedCollisionModule.remap): a batch
of ids looked up in a trained identity table of 1M slots, per-id blocks as TrainInputMapper gives
them, max_probe 128 (torchrec's default). Each case checks once that both agree exactly, then
times them interleaved. Bytes moved: the ids read and the slots written (the probes' table reads
depend on the table's fill)."""

import torch
from harness import Row, geomean, measure_quietly

SUITE = "torchrec_ops"
R = torch.ops.recops
FB = torch.ops.fbgemm


def zch_cases(gen, num_ids=262_144, rows=1 << 20, buckets=4):
    table = torch.randint(0, 1 << 40, (rows, 1), generator=gen)
    table[torch.rand(rows, generator=gen) < 0.3] = -1  # a partly filled table
    ids = torch.cat(
        [
            table[torch.randint(0, rows, (num_ids // 2,), generator=gen), 0].abs(),
            torch.randint(0, 1 << 40, (num_ids - num_ids // 2,), generator=gen),
        ]
    )
    size = rows // buckets
    which = torch.randint(0, buckets, (num_ids,), generator=gen)
    blocks = dict(local_sizes=torch.full((num_ids,), size), offsets=which * size)
    cases = []
    for label, extra in (("table", {}), ("blocks", blocks)):
        args = (ids, table, 128)
        kwargs = dict(circular_probe=True, readonly=True, **extra)
        fns = {
            "recops": lambda a=args, k=kwargs: R.zero_collision_hash(*a, **k),
            "fbgemm": lambda a=args, k=kwargs: FB.zero_collision_hash(*a, **k),
        }
        cases.append(
            (f"zero_collision_hash {label} {num_ids} ids in {rows} slots", fns, ids.numel() * 16.0)
        )
    return cases


def verify(fns) -> None:
    ours, theirs = fns["recops"](), fns["fbgemm"]()
    assert torch.equal(ours[0], theirs[0]) and ours[1] is None and theirs[1] is None


def run(limits) -> list[Row]:
    gen = torch.Generator().manual_seed(0)
    rows = []
    for name, fns, bytes_moved in zch_cases(gen):
        verify(fns)
        times, _ = measure_quietly(fns)
        rows += [Row(SUITE, name, impl, times[impl], bytes_moved) for impl in fns]
    speedups = [
        next(b.seconds for b in rows if b.case == r.case and b.impl == "fbgemm") / r.seconds
        for r in rows
        if r.impl == "recops"
    ]
    print(f"{SUITE}: recops vs fbgemm: geomean {geomean(speedups):.2f}x, min {min(speedups):.2f}x")
    return rows
