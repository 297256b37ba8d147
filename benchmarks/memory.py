"""Peak extra host memory of a call, from the kernel's peak-RSS counter.

During a measurement glibc serves blocks from 128 KiB up with mmap (returned to the OS on free),
the peak RSS is reset (/proc/self/clear_refs) and compared to the RSS before the call. Afterwards
the mmap threshold goes to glibc's largest dynamic value (32 MiB), so that later timings do not
pay a page fault per mid-sized allocation. Linux-only; returns 0.0 where the counters are
unavailable.
"""

import ctypes
import gc

_M_MMAP_THRESHOLD = -3
_MEASURE_THRESHOLD = 128 * 1024
_TIMING_THRESHOLD = 32 * 1024 * 1024

try:
    _libc = ctypes.CDLL("libc.so.6")
except OSError:
    _libc = None


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
        if _libc is not None:
            _libc.mallopt(_M_MMAP_THRESHOLD, _MEASURE_THRESHOLD)
            _libc.malloc_trim(0)
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
        if _libc is not None:
            _libc.mallopt(_M_MMAP_THRESHOLD, _TIMING_THRESHOLD)
