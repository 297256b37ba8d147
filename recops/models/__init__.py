"""Generative / sequential recommenders on jagged batches: HSTU, FuXi-alpha and the SASRec
baseline, each on recops' ops or on their plain-PyTorch reference formulation; ``recommend``
(recops.models.recommend) ranks the whole catalogue with a trained one (top-k items)."""

from recops.models.loss import sample_negatives, sampled_softmax_loss
from recops.models.model_config import MODELS, ModelConfig
from recops.models.recommender import BACKENDS, SequentialRecommender

__all__ = [
    "BACKENDS",
    "MODELS",
    "ModelConfig",
    "SequentialRecommender",
    "sample_negatives",
    "sampled_softmax_loss",
]
