"""The recops op backend: fused jagged attention kernels (the relative time and position bias
computed in-tile from the timestamps and the bias tables), the fused layer input and output and the
counter-based dropout (masks regenerated in backward, not stored), the fused sampled softmax
loss, the catalogue's top-k in one op, recops' jagged ops where a batch is padded or unpacked,
and the TBE with its fused optimizer for the items."""

from __future__ import annotations

import torch

import recops
from recops.data.batches import JaggedBatch
from recops.models.encoder import L2_NORM_EPS
from recops.models.item_table import TbeItemTable

ops = torch.ops.recops


class RecopsBackend:
    def layout(
        self, batch: JaggedBatch, dtype: torch.dtype, num_buckets: int | None
    ) -> JaggedBatch:
        """The kernels read the jagged batch as it is: nothing to prepare."""
        return batch

    def positions(self, batch: JaggedBatch) -> torch.Tensor:
        """Each row's position in its sequence."""
        return ops.offsets_range(batch.seq_offsets[:-1], batch.item_ids.numel())

    def pad(self, x: torch.Tensor, batch: JaggedBatch) -> torch.Tensor:
        """Jagged ``[L, F]`` to ``[B, padded_len, F]`` (zeros past each sequence)."""
        return ops.jagged_to_padded_dense(x, [batch.seq_offsets], [batch.padded_len])

    def unpad(self, dense: torch.Tensor, batch: JaggedBatch) -> torch.Tensor:
        return ops.dense_to_jagged(dense, [batch.seq_offsets], batch.item_ids.numel())[0]

    def hstu_attention(self, q, k, v, batch: JaggedBatch, ts_w, pos_w) -> torch.Tensor:
        """``[L, H, D]`` q, k, v to ``[L, H * Dv]``: causal HSTU attention with the fused
        relative time + position bias, ``silu_scale = 1 / max_seq_len``."""
        out = recops.hstu_attention(
            q,
            k,
            v,
            batch.seq_offsets,
            batch.max_seq_len,
            timestamps=batch.timestamps,
            ts_w=ts_w,
            pos_w=pos_w,
        )
        return out.flatten(1)

    def fuxi_attention(self, q, k, v, batch: JaggedBatch, ts_w, pos_w) -> torch.Tensor:
        """FuXi-alpha's three channels, ``[L, H * 3 * Dv]`` in the reference layout (per head
        position, time, semantic)."""
        return recops.fuxi_attention(
            q,
            k,
            v,
            batch.seq_offsets,
            batch.max_seq_len,
            timestamps=batch.timestamps,
            ts_w=ts_w,
            pos_w=pos_w,
            reference_layout=True,
        )

    def layer_input(self, x, weight, norm: str, eps: float, split) -> tuple[torch.Tensor, ...]:
        """A layer's projection ``silu(norm(x) @ weight)`` in one fused op, written as its column
        pieces (u, v, q, k), whose gradients its backward reads where they lie."""
        return recops.hstu_layer_input(x, weight, norm=norm, eps=eps, split=split)

    def layer_output(self, x, u, attn, linear, norm: str, eps: float, dropout: float, training):
        """A layer's output rows ``x + linear(dropout(u * norm(attn)))`` in one fused op, the
        dropout's mask regenerated in backward instead of stored."""
        return recops.hstu_layer_output(
            x,
            u,
            attn,
            linear.weight,
            linear.bias,
            norm=norm,
            eps=eps,
            dropout_p=dropout if training else 0.0,
        )

    def feed_forward(self, x, linears, norm: str, eps: float, dropout: float, training):
        """FuXi-alpha's MFFN stage 2 ``x + down(silu(gate(h)) * up(h))``,
        ``h = dropout(norm(x))``, in one fused op (the mask regenerated in backward)."""
        gate, up, down = linears
        return recops.fuxi_layer_ffn(
            x,
            gate.weight,
            up.weight,
            down.weight,
            norm=norm,
            eps=eps,
            dropout_p=dropout if training else 0.0,
        )

    def l2_normalize(self, x) -> torch.Tensor:
        """Unit-norm rows in one op (its backward recomputes each row's length)."""
        return recops.l2_normalize(x, L2_NORM_EPS)

    def input_features(self, embeddings, position_weight, layout, scale, p, training):
        """``dropout(scale * embeddings + position embeddings)`` in one op, its dropout
        counter-based (seeded from torch's generator) and regenerated in backward."""
        positions = self.positions(layout)
        return recops.positional_input_features(
            embeddings, positions, position_weight, scale, p, training
        )

    def next_item_loss(
        self, states, sequence, item_ids, negatives, negative_ids, temperature, predicts_next
    ) -> torch.Tensor:
        """The torch backend's next_item_loss in one fused op: the [M, R] logits never stored, and
        row i paired with row i + 1 inside it (positive_shift), so that no shifted view's backward
        writes its gradient into a zero-filled copy of the whole."""
        return recops.sampled_softmax_loss(
            states,
            sequence,
            item_ids,
            negatives,
            negative_ids,
            temperature,
            predicts_next,
            positive_shift=1,
        )

    def top_items(self, states, candidates, k: int, seen):
        """recops.models.recommend.top_items in one op (recops.mips_topk) over items 1..: the
        catalogue's ``[M, num_items + 1]`` scores never stored."""
        excluded_offsets, excluded = (None, None) if seen is None else (seen[0], seen[1] - 1)
        values, indices = recops.mips_topk(
            states.float(),
            candidates[1:].float(),
            k,
            excluded_offsets=excluded_offsets,
            excluded=excluded,
        )
        return indices + 1, values

    def item_table(self, weights, learning_rate, eps) -> TbeItemTable:
        return TbeItemTable(weights, learning_rate, eps)
