"""Shared benchmark machinery: timing, the machine's measured limits, and result rows.

Every suite (benchmarks/suites/<family>.py) defines ``run(limits) -> list[Row]``; run.py measures
the limits once, runs every suite in one process and prints/saves one table.
"""

import statistics
import time
from dataclasses import asdict, dataclass, field

import torch


def median_time(fn, *, warmup: int = 3, min_runs: int = 5, min_seconds: float = 0.3) -> float:
    """Median wall time of fn() in seconds over at least min_runs runs and min_seconds."""
    for _ in range(warmup):
        fn()
    times = []
    start = time.perf_counter()
    while len(times) < min_runs or time.perf_counter() - start < min_seconds:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if len(times) >= 1000:
            break
    return statistics.median(times)


@dataclass
class Limits:
    copy_gbps: float  # large tensor copy, bytes read + written per second / 1e9
    matmul_gflops: float  # large fp32 matmul
    threads: int


def measure_limits() -> Limits:
    n = 64 * 1024 * 1024  # 256 MiB of fp32, well past the caches
    src = torch.ones(n)
    dst = torch.empty_like(src)
    copy_s = median_time(lambda: dst.copy_(src), min_runs=10)
    m = 2048
    a, b = torch.randn(m, m), torch.randn(m, m)
    mm_s = median_time(lambda: torch.mm(a, b), min_runs=5)
    return Limits(
        copy_gbps=2 * src.numel() * 4 / copy_s / 1e9,
        matmul_gflops=2 * m**3 / mm_s / 1e9,
        threads=torch.get_num_threads(),
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
