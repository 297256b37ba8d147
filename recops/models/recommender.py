"""A sequential recommender: an item table and a sequence encoder, on one op backend."""

from __future__ import annotations

import torch
from torch import nn

from recops.data.batches import JaggedBatch
from recops.models.encoder import SequenceEncoder
from recops.models.model_config import ModelConfig
from recops.models.recops_backend import RecopsBackend
from recops.models.torch_backend import TorchBackend

BACKENDS = {"recops": RecopsBackend, "torch": TorchBackend}

# Adagrad for the item table: its first step moves every touched entry by the learning rate.
ITEM_LEARNING_RATE = 0.05
ITEM_EPS = 1e-8


class SequentialRecommender(nn.Module):
    """HSTU, FuXi-alpha or SASRec (``config.model``) on the ``recops`` or ``torch`` backend.

    Both backends hold the same parameters, created in the same order from the same random
    stream, so one seed gives both the same model. ``encoder`` holds every dense parameter (the
    trainer's Adam steps them; ``model.encoder.double()`` makes the model float64);
    ``item_table`` holds the float32 item embeddings and their Adagrad, fused into backward on
    recops (``item_table.optimizer()`` is None) or a torch optimizer to step.
    """

    def __init__(
        self,
        config: ModelConfig,
        backend: str = "recops",
        *,
        item_learning_rate: float = ITEM_LEARNING_RATE,
        item_eps: float = ITEM_EPS,
    ):
        super().__init__()
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {list(BACKENDS)}, got {backend!r}")
        self.config = config
        self.backend = BACKENDS[backend]()
        items = torch.empty(config.num_items + 1, config.dim)
        nn.init.trunc_normal_(items, std=0.02, a=-0.04, b=0.04)
        self.encoder = SequenceEncoder(config, self.backend)
        self.item_table = self.backend.item_table(items, item_learning_rate, item_eps)

    def item_embeddings(self, ids: torch.Tensor) -> torch.Tensor:
        return self.item_table(ids).to(self.encoder.dtype)

    def forward(self, batch: JaggedBatch) -> torch.Tensor:
        """``[L, d]`` unit-norm states of every row of ``batch``."""
        return self.encoder(self.item_embeddings(batch.item_ids), batch)

    def query_states(self, batch: JaggedBatch) -> torch.Tensor:
        """``[M, d]``: the states at ``batch.query_rows``."""
        return self(batch)[batch.query_rows]

    def training_loss(
        self, batch: JaggedBatch, negative_ids: torch.Tensor, temperature: float
    ) -> torch.Tensor:
        """Sampled softmax loss of predicting each training row's next item against the
        negatives. The sequence and the negatives are looked up in one call, so the table's
        backward applies one update with every row's summed gradient."""
        rows = batch.item_ids.numel()
        embeddings = self.item_embeddings(torch.cat([batch.item_ids, negative_ids]))
        # A split, whose backward concatenates the two gradients, where two slices would each
        # scatter theirs into a zero-filled copy of the whole and then add the copies.
        sequence, negatives = embeddings.split([rows, negative_ids.numel()])
        states = self.encoder(sequence, batch)
        # Row i predicts row i + 1 where both are in one sequence: the rows paired with the next
        # ones, weighted by predicts_next, instead of gathers (generative-recommenders weights its
        # shifted supervision the same way), which spares the gathers and their scatter-add
        # backward.
        return self.backend.next_item_loss(
            states,
            sequence,
            batch.item_ids,
            negatives,
            negative_ids,
            temperature,
            batch.predicts_next,
        )

    def candidate_embeddings(self) -> torch.Tensor:
        """``[num_items + 1, d]`` unit-norm item embeddings (row 0 is no item)."""
        return self.backend.l2_normalize(self.item_table.weight.to(self.encoder.dtype))
