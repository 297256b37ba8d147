"""The torch op backend: every recops op of the models in plain PyTorch, in the formulation of
generative-recommenders' research code (research/modeling/sequential/hstu.py) and of FuXi-alpha's:
sequences padded to ``[B, n]``, ``[B, H, n, n]`` scores from ``einsum``, the relative time bias by
``index_select`` of bucketised time differences, the position bias by the pad-repeat-reshape trick,
a float causal mask, ``einsum`` back to ``[B, n, H, D]``. Padding and unpacking are index copies
(``index_copy`` / ``index_select``, what the FBGEMM jagged ops compute), and the items are an
``nn.Embedding`` with ``torch.optim.Adagrad``.

Two departures from the reference code, both making it cheaper, never dearer: sequences are padded
to the batch's longest (the reference pads to the model's maximum), and the time buckets are
computed once per batch and shared by the layers (the reference bucketises in every layer).
The query time of a sequence's last position is its own timestamp, as in recops' kernels (the
padded timestamps repeat each sequence's last one, so the reference's "next timestamp" shift sees
it). Buckets are computed in the bias tables' dtype: float32 in training as in the reference,
float64 in float64 models, where they match recops' float64 bucketing exactly.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from recops.data.batches import JaggedBatch, seen_pairs
from recops.models.encoder import l2_normalize
from recops.models.item_table import TorchItemTable
from recops.models.loss import sampled_softmax_loss
from recops.models.recommend import state_scores

# HSTU's bucketisation: floor(ln(max(|dt|, 1)) / 0.301), clamped to the table.
BUCKET_DIVISOR = 0.301


@dataclasses.dataclass
class PaddedLayout:
    """A jagged batch's place in a ``[B, n]`` grid, and what every layer shares."""

    batch_size: int
    padded_len: int  # n
    max_seq_len: int  # N: the position table is pos_w[N - 1 + j - i]
    slots: torch.Tensor  # [L]: b * n + position of every row
    positions: torch.Tensor  # [L]
    causal: torch.Tensor  # [n, n] float, 1 where j <= i
    time_buckets: torch.Tensor | None  # [B, n, n] int64


def _time_buckets(timestamps: torch.Tensor, num_buckets: int, dtype) -> torch.Tensor:
    """generative-recommenders' bucketised ``ts[i + 1] - ts[j]`` over ``[B, n]`` timestamps."""
    n = timestamps.shape[1]
    ext = torch.cat([timestamps, timestamps[:, n - 1 : n]], dim=1)
    dt = ext[:, 1:].unsqueeze(2) - ext[:, :-1].unsqueeze(1)
    buckets = (torch.log(dt.abs().clamp(min=1).to(dtype)) / BUCKET_DIVISOR).long()
    return buckets.clamp(0, num_buckets)


def position_bias(pos_w: torch.Tensor, n: int, max_seq_len: int) -> torch.Tensor:
    """``[1, n, n]`` with ``[i, j] = pos_w[N - 1 + j - i]``: the reference's pad, repeat and
    reshape of the ``2n - 1`` central entries."""
    w = pos_w[max_seq_len - n : max_seq_len + n - 1]
    t = F.pad(w, [0, n]).repeat(n)
    t = t[..., :-n].reshape(1, n, 3 * n - 2)
    r = (2 * n - 1) // 2
    return t[:, :, r : 3 * n - 2 - r]


class TorchBackend:
    def layout(
        self, batch: JaggedBatch, dtype: torch.dtype, num_buckets: int | None
    ) -> PaddedLayout:
        """The padding of ``batch``, its causal mask in ``dtype`` and, unless ``num_buckets`` is
        None (no time bias), its time buckets."""
        lengths = batch.lengths
        batch_size, n, rows = batch.batch_size, batch.padded_len, batch.item_ids.numel()
        starts = torch.repeat_interleave(batch.seq_offsets[:-1], lengths, output_size=rows)
        positions = torch.arange(rows) - starts
        first_slots = torch.arange(batch_size) * n
        slots = torch.repeat_interleave(first_slots, lengths, output_size=rows) + positions
        buckets = None
        if num_buckets is not None:
            # Past its end a sequence repeats its last timestamp, so the shifted query time of
            # its last position is its own.
            last = (lengths - 1).clamp(min=0)[:, None]
            source = batch.seq_offsets[:-1, None] + torch.minimum(torch.arange(n)[None], last)
            buckets = _time_buckets(batch.timestamps[source], num_buckets, dtype)
        return PaddedLayout(
            batch_size=batch_size,
            padded_len=n,
            max_seq_len=batch.max_seq_len,
            slots=slots,
            positions=positions,
            causal=torch.tril(torch.ones(n, n, dtype=dtype)),
            time_buckets=buckets,
        )

    def positions(self, layout: PaddedLayout) -> torch.Tensor:
        return layout.positions

    def pad(self, x: torch.Tensor, layout: PaddedLayout) -> torch.Tensor:
        """Jagged ``[L, F]`` to ``[B, n, F]`` (zeros past each sequence)."""
        dense = x.new_zeros(layout.batch_size * layout.padded_len, x.shape[1])
        return dense.index_copy(0, layout.slots, x).view(layout.batch_size, layout.padded_len, -1)

    def unpad(self, dense: torch.Tensor, layout: PaddedLayout) -> torch.Tensor:
        return dense.reshape(-1, dense.shape[-1]).index_select(0, layout.slots)

    def _padded_heads(self, layout, *tensors):
        b, n = layout.batch_size, layout.padded_len
        return [self.pad(t.flatten(1), layout).view(b, n, t.shape[1], t.shape[2]) for t in tensors]

    def _time_bias(self, ts_w, layout) -> torch.Tensor:
        b, n = layout.batch_size, layout.padded_len
        return torch.index_select(ts_w, 0, layout.time_buckets.view(-1)).view(b, n, n)

    def hstu_attention(self, q, k, v, layout: PaddedLayout, ts_w, pos_w) -> torch.Tensor:
        n = layout.padded_len
        qp, kp, vp = self._padded_heads(layout, q, k, v)
        scores = torch.einsum("bnhd,bmhd->bhnm", qp, kp)
        bias = self._time_bias(ts_w, layout) + position_bias(pos_w, n, layout.max_seq_len)
        scores = scores + bias.unsqueeze(1)
        attn = F.silu(scores) / layout.max_seq_len * layout.causal
        out = torch.einsum("bhnm,bmhd->bnhd", attn, vp)
        return self.unpad(out.reshape(layout.batch_size, n, -1), layout)

    def fuxi_attention(self, q, k, v, layout: PaddedLayout, ts_w, pos_w) -> torch.Tensor:
        b, n = layout.batch_size, layout.padded_len
        qp, kp, vp = self._padded_heads(layout, q, k, v)
        semantic = F.silu(torch.einsum("bnhd,bmhd->bhnm", qp, kp)) / layout.max_seq_len
        semantic = semantic * layout.causal
        time = self._time_bias(ts_w, layout) * layout.causal
        position = position_bias(pos_w, n, layout.max_seq_len) * layout.causal
        out = torch.cat(
            [
                torch.einsum("bnm,bmhd->bnhd", position.expand(b, n, n), vp),
                torch.einsum("bnm,bmhd->bnhd", time, vp),
                torch.einsum("bhnm,bmhd->bnhd", semantic, vp),
            ],
            dim=-1,
        )  # per head [position, time, semantic]
        return self.unpad(out.reshape(b, n, -1), layout)

    def layer_input(self, x, weight, norm: str, eps: float, split) -> tuple[torch.Tensor, ...]:
        """A layer's projection ``silu(norm(x) @ weight)`` (HSTU: layer norm, FuXi-alpha: RMS
        norm) split into column pieces (u, v, q, k) of ``split`` columns each."""
        normalize = F.layer_norm if norm == "layer_norm" else F.rms_norm
        return torch.split(F.silu(normalize(x, x.shape[-1:], eps=eps) @ weight), split, dim=1)

    def layer_output(self, x, u, attn, linear, norm: str, eps: float, dropout: float, training):
        """A layer's output rows ``x + linear(dropout(u * norm(attn)))`` (HSTU: layer norm,
        FuXi-alpha's AMS output: RMS norm), as the reference code writes it."""
        normalize = F.layer_norm if norm == "layer_norm" else F.rms_norm
        gated = u * normalize(attn, attn.shape[-1:], eps=eps)
        return linear(F.dropout(gated, p=dropout, training=training)) + x

    def input_features(self, embeddings, position_weight, layout, scale, p, training):
        """``dropout(scale * embeddings + position embeddings)``, generative-recommenders'
        learnable positional embedding preprocessor."""
        x = embeddings * scale + F.embedding(self.positions(layout), position_weight)
        return F.dropout(x, p=p, training=training)

    def l2_normalize(self, x) -> torch.Tensor:
        """Unit-norm rows as generative-recommenders writes them (norm, clamp, divide)."""
        return l2_normalize(x)

    def feed_forward(self, x, linears, norm: str, eps: float, dropout: float, training):
        """FuXi-alpha's MFFN stage 2: ``x + down(silu(gate(h)) * up(h))``,
        ``h = dropout(norm(x))``, as the reference code writes it."""
        gate, up, down = linears
        normalize = F.layer_norm if norm == "layer_norm" else F.rms_norm
        h = F.dropout(normalize(x, x.shape[-1:], eps=eps), p=dropout, training=training)
        return down(F.silu(gate(h)) * up(h)) + x

    def next_item_loss(
        self, states, sequence, item_ids, negatives, negative_ids, temperature, predicts_next
    ) -> torch.Tensor:
        """recops.models.loss.sampled_softmax_loss of each row's state against the next row's
        item, as PyTorch ops: shifted views (generative-recommenders' autoregressive loss)."""
        return sampled_softmax_loss(
            states[:-1],
            sequence[1:],
            item_ids[1:],
            negatives,
            negative_ids,
            temperature,
            predicts_next[:-1],
        )

    def top_items(self, states, candidates, k: int, seen):
        """recops.models.recommend.top_items as generative-recommenders' brute-force MIPS: every
        item's score, item 0 and the seen items set to -inf, torch.topk."""
        scores = state_scores(None, states, candidates)
        if seen is not None:
            scores[seen_pairs(seen)] = float("-inf")
        top = scores.topk(k, dim=1)
        return top.indices, top.values

    def item_table(self, weights, learning_rate, eps) -> TorchItemTable:
        return TorchItemTable(weights, learning_rate, eps)
