"""One CompactionLog file and its batch ConsumeQueue file: a segment of a compaction queue.

The log file holds whole CommitLog records, byte for byte as the CommitLog holds them (so their
offset message ids and CRCs stay what they were), one after another, ended by a blank record
(``BLANK_MAGIC_CODE``) when the segment is sealed. The batch CQ file holds one 64-byte unit per
record (``bcq_format``), in queue-offset order, ended by an end unit when sealed. Both files
have the segment's name, its start offset in the queue's CompactionLog address space; a unit's
``position`` is that start plus the record's position in the log file.

Recovery (``Segment.recover``) is the CommitLog's in small: the batch CQ is trusted up to its
first unwritten unit, and back from there to the last unit whose record is whole in the log;
everything after (a torn unit, a record written without its unit) is zeroed and reported. A
record dropped that way is dispatched again from the CommitLog (the dispatch checkpoint is only
written once both files are flushed past it).

Thread-safety: the owning ``CompactionLog`` serialises ``append``/``seal`` (its append lock);
any thread may read while it holds the segment (``hold``/``release``). A sealed segment never
changes; a round reads it without a lock.
"""

from __future__ import annotations

import bisect
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from stratamq import record as codec
from stratamq.compaction import bcq_format as bcq
from stratamq.store.mapped_file import MappedFile

__all__ = ["Segment", "SegmentRecovery"]

LOG_ALLOCATE_AHEAD = 1024 * 1024
CQ_ALLOCATE_AHEAD = 64 * 1024
_LONG = struct.Struct(">q")


@dataclass
class SegmentRecovery:
    """What recovering one segment found and cut."""

    units: int = 0
    sealed: bool = False
    dropped_units: int = 0  # written units whose record was not whole (torn tail)
    dropped_bytes: int = 0  # log bytes after the last unit's record
    reason: str = ""


class Segment:
    """A log file + its batch CQ file (see the module docstring). Owns both ``MappedFile``s."""

    def __init__(self, log: MappedFile, cq: MappedFile) -> None:
        if log.file_from_offset != cq.file_from_offset:
            raise ValueError(f"{log.path} and {cq.path} are not one segment")
        self.log = log
        self.cq = cq
        self.start = log.file_from_offset
        self.units = 0  # units written (the end unit not counted)
        self.sealed = False
        self.first_offset = -1  # queue offset of the first unit, -1 while empty
        self.last_offset = -1
        self.tier_crc: int | None = None  # CRC the tier compares (tiering.segment_crc)

    @classmethod
    def create(cls, log_path: Path, cq_path: Path, log_size: int, cq_size: int) -> Segment:
        log = MappedFile(log_path, log_size, allocate_ahead=LOG_ALLOCATE_AHEAD)
        try:
            cq = MappedFile(cq_path, cq_size, allocate_ahead=CQ_ALLOCATE_AHEAD)
        except BaseException:
            log.destroy()
            raise
        return cls(log, cq)

    @classmethod
    def open(cls, log_path: Path, cq_path: Path, log_size: int, cq_size: int, *,
             read_only: bool = False) -> Segment:
        log = MappedFile(log_path, log_size, read_only=read_only,
                         allocate_ahead=LOG_ALLOCATE_AHEAD)
        try:
            cq = MappedFile(cq_path, cq_size, read_only=read_only,
                            allocate_ahead=CQ_ALLOCATE_AHEAD)
        except BaseException:
            log.close()
            raise
        return cls(log, cq)

    @property
    def name(self) -> str:
        return self.log.path.name

    @property
    def capacity(self) -> int:
        """Units the CQ file holds, its end unit included."""
        return self.cq.file_size // bcq.UNIT_SIZE

    @property
    def log_bytes(self) -> int:
        """Bytes of records in the log file (the blank filler not counted)."""
        if not self.units:
            return 0
        pos, size = bcq.position_size_at(self.cq.buffer, (self.units - 1) * bcq.UNIT_SIZE)
        return pos - self.start + size

    # -- recovery -------------------------------------------------------------------------------

    def recover(self, *, read_only: bool = False) -> SegmentRecovery:
        report = SegmentRecovery()
        cq_buf, log_buf = self.cq.buffer, self.log.buffer
        n = bcq.valid_count(cq_buf, self.capacity)
        sealed = n < self.capacity and bcq.is_end_unit(cq_buf, n * bcq.UNIT_SIZE)
        # Back from the last unit to one whose record is whole in the log.
        while n > 0:
            problem = self._unit_problem(n - 1)
            if problem is None:
                break
            report.reason = problem
            report.dropped_units += 1
            sealed = False
            n -= 1
        self.units = n
        self.sealed = sealed
        log_end = self.log_bytes
        if sealed:
            self.log.set_positions(self.log.file_size)
            self.cq.set_positions(self.cq.file_size)
        else:
            self.log.set_positions(log_end)
            self.cq.set_positions(n * bcq.UNIT_SIZE)
            if not read_only:
                # Units after a torn one, records written without their unit: zeroed, so no
                # later recovery mistakes them for live ones.
                tail = self._written_past(log_buf, log_end)
                if tail:
                    report.dropped_bytes = tail
                    report.reason = report.reason or "records after the last unit"
                self.log.zero_from(log_end)
                self.cq.zero_from(n * bcq.UNIT_SIZE)
        if n:
            self.first_offset = bcq.queue_offset_at(cq_buf, 0)
            self.last_offset = bcq.queue_offset_at(cq_buf, (n - 1) * bcq.UNIT_SIZE)
        report.units, report.sealed = n, sealed
        return report

    def _unit_problem(self, index: int) -> str | None:
        """Why unit ``index`` does not describe a whole record of this log, or None."""
        unit = bcq.unpack_unit(self.cq.buffer, index * bcq.UNIT_SIZE)
        rel = unit.position - self.start
        if rel < 0 or rel + unit.size > self.log.file_size:
            return f"unit {index} points outside its log file"
        try:
            size = codec.check_record(self.log.buffer, rel, rel + unit.size, None, False)
        except codec.RecordCorrupt as exc:
            return f"unit {index}: {exc.reason}"
        if size != unit.size:
            return f"unit {index}: record size {size} is not the unit's {unit.size}"
        if codec.record_positions(self.log.buffer, rel)[0] != unit.queue_offset:
            return f"unit {index}: the record's queue offset is not the unit's"
        return None

    @staticmethod
    def _written_past(buf: memoryview, end: int) -> int:
        """How many bytes after ``end`` look written (a record without its unit)."""
        if end + 8 > len(buf):
            return 0
        size, magic = codec.read_size_and_magic(buf, end)
        return size if magic in (codec.MESSAGE_MAGIC_CODE_V1, codec.MESSAGE_MAGIC_CODE_V2) \
            and size > 0 else 0

    # -- writing (the owner's append lock held) --------------------------------------------------

    def fits(self, size: int) -> bool:
        return (not self.sealed
                and self.log.wrote_position + size + codec.END_FILE_MIN_BLANK_LENGTH
                <= self.log.file_size
                and (self.units + 2) * bcq.UNIT_SIZE <= self.cq.file_size)  # room for the end

    def append(self, record: bytes | memoryview, queue_offset: int, tags_code: int,
               store_timestamp: int, key_digest: bytes, flags: int) -> None:
        """Append one record and its unit; the caller checked ``fits``."""
        rel = self.log.wrote_position
        self.log.write_at(rel, record)
        self.cq.write_at(self.units * bcq.UNIT_SIZE, bcq.pack_unit(
            self.start + rel, len(record), tags_code, store_timestamp, queue_offset,
            key_digest, flags))
        self.units += 1
        if self.first_offset < 0:
            self.first_offset = queue_offset
        self.last_offset = queue_offset

    def append_run(self, records: bytes | memoryview, units: np.ndarray) -> None:
        """Append records copied as one run, with their units (positions already rebased onto
        this segment): a round's bulk copy."""
        rel = self.log.wrote_position
        self.log.write_at(rel, records)
        self.cq.write_at(self.units * bcq.UNIT_SIZE, units.tobytes())
        if len(units):
            if self.first_offset < 0:
                self.first_offset = int(units["queue_offset"][0])
            self.last_offset = int(units["queue_offset"][-1])
        self.units += len(units)

    def seal(self) -> None:
        """End the segment: a blank record fills the log file, an end unit closes the CQ."""
        if self.sealed:
            return
        rel = self.log.wrote_position
        if rel + codec.END_FILE_MIN_BLANK_LENGTH <= self.log.file_size:
            self.log.write_at(rel, codec.encode_blank(self.log.file_size - rel))
        self.log.wrote_position = self.log.committed_position = self.log.file_size
        self.cq.write_at(self.units * bcq.UNIT_SIZE, bcq.END_UNIT)
        self.cq.wrote_position = self.cq.committed_position = self.cq.file_size
        self.sealed = True

    def flush(self) -> None:
        self.log.flush()
        self.cq.flush()

    # -- reading (hold the segment first) --------------------------------------------------------

    def hold(self) -> bool:
        if not self.log.hold():
            return False
        if not self.cq.hold():
            self.log.release()
            return False
        return True

    def release(self) -> None:
        self.cq.release()
        self.log.release()

    def index_of(self, queue_offset: int) -> int:
        """Index of the first unit with a queue offset at or after ``queue_offset``."""
        buf, n = self.cq.buffer, self.units
        return bisect.bisect_left(range(n), queue_offset,
                                  key=lambda i: bcq.queue_offset_at(buf, i * bcq.UNIT_SIZE))

    def index_of_time(self, timestamp_ms: int) -> int:
        """Index of the first unit stored at or after ``timestamp_ms`` (store times ascend)."""
        buf, n = self.cq.buffer, self.units
        at = bcq.OFFSETS["store_timestamp"]
        return bisect.bisect_left(range(n), timestamp_ms,
                                  key=lambda i: _LONG.unpack_from(buf, i * bcq.UNIT_SIZE + at)[0])

    def unit(self, index: int) -> bcq.Unit:
        return bcq.unpack_unit(self.cq.buffer, index * bcq.UNIT_SIZE)

    def units_array(self) -> np.ndarray:
        """The written units as a structured array viewing the map: hold the segment while
        using it."""
        return bcq.units_array(self.cq.buffer, self.units)

    def record_view(self, position: int, size: int) -> memoryview:
        rel = position - self.start
        return self.log.buffer[rel : rel + size]

    # -- lifetime -------------------------------------------------------------------------------

    def close(self) -> None:
        self.log.close()
        self.cq.close()

    def destroy(self, interval_forcibly_ms: int = 0) -> None:
        """Delete both files (readers keep their maps until they let go)."""
        self.log.destroy(interval_forcibly_ms)
        self.cq.destroy(interval_forcibly_ms)

    def __repr__(self) -> str:
        return (f"Segment({self.name}, units={self.units}, sealed={self.sealed}, "
                f"offsets={self.first_offset}..{self.last_offset})")

