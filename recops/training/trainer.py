"""Training and evaluation of a sequential recommender: sampled softmax, Adam on the dense
parameters, the item table's Adagrad (fused into backward on recops), fp32 or bf16 autocast,
optional ``torch.compile``, seeded per epoch so that a run resumed from a checkpoint continues
exactly as it would have."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterable

import torch

from recops.data.batches import eval_batches, train_batches
from recops.data.sequences import UserSequences
from recops.models import ModelConfig, SequentialRecommender, sample_negatives
from recops.models.recommend import catalogue_scores, evaluating, exclude_seen
from recops.training.metrics import RankingMetrics, target_ranks

DTYPES = ("fp32", "bf16")
# torch.compile of a step whose backward runs the TBE's fused update (an in-place write to a leaf
# Parameter, declared in the op's schema) fails in torch 2.10's AOTAutograd ("a leaf Variable that
# requires grad is being used in an in-place operation"); torch 2.14 compiles it (tested: 2.10.0
# and 2.14.1; the releases between are untested, so they are refused too).
COMPILE_FUSED_UPDATE_MIN_TORCH = (2, 14)


def torch_release() -> tuple[int, int]:
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int(minor)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    epochs: int = 60
    batch_size: int = 128
    learning_rate: float = 1e-3  # Adam, dense parameters (generative-recommenders' ML-1M value)
    item_learning_rate: float = 0.05  # Adagrad, item table
    num_negatives: int = 128
    temperature: float = 0.05
    dtype: str = "fp32"  # "fp32", or "bf16": the forward under CPU autocast
    compile: bool = False  # the forward + loss under torch.compile
    compile_backend: str = "inductor"
    seed: int = 42
    eval_batch_size: int = 256

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")


def build_model(
    model_config: ModelConfig, train_config: TrainConfig, backend: str
) -> SequentialRecommender:
    """The model of ``train_config.seed``: the same parameters on either backend."""
    torch.manual_seed(train_config.seed)
    return SequentialRecommender(
        model_config, backend, item_learning_rate=train_config.item_learning_rate
    )


def seed_epoch(seed: int, epoch: int) -> torch.Generator:
    """The random stream of one epoch (batch order and negatives); the epoch's dropout masks
    come from the global stream, reseeded the same way."""
    epoch_seed = seed * 1_000_003 + epoch
    torch.manual_seed(epoch_seed)
    return torch.Generator().manual_seed(epoch_seed)


class Trainer:
    """Trains ``model`` on ``data``'s training split, evaluates on its valid / test split.

    ``epoch`` counts the epochs done and ``history`` holds one record per epoch (mean loss,
    seconds, sequences / s, validation metrics); ``state_dict`` / ``load_state_dict`` cover the
    model, both optimizers and that progress, so training resumes at an epoch boundary."""

    def __init__(self, model: SequentialRecommender, data: UserSequences, config: TrainConfig):
        self.model = model
        self.data = data
        self.config = config
        # fused: one kernel for all the encoder's parameters; the per-tensor loop took 0.42 ms a
        # step on the main job's 11 small tensors, the fused step 0.13 ms.
        self.dense_optimizer = torch.optim.Adam(
            model.encoder.parameters(), lr=config.learning_rate, betas=(0.9, 0.98), fused=True
        )
        self.item_optimizer = model.item_table.optimizer()
        self.loss_fn = model.training_loss
        if config.compile:
            if self.item_optimizer is None and torch_release() < COMPILE_FUSED_UPDATE_MIN_TORCH:
                need = ".".join(map(str, COMPILE_FUSED_UPDATE_MIN_TORCH))
                raise RuntimeError(
                    f"compile=True with the recops backend (the TBE's update fused into "
                    f"backward) needs torch >= {need}; this is torch {torch.__version__}"
                )
            # fullgraph: the step is one graph (recops' ops have fake kernels, and the TBE's
            # backward declares its in-place update of weights and Adagrad state in its schema);
            # dynamic: batches differ in rows and sequences, one graph serves them all.
            self.loss_fn = torch.compile(
                model.training_loss, backend=config.compile_backend, fullgraph=True, dynamic=True
            )
        self.epoch = 0
        self.history: list[dict] = []

    def autocast(self):
        if self.config.dtype == "bf16":
            return torch.autocast("cpu", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [o for o in (self.dense_optimizer, self.item_optimizer) if o is not None]

    def batches(self, epoch: int):
        """``(batch, negatives)`` pairs of one epoch."""
        generator = seed_epoch(self.config.seed, epoch)
        max_len = self.model.config.max_seq_len
        for batch in train_batches(self.data, self.config.batch_size, max_len, generator):
            negatives = sample_negatives(self.data.num_items, self.config.num_negatives, generator)
            yield batch, negatives

    def step(self, batch, negatives) -> torch.Tensor:
        """One training step; returns the (detached) loss. The recops item table updates itself
        during backward, the other optimizers step after it."""
        with self.autocast():
            loss = self.loss_fn(batch, negatives, self.config.temperature)
        loss.backward()
        for optimizer in self.optimizers():
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    def num_batches(self) -> int:
        trainable = int((self.data.history_lengths("train") >= 2).sum())
        return -(-trainable // self.config.batch_size)

    def train_epoch(self, progress: Callable[[Iterable, int], Iterable] | None = None) -> dict:
        """Trains one epoch; ``progress(iterable, total)`` may wrap the batches (a progress bar)
        and receives the running loss through ``set_postfix`` if it has one."""
        self.model.train()
        batches = self.batches(self.epoch)
        if progress is not None:
            batches = progress(batches, self.num_batches())
        total_loss, steps, sequences = 0.0, 0, 0
        start = time.perf_counter()
        for batch, negatives in batches:
            total_loss += float(self.step(batch, negatives))
            steps += 1
            sequences += batch.batch_size
            if hasattr(batches, "set_postfix"):
                batches.set_postfix(loss=f"{total_loss / steps:.4f}")
        seconds = time.perf_counter() - start
        self.epoch += 1
        return {
            "epoch": self.epoch,
            "loss": total_loss / max(steps, 1),
            "seconds": seconds,
            "sequences_per_second": sequences / seconds,
        }

    def evaluate(self, split: str = "valid") -> dict[str, float]:
        """Full-ranking metrics of every user's ``split`` target (valid or test)."""
        metrics = RankingMetrics()
        max_len = self.model.config.max_seq_len
        with evaluating(self.model), self.autocast():
            for batch in eval_batches(self.data, split, self.config.eval_batch_size, max_len):
                scores = catalogue_scores(self.model, batch)
                target_scores = scores.gather(1, batch.targets.unsqueeze(1)).squeeze(1)
                metrics.add(target_ranks(exclude_seen(scores, batch), batch.targets, target_scores))
        return metrics.result()

    def fit(self, epochs: int, progress=None, on_epoch: Callable[[dict], None] | None = None):
        """Trains up to ``epochs`` epochs in all (continuing after a resume), evaluating the
        validation split after each; ``on_epoch(record)`` sees every record."""
        while self.epoch < epochs:
            record = self.train_epoch(progress)
            record["valid"] = self.evaluate("valid")
            self.history.append(record)
            if on_epoch is not None:
                on_epoch(record)
        return self.history

    def state_dict(self) -> dict:
        return {
            "epoch": self.epoch,
            "history": self.history,
            "model": self.model.state_dict(),
            "optimizers": [o.state_dict() for o in self.optimizers()],
        }

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        for optimizer, optimizer_state in zip(self.optimizers(), state["optimizers"], strict=True):
            optimizer.load_state_dict(optimizer_state)
        self.epoch = state["epoch"]
        self.history = list(state["history"])
