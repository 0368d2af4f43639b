"""File ConsumeQueues: per topic/queue, 20-byte units pointing into the CommitLog.

Contracts: the dispatcher thread is the only writer (``put_unit``, ``stage_unit`` +
``write_staged``, ``truncate_dirty``); readers on any thread call ``get_units``, ``min_offset``,
``max_offset``. The store stages a dispatch round's units per queue and writes them when the
round is committed (``commit_dispatch``), one copy per queue. The flush thread calls
``flush``. Recovery calls ``recover`` before any other thread starts.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

from stratamq.record import SysFlag
from stratamq.store.consume_queue_format import (
    BLANK_UNIT,
    UNIT,
    UNIT_SIZE,
    is_blank_unit,
    written_units,
)
from stratamq.store.consume_queue_pending import PendingFiles
from stratamq.store.consume_queue_snapshot import QueuePositions
from stratamq.store.layout import parse_segment_name
from stratamq.store.mapped_file import MappedFile, MappedFileError
from stratamq.store.mapped_file_queue import MappedFileQueue

# The bit the prepared (0b01) and rolled-back (0b11) transaction types have and the others
# (not transactional 0b00, committed 0b10) lack.
PREPARED_OR_ROLLED_BACK = SysFlag.TRANSACTION_PREPARED_TYPE

log = logging.getLogger(__name__)

CQ_ALLOCATE_AHEAD = 64 * 1024  # bytes reserved past a ConsumeQueue's write position
# A long dispatch round (a replay, a dispatcher catching up) writes its staged units this often.
STAGED_UNITS_MAX = 4096


# Loads of queues opened from a snapshot, one at a time (each is a directory listing and a
# read; re-entered by a repair's own writes). One lock, not one per queue: a queue is loaded
# once, and 10,000 locks made an open from a snapshot measurably slower.
_MATERIALIZE_LOCK = threading.RLock()
# The files of every queue not loaded yet: none (nothing may be written through it).
_UNLOADED = MappedFileQueue(Path("/"), UNIT_SIZE, read_only=True, evictable=True)


class ConsumeQueue:
    """The units of one topic/queue, in files of ``file_size`` bytes."""

    def __init__(self, topic: str, queue_id: int, directory: Path | None, file_size: int,
                 *, read_only: bool = False, positions: QueuePositions | None = None,
                 topic_dir: Path | None = None, pending: PendingFiles | None = None) -> None:
        self.topic = topic
        self.queue_id = queue_id
        # ``topic_dir`` instead of ``directory``: the path is built when first needed.
        self._directory = directory
        self._topic_dir = topic_dir
        self.read_only = read_only
        # A queue opened from a snapshot gets its files when first used (``_materialize``):
        # until then it shares an empty, read-only list (opening 10,000 queues from a
        # snapshot cost ~10 us each, most of it building a list per queue).
        self.file_size = file_size
        # New files wait in memory here until the flush thread creates them (see
        # consume_queue_pending.py); None: a new file is created at once.
        self._pending = pending
        self.files = _UNLOADED if positions is not None else self._file_queue()
        # End (offset + size) of the newest unit's record: re-dispatching a record at or below
        # it is a no-op, which makes recovery's replay idempotent.
        self.max_physic_offset = -1
        self.min_logic_offset = 0  # byte position of the first live unit
        # (first file, its first unit) as recovery read it, for the open's correct_min_offset.
        self._head_unit: tuple[MappedFile, tuple[int, int, int]] | None = None
        self._write_lock = threading.Lock()
        # The staging cursor (dispatcher thread only): units of the current dispatch round
        # wait packed in ``_staged`` to be written in one copy at the round's commit
        # (``stage_unit``, ``write_staged``), at byte ``_staged_at`` of ``_staged_file``. The
        # cursor outlives the round: the next unit staged must have queue offset
        # ``_staged_next``, lie below ``_staged_stop`` (the file's end) and point past
        # ``_staged_end`` (else it is a replay), which the store's ``dispatch_batch`` checks
        # inline, so a queue's usual unit costs no call. ``_staged_next`` -1: no cursor (the
        # next unit is checked against the files); anything else that writes units drops it.
        self._staged = bytearray()
        self._staged_file: MappedFile | None = None
        self._staged_at = 0
        self._staged_next = -1
        self._staged_stop = -1
        self._staged_end = -1
        # Not loaded yet: the positions a clean close saved (consume_queue_snapshot.py) answer
        # for the queue until its first read or write loads its files (``_materialize``).
        self._lazy = positions
        self._materializing = False
        # Set by the store for a queue opened from a snapshot: re-dispatches this queue's
        # records of a CommitLog range (its files turned out shorter than the snapshot).
        # It returns how many records it dispatched, -1 if it cannot (yet).
        self.refill: Callable[[ConsumeQueue, int, int], int] | None = None
        if positions is not None:
            self.max_physic_offset = positions.max_physic
            self.min_logic_offset = positions.min_logic

    # -- loading on first use -------------------------------------------------------------------

    def _materialize(self) -> None:
        """Load and recover the files of a queue opened from a snapshot (any thread; once).
        Its positions then come from its files, as after any open; a difference from the
        snapshot is an error to report (the offsets already given out came from it)."""
        with _MATERIALIZE_LOCK:
            saved = self._lazy
            if saved is None or self._materializing:
                return  # loaded, or this thread is loading it (the repair's put_unit)
            self._materializing = True
            try:
                files = self._file_queue()
                files.load(segment_listing(self.directory))
                self.files = files
                self.max_physic_offset = -1
                self._recover_files()
                self._head_unit = None
                self.min_logic_offset = max(saved.min_logic, self.files.min_offset())
                if (self.files.max_offset(), self.max_physic_offset) != (saved.max_bytes,
                                                                        saved.max_physic):
                    self._repair(saved)
                self._lazy = None
            finally:
                self._materializing = False

    def _repair(self, saved: QueuePositions) -> None:
        """The files differ from what the last clean close saved (damaged or cut since): a
        queue that ends short gets its missing units again from the CommitLog, as a recovery
        without the snapshot would have re-dispatched them."""
        have, had = self.files.max_offset() // UNIT_SIZE, saved.max_bytes // UNIT_SIZE
        log.error("%s/%d: files end at unit %d (record end %d), the snapshot of the last "
                  "clean close said %d (%d)", self.topic, self.queue_id, have,
                  self.max_physic_offset, had, saved.max_physic)
        if have >= had:
            return
        added = -1
        if self.refill is not None and not self.files.read_only:
            added = self.refill(self, max(self.max_physic_offset, 0), saved.max_physic)
        if added < 0:
            log.error("%s/%d: units %d to %d cannot be re-dispatched while the store opens; "
                      "their records stay in the CommitLog only", self.topic, self.queue_id,
                      have, had)
        else:
            log.warning("%s/%d: %d records re-dispatched from the CommitLog; the queue ends "
                        "at unit %d", self.topic, self.queue_id, added, self.max_offset())

    @property
    def directory(self) -> Path:
        directory = self._directory
        if directory is None:
            if self._topic_dir is None:
                raise ValueError(f"{self.topic}/{self.queue_id}: no directory given")
            directory = self._directory = self._topic_dir / str(self.queue_id)
        return directory

    def _file_queue(self) -> MappedFileQueue:
        # Reserve disk in small steps: a store may hold a great many queues.
        # Evictable: a store may hold more queues than the process may open files.
        # No read-ahead: see MappedFile._advise (a new file cost ~10 ms without it).
        return MappedFileQueue(self.directory, self.file_size, read_only=self.read_only,
                               allocate_ahead=CQ_ALLOCATE_AHEAD, evictable=True,
                               readahead=False, pending=self._pending)

    @property
    def loaded(self) -> bool:
        """False while the queue answers from a snapshot (its files not read yet)."""
        return self._lazy is None

    def positions(self) -> QueuePositions | None:
        """What a snapshot keeps of this queue; None for a queue without files."""
        if self._lazy is not None:
            return self._lazy
        first = self.files.first()
        if first is None:
            return None
        return QueuePositions(self.file_size, first.file_from_offset, self.files.max_offset(),
                              max(self.min_logic_offset, first.file_from_offset),
                              self.max_physic_offset)

    # -- positions ------------------------------------------------------------------------------

    def max_offset(self) -> int:
        """Queue offset the next message gets (the number of units ever written)."""
        saved = self._lazy
        if saved is not None:
            return saved.max_bytes // UNIT_SIZE
        return self.files.max_offset() // UNIT_SIZE

    def min_offset(self) -> int:
        saved = self._lazy
        if saved is not None:
            return saved.min_logic // UNIT_SIZE
        return max(self.min_logic_offset, self.files.min_offset()) // UNIT_SIZE

    def _unit_at(self, byte_pos: int) -> tuple[int, int, int] | None:
        if self._lazy is not None:
            self._materialize()
        mf = self.files.find_by_offset(byte_pos)
        if mf is None or not mf.hold():
            return None
        try:
            rel = byte_pos - mf.file_from_offset
            if rel + UNIT_SIZE > mf.read_position:
                return None
            return UNIT.unpack_from(mf.buffer, rel)
        finally:
            mf.release()

    def _live_unit_from(self, queue_offset: int, high: int) -> tuple[int, int, int] | None:
        """The first non-blank unit at or after ``queue_offset`` (blank fillers skipped)."""
        for q in range(queue_offset, high):
            unit = self._unit_at(q * UNIT_SIZE)
            if unit is None:
                return None
            if not is_blank_unit(*unit):
                return unit
        return None

    def _first_unit_where(self, predicate, low: int, high: int) -> int:
        """Binary search (by queue offset) for the first unit in [low, high) satisfying a
        predicate that is false then true along the queue; returns high if none. A blank filler
        unit is judged by the first real unit after it, so fillers never break the ordering."""
        while low < high:
            mid = (low + high) // 2
            unit = self._live_unit_from(mid, high)
            if unit is None or predicate(unit):
                high = mid
            else:
                low = mid + 1
        return low

    def offset_by_time(self, timestamp: int, store_time_at: Callable[[int], int | None]) -> int:
        """The first queue offset whose record was stored at or after ``timestamp`` (ms):
        ``min_offset()`` if all are, ``max_offset()`` if none is. Binary search: store times
        never decrease along a queue. ``store_time_at(commitlog_offset)`` reads a record's
        store time (None if the record is gone: counted as older)."""

        def stored_at_or_after(unit: tuple[int, int, int]) -> bool:
            stored = store_time_at(unit[0])
            return stored is not None and stored >= timestamp

        return self._first_unit_where(stored_at_or_after, self.min_offset(), self.max_offset())

    # -- recovery -------------------------------------------------------------------------------

    def load(self, listing: list[tuple[int, os.DirEntry[str]]] | None = None) -> None:
        """Load the queue's files (``listing``: its segments as the store listed them)."""
        self.files.load(listing)

    def recover(self) -> None:
        """Find the end of the written units (the first unwritten unit) in the last files.

        The files are read with ``pread`` (``MappedFile.read_data``), not mapped: a reopen of
        many queues maps none of them (each is mapped on first use), and only the written
        extents are read (the rest of a sparse file is never touched: a hole read through a
        map on a full tmpfs is a SIGBUS, and 6 MB of zero pages per queue made a reopen of
        many queues slow). A queue opened from a snapshot is recovered when first used."""
        if self._lazy is None:
            self._recover_files()

    def _recover_files(self) -> None:
        self._drop_cursor()
        self._head_unit = None
        files = self.files.files
        if not files:
            return
        start = max(0, len(files) - 3)
        end = files[start].file_from_offset
        last: tuple[int, int, int] | None = None
        clean = True  # no byte written past ``end`` in the file holding it
        for i in range(start, len(files)):
            mf = files[i]
            data = mf.read_data()
            pos = written_units(data, len(data)) * UNIT_SIZE
            end = mf.file_from_offset + pos
            if pos:
                last = UNIT.unpack_from(data, pos - UNIT_SIZE)
                if i == 0:
                    self._head_unit = (mf, UNIT.unpack_from(data, 0))
            if pos + UNIT_SIZE <= mf.file_size:
                clean = data.count(0, pos) == len(data) - pos
                break
        # A torn or stale tail is zeroed; a clean one is left as it is (nothing to read).
        self.files.truncate_dirty_files(end, zero_tail=not clean)
        if last is None and end >= UNIT_SIZE:  # the newest unit is in a file not read here
            last = self._unit_at(end - UNIT_SIZE)
        # The newest real unit's end: replays at or below it are no-ops.
        if last is not None and not is_blank_unit(*last):
            self.max_physic_offset = last[0] + last[1]

    def correct_min_offset(self, commitlog_min_offset: int) -> None:
        """Skip units whose records are gone (below the CommitLog's min) and blank fillers."""
        if self._lazy is not None:
            self._materialize()
        first = self.files.first()
        if first is None:
            return
        low = first.file_from_offset // UNIT_SIZE
        high = self.max_offset()
        head, self._head_unit = self._head_unit, None
        if (head is not None and head[0] is first and low < high
                and not is_blank_unit(*head[1]) and head[1][0] >= commitlog_min_offset):
            # Recovery read the first unit (the usual case at open: nothing expired): units
            # ascend, so it is the first live one, and the file need not be mapped to say so.
            self.min_logic_offset = low * UNIT_SIZE
            return
        first_live = self._first_unit_where(lambda u: u[0] >= commitlog_min_offset, low, high)
        while first_live < high:  # fillers at the head are not messages: start after them
            unit = self._unit_at(first_live * UNIT_SIZE)
            if unit is None or not is_blank_unit(*unit):
                break
            first_live += 1
        self.min_logic_offset = first_live * UNIT_SIZE

    def delete_expired(self, min_commitlog_offset: int) -> int:
        """Delete whole files whose units all point below ``min_commitlog_offset`` (records the
        clean-up removed), then move the min offset past the rest of them; return how many
        files went. Never the last file (it carries ``max_offset``), and never a file not yet
        flushed (the flusher walks forward from ``flushed_where``). Called by the clean-up
        thread; the write lock keeps it apart from ``put_unit``."""
        if self._lazy is not None:
            self._materialize()
        with self._write_lock:
            files = self.files.files
            flushed = self.files.flushed_where
            cut = 0
            for mf in files[:-1]:
                # Units ascend along the queue, so the file's last unit decides for all of it.
                last = self._unit_at(mf.file_end_offset - UNIT_SIZE)
                if last is None or mf.file_end_offset > flushed:
                    break
                if not is_blank_unit(*last) and last[0] >= min_commitlog_offset:
                    break
                cut = mf.file_end_offset
            doomed = self.files.delete_below(cut) if cut else []
            self.correct_min_offset(min_commitlog_offset)
        return len(doomed)

    def truncate_dirty(self, commitlog_end: int) -> int:
        """Drop units pointing at or past ``commitlog_end``; return how many were dropped."""
        if self._lazy is not None:
            if 0 <= self.max_physic_offset <= commitlog_end or self._lazy.max_bytes == 0:
                return 0  # as below, without loading the queue
            self._materialize()
        self.write_staged()  # normally nothing: a cut comes between dispatch rounds
        self._drop_cursor()
        first = self.files.first()
        if first is None:
            return 0
        if 0 <= self.max_physic_offset <= commitlog_end:
            return 0  # the newest unit's record ends in the CommitLog, so every one does
        self._head_unit = None  # the cut may reach the head, and new units replace it
        low = first.file_from_offset // UNIT_SIZE
        high = self.max_offset()
        cut = self._first_unit_where(lambda u: u[0] + u[1] > commitlog_end, low, high)
        dropped = high - cut
        if dropped:
            log.warning("%s/%d: %s %d units past CommitLog end %d", self.topic, self.queue_id,
                        "ignoring (read-only)" if self.files.read_only else "dropping", dropped,
                        commitlog_end)
            self.files.truncate_dirty_files(cut * UNIT_SIZE)
            prev = self._unit_at((cut - 1) * UNIT_SIZE) if cut > low else None
            self.max_physic_offset = prev[0] + prev[1] if prev and not is_blank_unit(*prev) else -1
        return dropped

    # -- writing --------------------------------------------------------------------------------

    def put_unit(self, queue_offset: int, commitlog_offset: int, size: int, tags_code: int) -> None:
        if self._lazy is not None:
            self._materialize()
        self._drop_cursor()
        with self._write_lock:
            if commitlog_offset + size <= self.max_physic_offset:
                return  # already have it: a replay after recovery
            target = queue_offset * UNIT_SIZE
            # The usual case first: the next unit of the newest file, which has room.
            mf = self.files.last()
            if mf is not None:
                rel = target - mf.file_from_offset
                if rel == mf.wrote_position and rel + UNIT_SIZE <= mf.file_size:
                    mf.write_at(rel, UNIT.pack(commitlog_offset, size, tags_code))
                    self.max_physic_offset = commitlog_offset + size
                    return
            current = self.files.max_offset()
            if target < current:
                log.warning("%s/%d: unit for queue offset %d already written; skipped",
                            self.topic, self.queue_id, queue_offset)
                return
            unit = UNIT.pack(commitlog_offset, size, tags_code)
            if current == 0 and self.files.last() is None and not self.files.read_only:
                # A new queue's first file is created with its first unit in it (no map, see
                # MappedFile._create_with), or waits in memory with it until the flush
                # thread creates it (consume_queue_pending.py). A queue whose earlier units
                # are gone (or never existed here) starts mid-file: the head of its first
                # file is filled with blank units, as RocketMQ does.
                head = target % self.file_size
                self.files.create_with(BLANK_UNIT * (head // UNIT_SIZE) + unit, target)
                self.min_logic_offset = target
                self.max_physic_offset = commitlog_offset + size
                return
            while current < target:
                log.error("%s/%d: gap in queue before offset %d; filling with blank units",
                          self.topic, self.queue_id, queue_offset)
                mf = self._file_for(current)
                mf.write_at(current - mf.file_from_offset, BLANK_UNIT)
                current += UNIT_SIZE
            last = self.files.last()
            if last is not None and last.is_full() and not self.files.read_only:
                self.files.create_with(unit)  # the next file, created with its first unit
            else:
                mf = self._file_for(target)
                mf.write_at(target - mf.file_from_offset, unit)
            self.max_physic_offset = commitlog_offset + size

    def stage_unit(self, queue_offset: int, commitlog_offset: int, size: int,
                   tags_code: int) -> bool:
        """``put_unit`` deferred to ``write_staged`` when the unit is the next one of the
        newest file and fits in it (the usual case): a round's units of this queue are then
        copied into the map at once. False when it is not that case: the caller writes what
        is staged, then calls ``put_unit`` (which handles every other case)."""
        end = commitlog_offset + size
        if self._staged_next >= 0:
            if end <= self._staged_end:
                return True  # already have it: a replay (as put_unit)
            if queue_offset != self._staged_next or queue_offset >= self._staged_stop:
                return False
        else:
            if end <= self.max_physic_offset:
                return True  # already have it: a replay (as put_unit)
            if self._lazy is not None:
                self._materialize()
            mf = self.files.last()
            if mf is None:
                return False
            rel = queue_offset * UNIT_SIZE - mf.file_from_offset
            if rel != mf.wrote_position or rel + UNIT_SIZE > mf.file_size:
                return False
            self._staged_file = mf
            self._staged_at = rel
            self._staged_stop = mf.file_end_offset // UNIT_SIZE
        self._staged += UNIT.pack(commitlog_offset, size, tags_code)
        self._staged_next = queue_offset + 1
        self._staged_end = end
        return True

    def write_staged(self) -> None:
        """Write the staged units (one copy into the map), as ``put_unit`` would have one by
        one: the same bytes at the same place."""
        data = self._staged
        if not data:
            return
        self._staged = bytearray()
        mf, at, next_offset = self._staged_file, self._staged_at, self._staged_next
        self._staged_next = -1  # no cursor until the write is done: a write that raises
        with self._write_lock:
            if mf is self.files.last() and mf is not None and mf.wrote_position == at:
                mf.write_at(at, data)
                self.max_physic_offset = self._staged_end
                self._staged_at = at + len(data)
                self._staged_next = next_offset  # the cursor's file and end still hold
                return
        self._drop_cursor()
        # The queue changed under the staged units (it never does while dispatch runs; kept
        # safe): one at a time, with every check put_unit makes.
        first = (mf.file_from_offset + at) // UNIT_SIZE if mf is not None else 0
        for i, (offset, size, tags_code) in enumerate(UNIT.iter_unpack(data)):
            self.put_unit(first + i, offset, size, tags_code)

    def _drop_cursor(self) -> None:
        """Forget the staging cursor (nothing may be staged): the next unit is checked
        against the files again. Whatever writes or cuts units other than ``write_staged``
        calls it."""
        self._staged_file = None
        self._staged_next = self._staged_stop = self._staged_end = -1

    def _file_for(self, byte_pos: int) -> MappedFile:
        mf = self.files.last_mapped_file(start_offset=byte_pos)
        if mf is None:  # only a read-only queue has none to give
            raise MappedFileError(f"{self.topic}/{self.queue_id}: no writable ConsumeQueue file")
        return mf

    # -- reading --------------------------------------------------------------------------------

    def get_units(self, queue_offset: int, max_units: int) -> list[tuple[int, int, int]]:
        """Up to ``max_units`` units from ``queue_offset`` on: (commitlog_offset, size, code)."""
        if self._lazy is not None:
            self._materialize()
        out: list[tuple[int, int, int]] = []
        pos = queue_offset * UNIT_SIZE
        end = self.files.max_offset()
        while len(out) < max_units and pos < end:
            mf = self.files.find_by_offset(pos)
            if mf is None or not mf.hold():
                break
            try:
                rel = pos - mf.file_from_offset
                stop = min(mf.read_position, rel + (max_units - len(out)) * UNIT_SIZE)
                if stop <= rel:
                    break
                out.extend(UNIT.iter_unpack(mf.buffer[rel:stop]))
                pos = mf.file_from_offset + stop
            finally:
                mf.release()
        return out

    def flush(self, least_pages: int) -> None:
        self.files.flush(least_pages)
        if least_pages == 0:
            self.files.flush_all()

    def disk_bytes(self) -> int:
        """Disk blocks this queue's files occupy (a fresh, sparse file uses few)."""
        if self._lazy is not None:
            return sum(entry.stat().st_blocks * 512
                       for _start, entry in segment_listing(self.directory))
        return sum(mf.path.stat().st_blocks * 512 for mf in self.files.files
                   if mf.path.exists())

    def destroy(self) -> None:
        if self._lazy is not None:
            self._materialize()  # its files are deleted with it
        self._staged = bytearray()
        self._drop_cursor()
        self.files.destroy()
        self._head_unit = None
        self.max_physic_offset = -1
        self.min_logic_offset = 0

    def close(self) -> None:
        self.files.close()


def segment_listing(directory: Path | str) -> list[tuple[int, os.DirEntry[str]]]:
    """A queue directory's segment files, (start offset, entry) sorted; none if it is gone."""
    try:
        entries = os.scandir(directory)
    except FileNotFoundError:
        return []
    with entries:
        return sorted((start, e) for e in entries
                      if (start := parse_segment_name(e.name)) is not None and e.is_file())
