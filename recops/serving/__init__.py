"""Serving trained recommenders (docs/serving.md): a paged key / value cache that lets a request
encode only a user's new events against the keys and values of the ones already seen, and the
recommender served from it."""

from recops.serving.cached_recommender import CachedRecommender
from recops.serving.paged_cache import CacheFull, CacheLayout, PagedKVCache, PageTables

__all__ = ["CacheFull", "CacheLayout", "CachedRecommender", "PageTables", "PagedKVCache"]
