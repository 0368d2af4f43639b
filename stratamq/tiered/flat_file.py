"""The container layer: ``FlatAppendFile`` and its two kinds, ``FlatCommitLogFile`` and
``FlatConsumeQueueFile`` (RocketMQ's ``file/FlatAppendFile.java`` and friends).

A ``FlatAppendFile`` is a run of ``FileSegment``s of one type of one queue, like a
``MappedFileQueue``: only the last is written; a full one is committed, then a new one is
started at the next offset (``roll``). Each segment is recorded in the metadata store before
anything is written to it, and its size after each commit.

* ``FlatCommitLogFile``: the queue's records, copied byte for byte from the local CommitLog;
  offsets are this queue's own (a record's flat offset is where it landed in this file), while
  the record keeps its original CommitLog offset inside (so its message id does not change).
  Records never straddle two segments. Rolls at ``tieredStoreCommitLogMaxSize``, or once its
  first message is older than ``commitLogRollingInterval`` and it holds
  ``commitLogRollingMinimumSize``.
* ``FlatConsumeQueueFile``: 20-byte units (``consume_queue_format``: flat CommitLog offset,
  size, tags code), unit ``n`` at byte ``n * 20``. Unlike RocketMQ's, its segments may have a
  gap between them: when local data expired before it was tiered, the next segment starts at
  the queue offset the tier resumes from (the gap is never filled).

Thread-safety: writers (append, commit, roll, truncate, expiry) hold ``lock``; readers take a
snapshot of ``segments`` (a tuple, replaced, never changed in place) and need no lock.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time

import numpy as np

from stratamq.store.consume_queue_format import UNIT, UNIT_SIZE
from stratamq.tiered.drivers import AppendResult, FileSegment, FileSegmentFactory, TierIOError
from stratamq.tiered.drivers.base import NO_TIMESTAMP
from stratamq.tiered.metadata import STATUS_SEALED, FileSegmentMetadata, MetadataStore
from stratamq.tiered.naming import FileSegmentType

__all__ = ["UNIT_DTYPE", "FlatAppendFile", "FlatCommitLogFile", "FlatConsumeQueueFile"]

# ``consume_queue_format.UNIT``'s layout as a numpy record, to pack or read many units at once.
UNIT_DTYPE = np.dtype([("offset", ">i8"), ("size", ">i4"), ("code", ">i8")])
assert UNIT_DTYPE.itemsize == UNIT_SIZE and UNIT.format.lstrip(">") == "qiq"

log = logging.getLogger(__name__)


class FlatAppendFile:
    """Segments of one file type of one queue (``file_path`` = broker/topic/queueId)."""

    def __init__(self, factory: FileSegmentFactory, metadata: MetadataStore,
                 file_type: FileSegmentType, file_path: str) -> None:
        self.factory = factory
        self.metadata = metadata
        self.file_type = file_type
        self.file_path = file_path
        self.lock = threading.RLock()
        self.segments: tuple[FileSegment, ...] = ()
        self._recover()

    def _recover(self) -> None:
        """Segments as the metadata records them (sizes as last persisted)."""
        found = []
        for meta in self.metadata.segments(self.file_path, self.file_type):
            segment = self.factory.create_segment(self.file_type, self.file_path,
                                                  meta.baseOffset)
            segment.init_position(meta.size)
            if meta.parts is not None:
                segment.known_parts(meta.parts, meta.size)
            segment.min_timestamp = meta.beginTimestamp
            segment.max_timestamp = meta.endTimestamp
            found.append(segment)
        self.segments = tuple(sorted(found))

    def check_last_size(self) -> tuple[int, int] | None:
        """Make the last segment's commit position the tier's real size (the metadata can lag
        the tier after a crash). Returns (recorded, real) when they differed; raises
        TierIOError when the tier cannot say."""
        with self.lock:
            if not self.segments:
                return None
            last = self.segments[-1]
            real = last.get_size()
            recorded = last.commit_position
            if real == recorded:
                return None
            last.init_position(real)
            self.flush_segment_meta(last)
            log.warning("tier file %s: the metadata said %d bytes, the tier holds %d: using "
                        "the tier's size", last.path, recorded, real)
            return recorded, real

    def flush_segment_meta(self, segment: FileSegment, *, sealed: bool = False,
                           defer: bool = False) -> None:
        meta = self.metadata.get_segment(self.file_path, self.file_type, segment.base_offset)
        if meta is None:
            meta = FileSegmentMetadata(self.file_path, int(self.file_type), segment.base_offset)
        meta.size = segment.commit_position
        meta.parts = segment.part_positions()
        meta.beginTimestamp = segment.min_timestamp
        meta.endTimestamp = segment.max_timestamp
        if sealed:
            meta.status = STATUS_SEALED
            meta.sealTimestamp = int(time.time() * 1000)
        self.metadata.update_segment(meta, defer=defer)

    # -- offsets -------------------------------------------------------------------------------

    @property
    def min_offset(self) -> int:
        segments = self.segments
        return segments[0].base_offset if segments else 0

    @property
    def commit_offset(self) -> int:
        segments = self.segments
        return segments[-1].commit_offset if segments else 0

    @property
    def append_offset(self) -> int:
        segments = self.segments
        return segments[-1].append_offset if segments else 0

    @property
    def min_timestamp(self) -> int:
        segments = self.segments
        return segments[0].min_timestamp if segments else NO_TIMESTAMP

    @property
    def max_timestamp(self) -> int:
        segments = self.segments
        return segments[-1].max_timestamp if segments else NO_TIMESTAMP

    def committed_bytes(self) -> int:
        return sum(s.commit_position for s in self.segments)

    # -- writing -------------------------------------------------------------------------------

    def init_offset(self, offset: int, *, known_new: bool = False,
                    persist: bool = True) -> None:
        """Start the file at ``offset`` (no-op when it has segments); ``known_new``: the caller
        checked that the tier holds nothing of this queue."""
        with self.lock:
            if not self.segments:
                self.roll(offset, known_new=known_new, persist=persist)

    def roll(self, offset: int, *, known_new: bool = False, persist: bool = True
             ) -> FileSegment:
        """Start a new last segment at ``offset``; recorded (and persisted, unless the caller
        persists before anything is uploaded) before any byte goes to it, so a crash never
        leaves tier data the metadata does not know of. Its size is asked of the tier (a file
        a lost metadata file forgot), unless ``known_new`` or the factory knows the tier has
        no file there (``segment_absent``: one listing per directory per process)."""
        with self.lock:
            if self.segments and self.segments[-1].needs_commit():
                raise TierIOError(f"tier file {self.segments[-1].path}: cannot roll over "
                                  f"uncommitted data")
            if self.segments:
                self.flush_segment_meta(self.segments[-1], sealed=True)
            segment = self.factory.create_segment(self.file_type, self.file_path, offset)
            if known_new or self.factory.segment_absent(self.file_type, self.file_path, offset):
                segment.mark_new()
                existing = 0
            else:
                existing = segment.get_size()
            if existing:
                log.warning("tier file %s already holds %d bytes the metadata did not know of: "
                            "kept", segment.path, existing)
            segment.init_position(existing)
            self.flush_segment_meta(segment)
            if persist:
                self.metadata.persist()
            self.segments = (*self.segments, segment)
            return segment

    def append(self, data: bytes, timestamp: int) -> AppendResult:
        """Buffer ``data`` in the last segment; a full segment is committed and the data goes
        to a new one."""
        with self.lock:
            if not self.segments:
                raise TierIOError(f"tier file {self.file_path}/{self.file_type.name} has no "
                                  "segment: init_offset first")
            segment = self.segments[-1]
            result = segment.append(data, timestamp)
            if result is not AppendResult.FILE_FULL:
                return result
            if not segment.commit():
                log.warning("tier file %s is full and its last upload failed: not rolling",
                            segment.path)
                return AppendResult.UNKNOWN_ERROR
            self.flush_segment_meta(segment)
            return self.roll(segment.append_offset).append(data, timestamp)

    def commit(self, *, defer_meta: bool = False) -> bool:
        """Upload what the last segment buffered; True when all of it is in the tier.
        ``defer_meta``: its new size needs no metadata write of its own (``update_segment``'s
        ``defer``)."""
        segments = self.segments
        if not segments:
            return True
        last = segments[-1]
        if not last.needs_commit():
            return True
        if not last.commit():
            return False
        self.flush_segment_meta(last, defer=defer_meta)
        return True

    def truncate_last(self, position: int) -> None:
        """Cut the last segment back to ``position`` (a torn tail after a crash)."""
        with self.lock:
            last = self.segments[-1]
            last.truncate(position)
            last.init_position(position)
            self.flush_segment_meta(last)

    # -- reading -------------------------------------------------------------------------------

    def segment_at(self, offset: int) -> FileSegment | None:
        segments = self.segments
        index = bisect.bisect_right([s.base_offset for s in segments], offset) - 1
        if index < 0:
            return None
        segment = segments[index]
        return segment if offset < segment.commit_offset else None

    def read(self, offset: int, length: int) -> bytes:
        """Committed bytes from ``offset``: across contiguous segments, stopping early at the
        end of what is committed or at a gap between segments."""
        segments = self.segments
        bases = [s.base_offset for s in segments]
        index = bisect.bisect_right(bases, offset) - 1
        if index < 0 or offset >= segments[index].commit_offset:
            raise TierIOError(f"tier file {self.file_path}/{self.file_type.name}: offset "
                              f"{offset} is not in the tier")
        pieces = []
        at, end = offset, offset + length
        while at < end and index < len(segments):
            segment = segments[index]
            if at < segment.base_offset or at >= segment.commit_offset:
                break
            take = min(end, segment.commit_offset) - at
            pieces.append(segment.read(at - segment.base_offset, take))
            at += take
            index += 1
        return b"".join(pieces)

    # -- expiry --------------------------------------------------------------------------------

    def destroy_expired(self, expire_timestamp: int) -> list[FileSegment]:
        """Delete head segments whose newest message is older than ``expire_timestamp``. The
        last (written) segment is always kept."""
        deleted = []
        with self.lock:
            while len(self.segments) > 1:
                first = self.segments[0]
                if first.max_timestamp != NO_TIMESTAMP and first.max_timestamp >= expire_timestamp:
                    break
                self.segments = self.segments[1:]  # readers stop finding it first
                first.destroy_file()
                self.metadata.delete_segment(self.file_path, self.file_type, first.base_offset)
                deleted.append(first)
        return deleted

    def destroy(self) -> None:
        with self.lock:
            for segment in self.segments:
                segment.destroy_file()
                self.metadata.delete_segment(self.file_path, self.file_type,
                                             segment.base_offset)
            self.segments = ()

    def close(self) -> None:
        for segment in self.segments:
            segment.close()


class FlatCommitLogFile(FlatAppendFile):
    """A queue's records in the tier."""

    def __init__(self, factory: FileSegmentFactory, metadata: MetadataStore,
                 file_path: str) -> None:
        super().__init__(factory, metadata, FileSegmentType.COMMIT_LOG, file_path)

    def try_rolling(self, interval_ms: int, minimum_size: int, now_ms: int) -> bool:
        """Roll when the last file's oldest message is older than ``interval_ms`` and it holds
        at least ``minimum_size`` bytes (RocketMQ's ``tryRollingFile``)."""
        with self.lock:
            if not self.segments:
                return False
            last = self.segments[-1]
            if (last.min_timestamp == NO_TIMESTAMP or last.min_timestamp + interval_ms >= now_ms
                    or last.append_position < max(1, minimum_size) or last.needs_commit()):
                return False
            self.roll(last.append_offset)
            return True


class FlatConsumeQueueFile(FlatAppendFile):
    """A queue's ConsumeQueue units in the tier; byte offset = queue offset x 20."""

    def __init__(self, factory: FileSegmentFactory, metadata: MetadataStore,
                 file_path: str) -> None:
        super().__init__(factory, metadata, FileSegmentType.CONSUME_QUEUE, file_path)

    @property
    def min_queue_offset(self) -> int:
        return self.min_offset // UNIT_SIZE

    @property
    def commit_queue_offset(self) -> int:
        return self.commit_offset // UNIT_SIZE

    @property
    def append_queue_offset(self) -> int:
        return self.append_offset // UNIT_SIZE

    def append_unit(self, flat_offset: int, size: int, tags_code: int,
                    timestamp: int) -> AppendResult:
        return self.append(UNIT.pack(flat_offset, size, tags_code), timestamp)

    def resume_at(self, queue_offset: int) -> None:
        """Continue at ``queue_offset``, past a gap: a new segment starts there."""
        with self.lock:
            if not self.segments:
                self.roll(queue_offset * UNIT_SIZE)
            elif queue_offset * UNIT_SIZE != self.append_offset:
                if queue_offset * UNIT_SIZE < self.append_offset:
                    raise ValueError(f"tier ConsumeQueue {self.file_path}: cannot resume at "
                                     f"{queue_offset}, before {self.append_queue_offset}")
                self.roll(queue_offset * UNIT_SIZE)

    def segment_end_queue_offset(self, queue_offset: int) -> int:
        """Where the committed run of units holding ``queue_offset`` ends (a gap or the end)."""
        segment = self.segment_at(queue_offset * UNIT_SIZE)
        return 0 if segment is None else segment.commit_offset // UNIT_SIZE

    def next_held(self, queue_offset: int) -> int | None:
        """The first committed queue offset at or after ``queue_offset`` (skips a gap)."""
        for segment in self.segments:
            if segment.commit_offset // UNIT_SIZE > queue_offset and segment.commit_position:
                return max(queue_offset, segment.base_offset // UNIT_SIZE)
        return None

    def read_unit_table(self, queue_offset: int, count: int) -> np.ndarray:
        """``read_units`` as a numpy record array (fields offset, size, code)."""
        data = self.read(queue_offset * UNIT_SIZE, count * UNIT_SIZE)
        return np.frombuffer(data, dtype=UNIT_DTYPE, count=len(data) // UNIT_SIZE)

    def read_units(self, queue_offset: int, count: int) -> list[tuple[int, int, int]]:
        """Up to ``count`` committed units from ``queue_offset`` (fewer at a gap or the end)."""
        data = self.read(queue_offset * UNIT_SIZE, count * UNIT_SIZE)
        return [UNIT.unpack_from(data, i) for i in range(0, len(data) - UNIT_SIZE + 1, UNIT_SIZE)]
