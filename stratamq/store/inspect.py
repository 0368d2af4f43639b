"""Read-only inspections of a store's parts, and the repairs ``store verify`` makes with them.

``scan_undispatched`` (records no ConsumeQueue holds; re-dispatched on request), ``index_gaps``
(records with keys no index file covers) and ``rebuild_index``, and ``record_problem_at`` (why
there is no record at an offset) let ``dump``, ``stat`` and ``query`` say what they cannot show.
They are handed ``StoreParts``, never the store.
"""

from __future__ import annotations

import mmap
import shutil
import struct
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, cast

from stratamq import record as codec
from stratamq.record import DispatchInfo, RecordCorrupt, SysFlag
from stratamq.store.consume_queue_store import ConsumeQueueStore
from stratamq.store.index_file import file_size
from stratamq.store.index_service import IndexService, record_keys
from stratamq.store.mapped_file import MappedFile
from stratamq.store.mapped_file_queue import MappedFileQueue
from stratamq.store.parts import StoreParts

MAX_LISTED_PROBLEMS = 50
MAX_LISTED_QUEUES = 10

QueueKey = tuple[str, int]


def queue_name(key: QueueKey) -> str:
    return f"{key[0]}/{key[1]}"


def _resync(mf: MappedFile, pos: int, limit: int) -> int | None:
    """The next position >= ``pos`` in ``mf`` where a record provably starts (searched in the
    mmap itself: ``message.resync`` on a memoryview would copy the whole segment)."""
    return codec.resync(cast("mmap.mmap", mf.buffer.obj), pos, limit, mf.file_from_offset)


def _segments_from(files: MappedFileQueue, offset: int) -> Iterator[MappedFile]:
    """Held segments from the one holding ``offset`` on; each is released after its turn."""
    mf = files.find_by_offset(max(offset, files.min_offset()))
    while mf is not None:
        if mf.hold():
            try:
                yield mf
            finally:
                mf.release()
        mf = files.find_by_offset(mf.file_end_offset)


# -- records no ConsumeQueue covers ----------------------------------------------------------


def _coverage(cq_stores: list[ConsumeQueueStore]) -> Callable[[str, int], int]:
    """``floor(topic, queue_id)``: records of that queue below it are in every ConsumeQueue
    store (-1: the queue is missing from one)."""
    cache: dict[QueueKey, int] = {}

    def floor(topic: str, queue_id: int) -> int:
        key = (topic, queue_id)
        value = cache.get(key)
        if value is None:
            floors = []
            for s in cq_stores:
                # find() first: a lazily loaded store (RocksDB) knows the queue's rows after it.
                if s.find(topic, queue_id) is None:
                    floors.append(-1)
                else:
                    floors.append(s.replay_floor(topic, queue_id))  # type: ignore[attr-defined]
            value = cache[key] = min(floors)
        return value

    return floor


@dataclass
class UndispatchedScan:
    """Records of the CommitLog that no ConsumeQueue holds, and damage met on the way."""

    by_queue: Counter[QueueKey] = field(default_factory=Counter)
    corrupt: list[RecordCorrupt] = field(default_factory=list)
    redispatched: bool = False

    @property
    def records(self) -> int:
        return sum(self.by_queue.values())

    def queues_text(self) -> str:
        listed = ", ".join(f"{queue_name(k)}: {n}"
                           for k, n in self.by_queue.most_common(MAX_LISTED_QUEUES))
        more = len(self.by_queue) - MAX_LISTED_QUEUES
        return listed + (f", and {more} more queues" if more > 0 else "")


def scan_undispatched(store: StoreParts, *, redispatch: bool = False,
                      start: int | None = None) -> UndispatchedScan:
    """Walk the CommitLog (from ``start``; default its beginning) and find the consumable
    records no ConsumeQueue covers (after a crash the queues lag; a queue's files may be gone).
    With ``redispatch`` (a read-write store whose dispatcher is stopped) dispatch them to every
    ConsumeQueue store too.

    Covered records are passed over reading only their topic and queue id (the replay's fast
    path); the others are checked in full, so damage is reported, never dispatched."""
    result = UndispatchedScan(redispatched=redispatch)
    floor = _coverage(store.cq_stores)
    floors: dict[tuple[bytes, int], int] = {}  # skip_covered's cache, by raw topic bytes
    files = store.commitlog.files
    for mf in _segments_from(files, files.min_offset() if start is None else start):
        buf, base, end = mf.buffer, mf.file_from_offset, mf.read_position
        pos = 0
        fast = True
        while pos + 8 <= end:
            if fast:
                try:
                    pos, _ = codec.skip_covered(buf, pos, end, base, floors, floor)
                except (IndexError, ValueError, struct.error):
                    # skip_covered trusts a record's body length; a damaged one sends it out of
                    # bounds. Check record by record for the rest of this segment instead.
                    fast = False
                if pos + 8 > end:
                    break
            pos, size, bad = _next_record(mf, pos, end)
            if bad is not None:
                result.corrupt.append(bad)
            if size is None:
                continue  # resynced past damage: check the record found there
            if size == 0:
                break
            info = codec.decode_dispatch_info(buf, pos)
            if (SysFlag.is_dispatchable(info.sys_flag)
                    and info.physical_offset >= floor(info.topic, info.queue_id)):
                result.by_queue[(info.topic, info.queue_id)] += 1
                if redispatch:
                    for cq_store in store.cq_stores:
                        cq_store.dispatch(info)
            pos += size
        if redispatch:
            for cq_store in store.cq_stores:
                cq_store.commit_dispatch()
    return result


def _next_record(mf: MappedFile, pos: int,
                 limit: int) -> tuple[int, int | None, RecordCorrupt | None]:
    """Check the record at ``pos`` of a segment: (pos, its size, None) when it is whole (size 0:
    the segment's end), else (where ``resync`` confirms the next record, None, what was wrong)
    or, with no record after it, (limit, 0, what was wrong)."""
    try:
        return pos, codec.check_record(mf.buffer, pos, limit, mf.file_from_offset + pos,
                                       False), None
    except RecordCorrupt as exc:
        bad = RecordCorrupt(mf.file_from_offset + pos, exc.reason)
        nxt = _resync(mf, pos + 1, limit)
        return (limit, 0, bad) if nxt is None else (nxt, None, bad)


# -- index coverage --------------------------------------------------------------------------


def is_indexed_record(info: DispatchInfo) -> bool:
    """Does the index hold entries for this record (IndexService.dispatch's rule)?"""
    rollback = info.sys_flag & SysFlag.TRANSACTION_MASK == SysFlag.TRANSACTION_ROLLBACK_TYPE
    return not rollback and bool(record_keys(info))


# Bytes every record with keys holds in its properties: a stretch without them has none, and
# is passed over with one search instead of a decode per record.
_KEY_MARKS = tuple(f"{name}{codec.NAME_VALUE_SEPARATOR}".encode()
                   for name in (codec.Prop.UNIQ_KEY, codec.Prop.KEYS))


def _next_key_mark(raw: Any, pos: int, limit: int) -> int:
    hits = [hit for mark in _KEY_MARKS if (hit := raw.find(mark, pos, limit)) >= 0]
    return min(hits, default=-1)


def indexed_records(files: MappedFileQueue, start: int,
                    stop: int) -> Iterator[tuple[int, DispatchInfo]]:
    """(CommitLog offset, dispatch info) of the records in [``start``, ``stop``) that the index
    holds entries for, walking from the record at ``start`` (resyncing past damage). Only
    records whose bytes hold a KEYS or UNIQ_KEY property name are decoded; the rest of a
    segment without one is skipped whole."""
    for mf in _segments_from(files, start):
        base, limit, buf = mf.file_from_offset, mf.read_position, mf.buffer
        raw = buf.obj  # the mmap: find() without copying
        pos = max(0, start - base)
        end = min(limit, stop - base)
        mark = -1
        while pos + 8 <= limit and pos < end:
            if mark < pos:
                mark = _next_key_mark(raw, pos, limit)
                if mark < 0:
                    break  # no record from here to the segment's end has keys
            pos, size, _ = _next_record(mf, pos, limit)
            if size is None:
                continue  # resynced past damage: check the record found there
            if size == 0:
                break
            if mark < pos + size:
                info = codec.decode_dispatch_info(buf, pos)
                if is_indexed_record(info):
                    yield base + pos, info
            pos += size
        if mf.file_end_offset >= stop:
            return


@dataclass
class IndexGap:
    """Records with keys that no index file covers, between two covered stretches."""

    first: int  # CommitLog offset of the first such record
    last: int  # of the last one seen (the first one only, when counting stopped early)
    records: int  # how many (1 when counting stopped at the first)
    first_timestamp: int  # store time of the first
    until_timestamp: int | None  # store time where coverage resumes (None: the log's end)


def index_spans(index_files: list) -> list[tuple[int, int]]:
    """[first, last] CommitLog offsets each index file with entries covers, merged, in order."""
    spans: list[tuple[int, int]] = []
    for begin, end in sorted((f.begin_phy_offset, f.end_phy_offset)
                             for f in index_files if f.entries):
        if spans and begin <= spans[-1][1]:
            spans[-1] = (spans[-1][0], max(end, spans[-1][1]))
        else:
            spans.append((begin, end))
    return spans


def index_gaps(store: StoreParts, index_files: list | None = None, *,
               first_only: bool = False) -> list[IndexGap]:
    """Stretches of the CommitLog holding records with keys that no index file covers.

    Only the uncovered stretches are walked (``indexed_records``): before the first file,
    between files and after the last. ``first_only`` stops each walk at the first such
    record (enough to warn). Empty when the index is off."""
    if store.index is None:
        return []
    if index_files is None:
        index_files = store.index.files()
    files = store.commitlog.files
    lo, hi = files.min_offset(), files.max_offset()
    spans = index_spans(index_files)
    # (walk from, stop before, store time where coverage resumes, covered record to skip): a
    # span's last offset is the start of a covered record, so a walk after it starts there.
    stretches: list[tuple[int, int, int | None, int]] = []
    cursor, skip = lo, -1
    for begin, end in spans:
        if begin > cursor:
            stretches.append((cursor, begin, store.commitlog.store_timestamp_at(begin), skip))
        if end >= cursor:
            cursor, skip = end, end
    if cursor < hi:
        stretches.append((cursor, hi, None, skip))
    gaps = []
    for start, stop, until, covered in stretches:
        gap: IndexGap | None = None
        for phys, info in indexed_records(files, start, stop):
            if phys == covered:
                continue
            if gap is None:
                gap = IndexGap(phys, phys, 1, info.store_timestamp, until)
                if first_only:
                    break
            else:
                gap.last = phys
                gap.records += 1
        if gap is not None:
            gaps.append(gap)
    return gaps


REBUILD_MARGIN = 4 * 1024 * 1024  # beside the index file: the checkpoint, a ConsumeQueue page


class NotEnoughSpace(OSError):
    """A repair would need more disk than is free; nothing was changed."""


def rebuild_index(store: StoreParts, gaps: list[IndexGap]) -> tuple[IndexService, dict]:
    """Index every record from the first gap on, into files that end before it.

    Entries must go in CommitLog order, newest file last, so index files covering anything
    after the first gap are removed (they are derived data) and rebuilt with it. The store's own
    index service lets go of its files first; the store's dispatcher must be stopped."""
    assert store.index is not None
    first = gaps[0].first
    cfg = store.config
    directory = store.index.directory
    # Check before anything is removed: a rebuild that runs out of disk half way would leave
    # less index than before and a full disk the broker cannot start on.
    need = file_size(cfg.max_hash_slot_num, cfg.max_index_num) + REBUILD_MARGIN
    free = shutil.disk_usage(store.layout.root).free  # index/ itself may be gone
    if free < need:
        raise NotEnoughSpace(
            f"not enough free space to rebuild the index in {directory}: a new index file may "
            f"take up to {need:,} bytes (maxHashSlotNum={cfg.max_hash_slot_num}, maxIndexNum="
            f"{cfg.max_index_num}) and {free:,} bytes are free; free some space, or pass the "
            f"broker's own settings with --config broker.conf")
    old = store.index.files()
    removed = [f.name for f in old if not (f.entries and f.end_phy_offset < first)]
    store.index.close()
    for name in removed:
        (directory / name).unlink(missing_ok=True)
    fresh = IndexService(directory, cfg.max_hash_slot_num, cfg.max_index_num)
    fresh.load()
    count = 0
    files = store.commitlog.files
    for _, info in indexed_records(files, first, files.max_offset()):
        fresh.dispatch(info)
        count += 1
    fresh.commit_dispatch()
    fresh.flush()
    return fresh, {"from_offset": first, "records": count, "removed_files": removed}


# -- reading one record ----------------------------------------------------------------------


def _is_record_start(mf: MappedFile, rel: int) -> bool:
    """Do the segment's records, followed by size from its start, reach position ``rel``?"""
    pos, limit = 0, mf.read_position
    while pos <= rel:
        walk = codec.walk_records(mf.buffer, pos, rel + 1, limit)
        positions = walk.positions
        if (len(positions) and int(positions[-1]) == rel) or walk.stop == rel:
            return True
        if walk.reason != "corrupt" or walk.stop > rel:
            return False
        nxt = _resync(mf, walk.stop + 1, limit)
        if nxt is None:
            return False
        pos = nxt
    return False


def record_problem_at(store: StoreParts, phys: int, *, known_start: bool = False) -> str | None:
    """Why the record at CommitLog offset ``phys`` cannot be read, or None if it reads fine or
    no record starts there. ``known_start``: ``phys`` comes from an index or a ConsumeQueue,
    so it is a record start unless those are damaged too; otherwise the segment is walked from
    its start to make sure before calling a record corrupt."""
    commitlog = store.commitlog
    rec = store.recovery
    if phys >= commitlog.max_offset:
        if rec is not None and rec.problem is not None and phys >= rec.end_offset:
            return (f"CommitLog offset {phys} lies after the point where recovery cuts the log "
                    f"({rec.problem})")
        return None
    if phys < commitlog.min_offset:
        return (f"CommitLog offset {phys} is below the log's first offset "
                f"{commitlog.min_offset}: clean-up removed it")
    mf = commitlog.files.find_by_offset(phys)
    if mf is None or not mf.hold():
        return None
    try:
        rel = phys - mf.file_from_offset
        try:
            codec.check_record(mf.buffer, rel, mf.read_position, phys, True)
        except RecordCorrupt as exc:
            if known_start or _is_record_start(mf, rel):
                return f"the record at CommitLog offset {phys} is corrupt: {exc.reason}"
        return None
    finally:
        mf.release()


# -- verify ----------------------------------------------------------------------------------
