"""The compaction batch ConsumeQueue unit: 64 bytes, big-endian. Spec:
``docs/formats/compaction-batch-cq.md``.

The first 46 bytes are Apache RocketMQ's ``BatchConsumeQueue`` unit (``CQ_STORE_UNIT_SIZE``),
field for field; StrataMQ appends the md5 digest of the message key and a flags byte, so a
compaction round builds its OffsetMap from the units alone, in bulk, without decoding a record::

    position i64 | size i32 | tags_code i64 | store_timestamp i64 | queue_offset i64 |
    batch_size i16 | compacted_offset i32 | reserved i32 | key_digest 16 bytes | flags u8 | pad u8

``position`` is the record's offset in the CompactionLog (file name + position in the file),
``queue_offset`` RocketMQ's ``msgBaseOffset``: units are in queue-offset order, with holes where
compaction removed messages, so a read binary-searches them. A unit is written when
``position >= 0 and size > 0 and queue_offset >= 0 and batch_size > 0`` (RocketMQ's test); the
file's end unit (``putEndPositionInfo``) has ``position = -1`` and ``compacted_offset = -1``.
Pure: no I/O.
"""

from __future__ import annotations

import struct
from typing import Any, NamedTuple

import numpy as np

__all__ = ["END_UNIT", "FLAG_HAS_KEY", "FLAG_TOMBSTONE", "UNIT", "UNIT_DTYPE", "UNIT_SIZE",
           "Unit", "cq_file_size", "is_end_unit", "pack_unit", "units_array", "valid_count"]

# The layout, written once: (name, struct code, numpy type). Offsets are derived from it.
_FIELDS: list[tuple[str, str, Any]] = [
    ("position", "q", ">i8"),
    ("size", "i", ">i4"),
    ("tags_code", "q", ">i8"),
    ("store_timestamp", "q", ">i8"),
    ("queue_offset", "q", ">i8"),  # RocketMQ's msgBaseOffset
    ("batch_size", "h", ">i2"),
    ("compacted_offset", "i", ">i4"),
    ("reserved", "i", ">i4"),
    ("key_digest", "16s", "V16"),  # StrataMQ: md5(KEYS), zeros when the message has none
    ("flags", "B", "u1"),
    ("pad", "x", "u1"),
]
UNIT = struct.Struct(">" + "".join(code for _, code, _ in _FIELDS))
UNIT_SIZE = UNIT.size
UNIT_DTYPE = np.dtype([(name, kind) for name, _, kind in _FIELDS])
OFFSETS: dict[str, int] = {}
_at = 0
for _name, _code, _ in _FIELDS:
    OFFSETS[_name] = _at
    _at += struct.calcsize(">" + _code)
assert UNIT_SIZE == _at == UNIT_DTYPE.itemsize == 64
# RocketMQ's BatchConsumeQueue constants, which the first 46 bytes keep.
ROCKETMQ_UNIT_SIZE = OFFSETS["key_digest"]
assert ROCKETMQ_UNIT_SIZE == 46
assert OFFSETS["store_timestamp"] == 20 and OFFSETS["queue_offset"] == 28  # MSG_*_INDEX
assert OFFSETS["batch_size"] == 36 and OFFSETS["compacted_offset"] == 38

FLAG_HAS_KEY = 0x1  # the message has a KEYS property (key_digest is md5 of it)
FLAG_TOMBSTONE = 0x2  # the message deletes its key: empty body, or TOMBSTONE=true
INVALID_POS = -1

_QUEUE_OFFSET = struct.Struct(">q")
_POS_SIZE = struct.Struct(">qi")


class Unit(NamedTuple):
    position: int
    size: int
    tags_code: int
    store_timestamp: int
    queue_offset: int
    batch_size: int
    compacted_offset: int
    reserved: int
    key_digest: bytes
    flags: int

    @property
    def written(self) -> bool:
        return (self.position >= 0 and self.size > 0 and self.queue_offset >= 0
                and self.batch_size > 0)

    @property
    def has_key(self) -> bool:
        return bool(self.flags & FLAG_HAS_KEY)

    @property
    def tombstone(self) -> bool:
        return bool(self.flags & FLAG_TOMBSTONE)


def pack_unit(position: int, size: int, tags_code: int, store_timestamp: int,
              queue_offset: int, key_digest: bytes, flags: int) -> bytes:
    return UNIT.pack(position, size, tags_code, store_timestamp, queue_offset, 1, 0, 0,
                     key_digest, flags)


END_UNIT = UNIT.pack(INVALID_POS, 0, 0, 0, 0, 0, INVALID_POS, 0, bytes(16), 0)


def unpack_unit(buf: Any, pos: int) -> Unit:
    return Unit(*UNIT.unpack_from(buf, pos))


def is_end_unit(buf: Any, pos: int) -> bool:
    position, size = _POS_SIZE.unpack_from(buf, pos)
    return position == INVALID_POS and size == 0 and struct.unpack_from(
        ">i", buf, pos + OFFSETS["compacted_offset"])[0] == INVALID_POS


def queue_offset_at(buf: Any, pos: int) -> int:
    return _QUEUE_OFFSET.unpack_from(buf, pos + OFFSETS["queue_offset"])[0]


def position_size_at(buf: Any, pos: int) -> tuple[int, int]:
    return _POS_SIZE.unpack_from(buf, pos)


def units_array(buf: Any, count: int) -> np.ndarray:
    """The first ``count`` units of ``buf`` as a structured numpy array (a view, no copy)."""
    return np.frombuffer(buf, dtype=UNIT_DTYPE, count=count)


def valid_count(buf: Any, capacity: int) -> int:
    """How many units from the start of ``buf`` are written (RocketMQ's test), in bulk: the
    index of the first unit that is not."""
    if capacity <= 0:
        return 0
    units = units_array(buf, capacity)
    ok = ((units["position"] >= 0) & (units["size"] > 0) & (units["queue_offset"] >= 0)
          & (units["batch_size"] > 0))
    bad = np.flatnonzero(~ok)
    return int(bad[0]) if bad.size else capacity


def cq_file_size(configured: int) -> int:
    """``compactionCqMappedFileSize`` rounded down to whole units, as RocketMQ does."""
    return max(UNIT_SIZE * 2, configured // UNIT_SIZE * UNIT_SIZE)
