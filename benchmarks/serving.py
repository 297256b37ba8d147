"""A served recommender under MLPerf LoadGen (the harness MLPerf's DLRMv3 reference uses):
recops' cached path (recops.serving.CachedRecommender) against the full recompute of every
request on recops' ops and on the plain-PyTorch backend (recops.models.recommend.recommend), on a
synthetic stream of returning users.

Workload: `--users` users with histories log-uniform in [--min-history, --max-history] events; each
query is a user's next visit: 1 to 8 new events, then a top-10 request at a time after the last
one. A query's user is fixed by its sample index; the events a visit brings are drawn when it is
served, so every system serves the same kind of visits whatever order LoadGen issues them in.
Scenarios: Offline (all queries at once; throughput) and Server (Poisson arrivals): for each
system, a search for the highest QPS whose p99 latency stays under --target-p99-ms, with
latency percentiles of every QPS tried.

Systems: `cached` (recops.serving.CachedRecommender on recops' delta op), `cached-aoti` (the
same with its delta step run from an AOTInductor package, recops.export.load_delta_step),
`cached-torch` (the same cache with the plain-PyTorch cached reference standing for
generative-recommenders' pytorch_cached_hstu_mha, recops/serving/torch_delta_attention.py),
`recompute` (the whole history on recops' ops) and `torch` (the whole history on the plain-PyTorch
backend). Before LoadGen, the latency of one request of a user with 200 and 4096 events encoded
and 8 new ones, per system.

Usage: python benchmarks/serving.py [--quick] [--target-p99-ms MS] [--out DIR]
                                    [--systems cached,cached-aoti,cached-torch,recompute,torch]
                                    [--latency-only] [--latency-repeats N]
Writes benchmarks/results/serving.json, serving.md and serving.png (latency vs QPS), or into
DIR; --quick writes them to a temporary folder.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import queue
import re
import statistics
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.dirname(HERE))  # the repository root: recops built in place

import mlperf_loadgen as lg  # noqa: E402
import torch  # noqa: E402
from harness import measure_limits  # noqa: E402

from recops.export import load_delta_step, package_delta_step  # noqa: E402
from recops.models import ModelConfig, SequentialRecommender  # noqa: E402
from recops.models.recommend import recommend  # noqa: E402
from recops.serving import CachedRecommender  # noqa: E402

RESULTS = os.path.join(HERE, "results")
TOP_K = 10
MAX_NEW_EVENTS = 8
SYSTEMS = ("cached", "cached-aoti", "cached-torch", "recompute", "torch")
# Single-request latency: history lengths (ML-100K's users have at most a few hundred events).
LATENCY_HISTORIES = (200, 4096)


class Users:
    """The synthetic users: ``count`` slots, each a returning user with a history (kept by every
    system alike) and a stream of visits drawn from the slot's generator. A user whose history
    would outgrow ``max_events`` (the model's window, past which no system can cache it) leaves,
    and a new user with a history as long as the slot's first takes the slot: its first request
    brings its whole history."""

    def __init__(
        self, count: int, min_history: int, max_history: int, num_items: int, max_events: int,
        seed=0, new_events: int | None = None,
    ):  # fmt: skip
        self.num_items, self.max_events = num_items, max_events
        self.new_events = new_events  # per visit; None: 1 to MAX_NEW_EVENTS
        gen = torch.Generator().manual_seed(seed)
        log_lengths = torch.empty(count).uniform_(
            math.log(min_history), math.log(max_history), generator=gen
        )
        self.lengths = log_lengths.exp().round().long().tolist()
        self._visits = [torch.Generator().manual_seed(seed + 1 + u) for u in range(count)]
        self.ids = list(range(count))  # the user in each slot
        self.histories = [self._history(slot) for slot in range(count)]

    def _history(self, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen, length = self._visits[slot], self.lengths[slot]
        items = torch.randint(1, self.num_items + 1, (length,), generator=gen)
        times = torch.cumsum(torch.randint(0, 3600, (length,), generator=gen), 0)
        return items, times

    def visit(self, slot: int) -> tuple[int, torch.Tensor, torch.Tensor, int]:
        """The next visit to ``slot``: its user, the events the visit brings (the whole history
        of a user new in the slot) and the request time; appended to the slot's history."""
        gen = self._visits[slot]
        n = self.new_events or int(torch.randint(1, MAX_NEW_EVENTS + 1, (1,), generator=gen))
        items, times = self.histories[slot]
        fresh = items.numel() + n > self.max_events
        if fresh:
            self.ids[slot] += len(self.ids)
            items, times = self._history(slot)
        new_items = torch.randint(1, self.num_items + 1, (n,), generator=gen)
        new_times = times[-1] + torch.cumsum(torch.randint(0, 3600, (n,), generator=gen), 0)
        self.histories[slot] = (torch.cat([items, new_items]), torch.cat([times, new_times]))
        brought = self.histories[slot] if fresh else (new_items, new_times)
        return self.ids[slot], *brought, int(new_times[-1]) + 60


class Recompute:
    """Every request re-encodes the user's whole history (recops.models.recommend.recommend)."""

    def __init__(self, model, users: Users):
        self.model, self.users = model, users

    def serve(self, slots: list[int]) -> None:
        times = [self.users.visit(s)[3] for s in slots]
        recommend(self.model, [self.users.histories[s] for s in slots], TOP_K, request_times=times)


class Cached:
    """recops.serving.CachedRecommender: a visit's events are appended and encoded with the
    request in one pass. Every history is observed (encoded and cached) before the test."""

    def __init__(
        self, model, users: Users, cache_bytes: int, attention: str = "recops", aoti: bool = False
    ):
        self.users = users
        self.served = CachedRecommender(model, cache_bytes, attention=attention)
        if aoti:  # the delta step from its AOTInductor package (recops.export)
            load_delta_step(self.served, _delta_step_package(self.served))
        everyone = list(range(len(users.histories)))
        for start in range(0, len(everyone), 8):
            batch = everyone[start : start + 8]
            self.served.observe(batch, [users.histories[u] for u in batch])

    def serve(self, slots: list[int]) -> None:
        visits = [self.users.visit(s) for s in slots]
        user_ids = [user for user, _, _, _ in visits]
        self.served.observe(
            user_ids, [(items, times) for _, items, times, _ in visits], encode=False
        )
        self.served.recommend(user_ids, TOP_K, request_times=[v[3] for v in visits])


class LoadGenSUT:
    """LoadGen's system under test: queries queue up; one worker serves them in batches of
    distinct users (at most ``max_batch``) and reports each sample complete."""

    def __init__(self, system, num_users: int, max_batch: int):
        self.system, self.num_users, self.max_batch = system, num_users, max_batch
        self.pending: queue.Queue = queue.Queue()
        self.worker = threading.Thread(target=self._serve_forever, daemon=True)
        self.worker.start()
        self.sut = lg.ConstructSUT(self._issue, lambda: None)

    def _issue(self, samples) -> None:
        for sample in samples:
            self.pending.put(sample)

    def _serve_forever(self) -> None:
        held = []
        while True:
            if not held:
                held.append(self.pending.get())
            while not self.pending.empty():
                held.append(self.pending.get())
            batch, users, rest = [], set(), []
            for sample in held:
                user = sample.index % self.num_users
                if user in users or len(batch) == self.max_batch:
                    rest.append(sample)
                else:
                    batch.append(sample)
                    users.add(user)
            held = rest
            self.system.serve([s.index % self.num_users for s in batch])
            lg.QuerySamplesComplete([lg.QuerySampleResponse(s.id, 0, 0) for s in batch])


def run_loadgen(sut: LoadGenSUT, settings, count: int) -> dict:
    qsl = lg.ConstructQSL(count, count, lambda s: None, lambda s: None)
    with tempfile.TemporaryDirectory() as out:
        log = lg.LogSettings()
        log.log_output.outdir = out
        log.log_output.copy_summary_to_stdout = False
        lg.StartTestWithLogSettings(sut.sut, qsl, settings, log)
        with open(os.path.join(out, "mlperf_log_summary.txt")) as f:
            summary = f.read()
    lg.DestroyQSL(qsl)

    def number(label):
        match = re.search(rf"^{re.escape(label)}\s*:\s*([0-9.e+]+)", summary, re.M)
        return float(match.group(1)) if match else float("nan")

    return {
        "valid": "Result is : VALID" in summary,
        "qps": number("Completed samples per second")
        if "Server" in summary
        else number("Samples per second"),
        "p50_ms": number("50.00 percentile latency (ns)") / 1e6,
        "p90_ms": number("90.00 percentile latency (ns)") / 1e6,
        "p99_ms": number("99.00 percentile latency (ns)") / 1e6,
    }


def offline(sut, count: int, seconds: float) -> dict:
    settings = lg.TestSettings()
    settings.scenario = lg.TestScenario.Offline
    settings.mode = lg.TestMode.PerformanceOnly
    settings.offline_expected_qps = 1.0
    settings.min_query_count = count
    settings.min_duration_ms = int(seconds * 1000)
    return run_loadgen(sut, settings, count)


def server(sut, qps: float, target_ms: float, count: int, seconds: float) -> dict:
    settings = lg.TestSettings()
    settings.scenario = lg.TestScenario.Server
    settings.mode = lg.TestMode.PerformanceOnly
    settings.server_target_qps = qps
    settings.server_target_latency_ns = int(target_ms * 1e6)
    settings.server_target_latency_percentile = 0.99
    settings.min_query_count = count
    settings.min_duration_ms = int(seconds * 1000)
    return {"target_qps": qps, **run_loadgen(sut, settings, count)}


def peak_server_qps(sut, start_qps: float, target_ms: float, count: int, seconds: float, steps):
    """The highest Server QPS with p99 <= target_ms: the Offline throughput if it passes, else
    halving until a rate passes, then bisecting between the last pass and the first failure."""
    passed, failed, tried = 0.0, start_qps, []
    qps = start_qps
    for _ in range(steps):
        result = server(sut, qps, target_ms, count, seconds)
        tried.append(result)
        ok = result["p99_ms"] <= target_ms
        print(
            f"    server {qps:8.2f} QPS: p50 {result['p50_ms']:.1f} ms, "
            f"p99 {result['p99_ms']:.1f} ms {'ok' if ok else 'over target'}",
            flush=True,
        )
        if ok:
            passed = qps
            if qps == start_qps:
                break
        else:
            failed = qps
        qps = (passed + failed) / 2 if passed else failed / 2
    return passed, tried


_packages: dict[int, str] = {}


def _delta_step_package(served) -> str:
    """The AOTInductor package of ``served``'s delta step, compiled once per model (every
    server here has the same cache layout)."""
    key = id(served.model)
    if key not in _packages:
        _packages[key] = package_delta_step(served, os.path.join(tempfile.mkdtemp(), "step.pt2"))
    return _packages[key]


def make_system(name: str, recops_model, torch_model, users: Users):
    if name == "cached":
        return Cached(recops_model, users, cache_bytes=1 << 30)
    if name == "cached-aoti":
        return Cached(recops_model, users, cache_bytes=1 << 30, aoti=True)
    if name == "cached-torch":
        return Cached(recops_model, users, cache_bytes=1 << 30, attention="torch")
    if name == "recompute":
        return Recompute(recops_model, users)
    if name == "torch":
        return Recompute(torch_model, users)
    raise SystemExit(f"--systems: unknown system {name!r} ({', '.join(SYSTEMS)})")


def request_latency(recops_model, torch_model, history: int, repeats: int, systems) -> dict:
    """Median milliseconds of one request (a visit of MAX_NEW_EVENTS events, then top-k) of a
    user with ``history`` events encoded before, on each of ``systems``; a fresh user per repeat,
    so every request meets the same history length."""
    medians = {}
    for name in systems:
        config = recops_model.config
        users = Users(
            repeats, history, history, config.num_items, config.max_seq_len - 1, seed=history,
            new_events=MAX_NEW_EVENTS,
        )  # fmt: skip
        system = make_system(name, recops_model, torch_model, users)
        times = []
        for user in range(repeats):
            start = time.perf_counter()
            system.serve([user])
            times.append(time.perf_counter() - start)
        medians[name] = 1e3 * statistics.median(times)
    return medians


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--latency-repeats", type=int, default=5)
    parser.add_argument(
        "--latency-only",
        action="store_true",
        help="one request's latency on --systems only (no LoadGen runs); prints, writes nothing",
    )
    parser.add_argument("--users", type=int, default=64)
    parser.add_argument("--min-history", type=int, default=64)
    parser.add_argument("--max-history", type=int, default=4096)
    parser.add_argument("--target-p99-ms", type=float, default=50.0)
    parser.add_argument("--seconds", type=float, default=10.0, help="LoadGen's min duration")
    parser.add_argument("--steps", type=int, default=5, help="Server QPS search steps")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: check it runs")
    parser.add_argument(
        "--out",
        default=RESULTS,
        help="folder for serving.json / .md / .png (a temporary one with --quick)",
    )
    args = parser.parse_args()
    if args.quick:
        args.users, args.min_history, args.max_history = 8, 8, 64
        args.seconds, args.steps = 1.0, 2
    limits = measure_limits()
    machine = (
        f"machine: {limits.cpu}, {limits.threads} threads, copy {limits.copy_gbps:.1f} GB/s,"
        f" fp32 matmul {limits.matmul_gflops:.1f} GFLOP/s"
    )
    print(machine, flush=True)
    # Room for every visit's events without sliding the window (the cache's exact regime).
    max_seq_len = args.max_history + 64 * MAX_NEW_EVENTS
    config = ModelConfig(
        model="hstu",
        num_items=10_000,
        max_seq_len=max_seq_len,
        dim=64,
        num_layers=2,
        num_heads=2,
        attention_dim=32,
        linear_dim=32,
        dropout=0.0,
    )
    torch.manual_seed(0)
    recops_model = SequentialRecommender(config).eval()
    torch_model = SequentialRecommender(config, backend="torch").eval()
    torch_model.load_state_dict(recops_model.state_dict(), strict=False)
    results = {"machine": machine, "target_p99_ms": args.target_p99_ms, "systems": {}}
    histories = [min(h, args.max_history) for h in LATENCY_HISTORIES]
    results["latency_ms"] = {}
    systems = args.systems.split(",") if args.latency_only else SYSTEMS
    for history in histories:
        latency = request_latency(recops_model, torch_model, history, args.latency_repeats, systems)
        results["latency_ms"][history] = latency
        print(
            f"one request, {history} events + {MAX_NEW_EVENTS} new: "
            + ", ".join(f"{name} {ms:.1f} ms" for name, ms in latency.items()),
            flush=True,
        )
    if args.latency_only:
        return
    for name in args.systems.split(","):
        users = Users(
            args.users, args.min_history, args.max_history, config.num_items, max_seq_len - 1
        )
        system = make_system(name, recops_model, torch_model, users)
        sut = LoadGenSUT(system, args.users, max_batch=16)
        count = max(2 * args.users, 32)
        print(f"{name}:", flush=True)
        throughput = offline(sut, count, args.seconds)
        print(f"    offline {throughput['qps']:.2f} QPS", flush=True)
        peak, tried = peak_server_qps(
            sut, throughput["qps"], args.target_p99_ms, count, args.seconds, args.steps
        )
        results["systems"][name] = {"offline": throughput, "server_peak_qps": peak, "server": tried}
    write(results, tempfile.mkdtemp() if args.quick else args.out)


def write(results: dict, out: str) -> None:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "serving.json"), "w") as f:
        json.dump(results, f, indent=1)
    lines = [
        results["machine"],
        "",
        f"p99 target {results['target_p99_ms']} ms",
        "",
        "| system | offline QPS | server QPS at p99 target |",
        "|---|---:|---:|",
    ]
    for name, r in results["systems"].items():
        lines.append(f"| {name} | {r['offline']['qps']:.2f} | {r['server_peak_qps']:.2f} |")
    lines += [
        "",
        f"One request (a visit of {MAX_NEW_EVENTS} new events, then top-{TOP_K}), median ms, and "
        "the full recompute's time over the cached path's:",
        "",
        "| history | " + " | ".join(SYSTEMS) + " | recompute / cached | torch / cached |",
        "|---:|" + "---:|" * (len(SYSTEMS) + 2),
    ]
    for history, ms in results["latency_ms"].items():
        lines.append(
            f"| {history} | "
            + " | ".join(f"{ms[name]:.1f}" for name in SYSTEMS)
            + f" | {ms['recompute'] / ms['cached']:.1f}x | {ms['torch'] / ms['cached']:.1f}x |"
        )
    for name, r in results["systems"].items():
        lines += ["", f"{name}, Server runs:", "", "| QPS | p50 ms | p90 ms | p99 ms |"]
        lines.append("|---:|---:|---:|---:|")
        for t in sorted(r["server"], key=lambda t: t["target_qps"]):
            lines.append(
                f"| {t['target_qps']:.2f} | {t['p50_ms']:.1f} | {t['p90_ms']:.1f} | "
                f"{t['p99_ms']:.1f} |"
            )
    with open(os.path.join(out, "serving.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, r in results["systems"].items():
        points = sorted((t["target_qps"], t["p99_ms"]) for t in r["server"])
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name)
    ax.axhline(results["target_p99_ms"], color="grey", linestyle="--", label="p99 target")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("Server QPS (Poisson arrivals)")
    ax.set_ylabel("p99 latency (ms)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, "serving.png"), dpi=120)
    print(f"written to {out}/serving.{{json,md,png}}")


if __name__ == "__main__":
    main()
