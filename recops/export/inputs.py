"""The exported recommender's inputs from user histories, and the text format the C++ serving
program (examples/cpp_serving) reads and writes.

A request file holds one user a line, ``request_time item:timestamp item:timestamp ...``, the
history oldest first; the program answers a line a user, ``item:score ...``, best first.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from recops.data.sequences import complete_offsets


def graph_inputs(
    user_histories: Sequence[tuple[Sequence[int], Sequence[int]]],
    max_seq_len: int,
    request_times: Sequence[int] | torch.Tensor | None = None,
    exclude_seen_items: bool = True,
) -> tuple[torch.Tensor, ...]:
    """The six int64 tensors RecommenderGraph takes, for ``user_histories`` as
    ``recops.recommend`` takes them: each history's window (its last ``max_seq_len - 1``
    interactions), the request times (default: each history's last timestamp) and the items to
    exclude (every history item, or none)."""
    if not user_histories:
        raise ValueError("user_histories is empty: a batch has at least one user")
    items = [torch.as_tensor(h[0], dtype=torch.int64) for h in user_histories]
    times = [torch.as_tensor(h[1], dtype=torch.int64) for h in user_histories]
    for user, (i, t) in enumerate(zip(items, times, strict=True)):
        if i.dim() != 1 or i.shape != t.shape or i.numel() == 0:
            raise ValueError(
                f"user_histories[{user}] needs as many timestamps as items, at least one of each"
            )
    if request_times is None:
        request_times = torch.stack([t[-1] for t in times])
    request_times = torch.as_tensor(request_times, dtype=torch.int64)
    if request_times.shape != (len(items),):
        raise ValueError(f"request_times needs one time per user ({len(items)})")
    window = max_seq_len - 1
    lengths = torch.tensor([i.numel() for i in items])
    seen = torch.cat(items) if exclude_seen_items else torch.zeros(0, dtype=torch.int64)
    seen_lengths = lengths if exclude_seen_items else torch.zeros_like(lengths)
    return (
        torch.cat([i[-window:] for i in items]),
        torch.cat([t[-window:] for t in times]),
        complete_offsets(lengths.clamp(max=window)),
        request_times,
        seen,
        complete_offsets(seen_lengths),
    )


def write_requests(path, user_histories, request_times=None) -> None:
    """``user_histories`` (and their request times, default each last timestamp) as a request
    file of the C++ serving program."""
    with open(path, "w") as out:
        for user, (items, times) in enumerate(user_histories):
            when = int(times[-1]) if request_times is None else int(request_times[user])
            pairs = " ".join(f"{int(i)}:{int(t)}" for i, t in zip(items, times, strict=True))
            out.write(f"{when} {pairs}\n")


def read_answers(path) -> tuple[torch.Tensor, torch.Tensor]:
    """``(items [U, k], scores [U, k])`` of the C++ serving program's answer file."""
    items, scores = [], []
    with open(path) as answers:
        for line in answers:
            pairs = [pair.split(":") for pair in line.split()]
            items.append([int(i) for i, _ in pairs])
            scores.append([float(s) for _, s in pairs])
    return torch.tensor(items, dtype=torch.int64), torch.tensor(scores, dtype=torch.float32)
