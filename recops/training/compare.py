"""Side by side: ``python -m recops.training.compare A/results.json B/results.json ...
[--out overlay.png]`` prints the runs' final metrics (and each one's difference to the first run)
and plots their loss and validation NDCG@10 curves on shared axes, e.g. one model on both op
backends, or the three models on one data set."""

from __future__ import annotations

import argparse
import json
import pathlib

from recops.training.metrics import METRICS
from recops.training.report import metrics_table


def load_runs(paths) -> list[dict]:
    return [json.loads(pathlib.Path(p).read_text()) for p in paths]


def label(run: dict) -> str:
    return f"{run['model']['model']} ops={run['ops']} ({run['epochs']} epochs)"


def comparison(runs: list[dict], split: str) -> str:
    """The ``split``'s final metrics of every run, each later run followed by its difference to
    the first."""
    first = runs[0][split]
    rows = {}
    for i, run in enumerate(runs):
        rows[f"{i}: {label(run)}"] = run[split]
        if i:
            rows[f"{i} - 0"] = {m: run[split][m] - first[m] for m in METRICS}
    return f"{split}:\n" + metrics_table(rows)


def plot_overlay(runs: list[dict], path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (loss_ax, ndcg_ax) = plt.subplots(1, 2, figsize=(9, 3.6))
    for run in runs:
        epochs = [r["epoch"] for r in run["history"]]
        loss_ax.plot(epochs, [r["loss"] for r in run["history"]], label=label(run))
        ndcg_ax.plot(epochs, [r["valid"]["ndcg@10"] for r in run["history"]], label=label(run))
    loss_ax.set(xlabel="epoch", ylabel="training loss", title="sampled softmax loss")
    ndcg_ax.set(xlabel="epoch", ylabel="NDCG@10", title="validation NDCG@10")
    for ax in (loss_ax, ndcg_ax):
        ax.grid(alpha=0.3)
    ndcg_ax.legend(fontsize=8)
    fig.suptitle(runs[0]["data"])
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m recops.training.compare")
    parser.add_argument("results", nargs="+", type=pathlib.Path, help="results.json files")
    parser.add_argument("--out", type=pathlib.Path, help="write the overlay plot here (PNG)")
    args = parser.parse_args(argv)
    runs = load_runs(args.results)
    for split in ("valid", "test"):
        print(comparison(runs, split))
    if args.out:
        plot_overlay(runs, args.out)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
