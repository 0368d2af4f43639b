"""The tier index file (RocketMQ's ``tieredstore/index/IndexStoreFile`` layout), in its two
forms. Spec: ``docs/formats/tier-index.md``. All integers big-endian.

UNSEALED (local, being written; hash chains like the store's own index)::

    header  28 bytes  magic i32 | begin_timestamp i64 | end_timestamp i64 |
                      hash_slot_count i32 (slots in use) | index_item_count i32
    slots   max_hash_slot_num x 8 bytes   item number of the slot's newest item (i32), 0
    items   max_index_num x 32 bytes      item n (from 1) at header + slots + n x 32:
            key_hash i32 | topic_id i32 | queue_id i32 | offset i64 | size i32 |
            time_diff i32 | previous item number i32 (0: end of chain)

SEALED / uploaded (re-laid out so a slot's items are contiguous: one ranged read per slot)::

    header  28 bytes  (magic END_MAGIC_CODE)
    slots   max_hash_slot_num x 8 bytes   position i32 | length i32 of the slot's items
    items   28 bytes each (the 32-byte item without its previous-item field), a slot's items
            newest first, slots in order

``key_hash`` is ``abs(String.hashCode("topic#key"))``; ``offset``/``size`` locate the record in
the queue's tier CommitLog; ``time_diff`` is whole seconds from ``begin_timestamp`` (negative
for a record older than the file's first one).
"""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path
from typing import NamedTuple

import numpy as np

__all__ = [
    "BEGIN_MAGIC_CODE", "COMPACT_ITEM", "END_MAGIC_CODE", "HEADER", "HEADER_SIZE", "ITEM",
    "SLOT", "IndexItem", "UnsealedIndexFile", "compact", "file_size", "query_sealed",
    "sealed_geometry", "slot_position",
]  # fmt: skip


def _int32(value: int) -> int:
    return (value + 2**31) % 2**32 - 2**31


# Java: 0xCCDDEEFF ^ 1880681586 + 4 (addition binds tighter than xor), as a signed int.
BEGIN_MAGIC_CODE = _int32(0xCCDDEEFF ^ (1880681586 + 4))
END_MAGIC_CODE = _int32(0xCCDDEEFF ^ (1880681586 + 8))
HEADER = struct.Struct(">iqqii")
HEADER_SIZE = HEADER.size
assert HEADER_SIZE == 28
SLOT = struct.Struct(">ii")
SLOT_SIZE = SLOT.size
ITEM = struct.Struct(">iiiqiii")
ITEM_SIZE = ITEM.size
assert ITEM_SIZE == 32
COMPACT_ITEM = struct.Struct(">iiiqii")
COMPACT_ITEM_SIZE = COMPACT_ITEM.size
assert COMPACT_ITEM_SIZE == 28
MAX_QUERY_COUNT = 512  # chain steps one unsealed lookup walks at most
_ITEM_DTYPE = np.dtype([("hash", ">i4"), ("topic_id", ">i4"), ("queue_id", ">i4"),
                        ("offset", ">i8"), ("size", ">i4"), ("time_diff", ">i4"),
                        ("prev", ">i4")])
_COMPACT_DTYPE = np.dtype(_ITEM_DTYPE.descr[:6])


class IndexItem(NamedTuple):
    key_hash: int
    topic_id: int
    queue_id: int
    offset: int  # in the queue's tier CommitLog
    size: int
    time_diff: int

    def store_time(self, begin_timestamp: int) -> int:
        return begin_timestamp + self.time_diff * 1000


def file_size(max_hash_slot_num: int, max_index_num: int) -> int:
    return HEADER_SIZE + max_hash_slot_num * SLOT_SIZE + max_index_num * ITEM_SIZE


def slot_position(slot: int) -> int:
    return HEADER_SIZE + slot * SLOT_SIZE


class UnsealedIndexFile:
    """A local, mapped UNSEALED file. ``put`` and ``query`` under the caller's lock (the
    service's); the map is owned here and unmapped by ``close``."""

    def __init__(self, path: Path, max_hash_slot_num: int, max_index_num: int,
                 begin_timestamp: int | None = None, *, read_only: bool = False) -> None:
        self.path = path
        self.slots = max_hash_slot_num
        self.max_items = max_index_num
        self.read_only = read_only
        size = file_size(max_hash_slot_num, max_index_num)
        fresh = not path.exists()
        if fresh and read_only:
            raise FileNotFoundError(f"no tier index file {path}")
        if not read_only:
            path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDONLY if read_only else os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if fresh:
                os.ftruncate(fd, size)  # sparse: blocks are taken as items are written
            elif os.fstat(fd).st_size != size:
                raise ValueError(f"tier index file {path} is {os.fstat(fd).st_size} bytes, not "
                                 f"the {size} of tieredStoreIndexFileMaxHashSlotNum="
                                 f"{max_hash_slot_num} / MaxIndexNum={max_index_num}")
            self.map = mmap.mmap(fd, size, access=mmap.ACCESS_READ if read_only
                                 else mmap.ACCESS_WRITE)
        finally:
            os.close(fd)
        if fresh:
            assert begin_timestamp is not None
            self.begin_timestamp = self.end_timestamp = begin_timestamp
            self.slot_count = self.item_count = 0
            self._write_header()
        else:
            magic, begin, end, self.slot_count, self.item_count = HEADER.unpack_from(self.map, 0)
            if magic not in (BEGIN_MAGIC_CODE, END_MAGIC_CODE) or not \
                    0 <= self.item_count < max_index_num:
                self.map.close()
                raise ValueError(f"tier index file {path} has a damaged header")
            self.begin_timestamp, self.end_timestamp = begin, end
        self.min_timestamp, self.max_timestamp = self._time_range()

    def _write_header(self) -> None:
        full = self.item_count + 1 >= self.max_items
        HEADER.pack_into(self.map, 0, END_MAGIC_CODE if full else BEGIN_MAGIC_CODE,
                         self.begin_timestamp, self.end_timestamp, self.slot_count,
                         self.item_count)

    def _items(self) -> np.ndarray:
        start = HEADER_SIZE + self.slots * SLOT_SIZE + ITEM_SIZE  # item 1
        return np.frombuffer(self.map, dtype=_ITEM_DTYPE, count=self.item_count, offset=start)

    def _time_range(self) -> tuple[int, int]:
        if not self.item_count:
            return self.begin_timestamp, self.begin_timestamp
        diffs = self._items()["time_diff"]
        return (self.begin_timestamp + int(diffs.min()) * 1000,
                self.begin_timestamp + int(diffs.max()) * 1000 + 999)

    def is_full(self, keys: int = 1) -> bool:
        return self.item_count + keys >= self.max_items

    def put(self, hashes: list[int], topic_id: int, queue_id: int, offset: int, size: int,
            timestamp: int, *, header: bool = True) -> bool:
        """Add one item per key hash; False (nothing added) when they do not all fit.
        ``header=False`` leaves the header to a later ``write_header`` (a batch)."""
        if self.is_full(len(hashes)):
            return False
        diff = (timestamp - self.begin_timestamp) // 1000
        diff = max(-(2**31), min(2**31 - 1, diff))
        for h in hashes:
            slot_at = slot_position(h % self.slots)
            previous = max(0, struct.unpack_from(">i", self.map, slot_at)[0])
            self.item_count += 1
            ITEM.pack_into(self.map, HEADER_SIZE + self.slots * SLOT_SIZE +
                           self.item_count * ITEM_SIZE, h, topic_id, queue_id, offset, size,
                           diff, previous)
            struct.pack_into(">i", self.map, slot_at, self.item_count)
            if previous == 0:
                self.slot_count += 1
        self.end_timestamp = max(self.end_timestamp, timestamp)
        self.min_timestamp = min(self.min_timestamp, timestamp)
        self.max_timestamp = max(self.max_timestamp, timestamp)
        if header:
            self._write_header()
        return True

    def room(self) -> int:
        """Keys the file can still take (``is_full`` counts the same way)."""
        return max(0, self.max_items - 1 - self.item_count)

    def put_many(self, hashes: np.ndarray, topic_id: int, queue_id: int, offsets: np.ndarray,
                 sizes: np.ndarray, timestamps: np.ndarray) -> None:
        """``put`` of many keys at once (arrays, one element per key; at most ``room()``),
        in order: the same items and chains as one ``put`` per key, built with numpy. Each
        key's item links to the slot's previous head: the previous key of the batch in that
        slot, or the item the slot pointed at before. The header is left to ``write_header``.
        """
        n = len(hashes)
        if n == 0:
            return
        if n > self.room():
            raise ValueError(f"tier index file {self.path}: {n} keys do not fit")
        numbers = self.item_count + 1 + np.arange(n, dtype=np.int64)
        slot = hashes.astype(np.int64) % self.slots
        order = np.argsort(slot, kind="stable")
        by_slot, in_order = slot[order], numbers[order]
        first = np.ones(n, dtype=bool)
        first[1:] = by_slot[1:] != by_slot[:-1]
        last = np.ones(n, dtype=bool)
        last[:-1] = first[1:]
        table = np.frombuffer(self.map, dtype=">i4", count=self.slots * 2,
                              offset=HEADER_SIZE).reshape(-1, 2)  # (head, unused) per slot
        try:
            prev_sorted = np.empty(n, dtype=np.int64)
            prev_sorted[1:] = in_order[:-1]
            heads = np.maximum(table[by_slot[first], 0].astype(np.int64), 0)
            prev_sorted[first] = heads
            self.slot_count += int((heads == 0).sum())
            table[by_slot[last], 0] = in_order[last]
        finally:
            del table  # no view of the map may outlive the call (close unmaps it)
        prev = np.empty(n, dtype=np.int64)
        prev[order] = prev_sorted
        begin = self.begin_timestamp
        items = np.empty(n, dtype=_ITEM_DTYPE)
        items["hash"] = hashes
        items["topic_id"] = topic_id
        items["queue_id"] = queue_id
        items["offset"] = offsets
        items["size"] = sizes
        items["time_diff"] = np.clip((timestamps - begin) // 1000, -(2**31), 2**31 - 1)
        items["prev"] = prev
        at = HEADER_SIZE + self.slots * SLOT_SIZE + (self.item_count + 1) * ITEM_SIZE
        self.map[at : at + n * ITEM_SIZE] = items.tobytes()
        self.item_count += n
        low, high = int(timestamps.min()), int(timestamps.max())
        self.end_timestamp = max(self.end_timestamp, high)
        self.min_timestamp = min(self.min_timestamp, low)
        self.max_timestamp = max(self.max_timestamp, high)

    def write_header(self) -> None:
        self._write_header()

    def query(self, h: int, begin_ms: int, end_ms: int, max_count: int) -> list[IndexItem]:
        found: list[IndexItem] = []
        number = max(0, struct.unpack_from(">i", self.map, slot_position(h % self.slots))[0])
        steps = MAX_QUERY_COUNT
        base = HEADER_SIZE + self.slots * SLOT_SIZE
        while steps and 0 < number <= self.item_count and len(found) < max_count:
            *fields, previous = ITEM.unpack_from(self.map, base + number * ITEM_SIZE)
            item = IndexItem(*fields)
            if item.key_hash == h and begin_ms <= item.store_time(self.begin_timestamp) <= end_ms:
                found.append(item)
            number = previous
            steps -= 1
        return found

    def flush(self) -> None:
        self.map.flush()

    def close(self) -> None:
        if not self.map.closed:
            if not self.read_only:
                self.map.flush()
            self.map.close()


def compact(unsealed: UnsealedIndexFile) -> bytes:
    """The SEALED form of a file: each slot's items contiguous, newest first (what walking
    each chain gives: a slot's chain holds exactly the items hashed to it)."""
    items = unsealed._items()
    slots = unsealed.slots
    count = len(items)
    numbers = np.arange(1, count + 1)
    slot_of = items["hash"].astype(np.int64) % slots
    order = np.lexsort((-numbers, slot_of))  # by slot, then newest first
    compacted = np.empty(count, dtype=_COMPACT_DTYPE)
    for name in _COMPACT_DTYPE.names or ():
        compacted[name] = items[name][order]
    lengths = np.bincount(slot_of, minlength=slots).astype(np.int64) * COMPACT_ITEM_SIZE
    items_start = HEADER_SIZE + slots * SLOT_SIZE
    positions = items_start + np.concatenate(([0], np.cumsum(lengths)[:-1]))
    table = np.empty(slots, dtype=np.dtype([("position", ">i4"), ("length", ">i4")]))
    table["position"] = positions
    table["length"] = lengths
    header = HEADER.pack(END_MAGIC_CODE, unsealed.begin_timestamp, unsealed.end_timestamp,
                         unsealed.slot_count, unsealed.item_count)
    return header + table.tobytes() + compacted.tobytes()


def sealed_geometry(header: bytes, size: int) -> tuple[int, int, int, int]:
    """(begin timestamp, end timestamp, hash slots, items) of a SEALED file from its header
    and total size; ValueError when they do not fit together."""
    magic, begin, end, _used, items = HEADER.unpack_from(header, 0)
    slots, rest = divmod(size - HEADER_SIZE - items * COMPACT_ITEM_SIZE, SLOT_SIZE)
    if magic != END_MAGIC_CODE or rest or slots <= 0 or items < 0:
        raise ValueError(f"not a sealed tier index file (magic {magic:#x}, {size} bytes, "
                         f"{items} items)")
    return begin, end, slots, items


def query_sealed(items: bytes, h: int, begin_timestamp: int, begin_ms: int, end_ms: int,
                 max_count: int) -> list[IndexItem]:
    """The matching items of one slot's contiguous run of compact items."""
    found = []
    for at in range(0, len(items) - COMPACT_ITEM_SIZE + 1, COMPACT_ITEM_SIZE):
        item = IndexItem(*COMPACT_ITEM.unpack_from(items, at))
        if item.key_hash == h and begin_ms <= item.store_time(begin_timestamp) <= end_ms:
            found.append(item)
            if len(found) >= max_count:
                break
    return found

