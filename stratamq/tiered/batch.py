"""One queue's upload batch in bulk: its records copied out of the local CommitLog as one
buffer, and the fields the tier needs of them (store times, index keys) found with numpy
rather than record by record.

A batch of a queue is a few thousand records scattered over the CommitLog between other
queues' records. ``gather`` copies them out of each local segment straight into one buffer
(``CommitLogReader.read_gather``): only the queue's own bytes are copied, once.
Record-at-a-time code remains for what is not a plain run of readable records (blank units,
data the local store no longer has): ``gather`` answers None and the uploader takes that path.

Thread-safety: pure functions over what they are handed.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from stratamq import record as codec
from stratamq.message import Prop
from stratamq.record.layout import _V4, MESSAGE_MAGIC_CODE_V1, SYS_FLAG_POS
from stratamq.store.consume_queue_format import is_blank_unit
from stratamq.store.log_reader import CommitLogReader

__all__ = ["Batch", "be_ints", "gather", "index_keys", "store_times"]

_HOST_FLAGS = int(codec.SysFlag.BORN_HOST_V6 | codec.SysFlag.STORE_HOST_V6)
_KEYS_TAG = (Prop.KEYS + codec.NAME_VALUE_SEPARATOR).encode()
_UNIQ_TAG = (Prop.UNIQ_KEY + codec.NAME_VALUE_SEPARATOR).encode()
_SEP = codec.PROPERTY_SEPARATOR.encode()


class Batch(NamedTuple):
    """Consecutive records of one queue from queue offset ``first``: record ``i`` is
    ``data[starts[i]:starts[i] + sizes[i]]`` (back to back), with tags code ``codes[i]``."""

    first: int
    data: bytes
    starts: np.ndarray  # int64
    sizes: np.ndarray  # int64
    codes: np.ndarray  # int64

    def __len__(self) -> int:
        return len(self.sizes)

    @classmethod
    def of(cls, first: int, records: list[bytes], codes: list[int]) -> Batch:
        """A batch of records handed one by one."""
        sizes = np.fromiter(map(len, records), dtype=np.int64, count=len(records))
        starts = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
        return cls(first, b"".join(records), starts, sizes,
                   np.asarray(codes, dtype=np.int64).reshape(-1))

    def head(self, count: int) -> Batch:
        """The first ``count`` records (sharing the buffer)."""
        if count >= len(self):
            return self
        return Batch(self.first, self.data, self.starts[:count], self.sizes[:count],
                     self.codes[:count])

    def nbytes(self) -> int:
        return int(self.sizes.sum())


def gather(reader: CommitLogReader, first: int, units: list[tuple[int, int, int]],
           max_bytes: int) -> Batch | None:
    """The records of ``units`` (consecutive from queue offset ``first``; at least one, at
    most ``max_bytes`` after the first) as one buffer; None when one of them is a blank unit or
    is not readable (the caller goes record by record)."""
    if not units:
        return None
    table = np.array(units, dtype=np.int64).reshape(-1, 3)
    phys, sizes, codes = table[:, 0], table[:, 1], table[:, 2]
    blank = (phys == 0) & (sizes == 0x7FFFFFFF) & (codes == 0)  # consume_queue_format's
    # A size below the smallest record cannot be one (and would make the header reads below
    # run past the buffer or into the next record).
    if (sizes < codec.MIN_RECORD_SIZE).any() or (phys < 0).any() or blank.any():
        return None
    ends = np.cumsum(sizes)
    take = max(1, int(np.searchsorted(ends, max_bytes, side="right")))
    phys, sizes, codes = phys[:take], sizes[:take], codes[:take]
    segment = phys // reader.segment_size
    if (segment != (phys + sizes - 1) // reader.segment_size).any():
        return None  # a record across a segment boundary is not a record
    # One copy per local segment, of the records alone (not of the other queues' records
    # between them): a queue is usually one of many sharing the CommitLog.
    cuts = np.flatnonzero(segment[1:] != segment[:-1]) + 1
    windows = []
    for lo, hi in zip([0, *cuts.tolist()], [*cuts.tolist(), take], strict=True):
        piece = reader.read_gather(phys[lo:hi].tolist(), sizes[lo:hi].tolist())
        if piece is None:
            return None  # gone (or not written): the record-at-a-time path says which
        windows.append(piece)
    data = windows[0] if len(windows) == 1 else b"".join(windows)
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
    # Each record's own size field must match its unit (a unit pointing at the wrong bytes
    # must not be copied into the tier).
    if (be_ints(np.frombuffer(data, dtype=np.uint8), starts, 4) != sizes).any():
        return None
    return Batch(first, data, starts, sizes, codes)


def collect(reader: CommitLogReader, start: int, units: list[tuple[int, int, int]],
            max_bytes: int) -> tuple[Batch | None, int, list[tuple[int, int]]]:
    """Record by record, where ``gather`` could not take the units at once: the records from
    queue offset ``start`` up to the first that is blank or gone (those at the start that are,
    skipped); (batch or None, the queue offset after what was looked at, the ``[from, to)``
    queue offsets skipped, for the caller to report)."""
    records: list[bytes] = []
    codes: list[int] = []
    skipped: list[tuple[int, int]] = []
    first = total = 0
    offset = start
    missing_from = None
    for phys, size, code in units:
        if records and total + size > max_bytes:
            break
        data = None if is_blank_unit(phys, size, code) else reader.read_bytes(phys, size)
        if data is None:
            if records:
                break  # commit what comes before the gap first
            if missing_from is None:
                missing_from = offset
            offset += 1
            continue
        if missing_from is not None:
            skipped.append((missing_from, offset))
            missing_from = None
        if not records:
            first = offset
        records.append(data)
        codes.append(code)
        total += size
        offset += 1
    if missing_from is not None:
        skipped.append((missing_from, offset))
    return (Batch.of(first, records, codes) if records else None), offset, skipped


def be_ints(data: np.ndarray, at: np.ndarray, width: int) -> np.ndarray:
    """Big-endian unsigned integers of ``width`` bytes at each position (int64)."""
    rows = data[at[:, None] + np.arange(width)].astype(np.int64)
    out = rows[:, 0].copy()
    for k in range(1, width):
        out = (out << 8) | rows[:, k]
    return out


def store_times(batch: Batch) -> np.ndarray:
    """Each record's store time."""
    data = np.frombuffer(batch.data, dtype=np.uint8)
    v6 = (be_ints(data, batch.starts + SYS_FLAG_POS, 4) & _HOST_FLAGS) != 0
    times = be_ints(data, batch.starts + _V4.store_timestamp_pos, 8)
    for row in np.flatnonzero(v6).tolist():  # IPv6 hosts move the field: rare, one by one
        times[row] = codec.record_store_timestamp(batch.data, int(batch.starts[row]))
    return times


def index_keys(batch: Batch) -> tuple[list[str], np.ndarray]:
    """Every index key of the batch's records (``KEYS`` split on spaces, then ``UNIQ_KEY``;
    a record's keys without repeats) and the row of the record each belongs to, in record
    order. The properties are located for all records at once, and only their bytes are
    searched. Flat lists of strings, no container per record: thousands of them alive
    through an upload would set off the garbage collector's full passes (a tenth of a second
    and more with a broker's objects) in the middle of it."""
    data = np.frombuffer(batch.data, dtype=np.uint8)
    pos = batch.starts
    v6 = (be_ints(data, pos + SYS_FLAG_POS, 4) & _HOST_FLAGS) != 0
    magic = be_ints(data, pos + 4, 4)
    body_len = be_ints(data, pos + _V4.header.size - 4, 4)
    p = pos + _V4.header.size + body_len
    v1 = magic == MESSAGE_MAGIC_CODE_V1
    safe = np.minimum(p, len(data) - 2)
    topic_len = np.where(v1, data[safe], (data[safe].astype(np.int64) << 8) | data[safe + 1])
    props_start = p + np.where(v1, 1, 2) + topic_len + 2
    props_end = pos + batch.sizes
    if not v6.any():
        bulk = _keys_in_bulk(data, props_start, props_end)
        if bulk is not None:
            return bulk
    return _keys_record_by_record(batch, v6, props_start, props_end)


def _keys_record_by_record(batch: Batch, v6: np.ndarray, props_start: np.ndarray,
                           props_end: np.ndarray) -> tuple[list[str], np.ndarray]:
    """``index_keys`` one record at a time (what the bulk path must give)."""
    pos = batch.starts
    raw = batch.data
    keys: list[str] = []
    rows: list[int] = []
    spans = zip(props_start.tolist(), props_end.tolist(), v6.tolist(), pos.tolist(),
                strict=True)
    for row, (start, end, is_v6, at) in enumerate(spans):
        if is_v6:  # the header is longer: the record's own codec finds its properties
            record = raw[at : int(at + batch.sizes[row])]
            words = codec.record_property(record, Prop.KEYS) or ""
            uniq = codec.record_property(record, Prop.UNIQ_KEY) or ""
        else:
            props = raw[start:end]
            words = _value(props, _KEYS_TAG)
            uniq = _value(props, _UNIQ_TAG)
        if words:
            split = words.split()
            if len(split) == 1:
                if split[0] != uniq:
                    keys.append(split[0])
                    rows.append(row)
            else:
                for word in dict.fromkeys(split):
                    if word != uniq:
                        keys.append(word)
                        rows.append(row)
        if uniq:
            keys.append(uniq)
            rows.append(row)
    return keys, np.array(rows, dtype=np.int64)


_KEYS_NAME = np.frombuffer(_KEYS_TAG, dtype=np.uint8)
_UNIQ_NAME = np.frombuffer(_UNIQ_TAG, dtype=np.uint8)
# Bytes the bulk path leaves to the record path: not ASCII (decoding with replacement, and
# str.split's Unicode spaces) or ASCII whitespace (a KEYS value of several words).
_NOT_PLAIN = np.zeros(256, dtype=bool)
_NOT_PLAIN[0x80:] = True
_NOT_PLAIN[[0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x1C, 0x1D, 0x1E, 0x1F, 0x20]] = True


def _keys_in_bulk(data: np.ndarray, props_start: np.ndarray, props_end: np.ndarray
                  ) -> tuple[list[str], np.ndarray] | None:
    """``index_keys`` for the usual batch, without a step per record: every record's
    properties end with a separator (as RocketMQ writes them), and each has at most one KEYS
    value, of one plain ASCII word, and one plain ASCII UNIQ_KEY. The properties of all
    records are copied back to back and their property names compared with numpy; None when
    the batch is not like that (the record path then takes it)."""
    lens = props_end - props_start
    if (lens < 0).any():
        return None
    held = lens > 0
    if (data[props_end[held] - 1] != 0x02).any():
        return None  # a record whose last property has no separator after it
    total = int(lens.sum())
    firsts = np.cumsum(lens) - lens  # where each record's properties start in ``joined``
    joined = data[np.repeat(props_start - firsts, lens) + np.arange(total)]
    separators = np.flatnonzero(joined == 0x02)
    # A property starts where a record's properties do, or after a separator (every record's
    # last property ends with one, so records' starts are among these).
    starts = np.concatenate(([0], separators[:-1] + 1)) if total else separators
    found = []
    for code, name in enumerate((_KEYS_NAME, _UNIQ_NAME)):  # code 0: KEYS, 1: UNIQ_KEY
        at = starts[starts + len(name) <= total]
        hit = (joined[at[:, None] + np.arange(len(name))] == name).all(axis=1)
        found.append((at[hit] + len(name), np.full(int(hit.sum()), code, dtype=np.int64)))
    begin = np.concatenate([values for values, _codes in found])  # where each value starts
    kind = np.concatenate([codes for _values, codes in found])
    rows = np.searchsorted(firsts, begin, side="right") - 1  # a property's record
    pairs = rows * 2 + kind
    order = np.argsort(pairs, kind="stable")  # a record's KEYS word, then its UNIQ_KEY
    pairs = pairs[order]
    if (pairs[1:] == pairs[:-1]).any():
        return None  # a property twice in a record
    begin, kind, rows = begin[order], kind[order], rows[order]
    end = separators[np.searchsorted(separators, begin)]  # each value ends at a separator
    marks = np.concatenate(([0], np.cumsum(_NOT_PLAIN[joined])))
    if (marks[end] != marks[begin]).any():
        return None
    latin = joined.tobytes().decode("latin-1")  # byte for character; the values are ASCII
    values = [latin[a:b] for a, b in zip(begin.tolist(), end.tolist(), strict=True)]
    uniq = {r: v for r, v, k in zip(rows.tolist(), values, kind.tolist(), strict=True) if k}
    keys: list[str] = []
    out: list[int] = []
    for row, value, is_uniq in zip(rows.tolist(), values, kind.tolist(), strict=True):
        # A KEYS word equal to the record's UNIQ_KEY is indexed once, as the UNIQ_KEY.
        if value and (is_uniq or uniq.get(row) != value):
            keys.append(value)
            out.append(row)
    return keys, np.array(out, dtype=np.int64)


def _value(props: bytes, tag: bytes) -> str:
    """The value of property ``tag`` (name + separator) in raw properties; "" when absent."""
    if props.startswith(tag):
        at = len(tag)
    else:
        at = props.find(_SEP + tag)
        if at < 0:
            return ""
        at += len(_SEP) + len(tag)
    end = props.find(_SEP, at)
    return props[at : end if end >= 0 else len(props)].decode("utf-8", "replace")
