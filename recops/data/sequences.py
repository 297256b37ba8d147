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
class Split:
    """Which part of every user's sequence a split uses: the history ``items[start:start + n]``
    (n = ``history_lengths``) and, for validation and test, the target right after it."""

    name: str
    history_lengths: torch.Tensor  # [U]
    has_target: bool


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

    def split(self, name: str) -> Split:
        """``train``: all but the last two items (the model learns to predict each next one);
        ``valid``: that history and the second-to-last item as target; ``test``: all but the last
        item and the last as target."""
        held_out = {"train": 2, "valid": 2, "test": 1}
        if name not in held_out:
            raise ValueError(f"unknown split {name!r} (train, valid or test)")
        return Split(name, self.lengths - held_out[name], has_target=name != "train")
