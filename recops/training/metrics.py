"""Full-ranking metrics: the target's rank among every item of the catalogue the user has not
seen (no sampled candidates), summarised as hit rate, NDCG and MRR."""

from __future__ import annotations

import torch

HIT_RATE_CUTOFFS = (1, 10, 50)
NDCG_CUTOFFS = (10, 50)
METRICS = (
    *(f"hr@{k}" for k in HIT_RATE_CUTOFFS),
    *(f"ndcg@{k}" for k in NDCG_CUTOFFS),
    "mrr",
)


def target_ranks(scores: torch.Tensor, targets: torch.Tensor, target_scores: torch.Tensor):
    """1-based rank of each target: one plus the number of items scoring strictly higher.
    ``target_scores`` are taken before seen items were excluded from ``scores``, so a target the
    user had seen before still competes."""
    return (scores > target_scores.unsqueeze(1)).sum(dim=1) + 1


class RankingMetrics:
    """Sums of per-user metrics over batches of ranks; ``result()`` gives their means."""

    def __init__(self):
        self.sums = dict.fromkeys(METRICS, 0.0)
        self.count = 0

    def add(self, ranks: torch.Tensor) -> None:
        ranks = ranks.double()
        for k in HIT_RATE_CUTOFFS:
            self.sums[f"hr@{k}"] += float((ranks <= k).sum())
        gain = 1.0 / torch.log2(ranks + 1.0)
        for k in NDCG_CUTOFFS:
            self.sums[f"ndcg@{k}"] += float(torch.where(ranks <= k, gain, 0.0).sum())
        self.sums["mrr"] += float((1.0 / ranks).sum())
        self.count += ranks.numel()

    def result(self) -> dict[str, float]:
        return {name: total / max(self.count, 1) for name, total in self.sums.items()}


def chance_hit_rate(k: int, num_items: int) -> float:
    """HR@k of a random ranking of ``num_items`` items."""
    return min(k, num_items) / num_items
