"""Bulk reading (the Spark source, verify, log bounds): walk a segment, find a record start
from anywhere, and locate the fields of many records at once. numpy is imported lazily: only
bulk readers need it."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from stratamq.message import Host, RecordCorrupt, _ip_text
from stratamq.record.codec import _HOST_FLAGS
from stratamq.record.decoding import check_record
from stratamq.record.layout import (
    _SIZE_MAGIC,
    _V4,
    BLANK_MAGIC_CODE,
    MESSAGE_MAGIC_CODE_V1,
    MESSAGE_MAGIC_CODE_V2,
    MIN_RECORD_SIZE,
    SYS_FLAG_POS,
    _fields,
    _layout_for,
)

if TYPE_CHECKING:
    from stratamq.record.codec import Buffer


class Walk(NamedTuple):
    positions: Sequence[int]  # start of each record that begins in [pos, end) (numpy int64)
    stop: int  # where the walk stopped
    reason: str  # "end" (passed end), "blank" (segment filler), "zero" (never written), "corrupt"


def walk_records(buf: Buffer, pos: int, end: int, limit: int) -> Walk:
    """Positions of the records starting in ``[pos, end)``, walking from the record at ``pos``.

    Only sizes and magic codes are checked here; :func:`locate_fields` checks the rest.

    The size chain is sequential, but following it one record at a time in Python costs about
    half a microsecond a record. So the walk is done in bulk: every position in the window whose
    bytes read as a V1/V2 magic code with a plausible size is a candidate, and the chain is
    followed through the candidates with numpy (each candidate's successor must be the next
    candidate). The result is exactly the sequential walk: the first record is the one at
    ``pos``, and every record after it is the previous one's position plus its size. A body
    that happens to contain a magic code only breaks the chain there; the walk jumps to the
    record the chain points at and goes on. Where the chain leaves the candidates (blank filler,
    never-written bytes, corruption) one sequential step says why.

    Before that scan, runs of records of one size (a producer's batch, most of a log in
    practice) are followed without it (:func:`_same_size_runs`); the scan then covers only
    what is left, if anything.
    """
    import numpy as np

    data = np.frombuffer(buf, dtype=np.uint8)
    pieces, pos = _same_size_runs(np, buf, data, pos, end, limit)
    if pos >= end:
        return Walk(_join(np, pieces), pos, "end")
    if not _is_candidate(buf, pos, min(end, limit - 8), limit):
        return Walk(_join(np, pieces), pos, _why_not(buf, pos, limit))  # no need to scan
    cand, nxt = _candidates(np, data, pos, min(end, limit - 8), limit)
    breaks = np.flatnonzero(nxt[:-1] != cand[1:])  # chain from cand[i] stops after a break
    while pos < end:
        j = int(np.searchsorted(cand, pos))
        if j < len(cand) and cand[j] == pos:
            b = int(breaks[np.searchsorted(breaks, j)]) if len(breaks) and breaks[-1] >= j \
                else len(cand) - 1
            pieces.append(cand[j : b + 1])
            pos = int(nxt[b])
            continue
        # Not a candidate: this is where the segment's records end (or are damaged).
        return Walk(_join(np, pieces), pos, _why_not(buf, pos, limit))
    positions = _join(np, pieces)
    # A chain piece may run past ``end``; the walk stops at the first record starting after it.
    cut = int(np.searchsorted(positions, end))
    stop = pos if cut == len(positions) else int(positions[cut])
    return Walk(positions[:cut], stop, "end")


def _is_candidate(buf: Buffer, pos: int, hi: int, limit: int) -> bool:
    """What :func:`_candidates` answers for one position."""
    if pos >= hi:
        return False
    size, magic = _SIZE_MAGIC.unpack_from(buf, pos)
    return (magic in (MESSAGE_MAGIC_CODE_V1, MESSAGE_MAGIC_CODE_V2) and size >= MIN_RECORD_SIZE
            and pos + size <= limit)


def _why_not(buf: Buffer, pos: int, limit: int) -> str:
    """The walk's reason to stop at a chain position that is not a candidate."""
    if pos + 8 > limit:
        return "zero" if pos == limit else "corrupt"
    total, magic = _SIZE_MAGIC.unpack_from(buf, pos)
    if magic in (MESSAGE_MAGIC_CODE_V1, MESSAGE_MAGIC_CODE_V2):
        return "corrupt"  # a candidate unless its size is bad
    if magic == BLANK_MAGIC_CODE:
        return "blank"
    if total == 0 and magic == 0:
        return "zero"
    return "corrupt"


SHORT_RUN = 64  # a run of one size shorter than this: sizes vary, scan for candidates instead
RUN_PROBE = 16384  # headers read at once when following a run


def _same_size_runs(np: Any, buf: Buffer, data: Any, pos: int, end: int, limit: int
                    ) -> tuple[list, int]:
    """Follow the size chain from the record at ``pos`` (a chain position) while records come
    in runs of one size, without looking at every byte: if the record at ``pos`` has size
    ``s``, read the headers at ``pos + k*s`` at once; the run is the records up to the first
    one whose magic code is not V1/V2 or whose size is not ``s`` (exactly the sequential walk:
    each record's successor is its position plus its size). That first record is where the
    chain goes on, with its own size. Stops at ``end``, at a header that is no record (the
    caller's scan says why), or after a short run (sizes vary: the candidate scan is cheaper
    then). Returns the runs' positions and where the chain stopped."""
    pieces: list = []
    hi = min(end, limit - 8)  # headers readable
    v1, v2 = MESSAGE_MAGIC_CODE_V1, MESSAGE_MAGIC_CODE_V2
    while pos < hi:
        size, magic = _SIZE_MAGIC.unpack_from(buf, pos)
        if magic not in (v1, v2) or size < MIN_RECORD_SIZE or pos + size > limit:
            break
        # Run positions starting before ``end`` whose header and whole record are readable
        # (at most RUN_PROBE of them at once: a run may end early).
        last = min(hi - 1, limit - size, pos + (RUN_PROBE - 1) * size)
        at = np.arange(pos, last + 1, size, dtype=np.int64)
        heads = _rows(np, data, at, 8).view(">u4")  # (size, magic) per position
        good = (heads[:, 0] == size) & ((heads[:, 1] == v1) | (heads[:, 1] == v2))
        bad = np.flatnonzero(~good)
        run = int(bad[0]) if len(bad) else len(at)  # records of the run (the first is good)
        pieces.append(at[:run])
        pos += run * size
        if run < min(len(at), SHORT_RUN):
            break
        # Otherwise the next record (another size, or no record, or past ``hi``) is looked
        # at as the start of the next run.
    return pieces, pos


def stamped_runs(buf: Buffer, pos: int, limit: int, file_from_offset: int) -> int:
    """Follow the size chain from ``pos`` through runs of records of one size that lie whole
    before ``limit``, each record checked as :func:`records_pass` checks it; return where the
    chain leaves such runs (``pos`` itself when the record there does not pass).

    The records before the returned position are exactly those a record-by-record check of
    the chain passes; the caller goes on from there (:func:`walk_records`). Nothing is gathered
    per record: the headers of a run are read through a strided view of ``buf`` (one every
    ``size`` bytes), so a run of thousands of records costs a few vectorised operations (a
    slave catching up checks every byte it copies this way).
    """
    import numpy as np

    data = np.frombuffer(buf, dtype=np.uint8)
    header = _checked_header(np)
    v1, v2 = MESSAGE_MAGIC_CODE_V1, MESSAGE_MAGIC_CODE_V2
    while pos + 8 <= limit:
        size, magic = _SIZE_MAGIC.unpack_from(buf, pos)
        if magic not in (v1, v2) or size < MIN_RECORD_SIZE or pos + size > limit:
            break
        count = min((limit - pos) // size, RUN_PROBE)  # records of this size lying whole
        heads = np.ndarray((count,), dtype=header, buffer=buf, offset=pos, strides=(size,))
        starts = np.arange(pos, pos + count * size, size, dtype=np.int64)
        good = (heads["total_size"] == size) & _pass(np, data, heads, starts, file_from_offset)
        bad = np.flatnonzero(~good)
        run = int(bad[0]) if len(bad) else count
        pos += run * size
        if run < count and run < SHORT_RUN:
            break  # sizes vary here (or a record is damaged): the caller's walk goes on
    return pos


def records_pass(buf: Buffer, positions: Sequence[int], file_from_offset: int) -> Any:
    """Whether each record at ``positions`` (each lying whole in ``buf``, as a walk finds them)
    passes the checks :func:`scan_records` makes, without the CRC: a V1/V2 magic code, a
    size of at least :data:`MIN_RECORD_SIZE`, its stored physical offset equal to
    ``file_from_offset`` + its position, and body, topic and properties lengths that add up to
    its size (a record with an IPv6 host, another header layout and rare: all but the
    lengths). A numpy bool array."""
    import numpy as np

    data = np.frombuffer(buf, dtype=np.uint8)
    starts = np.asarray(positions, dtype=np.int64)
    heads = _rows(np, data, starts, _V4.header.size).view(_checked_header(np)).ravel()
    return _pass(np, data, heads, starts, file_from_offset)


_CHECKED_FIELDS = {"total_size": ">i4", "magic_code": ">u4", "physical_offset": ">i8",
                   "sys_flag": ">i4", "body_length": ">i4"}


def _checked_header(np: Any) -> Any:
    """The header fields the checks read, as a numpy record of the IPv4 header's size."""
    return np.dtype({"names": list(_CHECKED_FIELDS), "formats": list(_CHECKED_FIELDS.values()),
                     "offsets": [_V4.offsets[name] for name in _CHECKED_FIELDS],
                     "itemsize": _V4.header.size})


def _pass(np: Any, data: Any, heads: Any, starts: Any, file_from_offset: int) -> Any:
    """:func:`records_pass` for the records whose headers are ``heads``, at ``starts``."""
    size = heads["total_size"].astype(np.int64)
    ends = starts + size
    magic = heads["magic_code"]
    v1 = magic == MESSAGE_MAGIC_CODE_V1
    good = (v1 | (magic == MESSAGE_MAGIC_CODE_V2)) & (size >= MIN_RECORD_SIZE) \
        & (ends <= len(data)) & (heads["physical_offset"] == starts + file_from_offset)
    v6 = (heads["sys_flag"] & int(_HOST_FLAGS)) != 0
    body_length = heads["body_length"].astype(np.int64)
    topic_at = starts + _V4.header.size + body_length
    fits = good & ~v6 & (body_length >= 0) & (topic_at + 3 <= ends)
    topic_at = np.where(fits, topic_at, starts)  # keep the picks inside the buffer
    high = data[topic_at].astype(np.int64)
    topic_length = np.where(v1, high, (high << 8) | data[topic_at + 1])
    props_at = topic_at + np.where(v1, 1, 2) + topic_length
    fits &= (topic_length > 0) & (props_at + 2 <= ends)
    props_at = np.where(fits, props_at, starts)
    props_length = (data[props_at].astype(np.int64) << 8) | data[props_at + 1]
    fits &= props_at + 2 + props_length == ends
    return good & (v6 | fits)


def _join(np: Any, pieces: list) -> Any:
    return np.concatenate(pieces) if pieces else np.empty(0, dtype=np.int64)


_MAGIC_BYTES = [struct.pack(">I", m) for m in (MESSAGE_MAGIC_CODE_V1, MESSAGE_MAGIC_CODE_V2)]


def _candidates(np, data, lo: int, hi: int, limit: int) -> tuple:
    """Positions p in ``[lo, hi)`` whose bytes read as a record header (V1/V2 magic code, size
    at least :data:`MIN_RECORD_SIZE` and inside ``limit``), and ``p + size`` for each."""
    if hi <= lo:
        empty = np.empty(0, dtype=np.int64)
        return empty, empty
    first = _MAGIC_BYTES[0]
    # One pass over the window for the magic code's first byte; the rest checked on the hits.
    starts = np.flatnonzero(data[lo + 4 : hi + 4] == first[0]) + lo  # record starts: magic - 4
    starts = starts[starts + 8 <= limit]
    ok = (data[starts + 5] == first[1]) & (data[starts + 6] == first[2])
    last = data[starts + 7]
    ok &= (last == _MAGIC_BYTES[0][3]) | (last == _MAGIC_BYTES[1][3])
    cand = starts[ok]
    size = _be(np, data, cand, 4).astype(np.int64)
    size = np.where(size >= 0x8000_0000, size - (1 << 32), size)
    good = (size >= MIN_RECORD_SIZE) & (cand + size <= limit)
    cand = cand[good]
    return cand, cand + size[good]


def _be(np, data, at, width: int):
    """Big-endian unsigned integers of ``width`` bytes at positions ``at`` (as uint64)."""
    value = np.zeros(len(at), dtype=np.uint64)
    for k in range(width):
        value = (value << np.uint64(8)) | data[at + k]
    return value


_MAGIC_PREFIX = struct.pack(">I", MESSAGE_MAGIC_CODE_V1)[:3]
assert struct.pack(">I", MESSAGE_MAGIC_CODE_V2)[:3] == _MAGIC_PREFIX


def resync(buf: Buffer, pos: int, limit: int, file_from_offset: int) -> int | None:
    """The first position >= ``pos`` where a record provably starts, or None before ``limit``.

    A candidate is a V1/V2 magic code; it is confirmed when the record's stored physical offset
    equals ``file_from_offset`` + its position and its lengths add up (:func:`check_record`).
    Body bytes that merely look like a magic code fail the offset check.
    """
    find = buf.find if hasattr(buf, "find") else bytes(buf).find
    at = pos + 4
    while True:
        hit = find(_MAGIC_PREFIX, at, limit)
        if hit < 0:
            return None
        start = hit - 4
        if hit + 4 <= limit and buf[hit + 3] in (0xA7, 0xAB):
            try:
                check_record(buf, start, limit, file_from_offset + start, False)
                return start
            except RecordCorrupt:
                pass
        at = hit + 1


_NUMPY_CODES = {"i": ">i4", "I": ">u4", "q": ">i8", "4si": (">u4", ">i4"),
                "16si": ("V16", ">i4")}  # fmt: skip


def _numpy_fields(layout_fields: list[tuple[str, str]]) -> list[tuple[str, str]]:
    out = []
    for name, code in layout_fields:
        np_code = _NUMPY_CODES[code]
        if isinstance(np_code, tuple):  # a host: address then port
            out += [(f"{name}_ip", np_code[0]), (f"{name}_port", np_code[1])]
        else:
            out.append((name, np_code))
    return out


def locate_fields(buf: Buffer, positions: Sequence[int],
                  file_from_offset: int) -> dict[str, Any]:
    """Header fields and the spans of body, topic and properties of many records, as numpy
    arrays (one element per position); raises :class:`RecordCorrupt` for the first record whose
    lengths do not add up or whose stored physical offset is not where it lies.

    Keys: every header field of :func:`_fields` (hosts as ``*_ip`` and ``*_port``; an IPv4
    address as a u32, IPv6 addresses in ``v6_hosts``: {row: (born Host, store Host)}), plus
    ``body_start``, ``topic_start``, ``topic_length``, ``props_start``, ``props_length``.
    """
    import numpy as np

    data = np.frombuffer(buf, dtype=np.uint8)
    pos = np.asarray(positions, dtype=np.int64)
    n = len(pos)
    sys_flag = _gather(np, data, pos + SYS_FLAG_POS, ">i4")
    out: dict[str, Any] = {}
    v6_rows = np.flatnonzero(sys_flag & _HOST_FLAGS)
    v4_dtype = np.dtype(_numpy_fields(_fields(False, False)))
    header = _gather_struct(np, data, pos, v4_dtype)
    for name in v4_dtype.names or ():
        out[name] = header[name].astype(v4_dtype[name].newbyteorder("="))
    header_size = np.full(n, _V4.header.size, dtype=np.int64)
    v6_hosts: dict[int, tuple[Host, Host]] = {}
    for row in v6_rows.tolist():  # rare: decode such headers one by one
        at = int(pos[row])
        layout = _layout_for(int(sys_flag[row]))
        values = layout.header.unpack_from(buf, at)
        for (name, _), value in zip(_fields(False, False)[9:], _split_hosts(values)[9:]):
            if name not in ("born_host", "store_host"):
                out[name][row] = value
        v = _split_hosts(values)
        v6_hosts[row] = (Host(_ip_text(v[9][0]), v[9][1]), Host(_ip_text(v[11][0]), v[11][1]))
        out["born_host_ip"][row] = out["store_host_ip"][row] = 0
        header_size[row] = layout.header.size
    out["v6_hosts"] = v6_hosts
    total = out["total_size"]
    body_start = pos + header_size
    p = body_start + out["body_length"]
    end = pos + total
    v1 = out["magic_code"] == MESSAGE_MAGIC_CODE_V1
    bad = (out["body_length"] < 0) | (p + np.where(v1, 1, 2) > end)
    p = np.where(bad, pos, p)  # keep gathers inside the buffer until the check below
    first = data[p].astype(np.int64)
    topic_len = np.where(v1, first, (first << 8) | data[np.minimum(p + 1, len(data) - 1)])
    topic_start = p + np.where(v1, 1, 2)
    props_len_pos = np.minimum(topic_start + topic_len, len(data) - 2)
    props_len = (data[props_len_pos].astype(np.int64) << 8) | data[props_len_pos + 1]
    props_start = topic_start + topic_len + 2
    bad |= (props_start + props_len != end) | (topic_len == 0)
    bad |= out["physical_offset"] != pos + file_from_offset
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        check_record(buf, int(pos[row]), len(data), file_from_offset + int(pos[row]), False)
        raise RecordCorrupt(int(pos[row]), "fields do not add up")  # check_record raised first
    out.update(body_start=body_start, topic_start=topic_start, topic_length=topic_len,
               props_start=props_start, props_length=props_len)
    return out


def _split_hosts(values: tuple) -> list:
    """A header tuple with each host's (ip, port) pair joined, aligned with :func:`_fields`."""
    v = list(values)
    return v[:9] + [(v[9], v[10])] + [v[11]] + [(v[12], v[13])] + v[14:]


def _rows(np, data, pos, width: int):
    """The ``width`` bytes at each position, one row each: numpy copies whole rows (one memcpy
    per record) from a strided view, much cheaper than a per-byte fancy index."""
    if len(pos) and int(pos.max()) + width > len(data):
        raise RecordCorrupt(int(pos.max()), "record header runs past the end of the data")
    view = np.lib.stride_tricks.as_strided(data, shape=(max(len(data) - width + 1, 0), width),
                                           strides=(1, 1), writeable=False)
    return view[pos]


def gather_longs(buf: Buffer, at: Any) -> Any:
    """The big-endian signed 8-byte integers at positions ``at`` of ``buf`` (numpy int64)."""
    import numpy as np

    return _gather(np, np.frombuffer(buf, dtype=np.uint8), np.asarray(at, dtype=np.int64),
                   ">i8")


def _gather(np, data, at, dtype: str):
    width = np.dtype(dtype).itemsize
    return _rows(np, data, at, width).view(dtype).ravel().astype(dtype[1:])


def _gather_struct(np, data, pos, dtype):
    return _rows(np, data, pos, dtype.itemsize).view(dtype).ravel()
