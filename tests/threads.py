"""Running a block with a given intra-op thread count: kernels chunk their work by thread count,
so some paths (per-chunk partials, phase hand-offs between threads) only run with several."""

import contextlib

import torch


@contextlib.contextmanager
def num_threads(n):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
