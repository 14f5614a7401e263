"""BoundedCache: a dict with a size bound, for caches whose keys may never repeat."""

from __future__ import annotations

from typing import Any, Hashable


class BoundedCache:
    """Values by key, emptied whenever a new key would exceed ``capacity``: unnamed tensors make new keys on
    every call, so the caches built from calls need a bound, and the ones on the hot path must cost no
    more than a dict lookup to read (``get`` is the dict's own)."""

    def __init__(self, capacity: int):
        self._capacity = capacity
        self._items: dict = {}
        self.get = self._items.get

    def put(self, key: Hashable, value: Any) -> Any:
        """Store ``value`` under ``key`` (forgetting everything first if the cache is full) and return it."""
        items = self._items
        if len(items) >= self._capacity and key not in items:
            items.clear()
        items[key] = value
        return value

    def __len__(self) -> int:
        return len(self._items)

    def items(self):
        return self._items.items()
