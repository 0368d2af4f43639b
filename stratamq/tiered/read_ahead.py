"""The fetcher's read-ahead cache (RocketMQ's cache in ``MessageStoreFetcherImpl``).

One ranged read of the tier brings up to ``readAheadMessageCountThreshold`` messages /
``readAheadMessageSizeThreshold`` bytes of a queue; they are kept as one *chunk* (consecutive
queue offsets), and the reads that follow are served from it. A reader that gets past the
middle of a chunk starts the read of the next one in the background (at most one in flight per
queue and offset; a read that needs it waits for it, as RocketMQ's in-flight request map
does), so a sequential reader seldom waits for the tier. Chunks are weighted by their bytes,
bounded by ``readAheadCacheSizeThresholdRate`` of the memory the process may use, dropped when
not read or written for ``readAheadCacheExpireDuration`` (expire after access), least recently
used first when full. ``accesses`` / ``hits`` count messages asked for / found.

Thread-safety: every method takes the cache's lock.
"""

from __future__ import annotations

import bisect
import os
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future
from pathlib import Path

from stratamq.tiered.flat_message_file import RecordBlock

__all__ = ["Chunk", "ReadAheadCache", "memory_limit"]


Chunk = RecordBlock  # one read-ahead: consecutive messages of a queue, one buffer


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


_Key = tuple[str, int, int]  # topic, queue id, chunk start


class ReadAheadCache:
    def __init__(self, max_bytes: int, expire_ms: int) -> None:
        self.max_bytes = max_bytes
        self.expire_s = expire_ms / 1000
        self._lock = threading.Lock()
        self._chunks: OrderedDict[_Key, tuple[Chunk, float]] = OrderedDict()
        self._starts: dict[tuple[str, int], list[int]] = {}  # sorted chunk starts per queue
        self.in_flight: dict[_Key, Future] = {}
        self.bytes = 0
        self.messages = 0
        self.accesses = 0
        self.hits = 0

    def _drop(self, key: _Key) -> None:
        chunk, _touched = self._chunks.pop(key)
        self.bytes -= chunk.nbytes
        self.messages -= chunk.length
        starts = self._starts[key[:2]]
        starts.pop(bisect.bisect_left(starts, key[2]))
        if not starts:
            del self._starts[key[:2]]

    def _expire(self, now: float) -> None:
        while self._chunks:
            key, (_chunk, touched) = next(iter(self._chunks.items()))
            if now - touched < self.expire_s and self.bytes <= self.max_bytes:
                break
            self._drop(key)

    def find(self, topic: str, queue_id: int, offset: int) -> Chunk | None:
        """The chunk holding ``offset`` (counted as one access, a hit when found)."""
        now = time.monotonic()
        with self._lock:
            self.accesses += 1
            starts = self._starts.get((topic, queue_id))
            if not starts:
                return None
            index = bisect.bisect_right(starts, offset) - 1
            if index < 0:
                return None
            key = (topic, queue_id, starts[index])
            chunk, touched = self._chunks[key]
            if offset >= chunk.end or now - touched >= self.expire_s:
                return None
            self.hits += 1
            self._chunks[key] = (chunk, now)
            self._chunks.move_to_end(key)
            return chunk

    def count_hits(self, served: int) -> None:
        """Messages served from a chunk after the first one ``find`` counted."""
        with self._lock:
            self.accesses += served
            self.hits += served

    def put(self, topic: str, queue_id: int, chunk: Chunk) -> None:
        if not chunk.length:
            return
        now = time.monotonic()
        key = (topic, queue_id, chunk.start)
        with self._lock:
            if key in self._chunks:
                self._drop(key)
            self._chunks[key] = (chunk, now)
            bisect.insort(self._starts.setdefault((topic, queue_id), []), chunk.start)
            self.bytes += chunk.nbytes
            self.messages += chunk.length
            self._expire(now)

    def busy(self) -> bool:
        """Past 80% of its size: RocketMQ then reads the tier directly, without read-ahead."""
        return self.bytes > self.max_bytes * 0.8

    def __len__(self) -> int:
        return self.messages

    def hit_ratio(self) -> float:
        return self.hits / self.accesses if self.accesses else 0.0
