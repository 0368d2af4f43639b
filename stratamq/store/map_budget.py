"""A bound on how many files this process keeps mapped at once, for stores with more
ConsumeQueues than it may open files.

Every live ``mmap`` holds a file descriptor of its own (CPython 3.11 duplicates the one it is
given and keeps it for ``size()``), so a store with one mapped file per queue runs out of
descriptors at about the open-file limit: ten thousand queues on a machine whose limit is
20,000 once stopped the dispatcher with EMFILE. ConsumeQueue files are therefore *evictable*:
they close their own descriptor once mapped (operations that need one open it for the call),
and when more of them are mapped than the budget allows, the least recently used idle ones
are unmapped. The next reader or writer maps the file again (``MappedFile.hold``). Unmapping
loses nothing: the mapping is shared, so written bytes are in the page cache and reach the
disk with the next flush, which syncs the file by path.

The budget is half the soft ``RLIMIT_NOFILE`` (the rest is for CommitLog segments, index files,
RocksDB, sockets), and never below 16.
"""

from __future__ import annotations

import resource
import threading
from collections import OrderedDict
from typing import Protocol

__all__ = ["Evictable", "MappingBudget", "budget"]


class Evictable(Protocol):
    def try_evict(self) -> bool:
        """Unmap if no reader or writer holds the file; True if it was unmapped."""
        ...


class MappingBudget:
    """The mapped evictable files of this process, least recently used first."""

    def __init__(self, limit: int) -> None:
        self.limit = max(16, limit)
        self._lru: OrderedDict[int, Evictable] = OrderedDict()
        self._lock = threading.Lock()
        self.evictions = 0

    def mapped(self, f: Evictable) -> None:
        """``f`` was just mapped, or used: it becomes the most recently used; older idle files
        are unmapped while more than ``limit`` are mapped."""
        with self._lock:
            lru = self._lru
            key = id(f)
            if key in lru:
                lru.move_to_end(key)
                return
            lru[key] = f
            if len(lru) <= self.limit:
                return
            for old_key in list(lru)[: len(lru) - self.limit + self.limit // 8]:
                if old_key == key:
                    continue
                victim = lru[old_key]
                if victim.try_evict():  # busy files (held) stay; the next call retries
                    del lru[old_key]
                    self.evictions += 1

    def unmapped(self, f: Evictable) -> None:
        with self._lock:
            self._lru.pop(id(f), None)

    def __len__(self) -> int:
        return len(self._lru)


def _default_limit() -> int:
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1 << 20
    return soft // 2


budget = MappingBudget(_default_limit())
