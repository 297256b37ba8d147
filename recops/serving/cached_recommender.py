"""A served HSTU / FuXi-alpha recommender: each user's history is encoded once, its per-layer keys
and values kept in a paged cache, and a request encodes only the rows the cache lacks
(docs/serving.md).

What is cached, exactly. The models' relative time bias measures query row i from the *next*
row's timestamp, so a row's outputs above the first layer, and with them its keys and values in
the layers above, depend on the row after it. A history row is therefore final once the next event
is known: the cache holds every row of a user's history but the last. A request encodes the
uncached rows (at least the last history row) and the request token, whose timestamp is the
request time, against the cached ones; the last history row's state is the query. Its keys and
values are written to the pages for the request and dropped after it. The result is the full
recompute's (``recops.models.recommend.recommend``) to float rounding.

Positions are absolute within the encoded window of ``max_seq_len - 1`` history items. A history
longer than that slides the window with every event, which changes every row's position: such a
user is encoded whole on each request, as the full recompute does, and not cached.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence

import torch

from recops.models.recommend import evaluating, state_scores, top_items
from recops.serving.delta_attention import delta_attention
from recops.serving.delta_step import DeltaStep
from recops.serving.item_table import ServedItemTable
from recops.serving.paged_cache import CacheFull, CacheLayout, PagedKVCache
from recops.serving.torch_delta_attention import torch_delta_attention

CACHED_MODELS = ("hstu", "fuxi")
# The attention of the new rows: recops' fused delta op, or the plain-PyTorch reference that
# stands for generative-recommenders' pytorch_cached_hstu_mha (benchmarks compare the two).
ATTENTIONS = {"recops": delta_attention, "torch": torch_delta_attention}


def _cat(tensors: list[torch.Tensor]) -> torch.Tensor:
    """torch.cat, but a request of one user's pieces skips the copy (each op costs microseconds
    in a request that takes a few hundred)."""
    return tensors[0] if len(tensors) == 1 else torch.cat(tensors)


class CachedRecommender:
    """``model`` (a trained :class:`recops.models.SequentialRecommender`, HSTU or FuXi-alpha)
    served with a cache of at most ``cache_bytes`` holding keys and values in ``dtype``, the new
    rows attending through ``attention`` ("recops": the fused delta op; "torch": the plain-PyTorch
    reference), the items' embeddings and the catalogue read from ``item_table`` ("fp32": the
    model's; "int8", "int4": a rowwise-quantized copy, recops/serving/item_table.py)."""

    def __init__(
        self,
        model,
        cache_bytes: int,
        *,
        dtype: torch.dtype = torch.float32,
        page_rows: int = 64,
        attention: str = "recops",
        item_table: str = "fp32",
    ):
        config = model.config
        if config.model not in CACHED_MODELS:
            raise ValueError(f"model must be one of {CACHED_MODELS}, got {config.model!r}")
        if attention not in ATTENTIONS:
            raise ValueError(f"attention must be one of {tuple(ATTENTIONS)}, got {attention!r}")
        self.items = ServedItemTable(model, item_table)
        # The delta step: DeltaStep eagerly, or what set_step swapped it for.
        self.step = DeltaStep(model, self.items, ATTENTIONS[attention])
        self._step = self.step
        self.model = model
        self.config = config
        layout = CacheLayout(
            num_layers=config.num_layers,
            num_heads=config.num_heads,
            key_dim=config.attention_dim,
            value_dim=config.linear_dim,
            dtype=dtype,
            page_rows=page_rows,
        )
        self.cache = PagedKVCache(layout, cache_bytes)
        self._histories: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._histories_lock = threading.Lock()

    # ------------------------------------------------------------------------------ histories
    def history(self, user: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(items, timestamps)`` of everything observed for ``user``, oldest first."""
        with self._histories_lock:
            if user not in self._histories:
                raise KeyError(f"user {user} has no observed events")
            return self._histories[user]

    def _checked_events(self, user: int, items, timestamps) -> tuple[torch.Tensor, torch.Tensor]:
        items = torch.as_tensor(items, dtype=torch.int64)
        timestamps = torch.as_tensor(timestamps, dtype=torch.int64)
        items = items if items.dim() == 1 else items.reshape(-1)
        timestamps = timestamps if timestamps.dim() == 1 else timestamps.reshape(-1)
        if items.numel() != timestamps.numel():
            raise ValueError(
                f"user {user}: events need one timestamp per item, got {items.numel()} items "
                f"and {timestamps.numel()} timestamps"
            )
        low, high = torch.aminmax(items) if items.numel() else (1, 1)
        if not 1 <= int(low) <= int(high) <= self.config.num_items:
            raise ValueError(f"user {user}: item ids must be in [1, {self.config.num_items}]")
        return items, timestamps

    def _append(self, user: int, items: torch.Tensor, timestamps: torch.Tensor) -> None:
        with self._histories_lock:
            old_items, old_times = self._histories.get(
                user, (items.new_empty(0), timestamps.new_empty(0))
            )
            self._histories[user] = (
                torch.cat([old_items, items]),
                torch.cat([old_times, timestamps]),
            )

    def set_step(self, step=None) -> None:
        """Runs the delta step through ``step``, a callable taking DeltaStep.forward's arguments
        (an AOTInductor package of it: recops.export.load_delta_step), or eagerly again (None)."""
        self._step = self.step if step is None else step

    # ------------------------------------------------------------------------------ requests
    def observe(
        self, user_ids: Sequence[int], events: Sequence[tuple], encode: bool = True
    ) -> None:
        """Appends ``events[b] = (items, timestamps)`` (oldest first) to user b's history and,
        with ``encode``, encodes its new rows into the cache, all but the last (see the module
        docstring). Without, the next request encodes them (one pass instead of two)."""
        user_ids = [int(u) for u in user_ids]
        if len(events) != len(user_ids):
            raise ValueError(f"events must hold one entry per user, got {len(events)}")
        checked = [self._checked_events(u, *e) for u, e in zip(user_ids, events, strict=True)]
        for user, (items, timestamps) in zip(user_ids, checked, strict=True):  # all or nothing
            self._append(user, items, timestamps)
        if not encode:
            return
        cacheable = [u for u in user_ids if self._window(u)[2]]
        if cacheable:
            self._encode(cacheable, request_times=None)

    def recommend(
        self,
        user_ids: Sequence[int],
        k: int = 10,
        *,
        request_times: Sequence[int] | torch.Tensor | None = None,
        exclude_seen_items: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-k items ``[U, k]`` and scores for each user from its observed history, asked at
        ``request_times[u]`` (default: its last event's time); what
        ``recops.models.recommend.recommend`` returns for the same histories."""
        user_ids = [int(u) for u in user_ids]
        states = self._query_states(user_ids, request_times)
        seen = None
        if exclude_seen_items:
            histories = [self.history(user)[0] for user in user_ids]
            ends = itertools.accumulate(items.numel() for items in histories)
            seen = (torch.tensor([0, *ends]), _cat(histories))
        with evaluating(self.model):
            return top_items(self.model, states, k, seen, self.items.candidates())

    def scores(
        self,
        user_ids: Sequence[int],
        *,
        request_times: Sequence[int] | torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The whole catalogue's scores ``[U, num_items + 1]`` (item 0: -inf) for each user, seen
        items included: what evaluations rank a target among (``recommend`` ranks them without
        storing them)."""
        states = self._query_states([int(u) for u in user_ids], request_times)
        with evaluating(self.model):
            return state_scores(self.model, states, self.items.candidates())

    def _query_states(self, user_ids: list[int], request_times) -> torch.Tensor:
        """``[U, d]`` states of each user's query row, asked at ``request_times[u]`` (default:
        its last event's time)."""
        if request_times is None:
            times = [int(self.history(u)[1][-1]) for u in user_ids]
        else:
            times = torch.as_tensor(request_times, dtype=torch.int64).reshape(-1).tolist()
            if len(times) != len(user_ids):
                raise ValueError(f"request_times must hold one time per user, got {len(times)}")
        return self._encode(user_ids, request_times=times)

    # ------------------------------------------------------------------------------ encoding
    def _window(self, user: int) -> tuple[torch.Tensor, torch.Tensor, bool]:
        """The history rows the model encodes (the last max_seq_len - 1) and whether they are
        the whole history (so their positions, and the cache, stay valid as it grows)."""
        items, timestamps = self.history(user)
        if items.numel() == 0:
            raise ValueError(f"user {user} has no observed events")
        kept = self.config.max_seq_len - 1
        if items.numel() <= kept:
            return items, timestamps, True
        return items[-kept:], timestamps[-kept:], False

    def _encode(self, user_ids: list[int], request_times: list[int] | None) -> torch.Tensor:
        """_encode_together, in parts small enough for the cache's pages when all at once are
        not (a request's rows are written to pages to be attended): CacheFull only when one
        user's rows exceed the cache."""
        try:
            return self._encode_together(user_ids, request_times)
        except CacheFull:
            if len(user_ids) == 1:
                raise
        half = len(user_ids) // 2
        parts = [(user_ids[:half], None), (user_ids[half:], None)]
        if request_times is not None:
            parts = [
                (user_ids[:half], request_times[:half]),
                (user_ids[half:], request_times[half:]),
            ]
        return torch.cat([self._encode(users, times) for users, times in parts])

    def _encode_together(self, user_ids: list[int], request_times: list[int] | None):
        """Encodes each user's uncached window rows (and, for a request, a token at the request
        time) against its cached ones, caching the rows that are final. Returns the states of the
        query rows (the last history row) ``[U, d]`` for a request."""
        windows = [self._window(u) for u in user_ids]
        rows, keep = [], []
        for items, _, cacheable in windows:
            n = items.numel()
            rows.append(n + (request_times is not None))
            keep.append(n - 1 if cacheable else 0)
        # Inference mode, not only no_grad: the ops then skip the autograd layer (about a fifth
        # of a short request's time). The states it returns are inference tensors, read only.
        with (
            self.cache.hold(user_ids, rows, keep) as tables,
            evaluating(self.model),
            torch.inference_mode(),
        ):
            items, times, positions = self._delta_rows(windows, request_times, tables)
            states = self._forward(items, times, positions, tables)
        if request_times is None:
            return states
        rows = [end - 2 for end in itertools.accumulate(tables.row_counts[1])]
        # Each user's row before its token (one user's: a view, an op instead of two).
        return states[rows[0] : rows[0] + 1] if len(rows) == 1 else states[rows]

    @staticmethod
    def _delta_rows(windows, request_times, tables):
        lengths, new_rows = tables.row_counts
        items, times, positions = [], [], []
        for b, (window_items, window_times, _) in enumerate(windows):
            start = lengths[b]
            if request_times is None:
                items.append(window_items[start:])
                times.append(window_times[start:])
            else:  # and the request token: no item, at the request time
                items.append(torch.constant_pad_nd(window_items[start:], (0, 1), 0))
                times.append(torch.constant_pad_nd(window_times[start:], (0, 1), request_times[b]))
            positions.append(torch.arange(start, start + new_rows[b]))
        return _cat(items), _cat(times), _cat(positions)

    def _forward(self, items, times, positions, tables) -> torch.Tensor:
        """The delta step (DeltaStep, or the package it was swapped for) on the new rows."""
        cache = self.cache
        return self._step(
            items, times, positions, cache.slots(tables), tables.pages, tables.lengths,
            tables.new_rows, cache.layer_keys, cache.layer_values, cache.timestamps,
        )  # fmt: skip
