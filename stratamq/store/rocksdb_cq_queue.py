"""Handles on the RocksDB ConsumeQueue store: one queue (``RocksDBConsumeQueue``) and the
lazily filled queue-offset table the CommitLog assigns from (``QueueOffsets``). They hold names
and key prefixes only; every row lives in the store (``rocksdb_consume_queue.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from stratamq.store.consume_queue_store import Unit
from stratamq.store.rocksdb_cq_format import (
    CQ_KEY_TAIL,
    CQ_VALUE,
    CTRL_1,
    I64,
    cq_key,
    queue_prefix,
)

if TYPE_CHECKING:
    from stratamq.store.rocksdb_consume_queue import RocksDBConsumeQueueStore


class QueueOffsets(dict):
    """The CommitLog's (topic, queue id) -> next queue offset, filled from the offset table the
    first time a queue is asked for (the CommitLog calls ``get`` under its own lock), so opening
    a store does not build 100,000 entries. Queues the CommitLog assigns to are then plain dict
    entries; a queue absent here has no message since the last dispatch, so the offset table's
    ``max`` is its truth."""

    def __init__(self, store: RocksDBConsumeQueueStore) -> None:
        super().__init__()
        self._store = store

    def __missing__(self, key: tuple[str, int]) -> int:
        row = self._store.max_row(key)
        if row is None:
            raise KeyError(key)
        value = row[0] + 1
        self[key] = value
        return value

    def get(self, key: tuple[str, int], default: int | None = None) -> int | None:  # type: ignore[override]
        try:
            return self[key]
        except KeyError:
            return default

    def __contains__(self, key: object) -> bool:
        return self.get(key) is not None  # type: ignore[arg-type]


class RocksDBConsumeQueue:
    """A handle on one queue: a name and a key prefix; all state lives in the store."""

    __slots__ = ("store", "topic", "queue_id", "key", "prefix")

    def __init__(self, store: RocksDBConsumeQueueStore, topic: str, queue_id: int) -> None:
        self.store = store
        self.topic = topic
        self.queue_id = queue_id
        self.key = (topic, queue_id)
        self.prefix = queue_prefix(topic.encode("utf-8"), queue_id)

    def max_offset(self) -> int:
        row = self.store.max_row(self.key)
        return row[0] + 1 if row is not None else 0

    def min_offset(self) -> int:
        return self.store.queue_min_offset(self.key, self.prefix)

    @property
    def max_physic_offset(self) -> int:
        row = self.store.max_row(self.key)
        return row[1] if row is not None else -1

    def get_units(self, queue_offset: int, max_units: int) -> list[Unit]:
        """Consecutive units from ``queue_offset``: one seek, then ``next()`` within the queue."""
        return [(p, s, c) for p, s, c, _ in self.get_units_with_time(queue_offset, max_units)]

    def get_units_with_time(self, queue_offset: int,
                            max_units: int) -> list[tuple[int, int, int, int]]:
        out: list[tuple[int, int, int, int]] = []
        end = self.max_offset()  # before the iterator: see RocksDBConsumeQueueStore._write
        if max_units <= 0 or queue_offset >= end or queue_offset < 0:
            return out
        it = self.store.reading_iterator()
        if it is None:
            return out
        # No upper bound in ReadOptions (setting one per read cost as much as the read): the
        # count stops at the queue's end, and each key is checked to be this queue's next one.
        head = self.prefix + CTRL_1
        stop = queue_offset + min(max_units, end - queue_offset)
        it.seek(head + I64.pack(queue_offset))
        expected = queue_offset
        unpack = CQ_VALUE.unpack
        while expected < stop and it.valid():
            key = it.key()
            if key[:-8] != head or I64.unpack_from(key, len(key) - 8)[0] != expected:
                break  # a hole (expired below, or a gap) or the next queue: the range ends here
            out.append(unpack(it.value()))
            expected += 1
            it.next()
        return out

    def store_time_at(self, queue_offset: int) -> int | None:
        value = self.store.get_row(cq_key(self.prefix, queue_offset))
        return CQ_VALUE.unpack(value)[3] if value is not None else None

    def offset_by_time(self, timestamp: int,
                       store_time_at: Callable[[int], int | None] | None = None) -> int:
        """First offset stored at or after ``timestamp`` (ms), by binary search over the store
        time kept in each value: no CommitLog read. The max offset if every unit is older."""
        low, high = self.min_offset(), self.max_offset()
        while low < high:
            mid = (low + high) // 2
            t = self.store_time_at(mid)
            if t is None or t >= timestamp:
                high = mid
            else:
                low = mid + 1
        return low

    def disk_bytes(self) -> int:
        """Logical bytes of this queue's rows (RocksDB shares its files between queues)."""
        return (self.max_offset() - self.min_offset()) * (len(self.prefix) + CQ_KEY_TAIL
                                                          + CQ_VALUE.size)
