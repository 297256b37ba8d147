"""Throughput of the two op backends on the same model, data and batches: training (sequences
per second, forward + backward + optimizer) and ``recommend`` (users per second)."""

from __future__ import annotations

import itertools
import time

import torch

from recops.data.sequences import UserSequences
from recops.inference import recommend_throughput
from recops.models import BACKENDS, ModelConfig
from recops.training.trainer import TrainConfig, Trainer, build_model


def training_throughput(trainer: Trainer, steps: int) -> float:
    """Sequences per second over ``steps`` training steps on the first batches of epoch 0,
    timed on their second pass: the first pass warms what a longer run has warm (recops'
    attention generates a GEMM micro-kernel per new tile shape, compiled code is built)."""
    batches = list(itertools.islice(trainer.batches(0), steps))
    for batch, negatives in batches:
        trainer.step(batch, negatives)
    start = time.perf_counter()
    for batch, negatives in batches:
        trainer.step(batch, negatives)
    seconds = time.perf_counter() - start
    return sum(batch.batch_size for batch, _ in batches) / seconds


def recommend_histories(data: UserSequences, users: int) -> list[tuple]:
    """The test-split histories (all but the last item) of the first ``users`` users."""
    starts = data.offsets[:-1][:users].tolist()
    lengths = data.split("test").history_lengths[:users].tolist()
    return [
        (data.items[start : start + n], data.timestamps[start : start + n])
        for start, n in zip(starts, lengths, strict=True)
    ]


def compare_backends(
    model_config: ModelConfig,
    train_config: TrainConfig,
    data: UserSequences,
    steps: int = 5,
    users: int = 256,
) -> dict:
    """Per backend, a freshly built model's training sequences / s and ``recommend`` users / s
    (top 10 of the whole catalogue for ``users`` users), measured one after the other in this
    process; plus the recops / torch ratios."""
    results = {}
    histories = recommend_histories(data, users)
    state = torch.random.get_rng_state()  # measuring must not shift the caller's random stream
    for backend in BACKENDS:
        trainer = Trainer(build_model(model_config, train_config, backend), data, train_config)
        results[backend] = {
            "train_sequences_per_second": training_throughput(trainer, steps),
            "recommend_users_per_second": recommend_throughput(trainer.model, histories),
        }
    torch.random.set_rng_state(state)
    for key in ("train_sequences_per_second", "recommend_users_per_second"):
        results[f"speedup_{key.split('_')[0]}"] = results["recops"][key] / results["torch"][key]
    return results
