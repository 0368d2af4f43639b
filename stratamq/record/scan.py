"""Scanning runs of records in bulk: recovery's validation loop (``scan_records``) and
replay's skip over records every dispatcher already holds (``skip_covered``). Both inline the
common IPv4 case of the layout for speed and fall back to :func:`codec.check_record` for
everything else, so the answers are the codec's."""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import NamedTuple

from stratamq.message import RecordCorrupt
from stratamq.record.codec import _HOST_FLAGS, _crc32
from stratamq.record.decoding import check_record, topic_name
from stratamq.record.layout import (
    _INT,
    _SIZE_MAGIC,
    _V4,
    HEADER_SIZE_V4,
    MESSAGE_MAGIC_CODE_V1,
    MESSAGE_MAGIC_CODE_V2,
    MIN_RECORD_SIZE,
    SYS_FLAG_POS,
    _layout_for,
)


class ScanResult(NamedTuple):
    """Where a run of valid records ends and why (see :func:`scan_records`)."""

    end: int  # position where valid records end
    records: int  # valid records before it
    blank: bool  # stopped at a valid blank record (the segment's filler)
    problem: RecordCorrupt | None  # None: a blank, never-written zeros, or ``limit`` reached


def scan_records(buf: memoryview, pos: int, limit: int, file_from_offset: int,
                 check_crc: bool) -> ScanResult:
    """Validate consecutive records from ``buf[pos:]`` up to ``limit`` in one loop.

    The checks are exactly :func:`check_record`'s (recovery trusts them); this is its loop form,
    because one Python call per record was most of a crash recovery's cost. IPv4 records, the
    common case, are checked inline; anything else, and any record that fails a check, goes
    through :func:`check_record`, which also words the problem. ``problem`` positions are
    CommitLog offsets (``file_from_offset`` + position).
    """
    unpack_head = _V4.header.unpack_from
    size_magic = _SIZE_MAGIC.unpack_from
    crc32 = _crc32
    header_size = _V4.header.size
    v1, v2 = MESSAGE_MAGIC_CODE_V1, MESSAGE_MAGIC_CODE_V2
    records = 0
    while pos + 8 <= limit:
        total, magic = size_magic(buf, pos)
        end = pos + total
        if magic in (v1, v2) and total >= MIN_RECORD_SIZE and end <= limit:
            fields = unpack_head(buf, pos)
            body_len = fields[16]
            body_start = pos + header_size
            p = body_start + body_len
            if not fields[7] & _HOST_FLAGS and body_len >= 0 and p + 3 <= end:
                if magic == v1:
                    topic_len = buf[p]
                    p += 1 + topic_len
                else:
                    topic_len = (buf[p] << 8) | buf[p + 1]
                    p += 2 + topic_len
                if (topic_len and p + 2 <= end and p + 2 + ((buf[p] << 8) | buf[p + 1]) == end
                        and fields[6] == file_from_offset + pos
                        and (not check_crc or crc32(buf[body_start : body_start + body_len])
                             & 0x7FFFFFFF == fields[2])):
                    pos = end
                    records += 1
                    continue
        elif total == 0 and magic == 0:
            return ScanResult(pos, records, False, None)  # never written: a clean end
        try:  # the slow path: other layouts, blanks, and saying what is wrong
            length = check_record(buf, pos, limit, file_from_offset + pos, check_crc)
        except RecordCorrupt as exc:
            return ScanResult(pos, records, False,
                              RecordCorrupt(file_from_offset + pos, exc.reason))
        if length == 0:
            return ScanResult(pos, records, True, None)
        pos += length
        records += 1
    return ScanResult(pos, records, False, None)


# total_size, magic_code, queue_id, sys_flag and (IPv4 layout) body_length in one unpack; the
# gaps are derived from the layout table.
_ROUTE = struct.Struct(
    ">iI{}xi{}xi{}xi".format(
        _V4.offsets["queue_id"] - 8,
        SYS_FLAG_POS - _V4.offsets["queue_id"] - 4,
        _V4.offsets["body_length"] - SYS_FLAG_POS - 4,
    )
)
assert _ROUTE.size == HEADER_SIZE_V4


def skip_covered(
    buf: memoryview, pos: int, end: int, base: int,
    floors: dict[tuple[bytes, int], int],
    floor_of: Callable[[str, int], int],
) -> tuple[int, int]:
    """The position of the first record in ``buf[pos:end]`` that some dispatcher still needs,
    and the position of the last record skipped before it (-1 if none).

    A record is covered when its physical offset (``base`` + position) is below the floor of
    its (topic, queue id): ``floors`` caches them by raw topic bytes and ``floor_of(topic,
    queue_id)`` supplies a missing one. Used by crash-recovery replay, where nearly every
    record is already in the ConsumeQueues: reading its topic and queue id costs far less than
    :func:`decode_dispatch_info`. Stops, without judging it, at anything that is not a whole
    message record inside ``end`` (a blank, a torn tail): the caller's full path handles it.
    """
    route = _ROUTE.unpack_from
    v1 = MESSAGE_MAGIC_CODE_V1
    header_size = HEADER_SIZE_V4
    last = -1
    while pos + header_size <= end:
        total, magic, queue_id, sys_flag, body_len = route(buf, pos)
        if magic != v1 and magic != MESSAGE_MAGIC_CODE_V2 or pos + total > end or total <= 0:
            break
        if sys_flag & _HOST_FLAGS:
            layout = _layout_for(sys_flag)
            p = pos + layout.header.size + _INT.unpack_from(buf, pos + layout.header.size - 4)[0]
        else:
            p = pos + header_size + body_len
        if p < pos + header_size or p + 2 > pos + total:
            break  # a damaged body length: the full path names the record
        if magic == v1:
            key = (bytes(buf[p + 1 : p + 1 + buf[p]]), queue_id)
        else:
            key = (bytes(buf[p + 2 : p + 2 + ((buf[p] << 8) | buf[p + 1])]), queue_id)
        floor = floors.get(key)
        if floor is None:
            floor = floors[key] = floor_of(topic_name(key[0]), queue_id)
        if base + pos >= floor:
            break
        last = pos
        pos += total
    return pos, last
