"""Serving trained recommenders (docs/serving.md): the paged key / value cache that lets a request
encode only a user's new events against the keys and values of the ones already seen."""

from recops.serving.paged_cache import CacheFull, CacheLayout, PagedKVCache, PageTables

__all__ = ["CacheFull", "CacheLayout", "PageTables", "PagedKVCache"]
