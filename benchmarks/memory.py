"""The benchmark process's allocator, in two modes: steady for timings, fresh for peak memory.

Timings (use_steady_allocator, set when a suite starts): glibc serves every block from its heap and
never returns freed memory to the OS. Its default hands blocks over a dynamic threshold (up to
32 MiB) to mmap and unmaps them on free, so a large output costs a page fault and a page zeroing
per 4 KiB on every call, or not, depending on which sizes the process allocated earlier: the
same call measured 2.5 ms or 12.8 ms in one process or the next, whichever library made it. In
steady mode every call reuses memory, as under the caching allocators (jemalloc, tcmalloc)
tuned deployments use, and a timing measures the op instead of the OS.

Peak extra memory (peak_extra_bytes): blocks from 128 KiB up are mmapped (returned to the OS on
free), the heap is trimmed and the kernel's peak-RSS counter is reset (/proc/self/clear_refs)
and compared to the RSS before the call; then the steady mode returns. Linux/glibc-only;
elsewhere timings run with the default allocator and peaks read 0.0.
"""

import ctypes
import gc

from recops.training.allocator import keep_freed_memory

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_MMAP_MAX = -4
_MEASURE_THRESHOLD = 128 * 1024
_GLIBC_MMAP_MAX = 65536  # glibc's default M_MMAP_MAX

try:
    _libc = ctypes.CDLL("libc.so.6")
    _libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
except (OSError, AttributeError):
    _libc = None


def use_steady_allocator() -> None:
    """Timing mode: no mmapped blocks, no trimming (freed memory stays mapped for reuse), the
    setting recops.train runs with (recops/training/allocator.py)."""
    keep_freed_memory()


def _use_fresh_allocator() -> None:
    """Peak-memory mode: blocks from 128 KiB up come from (and return to) the OS."""
    if _libc is not None:
        _libc.mallopt(_M_MMAP_MAX, _GLIBC_MMAP_MAX)
        _libc.mallopt(_M_MMAP_THRESHOLD, _MEASURE_THRESHOLD)
        _libc.mallopt(_M_TRIM_THRESHOLD, _MEASURE_THRESHOLD)
        _libc.malloc_trim(0)


def _status_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1])
    raise KeyError(field)


def peak_extra_bytes(fn) -> float:
    """Runs fn() once; returns its peak resident memory above the memory in use before it."""
    try:
        gc.collect()
        _use_fresh_allocator()
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        before = _status_kib("VmRSS:")
        result = fn()
        peak = _status_kib("VmHWM:")
        del result
        return max(0, peak - before) * 1024.0
    except (OSError, KeyError):
        return 0.0
    finally:
        use_steady_allocator()
