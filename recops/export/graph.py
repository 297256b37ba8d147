"""The served recommender as one exportable graph: user histories in, top-k items and scores out.

Inputs (all int64, jagged rows of a batch of users):

- ``history_items [L]``, ``history_timestamps [L]``, ``history_offsets [B + 1]``: each user's
  window, its last ``max_seq_len - 1`` interactions at most, oldest first, at least one;
- ``request_times [B]``: the time each recommendation is for;
- ``seen_items [S]``, ``seen_offsets [B + 1]``: the items to exclude from each user's top-k (the
  whole history; empty rows to exclude nothing).

The graph builds the request batch in place of ``recops.data.batches.request_batch`` (each window
followed by its request token, with index arithmetic whose sizes are sums of the input sizes, so
that batch size and lengths stay dynamic), encodes it and takes the catalogue's top-k on
the model's backend (recops.mips_topk on recops'): the eager ``recommend``'s steps, in its order.
"""

from __future__ import annotations

import torch
from torch import nn

from recops.data.batches import JaggedBatch, segment_ids
from recops.serving.item_table import ServedItemTable


class RecommenderGraph(nn.Module):
    """``model`` (a SequentialRecommender, eval mode) answering ``k`` items a user, its items read
    from ``item_table`` ("fp32", "int8" or "int4", see ServedItemTable)."""

    def __init__(self, model, k: int = 10, item_table: str = "fp32"):
        super().__init__()
        if k < 1 or k > model.config.num_items:
            raise ValueError(f"k must be in [1, num_items = {model.config.num_items}], got {k}")
        # The encoder and the served table only: the training table and its optimizer state stay
        # out of the graph.
        self.encoder = model.eval().encoder
        self.table = ServedItemTable(model, item_table)
        self.backend = model.backend
        self.k = k
        self.max_seq_len = model.config.max_seq_len

    def request_batch(self, items, timestamps, offsets, request_times) -> JaggedBatch:
        """Each window then its request token (item 0 at the request time)."""
        rows, users = items.numel(), request_times.numel()
        shift = segment_ids(offsets, rows)  # a history row moves down by its user's index
        user_index = torch.arange(users + 1, dtype=offsets.dtype)
        seq_offsets = offsets + user_index
        token_rows = seq_offsets[1:] - 1
        history_rows = torch.arange(rows, dtype=offsets.dtype) + shift
        item_ids = items.new_zeros(rows + users).index_put((history_rows,), items)
        times = timestamps.new_empty(rows + users)
        times = times.index_put((history_rows,), timestamps).index_put((token_rows,), request_times)
        return JaggedBatch(
            item_ids=item_ids,
            timestamps=times,
            seq_offsets=seq_offsets,
            max_seq_len=self.max_seq_len,
            # The padded backend (SASRec) pads to the model's length: padding past a causal row
            # changes nothing, and a length read from the data would not be a shape.
            padded_len=self.max_seq_len,
            query_rows=token_rows - 1,
        )

    def forward(
        self,
        history_items,
        history_timestamps,
        history_offsets,
        request_times,
        seen_items,
        seen_offsets,
    ):
        batch = self.request_batch(
            history_items, history_timestamps, history_offsets, request_times
        )
        states = self.encoder(self.table.rows(batch.item_ids), batch)[batch.query_rows]
        seen = (seen_offsets, seen_items)
        return self.backend.top_items(states, self.table.candidates(), self.k, seen)
