"""``TierFetcher``: the tier as a ``ReadSource`` of the store's read chain (RocketMQ's
``MessageStoreFetcherImpl`` with ``TieredMessageStore``'s read policies).

Reads answer with the records exactly as they were stored locally (the tier CommitLog holds
copies), at the same queue offsets, with the original CommitLog offset inside each record: a
reader cannot tell where a message came from. Policies (``tieredStorageLevel``):

* ``DISABLE``: the tier serves no read (``wire`` does not add the source);
* ``NOT_IN_DISK`` (default): the source is asked after the local one, so it serves only what
  the local store no longer holds;
* ``NOT_IN_MEM``: asked first; serves what it holds unless the local store has the message
  in memory (within ``accessMessageInMemoryMaxRatio`` of physical memory from the CommitLog's
  end, RocketMQ's ``checkInMemByCommitOffset``);
* ``FORCE``: asked first; serves everything it holds.

A read first looks in the read-ahead cache; on a miss it reads up to
``readAheadMessageCountThreshold`` units and the CommitLog span they cover in two ranged reads
and caches them all (``read_ahead.py``). Lookups by key go through the tier index; by
CommitLog offset (an offset message id) through a search of the queues whose range covers it.

Thread-safety: every method from any reading thread.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

from stratamq import record as codec
from stratamq.config import StoreConfig, TieredStorageLevel
from stratamq.message import Prop, StoredMessage
from stratamq.record.copy_check import CopyChecks
from stratamq.store.read_chain import QueueOffsets, ReadRequest
from stratamq.store.results import GetMessageResult, GetMessageStatus, SelectedRecord
from stratamq.tiered.flat_message_file import FlatFileStore, FlatMessageFile
from stratamq.tiered.index_service import IndexStoreService
from stratamq.tiered.metadata import MetadataStore
from stratamq.tiered.read_ahead import Chunk, ReadAheadCache, memory_limit
from stratamq.tiered.read_damage import CHECK_WINDOW, BlockChecks, ReadDamage, find_missing

__all__ = ["LocalView", "TierFetcher"]

log = logging.getLogger(__name__)

# Set to 1, tier reads skip the checks of what they serve: for bench/tier_reads.py's baseline
# broker only, never a setting (nothing a user should turn off).
UNCHECKED_READS_ENV = "STRATAMQ_BENCH_UNCHECKED_TIER_READS"



class LocalView(Protocol):
    """What the fetcher asks of the local store to apply a read policy."""

    def offsets(self, topic: str, queue_id: int) -> tuple[int, int] | None: ...

    def in_memory(self, topic: str, queue_id: int, offset: int) -> bool: ...

    def min_physical_offset(self) -> int: ...

    def max_physical_offset(self) -> int: ...


def _empty(offset: int) -> Chunk:
    return Chunk(offset, memoryview(b""), [], [], [], [], [])


class TierFetcher:
    """The tier's read source (see the module docstring)."""

    name = "tier"

    def __init__(self, config: StoreConfig, files: FlatFileStore, metadata: MetadataStore,
                 index: IndexStoreService | None, local: LocalView | None) -> None:
        self.config = config
        self.policy = TieredStorageLevel(config.tiered_storage_level)
        self.files = files
        self.metadata = metadata
        self.index = index
        self.local = local
        self.cache = ReadAheadCache(
            int(memory_limit() * config.read_ahead_cache_size_threshold_rate),
            config.read_ahead_cache_expire_duration)
        self.tier_reads = 0  # read-aheads (each: a ranged read of units, one of records)
        self._flight_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(2, thread_name_prefix="tier-read-ahead")
        self._closed = False
        self.served = 0  # messages handed to readers
        # Records are checked before they are served (``record.copy_check``); False only for
        # the benchmark's baseline (bench/tier_reads.py; a broker's through the environment).
        self.check_records = os.environ.get(UNCHECKED_READS_ENV) != "1"
        if not self.check_records:
            log.warning("%s=1: tier records are served unchecked (a benchmark's baseline only)",
                        UNCHECKED_READS_ENV)
        self.damage = ReadDamage()
        self._phys_ranges: dict[tuple[str, int], tuple[int, int, int, int]] = {}

    def close(self) -> None:
        with self._flight_lock:
            self._closed = True
        self._pool.shutdown(wait=True)

    @property
    def first(self) -> bool:
        """Whether the source goes before the local one in the read chain."""
        return self.policy in (TieredStorageLevel.NOT_IN_MEM, TieredStorageLevel.FORCE)

    # -- ReadSource ------------------------------------------------------------------------------

    def _flat(self, topic: str, queue_id: int) -> FlatMessageFile | None:
        flat = self.files.get(topic, queue_id)
        return flat if flat is not None and flat.is_init() else None

    def offsets(self, topic: str, queue_id: int) -> QueueOffsets | None:
        flat = self._flat(topic, queue_id)
        if flat is None:
            return None
        low, high = flat.min_offset(), flat.commit_offset
        return QueueOffsets(low, high) if high > low else None

    def _local_holds(self, topic: str, queue_id: int, offset: int) -> bool:
        held = self.local.offsets(topic, queue_id) if self.local is not None else None
        return held is not None and held[0] <= offset < held[1]

    def read(self, request: ReadRequest) -> GetMessageResult | None:
        if self.policy is TieredStorageLevel.DISABLE:
            return None
        topic, queue_id, offset = request.topic, request.queue_id, request.offset
        flat = self._flat(topic, queue_id)
        if flat is None:
            return None
        low, high = flat.min_offset(), flat.commit_offset
        if not low <= offset < high:
            return None
        if self.policy is TieredStorageLevel.NOT_IN_MEM and self.local is not None and \
                self._local_holds(topic, queue_id, offset) and \
                self.local.in_memory(topic, queue_id, offset):
            return None
        held = flat.next_held(offset)
        if held != offset:  # a gap in the tier (local data that expired before upload)
            if self._local_holds(topic, queue_id, offset):
                return None
            return self._result(GetMessageStatus.OFFSET_FOUND_NULL, held or high, low, high,
                                topic, queue_id)
        for _ in range(3):  # each failure that finds lost data narrows the next attempt
            lost = self.damage.missing_at(topic, queue_id, offset)
            if lost is not None:
                return self._over_gap(topic, queue_id, offset, lost[1], low, high)
            try:
                return self._read_records(flat, request, low, high)
            except OSError as exc:
                error = exc
                if not find_missing(flat, offset, self.config.read_ahead_message_count_threshold,
                                    self.damage):
                    break  # the tier holds the data but did not answer: not a gap
        log.warning("tier read of %s/%d at %d failed: %s", topic, queue_id, offset, error)
        if self._local_holds(topic, queue_id, offset):
            return None  # the local copy serves it (RocketMQ's fallback)
        return self._result(GetMessageStatus.OFFSET_FOUND_NULL, offset, low, high, topic,
                            queue_id)

    def _over_gap(self, topic: str, queue_id: int, offset: int, end: int, low: int,
                  high: int) -> GetMessageResult | None:
        """A read at ``offset`` inside data the tier lost, up to ``end``: the local store
        serves it if it still holds it; otherwise RocketMQ's answer for a hole,
        ``OFFSET_FOUND_NULL`` with the next offset past it (or where the local queue starts,
        if that is sooner), so a reader crosses the whole gap in one read."""
        held = self.local.offsets(topic, queue_id) if self.local is not None else None
        if held is not None and held[0] <= offset < held[1]:
            return None
        if held is not None and offset < held[0] < end and held[1] > held[0]:
            end = held[0]
        return self._result(GetMessageStatus.OFFSET_FOUND_NULL, end, low, high, topic, queue_id)

    def _result(self, status: GetMessageStatus, next_offset: int, low: int, high: int,
                topic: str, queue_id: int) -> GetMessageResult:
        # Offsets as the whole store sees them: the local queue may start lower or end higher.
        held = self.local.offsets(topic, queue_id) if self.local is not None else None
        if held is not None and held[1] > held[0]:
            low, high = min(low, held[0]), max(high, held[1])
        return GetMessageResult(status, next_offset, low, high)

    def _load(self, flat: FlatMessageFile, offset: int, count: int) -> Chunk:
        """One read-ahead from the tier (two ranged reads: units, then their records)."""
        chunk = flat.read_block(offset, count, self.config.read_ahead_message_size_threshold)
        self.tier_reads += 1
        if chunk is None:
            return _empty(offset)
        chunk = self._with_checks(chunk)
        self.cache.put(flat.topic, flat.queue_id, chunk)
        return chunk

    def _with_checks(self, block: Chunk) -> Chunk:
        """The block, with the state of its checks (none when checks are off)."""
        return block._replace(checks=BlockChecks(block.length)) if self.check_records \
            else block

    def _check_window(self, flat: FlatMessageFile, block: Chunk, i: int) -> int:
        """Check the window of records holding record ``i`` of the block (once per block:
        readers share the cached block), noting those that fail; returns where the window
        ends. Checked as they are about to be served, a window at a time: the bytes a check
        reads are then still in the CPU's cache when they are served, and a reader that
        takes a few records of a block pays for a window, not for the whole block."""
        checks = block.checks
        if checks is None:
            return block.length
        k = i // CHECK_WINDOW
        first, end = k * CHECK_WINDOW, min(block.length, (k + 1) * CHECK_WINDOW)
        if not checks.done[k]:
            copies = checks.copies
            if copies is None:  # the layout of the whole block is checked at once, CRCs later
                copies = checks.copies = CopyChecks(block.buffer, block.starts, block.sizes,
                                                    flat.topic, flat.queue_id, block.start)
            for j, why in copies.window(first, end).items():
                self.damage.corrupt(flat.topic, flat.queue_id, block.start + j, why,
                                    flat.file_path)
                checks.bad.add(j)
            checks.done[k] = 1
        return end

    def _chunk_at(self, flat: FlatMessageFile, offset: int, count: int) -> Chunk | None:
        """The cached chunk holding ``offset``, read (or waited for, when a read-ahead of it
        is in flight) on a miss."""
        found = self.cache.find(flat.topic, flat.queue_id, offset)
        if found is not None:
            return found
        key = (flat.topic, flat.queue_id, offset)
        with self._flight_lock:
            future = self.cache.in_flight.get(key)
            owner = future is None
            if owner:
                future = self.cache.in_flight[key] = Future()
        assert future is not None
        if not owner:
            chunk = future.result(timeout=120)
            if chunk is None:  # that read-ahead failed: read it here
                chunk = self._load(flat, offset, count)
        else:
            try:
                chunk = self._load(flat, offset, count)
                future.set_result(chunk)
            except BaseException as exc:
                future.set_exception(exc)
                raise
            finally:
                with self._flight_lock:
                    self.cache.in_flight.pop(key, None)
        return chunk if offset < chunk.end else None

    def _prefetch(self, flat: FlatMessageFile, chunk: Chunk, position: int) -> None:
        """Past the middle of a chunk: read the next one in the background."""
        nxt = chunk.end
        if position - chunk.start < chunk.length // 2 or \
                nxt >= flat.consume_queue.segment_end_queue_offset(chunk.start) or \
                self.damage.missing_at(flat.topic, flat.queue_id, nxt) is not None:
            return
        key = (flat.topic, flat.queue_id, nxt)
        with self._flight_lock:
            if key in self.cache.in_flight or self._closed:
                return
            future: Future = Future()
            self.cache.in_flight[key] = future
        count = self.config.read_ahead_message_count_threshold

        def run() -> None:
            try:
                future.set_result(self._load(flat, nxt, count))
            except BaseException as exc:  # the reader that needs it reads it again
                future.set_result(None)
                log.debug("tier read-ahead of %s at %d failed: %s", flat.file_path, nxt, exc)
            finally:
                with self._flight_lock:
                    self.cache.in_flight.pop(key, None)

        self._pool.submit(run)

    def _read_records(self, flat: FlatMessageFile, request: ReadRequest, low: int,
                      high: int) -> GetMessageResult | None:
        """Records from the request's offset (None: the first is corrupt and the local store
        holds it); stops before data the tier is known to have lost."""
        cfg = self.config
        topic, queue_id = flat.topic, flat.queue_id
        filt = request.filter
        use_cache = cfg.read_ahead_cache_enable and not self.cache.busy()
        # Pop consumers read one message at a time, at random: read less ahead for them.
        count = 32 if request.max_count == 1 else cfg.read_ahead_message_count_threshold
        end = flat.consume_queue.segment_end_queue_offset(request.offset)
        lost = self.damage.next_missing(topic, queue_id, request.offset)
        if lost is not None and lost < end:
            end = lost  # the tier lost what follows: read up to it
            count = min(count, end - request.offset)
        result = self._result(GetMessageStatus.NO_MATCHED_MESSAGE, request.offset, low, high,
                              topic, queue_id)
        total = 0
        offset = request.offset
        scan = request.max_count if filt.accepts_all else max(request.max_count, 800)
        chunk: Chunk | None = None
        done = False
        out, max_count, max_bytes = result.records, request.max_count, request.max_bytes
        last = request.offset + scan
        everything = filt.accepts_all
        while not done and offset < end and offset - request.offset < scan:
            if use_cache:
                chunk = self._chunk_at(flat, offset, min(count, end - offset))
            else:
                chunk = flat.read_block(offset, min(max(request.max_count, 1), end - offset),
                                        request.max_bytes)
                self.tier_reads += 1
                if chunk is not None:
                    chunk = self._with_checks(chunk)
            if chunk is None or not chunk.length:
                break
            served = 0
            buf, starts, sizes = chunk.buffer, chunk.starts, chunk.sizes
            codes, physical = chunk.codes, chunk.physical
            bad = chunk.checks.bad if chunk.checks is not None else ()
            checked_to = 0
            for i in range(offset - chunk.start, min(chunk.length, end - chunk.start)):
                size = sizes[i]
                if offset >= last or len(out) >= max_count or (out and total + size > max_bytes):
                    done = True
                    break
                if i >= checked_to:
                    checked_to = self._check_window(flat, chunk, i)
                if bad and i in bad:  # never served: the local copy, else the next record
                    if self._local_holds(topic, queue_id, offset):
                        if offset == request.offset:
                            return None
                        done = True
                        break
                    offset += 1
                    continue
                offset += 1
                served += 1
                at = starts[i]
                if not everything and (not filt.matches_code(codes[i]) or (
                        filt.tags is not None and
                        not filt.matches_tags(codec.record_tags(buf, at)))):
                    continue
                # A view of its own: a result's release() must not release the cache's.
                out.append(SelectedRecord(buf[at : at + size], physical[i], offset - 1))
                total += size
            if use_cache and served > 1:
                self.cache.count_hits(served - 1)
            if not use_cache:
                break
        if use_cache and chunk is not None and chunk.length:
            self._prefetch(flat, chunk, offset)
        result.next_begin_offset = offset
        if result.records:
            result.status = GetMessageStatus.FOUND
            self.served += len(result.records)
        return result

    def offset_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int | None:
        if self.policy is TieredStorageLevel.DISABLE:
            return None
        flat = self._flat(topic, queue_id)
        if flat is None:
            return None
        try:
            return flat.offset_by_time(timestamp_ms)
        except OSError as exc:
            log.warning("tier offset-by-time of %s/%d failed: %s", topic, queue_id, exc)
            return None

    def query_by_key(self, topic: str, key: str, max_num: int, begin_ms: int,
                     end_ms: int) -> list[StoredMessage]:
        if self.index is None or self.policy is TieredStorageLevel.DISABLE or max_num <= 0:
            return []
        meta = self.metadata.get_topic(topic)
        if meta is None:
            return []
        found = []
        for item in self.index.query(topic, key, max_num * 2, begin_ms, end_ms):
            if item.topic_id != meta.topicId:
                continue
            flat = self._flat(topic, item.queue_id)
            if flat is None or item.offset < flat.commit_log.min_offset:
                continue  # its file expired from the tier
            try:
                data = flat.commit_log.read(item.offset, item.size)
                msg = self._decode_checked(flat, data)
            except (OSError, ValueError, struct.error) as exc:
                log.warning("tier index item of %s/%d at %d unreadable: %s", topic,
                            item.queue_id, item.offset, exc)
                continue
            props = msg.properties
            if msg.topic != topic or not begin_ms <= msg.store_timestamp <= end_ms:
                continue
            if props.get(Prop.UNIQ_KEY) != key and key not in props.get(Prop.KEYS, "").split():
                continue  # a hash collision
            found.append(msg)
        found.sort(key=lambda m: (m.store_timestamp, m.physical_offset), reverse=True)
        return found[:max_num]

    def read_by_physical_offset(self, physical_offset: int) -> StoredMessage | None:
        if self.policy is TieredStorageLevel.DISABLE or physical_offset < 0:
            return None
        if self.local is not None and self.local.min_physical_offset() <= physical_offset \
                < self.local.max_physical_offset():
            return None  # in the local CommitLog: the local source answers (history an
            # offload brought from another broker has offsets the local log never had)
        for flat in self.files.files():
            bounds = self._physical_bounds(flat)
            if bounds is None or not bounds[0] <= physical_offset <= bounds[1]:
                continue
            try:
                data = flat.find_physical(physical_offset)
            except OSError as exc:
                log.warning("tier lookup of CommitLog offset %d in %s failed: %s",
                            physical_offset, flat.file_path, exc)
                continue
            if data is not None:
                try:
                    return self._decode_checked(flat, data)
                except (ValueError, struct.error):
                    return None
        return None

    def _decode_checked(self, flat: FlatMessageFile, data: bytes) -> StoredMessage:
        """A record found by a lookup (key, offset message id), decoded once its body matches
        its CRC; a corrupt one is noted (ERROR once) and raises ``RecordCorrupt``."""
        try:
            return codec.decode(data, check_crc=self.check_records)
        except codec.RecordCorrupt as exc:
            if len(data) >= codec.QUEUE_OFFSET_POS + 8:
                queue_offset = codec.record_positions(data, 0)[0]
                self.damage.corrupt(flat.topic, flat.queue_id, queue_offset, exc.reason,
                                    flat.file_path)
            raise

    def _physical_bounds(self, flat: FlatMessageFile) -> tuple[int, int] | None:
        if not flat.is_init():
            return None
        key = (flat.topic, flat.queue_id)
        low, high = flat.min_offset(), flat.commit_offset
        cached = self._phys_ranges.get(key)
        if cached is not None and cached[:2] == (low, high):
            return cached[2], cached[3]
        try:
            found = flat.physical_range()
        except OSError:
            return None
        if found is None:
            return None
        self._phys_ranges[key] = (low, high, *found)
        return found

    def physical_end(self) -> int:
        """Where the records the tier holds end in the CommitLog they came from (0 for an
        empty tier); the store starts an empty local CommitLog past it. One ranged read per
        queue, asked only when the local CommitLog is empty (a store that lost its files, or
        that adopted an offloaded history)."""
        end = 0
        for flat in self.files.files():
            if not flat.is_init() or flat.commit_offset <= flat.min_offset():
                continue
            last = flat.record_at(flat.commit_offset - 1)
            if last is not None and len(last) >= codec.PHYSICAL_OFFSET_POS + 8:
                physical = struct.unpack_from(">q", last, codec.PHYSICAL_OFFSET_POS)[0]
                end = max(end, physical + len(last))
        return end

    def topics(self) -> dict[str, list[int]]:
        if self.policy is TieredStorageLevel.DISABLE:
            return {}
        return {topic: [q for q in queues if self.offsets(topic, q) is not None]
                for topic, queues in self.files.topics().items()}
