"""Per-user chronological sequences and their leave-one-out split (SASRec, HSTU): a user's last
item is the test target, the one before it the validation target, the rest is training data."""

from __future__ import annotations

import dataclasses

import torch

from recops.data.readers import Interactions

# A user needs one training item before the validation and test targets.
MIN_SEQUENCE_LENGTH = 3


def complete_offsets(lengths: torch.Tensor) -> torch.Tensor:
    """``[0, l0, l0 + l1, ...]``: the B + 1 offsets of jagged rows of these lengths."""
    return torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])


@dataclasses.dataclass(frozen=True)
class UserSequences:
    """Every user's interactions in chronological order, concatenated: user u's are
    ``items[offsets[u]:offsets[u + 1]]`` with their ``timestamps`` (seconds). Item ids run from 1
    to ``num_items``; 0 means "no item"."""

    items: torch.Tensor  # [R] int64
    timestamps: torch.Tensor  # [R] int64
    offsets: torch.Tensor  # [U + 1] int64
    num_items: int
    name: str
    item_tokens: list[str] | None = None  # raw id of each item (item i is item_tokens[i - 1])

    @property
    def num_users(self) -> int:
        return self.offsets.numel() - 1

    @property
    def lengths(self) -> torch.Tensor:
        return self.offsets[1:] - self.offsets[:-1]

    @classmethod
    def from_interactions(cls, interactions: Interactions, name: str) -> UserSequences:
        """Groups interactions by user and sorts each user's by time (ties keep file order);
        users with fewer than three interactions are dropped (they cannot be split)."""
        order = torch.argsort(interactions.timestamps, stable=True)
        order = order[torch.argsort(interactions.users[order], stable=True)]
        users = interactions.users[order]
        counts = torch.bincount(users)
        keep = (counts >= MIN_SEQUENCE_LENGTH)[users]
        counts = counts[counts >= MIN_SEQUENCE_LENGTH]
        if counts.numel() == 0:
            raise ValueError(
                f"{interactions.source}: no user has {MIN_SEQUENCE_LENGTH} interactions"
            )
        return cls(
            items=interactions.items[order][keep],
            timestamps=interactions.timestamps[order][keep],
            offsets=complete_offsets(counts),
            num_items=len(interactions.item_tokens),
            name=name,
            item_tokens=interactions.item_tokens,
        )

    def history_lengths(self, split: str) -> torch.Tensor:
        """``[U]``: how many of each user's first items a split uses as history. ``train``: all
        but the last two (the model learns to predict each next one); ``valid``: the same, with
        the second-to-last item as target; ``test``: all but the last item, which is the
        target. A split's target is the item right after its history."""
        held_out = {"train": 2, "valid": 2, "test": 1}
        if split not in held_out:
            raise ValueError(f"unknown split {split!r} (train, valid or test)")
        return self.lengths - held_out[split]
