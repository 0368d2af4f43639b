"""Checks of record copies read back from somewhere else than the CommitLog they were written
to (the tier), before they are served: each must be whole, be the record its ConsumeQueue unit
says (topic, queue id and queue offset in its header) and hold the body its CRC was computed
over (RocketMQ keeps ``BODYCRC`` in the header: ``docs/formats/commitlog-record.md``).

Many records are checked at once: header fields are gathered with numpy (no step per record),
only the CRCs are computed one record at a time (ISA-L's CRC-32 where installed). A reader that
serves a block a window at a time (the tier's read-ahead) uses :class:`CopyChecks`: the layout
of the whole block is checked in one numpy pass at its first window, the CRCs of a window when
that window is served. numpy is imported lazily, as in ``bulk``.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from stratamq.message import RecordCorrupt
from stratamq.record.codec import _HOST_FLAGS, _crc32
from stratamq.record.decoding import check_record, decode_dispatch_info, record_topic
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

__all__ = ["CopyChecks", "check_copies"]

# Up to this many records, one at a time: numpy's fixed cost per call is more than theirs.
_FEW = 32
# The IPv4 header's fields the quick check reads, in one unpack (``x``: fields it skips).
_HEAD = struct.Struct(f">iIiiiqqi{_V4.offsets['body_length'] - _V4.offsets['born_timestamp']}xi")
assert _HEAD.size == _V4.header.size

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
    return CopyChecks(buf, starts, sizes, topic, queue_id, first_queue_offset).window(
        0, len(starts))


class CopyChecks:
    """The checks of :func:`check_copies` for one block of records, asked a window at a time
    (``window(first, end)``, each window once): the layout checks of every record of the block
    run once, at the first window (numpy's fixed cost paid once per block, not per window),
    the CRCs of a window's bodies when it is asked for (a reader that serves a few records of
    a block pays the CRCs of one window only). Readers sharing one may check the same window
    (or the layout) at the same moment: each computes the same answer, stored whole."""

    __slots__ = ("_body", "_buf", "_crc", "_first", "_good", "_layout", "_queue_id",
                 "_sizes", "_starts", "_topic", "_v6")

    def __init__(self, buf: Buffer, starts: Sequence[int], sizes: Sequence[int], topic: str,
                 queue_id: int, first_queue_offset: int) -> None:
        self._buf = buf
        self._starts, self._sizes = starts, sizes
        self._topic, self._queue_id, self._first = topic, queue_id, first_queue_offset
        self._layout: dict[int, str] | None = None  # records whose layout is wrong, by index
        self._good: Any = None  # bool per record: layout checked, its CRC still to compute
        self._body: tuple[list[int], list[int]] = ([], [])  # each body's start and end
        self._crc: Any = None  # the CRC stored in each header
        self._v6: list[int] = []  # records with an IPv6 host: the scalar check, per window

    def window(self, first: int, end: int) -> dict[int, str]:
        """``{i: why}`` for the records ``first <= i < end`` of the block that must not be
        served (indices in the block)."""
        if len(self._starts) <= _FEW:
            found = _check_few(self._buf, self._starts[first:end], self._sizes[first:end],
                               self._topic, self._queue_id, self._first + first)
            return {first + j: why for j, why in found.items()}
        if self._layout is None:
            self._check_layout()
        assert self._layout is not None
        out = {i: why for i, why in self._layout.items() if first <= i < end}
        good = self._good[first:end]
        if good.all():
            out.update(self._check_crcs(first, end, None))
        elif good.any():
            out.update(self._check_crcs(first, end, good))
        for i in self._v6:  # rare: one at a time
            if first <= i < end:
                why = _check_one(self._buf, int(self._starts[i]), int(self._sizes[i]),
                                 self._topic, self._queue_id, self._first + i)
                if why is not None:
                    out[i] = why
        return out

    def _check_crcs(self, first: int, end: int, good: Any) -> dict[int, str]:
        import numpy as np

        starts, ends = self._body
        expected = self._crc[first:end]
        if good is None:
            body_starts, body_ends = starts[first:end], ends[first:end]
            index = None
        else:
            index = np.flatnonzero(good)
            expected = expected[index]
            body_starts = [starts[first + j] for j in index.tolist()]
            body_ends = [ends[first + j] for j in index.tolist()]
        # One CRC per body, the loop in C (map over slices of one view): a Python step per
        # record here would cost more than the CRC of a 1 KiB body.
        buf = self._buf
        view = buf if isinstance(buf, memoryview) else memoryview(buf)
        crcs = np.fromiter(map(_crc32, map(view.__getitem__, map(slice, body_starts,
                                                                  body_ends))),
                           dtype=np.int64, count=len(body_starts))
        wrong = np.flatnonzero((crcs & 0x7FFFFFFF) != expected).tolist()
        if index is not None:
            wrong = index[wrong].tolist()
        return dict.fromkeys((first + j for j in wrong),
                             "its body does not match the body CRC in its header")

    def _check_layout(self) -> None:
        """Every record's layout, header fields and topic, in one numpy pass over the block."""
        import numpy as np

        buf, topic, queue_id = self._buf, self._topic, self._queue_id
        n = len(self._starts)
        data = np.frombuffer(buf, dtype=np.uint8)
        pos = np.asarray(self._starts, dtype=np.int64)
        size = np.asarray(self._sizes, dtype=np.int64)
        width = _V4.header.size
        if len(data) < width:
            self._good = np.zeros(n, dtype=bool)
            self._layout = dict.fromkeys(range(n), "the record is cut short")
            return
        end = pos + size
        fits = (pos >= 0) & (size >= MIN_RECORD_SIZE) & (end <= len(data))
        at = np.where(fits, pos, 0)  # every gather stays inside the buffer
        rows = np.lib.stride_tricks.as_strided(data, shape=(len(data) - width + 1, width),
                                               strides=(1, 1), writeable=False)[at]
        head = rows.view(_head_dtype()).ravel()
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
            names = np.lib.stride_tricks.as_strided(
                data, shape=(len(data) - len(name) + 1, len(name)), strides=(1, 1),
                writeable=False)[np.where(mine, topic_start, 0)]
            mine &= (names == np.frombuffer(name, dtype=np.uint8)).all(axis=1)
        expected = self._first + np.arange(n, dtype=np.int64)
        placed = (head["queue_id"] == queue_id) & (head["queue_offset"] == expected)
        out: dict[int, str] = {}
        for i in np.flatnonzero(~whole).tolist():
            out[i] = _why_not_whole(buf, int(pos[i]), int(size[i]), len(data))
        for i in np.flatnonzero(whole & ~v6 & ~plain).tolist():
            out[i] = "its field lengths do not add up to its size"
        for i in np.flatnonzero(plain & (~mine | ~placed)).tolist():
            out[i] = _whose(head, i, topic_length, topic_start, buf)
        self._good = plain & mine & placed
        self._body = (body_start.tolist(), topic_at.tolist())
        self._crc = head["body_crc"].astype(np.int64)
        self._v6 = np.flatnonzero(v6).tolist()
        self._layout = out  # last: a reader sharing the block sees all of it or none


@functools.cache
def _head_dtype() -> Any:
    import numpy as np

    return np.dtype({"names": list(_FIELDS), "formats": list(_FIELDS.values()),
                     "offsets": [_V4.offsets[f] for f in _FIELDS],
                     "itemsize": _V4.header.size})


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
    total, magic, crc, qid, _flag, offset, _phys, sys_flag, body_length = \
        _HEAD.unpack_from(view, pos)
    if total != size or qid != queue_id or offset != queue_offset or sys_flag & _HOST_FLAGS \
            or magic not in (MESSAGE_MAGIC_CODE_V1, MESSAGE_MAGIC_CODE_V2):
        return False
    end = pos + size
    body_start = pos + _HEAD.size
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
