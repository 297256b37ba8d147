"""The deployed recommender: its AOTInductor package (python -m recops.export) served by the C++
program examples/cpp_serving, against the eager Python recommender (recops.recommend on recops'
ops, what a Python server runs) and the same package loaded in Python, on the same requests with
the same threads.

Model: the main job's HSTU (recops.train's defaults: ML-100K's 1,682 items, max_seq_len 200,
d = 50, 2 layers, 1 head) with random weights: the work per request does not depend on them.
Requests: ML-100K's 943 users, each asking for its top-10 at its last interaction (history
windows of up to 199 items, the whole history excluded), in batches of --batch-sizes users.
Threads: for each (workers, threads per worker) in --threads, `workers` callers take batches from
one queue, each with that many intra-op threads (the eager model and the Python-loaded package
from Python threads, which the ops release the GIL in; the C++ program from std::threads).
Reported: per-batch latency p50 / p90 / p99 and users per second, each system twice over the
requests after a warm-up batch (the C++ program's own timings; the Python ones around the call).

Usage: python benchmarks/deploy.py [--quick]
Writes benchmarks/results/deploy.json and deploy.md (--quick: a temporary folder, fewer users).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(1, ROOT)  # the repository root: recops built in place

import torch  # noqa: E402
from harness import measure_limits  # noqa: E402

import recops  # noqa: E402
from recops.data.datasets import load_dataset  # noqa: E402
from recops.export import PackagedRecommender, package_recommender, write_requests  # noqa: E402
from recops.models import ModelConfig, SequentialRecommender  # noqa: E402
from recops.models.recommend import recommend  # noqa: E402

RESULTS = os.path.join(HERE, "results")
TOP_K = 10
REPEATS = 2


def user_histories(limit: int | None):
    data = load_dataset("ml-100k")
    histories = []
    for user in range(data.num_users if limit is None else limit):
        begin, end = int(data.offsets[user]), int(data.offsets[user + 1])
        histories.append((data.items[begin:end].tolist(), data.timestamps[begin:end].tolist()))
    return histories, data.num_items


def summary(latencies_ms: list[float], users: int, seconds: float) -> dict:
    ordered = sorted(latencies_ms)

    def rank(p):
        return ordered[max(0, -(-len(ordered) * p // 100) - 1)]

    return {
        "latency_ms": {"p50": rank(50), "p90": rank(90), "p99": rank(99), "max": ordered[-1]},
        "users_per_second": users / seconds,
    }


def python_pool(answer, batches: list, workers: int, threads: int) -> dict:
    """``answer(batch)`` for every batch REPEATS times from ``workers`` Python threads."""
    answer(batches[0])  # warm-up
    tasks: queue.SimpleQueue = queue.SimpleQueue()
    for _ in range(REPEATS):
        for batch in batches:
            tasks.put(batch)
    latencies: list[float] = []
    lock = threading.Lock()

    def work():
        torch.set_num_threads(threads)  # the intra-op thread count is per calling thread
        mine = []
        while True:
            try:
                batch = tasks.get_nowait()
            except queue.Empty:
                break
            start = time.perf_counter()
            answer(batch)
            mine.append(1e3 * (time.perf_counter() - start))
        with lock:
            latencies.extend(mine)

    begin = time.perf_counter()
    pool = [threading.Thread(target=work) for _ in range(workers)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    users = REPEATS * sum(len(batch) for batch in batches)
    return summary(latencies, users, time.perf_counter() - begin)


def cpp_program() -> str:
    build = os.path.join(ROOT, "build", "cpp_serving")
    configure = ["cmake", "-S", os.path.join(ROOT, "examples", "cpp_serving"), "-B", build,
                 f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}"]  # fmt: skip
    for command in (configure, ["cmake", "--build", build, "-j2"]):
        subprocess.run(command, check=True, capture_output=True)
    return os.path.join(build, "recops_cpp_serving")


def run_cpp(program, package, requests, batch_size, workers, threads) -> dict:
    result = subprocess.run(
        [program, "--package", package, "--library", recops.library_path, "--requests", requests,
         "--out", os.devnull, "--batch-size", str(batch_size), "--workers", str(workers),
         "--threads", str(threads), "--repeat", str(REPEATS)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    report = json.loads(result.stderr.strip().splitlines()[-1])
    return {"latency_ms": report["latency_ms"], "users_per_second": report["users_per_second"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--batch-sizes", default="1,32")
    parser.add_argument("--threads", default="1x2,2x1", help="workers x threads per worker")
    args = parser.parse_args()
    limits = measure_limits()
    machine = (
        f"machine: {limits.cpu}, {limits.threads} threads, copy {limits.copy_gbps:.1f} GB/s, "
        f"torch {torch.__version__}"
    )
    print(machine, flush=True)
    histories, num_items = user_histories(100 if args.quick else None)
    torch.manual_seed(0)
    model = SequentialRecommender(ModelConfig(model="hstu", num_items=num_items)).eval()
    out = tempfile.mkdtemp() if args.quick else RESULTS
    work = tempfile.mkdtemp()
    package = package_recommender(model, os.path.join(work, "hstu.pt2"), TOP_K)
    requests = os.path.join(work, "requests.txt")
    write_requests(requests, histories)
    program = cpp_program()

    results = {"machine": machine, "users": len(histories), "runs": []}
    for pool in args.threads.split(","):
        workers, threads = (int(n) for n in pool.split("x"))
        served = PackagedRecommender(package, runners=workers)
        for batch_size in (int(b) for b in args.batch_sizes.split(",")):
            batches = [histories[i : i + batch_size] for i in range(0, len(histories), batch_size)]
            run = {"workers": workers, "threads": threads, "batch_size": batch_size}
            with torch.no_grad():
                run["eager"] = python_pool(
                    lambda batch: recommend(model, batch, TOP_K), batches, workers, threads
                )
                run["package-python"] = python_pool(served.recommend, batches, workers, threads)
            run["package-cpp"] = run_cpp(program, package, requests, batch_size, workers, threads)
            results["runs"].append(run)
            print(json.dumps(run), flush=True)
    write(results, out)


SYSTEMS = ("eager", "package-python", "package-cpp")


def write(results: dict, out: str) -> None:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "deploy.json"), "w") as f:
        json.dump(results, f, indent=1)
    lines = [
        "# The deployed recommender: C++ program vs eager Python",
        "",
        results["machine"],
        "",
        f"HSTU (the main job's model), {results['users']} ML-100K users, top-{TOP_K}; "
        "latency per batch in ms; `python benchmarks/deploy.py`.",
        "",
        "| workers x threads | users a batch | system | p50 | p90 | p99 | users/s | vs eager |",
        "|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for run in results["runs"]:
        eager = run["eager"]["users_per_second"]
        for system in SYSTEMS:
            r, lat = run[system], run[system]["latency_ms"]
            lines.append(
                f"| {run['workers']} x {run['threads']} | {run['batch_size']} | {system} | "
                f"{lat['p50']:.2f} | {lat['p90']:.2f} | {lat['p99']:.2f} | "
                f"{r['users_per_second']:.0f} | {r['users_per_second'] / eager:.2f}x |"
            )
    with open(os.path.join(out, "deploy.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {out}/deploy.md")


if __name__ == "__main__":
    main()
