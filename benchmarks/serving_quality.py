"""What serving from the cache changes in a trained model's recommendations: the test split of a
data set (every user's last item, ranked against the whole catalogue, as `recops.train`
evaluates it) served by recops.serving.CachedRecommender with the keys and values stored in fp32
or bf16 and the item table in fp32, int8 or int4, against the full recompute of every history
(recops.models.recommend).

Each user's history before its test item is observed (encoded into the cache), then the
catalogue is scored at the test item's time. Reported: HR@10 and NDCG@10 of each, how many
users' top-10 lists equal the full recompute's, the cache's bytes per cached row and the item
table's bytes.

Usage: python benchmarks/serving_quality.py [--checkpoint PATH] [--data ml-100k]
Without a checkpoint it trains one first (python -m recops.train's defaults, HSTU, into
train-results/serving-quality/). Writes benchmarks/results/serving_quality.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # the repository root: recops built in place

import torch  # noqa: E402

from recops import train  # noqa: E402
from recops.data.datasets import load_dataset  # noqa: E402
from recops.models.recommend import recommend  # noqa: E402
from recops.serve import load_model  # noqa: E402
from recops.serving import CachedRecommender  # noqa: E402
from recops.training.metrics import RankingMetrics, target_ranks  # noqa: E402

RESULTS = os.path.join(HERE, "results")
# (pages, item table) served.
SETTINGS = [("fp32", "fp32"), ("bf16", "fp32"), ("fp32", "int8"), ("fp32", "int4")]
PAGES = {"fp32": torch.float32, "bf16": torch.bfloat16}
BATCH = 64


def test_requests(data):
    """Per user: (history items, history times) before its test item, the item and its time."""
    lengths = data.history_lengths("test")
    for user in range(data.num_users):
        start, n = int(data.offsets[user]), int(lengths[user])
        yield (
            (data.items[start : start + n], data.timestamps[start : start + n]),
            int(data.items[start + n]),
            int(data.timestamps[start + n]),
        )


def evaluate(model, data, pages: str, item_table: str):
    """Metrics of the cached path with ``pages`` pages and ``item_table``, its top-10 per batch,
    the recommender."""
    served = CachedRecommender(
        model, cache_bytes=1 << 30, dtype=PAGES[pages], item_table=item_table
    )
    metrics, tops = RankingMetrics(), []
    requests = list(test_requests(data))
    for start in range(0, len(requests), BATCH):
        chunk = requests[start : start + BATCH]
        users = list(range(start, start + len(chunk)))
        served.observe(users, [history for history, _, _ in chunk])
        scores = served.scores(users, request_times=[time for _, _, time in chunk])
        targets = torch.tensor([target for _, target, _ in chunk])
        target_scores = scores.gather(1, targets[:, None]).squeeze(1)
        for b, (history, _, _) in enumerate(chunk):
            scores[b, history[0]] = float("-inf")
        metrics.add(target_ranks(scores, targets, target_scores))
        tops.append(scores.topk(10, dim=1).indices)
        for user in users:  # keep the cache to the users of one batch
            served.cache.evict(user)
    return metrics.result(), tops, served


def recompute_tops(model, data) -> list[torch.Tensor]:
    requests = list(test_requests(data))
    return [
        recommend(
            model,
            [history for history, _, _ in requests[start : start + BATCH]],
            10,
            request_times=[time for _, _, time in requests[start : start + BATCH]],
        )[0]
        for start in range(0, len(requests), BATCH)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=pathlib.Path)
    parser.add_argument("--data", default="ml-100k")
    args = parser.parse_args()
    if args.checkpoint is None:
        out = pathlib.Path("train-results/serving-quality")
        args.checkpoint = out / "checkpoint.pt"
        if not args.checkpoint.exists():
            train.run(["--data", args.data, "--out", str(out), "--checkpoint",
                       str(args.checkpoint), "--no-progress", "--speedup-steps", "0"])  # fmt: skip
    model = load_model(args.checkpoint)
    data = load_dataset(args.data)
    want = recompute_tops(model, data)
    results = {"checkpoint": str(args.checkpoint), "data": args.data, "settings": []}
    for pages, item_table in SETTINGS:
        metrics, tops, served = evaluate(model, data, pages, item_table)
        same = sum(int((a == b).all(dim=1).sum()) for a, b in zip(tops, want, strict=True))
        results["settings"].append(
            {
                "pages": pages,
                "item_table": item_table,
                **metrics,
                "top10_equal_to_recompute": same,
                "users": data.num_users,
                "row_bytes": served.cache.layout.row_bytes,
                "item_table_bytes": served.items.nbytes,
            }
        )
        print(f"{pages} pages, {item_table} items: {metrics}, top-10 equal {same}", flush=True)
    write(results)


def write(results: dict) -> None:
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "serving_quality.json"), "w") as f:
        json.dump(results, f, indent=1)
    lines = [
        f"{results['data']}, test split, served from the cache ({results['checkpoint']})",
        "",
        "| pages | item table | HR@10 | NDCG@10 | top-10 = full recompute | cache bytes / row "
        "| item table bytes |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in results["settings"]:
        lines.append(
            f"| {r['pages']} | {r['item_table']} | {r['hr@10']:.4f} | {r['ndcg@10']:.4f} | "
            f"{r['top10_equal_to_recompute']}/{r['users']} | {r['row_bytes']} | "
            f"{r['item_table_bytes']} |"
        )
    with open(os.path.join(RESULTS, "serving_quality.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
