"""CommitLog recovery, in two parts (as Kafka splits LogSegment.recover and LogLoader):

* ``scan_segment`` validates the records of one segment buffer and says where valid data ends
  and why (pure: no I/O, no state);
* ``recover_commitlog`` picks where to start (the last three segments after a clean shutdown;
  after a crash, the newest segment that began before the checkpoint's flush time), scans
  forward across segments, and cuts the log at the first torn or corrupt record, deleting the
  segments after it and zeroing the cut tail so that stale records can never come back.

Before cutting, it counts the valid records the cut throws away (``count_records_after``): none
after a torn tail, but a corrupt record or a lost write in the middle of the log has valid
records behind it, and the report says so instead of passing the cut off as a clean end. Where
RocketMQ would then delete them, a read-write open first sets every byte after the cut aside
under ``<store>/damaged/`` (``salvage.py``) and logs it at ERROR.
"""

from __future__ import annotations

import logging
import mmap
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from stratamq import record as codec
from stratamq.message import RecordCorrupt
from stratamq.store.checkpoint import StoreCheckpoint
from stratamq.store.mapped_file import MappedFile
from stratamq.store.mapped_file_queue import MappedFileQueue
from stratamq.store.salvage import set_aside_after_cut

log = logging.getLogger(__name__)


@dataclass
class SegmentScan:
    valid_end: int  # position (within the segment) where valid records end
    records: int  # valid records before it
    ended_with_blank: bool  # the segment is complete: a blank record fills its tail
    problem: RecordCorrupt | None  # why scanning stopped, if not at a blank or clean zeros


def scan_segment(buf: memoryview, file_from_offset: int, size: int,
                 check_crc: bool) -> SegmentScan:
    scan = codec.scan_records(buf, 0, size, file_from_offset, check_crc)
    problem = scan.problem
    if problem is None and not scan.blank and scan.end + 8 > size:
        # Ran to the end of the file without meeting a blank record or unwritten zeros.
        problem = RecordCorrupt(file_from_offset + scan.end, "segment ends without a blank record")
    return SegmentScan(scan.end, scan.records, scan.blank, problem)


@dataclass
class RecoveryReport:
    abnormal: bool
    start_offset: int = 0  # where scanning (and replay to the ConsumeQueues) began
    end_offset: int = 0  # the CommitLog's end after recovery
    records_scanned: int = 0
    bytes_scanned: int = 0
    problem: str | None = None  # what stopped the scan early, with its offset
    deleted_segments: list[str] = field(default_factory=list)
    dropped_units: int = 0  # ConsumeQueue units removed because their records are gone
    # Valid records found after the cut (confirmed by their stored physical offsets): what the
    # cut throws away. 0 for a torn tail; more means damage in the middle of the log.
    records_after_cut: int = 0
    first_record_after_cut: int | None = None
    # Where the bytes after the cut were kept (``<store>/damaged/...``) when valid records
    # followed it; None when nothing valid was cut (or on a read-only open).
    set_aside: str | None = None
    # A read-only open changes nothing on disk: deleted_segments and dropped_units then say
    # what a read-write open would remove.
    read_only: bool = False

    @property
    def lost_data(self) -> bool:
        """Did the cut throw away valid records or dispatched messages (not just a torn tail)?"""
        return self.records_after_cut > 0 or self.dropped_units > 0

    def as_dict(self) -> dict:
        extra: dict = {}
        if self.read_only and (self.deleted_segments or self.dropped_units
                               or self.records_after_cut):
            extra["note"] = ("read-only open: nothing on disk was changed; deleted_segments and "
                             "dropped_units are what a read-write open would remove")
        return {
            "abnormal": self.abnormal,
            "start_offset": self.start_offset,
            "end_offset": self.end_offset,
            "records_scanned": self.records_scanned,
            "bytes_scanned": self.bytes_scanned,
            "problem": self.problem,
            "deleted_segments": self.deleted_segments,
            "dropped_units": self.dropped_units,
            "records_after_cut": self.records_after_cut,
            "first_record_after_cut": self.first_record_after_cut,
            "set_aside": self.set_aside,
            "read_only": self.read_only,
            **extra,
        }


def _first_record_time(mf: MappedFile) -> int | None:
    """Store time of a segment's first record, or None if it does not start with one."""
    try:
        if codec.check_record(mf.buffer, 0, mf.file_size, mf.file_from_offset, False) == 0:
            return None
    except RecordCorrupt:
        return None
    return codec.record_store_timestamp(mf.buffer, 0)


def choose_start(files: list[MappedFile], abnormal: bool, checkpoint: StoreCheckpoint) -> int:
    """Index of the segment recovery starts scanning at."""
    if not files:
        return 0
    if not abnormal:
        return max(0, len(files) - 3)
    safe_before = checkpoint.min_timestamp()
    for index in range(len(files) - 1, -1, -1):
        first = _first_record_time(files[index])
        # Strictly older: every record before this segment precedes the checkpoint's record.
        if first is not None and first < safe_before:
            return index
    return 0


def count_records_after(files: list[MappedFile], cut: int,
                        check_crc: bool) -> tuple[int, int | None]:
    """Valid records after CommitLog offset ``cut`` (the rest of its segment and every later
    one) and the offset of the first: what cutting the log at ``cut`` throws away.

    Records are found by resyncing on the magic code and confirmed by their stored physical
    offset (``message.resync``), so stale copies and body bytes that look like a header do not
    count. Only a file's data extents are searched: a torn tail is followed by unwritten space,
    which costs nothing to skip."""
    count = 0
    first: int | None = None
    for mf in files:
        if mf.file_end_offset <= cut:
            continue
        base, size = mf.file_from_offset, mf.file_size
        # The record at the cut failed a check (or is zeros): look from the next byte.
        pos = max(0, cut + 1 - base)
        raw = cast(mmap.mmap, mf.buffer.obj)  # the mmap: find() searches without copying
        done = False
        # Holes and unwritten extents read as zeros: no record can start there. (A record
        # straddling a hole, which only a zero-detecting copy could make, is not counted.)
        for start, stop in mf._data_extents(pos):
            pos = max(pos, start)
            while not done and pos < stop:
                hit = codec.resync(raw, pos, stop, base)
                if hit is None:
                    break
                scan = codec.scan_records(mf.buffer, hit, size, base, check_crc)
                if scan.records:
                    count += scan.records
                    if first is None:
                        first = base + hit
                done = scan.blank  # the segment's filler: the rest of it is not records
                pos = max(scan.end, hit) + 1
            if done:
                break
    return count, first


def recover_commitlog(
    queue: MappedFileQueue, abnormal: bool, checkpoint: StoreCheckpoint, check_crc: bool,
    damaged_root: Path | None = None,
) -> RecoveryReport:
    """Scan and cut the CommitLog; with ``damaged_root`` (a read-write open), valid records
    behind the cut are set aside there first (an ``OSError`` from that leaves the log uncut)."""
    report = RecoveryReport(abnormal=abnormal, read_only=queue.read_only)
    files = queue.files
    if not files:
        return report
    index = choose_start(files, abnormal, checkpoint)
    report.start_offset = files[index].file_from_offset
    end = report.start_offset
    while index < len(files):
        mf = files[index]
        scan = scan_segment(mf.buffer, mf.file_from_offset, mf.file_size, check_crc)
        report.records_scanned += scan.records
        report.bytes_scanned += scan.valid_end
        end = mf.file_from_offset + scan.valid_end
        if scan.ended_with_blank:
            end = mf.file_end_offset  # the blank belongs to the log; appends roll over
            index += 1
            continue
        if scan.problem is not None:
            report.problem = str(scan.problem)
            log.warning("CommitLog recovery stops at %d: %s", end, scan.problem.reason)
        break
    report.end_offset = end
    if index < len(files):  # the scan stopped inside files[index]: the log is cut at ``end``
        lost, first = count_records_after(files[index:], end, check_crc)
        report.records_after_cut, report.first_record_after_cut = lost, first
        if lost:
            if report.problem is None:  # zeros in the middle of the log: a lost write
                report.problem = str(RecordCorrupt(
                    end, f"zero bytes where a record should be, but valid records follow "
                         f"from {first}"))
            if damaged_root is not None and not queue.read_only:
                kept = set_aside_after_cut(files[index:], end, damaged_root)
                report.set_aside = str(kept) if kept is not None else None
                log.error("CommitLog recovery cuts the log at %d (%s): %d valid records after "
                          "it, the first at %s, are no longer in the log; every byte after the "
                          "cut is kept in %s (see docs/formats/damaged-commitlog.md)",
                          end, report.problem, lost, first, kept)
            else:
                log.warning("CommitLog recovery cuts at %d: %d valid records after it are lost",
                            end, lost)
    old_names = {mf.path.name for mf in files}
    queue.truncate_dirty_files(end)
    report.deleted_segments = sorted(old_names - {mf.path.name for mf in queue.files})
    return report


def confirm_offset_at_open(saved: int, min_offset: int, log_end: int) -> int:
    """Where a controller-mode store holds dispatch at open: the checkpoint's
    ``confirm_phy_offset``, moved into the log as RocketMQ's recovery moves it (below the
    log's first byte: there; past the recovered end: the end). An old checkpoint, which never
    recorded it, reads 0: only what was dispatched before is readable until the role is known.
    """
    held = min(max(saved, min_offset), log_end)
    if held != saved:
        log.info("confirm offset %d from the checkpoint lies outside the CommitLog [%d, %d]: "
                 "holding dispatch at %d", saved, min_offset, log_end, held)
    if held < log_end:
        log.info("controller mode: dispatch held at the confirm offset %d until this broker's "
                 "role is known; the %d bytes after it (a tail its group may never have "
                 "confirmed) are read by no consumer meanwhile", held, log_end - held)
    return held
