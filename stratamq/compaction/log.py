"""``CompactionLog``: one compaction topic's queue, split out of the CommitLog.

A list of segments (``segment.py``): every segment but the last is sealed; the last is the one
being written. Appends come from the dispatch thread; a compaction round reads the sealed
segments without a lock and swaps its output in (``swap_in``) under the append lock; readers
use a snapshot of the list (a tuple, replaced, never changed in place) and hold each segment
they view until their result is released.

Reads binary-search the batch CQ by queue offset. Queue offsets never change: the ones a round
removed are holes, and a read from a hole starts at the next kept message. The queue claims
every offset below its next offset, so an offset compaction removed is never served from the
uncompacted local ConsumeQueue behind it.

Thread-safety: ``append``/``seal_active``/``swap_in`` under ``_lock``; everything else from any
thread.
"""

from __future__ import annotations

import bisect
import logging
import os
import shutil
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from stratamq import record as codec
from stratamq.compaction import swap
from stratamq.compaction.bcq_format import UNIT, UNIT_SIZE
from stratamq.compaction.layout import QueuePaths
from stratamq.compaction.segment import Segment, SegmentRecovery
from stratamq.compaction.state_format import QueueState, SwapManifest
from stratamq.store.read_chain import QueueOffsets, ReadRequest
from stratamq.store.results import GetMessageResult, GetMessageStatus, SelectedRecord

if TYPE_CHECKING:
    from stratamq.compaction.tiering import TierSegment

__all__ = ["CompactionLog", "CompactionLogError", "RecordTooLarge"]

log = logging.getLogger(__name__)


class CompactionLogError(RuntimeError):
    """A compaction queue's files do not fit together (the message names them)."""


class RecordTooLarge(CompactionLogError):
    """A record larger than a CompactionLog file can hold."""


class CompactionLog:
    """One compaction queue (see the module docstring). Owns its segments."""

    def __init__(self, paths: QueuePaths, log_size: int, cq_size: int, *,
                 read_only: bool = False, destroy_interval_ms: int = 120_000) -> None:
        self.paths = paths
        self.topic, self.queue_id = paths.topic, paths.queue_id
        self.log_size, self.cq_size = log_size, cq_size
        self.read_only = read_only
        self.destroy_interval_ms = destroy_interval_ms
        self._segments: tuple[Segment, ...] = ()
        self._tiered: tuple[TierSegment, ...] = ()  # released files the tier serves
        self._lock = threading.Lock()
        self.state = QueueState()
        self.next_offset = 0  # the next queue offset this queue expects
        self.physical_end = 0  # CommitLog end of the newest record appended (replay floor)
        self.recovered: list[SegmentRecovery] = []
        self.compacting = threading.Lock()  # one round at a time per queue

    # -- load and recovery ------------------------------------------------------------------------

    @property
    def segments(self) -> tuple[Segment, ...]:
        return self._segments

    def load(self) -> None:
        """Finish or undo an interrupted swap, then map and recover every segment."""
        paths = self.paths
        if not self.read_only:
            done = swap.recover(paths)
            if done:
                log.info("compaction queue %s:%d: %s", self.topic, self.queue_id, done)
        elif paths.manifest.exists():
            raise CompactionLogError(
                f"{paths.manifest}: a compaction swap is unfinished; open the store "
                "read-write once to finish it")
        self.state = QueueState.read(paths.state)
        logs, cqs = paths.segment_starts()
        logs, cqs = self._pair(logs, cqs)
        if logs:
            self.log_size = os.path.getsize(paths.log_file(logs[0]))
            self.cq_size = os.path.getsize(paths.cq_file(logs[0]))
            if self.cq_size % UNIT_SIZE:
                raise CompactionLogError(
                    f"{paths.cq_file(logs[0])} is {self.cq_size} bytes, not whole {UNIT_SIZE}-"
                    "byte units: it was not written by StrataMQ (Apache RocketMQ's batch "
                    "ConsumeQueue has 46-byte units); move the queue's compactionLog/ and "
                    "compactionCq/ directories away to serve the topic from the CommitLog")
        segments = []
        try:
            for start in logs:
                seg = Segment.open(paths.log_file(start), paths.cq_file(start), self.log_size,
                                   self.cq_size, read_only=self.read_only)
                segments.append(seg)
                report = seg.recover(read_only=self.read_only)
                if report.dropped_units or report.dropped_bytes:
                    log.warning("compaction queue %s:%d file %s: dropped %d units and %d log "
                                "bytes after its last whole record (%s); they are dispatched "
                                "again from the CommitLog", self.topic, self.queue_id,
                                seg.name, report.dropped_units, report.dropped_bytes,
                                report.reason)
                self.recovered.append(report)
        except BaseException:
            for seg in segments:
                seg.close()
            raise
        for seg in segments[:-1]:
            if not seg.sealed and not self.read_only:
                # Only the newest segment is ever written; an older one left open (a crash
                # between two steps of a roll) is sealed where its records end.
                seg.seal()
        self._segments = tuple(segments)
        self.next_offset = self.state.next_offset
        for seg in reversed(segments):
            if seg.units:
                self.next_offset = max(self.next_offset, seg.last_offset + 1)
                unit = seg.unit(seg.units - 1)
                if seg.hold():
                    try:
                        phys = codec.record_positions(seg.record_view(unit.position, unit.size),
                                                      0)[1]
                    finally:
                        seg.release()
                    self.physical_end = phys + unit.size
                break

    def _pair(self, logs: list[int], cqs: list[int]) -> tuple[list[int], list[int]]:
        """Each log file with its batch CQ file. A newest file without its partner (a crash
        while a segment was created) is removed when empty; any other mismatch is an error."""
        only_log, only_cq = sorted(set(logs) - set(cqs)), sorted(set(cqs) - set(logs))
        for start, path in ([(s, self.paths.log_file(s)) for s in only_log]
                            + [(s, self.paths.cq_file(s)) for s in only_cq]):
            newest = start == max(logs + cqs)
            if newest and not self.read_only and _all_zero(path):
                log.warning("compaction queue %s:%d: removed %s, created without its partner "
                            "file and never written", self.topic, self.queue_id, path)
                path.unlink()
                continue
            partner = "batch CQ" if path.parent == self.paths.log_dir else "log"
            raise CompactionLogError(
                f"{path} has no matching {partner} file (each CompactionLog file pairs with a "
                "batch ConsumeQueue file of the same name, and neither can be read alone); "
                "restore the missing file from a backup. The queue was left as it is")
        both = sorted(set(logs) & set(cqs))
        return both, both

    # -- writing (dispatch thread) ----------------------------------------------------------------

    def append(self, record: bytes | memoryview, queue_offset: int, physical_end: int,
               tags_code: int, store_timestamp: int, key_digest: bytes, flags: int) -> bool:
        """Append one record unless the queue has it already (a replay); True if appended."""
        with self._lock:
            if queue_offset < self.next_offset:
                return False
            seg = self._segments[-1] if self._segments else None
            if seg is None or not seg.fits(len(record)):
                seg = self._roll(seg)
                if not seg.fits(len(record)):
                    raise RecordTooLarge(
                        f"a {len(record)}-byte record of {self.topic}:{self.queue_id} does not "
                        f"fit a {self.log_size}-byte CompactionLog file "
                        "(compactionMappedFileSize)")
            seg.append(record, queue_offset, tags_code, store_timestamp, key_digest, flags)
            self.next_offset = queue_offset + 1
            self.physical_end = physical_end
            return True

    def _roll(self, current: Segment | None) -> Segment:
        """Seal ``current`` and start the next segment (under ``_lock``)."""
        if current is not None:
            current.seal()
        if current is not None:
            start = current.start + self.log_size
        elif self._tiered:
            # Past the files the tier serves (a broker that adopted the tier's set, or a cut
            # that left no local file): a local file under one of their names would be
            # replaced by the tier's when a round restores them, with what it holds.
            start = max(t.start for t in self._tiered) + self.log_size
        else:
            start = 0
        for directory in (self.paths.log_dir, self.paths.cq_dir):
            directory.mkdir(parents=True, exist_ok=True)
        seg = Segment.create(self.paths.log_file(start), self.paths.cq_file(start),
                             self.log_size, self.cq_size)
        self._segments = (*self._segments, seg)
        return seg

    def seal_active(self) -> bool:
        """Seal the segment being written (if it holds anything) and start the next one, so a
        round can compact everything written so far. True if it sealed one."""
        with self._lock:
            seg = self._segments[-1] if self._segments else None
            if seg is None or not seg.units or seg.sealed:
                return False
            self._roll(seg)
            return True

    def flush(self) -> None:
        for seg in self._segments:
            seg.flush()

    # -- compaction rounds ------------------------------------------------------------------------

    def sealed_segments(self) -> list[Segment]:
        """The segments a round may compact: every sealed one (never the one being written),
        and only once the queue has at least two files (RocketMQ's getCompactionFile)."""
        segs = self._segments
        if len(segs) < 2:
            return []
        return [s for s in segs if s.sealed]

    def swap_in(self, replaced: Sequence[Segment], manifest: SwapManifest,
                tiered: Sequence[TierSegment] | None = None) -> None:
        """Apply a committed round (its manifest is on disk): move the new files in, swap the
        in-memory list, and retire the old segments (readers keep their maps). ``tiered``: the
        files the tier serves from now on (local files released or restored), replaced in the
        same step, so no read sees the queue with those files in neither place."""
        names = {s.name for s in replaced}
        with self._lock:
            swap.roll_forward(self.paths, manifest)
            fresh = []
            try:
                for name in manifest.with_:
                    start = int(name)
                    seg = Segment.open(self.paths.log_file(start), self.paths.cq_file(start),
                                       self.log_size, self.cq_size)
                    fresh.append(seg)
                    seg.recover()
            except BaseException:
                for seg in fresh:
                    seg.close()
                raise
            kept = [s for s in self._segments if s.name not in names]
            self._segments = tuple(sorted([*fresh, *kept], key=lambda s: s.start))
            if tiered is not None:
                self._tiered = tuple(tiered)
            self.state = manifest.state
        for seg in replaced:
            # Their files were renamed <name>.deleted (and removed): point the maps there, so
            # retiring them never unlinks the new file of the same name.
            seg.log.path = QueuePaths.deleted(seg.log.path)
            seg.cq.path = QueuePaths.deleted(seg.cq.path)
            seg.destroy(self.destroy_interval_ms)

    # -- reading ----------------------------------------------------------------------------------

    def tier_only(self) -> tuple[TierSegment, ...]:
        """The files served from the tier: released locally, below ``state.tier_floor``."""
        return self._tiered

    def set_tiered(self, segs: Sequence[TierSegment]) -> None:
        self._tiered = tuple(segs)

    def _view(self) -> tuple[Segment | TierSegment, ...]:
        """Every file of the queue in offset order: the tier's released ones, then the local
        ones (a snapshot; both tuples are replaced, never changed in place, together under
        the lock when files move between the two)."""
        with self._lock:
            tiered, segments = self._tiered, self._segments
        return (*tiered, *segments) if tiered else segments

    def min_offset(self) -> int:
        for seg in self._view():
            if seg.units:
                return seg.first_offset
        return self.next_offset

    def offsets(self) -> QueueOffsets | None:
        if not self._segments and not self._tiered and not self.next_offset:
            return None
        return QueueOffsets(self.min_offset(), self.next_offset)

    def _locate(self, segs: Sequence[Segment | TierSegment], offset: int) -> int:
        """Index of the first segment holding a unit at or after ``offset`` (len if none)."""
        lasts, last = [], -1
        for seg in segs:  # an empty segment (the one being written) keeps the order
            last = seg.last_offset if seg.units else last
            lasts.append(last)
        return bisect.bisect_left(lasts, offset)

    def read(self, request: ReadRequest) -> GetMessageResult | None:
        high = self.next_offset
        if not 0 <= request.offset < high:
            return None
        segs = self._view()
        result = GetMessageResult(GetMessageStatus.OFFSET_FOUND_NULL, request.offset,
                                  self.min_offset(), high)
        filt = request.filter
        scan = request.max_count if filt.accepts_all else max(request.max_count, 800)
        records, total, scanned = result.records, 0, 0
        for seg in segs[self._locate(segs, request.offset):]:
            if not seg.units:
                continue
            units_raw: bytes | memoryview
            if not isinstance(seg, Segment):
                try:  # the units too are read from the tier (once per file)
                    index = (seg.index_of(request.offset) if seg.first_offset < request.offset
                             else 0)
                    stop = min(seg.units, index + scan - scanned)
                    units_raw, view_of = self._tier_units(seg, index, stop, request.max_bytes)
                except OSError as exc:
                    # As a tier read of any topic answers (tiered/fetcher.py): what was read
                    # so far, else nothing at this offset for now, so the reader asks again;
                    # not an error that fails the whole receive or pull.
                    log.warning("compaction queue %s:%d: tier read of %s failed: %s",
                                self.topic, self.queue_id, seg.name, exc)
                    return self._done(result, scanned)
            else:
                index = seg.index_of(request.offset) if seg.first_offset < request.offset else 0
                stop = min(seg.units, index + scan - scanned)
                if not seg.hold():
                    return self._done(result, scanned)  # swapped out: the next read sees new
                result._held.append(seg.log)
                result._held.append(seg.cq)
                units_raw, view_of = seg.cq.buffer[index * UNIT_SIZE : stop * UNIT_SIZE], \
                    seg.record_view
            # A tier file's units come only as far as max_bytes reaches: with a tag filter the
            # loop below can use them all up without reaching max_bytes, and the units not
            # fetched must be read next, not passed over for the next file.
            short = len(units_raw) < (stop - index) * UNIT_SIZE
            for position, size, tags_code, _t, queue_offset, *_rest in UNIT.iter_unpack(
                    units_raw):
                if len(records) >= request.max_count or (
                        records and total + size > request.max_bytes):
                    result.next_begin_offset = queue_offset
                    return self._done(result, scanned)
                scanned += 1
                result.next_begin_offset = queue_offset + 1
                if not filt.matches_code(tags_code):
                    continue
                view = view_of(position, size)
                if filt.tags is not None and not filt.matches_tags(codec.record_tags(view, 0)):
                    view.release()
                    continue
                records.append(SelectedRecord(view, codec.record_positions(view, 0)[1],
                                              queue_offset))
                total += size
            if scanned >= scan or short:
                return self._done(result, scanned)
        # Every unit after the offset was read: what is left below the next offset are holes.
        result.next_begin_offset = high
        return self._done(result, scanned)

    @staticmethod
    def _tier_units(seg: TierSegment, index: int, stop: int, max_bytes: int
                    ) -> tuple[bytes, Callable[[int, int], memoryview]]:
        """Units ``index:stop`` of a tier file and a view of their records, fetched in one
        ranged read that covers no more than ``max_bytes`` (plus one record)."""
        units = seg.units_array()[index:stop]
        if not len(units):
            return b"", lambda _p, _s: memoryview(b"")
        ends = np.cumsum(units["size"].astype(np.int64))
        take = min(len(units), int(np.searchsorted(ends, max_bytes, side="right")) + 1)
        units = units[:take]
        base = int(units["position"][0])
        data = memoryview(seg.log_range(base, int(units["position"][-1]) - base
                                        + int(units["size"][-1])))
        return units.tobytes(), lambda position, size: data[position - base:
                                                            position - base + size]

    @staticmethod
    def _done(result: GetMessageResult, scanned: int) -> GetMessageResult:
        if result.records:
            result.status = GetMessageStatus.FOUND
        elif scanned:
            result.status = GetMessageStatus.NO_MATCHED_MESSAGE  # all filtered out
        return result

    def records_end(self) -> int:
        """CommitLog end of the newest record the queue holds, local or in the tier (0 for
        none). With nothing local it reads the last unit and record of the tier's newest file
        (a ranged read each; raises OSError when the tier cannot serve them)."""
        if self.physical_end:
            return self.physical_end
        for seg in reversed(self._tiered):
            if seg.units:
                unit = seg.units_array()[-1]
                record = memoryview(seg.log_range(int(unit["position"]), int(unit["size"])))
                return codec.record_positions(record, 0)[1] + len(record)
        return 0

    def offset_by_time(self, timestamp_ms: int) -> int | None:
        for seg in self._view():
            if not seg.units:
                continue
            if not isinstance(seg, Segment):
                if seg.entry.last_timestamp and timestamp_ms > seg.entry.last_timestamp:
                    continue  # the manifest says every unit is older: no read needed
                try:
                    index = seg.index_of_time(timestamp_ms)
                except OSError as exc:
                    # The file's timestamps cannot be read now: answer its first offset, the
                    # earliest the answer can be, so a consumer reset by time re-reads a
                    # few older versions rather than skipping any at or after the time.
                    log.warning("compaction queue %s:%d: tier read of %s failed (%s): "
                                "answering its first offset for time %d", self.topic,
                                self.queue_id, seg.name, exc, timestamp_ms)
                    return seg.first_offset
                if index < seg.units:
                    return int(seg.units_array()["queue_offset"][index])
                continue
            if not seg.hold():
                continue
            try:
                index = seg.index_of_time(timestamp_ms)
                if index < seg.units:
                    return seg.unit(index).queue_offset
            finally:
                seg.release()
        return None

    # -- lifetime ---------------------------------------------------------------------------------

    def close(self) -> None:
        segs, self._segments = self._segments, ()
        for seg in segs:
            seg.close()

    def destroy(self) -> None:
        """Delete the queue's files and directories (its topic was deleted)."""
        with self._lock:
            segs, self._segments = self._segments, ()
            for seg in segs:
                seg.destroy(self.destroy_interval_ms)
            for directory in (self.paths.log_dir, self.paths.cq_dir):
                shutil.rmtree(directory, ignore_errors=True)
            self.next_offset = 0
            self.state = QueueState()


def _all_zero(path: os.PathLike) -> bool:
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            if chunk.count(0) != len(chunk):
                return False
    return True

