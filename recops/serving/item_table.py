"""The item table a served recommender reads: the model's own (fp32), or a copy quantized rowwise in
FBGEMM's fused layouts, which is all the server keeps of it. Quantized rows are dequantized where
they are read: the rows of a request's items (the input embeddings) and the catalogue (the
scores' candidates).

- int8: ``FloatToFused8BitRowwiseQuantized``, each row its bytes and an fp32 scale and bias
  (``d + 8`` bytes for ``4 d`` in fp32).
- int4: ``FloatOrHalfToFusedNBitRowwiseQuantizedSBHalf`` at 4 bits, two values a byte and an fp16
  scale and bias (``d / 2 + 4`` bytes, d rounded up to a multiple of 4).

The ops are ``torch.ops.fbgemm``'s: recops serves them, bit-exact with FBGEMM.
"""

from __future__ import annotations

import torch
from torch import nn

from recops.models.encoder import l2_normalize

ITEM_TABLES = ("fp32", "int8", "int4")


class ServedItemTable(nn.Module):
    """``model``'s item table as ``kind`` (one of ITEM_TABLES) stores it, in buffers (so that an
    exported graph carries them). A served model is frozen: the table, and the unit-norm catalogue
    the scores are taken against, are the model's as this table is built (fp32 reads the model's
    own table in place)."""

    def __init__(self, model, kind: str = "fp32"):
        super().__init__()
        if kind not in ITEM_TABLES:
            raise ValueError(f"item_table must be one of {ITEM_TABLES}, got {kind!r}")
        self.kind = kind
        weight = model.item_table.weight.detach()
        self._dtype = model.encoder.dtype
        fbgemm = torch.ops.fbgemm
        if kind == "fp32":
            stored = weight
        elif kind == "int8":
            stored = fbgemm.FloatToFused8BitRowwiseQuantized(weight.float())
        else:
            # FBGEMM's int4 rows hold a whole number of fp16s (dim a multiple of 4): a row is
            # padded with copies of its first value, which leaves its range, and so its
            # quantization, as they are; the padding is cut off when read.
            padding = -weight.shape[1] % 4
            padded = torch.cat([weight, weight[:, :1].expand(-1, padding)], dim=1)
            stored = fbgemm.FloatOrHalfToFusedNBitRowwiseQuantizedSBHalf(padded.float(), 4)
        self.register_buffer("stored", stored, persistent=False)
        self.dim = weight.shape[1]
        # fp32: the normalised catalogue once (a second copy of the table, as a search index
        # keeps); quantized: per request, so that the quantized table is all that is kept.
        normalised = l2_normalize(weight.to(self._dtype)) if kind == "fp32" else None
        self.register_buffer("normalised", normalised, persistent=False)

    @property
    def nbytes(self) -> int:
        """The bytes the table is kept in."""
        return self.stored.numel() * self.stored.element_size()

    def _dequantized(self, rows: torch.Tensor) -> torch.Tensor:
        if self.kind == "int8":
            out = torch.ops.fbgemm.Fused8BitRowwiseQuantizedToFloat(rows)
        else:
            out = torch.ops.fbgemm.FusedNBitRowwiseQuantizedSBHalfToFloat(rows, 4)[:, : self.dim]
        return out.to(self._dtype)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """``[n, d]`` embeddings of items ``ids`` in the encoder's dtype."""
        if self.kind == "fp32":
            return self.stored.index_select(0, ids).to(self._dtype)
        return self._dequantized(self.stored.index_select(0, ids))

    def candidates(self) -> torch.Tensor:
        """``[num_items + 1, d]`` unit-norm embeddings of the catalogue (row 0 is no item)."""
        if self.normalised is not None:
            return self.normalised
        return l2_normalize(self._dequantized(self.stored))
