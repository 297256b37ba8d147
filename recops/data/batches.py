"""Jagged batches of user sequences: what the models consume. Sequences are packed row after row
(``seq_offsets``), never padded; each batch names the rows whose output is asked to predict an
item (``query_rows``) and that item (``targets``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import torch

from recops.data.sequences import UserSequences, complete_offsets


@dataclasses.dataclass(frozen=True)
class JaggedBatch:
    """B sequences of items with timestamps, packed: sequence b is rows
    ``seq_offsets[b]:seq_offsets[b + 1]`` of ``item_ids`` / ``timestamps``, oldest first.

    ``max_seq_len`` is the model's N (positions, relative bias, HSTU's 1/N scale), ``padded_len``
    this batch's longest sequence (the width of padded formulations). The output at
    ``query_rows[i]`` predicts ``targets[i]``. In training batches every row but a sequence's last
    predicts the next row's item, and ``predicts_next`` marks those rows; in evaluation and
    request batches it is None and ``seen`` lists, jagged, the items each query's ranking
    excludes: query m's are ``seen[1][seen[0][m]:seen[0][m + 1]]`` (offsets from 0 to every
    item).
    """

    item_ids: torch.Tensor  # [L] int64
    timestamps: torch.Tensor  # [L] int64
    seq_offsets: torch.Tensor  # [B + 1] int64
    max_seq_len: int
    padded_len: int
    query_rows: torch.Tensor  # [M] int64
    targets: torch.Tensor | None = None  # [M] int64; None in request batches
    predicts_next: torch.Tensor | None = None  # [L] bool
    seen: tuple[torch.Tensor, torch.Tensor] | None = None  # ([M + 1] offsets, [S] items)

    @property
    def batch_size(self) -> int:
        return self.seq_offsets.numel() - 1

    @property
    def lengths(self) -> torch.Tensor:
        return self.seq_offsets[1:] - self.seq_offsets[:-1]


def segment_ids(offsets: torch.Tensor, rows: int) -> torch.Tensor:
    """``[rows]``: the segment of ``offsets`` (from 0) each row falls in."""
    positions = torch.arange(rows, dtype=offsets.dtype, device=offsets.device)
    # (offsets[1:] would be a slice whose contiguity check specialises the batch size to >= 2
    # under torch.export.)
    return torch.searchsorted(offsets, positions, right=True) - 1


def seen_pairs(seen: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """``JaggedBatch.seen`` as (query index, item) pairs, what indexes a ``[M, items]`` tensor
    (sizes that torch.export keeps symbolic)."""
    offsets, items = seen
    return segment_ids(offsets, items.numel()), items


def _rows(starts: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(source rows ``starts[b] + 0..lengths[b] - 1`` for every b, concatenated; their offsets)."""
    offsets = complete_offsets(lengths)
    total = int(offsets[-1])
    steps = torch.repeat_interleave(starts - offsets[:-1], lengths, output_size=total)
    return steps + torch.arange(total), offsets


def train_batches(
    data: UserSequences, batch_size: int, max_seq_len: int, generator: torch.Generator
) -> Iterator[JaggedBatch]:
    """One epoch of training batches over the users in random order: each user's training
    history (all but the last two items), cut to its last ``max_seq_len`` items; every position
    but the last predicts the next item. Users with fewer than two training items are skipped."""
    history = data.history_lengths("train")
    users = torch.nonzero(history >= 2).flatten()
    users = users[torch.randperm(users.numel(), generator=generator)]
    for chunk in users.split(batch_size):
        lengths = history[chunk].clamp(max=max_seq_len)
        rows, offsets = _rows(data.offsets[chunk] + history[chunk] - lengths, lengths)
        items = data.items[rows]
        predicts_next = torch.ones(rows.numel(), dtype=torch.bool)
        predicts_next[offsets[1:] - 1] = False
        query_rows = torch.nonzero(predicts_next).flatten()
        yield JaggedBatch(
            item_ids=items,
            timestamps=data.timestamps[rows],
            seq_offsets=offsets,
            max_seq_len=max_seq_len,
            padded_len=int(lengths.max()),
            query_rows=query_rows,
            targets=items[query_rows + 1],
            predicts_next=predicts_next,
        )


def request_batch(
    history_items: torch.Tensor,
    history_timestamps: torch.Tensor,
    history_offsets: torch.Tensor,
    request_times: torch.Tensor,
    max_seq_len: int,
    targets: torch.Tensor | None = None,
    exclude_seen: bool = True,
) -> JaggedBatch:
    """A batch asking for each user's next item: the last ``max_seq_len - 1`` items of each
    (jagged, non-empty) history, then a request token (item 0) carrying the time of the request.

    The query row is each history's last item. HSTU's and FuXi-alpha's time bias measures a
    position's time from the next position's, so the last history item's is measured from the
    request time, as in training it is from the time of the item it predicts (generative
    recommenders puts the target's timestamp after the history the same way). The token's own
    output is unused, and the attention being causal no other position sees it. ``seen`` lists
    every history item (not only the kept window) when ``exclude_seen``: ``history_offsets``
    and ``history_items`` as given, which therefore run from offset 0 over every item."""
    lengths = history_offsets[1:] - history_offsets[:-1]
    if lengths.numel() and int(lengths.min()) < 1:
        raise ValueError("every history needs at least one item")
    kept = lengths.clamp(max=max_seq_len - 1)
    rows, offsets = _rows(history_offsets[:-1] + lengths - kept, kept + 1)
    token_rows = offsets[1:] - 1
    is_history = torch.ones(rows.numel(), dtype=torch.bool)
    is_history[token_rows] = False
    item_ids = torch.zeros(rows.numel(), dtype=torch.int64)
    item_ids[is_history] = history_items[rows[is_history]]
    timestamps = torch.empty(rows.numel(), dtype=torch.int64)
    timestamps[is_history] = history_timestamps[rows[is_history]]
    timestamps[token_rows] = request_times.to(torch.int64)
    seen = (history_offsets, history_items) if exclude_seen else None
    return JaggedBatch(
        item_ids=item_ids,
        timestamps=timestamps,
        seq_offsets=offsets,
        max_seq_len=max_seq_len,
        padded_len=int(kept.max()) + 1 if kept.numel() else 0,
        query_rows=token_rows - 1,
        targets=targets,
        seen=seen,
    )


def eval_batches(
    data: UserSequences, split: str, batch_size: int, max_seq_len: int
) -> Iterator[JaggedBatch]:
    """Every user once, in order: the history before the ``split``'s target ("valid" or
    "test"), asked at the target's time, with that target; rankings exclude the history."""
    history = data.history_lengths(split)
    for chunk in torch.arange(data.num_users).split(batch_size):
        starts = data.offsets[chunk]
        rows, offsets = _rows(starts, history[chunk])
        target_at = starts + history[chunk]
        yield request_batch(
            data.items[rows],
            data.timestamps[rows],
            offsets,
            data.timestamps[target_at],
            max_seq_len,
            targets=data.items[target_at],
        )
