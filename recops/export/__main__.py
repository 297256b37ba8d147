"""Export a trained checkpoint (``python -m recops.train --checkpoint PATH``) and compile it
ahead of time into an AOTInductor package that examples/cpp_serving serves (docs/deploy.md).

Usage: python -m recops.export --checkpoint PATH --out model.pt2 [--k 10] [--item-table int8]
"""

from __future__ import annotations

import argparse
import pathlib

from recops.export.package import package_recommender
from recops.serve import load_model
from recops.serving.item_table import ITEM_TABLES


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=pathlib.Path, required=True)
    parser.add_argument("--out", type=pathlib.Path, required=True, help="the package (.pt2)")
    parser.add_argument("--k", type=int, default=10, help="items answered a user")
    parser.add_argument("--item-table", choices=ITEM_TABLES, default="fp32")
    args = parser.parse_args(argv)
    if args.out.suffix != ".pt2":
        parser.error(f"--out must name a .pt2 file, got {args.out}")
    model = load_model(args.checkpoint)
    path = package_recommender(model, args.out, args.k, args.item_table)
    config = model.config
    print(
        f"{path}: {config.model}, max_seq_len {config.max_seq_len}, "
        f"{config.num_items} items, top-{args.k}, {args.item_table} item table"
    )


if __name__ == "__main__":
    main()
