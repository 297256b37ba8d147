"""Shared benchmark machinery: timing, the machine's measured limits, and result rows.

Every suite (benchmarks/suites/<family>.py) defines ``run(limits) -> list[Row]``; run.py measures
the limits once, runs every suite in one process and prints/saves one table.
"""

import contextlib
import gc
import math
import os
import statistics
import time
from dataclasses import asdict, dataclass, field

import torch
from memory import peak_extra_bytes


@contextlib.contextmanager
def no_garbage_collection():
    """Timings run with Python's cyclic garbage collector off, as `timeit` runs them: a
    collection that lands inside a timed call scans every object the interpreter holds (torch's
    modules included) and charges that to whichever implementation happened to be running."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def median_time(fn, *, warmup: int = 3, min_runs: int = 5, min_seconds: float = 0.3) -> float:
    """Median wall time of fn() in seconds over at least min_runs runs and min_seconds."""
    for _ in range(warmup):
        fn()
    times = []
    start = time.perf_counter()
    with no_garbage_collection():
        while len(times) < min_runs or time.perf_counter() - start < min_seconds:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
            if len(times) >= 1000:
                break
    return statistics.median(times)


def compare_times(
    fns: dict, *, warmup: int = 2, min_runs: int = 7, min_seconds: float = 0.3, max_runs: int = 500
) -> dict:
    """Median wall time in seconds of every fn in `fns` (name -> callable), measured in interleaved
    rounds (each round runs every fn once, in rotating order), so that load from other processes
    lands on all implementations alike instead of on whichever ran during a busy spell."""
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    times = {name: [] for name in names}
    start = time.perf_counter()
    rounds = 0
    with no_garbage_collection():
        while rounds < min_runs or time.perf_counter() - start < min_seconds:
            for i in range(len(names)):
                name = names[(rounds + i) % len(names)]
                t0 = time.perf_counter()
                fns[name]()
                times[name].append(time.perf_counter() - t0)
            rounds += 1
            if rounds >= max_runs:
                break
    return {name: statistics.median(ts) for name, ts in times.items()}


def _cpu_seconds():
    """(seconds all CPUs spent busy, seconds this process spent on CPU) since boot / start."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:9]]
    hz = os.sysconf("SC_CLK_TCK")
    own = os.times()
    return (sum(ticks) - ticks[3] - ticks[4]) / hz, own.user + own.system


def others_load(fn):
    """Runs fn() and returns (its result, the CPU load other processes put on this machine
    meanwhile, in cores' worth: 0 = quiet, 1 = one core fully taken). Unknown (0) without /proc."""
    try:
        busy0, own0 = _cpu_seconds()
    except (OSError, ValueError):
        return fn(), 0.0
    start = time.perf_counter()
    result = fn()
    wall = time.perf_counter() - start
    busy1, own1 = _cpu_seconds()
    return result, max(0.0, (busy1 - busy0) - (own1 - own0)) / max(wall, 1e-9)


def wait_for_quiet(max_load: float = 0.1, timeout: float = 2.0, interval: float = 0.1) -> float:
    """Waits (up to `timeout` s) until other processes leave the CPUs mostly idle; returns the last
    load seen (cores' worth)."""
    deadline = time.perf_counter() + timeout
    while True:
        _, load = others_load(lambda: time.sleep(interval))
        if load <= max_load or time.perf_counter() >= deadline:
            return load


def measure_quietly(
    fns: dict, *, attempts: int = 2, max_load: float = 0.15, wait: float = 1.0, **kwargs
):
    """compare_times(fns) on a shared machine: measures up to `attempts` times (each after waiting
    up to `wait` s for quiet) until other processes stayed below `max_load` cores' worth during the
    measurement, and keeps the attempt they disturbed least. Returns (times, that attempt's load).

    BENCH_PATIENCE=<seconds> keeps retrying each measurement for up to that long instead (waiting
    up to 20 s for quiet each time): slower, but on a busy machine the only way to clean numbers.
    """
    patience = float(os.environ.get("BENCH_PATIENCE", "0"))
    deadline = time.perf_counter() + patience
    best = None
    tries = 0
    while True:
        wait_for_quiet(timeout=min(20.0, max(wait, deadline - time.perf_counter())))
        times, load = others_load(lambda: compare_times(fns, **kwargs))
        tries += 1
        if best is None or load < best[1]:
            best = (times, load)
        out_of_tries = time.perf_counter() >= deadline if patience > 0 else tries >= attempts
        if load <= max_load or out_of_tries:
            return best


def geomean(values) -> float:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def measure_case(suite: str, name: str, fns: dict, bytes_moved: float, order) -> list:
    """Times a case's implementations side by side (measure_quietly) and returns a Row each;
    each compares itself with the implementations after it in ``order``."""
    times, load = measure_quietly(fns, min_seconds=0.3)
    if load > 0.3:
        print(f"  noisy: {name} measured while others used {load:.1f} cores; rerun it")
    rows = []
    for impl in fns:
        compare = [
            b for b in order if b in fns and impl in order and order.index(b) > order.index(impl)
        ]
        extra = {"compare_to": compare, "others_load": round(load, 2)}
        rows.append(Row(suite, name, impl, times[impl], bytes_moved, extra=extra))
    return rows


def print_speedups(suite: str, rows, baselines=("fbgemm", "torch")) -> None:
    """Prints recops' geomean and minimum speed-up over each baseline across a suite's cases."""
    speedups = {}
    for r in rows:
        if r.impl == "recops":
            base = {b.impl: b.seconds for b in rows if b.case == r.case}
            for impl in baselines:
                if impl in base:  # ops FBGEMM has no CPU kernel for have no fbgemm row
                    speedups.setdefault(impl, []).append(base[impl] / r.seconds)
    for impl, vals in speedups.items():
        print(f"{suite}: recops vs {impl}: geomean {geomean(vals):.2f}x, min {min(vals):.2f}x")


def results_dir() -> str:
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    os.makedirs(path, exist_ok=True)
    return path


@dataclass
class Limits:
    copy_gbps: float  # large tensor copy, bytes read + written per second / 1e9
    copy_1thread_gbps: float  # the same copy on one thread
    matmul_gflops: float  # large fp32 matmul, the faster of MKL (torch.mm) and oneDNN
    threads: int
    matmul_bf16_gflops: float = 0.0  # large bf16 matmul (fp32 accumulation), torch.mm / oneDNN
    cpu: str = ""  # the CPU's model and its bf16 matrix units (cpu_description)


def cpu_description() -> str:
    """The CPU's model name and whether it has AMX bf16 tiles: the workplace's machines differ
    from run to run (an AMX CPU's bf16 matmul is several times its AVX512_BF16-only peers'), so a
    table names the machine it was measured on."""
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read()
    except OSError:
        return "unknown CPU"
    fields = {}
    for line in info.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    model = fields.get("model name", "unknown CPU")
    flags = fields.get("flags", "").split()
    units = [f for f in ("avx512_bf16", "amx_bf16") if f in flags]
    return f"{model} ({', '.join(units) or 'no bf16 dot products'})"


def _matmul_gflops(m, dtype):
    """GFLOP/s of the faster of PyTorch's GEMMs for [m, m] x [m, m] in `dtype`: torch.mm (fp32:
    MKL's sgemm, its AVX2 path on AMD CPUs; bf16: oneDNN where the CPU has bf16 dot products) and
    oneDNN's linear (the library recops' attention tiles run on), which on AVX-512 AMD CPUs is
    about twice as fast for fp32."""
    a, b = torch.randn(m, m).to(dtype), torch.randn(m, m).to(dtype)
    fns = {"mm": lambda: torch.mm(a, b)}
    if torch.backends.mkldnn.is_available():
        a_dnnl, b_dnnl = a.to_mkldnn(), b.t().contiguous().to_mkldnn()
        fns["onednn"] = lambda: torch._C._nn.mkldnn_linear(a_dnnl, b_dnnl)
    return 2 * m**3 / min(measure_quietly(fns, min_runs=5)[0].values()) / 1e9


def measure_limits() -> Limits:
    n = 64 * 1024 * 1024  # 256 MiB of fp32, well past the caches
    src = torch.ones(n)
    dst = torch.empty_like(src)
    # Other processes only ever slow these down: retry while they were busy (measure_quietly).
    copy_s = measure_quietly({"copy": lambda: dst.copy_(src)}, attempts=3, min_runs=10)[0]["copy"]
    # One thread's copy rate next to both threads': on this workplace's 2-vCPU machines the ratio
    # tells whether the two vCPUs sit on separate memory paths (about 2x) or share one (about
    # 1.1x), which caps what any parallel memory-bound kernel gains over a single-threaded one.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    copy_1thread_s = measure_quietly({"copy": lambda: dst.copy_(src)}, attempts=3, min_runs=10)[0][
        "copy"
    ]
    torch.set_num_threads(threads)
    return Limits(
        copy_gbps=2 * src.numel() * 4 / copy_s / 1e9,
        copy_1thread_gbps=2 * src.numel() * 4 / copy_1thread_s / 1e9,
        matmul_gflops=_matmul_gflops(2048, torch.float32),
        threads=torch.get_num_threads(),
        matmul_bf16_gflops=_matmul_gflops(2048, torch.bfloat16),
        cpu=cpu_description(),
    )


@dataclass
class Row:
    """One measured implementation of one case. `baseline` names the row this one is compared to
    (same suite, same case); `bytes_moved` / `flops` give achieved GB/s / GFLOP/s."""

    suite: str
    case: str
    impl: str
    seconds: float
    bytes_moved: float = 0.0
    flops: float = 0.0
    peak_bytes: float = 0.0
    extra: dict = field(default_factory=dict)

    def as_dict(self):
        return asdict(self)


def outputs(out):
    """An impl's result as a tuple of tensors (ops like the layer input return several)."""
    return tuple(out) if isinstance(out, tuple | list) else (out,)


def check_matches(reference, candidate, dtype, case):
    """Correctness guard before timing: candidate() matches reference() on the benchmark inputs,
    output by output, to a tolerance relative to the output's magnitude (fp32: 1e-4, lower
    precisions: 3e-2)."""
    with torch.no_grad():
        pairs = zip(outputs(reference()), outputs(candidate()), strict=True)
        for expected, actual in pairs:
            expected, actual = expected.float(), actual.float()
            tol = 1e-4 if dtype == torch.float32 else 3e-2
            scale = expected.abs().max().item() + 1e-6
            assert (actual - expected).abs().max().item() <= tol * scale, case


def _recops_baselines(fp32_case, phase):
    """compare_to of a recops row of measure_fwd_bwd: the reference, and recops on fp32_case."""
    same_work = [["recops", f"{fp32_case} {phase}", "recops float32"]] if fp32_case else []
    return ["reference", *same_work]


def measure_fwd_bwd(
    suite, case, impls, leaves, dtype, fwd_flops, bwd_flops_factor, fp32_case=None, check=True
):
    """Rows for each of impls ({"reference": fn, "recops": fn}, recops compared to the
    reference): fn() forward (no grad) and forward + backward to `leaves`, with time, FLOPs and
    peak extra memory; the backward's FLOPs are bwd_flops_factor times the forward's. Checks
    first that recops matches the reference (check_matches) unless `check` is False (impls that
    draw different random numbers, which the caller checks without them). Rows record the dtype
    (the table rates a bf16 row against the bf16 matmul limit). fp32_case: the case measured on
    the same inputs in float32, whose recops rows the recops rows here are also compared to (so a
    bf16 row says its speed-up over recops' own fp32 on identical work)."""
    if check:
        check_matches(impls["reference"], impls["recops"], dtype, case)
    rows = []
    for impl, fn in impls.items():

        def forward(fn=fn):
            with torch.no_grad():
                return fn()

        def forward_backward(fn=fn):
            outs = outputs(fn())
            return torch.autograd.grad(outs, leaves, [torch.ones_like(o) for o in outs])

        rows += [
            Row(
                suite=suite,
                case=f"{case} {phase}",
                impl=impl,
                seconds=median_time(call, warmup=1, min_runs=3, min_seconds=0.5),
                flops=flops,
                peak_bytes=peak_extra_bytes(call),
                extra={
                    "compare_to": _recops_baselines(fp32_case, phase) if impl == "recops" else [],
                    "dtype": str(dtype).split(".")[-1],
                },
            )
            for phase, call, flops in (
                ("fwd", forward, fwd_flops),
                ("fwd+bwd", forward_backward, (1 + bwd_flops_factor) * fwd_flops),
            )
        ]
    return rows
