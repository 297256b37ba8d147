"""A paged key / value cache for serving generative recommenders (docs/serving.md).

Per user and per layer, the keys and values of the rows already encoded, with each row's
timestamp (the relative time bias reads the keys' times), in fixed-size pages of one pool that is
allocated once: vLLM's and Rec SDK's ``hstu_paged`` layout, one page table per user shared by every
layer. Appending rows fills the user's last page and takes new pages; old rows never move. When
pages run short, whole users are evicted, least recently used first. The pool's bytes never exceed
the capacity it was given.

Requests may come from several threads. The bookkeeping (page tables, the LRU order, which users a
request holds) is under one lock; the reads and writes of page contents are not: a request holds
its users (:meth:`PagedKVCache.hold`) so that no other request evicts or extends them meanwhile,
and a request that asks for a user another one holds waits for it.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import sys
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence

import torch

from recops.data.sequences import complete_offsets


@dataclasses.dataclass(frozen=True)
class CacheLayout:
    """What one cached row holds: ``num_layers`` x (keys ``[num_heads, key_dim]`` and values
    ``[num_heads, value_dim]``) in ``dtype``, and a float64 timestamp (the attention ops' time
    type: exact for integer times below 2^53). ``page_rows`` rows a page."""

    num_layers: int
    num_heads: int
    key_dim: int
    value_dim: int
    dtype: torch.dtype = torch.float32
    page_rows: int = 64

    def __post_init__(self):
        for name in ("num_layers", "num_heads", "key_dim", "value_dim", "page_rows"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise ValueError(f"dtype must be float32, bfloat16 or float16, got {self.dtype}")
        if self.dtype == torch.bfloat16 and self.page_rows % 2:
            # The bf16 attention tiles pair keys: a page must start at an even key.
            raise ValueError(f"bfloat16 pages need an even page_rows, got {self.page_rows}")

    @property
    def row_bytes(self) -> int:
        element = torch.empty(0, dtype=self.dtype).element_size()
        per_layer = self.num_heads * (self.key_dim + self.value_dim) * element
        return self.num_layers * per_layer + 8  # + the float64 timestamp

    @property
    def page_bytes(self) -> int:
        return self.page_rows * self.row_bytes


class CacheFull(RuntimeError):
    """The users a request needs do not fit in the cache, even with every other user evicted."""


@dataclasses.dataclass
class _Entry:
    pages: list[int]
    length: int = 0  # cached rows


@dataclasses.dataclass(frozen=True)
class PageTables:
    """The page tables of a batch of users: ``pages[b, j]`` is the pool page holding user b's rows
    ``[j * page_rows, (j + 1) * page_rows)`` (-1 past its pages), ``lengths[b]`` its cached rows
    and ``new_rows[b]`` the rows the request appends after them (pages reserved)."""

    pages: torch.Tensor  # [B, max_pages] int32
    lengths: torch.Tensor  # [B] int64
    new_rows: torch.Tensor  # [B] int64

    # What the delta ops read besides the pages, computed once for every layer of a step.
    @functools.cached_property
    def delta_offsets(self) -> torch.Tensor:
        """``[B + 1]`` offsets of the users' new rows among the request's."""
        return complete_offsets(self.new_rows)

    @functools.cached_property
    def seq_lengths(self) -> torch.Tensor:
        """``[B]`` rows of each user after the request's: cached and new."""
        return self.lengths + self.new_rows

    @functools.cached_property
    def row_counts(self) -> tuple[list[int], list[int]]:
        """``(lengths, new_rows)`` as Python lists, for the request's bookkeeping (reading them
        from the tensors entry by entry costs an op each)."""
        return self.lengths.tolist(), self.new_rows.tolist()


_MADV_HUGEPAGE = 14  # Linux's madvise advice for transparent huge pages
_HUGE_PAGE_BYTES = 2 << 20


def _pool(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zeroed pool whose memory Linux may back with 2 MiB pages, asked for before the memory is
    first touched (transparent huge pages in madvise mode serve only the ranges advised). A
    user's pages lie scattered over the pool, and with 4 KiB pages each of them costs TLB misses
    whose page walks miss the caches too: the delta op read a user's 4105 cold keys from pages
    scattered over the pool 1.2-2.1x as fast with them (H=2, D=32, fp32). Elsewhere, or where the
    kernel declines, the pool is plain memory."""
    pool = torch.empty(shape, dtype=dtype)
    start = pool.data_ptr()
    first = -(-start // _HUGE_PAGE_BYTES) * _HUGE_PAGE_BYTES
    last = (start + pool.numel() * pool.element_size()) // _HUGE_PAGE_BYTES * _HUGE_PAGE_BYTES
    if sys.platform == "linux" and last > first:
        with contextlib.suppress(OSError, AttributeError):
            madvise = ctypes.CDLL(None, use_errno=True).madvise
            madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            madvise(first, last - first, _MADV_HUGEPAGE)  # advice: a failure changes nothing
    return pool.zero_()


def store_rows(pool: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor) -> None:
    """Writes ``rows`` at row ``slots`` of ``pool [pages, page_rows, ...]`` in place, in the pool's
    dtype: the one place the cache's pages are written."""
    pool.flatten(0, 1).index_copy_(0, slots, rows.to(pool.dtype))


class PagedKVCache:
    """Keys, values and timestamps of users' encoded rows in a pool of at most ``capacity_bytes``.

    ``keys[layer]`` is ``[num_pages, page_rows, num_heads, key_dim]`` (``values`` likewise with
    ``value_dim``), ``timestamps`` ``[num_pages, page_rows]``."""

    def __init__(self, layout: CacheLayout, capacity_bytes: int):
        num_pages = capacity_bytes // layout.page_bytes
        if num_pages < 1:
            raise ValueError(
                f"capacity_bytes must hold at least one page of {layout.page_bytes} bytes "
                f"({layout.page_rows} rows), got {capacity_bytes}"
            )
        self.layout = layout
        self.capacity_bytes = capacity_bytes
        shape = (layout.num_layers, num_pages, layout.page_rows, layout.num_heads)
        self.keys = _pool((*shape, layout.key_dim), layout.dtype)
        self.values = _pool((*shape, layout.value_dim), layout.dtype)
        self.timestamps = _pool((num_pages, layout.page_rows), torch.float64)
        # Each layer's pools, as the delta step takes them (views made once, not per request).
        self.layer_keys, self.layer_values = self.keys.unbind(0), self.values.unbind(0)
        self._free = list(range(num_pages - 1, -1, -1))  # pop() takes the lowest page first
        self._users: OrderedDict[int, _Entry] = OrderedDict()  # least recently used first
        self._held: set[int] = set()
        self._changed = threading.Condition()

    @property
    def num_pages(self) -> int:
        return self.timestamps.shape[0]

    @property
    def nbytes(self) -> int:
        """The pool's bytes (at most ``capacity_bytes``)."""
        return sum(t.numel() * t.element_size() for t in (self.keys, self.values, self.timestamps))

    @property
    def free_pages(self) -> int:
        with self._changed:
            return len(self._free)

    def __len__(self) -> int:
        with self._changed:
            return len(self._users)

    def cached_rows(self, user: int) -> int:
        """Rows cached for ``user`` (0 if none or evicted); does not count as a use."""
        with self._changed:
            entry = self._users.get(user)
            return 0 if entry is None else entry.length

    def _pages_for(self, rows: int) -> int:
        return -(-rows // self.layout.page_rows)

    def _reserve(self, users: list[int], rows: list[int]) -> list[int]:
        """Pages for ``rows[b]`` rows of every user, evicting unheld users least recently used
        first; returns the users that were not cached. All or nothing: on CacheFull nothing
        changed."""
        needed = 0
        for user, count in zip(users, rows, strict=True):
            entry = self._users.get(user)
            have = 0 if entry is None else len(entry.pages)
            needed += max(0, self._pages_for(count) - have)
        if needed > len(self._free):  # (a scan of every cached user only when it must evict)
            evictable = [u for u in self._users if u not in self._held and u not in users]
            spare = len(self._free) + sum(len(self._users[u].pages) for u in evictable)
            if needed > spare:
                raise CacheFull(
                    f"the request needs {needed} more pages of {self.layout.page_rows} rows; "
                    f"{spare} of the cache's {self.num_pages} can be freed"
                )
            for victim in evictable:
                if len(self._free) >= needed:
                    break
                self._drop(victim)
        added = []
        for user, count in zip(users, rows, strict=True):
            entry = self._users.get(user)
            if entry is None:
                entry = self._users[user] = _Entry(pages=[])
                added.append(user)
            self._users.move_to_end(user)
            while len(entry.pages) < self._pages_for(count):
                entry.pages.append(self._free.pop())
        return added

    def _drop(self, user: int) -> None:
        self._free.extend(reversed(self._users.pop(user).pages))

    @contextlib.contextmanager
    def hold(
        self,
        users: Sequence[int],
        rows: Sequence[int],
        keep_rows: Sequence[int] | None = None,
    ) -> Iterator[PageTables]:
        """Holds ``users`` for one request after which user b has ``rows[b]`` rows: the cached
        ones it keeps (at most ``keep_rows[b]``: rows past it are stale and dropped), then the
        rows the request writes (:meth:`slots`, :meth:`write`), pages reserved for them; yields
        their page tables. When the block exits normally the first ``keep_rows[b]`` (default:
        all) rows count as cached and pages past them are freed; on an exception the request's
        rows are dropped. Users not cached start empty. Waits while another request holds any of
        the users; raises CacheFull (changing nothing) when the rows cannot fit."""
        users = [int(u) for u in users]
        rows = [int(n) for n in rows]
        keep_rows = rows if keep_rows is None else [int(n) for n in keep_rows]
        if len(set(users)) != len(users):
            raise ValueError(f"users must be distinct within a request, got {users}")
        if len(rows) != len(users) or any(n < 0 for n in rows):
            raise ValueError(f"rows must hold one count >= 0 per user, got {rows}")
        if len(keep_rows) != len(rows) or any(
            not 0 <= k <= n for k, n in zip(keep_rows, rows, strict=True)
        ):
            raise ValueError(f"keep_rows must be in [0, rows], got {keep_rows} for {rows}")
        with self._changed:
            self._changed.wait_for(lambda: self._held.isdisjoint(users))
            added = self._reserve(users, rows)
            self._held.update(users)
            for user, keep in zip(users, keep_rows, strict=True):
                entry = self._users[user]
                entry.length = min(entry.length, keep)
            tables = self._page_tables(users, rows)
        committed = False
        try:
            yield tables
            committed = True
        finally:
            with self._changed:
                for user, keep in zip(users, keep_rows, strict=True):
                    entry = self._users[user]
                    if committed:
                        entry.length = keep
                    if entry.length == 0 and user in added:
                        self._drop(user)
                    else:  # give back the pages past the cached rows
                        used = self._pages_for(entry.length)
                        self._free.extend(reversed(entry.pages[used:]))
                        del entry.pages[used:]
                self._held.difference_update(users)
                self._changed.notify_all()

    def _page_tables(self, users: list[int], rows: list[int]) -> PageTables:
        # Built from Python lists in one tensor each: a request of one user builds them in a few
        # microseconds, where tensor arithmetic costs that per operation.
        entries = [self._users[u] for u in users]
        width = max((len(e.pages) for e in entries), default=0)
        padded = [e.pages + [-1] * (width - len(e.pages)) for e in entries]
        pages = torch.tensor(padded, dtype=torch.int32).reshape(len(users), width)
        lengths = [e.length for e in entries]
        new_rows = [n - length for n, length in zip(rows, lengths, strict=True)]
        counts = torch.tensor([lengths, new_rows], dtype=torch.int64).reshape(2, len(users))
        return PageTables(pages, counts[0], counts[1])

    def slots(self, tables: PageTables) -> torch.Tensor:
        """Pool row slots (``page * page_rows + row``) of every request's new rows, users in
        order: where :meth:`write` puts them."""
        page_rows = self.layout.page_rows
        slots = []
        for pages, length, new in zip(tables.pages.tolist(), *tables.row_counts, strict=True):
            for position in range(length, length + new):
                slots.append(pages[position // page_rows] * page_rows + position % page_rows)
        return torch.tensor(slots, dtype=torch.int64)

    def write(
        self,
        layer: int,
        slots: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        timestamps: torch.Tensor | None = None,
    ) -> None:
        """Stores one layer's keys ``[R, num_heads, key_dim]`` and values of a held request's new
        rows at ``slots`` (:meth:`slots`), and their timestamps once (any layer)."""
        store_rows(self.keys[layer], slots, keys)
        store_rows(self.values[layer], slots, values)
        if timestamps is not None:
            store_rows(self.timestamps, slots, timestamps)

    def gather(self, layer: int, tables: PageTables, user: int) -> tuple[torch.Tensor, ...]:
        """Row ``user`` of ``tables``: its cached rows and the request's new ones (written
        already) of one layer, contiguous: ``(keys [n, num_heads, key_dim], values, timestamps
        [n])``. A copy, for references and tests; the paged kernels read the pages in place."""
        n = int(tables.lengths[user] + tables.new_rows[user])
        pages = tables.pages[user, : self._pages_for(n)].long()
        return tuple(
            t[pages].flatten(0, 1)[:n]
            for t in (self.keys[layer], self.values[layer], self.timestamps)
        )

    def evict(self, user: int) -> bool:
        """Drops ``user``'s rows (waiting while a request holds it); whether it was cached."""
        with self._changed:
            self._changed.wait_for(lambda: user not in self._held)
            if user not in self._users:
                return False
            self._drop(user)
            return True
