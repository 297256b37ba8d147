"""One step of the cached recommender as a module: the encoder on a request's new rows, each block's
keys and values written to the cache's pages and then attended through the page tables. The cached
recommender runs it eagerly; recops.export exports it (the pages are its inputs, written in place,
so that the cache stays outside the graph).
"""

from __future__ import annotations

import math

from torch import nn

from recops.serving.paged_cache import PageTables, store_rows


class DeltaStep(nn.Module):
    """``model``'s encoder (HSTU or FuXi-alpha) on new rows, reading items from ``item_table``
    (a ServedItemTable) and attending through ``attention`` (delta_attention or its plain-PyTorch
    reference)."""

    def __init__(self, model, item_table, attention):
        super().__init__()
        self.encoder = model.encoder
        self.items = item_table
        self.attention = attention
        self.model_name = model.config.model
        self.max_seq_len = model.config.max_seq_len

    def forward(
        self, items, times, positions, slots, pages, lengths, new_rows, keys, values, timestamps
    ):
        """``[R, d]`` unit-norm states of the new rows ``items``, ``times``, ``positions`` (int64
        ``[R]``), users in order, written at pool ``slots`` (PagedKVCache.slots) of the pages:
        ``keys`` and ``values`` one pool per layer (``[pages, page_rows, H, Dqk]``, PagedKVCache's
        ``keys.unbind(0)``) and ``timestamps [pages, page_rows]``, which this writes; ``pages``,
        ``lengths``, ``new_rows`` are the batch's PageTables.

        Each layer's pool is an input of its own, not a slice of one: an exported step then writes
        the rows into the pool in place, where a write into a slice of an input makes AOTInductor
        copy the whole input back on every call (in proportion to the cache)."""
        tables = PageTables(pages, lengths, new_rows)
        embeddings = self.items.rows(items)
        x = embeddings * math.sqrt(embeddings.shape[-1]) + self.encoder.positions(positions)
        for layer, block in enumerate(self.encoder.blocks):
            u, q, k, v = block.project(x)
            store_rows(keys[layer], slots, k)
            store_rows(values[layer], slots, v)
            if layer == 0:
                store_rows(timestamps, slots, times)
            attn = self.attention(
                self.model_name, q, keys[layer], values[layer], timestamps, tables,
                self.max_seq_len, block.relative_bias.ts_w, block.relative_bias.pos_w,
            )  # fmt: skip
            x = block.combine(x, u, attn)
        return self.encoder.backend.l2_normalize(x)  # as the encoder normalises its states
