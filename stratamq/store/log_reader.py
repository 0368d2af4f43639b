"""``CommitLogReader``: the one way parts outside the CommitLog read it.

What the tier uploader, replication and the compaction log need from the log, behind one small
interface that hands out bytes, not ``MappedFile`` internals:

- ``read_bytes(offset, size)``: a copy of a byte range inside one segment (a record);
- ``read_range(start, end)``: raw CommitLog bytes for replication, clipped to a segment and to
  what is written; ``view_range(start, end)`` the same bytes as a view of the segment, valid
  inside a ``with`` (the master hands them to the socket without copying them first);
- ``read_gather(offsets, sizes)``: many records of one segment back to back, one copy (the
  tier uploader's batch of one queue);
- ``records(start, end)``: the records from ``start`` (a record boundary), each as a copy, with
  blank filler skipped to the next segment and damage reported through a ``Reporter`` (what,
  where, why) before the walk resyncs past it.

Every segment is held while it is read and released before the call returns, so clean-up can
always take it afterwards. Thread-safety: any thread; no state between calls.
"""

from __future__ import annotations

import contextlib
import logging
import operator
from collections.abc import Callable, Iterator
from typing import NamedTuple, Protocol

from stratamq import record as codec
from stratamq.store.mapped_file_queue import MappedFileQueue

__all__ = ["CommitLogReader", "LogRecord", "LoggingReporter", "Reporter"]

log = logging.getLogger(__name__)


class LogRecord(NamedTuple):
    physical_offset: int
    data: bytes  # the whole record, as stored


class Reporter(Protocol):
    """Told of every stretch of the log a walk could not read as records."""

    def corruption(self, offset: int, skipped: int, reason: str) -> None: ...


class LoggingReporter:
    """Logs each damaged stretch (the default)."""

    def __init__(self, what: str = "CommitLog reader") -> None:
        self.what = what
        self.skipped_bytes = 0

    def corruption(self, offset: int, skipped: int, reason: str) -> None:
        self.skipped_bytes += skipped
        log.error("%s: skipped %d bytes at CommitLog offset %d: %s", self.what, skipped, offset,
                  reason)


class CommitLogReader:
    """Reads a CommitLog's segments (``files``) by offset; ``end()`` says how far it is
    written (the CommitLog's max offset, or a replica's confirmed end)."""

    def __init__(self, files: MappedFileQueue, end: Callable[[], int] | None = None) -> None:
        self._files = files
        self._end = end if end is not None else files.max_offset

    @property
    def min_offset(self) -> int:
        first = self._files.first()
        return first.file_from_offset if first is not None else 0

    def end(self) -> int:
        return self._end()

    @property
    def segment_size(self) -> int:
        return self._files.mapped_file_size

    def read_bytes(self, offset: int, size: int) -> bytes | None:
        """A copy of ``size`` bytes at ``offset`` (inside one segment); None if that data is
        gone or not written yet."""
        mf = self._files.find_by_offset(offset)
        if mf is None or not mf.hold():
            return None
        try:
            rel = offset - mf.file_from_offset
            if rel < 0 or rel + size > mf.read_position:
                return None
            return bytes(mf.buffer[rel : rel + size])
        finally:
            mf.release()

    def read_range(self, start: int, end: int) -> bytes:
        """Raw bytes from ``start`` up to ``end``, stopping at the end of the segment holding
        ``start`` and at what is written: b"" when nothing is (or the data is gone)."""
        mf = self._files.find_by_offset(start)
        if mf is None or not mf.hold():
            return b""
        try:
            rel = start - mf.file_from_offset
            base = mf.file_from_offset
            stop = min(mf.read_position, end - base, self._end() - base)
            if stop <= rel:
                return b""
            return bytes(mf.buffer[rel:stop])
        finally:
            mf.release()

    @contextlib.contextmanager
    def view_range(self, start: int, end: int) -> Iterator[memoryview]:
        """``read_range``'s bytes as a zero-copy view of the segment, which is held until the
        ``with`` ends: the caller must drop every view it took of them by then (a view left
        alive keeps the segment's map from being unmapped)."""
        mf = self._files.find_by_offset(start)
        if mf is None or not mf.hold():
            yield memoryview(b"")
            return
        view = None
        try:
            rel = start - mf.file_from_offset
            base = mf.file_from_offset
            stop = min(mf.read_position, end - base, self._end() - base)
            view = mf.buffer[rel : max(rel, stop)]
            yield view
        finally:
            if view is not None:
                view.release()
            mf.release()

    def read_gather(self, offsets: list[int], sizes: list[int]) -> bytes | None:
        """The byte ranges ``offsets[i]``..``+ sizes[i]`` (all in the segment holding
        ``offsets[0]``) back to back, copied once straight from the segment (no copy of the
        span between them); None when one is gone, not written, or in another segment."""
        if not offsets:
            return b""
        mf = self._files.find_by_offset(offsets[0])
        if mf is None or not mf.hold():
            return None
        try:
            base = mf.file_from_offset
            stop = min(mf.read_position, self._end() - base)
            if min(offsets) < base or min(sizes) < 0 or \
                    max(map(operator.add, offsets, sizes)) - base > stop:
                return None
            buf = mf.buffer
            # The slices are views of the mapping: they are gone before it is released.
            pieces = [buf[at - base : at - base + size]
                      for at, size in zip(offsets, sizes, strict=True)]
            data = b"".join(pieces)
            del pieces
            return data
        finally:
            mf.release()

    def records(self, start: int, end: int | None = None,
                reporter: Reporter | None = None) -> Iterator[LogRecord]:
        """Each record from ``start`` (a record boundary) to ``end`` (default: ``end()``).

        A blank filler moves on to the next segment. Bytes that are not a record are reported
        and skipped to the next position where one provably starts (``codec.resync``), or to
        the next segment. A record written only in part ends the walk before it.
        """
        reporter = reporter or LoggingReporter()
        limit = self._end() if end is None else min(end, self._end())
        offset = max(start, self.min_offset)
        while offset < limit:
            batch, offset, done = self._segment_records(offset, limit, reporter)
            yield from batch  # after the segment was released
            if done:
                return

    def _segment_records(self, offset: int, limit: int, reporter: Reporter
                         ) -> tuple[list[LogRecord], int, bool]:
        """Up to 4,096 records of the segment holding ``offset``: (records, where to go on,
        whether the walk is over)."""
        mf = self._files.find_by_offset(offset)
        if mf is None or not mf.hold():
            return [], offset, True
        batch: list[LogRecord] = []
        try:
            buf, base = mf.buffer, mf.file_from_offset
            pos = offset - base
            stop = min(mf.read_position, limit - base)
            while pos + 8 <= stop and len(batch) < 4096:
                try:
                    size = codec.check_record(buf, pos, stop, base + pos, check_crc=False)
                except codec.RecordCorrupt as exc:
                    declared, magic = codec.read_size_and_magic(buf, pos)
                    if declared == 0 and magic == 0:  # never written: the end of the log
                        return batch, base + pos, True
                    if magic in (codec.MESSAGE_MAGIC_CODE_V1, codec.MESSAGE_MAGIC_CODE_V2) \
                            and pos + declared > stop and pos + declared <= mf.file_size:
                        return batch, base + pos, True  # written only in part, so far
                    found = codec.resync(buf, pos + 1, stop, base)
                    skip_to = found if found is not None else stop
                    reporter.corruption(base + pos, skip_to - pos, exc.reason)
                    pos = skip_to
                    continue
                if size == 0:  # blank filler: the rest of the segment is not records
                    return batch, mf.file_end_offset, mf.file_end_offset >= limit
                batch.append(LogRecord(base + pos, bytes(buf[pos : pos + size])))
                pos += size
            if len(batch) >= 4096 or base + pos >= limit or pos + 8 <= stop:
                return batch, base + pos, base + pos >= limit
            # Fewer than 8 bytes left before the segment's written end.
            full = mf.read_position >= mf.file_size - 8
            return batch, (mf.file_end_offset if full else base + pos), not full
        finally:
            mf.release()
