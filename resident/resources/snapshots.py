"""SnapshotIndex: which GDN state snapshot holds the state after which cached prefix.

A snapshot is the conv and recurrent state of every GDN layer right after a page-aligned prefix
of a prompt; it is named by that prefix's last page key (page_cache.page_keys), so it is valid
exactly where that key's pages are. The pool has a fixed number of snapshots (the device
tensors are engine/prefix.py's); a new one takes a free index or the least recently used one.
Pure bookkeeping: no device memory here.
"""

from __future__ import annotations

from collections import OrderedDict

from resident.resources.page_cache import PageKey


class SnapshotIndex:
    def __init__(self, num_snapshots: int) -> None:
        if num_snapshots < 1:
            raise ValueError(f"a snapshot pool needs at least 1 snapshot, got {num_snapshots}")
        self.num_snapshots = num_snapshots
        self._free = list(range(num_snapshots - 1, -1, -1))
        self._by_key: OrderedDict[PageKey, int] = OrderedDict()  # key -> index, LRU first
        self.num_evicted = 0

    @property
    def num_used(self) -> int:
        return len(self._by_key)

    def find(self, key: PageKey) -> int | None:
        """The snapshot after the prefix `key` ends, marked recently used; None if none."""
        index = self._by_key.get(key)
        if index is not None:
            self._by_key.move_to_end(key)
        return index

    def __contains__(self, key: PageKey) -> bool:
        return key in self._by_key

    def take(self, key: PageKey) -> int:
        """An index for a new snapshot under `key` (not held yet): a free one, else the least
        recently used one's, which is forgotten."""
        if self._free:
            index = self._free.pop()
        else:
            _, index = self._by_key.popitem(last=False)
            self.num_evicted += 1
        self._by_key[key] = index
        return index
