"""The store's side of replication: what a slave does to its log (``ReplicaLog``).

A slave's CommitLog is a byte-for-byte copy of its master's: records arrive as raw bytes with
the physical offsets, queue offsets and store times the master stamped, and land at the same
offsets. Two operations, both only on a store whose ``brokerRole`` is SLAVE:

* ``append(offset, data)``: copy the whole records at the head of ``data`` to the end of the log,
  which must be ``offset``. Every record is checked as recovery checks it (magic code, sizes,
  the physical offset stored in it equals where it lands); a blank filler must end its segment
  exactly. A record cut by the end of ``data`` is not an error: the caller hands it again with
  its rest (the master streams bytes, not records). ``append_pieces(offset, pieces)`` does
  the same for bytes in pieces (the frames of one read): written past the log's end first,
  checked where they landed, then made visible; no gathering copy. Dispatch into the slave's
  ConsumeQueues and index is the reput thread's, as for any append; flushing is the flush
  service's.
* ``truncate(offset)``: cut the log back to ``offset`` (a slave ahead of its master, or one whose
  bytes after ``offset`` differ from the master's): later segments are deleted and the cut tail
  zeroed (recovery's ``truncate_dirty_files``), ConsumeQueue units of the cut records dropped,
  dispatch rewound, and a report says what was cut.

And one lever for a slave catching up: ``hold_dispatch()`` / ``release_dispatch()``. The
slave's dispatch (some microseconds of Python per record) and the replication thread share one
GIL; run together, each gets about half of it and the copy crawls. While held, the reput thread
waits before its next record (a no-op dispatcher at the end of its list, installed on the first
hold), so the copy runs alone; released, dispatch catches up in one long round. Reads of what
was copied meanwhile wait for that round (a slave's reads lag its copy by the hold).

The record checks are the pure function ``whole_records`` (no I/O), tested on its own.
Thread-safety: one replication thread calls ``append``, ``truncate`` and the hold; readers on
any thread keep working (a reader that held a view of cut bytes sees zeros or the new bytes, as
after a recovery cut).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from stratamq import record as codec
from stratamq.record import (
    BLANK_MAGIC_CODE,
    END_FILE_MIN_BLANK_LENGTH,
    MESSAGE_MAGIC_CODE_V1,
    MESSAGE_MAGIC_CODE_V2,
    MIN_RECORD_SIZE,
)
from stratamq.store.commitlog import CommitLog
from stratamq.store.consume_queue_store import ConsumeQueueStore
from stratamq.store.dispatch import Dispatcher, ReputService
from stratamq.store.mapped_file import MappedFile
from stratamq.store.recovery import count_records_after

__all__ = ["ReplicaDataError", "ReplicaLog", "TruncateReport", "whole_records"]

log = logging.getLogger(__name__)


class ReplicaDataError(ValueError):
    """Replicated bytes that cannot go into the log: not at its end, or not records stamped
    for where they would land. Nothing of them was written."""


def whole_records(data: memoryview, offset: int, segment_size: int) -> int:
    """How many bytes at the head of ``data`` are whole records that may land at ``offset``.

    Stops at the end of the segment holding ``offset`` (a frame never crosses one) and before a
    record that ``data`` holds only the head of. Raises ReplicaDataError for anything that is
    not a record there: a bad magic code or size, a physical offset that is not its position,
    zeros, a record reaching into the last 8 bytes of a segment, a blank that does not end it.

    Small chunks are checked record by record as recovery checks them (``scan_records``); a
    large one (a slave catching up) in bulk with numpy, the same checks but the CRC (runs of
    records of one size through strided views, anything else by the walk of the size chain),
    so the copy keeps up with the network. Dispatch does not check records again: what is
    published here is what the slave's ConsumeQueues and readers trust. The records were
    checked when the master wrote them; what replication must catch is bytes that landed
    anywhere but where they belong, or were torn or damaged on the way.
    """
    room = segment_size - offset % segment_size  # bytes left in this segment
    limit = min(len(data), room)
    if limit >= BULK_CHECK_BYTES:
        end, blank, problem = _bulk_scan(data, offset, limit)
    else:
        scan = codec.scan_records(data, 0, limit, offset, False)
        end, blank, problem = scan.end, scan.blank, scan.problem
    if end > room - END_FILE_MIN_BLANK_LENGTH:
        raise ReplicaDataError(
            f"a record ends at {offset + end}, inside the last {END_FILE_MIN_BLANK_LENGTH} bytes "
            f"of the segment ending at {offset + room}")
    if blank:
        size = codec.read_size_and_magic(data, end)[0]
        if end + size != room:
            raise ReplicaDataError(
                f"blank filler at {offset + end} of {size} bytes does not end its segment "
                f"(at {offset + room})")
        return end + size
    if end >= limit:
        return end
    if limit - end < 8:
        return end  # the next record's header continues in the next frame
    size, magic = codec.read_size_and_magic(data, end)
    if magic in (MESSAGE_MAGIC_CODE_V1, MESSAGE_MAGIC_CODE_V2) and size >= MIN_RECORD_SIZE \
            and end + size > limit and end + size <= room - END_FILE_MIN_BLANK_LENGTH:
        return end  # a record whose tail is in the next frame
    if magic == BLANK_MAGIC_CODE and end + size == room and len(data) < room:
        return end  # a blank filler whose tail is in the next frame
    if problem is None:  # the bulk walk says only where; the scan says why
        problem = codec.scan_records(data, end, limit, offset, False).problem
    reason = str(problem) if problem is not None else (
        f"zero bytes where a record should start ({offset + end})")
    raise ReplicaDataError(f"not a record at CommitLog offset {offset + end}: {reason}")


BULK_CHECK_BYTES = 256 * 1024  # from this size on, a chunk is checked in bulk


def _bulk_scan(data: memoryview, offset: int, limit: int
               ) -> tuple[int, bool, codec.RecordCorrupt | None]:
    """``scan_records``' answer without the CRC (where whole records end, whether a blank
    follows, what is wrong) for a large chunk, in bulk: runs of records of one size through
    strided views (``stamped_runs``), anything else by the walk and ``records_pass`` on its
    positions; falls back to the record-by-record scan to word a problem."""
    start = codec.stamped_runs(data, 0, limit, offset)  # most of a log: runs of one size
    if start == limit:
        return limit, False, None
    walk = codec.walk_records(data, start, limit, limit)  # the rest, if anything
    if len(walk.positions) and not codec.records_pass(data, walk.positions, offset).all():
        scan = codec.scan_records(data, 0, limit, offset, False)  # says which and why
        return scan.end, scan.blank, scan.problem
    if walk.reason == "blank":
        scan = codec.scan_records(data, walk.stop, limit, offset, False)  # checks the blank
        return scan.end, scan.blank, scan.problem
    return walk.stop, False, None


@dataclass
class TruncateReport:
    """What ``ReplicaLog.truncate`` cut: shown in logs and ``ha status``."""

    offset: int  # the log's end after the cut
    previous_end: int
    records_cut: int  # valid records that were in the cut bytes
    dropped_units: int  # ConsumeQueue units of those records
    deleted_segments: list[str] = field(default_factory=list)
    reason: str = ""

    @property
    def bytes_cut(self) -> int:
        return self.previous_end - self.offset

    def as_dict(self) -> dict:
        return {"offset": self.offset, "previous_end": self.previous_end,
                "bytes_cut": self.bytes_cut, "records_cut": self.records_cut,
                "dropped_units": self.dropped_units,
                "deleted_segments": self.deleted_segments, "reason": self.reason}


class _DispatchHold:
    """The last dispatcher of a slave's reput thread: makes it wait while the replication
    thread holds dispatch back. Owned by a ``ReplicaLog``; ``dispatch`` on the reput thread."""

    def __init__(self) -> None:
        self.held = False  # read per record without a lock: the Event is the real gate
        self._free = threading.Event()
        self._free.set()

    def dispatch(self, info: object) -> None:
        if self.held:
            self._free.wait()

    def replay_floor(self, topic: str, queue_id: int) -> int:
        return 2**63 - 1  # it holds nothing: never the reason a replay looks at a record

    def hold(self) -> None:
        self._free.clear()
        self.held = True

    def release(self) -> None:
        self.held = False
        self._free.set()


class ReplicaLog:
    """Appends replicated bytes to a slave's log and cuts it back; see the module docstring.

    Handed the parts it works on (the CommitLog, the ConsumeQueue stores, the reput service and
    the plugged-in dispatchers), never the store. ``on_truncate`` hears of every cut (the HA
    side records it as a new epoch)."""

    def __init__(self, commitlog: CommitLog, cq_stores: Sequence[ConsumeQueueStore],
                 reput: ReputService, plugged: Sequence[Dispatcher] = (),
                 check_crc: bool = False) -> None:
        self.commitlog = commitlog
        self.cq_stores = cq_stores
        self.reput = reput
        self.plugged = plugged
        self.check_crc = check_crc
        self.on_truncate: list[Callable[[TruncateReport], None]] = []
        self._hold: _DispatchHold | None = None
        self._raw_end = 0  # how far append_pieces wrote past the log's end (see discard_...)

    @property
    def segment_size(self) -> int:
        return self.commitlog.files.mapped_file_size

    def end(self) -> int:
        """Where the next replicated byte goes (the log's max offset)."""
        return self.commitlog.max_offset

    def is_empty(self) -> bool:
        return self.commitlog.files.last() is None

    def _check_at_end(self, offset: int) -> None:
        files = self.commitlog.files
        if files.last() is None:
            if offset % files.mapped_file_size:
                raise ReplicaDataError(
                    f"an empty log starts at a segment boundary, not at {offset}")
        elif offset != files.max_offset():
            raise ReplicaDataError(f"replicated bytes for offset {offset}, but the log ends "
                                   f"at {files.max_offset()}")

    def append(self, offset: int, data: bytes | bytearray | memoryview) -> int:
        """Append the whole records at the head of ``data`` at ``offset``; return their size
        (0 when ``data`` holds only the head of a record). See ``whole_records``."""
        view = memoryview(data)
        files = self.commitlog.files
        with self.commitlog.append_lock:  # the slave's only writer, but readers of max_offset race
            self._check_at_end(offset)
            n = whole_records(view, offset, files.mapped_file_size)
            if n == 0:
                return 0
            mf = files.last_mapped_file(start_offset=offset, create=True)
            if mf is None or mf.file_from_offset + mf.wrote_position != offset:
                raise ReplicaDataError(f"no segment to append at {offset}")
            mf.write_at(offset - mf.file_from_offset, view[:n])
            size, magic = codec.read_size_and_magic(view, 0)
            if magic != BLANK_MAGIC_CODE:
                # The first record's time: older than the rest, so the checkpoint built on it
                # only ever makes recovery start earlier (safe).
                mf.store_timestamp = codec.record_store_timestamp(view, 0)
        if self.commitlog.on_append is not None:
            self.commitlog.on_append()
        return n

    def append_pieces(self, offset: int, pieces: Sequence[bytes | memoryview]) -> int:
        """``append`` of the bytes of ``pieces`` one after another (the frames of one read),
        without gathering them first: they are written into the segment past its end, where no
        reader looks, then checked where they landed (``whole_records``), and only the whole
        records become part of the log. What lies past the new end (the head of a record
        whose rest comes later) is overwritten by the next append, cut by ``truncate``, or
        cut by recovery as a torn tail. Bytes that are not records are zeroed again before
        ReplicaDataError is raised. Returns the size of the whole records (at most the rest
        of the segment holding ``offset``; the caller hands the remainder again)."""
        files = self.commitlog.files
        with self.commitlog.append_lock:
            self._check_at_end(offset)
            mf = files.last()
            in_place = mf is not None and not mf.is_full()
            n = self._write_and_check(mf, offset, pieces) if mf is not None and in_place else 0
        if not in_place:
            # A new segment (once per segment): gathered; ``append`` creates it once checked.
            return self.append(offset, b"".join(pieces))
        if n and self.commitlog.on_append is not None:
            self.commitlog.on_append()
        return n

    def _write_and_check(self, mf: MappedFile, offset: int,
                         pieces: Sequence[bytes | memoryview]) -> int:
        rel = offset - mf.file_from_offset
        written = mf.write_pieces(rel, pieces, mf.file_size - rel)
        self._raw_end = max(self._raw_end, offset + written)
        view = mf.buffer[rel : rel + written]
        try:
            n = whole_records(view, offset, self.commitlog.files.mapped_file_size)
        except ReplicaDataError:
            mf.write_pieces(rel, (bytes(written),), written)  # back to zeros
            raise
        if n:
            mf.publish(rel + n)
            if codec.read_size_and_magic(view, 0)[1] != BLANK_MAGIC_CODE:
                mf.store_timestamp = codec.record_store_timestamp(view, 0)  # as in append
        return n

    def discard_unpublished(self) -> None:
        """Zero what ``append_pieces`` left past the log's end (the head of a record whose rest
        did not come): the next stream starts at the end again, and may bring other bytes there
        (a master that lost its tail), shorter than what lies there now. Called when a stream
        (re)starts; within one stream the next append overwrites those bytes with the same."""
        files = self.commitlog.files
        with self.commitlog.append_lock:
            raw, self._raw_end = self._raw_end, 0
            end = files.max_offset()
            mf = files.last()
            if raw <= end or mf is None or not mf.file_from_offset <= end < mf.file_end_offset:
                return
            size = min(raw, mf.file_end_offset) - end
            mf.write_pieces(end - mf.file_from_offset, (bytes(size),), size)

    # -- holding dispatch back while catching up -------------------------------------------------

    def hold_dispatch(self) -> None:
        """Let the reput thread dispatch no further record until ``release_dispatch``."""
        if self._hold is None:
            self._hold = _DispatchHold()
            # Appended at the end of the running thread's list: a record being dispatched
            # meets it at most once more, and no other dispatcher moves.
            self.reput.dispatchers.append(self._hold)
        self._hold.hold()

    def release_dispatch(self) -> None:
        if self._hold is not None:
            self._hold.release()

    @property
    def dispatch_held(self) -> bool:
        return self._hold is not None and self._hold.held

    def dispatch_lag(self) -> int:
        """Bytes of the log not dispatched yet."""
        return self.reput.behind_bytes()

    def truncate(self, offset: int, reason: str = "") -> TruncateReport:
        """Cut the log back to ``offset`` (a record boundary the caller knows: the master's
        end, or where the master's bytes start to differ) and everything built from what was
        cut; return what was cut."""
        self.release_dispatch()  # the cut waits for the dispatch round to end
        files = self.commitlog.files
        with self.reput.paused(), self.commitlog.append_lock:
            end = files.max_offset()
            if offset >= end:
                return TruncateReport(end, end, 0, 0, reason=reason)
            if offset < files.min_offset():
                raise ReplicaDataError(f"cannot cut the log back to {offset}: it starts at "
                                       f"{files.min_offset()}")
            records, _first = count_records_after(files.files, offset, self.check_crc)
            # count_records_after looks from the byte after the cut: the record at the cut
            # itself is valid too (it was whole), so count it.
            at_cut = self._record_at(offset)
            records += at_cut
            names = {mf.path.name for mf in files.files}
            files.truncate_dirty_files(offset)
            deleted = sorted(names - {mf.path.name for mf in files.files})
            dropped = [cq.truncate_dirty(offset) for cq in self.cq_stores]
            for dispatcher in self.plugged:
                cut = getattr(dispatcher, "truncate_from", None)
                if cut is not None:
                    cut(offset)
            self.reput.rewind(offset)
            self.commitlog.recent_dispatch.clear()
            self.commitlog.queue_offsets = self.cq_stores[0].queue_offset_table()
        report = TruncateReport(offset, end, records, dropped[0] if dropped else 0,
                                deleted, reason)
        log.warning("replica log cut back from %d to %d (%d bytes, %d records, %d ConsumeQueue "
                    "units, segments deleted: %s): %s", end, offset, report.bytes_cut, records,
                    report.dropped_units, deleted or "none", reason or "asked to")
        for listener in self.on_truncate:
            listener(report)
        return report

    def _record_at(self, offset: int) -> int:
        mf = self.commitlog.files.find_by_offset(offset)
        if mf is None or not mf.hold():
            return 0
        try:
            rel = offset - mf.file_from_offset
            codec.check_record(mf.buffer, rel, mf.read_position, offset, False)
            return 1 if codec.read_size_and_magic(mf.buffer, rel)[1] != BLANK_MAGIC_CODE else 0
        except codec.RecordCorrupt:
            return 0
        finally:
            mf.release()
