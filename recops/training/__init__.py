"""Training, evaluation and throughput measurement of the sequential recommenders."""

from recops.training.metrics import METRICS, RankingMetrics, chance_hit_rate, target_ranks
from recops.training.trainer import DTYPES, TrainConfig, Trainer, build_model

__all__ = [
    "DTYPES",
    "METRICS",
    "RankingMetrics",
    "TrainConfig",
    "Trainer",
    "build_model",
    "chance_hit_rate",
    "target_ranks",
]
