"""Data for sequential recommendation: interaction readers (MovieLens), per-user chronological
sequences with a leave-one-out split, jagged batches, and a synthetic generator."""

from recops.data.batches import JaggedBatch, eval_batches, request_batch, train_batches
from recops.data.datasets import load_dataset
from recops.data.readers import Interactions, movielens_100k_path, read_interactions
from recops.data.sequences import UserSequences, complete_offsets
from recops.data.synthetic import synthetic_sequences

__all__ = [
    "Interactions",
    "JaggedBatch",
    "UserSequences",
    "complete_offsets",
    "eval_batches",
    "load_dataset",
    "movielens_100k_path",
    "read_interactions",
    "request_batch",
    "synthetic_sequences",
    "train_batches",
]
