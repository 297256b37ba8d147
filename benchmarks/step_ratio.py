"""A training step's speed-up, recops vs the torch backend, robust to a machine whose speed drifts:
the two backends' steps (benchmarks/suites/training.py's, the ones `run.py training` times) run
interleaved for several rounds, each round timing two steps of each after one discarded step (the
torch step's memory churn slows whatever runs next), with Python's cyclic garbage collector off
while timing, as harness.py times every benchmark; prints the median step times and the median,
minimum and maximum of the per-round ratios. The allocator keeps freed memory, as in run.py and
in recops.train (recops/training/allocator.py).

    python benchmarks/step_ratio.py [--models hstu,fuxi] [--max-lens 200,1024] [--rounds 7]
"""

import argparse
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "suites"))
sys.path.insert(1, os.path.dirname(HERE))  # the repository root: recops built in place
from harness import cpu_description, no_garbage_collection  # noqa: E402
from memory import use_steady_allocator  # noqa: E402
from training import training_cases, training_step  # noqa: E402

BACKENDS = ("torch", "recops")


def step_seconds(step) -> float:
    step()  # discarded: the other backend ran just before
    with no_garbage_collection():  # as run.py times them (harness.py)
        start = time.perf_counter()
        step()
        step()
        return (time.perf_counter() - start) / 2


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="hstu,fuxi")
    p.add_argument("--max-lens", default="200,1024")
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args(argv)
    models, max_lens = args.models.split(","), {int(n) for n in args.max_lens.split(",")}
    use_steady_allocator()
    print(f"machine: {cpu_description()}, {torch.get_num_threads()} threads")
    torch.manual_seed(0)
    for case, data, max_len, batch_size in training_cases():
        if max_len not in max_lens:
            continue
        for model in models:
            steps = {b: training_step(model, b, data, max_len, batch_size)[0] for b in BACKENDS}
            times = {b: [] for b in BACKENDS}
            for _ in range(args.rounds):
                for backend, step in steps.items():
                    times[backend].append(step_seconds(step))
            ratios = [t / r for t, r in zip(times["torch"], times["recops"], strict=True)]
            print(
                f"{model} {case}: torch {statistics.median(times['torch']) * 1e3:.1f} ms, "
                f"recops {statistics.median(times['recops']) * 1e3:.1f} ms, speed-up median "
                f"{statistics.median(ratios):.2f}x (rounds {min(ratios):.2f}-{max(ratios):.2f})",
                flush=True,
            )


if __name__ == "__main__":
    main(sys.argv[1:])
