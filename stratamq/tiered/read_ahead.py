"""The fetcher's read-ahead cache (RocketMQ's Caffeine cache in ``MessageStoreFetcherImpl``).

Entries are single messages keyed ``(topic, queue id, queue offset)``; one ranged read of the
tier fills up to ``readAheadMessageCountThreshold`` messages / ``readAheadMessageSizeThreshold``
bytes, and the reads that follow are served from here. Weighted by record size, bounded by
``readAheadCacheSizeThresholdRate`` of the memory the process may use, an entry is dropped
when it was not read or written for ``readAheadCacheExpireDuration`` (expire after access),
least recently used first when full.

Thread-safety: every method takes the cache's lock.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import NamedTuple

__all__ = ["CachedMessage", "ReadAheadCache", "memory_limit"]


class CachedMessage(NamedTuple):
    data: bytes
    tags_code: int


def memory_limit() -> int:
    """Bytes this process may use: physical memory, or a cgroup's limit when lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in (Path("/sys/fs/cgroup/memory.max"),
                 Path("/sys/fs/cgroup/memory/memory.limit_in_bytes")):
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total


class ReadAheadCache:
    def __init__(self, max_bytes: int, expire_ms: int) -> None:
        self.max_bytes = max_bytes
        self.expire_s = expire_ms / 1000
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[str, int, int], tuple[CachedMessage, float]] = \
            OrderedDict()
        self.bytes = 0
        self.accesses = 0
        self.hits = 0

    def _expire(self, now: float) -> None:
        entries = self._entries
        while entries:
            key, (msg, touched) = next(iter(entries.items()))
            if now - touched < self.expire_s and self.bytes <= self.max_bytes:
                break
            entries.popitem(last=False)
            self.bytes -= len(msg.data)

    def get(self, key: tuple[str, int, int]) -> CachedMessage | None:
        now = time.monotonic()
        with self._lock:
            self.accesses += 1
            found = self._entries.get(key)
            if found is None or now - found[1] >= self.expire_s:
                return None
            self.hits += 1
            self._entries[key] = (found[0], now)
            self._entries.move_to_end(key)
            return found[0]

    def put(self, key: tuple[str, int, int], msg: CachedMessage) -> None:
        now = time.monotonic()
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.bytes -= len(old[0].data)
            self._entries[key] = (msg, now)
            self.bytes += len(msg.data)
            self._expire(now)

    def busy(self) -> bool:
        """Past 80% of its size: RocketMQ then reads the tier directly, without read-ahead."""
        return self.bytes > self.max_bytes * 0.8

    def __len__(self) -> int:
        return len(self._entries)

    def hit_ratio(self) -> float:
        return self.hits / self.accesses if self.accesses else 0.0
