"""Serve a trained checkpoint (``python -m recops.train --checkpoint PATH``) with the cached
recommender (docs/serving.md), one JSON request a line on stdin, one JSON answer a line on stdout:

    {"observe": {"users": [7], "events": [[[3, 14, 15], [100, 200, 300]]]}}
    {"recommend": {"users": [7], "k": 10, "request_times": [400]}}

``observe`` appends each user's events (items, timestamps; oldest first) and answers
``{"observed": N}``; ``recommend`` answers ``{"items": [[...]], "scores": [[...]]}`` (the
request times are optional: default, each user's last event). A bad request is answered
``{"error": "..."}`` and changes nothing; the server goes on.

Usage: python -m recops.serve --checkpoint PATH [--cache-mib 256] [--cache-dtype bf16]
                              [--item-table int8]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
from collections.abc import Iterable
from typing import TextIO

import torch

from recops.models import ModelConfig, SequentialRecommender
from recops.serving import CachedRecommender
from recops.serving.item_table import ITEM_TABLES

CACHE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def load_model(checkpoint: pathlib.Path) -> SequentialRecommender:
    """The trained model of a ``recops.train`` checkpoint, in eval mode."""
    saved = torch.load(checkpoint, weights_only=False)
    model = SequentialRecommender(ModelConfig(**saved["run"]["model"]), backend=saved["run"]["ops"])
    model.load_state_dict(saved["trainer"]["model"])
    return model.eval()


def answer(served: CachedRecommender, request: dict) -> dict:
    """The answer to one request (see the module docstring)."""
    if set(request) == {"observe"}:
        body = request["observe"]
        served.observe(body["users"], [tuple(e) for e in body["events"]])
        return {"observed": len(body["users"])}
    if set(request) == {"recommend"}:
        body = request["recommend"]
        items, scores = served.recommend(
            body["users"], body.get("k", 10), request_times=body.get("request_times")
        )
        return {"items": items.tolist(), "scores": scores.tolist()}
    raise ValueError(
        f"a request is {{'observe': ...}} or {{'recommend': ...}}, got {list(request)}"
    )


def serve(served: CachedRecommender, lines: Iterable[str], out: TextIO) -> None:
    for line in lines:
        if not line.strip():
            continue
        try:
            reply = answer(served, json.loads(line))
        except (ValueError, KeyError, TypeError, RuntimeError) as error:
            reply = {"error": f"{type(error).__name__}: {error}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=pathlib.Path, required=True)
    parser.add_argument("--cache-mib", type=int, default=256, help="the key / value cache's size")
    parser.add_argument("--cache-dtype", choices=sorted(CACHE_DTYPES), default="fp32")
    parser.add_argument("--item-table", choices=ITEM_TABLES, default="fp32")
    args = parser.parse_args(argv)
    served = CachedRecommender(
        load_model(args.checkpoint),
        cache_bytes=args.cache_mib << 20,
        dtype=CACHE_DTYPES[args.cache_dtype],
        item_table=args.item_table,
    )
    serve(served, sys.stdin, sys.stdout)


if __name__ == "__main__":
    main()
