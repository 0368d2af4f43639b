"""Checks of record copies read back from somewhere else than the CommitLog they were written
to (the tier), before they are served: each must be whole, be the record its ConsumeQueue unit
says (topic, queue id and queue offset in its header) and hold the body its CRC was computed
over (RocketMQ keeps ``BODYCRC`` in the header: ``docs/formats/commitlog-record.md``).

Many records are checked at once: header fields are gathered with numpy (no step per record),
only the CRCs are computed one record at a time (ISA-L's CRC-32 where installed). numpy is
imported lazily, as in ``bulk``.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from stratamq.message import RecordCorrupt
from stratamq.record.codec import (
    _HOST_FLAGS,
    _crc32,
    check_record,
    decode_dispatch_info,
    record_topic,
)
from stratamq.record.layout import (
    _INT,
    _POSITIONS,
    _V4,
    MESSAGE_MAGIC_CODE_V1,
    MESSAGE_MAGIC_CODE_V2,
    MIN_RECORD_SIZE,
    QUEUE_OFFSET_POS,
)

if TYPE_CHECKING:
    from stratamq.record.codec import Buffer

__all__ = ["check_copies"]

# Up to this many records, one at a time: numpy's fixed cost per call is more than theirs.
_FEW = 32
# The header up to sys_flag (the same in every layout).
_HEAD = struct.Struct(">iIiiiqqi")
assert _HEAD.size == _V4.offsets["born_timestamp"]

# The header fields the checks read, at their offsets in the IPv4 header (the usual layout; a
# record with an IPv6 host is checked on its own, by the scalar codec).
_FIELDS = {"total_size": ">i4", "magic_code": ">u4", "body_crc": ">i4", "queue_id": ">i4",
           "queue_offset": ">i8", "sys_flag": ">i4", "body_length": ">i4"}


def check_copies(buf: Buffer, starts: Sequence[int], sizes: Sequence[int], topic: str,
                 queue_id: int, first_queue_offset: int) -> dict[int, str]:
    """Record ``i`` is ``buf[starts[i]:starts[i] + sizes[i]]``, the copy a queue's unit at
    queue offset ``first_queue_offset + i`` points at. Returns ``{i: why}`` for each record
    that must not be served: not whole (magic code, a total size other than the unit's,
    lengths that do not add up), another queue's or another offset's record, or a body whose
    CRC is not the one stored in its header."""
    n = len(starts)
    if n <= _FEW:
        return _check_few(buf, starts, sizes, topic, queue_id, first_queue_offset)
    import numpy as np

    data = np.frombuffer(buf, dtype=np.uint8)
    pos = np.asarray(starts, dtype=np.int64)
    size = np.asarray(sizes, dtype=np.int64)
    end = pos + size
    width = _V4.header.size
    fits = (pos >= 0) & (size >= MIN_RECORD_SIZE) & (end <= len(data))
    if len(data) < width:
        return dict.fromkeys(range(n), "the record is cut short")
    at = np.where(fits, pos, 0)  # every gather stays inside the buffer
    rows = np.lib.stride_tricks.as_strided(data, shape=(len(data) - width + 1, width),
                                           strides=(1, 1), writeable=False)[at]
    head = rows.view(np.dtype({"names": list(_FIELDS), "formats": list(_FIELDS.values()),
                               "offsets": [_V4.offsets[f] for f in _FIELDS],
                               "itemsize": width})).ravel()
    magic = head["magic_code"]
    v1 = magic == MESSAGE_MAGIC_CODE_V1
    whole = fits & (v1 | (magic == MESSAGE_MAGIC_CODE_V2)) & (head["total_size"] == size)
    v6 = whole & ((head["sys_flag"] & int(_HOST_FLAGS)) != 0)
    plain = whole & ~v6
    body_start = pos + width
    body_length = head["body_length"].astype(np.int64)
    topic_at = body_start + body_length
    plain &= (body_length >= 0) & (topic_at + 3 <= end)
    topic_at = np.where(plain, topic_at, at)
    high = data[topic_at].astype(np.int64)
    topic_length = np.where(v1, high, (high << 8) | data[topic_at + 1])
    topic_start = topic_at + np.where(v1, 1, 2)
    props_at = topic_start + topic_length
    plain &= props_at + 2 <= end
    props_at = np.where(plain, props_at, at)
    props_length = (data[props_at].astype(np.int64) << 8) | data[props_at + 1]
    plain &= props_at + 2 + props_length == end
    name = topic.encode()
    mine = plain & (topic_length == len(name))
    if name and mine.any():
        rows = np.lib.stride_tricks.as_strided(
            data, shape=(len(data) - len(name) + 1, len(name)), strides=(1, 1),
            writeable=False)[np.where(mine, topic_start, 0)]
        mine &= (rows == np.frombuffer(name, dtype=np.uint8)).all(axis=1)
    expected = first_queue_offset + np.arange(n, dtype=np.int64)
    placed = (head["queue_id"] == queue_id) & (head["queue_offset"] == expected)
    out: dict[int, str] = {}
    for i in np.flatnonzero(~whole).tolist():
        out[i] = _why_not_whole(buf, int(pos[i]), int(size[i]), len(data))
    for i in np.flatnonzero(whole & ~v6 & ~plain).tolist():
        out[i] = "its field lengths do not add up to its size"
    for i in np.flatnonzero(plain & (~mine | ~placed)).tolist():
        out[i] = _whose(head, i, topic_length, topic_start, buf)
    good = np.flatnonzero(plain & mine & placed)
    if len(good):
        # One CRC per body, the loop in C (map over slices of one view): a Python step per
        # record here would cost more than the CRC of a 1 KiB body.
        view = memoryview(buf) if not isinstance(buf, memoryview) else buf
        crcs = np.fromiter(map(_crc32, map(view.__getitem__, map(
            slice, body_start[good].tolist(), topic_at[good].tolist()))),
            dtype=np.int64, count=len(good))
        for i in good[(crcs & 0x7FFFFFFF) != head["body_crc"][good]].tolist():
            out[i] = "its body does not match the body CRC in its header"
    for i in np.flatnonzero(v6).tolist():  # rare: one at a time
        why = _check_one(buf, int(pos[i]), int(size[i]), topic, queue_id,
                         first_queue_offset + i)
        if why is not None:
            out[i] = why
    return out


def _why_not_whole(buf: Buffer, pos: int, size: int, limit: int) -> str:
    if pos < 0 or pos + size > limit:
        return "the record is cut short"
    if size < MIN_RECORD_SIZE:
        return f"its ConsumeQueue unit gives an impossible size {size}"
    total, magic = struct.unpack_from(">iI", buf, pos)
    if magic not in (MESSAGE_MAGIC_CODE_V1, MESSAGE_MAGIC_CODE_V2):
        return f"no record starts there (magic code {magic:#010x})"
    return f"its size {total} is not the {size} bytes its ConsumeQueue unit gives"


def _whose(head: Any, i: int, topic_length: Any, topic_start: Any, buf: Buffer) -> str:
    start = int(topic_start[i])
    found = bytes(memoryview(buf)[start:start + int(topic_length[i])])
    return (f"it is the record of {found.decode('utf-8', 'replace')}/{int(head['queue_id'][i])}"
            f" at queue offset {int(head['queue_offset'][i])}")


def _check_few(buf: Buffer, starts: Sequence[int], sizes: Sequence[int], topic: str,
               queue_id: int, first_queue_offset: int) -> dict[int, str]:
    found = {}
    name = topic.encode()
    view = memoryview(buf) if not isinstance(buf, memoryview) else buf
    limit = len(view)
    for i, (pos, size) in enumerate(zip(starts, sizes, strict=True)):
        if _whole_and_placed(view, pos, size, limit, name, queue_id, first_queue_offset + i):
            continue
        why = _check_one(buf, pos, size, topic, queue_id, first_queue_offset + i)
        if why is not None:  # None: a layout the quick check leaves to it (an IPv6 host)
            found[i] = why
    return found


def _whole_and_placed(view: memoryview, pos: int, size: int, limit: int, name: bytes,
                      queue_id: int, queue_offset: int) -> bool:
    """The whole check of one record in a few unpacks (the common case: it passes); the
    reason for one that fails is found by :func:`_check_one`."""
    if pos < 0 or size < MIN_RECORD_SIZE or pos + size > limit:
        return False
    total, magic, crc, qid, _flag, offset, _phys, sys_flag = _HEAD.unpack_from(view, pos)
    if total != size or qid != queue_id or offset != queue_offset or sys_flag & _HOST_FLAGS \
            or magic not in (MESSAGE_MAGIC_CODE_V1, MESSAGE_MAGIC_CODE_V2):
        return False
    end = pos + size
    body_start = pos + _V4.header.size
    body_length = _INT.unpack_from(view, body_start - 4)[0]
    at = body_start + body_length
    if body_length < 0 or at + 3 > end:
        return False
    if magic == MESSAGE_MAGIC_CODE_V1:
        topic_length, at = view[at], at + 1
    else:
        topic_length, at = (view[at] << 8) | view[at + 1], at + 2
    props_at = at + topic_length
    if props_at + 2 > end or props_at + 2 + ((view[props_at] << 8) | view[props_at + 1]) != end:
        return False
    return view[at:props_at] == name and \
        _crc32(view[body_start:body_start + body_length]) & 0x7FFFFFFF == crc


def _check_one(buf: Buffer, pos: int, size: int, topic: str, queue_id: int,
               queue_offset: int) -> str | None:
    """The checks of one record, with the scalar codec (a few records, or an IPv6 host)."""
    if pos < 0 or size < MIN_RECORD_SIZE or pos + size > len(buf):
        return _why_not_whole(buf, pos, size, len(buf))
    try:
        if check_record(buf, pos, pos + size, None, True) != size:
            return _why_not_whole(buf, pos, size, len(buf))
        found = _POSITIONS.unpack_from(buf, pos + QUEUE_OFFSET_POS)[0]
        qid = _INT.unpack_from(buf, pos + _V4.offsets["queue_id"])[0]
        if (qid, found) == (queue_id, queue_offset) and record_topic(buf, pos) == topic:
            return None
        info = decode_dispatch_info(buf, pos)
    except RecordCorrupt as exc:
        return exc.reason
    except (struct.error, IndexError, ValueError) as exc:
        return str(exc)
    return (f"it is the record of {info.topic}/{info.queue_id} at queue offset "
            f"{info.queue_offset}")
