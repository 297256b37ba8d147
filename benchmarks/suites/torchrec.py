"""Sharded training under torchrec (issue 18): steps/s of the same DLRM on torchrec with FBGEMM's
CPU kernels vs torchrec with recops' (`recops.operators.torchrec.enable()`), sharded by
DistributedModelParallel over 2 gloo processes, and on one process (every table local).

The model, data and training loop are examples/torchrec_dlrm.py's (docs/torchrec.md): 26 tables of
100k rows, dimension 64, 13 dense features, batch 512 per process, fused rowwise Adagrad, one
thread per process. Both kernel sets train alternately, twice each, in the same processes; each
row keeps its best run (another process on the machine can only slow a run down). The ratio is
end to end: the dense layers, the interaction and the all-to-alls cost the same on both.

Needs torchrec: `make bench-torchrec` runs this suite in .venv-torchrec; elsewhere it is skipped.
"""

import importlib
import importlib.util
import os
import sys

from harness import Row

SUITE = "torchrec"
EXAMPLES = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples"
)
STEPS = 60


def _example():
    # On sys.path, not loaded from its file: the spawned workers import it by name.
    sys.path.insert(0, EXAMPLES)
    return importlib.import_module("torchrec_dlrm")


def run(limits):
    if importlib.util.find_spec("torchrec") is None:
        print("  torchrec suite skipped: torchrec is not installed (make bench-torchrec)")
        return []
    example = _example()
    args = example.parse_args(["--bench", "--steps", str(STEPS), "--threads", "1"])
    rows = []
    for world in (2, 1):
        rates = example.best_rates(world, args)
        case = f"DLRM 26x{args.rows // 1000}k d={args.dim} B={args.batch_size}/process, " + (
            "2 processes, planner's sharding" if world == 2 else "1 process"
        )
        for kernels in ("fbgemm", "recops"):
            rows.append(
                Row(
                    suite=SUITE,
                    case=case,
                    impl=kernels,
                    seconds=1.0 / rates[kernels],
                    extra={
                        "compare_to": ["fbgemm"] if kernels == "recops" else [],
                        "per_second": rates[kernels] * args.batch_size * world,
                    },
                )
            )
    return rows
