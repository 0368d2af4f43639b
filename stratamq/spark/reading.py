"""Reading splits on Spark executors: segment files mapped read-only, Arrow batches out.

Nothing here takes the store lock or writes a byte, so it reads a directory a running broker
(StrataMQ's or Apache RocketMQ's) is writing, a copy of one, or one on a shared mount.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stratamq import record as codec
from stratamq.spark.planning import LogSplit, QueueSplit, store_type_of
from stratamq.spark.rows import records_to_batch
from stratamq.store.consume_queue import ConsumeQueue
from stratamq.store.consume_queue_format import UNIT_SIZE, is_blank_unit
from stratamq.store.consume_queue_store import (
    STORE_TYPE_ROCKSDB,
    ConsumeQueueHandle,
    open_consume_queue_store,
)
from stratamq.store.layout import StoreLayout, parse_segment_name, segment_name
from stratamq.store.mapped_file_queue import MappedFileQueue

log = logging.getLogger(__name__)

BATCH_BYTES = 8 * 1024 * 1024  # CommitLog bytes per Arrow batch (~25k records of 300 B)
BATCH_ROWS = 8192  # records per Arrow batch when reading through a ConsumeQueue


class DataLoss(RuntimeError):
    """Messages an offset range covers are gone (deleted by retention) and failOnDataLoss."""


class Segments:
    """Read-only maps of CommitLog segments, opened on first use and closed together."""

    def __init__(self, root: str) -> None:
        self.dir = StoreLayout(root).commitlog_dir
        self.size = MappedFileQueue.size_on_disk(self.dir) or 0
        self._maps: dict[int, mmap.mmap] = {}

    def get(self, start: int) -> mmap.mmap | None:
        m = self._maps.get(start)
        if m is None:
            try:
                fd = os.open(self.dir / segment_name(start), os.O_RDONLY)
            except FileNotFoundError:
                return None
            try:
                if os.fstat(fd).st_size == 0:
                    return None  # an empty file holds no records (and cannot be mapped)
                m = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
            finally:
                os.close(fd)
            self._maps[start] = m
        return m

    def close(self) -> None:
        for m in self._maps.values():
            with contextlib.suppress(BufferError):  # an Arrow view is alive: the GC unmaps it
                m.close()
        self._maps.clear()


WALK_BYTES = 64 * 1024 * 1024  # CommitLog bytes per bulk walk when finding where records end
TAIL_CRC_RECORDS = 256  # the last records whose body CRCs are checked (a write may be under way)
TAIL_WINDOW = 8 * 1024 * 1024  # bytes before the last non-zero byte where the tail walk starts
ZERO_SCAN_BYTES = 4 * 1024 * 1024  # bytes per step of the backward scan for the data's end


def log_bounds(root: str) -> tuple[int, int]:
    """(min, end) of the CommitLog's records: the first segment's start, and where records stop
    in the last segment holding any, found by a bulk walk of that segment's tail (read-only, no
    store lock).

    A store open would find the same end by recovery, but recovery walks record by record and
    CRC-checks every body: seconds per GiB on every query. Here the walk uses sizes and magic
    codes (like every split reader), and only the last ``TAIL_CRC_RECORDS`` records, where a
    broker's write can be under way, have their bodies CRC-checked; the end is cut before the
    first that fails. Segments after it that hold no record (the store creates the next segment
    before it is needed) are not the end.

    The walk starts ``TAIL_WINDOW`` bytes before the segment's last non-zero byte (at the first
    record found there by its stored offset), not at the segment's start: walking a whole 1 GiB
    segment cost the driver 1.5 s of CPU on every query, before any task could start. Records
    before the window are checked by the tasks that read them (a damaged record or zeros where
    records should be fail the read naming the offset, as in any other segment).

    A bad record with valid records after it is damage, not a write under way: RecordCorrupt,
    naming its CommitLog offset and file, rather than a read that silently stops there.
    """
    directory = StoreLayout(root).commitlog_dir
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return 0, 0
    starts = sorted(s for name in names if (s := parse_segment_name(name)) is not None)
    if not starts:
        return 0, 0
    segments = Segments(root)
    try:
        for last in reversed(starts):
            buf = segments.get(last)
            if buf is not None and buf[:8] != bytes(8):  # a record (or a blank) at its start
                break
        else:
            return starts[0], starts[0]  # no segment holds a record yet
        data_end = _data_end(buf)
        window = TAIL_WINDOW
        while True:
            pos = _record_at_or_after(buf, data_end - window, last)
            end, tail, walk = _walk_to_end(buf, pos)
            if pos == 0 or len(tail) >= TAIL_CRC_RECORDS:
                break
            window *= 4  # too few records in the window for the tail check: look further back
        if walk.reason == "corrupt":
            _fail_if_followed(buf, last, end, segments, "not a record")
        for k, at in enumerate(tail.tolist()):
            try:
                codec.check_record(buf, at, end, last + at, True)
            except codec.RecordCorrupt as exc:
                if any(_whole(buf, later, end, last) for later in tail.tolist()[k + 1:]):
                    raise codec.RecordCorrupt(last + at, f"in {segments.dir}/"
                                              f"{segment_name(last)}: {exc.reason}; whole "
                                              "records follow it") from None
                end = at
                break
        return starts[0], last + end
    finally:
        segments.close()


def _data_end(buf) -> int:
    """One past the segment's last non-zero byte (0 if all zero): the store pre-allocates
    segments with zeros, so the records end at or before it. Scanned backwards in steps, so a
    full segment costs one step."""
    data = np.frombuffer(buf, dtype=np.uint8)
    hi = len(data)
    while hi > 0:
        lo = max(0, hi - ZERO_SCAN_BYTES)
        nonzero = np.flatnonzero(data[lo:hi])
        if len(nonzero):
            return lo + int(nonzero[-1]) + 1
        hi = lo
    return 0


def _record_at_or_after(buf, pos: int, file_from_offset: int) -> int:
    """Where the tail walk starts: 0 if ``pos`` is at or before the start, else the first record
    at or after ``pos`` confirmed by its stored offset (0 if none: then the whole segment)."""
    if pos <= 0:
        return 0
    found = codec.resync(buf, pos, len(buf), file_from_offset)
    return 0 if found is None else found


def _walk_to_end(buf, pos: int) -> tuple[int, np.ndarray, codec.Walk]:
    """Walks from the record at ``pos`` to where records stop: (that position, the positions of
    the last ``TAIL_CRC_RECORDS`` records, the last walk)."""
    tail = np.empty(0, dtype=np.int64)
    while True:
        walk = codec.walk_records(buf, pos, pos + WALK_BYTES, len(buf))
        if len(walk.positions):
            tail = np.concatenate([tail, walk.positions])[-TAIL_CRC_RECORDS:]
        if walk.reason != "end" or walk.stop >= len(buf):
            return walk.stop, tail, walk
        pos = walk.stop


def _whole(buf, at: int, end: int, file_from_offset: int) -> bool:
    try:
        codec.check_record(buf, at, end, file_from_offset + at, True)
        return True
    except codec.RecordCorrupt:
        return False


def _fail_if_followed(buf, base: int, at: int, segments: Segments, what: str) -> None:
    """RecordCorrupt if a record confirmed by its stored offset starts after ``at``: the bytes
    at ``at`` are damage in the log, not the end of what has been written."""
    after = codec.resync(buf, at + 1, len(buf), base)
    if after is not None:
        raise codec.RecordCorrupt(base + at, f"in {segments.dir}/{segment_name(base)}: {what}; "
                                  f"records go on from {base + after}")


def read_log_split(split: LogSplit) -> Iterator[pa.RecordBatch]:
    exclude = pa.array(sorted(split.exclude), pa.string()) if split.exclude else None
    for segments, base, buf, positions in walk_log_split(split):
        batch = _located(segments, base, buf, positions)
        if exclude is not None:
            batch = batch.filter(pc.invert(pc.is_in(batch.column("topic"), value_set=exclude)))
        yield batch


def walk_log_split(split: LogSplit
                   ) -> Iterator[tuple[Segments, int, mmap.mmap, Sequence[int]]]:
    """The records of a CommitLog byte range, a batch (``BATCH_BYTES``) at a time: (segments,
    segment start, the segment's map, positions of the records in it). A record belongs to the
    range where it starts; damage is raised as ``RecordCorrupt`` naming the offset and file,
    a missing segment as ``DataLoss`` (or a warning with ``failOnDataLoss`` false). The map is
    valid until the next item is asked for."""
    if split.start >= split.end:
        return
    segments = Segments(split.root)
    try:
        buf = segments.get(split.segment_start)
        if buf is None:
            text = (f"CommitLog segment {segment_name(split.segment_start)} is gone (or empty): "
                    f"records at CommitLog offsets [{split.start}, {split.end}) cannot be read")
            if split.fail_on_data_loss:
                raise DataLoss(text + ". Set failOnDataLoss=false to skip them with a warning.")
            log.warning("%s (skipped: failOnDataLoss=false)", text)
            return
        base = split.segment_start
        limit = min(len(buf), split.limit - base)
        pos = split.start - base
        if pos > 0:
            found = codec.resync(buf, pos, limit, base)
            if found is None:
                return
            pos = found
        end = split.end - base
        while pos < end:
            walk = codec.walk_records(buf, pos, min(end, pos + BATCH_BYTES), limit)
            if len(walk.positions):
                yield segments, base, buf, walk.positions
            if walk.reason == "corrupt":
                raise codec.RecordCorrupt(base + walk.stop, f"in {segments.dir}/"
                                          f"{segment_name(base)}: not a record")
            if walk.reason == "zero" and walk.stop < limit:
                # Zeros before the data's end (planning saw records past here): a lost write.
                raise codec.RecordCorrupt(base + walk.stop, f"in {segments.dir}/"
                                          f"{segment_name(base)}: zero bytes where a record "
                                          f"should be (the log goes on to {base + limit})")
            if walk.reason != "end":
                break  # blank record (segment complete) or the end of the data
            pos = walk.stop
    finally:
        segments.close()


def _located(segments: Segments, base: int, buf, positions, where: str = "") -> pa.RecordBatch:
    """``records_to_batch``, with a RecordCorrupt it raises (positions in the segment's
    buffer) turned into one naming the CommitLog offset, the file and ``where`` (topic/queue)."""
    try:
        return records_to_batch(buf, positions, base)
    except codec.RecordCorrupt as exc:
        raise codec.RecordCorrupt(base + exc.position, f"in {segments.dir}/{segment_name(base)}"
                                  f"{where}: {exc.reason}") from None


@contextlib.contextmanager
def _open_queue(split: QueueSplit) -> Iterator[tuple[ConsumeQueueHandle | None, int]]:
    """The split's queue, read-only, and its first offset still on disk (``split.end`` if the
    queue is empty); None if the store has no such queue any more.

    A file queue is opened alone, not the whole store: a task reads one queue of perhaps
    thousands. A RocksDB store is opened read-only beside the broker that writes it; it shows
    what the broker has flushed to SST files (its WAL is off: the CommitLog is the log).
    """
    layout = StoreLayout(split.root)
    if store_type_of(split.root) == STORE_TYPE_ROCKSDB:
        store = open_consume_queue_store(STORE_TYPE_ROCKSDB, layout, 0, read_only=True)
        store.load()
        try:
            cq = store.find(split.topic, split.queue_id)
            yield cq, (cq.min_offset() if cq is not None and cq.max_offset() else split.end)
        finally:
            store.close()
        return
    directory = layout.consume_queue_dir(split.topic, split.queue_id)
    size = MappedFileQueue.size_on_disk(directory)
    if size is None:
        yield None, split.end
        return
    queue = ConsumeQueue(split.topic, split.queue_id, Path(directory), size, read_only=True)
    queue.load()
    try:
        yield queue, (queue.files.min_offset() // UNIT_SIZE if queue.files.files else split.end)
    finally:
        queue.close()


def read_queue_split(split: QueueSplit) -> Iterator[pa.RecordBatch]:
    with _open_queue(split) as (cq, first):
        if cq is None:
            _lost(split, split.start, split.end, "its ConsumeQueue is gone")
            return
        yield from _read_queue(split, cq, first)


def _read_queue(split: QueueSplit, cq: ConsumeQueueHandle, first: int) -> Iterator[pa.RecordBatch]:
    segments = Segments(split.root)
    try:
        start = split.start
        if start < first:
            _lost(split, start, min(first, split.end), "retention deleted them")
            start = min(first, split.end)
        offset = start
        while offset < split.end:
            units = cq.get_units(offset, min(BATCH_ROWS, split.end - offset))
            if not units:
                raise DataLoss(f"{split.topic}/{split.queue_id}: ConsumeQueue ends at {offset}, "
                               f"before {split.end}")
            yield from _units_to_batches(split, segments, offset, units)
            offset += len(units)
    finally:
        segments.close()


def _units_to_batches(split: QueueSplit, segments: Segments, first_offset: int,
                      units: list[tuple[int, int, int]]) -> Iterator[pa.RecordBatch]:
    """Records the units point at, grouped by segment, with each record checked against its
    unit (topic, queue and queue offset) so a stale ConsumeQueue is caught, not believed."""
    seg_size = segments.size
    if not seg_size:  # no CommitLog segment at all: every record the units point at is gone
        _lost(split, first_offset, first_offset + len(units), "the CommitLog has no segments")
        return
    run: list[int] = []
    expected: list[int] = []
    run_seg = -1
    for queue_offset, (phys, _size, code) in enumerate(units, first_offset):
        if is_blank_unit(phys, _size, code):
            continue
        seg = phys - phys % seg_size
        if seg != run_seg and run:
            yield from _batch(split, segments, run_seg, run, expected)
            run, expected = [], []
        run_seg = seg
        run.append(phys - seg)
        expected.append(queue_offset)
    if run:
        yield from _batch(split, segments, run_seg, run, expected)


def _batch(split: QueueSplit, segments: Segments, seg: int, positions: list[int],
           expected: list[int]) -> Iterator[pa.RecordBatch]:
    buf = segments.get(seg)
    if buf is None:
        _lost(split, expected[0], expected[-1] + 1, f"CommitLog segment {segment_name(seg)} "
              "was deleted")
        return
    batch = _located(segments, seg, buf, positions,
                     f" (ConsumeQueue {split.topic}/{split.queue_id})")
    if batch.num_rows != len(positions):  # a unit pointing at a non-message
        raise codec.RecordCorrupt(seg + positions[0], "ConsumeQueue unit points at a "
                                  "prepared or rolled-back transactional record")
    if batch.num_rows and not pc.all(pc.equal(batch.column("topic"), split.topic)).as_py():
        raise codec.RecordCorrupt(seg + positions[0], f"ConsumeQueue {split.topic}/"
                                  f"{split.queue_id} points at records of another topic")
    offsets = batch.column("queue_offset").to_numpy()
    qids = batch.column("queue_id").to_numpy()
    if not (np.array_equal(offsets, expected) and (qids == split.queue_id).all()):
        bad = int(np.flatnonzero((offsets != expected) | (qids != split.queue_id))[0])
        raise codec.RecordCorrupt(seg + positions[bad], f"ConsumeQueue {split.topic}/"
                                  f"{split.queue_id} offset {expected[bad]} points at a record "
                                  f"of queue {qids[bad]} offset {offsets[bad]}")
    yield batch


def _lost(split: QueueSplit, start: int, end: int, why: str) -> None:
    text = (f"{split.topic}/{split.queue_id}: messages at offsets [{start}, {end}) cannot be "
            f"read: {why}. Set failOnDataLoss=false to skip them with a warning.")
    if split.fail_on_data_loss:
        raise DataLoss(text)
    log.warning("%s (skipped: failOnDataLoss=false)", text)
