"""Synthetic user sequences with learnable structure, for tests and long-sequence benchmarks.

Items fall into equal groups; each user stays in one group and mostly walks through it in order
(the next item is the current one's successor in its group with probability ``follow``, else a
random item of the group). A sequential model can learn both the group (from the history) and
the walk (from the last item), so its hit rate rises far above the 1 / num_items of chance.
Timestamps increase by log-uniform gaps from one second to about eleven days, so the relative
time bias sees a spread of buckets.
"""

from __future__ import annotations

import math

import torch

from recops.data.sequences import MIN_SEQUENCE_LENGTH, UserSequences, complete_offsets

_MAX_GAP_SECONDS = 10**6
_FIRST_TIMESTAMP = 1_600_000_000


def synthetic_sequences(
    num_users: int,
    num_items: int,
    min_length: int,
    max_length: int,
    *,
    num_groups: int = 8,
    follow: float = 0.8,
    seed: int = 0,
) -> UserSequences:
    """``num_users`` sequences with lengths uniform in ``[min_length, max_length]`` over items
    ``1..num_items`` (``num_items`` a multiple of ``num_groups``), reproducible from ``seed``."""
    if min_length < MIN_SEQUENCE_LENGTH or max_length < min_length:
        raise ValueError(f"need {MIN_SEQUENCE_LENGTH} <= min_length <= max_length")
    if num_items % num_groups:
        raise ValueError("num_items must be a multiple of num_groups")
    gen = torch.Generator().manual_seed(seed)
    group_size = num_items // num_groups
    lengths = torch.randint(min_length, max_length + 1, (num_users,), generator=gen)
    first_item = torch.randint(0, num_groups, (num_users,), generator=gen) * group_size + 1
    # Offsets inside each user's group, one column per position, walked left to right.
    steps = torch.empty(num_users, max_length, dtype=torch.int64)
    steps[:, 0] = torch.randint(0, group_size, (num_users,), generator=gen)
    follows = torch.rand(num_users, max_length, generator=gen) < follow
    jumps = torch.randint(0, group_size, (num_users, max_length), generator=gen)
    for t in range(1, max_length):
        steps[:, t] = torch.where(follows[:, t], (steps[:, t - 1] + 1) % group_size, jumps[:, t])
    log_gaps = torch.rand(num_users, max_length, generator=gen) * math.log(_MAX_GAP_SECONDS)
    times = _FIRST_TIMESTAMP + log_gaps.exp().long().cumsum(1)
    valid = torch.arange(max_length) < lengths[:, None]
    return UserSequences(
        items=(first_item[:, None] + steps)[valid],
        timestamps=times[valid],
        offsets=complete_offsets(lengths),
        num_items=num_items,
        name=f"synthetic-{num_users}x{min_length}-{max_length}",
    )
