"""What a training run reports: the per-epoch table, the final metrics, a JSON record and a PNG
plot (loss and validation NDCG@10 per epoch, throughput of both op backends)."""

from __future__ import annotations

import json
import pathlib

from recops.training.metrics import METRICS

EPOCH_COLUMNS = ("epoch", "loss", "HR@10", "NDCG@10", "MRR", "seconds", "seq/s")


def epoch_header() -> str:
    return " ".join(f"{name:>8}" for name in EPOCH_COLUMNS)


def epoch_row(record: dict) -> str:
    valid = record["valid"]
    values = (
        f"{record['epoch']:8d}",
        f"{record['loss']:8.4f}",
        f"{valid['hr@10']:8.4f}",
        f"{valid['ndcg@10']:8.4f}",
        f"{valid['mrr']:8.4f}",
        f"{record['seconds']:8.2f}",
        f"{record['sequences_per_second']:8.0f}",
    )
    return " ".join(values)


def metrics_table(rows: dict[str, dict[str, float]]) -> str:
    """One line per named set of metrics (e.g. valid, test), one column per metric."""
    width = max(len(name) for name in rows)
    lines = [" " * width + "".join(f"{m.upper():>10}" for m in METRICS)]
    for name, metrics in rows.items():
        lines.append(f"{name:<{width}}" + "".join(f"{metrics[m]:10.4f}" for m in METRICS))
    return "\n".join(lines)


def throughput_lines(throughput: dict) -> list[str]:
    recops, torch = throughput["recops"], throughput["torch"]
    return [
        f"training:  recops {recops['train_sequences_per_second']:8.0f} sequences/s, "
        f"torch {torch['train_sequences_per_second']:8.0f} -> "
        f"{throughput['speedup_train']:.2f}x speed-up",
        f"recommend: recops {recops['recommend_users_per_second']:8.0f} users/s,     "
        f"torch {torch['recommend_users_per_second']:8.0f} -> "
        f"{throughput['speedup_recommend']:.2f}x speed-up",
    ]


def write_json(path: pathlib.Path, record: dict) -> None:
    path.write_text(json.dumps(record, indent=1) + "\n")


def plot(path: pathlib.Path, title: str, history: list[dict], throughput: dict | None) -> None:
    """Loss and validation NDCG@10 per epoch, and (when measured) training sequences / s of
    both backends."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = 3 if throughput else 2
    fig, axes = plt.subplots(1, panels, figsize=(4.2 * panels, 3.4))
    epochs = [r["epoch"] for r in history]
    axes[0].plot(epochs, [r["loss"] for r in history], marker=".")
    axes[0].set(xlabel="epoch", ylabel="training loss", title="sampled softmax loss")
    axes[1].plot(epochs, [r["valid"]["ndcg@10"] for r in history], marker=".", color="C1")
    axes[1].set(xlabel="epoch", ylabel="NDCG@10", title="validation NDCG@10")
    if throughput:
        backends = ("recops", "torch")
        rates = [throughput[b]["train_sequences_per_second"] for b in backends]
        bars = axes[2].bar(backends, rates, color=["C2", "C7"])
        axes[2].bar_label(bars, fmt="%.0f")
        axes[2].set(
            ylabel="sequences / s",
            title=f"training throughput ({throughput['speedup_train']:.2f}x)",
        )
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
