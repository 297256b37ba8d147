"""Runs every benchmark suite side by side in one process and writes one table.

Usage: python benchmarks/run.py [suite ...]   (default: all suites in benchmarks/suites/)
Results: printed as a table, and saved to benchmarks/results/latest.json and latest.md.
On a shared machine each measurement is retried while other processes load the CPUs; set
BENCH_PATIENCE=<seconds> to keep retrying each one that long (see harness.measure_quietly).
"""

import importlib
import json
import os
import pkgutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.dirname(HERE))  # the repository root: recops built in place

import torch  # noqa: E402
from harness import Limits, Row, geomean, measure_limits  # noqa: E402
from memory import use_steady_allocator  # noqa: E402

import recops  # noqa: E402

RESULTS = os.path.join(HERE, "results")


def _versions():
    fbgemm = "absent"
    if recops.fbgemm_loaded:
        import fbgemm_gpu

        fbgemm = fbgemm_gpu.__version__
    return f"torch {torch.__version__}, fbgemm-gpu-cpu {fbgemm}, recops {recops.__version__}"


def format_table(rows, limits):
    lines = [
        f"machine: {limits.cpu}, {limits.threads} threads, copy {limits.copy_gbps:.1f} GB/s "
        f"({limits.copy_1thread_gbps:.1f} on one thread), "
        f"fp32 matmul {limits.matmul_gflops:.1f} GFLOP/s, "
        f"bf16 matmul {limits.matmul_bf16_gflops:.1f} GFLOP/s, {_versions()}; "
        "allocator: steady (freed memory reused, no page faults in timings; benchmarks/memory.py)",
        "",
        "| suite | case | impl | median ms | speed-up vs | GB/s (% copy) | GFLOP/s (% mm) "
        "| peak MiB |",
        "|---|---|---|---:|---|---:|---:|---:|",
    ]
    by_key = {(r.suite, r.case, r.impl): r for r in rows}
    for r in rows:
        speedups = [f"{b.seconds / r.seconds:.2f}x {label}" for label, b in _baselines(r, by_key)]
        rate = r.bytes_moved / r.seconds / 1e9
        gbps = f"{rate:.1f} ({100 * rate / limits.copy_gbps:.0f}%)" if r.bytes_moved else ""
        flop_rate = r.flops / r.seconds / 1e9
        gflops = f"{flop_rate:.1f} ({_matmul_share(r, flop_rate, limits)})" if r.flops else ""
        peak = f"{r.peak_bytes / 2**20:.1f}" if r.peak_bytes else ""
        lines.append(
            f"| {r.suite} | {r.case} | {r.impl} | {1e3 * r.seconds:.3f} | {'; '.join(speedups)} "
            f"| {gbps} | {gflops} | {peak} |"
        )
    lines += speedup_summary(rows, by_key)
    return "\n".join(lines)


def _matmul_share(row, flop_rate, limits):
    """The row's GFLOP/s as a share of the machine's matmul rate in its dtype: bf16 rows of the
    bf16 matmul ("% bf16 mm"), the rest of the fp32 one."""
    if row.extra.get("dtype") == "bfloat16" and limits.matmul_bf16_gflops:
        return f"{100 * flop_rate / limits.matmul_bf16_gflops:.0f}% bf16 mm"
    return f"{100 * flop_rate / limits.matmul_gflops:.0f}%"


def _baselines(row, by_key):
    """(label, row) of each measured baseline in row.extra["compare_to"]: an impl name (that impl
    on the same case) or [impl, case, label] (that impl on another case, e.g. the same inputs in
    float32)."""
    found = []
    for base in row.extra.get("compare_to", []):
        impl, case, label = (base, row.case, base) if isinstance(base, str) else base
        b = by_key.get((row.suite, case, impl))
        if b is not None:
            found.append((label, b))
    return found


def speedup_summary(rows, by_key):
    """Geometric mean and minimum of each (suite, impl, baseline) speed-up over the cases."""
    ratios = {}
    for r in rows:
        for label, b in _baselines(r, by_key):
            ratios.setdefault((r.suite, r.impl, label), []).append((b.seconds / r.seconds, r.case))
    if not ratios:
        return []
    lines = [
        "",
        "| suite | impl | vs | cases | geomean speed-up | min (case) |",
        "|---|---|---|---:|---:|---|",
    ]
    for (suite, impl, base), vals in ratios.items():
        low, low_case = min(vals)
        lines.append(
            f"| {suite} | {impl} | {base} | {len(vals)} | {geomean(v for v, _ in vals):.2f}x "
            f"| {low:.2f}x ({low_case}) |"
        )
    return lines


def run_suite_isolated(name, limits):
    """Runs one suite in a fresh interpreter: allocator state, caches and thread pools left by
    another suite must not shift its timings."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rows.json")
        subprocess.run(
            [sys.executable, __file__, "--suite", name, json.dumps(vars(limits)), out], check=True
        )
        with open(out) as f:
            return [Row(**row) for row in json.load(f)]


def main(argv):
    if argv[:1] == ["--suite"]:  # child of run_suite_isolated
        name, limits, out = argv[1], Limits(**json.loads(argv[2])), argv[3]
        use_steady_allocator()
        rows = importlib.import_module(f"suites.{name}").run(limits)
        with open(out, "w") as f:
            json.dump([r.as_dict() for r in rows], f)
        return
    suites = sorted(m.name for m in pkgutil.iter_modules([os.path.join(HERE, "suites")]))
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__ + "\nSuites: " + " ".join(suites))
        return
    unknown = [name for name in argv if name not in suites]
    if unknown:
        sys.exit(f"unknown suite(s) {' '.join(unknown)}; the suites are: {' '.join(suites)}")
    names = argv or suites
    limits = measure_limits()
    print(
        f"limits: copy {limits.copy_gbps:.1f} GB/s ({limits.copy_1thread_gbps:.1f} on one thread), "
        f"matmul {limits.matmul_gflops:.1f} GFLOP/s (bf16 {limits.matmul_bf16_gflops:.1f})",
        flush=True,
    )
    rows = []
    for name in names:
        t0 = time.time()
        rows += run_suite_isolated(name, limits)
        print(f"suite {name}: {time.time() - t0:.1f} s", flush=True)
    table = format_table(rows, limits)
    print(table)
    os.makedirs(RESULTS, exist_ok=True)
    suffix = "" if not argv else "_" + "_".join(names)
    with open(os.path.join(RESULTS, f"latest{suffix}.md"), "w") as f:
        f.write(table + "\n")
    with open(os.path.join(RESULTS, f"latest{suffix}.json"), "w") as f:
        json.dump({"limits": vars(limits), "rows": [r.as_dict() for r in rows]}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
