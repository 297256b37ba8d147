"""Loads the compiled operator library, which registers every op in ``torch.ops.recops``."""

import glob
import os

import torch


def load() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = sorted(glob.glob(os.path.join(here, "_C*.so")))
    if not candidates:
        raise ImportError(
            "recops' compiled library (recops/_C*.so) is missing: build it with `make build` or "
            "`pip install --no-build-isolation .`"
        )
    torch.ops.load_library(candidates[0])
    return candidates[0]
