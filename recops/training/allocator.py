"""The training process's allocator: glibc keeps freed memory for reuse instead of returning it to
the OS, as the caching allocators that tuned CPU deployments preload (jemalloc, tcmalloc) do.

glibc's default maps blocks above a dynamic threshold (up to 32 MiB) with mmap and unmaps them on
free, and returns the free top of its heap to the OS: a training step's large tensors (the
layers' activations and gradients, the attention's scratch) then cost a page fault and the
zeroing of a page per 4 KiB on every step. On a 2-core Xeon at ML-100K sizes that was 2,500-4,400
faults and 6 ms of system time per recops HSTU step, which took 75 ms then and 70 ms with this
setting (benchmarks/step_ratio.py measures with it, as benchmarks/run.py does). The price is a
resident size that stays at the process's peak, which a training process reaches every step
anyway.
"""

from __future__ import annotations

import ctypes

_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_NEVER_TRIM = 2**31 - 1


def keep_freed_memory() -> bool:
    """Serves every block from glibc's heap (no mmapped blocks) and never trims it, for the rest
    of the process. Returns False, changing nothing, where the C library is not glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, _NEVER_TRIM))
