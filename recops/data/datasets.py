"""Named data sets for the training command: ``ml-100k`` (embedded), ``synthetic`` or a path."""

from __future__ import annotations

import pathlib

from recops.data.readers import movielens_100k_path, read_interactions
from recops.data.sequences import UserSequences
from recops.data.synthetic import synthetic_sequences

# The synthetic set the command line offers: ML-100K's scale (users, items, lengths up to 200).
SYNTHETIC_DEFAULT = dict(num_users=1000, num_items=1600, min_length=20, max_length=200)


def load_dataset(spec: str) -> UserSequences:
    """``"ml-100k"``: MovieLens-100K from the recbole wheel; ``"synthetic"``: synthetic
    sequences of ML-100K's scale; anything else is a path to ``ratings.dat`` (ML-1M),
    ``ratings.csv`` (ML-20M) or a recbole ``.inter`` file."""
    if spec == "ml-100k":
        return UserSequences.from_interactions(read_interactions(movielens_100k_path()), spec)
    if spec == "synthetic":
        return synthetic_sequences(**SYNTHETIC_DEFAULT)
    path = pathlib.Path(spec)
    if not path.is_file():
        raise FileNotFoundError(f"--data {spec!r}: not ml-100k, synthetic, or an existing file")
    return UserSequences.from_interactions(read_interactions(path), path.name)
