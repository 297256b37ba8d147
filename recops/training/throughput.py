"""Throughput of the two op backends on the same model, data and batches: training (sequences
per second, forward + backward + optimizer) and ``recommend`` (users per second).

Both backends are measured in one process, in alternation (each training step and each
``recommend`` pass runs on one backend, then the other), so load from other processes on a
shared machine falls on both alike.
"""

from __future__ import annotations

import functools
import itertools
import statistics
import time

import torch

from recops.data.sequences import UserSequences
from recops.models import BACKENDS, ModelConfig
from recops.models.recommend import recommend_all
from recops.training.trainer import TrainConfig, Trainer, build_model

RECOMMEND_PASSES = 3


def recommend_histories(data: UserSequences, users: int) -> list[tuple]:
    """The test-split histories (all but the last item) of the first ``users`` users."""
    starts = data.offsets[:-1][:users].tolist()
    lengths = data.history_lengths("test")[:users].tolist()
    return [
        (data.items[start : start + n], data.timestamps[start : start + n])
        for start, n in zip(starts, lengths, strict=True)
    ]


def _seconds(fn) -> float:
    begin = time.perf_counter()
    fn()
    return time.perf_counter() - begin


def compare_backends(
    model_config: ModelConfig,
    train_config: TrainConfig,
    data: UserSequences,
    steps: int = 5,
    users: int = 256,
) -> dict:
    """Per backend, a freshly built model's training sequences / s over the first ``steps``
    batches of epoch 0 and its ``recommend`` users / s (top 10 of the whole catalogue for
    ``users`` users); plus the recops / torch ratios. Everything is timed on a second pass: the
    first warms what a longer run has warm (recops' attention generates a GEMM micro-kernel per
    new tile shape; compiled code is built)."""
    state = torch.random.get_rng_state()  # measuring must not shift the caller's random stream
    trainers = {
        backend: Trainer(build_model(model_config, train_config, backend), data, train_config)
        for backend in BACKENDS
    }
    batches = list(itertools.islice(trainers["recops"].batches(0), steps))
    histories = recommend_histories(data, users)
    for trainer in trainers.values():
        for batch, negatives in batches:
            trainer.step(batch, negatives)
        recommend_all(trainer.model, histories)
    train_seconds = dict.fromkeys(trainers, 0.0)
    for batch, negatives in batches:
        for backend, trainer in trainers.items():
            train_seconds[backend] += _seconds(functools.partial(trainer.step, batch, negatives))
    recommend_seconds = {backend: [] for backend in trainers}
    for _ in range(RECOMMEND_PASSES):
        for backend, trainer in trainers.items():
            pass_seconds = _seconds(functools.partial(recommend_all, trainer.model, histories))
            recommend_seconds[backend].append(pass_seconds)
    torch.random.set_rng_state(state)
    sequences = sum(batch.batch_size for batch, _ in batches)
    results = {
        backend: {
            "train_sequences_per_second": sequences / train_seconds[backend],
            "recommend_users_per_second": len(histories)
            / statistics.median(recommend_seconds[backend]),
        }
        for backend in trainers
    }
    for key in ("train_sequences_per_second", "recommend_users_per_second"):
        results[f"speedup_{key.split('_')[0]}"] = results["recops"][key] / results["torch"][key]
    return results
