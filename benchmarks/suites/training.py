"""Training and inference of the sequential recommenders (issue 16): each model on the recops
backend (fused HSTU / FuXi-alpha attention, recops' jagged ops, the TBE with fused Adagrad) vs
the torch backend (generative-recommenders' padded formulation, nn.Embedding + torch.optim).

Training rows time one step (forward, backward, both optimizers) on one fixed batch and give
sequences / s and the step's peak extra memory: ML-100K at the default sizes (2 layers, d = 50,
max length 200, batch 128), and synthetic sequences at max length 1024 and 4096 (lengths
uniform in [N / 2, N]). Inference rows time ``recommend`` (top 10 of all 1682 items, seen items
excluded) for 256 ML-100K users.
"""

import torch
from harness import Row, measure_quietly
from memory import peak_extra_bytes

from recops.data import load_dataset, synthetic_sequences
from recops.models import MODELS, ModelConfig
from recops.models.recommend import recommend
from recops.training import TrainConfig, Trainer, build_model
from recops.training.throughput import recommend_histories

BACKENDS = ("torch", "recops")  # torch first: recops rows are compared to it
# (case name, data, max length, batch size)
LONG_SEQUENCES = [(1024, 32), (4096, 4)]
RECOMMEND_USERS = 256


def training_cases():
    yield "ML-100K N=200 B=128", load_dataset("ml-100k"), 200, 128
    for n, batch in LONG_SEQUENCES:
        data = synthetic_sequences(batch, 4096, n // 2 + 2, n + 2, seed=n)
        yield f"synthetic N={n} B={batch}", data, n, batch


def training_step(model, backend, data, max_len, batch_size):
    """A closure running one training step on the first batch of epoch 0."""
    config = TrainConfig(batch_size=batch_size)
    model_config = ModelConfig(model, data.num_items, max_seq_len=max_len)
    trainer = Trainer(build_model(model_config, config, backend), data, config)
    batch, negatives = next(trainer.batches(0))
    return lambda: trainer.step(batch, negatives), batch.batch_size


def rows_for(case, steps, sequences, suite="training"):
    times, _ = measure_quietly(steps, warmup=1, min_runs=3, min_seconds=1.0)
    return [
        Row(
            suite=suite,
            case=case,
            impl=backend,
            seconds=times[backend],
            peak_bytes=peak_extra_bytes(steps[backend]),
            extra={
                "compare_to": ["torch"] if backend == "recops" else [],
                "per_second": sequences / times[backend],
            },
        )
        for backend in BACKENDS
    ]


def run(limits):
    torch.manual_seed(0)
    rows = []
    for case, data, max_len, batch_size in training_cases():
        for model in MODELS:
            steps = {}
            for backend in BACKENDS:
                steps[backend], sequences = training_step(model, backend, data, max_len, batch_size)
            rows += rows_for(f"{model} {case}", steps, sequences)
    data = load_dataset("ml-100k")
    histories = recommend_histories(data, RECOMMEND_USERS)
    for model in MODELS:
        config = ModelConfig(model, data.num_items)
        recommenders = {b: build_model(config, TrainConfig(), b) for b in BACKENDS}
        calls = {b: (lambda m=m: recommend(m, histories, k=10)) for b, m in recommenders.items()}
        rows += rows_for(
            f"{model} recommend top-10, {RECOMMEND_USERS} users",
            calls,
            len(histories),
            suite="inference",
        )
    return rows
