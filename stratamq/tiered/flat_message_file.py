"""``FlatMessageFile`` (one queue in the tier: its CommitLog and ConsumeQueue files) and
``FlatFileStore`` (every queue's, by topic and queue id). RocketMQ's ``FlatMessageFile`` and
``FlatFileStore``.

This is also the writer API an offline job uses to build a tier: ``FlatFileStore(...)``,
``computeIfAbsent``-style ``get_or_create(topic, queue_id)``, then per queue
``append_message(record, queue_offset, tags_code, store_timestamp)`` for each record in queue
order, ``commit()``, and ``metadata.persist()`` at the end (see docs/formats/tier-layout.md).

Recovery (``recover``, before the first append after a start): the metadata may lag the tier
after a crash, so the last segment of each file takes its size from the tier; a torn tail is
cut; records the CommitLog file holds past the last ConsumeQueue unit (a crash between the two
uploads) get their units rebuilt from the records themselves, so nothing is uploaded twice.

Thread-safety: ``file_lock`` serialises the uploader's work on one queue (append, commit,
recover, expiry); readers use the flat files' snapshots and need no lock.
"""

from __future__ import annotations

import logging
import struct
import threading
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np

from stratamq import record as codec
from stratamq.store.consume_queue_format import UNIT_SIZE
from stratamq.tiered.batch import Batch, be_ints
from stratamq.tiered.drivers import AppendResult, FileSegmentFactory, TierIOError
from stratamq.tiered.drivers.base import NO_TIMESTAMP
from stratamq.tiered.flat_file import UNIT_DTYPE, FlatCommitLogFile, FlatConsumeQueueFile
from stratamq.tiered.metadata import MetadataStore, QueueMetadata, TopicMetadata
from stratamq.tiered.naming import queue_file_path
from stratamq.tiered.read_damage import BlockChecks

__all__ = ["FlatFileStore", "FlatMessageFile", "RecordBlock", "TierRecord"]

log = logging.getLogger(__name__)

_QUEUE_OFFSET = struct.Struct(">q")


HEADER_PEEK = 128  # bytes of a record that hold every header field up to the store time


class TierRecord(NamedTuple):
    queue_offset: int
    flat_offset: int  # in the queue's tier CommitLog
    tags_code: int
    data: memoryview  # the whole record, as stored locally (a view of one ranged read)


class RecordBlock(NamedTuple):
    """Consecutive records from queue offset ``start``: record ``i`` is
    ``buffer[starts[i]:starts[i] + sizes[i]]`` (one ranged read's buffer), with tags code
    ``codes[i]``, original CommitLog offset ``physical[i]`` and tier CommitLog offset
    ``flat_offsets[i]``. Parallel lists, not an object per record: a block holds thousands.
    ``checks``: the reader's checks of the records (``read_damage.BlockChecks``), if any."""

    start: int
    buffer: memoryview
    starts: list[int]
    sizes: list[int]
    codes: list[int]
    physical: list[int]
    flat_offsets: list[int]
    checks: BlockChecks | None = None

    @property
    def length(self) -> int:
        return len(self.sizes)

    @property
    def end(self) -> int:
        return self.start + len(self.sizes)

    @property
    def nbytes(self) -> int:
        return len(self.buffer)


class FlatMessageFile:
    """One topic/queue in the tier."""

    def __init__(self, factory: FileSegmentFactory, metadata: MetadataStore, broker: str,
                 topic: str, queue_id: int, *, read_only: bool = False) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.file_path = queue_file_path(broker, topic, queue_id)
        self.metadata = metadata
        self.read_only = read_only
        topic_meta = metadata.get_topic(topic)
        queue_meta = metadata.get_queue(topic, queue_id)
        if not read_only:
            topic_meta = topic_meta or metadata.add_topic(topic)
            queue_meta = queue_meta or metadata.add_queue(topic, broker, queue_id)
        self.topic_meta: TopicMetadata | None = topic_meta
        self.queue_meta: QueueMetadata | None = queue_meta
        self.factory = factory
        self.commit_log = FlatCommitLogFile(factory, metadata, self.file_path)
        self.consume_queue = FlatConsumeQueueFile(factory, metadata, self.file_path)
        self.file_lock = threading.RLock()
        self.recovered = False
        self.closed = False
        # (CL min offset, queue offset of its first record), read once per CommitLog head;
        # seeded from the metadata (its minOffset was computed for the head it recorded).
        self._first_queue_offset: tuple[int, int] | None = None
        if queue_meta is not None and queue_meta.minOffset >= 0 and self.commit_log.segments:
            self._first_queue_offset = (self.commit_log.min_offset, queue_meta.minOffset)

    @property
    def topic_id(self) -> int:
        return self.topic_meta.topicId if self.topic_meta is not None else -1

    # -- offsets -------------------------------------------------------------------------------

    def is_init(self) -> bool:
        return bool(self.consume_queue.segments)

    @property
    def commit_offset(self) -> int:
        """The queue offset after the last unit in the tier (the tier's max offset)."""
        return self.consume_queue.commit_queue_offset

    @property
    def append_offset(self) -> int:
        return self.consume_queue.append_queue_offset

    def min_offset(self) -> int:
        """The first queue offset the tier still serves: past expired ConsumeQueue files and
        past units whose records expired (``getConsumeQueueMinOffset``)."""
        low = self.consume_queue.min_queue_offset
        first = self.first_message_offset()
        return max(low, first) if first is not None else low

    def first_message_offset(self) -> int | None:
        """The queue offset of the first record the tier's CommitLog holds (read from its
        header once per CommitLog head)."""
        cl_min = self.commit_log.min_offset
        cached = self._first_queue_offset
        if cached is not None and cached[0] == cl_min:
            return cached[1]
        if self.commit_log.commit_offset - cl_min < codec.QUEUE_OFFSET_POS + 8:
            return None
        try:
            head = self.commit_log.read(cl_min, codec.QUEUE_OFFSET_POS + 8)
        except OSError as exc:
            log.warning("tier queue %s: cannot read its first record: %s", self.file_path, exc)
            return None
        queue_offset = _QUEUE_OFFSET.unpack_from(head, codec.QUEUE_OFFSET_POS)[0]
        self._first_queue_offset = (cl_min, queue_offset)
        return queue_offset

    def min_store_timestamp(self) -> int:
        ts = self.commit_log.min_timestamp
        return -1 if ts == NO_TIMESTAMP else ts

    def committed_bytes(self) -> int:
        return self.commit_log.committed_bytes() + self.consume_queue.committed_bytes()

    # -- writing (the uploader, under file_lock) ---------------------------------------------

    def init_offset(self, queue_offset: int, *, persist: bool = True) -> None:
        """Start the queue's files, its first record at ``queue_offset``: both recorded in
        the metadata, persisted once, before anything is uploaded (``persist=False``: the
        caller persists before any upload, once for several queues)."""
        known_new = self.factory.queue_absent(self.file_path)
        self.commit_log.init_offset(0, known_new=known_new, persist=False)
        self.consume_queue.init_offset(queue_offset * UNIT_SIZE, known_new=known_new,
                                       persist=False)
        if persist:
            self.metadata.persist()
        if self.commit_log.commit_offset == 0:
            self._first_queue_offset = (0, queue_offset)

    def append_message(self, record: bytes, queue_offset: int, tags_code: int,
                       store_timestamp: int) -> AppendResult:
        """Buffer one record and its unit. ``queue_offset`` must be the next one, or past a
        gap after a commit (the ConsumeQueue then starts a new segment there)."""
        if self.closed:
            return AppendResult.FILE_CLOSED
        if not self.is_init():
            self.init_offset(queue_offset)
        elif queue_offset != self.append_offset:
            self.consume_queue.resume_at(queue_offset)
        result = self.commit_log.append(record, store_timestamp)
        if result is not AppendResult.SUCCESS:
            return result
        flat_offset = self.commit_log.append_offset - len(record)
        return self.consume_queue.append_unit(flat_offset, len(record), tags_code,
                                              store_timestamp)

    def append_batch(self, batch: list[tuple[int, bytes, int, int]]) -> list[int]:
        """Buffer consecutive records (queue offset, record, tags code, store time) and their
        units; returns the records' flat CommitLog offsets, fewer than the batch when a full
        file could not be committed before rolling over (``append_block`` of a list)."""
        if not batch:
            return []
        block = Batch.of(batch[0][0], [r for _q, r, _c, _t in batch],
                         [c for _q, _r, c, _t in batch])
        return self.append_block(block).tolist()

    def append_block(self, batch: Batch) -> np.ndarray:
        """Buffer a batch of consecutive records and their units, a file's worth at a time
        (one buffer per file, the units packed with numpy); returns the flat CommitLog offsets
        of the records taken, fewer than the batch when a full file could not be committed
        before rolling over."""
        n = len(batch)
        if self.closed or not n:
            return np.empty(0, dtype=np.int64)
        first = batch.first
        if not self.is_init():
            self.init_offset(first)
        elif first != self.append_offset:
            self.consume_queue.resume_at(first)
        cl, cq = self.commit_log, self.consume_queue
        data, sizes = memoryview(batch.data), batch.sizes
        offsets = np.empty(n, dtype=np.int64)
        done = 0
        while done < n:
            cl_room = cl.segments[-1].room()
            cq_room = cq.segments[-1].room() // UNIT_SIZE
            ends = np.cumsum(sizes[done:])
            take = min(cq_room, int(np.searchsorted(ends, cl_room, side="right")))
            if take == 0:  # a file is full: commit it and start the next
                size = int(sizes[done])
                if cl.segments[-1].append_position == 0 and cq_room:
                    raise TierIOError(f"tier queue {self.file_path}: a record of {size} bytes "
                                      "is larger than tieredStoreCommitLogMaxSize")
                for flat, full in ((cl, cl_room < size), (cq, cq_room < 1)):
                    if not full:
                        continue
                    last = flat.segments[-1]
                    if not flat.commit():
                        return offsets[:done]
                    flat.roll(last.append_offset)
                continue
            base = cl.append_offset
            stop = done + take
            at = int(batch.starts[done])
            end = at + int(ends[take - 1])
            offsets[done:stop] = base + (batch.starts[done:stop] - at)
            units = np.empty(take, dtype=UNIT_DTYPE)
            units["offset"] = offsets[done:stop]
            units["size"] = sizes[done:stop]
            units["code"] = batch.codes[done:stop]
            # Store times grow along the log: a part's first and last record bound it.
            low = codec.record_store_timestamp(data, at)
            high = codec.record_store_timestamp(data, int(batch.starts[stop - 1]))
            low, high = min(low, high), max(low, high)
            # The whole batch in one file (the usual case): its buffer as it is, not a copy.
            records = batch.data if at == 0 and end == len(batch.data) and \
                isinstance(batch.data, bytes) else data[at:end]
            if cl.segments[-1].append(records, low, high) is not AppendResult.SUCCESS or \
                    cq.segments[-1].append(units.tobytes(), low, high) \
                    is not AppendResult.SUCCESS:
                raise TierIOError(f"tier queue {self.file_path}: append refused")
            done = stop
        return offsets

    def commit(self) -> bool:
        """CommitLog data first, then the units pointing into it (RocketMQ's order): a unit
        in the tier always points at a record in the tier."""
        if not self.commit_log.commit():
            return False
        if not self.consume_queue.commit():
            return False
        self.flush_metadata()
        return True

    def flush_metadata(self) -> None:
        meta = self.queue_meta
        if meta is not None and not self.read_only:
            meta.minOffset = self.min_offset()
            meta.maxOffset = self.commit_offset
            self.metadata.update_queue(meta)

    def try_rolling(self, interval_ms: int, minimum_size: int, now_ms: int) -> bool:
        return self.commit_log.try_rolling(interval_ms, minimum_size, now_ms)

    def recover(self) -> list[str]:
        """Reconcile with the tier after a start (see the module docstring); returns what was
        corrected, for the log. Raises TierIOError when the tier cannot be reached."""
        notes = []
        with self.file_lock:
            for flat in (self.commit_log, self.consume_queue):
                changed = flat.check_last_size()
                if changed is not None:
                    notes.append(f"{flat.file_type.name} {changed[0]} -> {changed[1]} bytes")
            cq = self.consume_queue
            if cq.segments and cq.segments[-1].commit_position % UNIT_SIZE:
                last = cq.segments[-1]
                cut = last.commit_position - last.commit_position % UNIT_SIZE
                cq.truncate_last(cut)
                notes.append(f"cut a torn ConsumeQueue unit at {cut}")
            notes.extend(self._units_from_commit_log())
            self.flush_metadata()
            self.recovered = True
        return notes

    def _units_from_commit_log(self) -> list[str]:
        """Units for the records the tier's CommitLog holds past the last unit."""
        cl, cq = self.commit_log, self.consume_queue
        if not cl.segments:
            return []
        end = cl.commit_offset
        covered = cl.min_offset
        if cq.commit_queue_offset > cq.min_queue_offset:
            flat, size, _code = cq.read_units(cq.commit_queue_offset - 1, 1)[0]
            covered = flat + size
            if covered > end:  # units past the CommitLog's end: they cannot be served
                raise TierIOError(f"tier queue {self.file_path}: its ConsumeQueue points to "
                                  f"{covered}, past its CommitLog's end {end}")
        if covered >= end:
            return []
        data = cl.read(covered, end - covered)
        pos = rebuilt = 0
        while pos < len(data):
            try:
                size = codec.check_record(data, pos, len(data), covered + pos, check_crc=False)
                if size <= 0:
                    raise codec.RecordCorrupt(covered + pos, "blank or empty record")
                info = codec.decode_dispatch_info(data, pos)
            except (codec.RecordCorrupt, struct.error, ValueError) as exc:
                cl.truncate_last(covered + pos - cl.segments[-1].base_offset)
                log.warning("tier queue %s: cut a torn CommitLog tail at %d: %s",
                            self.file_path, covered + pos, exc)
                break
            ts = info.store_timestamp
            if not cq.segments:
                cq.init_offset(info.queue_offset * UNIT_SIZE)
            elif info.queue_offset != cq.append_queue_offset:
                cq.resume_at(info.queue_offset)
            cq.append_unit(covered + pos, size, info.tags_code, ts)
            pos += size
            rebuilt += 1
        if rebuilt and not cq.commit():
            raise TierIOError(f"tier queue {self.file_path}: cannot upload the rebuilt units")
        return [f"rebuilt {rebuilt} ConsumeQueue units from the CommitLog"] if rebuilt else []

    # -- reading -------------------------------------------------------------------------------

    def units(self, queue_offset: int, count: int) -> list[tuple[int, int, int]]:
        return self.consume_queue.read_units(queue_offset, count)

    def records(self, queue_offset: int, max_count: int, max_bytes: int) -> list[TierRecord]:
        """``read_block`` as one ``TierRecord`` per record."""
        block = self.read_block(queue_offset, max_count, max_bytes)
        if block is None:
            return []
        buf = block.buffer
        return [TierRecord(block.start + i, flat, code, buf[at : at + size])
                for i, (flat, code, at, size) in enumerate(zip(
                    block.flat_offsets, block.codes, block.starts, block.sizes, strict=True))]

    def read_block(self, queue_offset: int, max_count: int, max_bytes: int) -> RecordBlock | None:
        """Records from ``queue_offset`` (committed, in one run of units): one ranged read of
        units, then one of the CommitLog span they cover (at least one record, at most
        ``max_bytes`` beyond the first); None when there is none. Units and the records'
        fields are read with numpy: nothing is done per record here."""
        end = self.consume_queue.segment_end_queue_offset(queue_offset)
        count = min(max_count, end - queue_offset)
        if count <= 0:
            return None
        units = self.consume_queue.read_unit_table(queue_offset, count)
        if not len(units):
            return None
        flat = units["offset"].astype(np.int64)
        sizes = units["size"].astype(np.int64)
        first = int(flat[0])
        keep = max(1, int(np.searchsorted(flat + sizes - first, max_bytes, side="right")))
        span_end = int(flat[keep - 1] + sizes[keep - 1])
        data = self.commit_log.read(first, span_end - first)
        starts = flat[:keep] - first
        # The CommitLog read stops early at the end of what is committed.
        keep = int(np.searchsorted(starts + sizes[:keep], len(data), side="right"))
        if keep == 0:
            return None
        starts = starts[:keep]
        physical = be_ints(np.frombuffer(data, dtype=np.uint8),
                           starts + codec.PHYSICAL_OFFSET_POS, 8)
        return RecordBlock(queue_offset, memoryview(data), starts.tolist(),
                           sizes[:keep].tolist(), units["code"][:keep].tolist(),
                           physical.tolist(), flat[:keep].tolist())

    def record_at(self, queue_offset: int) -> bytes | None:
        units = self.units(queue_offset, 1)
        if not units:
            return None
        flat, size, _ = units[0]
        return self.commit_log.read(flat, size)

    def store_time_at(self, queue_offset: int) -> int:
        flat, size, _ = self.units(queue_offset, 1)[0]
        head = self.commit_log.read(flat, min(size, HEADER_PEEK))
        return codec.record_store_timestamp(head, 0)

    def offset_by_time(self, timestamp: int) -> int | None:
        """The first queue offset the tier holds stored at or after ``timestamp``; None when
        every message it holds is older (RocketMQ's ``getQueueOffsetByTimeAsync``, LOWER)."""
        low, high = self.min_offset(), self.commit_offset - 1
        if high < low:
            return None
        # Narrow to the ConsumeQueue file by its time range first (one file of many).
        for segment in self.consume_queue.segments:
            seg_low = max(low, segment.base_offset // UNIT_SIZE)
            seg_high = segment.commit_offset // UNIT_SIZE - 1
            if seg_high < seg_low:
                continue
            if segment.max_timestamp != NO_TIMESTAMP and segment.max_timestamp < timestamp:
                continue
            if self.store_time_at(seg_high) < timestamp:
                continue
            lo, hi = seg_low, seg_high
            while lo < hi:
                mid = (lo + hi) // 2
                if self.store_time_at(mid) < timestamp:
                    lo = mid + 1
                else:
                    hi = mid
            return lo
        return None

    def physical_range(self) -> tuple[int, int] | None:
        """Original CommitLog offsets of the first and last record the tier holds."""
        low, high = self.min_offset(), self.commit_offset - 1
        if high < low:
            return None
        first = self.record_at(low)
        last = self.record_at(high)
        if first is None or last is None:
            return None
        return (_QUEUE_OFFSET.unpack_from(first, codec.PHYSICAL_OFFSET_POS)[0],
                _QUEUE_OFFSET.unpack_from(last, codec.PHYSICAL_OFFSET_POS)[0])

    def find_physical(self, physical_offset: int) -> bytes | None:
        """The record whose original CommitLog offset is ``physical_offset`` (a binary search
        over the queue: those offsets grow with the queue offset)."""
        lo, hi = self.min_offset(), self.commit_offset - 1
        while lo <= hi:
            mid = (lo + hi) // 2
            held = self.next_held(mid)
            if held is None or held > hi:
                hi = mid - 1
                continue
            data = self.record_at(held)
            if data is None:
                return None
            phys = _QUEUE_OFFSET.unpack_from(data, codec.PHYSICAL_OFFSET_POS)[0]
            if phys == physical_offset:
                return data
            if phys < physical_offset:
                lo = held + 1
            else:
                hi = mid - 1
        return None

    def next_held(self, queue_offset: int) -> int | None:
        return self.consume_queue.next_held(queue_offset)

    # -- retention -----------------------------------------------------------------------------

    def destroy_expired(self, expire_timestamp: int) -> int:
        """Delete files whose newest message is older than ``expire_timestamp``; returns how
        many went."""
        with self.file_lock:
            gone = len(self.consume_queue.destroy_expired(expire_timestamp))
            gone += len(self.commit_log.destroy_expired(expire_timestamp))
            if gone:
                self.flush_metadata()
            return gone

    def destroy(self) -> None:
        with self.file_lock:
            self.closed = True
            self.factory.forget_topic(self.file_path)
            self.consume_queue.destroy()
            self.commit_log.destroy()
            self.metadata.delete_queue(self.topic, self.queue_id)

    def close(self) -> None:
        self.closed = True
        self.commit_log.close()
        self.consume_queue.close()

    def __repr__(self) -> str:
        return f"FlatMessageFile({self.file_path}, {self.min_offset()}..{self.commit_offset})"


class FlatFileStore:
    """Every queue's ``FlatMessageFile`` (RocketMQ's ``FlatFileStore``).

    Thread-safety: ``get`` / ``get_or_create`` / ``files`` from any thread (the table is
    replaced under a lock, read without one)."""

    def __init__(self, factory: FileSegmentFactory, metadata: MetadataStore, broker: str,
                 *, read_only: bool = False) -> None:
        self.factory = factory
        self.metadata = metadata
        self.broker = broker
        self.read_only = read_only
        self._lock = threading.Lock()
        self._files: dict[tuple[str, int], FlatMessageFile] = {}

    def load(self) -> None:
        """Every queue the metadata records (no tier access: sizes as last persisted)."""
        files = {}
        for queue in self.metadata.queues():
            files[(queue.topic, queue.queueId)] = FlatMessageFile(
                self.factory, self.metadata, self.broker, queue.topic, queue.queueId,
                read_only=self.read_only)
        with self._lock:
            self._files = files

    def get(self, topic: str, queue_id: int) -> FlatMessageFile | None:
        return self._files.get((topic, queue_id))

    def get_or_create(self, topic: str, queue_id: int) -> FlatMessageFile:
        found = self._files.get((topic, queue_id))
        if found is not None:
            return found
        with self._lock:
            found = self._files.get((topic, queue_id))
            if found is None:
                found = FlatMessageFile(self.factory, self.metadata, self.broker, topic,
                                        queue_id, read_only=self.read_only)
                self._files = {**self._files, (topic, queue_id): found}
            return found

    def files(self) -> list[FlatMessageFile]:
        return list(self._files.values())

    def __iter__(self) -> Iterator[FlatMessageFile]:
        return iter(self.files())

    def topics(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for topic, queue_id in self._files:
            out.setdefault(topic, []).append(queue_id)
        return {t: sorted(q) for t, q in out.items()}

    def destroy_file(self, topic: str, queue_id: int) -> None:
        with self._lock:
            files = dict(self._files)
            flat = files.pop((topic, queue_id), None)
            self._files = files
        if flat is not None:
            flat.destroy()
            log.info("tier queue %s deleted", flat.file_path)

    def destroy_topic(self, topic: str) -> None:
        for t, queue_id in list(self._files):
            if t == topic:
                self.destroy_file(t, queue_id)
        self.metadata.delete_topic(topic)

    def close(self) -> None:
        for flat in self.files():
            flat.close()
