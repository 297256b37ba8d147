"""The int_nbit suite's cases with FBGEMM's quantized CPU forward at its best thread setting on
this machine: FBGEMM_TBE_MAX_NUM_THREADS = torch's thread count and
FBGEMM_TBE_MIN_TABLES_PER_THREAD = 1 (FBGEMM reads both once per process, at its first forward;
each suite runs in a process of its own, and this one sets them on import, before any forward)."""

import os

import torch

os.environ["FBGEMM_TBE_MAX_NUM_THREADS"] = str(torch.get_num_threads())
os.environ["FBGEMM_TBE_MIN_TABLES_PER_THREAD"] = "1"

from suites.int_nbit import run  # noqa: E402

__all__ = ["run"]
