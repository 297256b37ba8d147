"""Where a training step's time goes: torch.profiler over steps of the main job's model (ML-100K,
N = 200, B = 128, by default HSTU on the recops backend), the ops' self time grouped by what they
compute, as shares of the step (issue 28's table).

    python benchmarks/profile_step.py [--model hstu|fuxi|sasrec] [--backend recops|torch]
                                      [--max-len 200|1024] [--steps 10]
"""

import argparse
import collections
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "suites"))
sys.path.insert(1, os.path.dirname(HERE))  # the repository root: recops built in place
from harness import cpu_description  # noqa: E402
from training import training_cases, training_step  # noqa: E402

# (part, substrings of the profiler's op names), first match wins; autograd nodes that wrap an op
# (GeneratedBackwardFor_recops_<op>...) count with the op.
PARTS = [
    ("layer input / output / feed-forward (fused)", ("hstu_layer", "fuxi_layer")),
    ("attention forward + backward", ("hstu_dense", "fuxi", "_sdpa", "attention")),
    ("dropout", ("dropout", "bernoulli")),
    ("loss (fused or composed)", ("sampled_softmax",)),
    ("item table (lookup, update)", ("embedding", "split_embedding", "adagrad", "Adam")),
    ("matrix products (aten::mm, addmm, bmm)", ("aten::mm", "aten::addmm", "aten::bmm")),
]
OTHER = "element-wise and the rest (aten)"


def part_of(name: str) -> str:
    for part, keys in PARTS:
        if any(k in name for k in keys):
            return part
    return OTHER


def profile(model, backend, max_len, steps):
    torch.manual_seed(0)
    data, batch_size = next((d, b) for _, d, n, b in training_cases() if n == max_len)
    step, _ = training_step(model, backend, data, max_len, batch_size)
    for _ in range(3):
        step()
    with torch.profiler.profile() as prof:
        for _ in range(steps):
            step()
    shares = collections.Counter()
    for event in prof.key_averages():
        shares[part_of(event.key)] += event.self_cpu_time_total
    total = sum(shares.values())
    return {part: us / total for part, us in shares.most_common()}, total / steps / 1e3


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="hstu", choices=("hstu", "fuxi", "sasrec"))
    p.add_argument("--backend", default="recops", choices=("recops", "torch"))
    p.add_argument("--max-len", type=int, default=200, choices=(200, 1024))
    p.add_argument("--steps", type=int, default=10)
    args = p.parse_args(argv)
    threads = torch.get_num_threads()
    print(f"machine: {cpu_description()}, {threads} threads, torch {torch.__version__}")
    shares, step_ms = profile(args.model, args.backend, args.max_len, args.steps)
    print(f"\n{args.model}, {args.backend} backend, N={args.max_len}: {step_ms:.1f} ms a step")
    print("(profiled)\n\n| part | share |\n|---|---:|")
    for part, share in shares.items():
        print(f"| {part} | {share:.0%} |")


if __name__ == "__main__":
    main(sys.argv[1:])
