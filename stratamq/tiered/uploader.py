"""``TierUploader``: the dispatcher that copies each queue's messages to the tier (RocketMQ's
``MessageStoreDispatcherImpl``, seed 000 section 5.2).

It plugs into the store as a dispatcher (``MessageStore.add_dispatcher``): ``dispatch`` only
notes, per queue, that records wait (no bytes are copied on the store's dispatch thread);
the upload itself reads the local ConsumeQueue units and CommitLog records later, on the
uploader's own threads, as RocketMQ's dispatcher does:

* a queue's batch goes when its oldest waiting message is ``tieredStoreGroupCommitTimeout``
  old, or ``tieredStoreGroupCommitCount`` messages or ``tieredStoreGroupCommitSize`` bytes
  wait, or on demand (``flush``); a scan runs every second;
* a batch appends the records to the queue's tier CommitLog and their units to its tier
  ConsumeQueue, uploads the CommitLog data first, then the units, then adds the keys to the
  tier index;
* a queue whose local data expired before it was uploaded resumes at the local minimum (the
  tier's ConsumeQueue gets a gap there) and the skipped offsets are logged;
* ``committed_offset()``: the CommitLog offset below which every record was committed to the
  tier (the first waiting record of any queue, or the end of what was dispatched);
  ``durable_offset()``: the same, verified in the tier (``coverage.TierCoverage``: the tier's
  listing and each queue's last record read back), which is what local clean-up trusts (the
  store's and ``store clean --tiered-only``). The store replays dispatch from it on open (the
  first call after ``attach``: the committed offset, nothing asked of the tier) and keeps local
  CommitLog files above it, bounded by ``dispatcherRetentionHoldMaxBytes``;
  ``retention_hold_bytes()`` is how much it holds.

Threads: ``dispatch`` on the store's dispatch thread (cheap, under ``_lock``); one scheduler
thread (``tier-uploader``); uploads on a pool (``tier-upload-N``), one at a time per queue
(under the queue's ``file_lock``). ``flush`` from any thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

import numpy as np

from stratamq import record as codec
from stratamq.config import StoreConfig
from stratamq.message import DispatchInfo
from stratamq.store.consume_queue_format import is_blank_unit
from stratamq.store.log_reader import CommitLogReader
from stratamq.tiered.batch import Batch, collect, gather
from stratamq.tiered.coverage import TierCoverage
from stratamq.tiered.flat_message_file import HEADER_PEEK, FlatFileStore, FlatMessageFile
from stratamq.tiered.health import TierHealth
from stratamq.tiered.index_feed import TierIndexFeed
from stratamq.tiered.index_service import IndexStoreService
from stratamq.tiered.metadata import MetadataStore
from stratamq.tiered.retention import delete_expired_files
from stratamq.tiered.topic_filter import is_filtered_topic

__all__ = ["LocalQueues", "TierUploader", "is_filtered_topic"]

log = logging.getLogger(__name__)

SCAN_INTERVAL_S = 1.0


class LocalQueues(Protocol):
    """What the uploader reads of the local store's ConsumeQueues."""

    def offsets(self, topic: str, queue_id: int) -> tuple[int, int] | None:
        """(min, max) queue offsets the local store holds; None for an unknown queue."""
        ...

    def units(self, topic: str, queue_id: int, offset: int,
              count: int) -> list[tuple[int, int, int]]:
        """(CommitLog offset, size, tags code) of up to ``count`` units from ``offset``."""
        ...


class _Waiting:
    """What waits to be uploaded in one queue (guarded by the uploader's ``_lock``)."""

    __slots__ = ("next", "seen_next", "first_phys", "first_ts", "bytes", "scheduled", "force")

    def __init__(self, next_offset: int, first_phys: int, first_ts: int) -> None:
        self.next = next_offset  # the first queue offset not in the tier
        self.seen_next = next_offset  # one past the last offset dispatched
        self.first_phys = first_phys  # CommitLog offset of the first record waiting
        self.first_ts = first_ts  # its store time
        self.bytes = 0
        self.scheduled = False
        self.force = False


class TierUploader:
    """The tier's dispatcher (see the module docstring)."""

    name = "tier-uploader"

    def __init__(self, config: StoreConfig, files: FlatFileStore, metadata: MetadataStore,
                 index: IndexStoreService | None, local: LocalQueues, *,
                 workers: int = 8) -> None:
        self.config = config
        self.files = files
        self.metadata = metadata
        self.index = index
        self.local = local
        self.reader: CommitLogReader | None = None
        self._lock = threading.Lock()
        self._progress = threading.Condition(self._lock)
        self._waiting: dict[tuple[str, int], _Waiting] = {}
        self._finished = 0  # upload tasks ended (under _lock): ``flush`` waits for the next
        # Per queue, the batch whose upload failed (appended, not committed): its keys go to
        # the index when the retry lands. Touched only under the queue's file_lock.
        self._failed: dict[tuple[str, int], tuple[Batch, np.ndarray]] = {}
        self._dispatched_end = metadata.durable_offset
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix="tier-upload")
        self._last_expiry = time.monotonic()
        # Whether the tier works, and when to try it again after a failure (back-off, one log
        # line per change of state): no round, flush or index upload is tried before that.
        self.health = TierHealth(files.factory.describe())
        self.index_feed = TierIndexFeed(config, index, metadata, self.health)
        self.coverage = TierCoverage(files, local)
        self._opening = False  # attached, the store's replay start not asked yet
        # Counters (metrics, status), changed under _count_lock: uploads run on several pool
        # threads, and ``+=`` on an attribute is not atomic across them.
        self._count_lock = threading.Lock()
        self.uploaded_messages = 0
        self.uploaded_bytes = 0
        self.skipped_messages = 0
        self.failed_uploads = 0
        # Topics tiered by another part, never here (compaction topics: their compacted files
        # are what the tier holds; stratamq.compaction.tiering.link sets it).
        self.skip_topic: Callable[[str], bool] | None = None
        # Controller mode: True while this broker is not its group's master (no upload, no
        # tier housekeeping; dispatch still notes what waits, for the day it is elected).
        self.paused = False

    # -- the dispatcher seam ---------------------------------------------------------------------

    def attach(self, reader: CommitLogReader) -> None:
        self.reader = reader
        self._opening = True

    def dispatch(self, info: DispatchInfo) -> None:
        end = info.physical_offset + info.size
        with self._lock:
            if end > self._dispatched_end:
                self._dispatched_end = end
            if is_filtered_topic(info.topic) or (self.skip_topic is not None
                                                  and self.skip_topic(info.topic)):
                return
            key = (info.topic, info.queue_id)
            waiting = self._waiting.get(key)
            if waiting is None:
                flat = self.files.get(*key)
                if flat is not None and flat.is_init() and info.queue_offset < flat.commit_offset:
                    return  # a replayed record the tier already has
                waiting = self._waiting[key] = _Waiting(info.queue_offset, info.physical_offset,
                                                        info.store_timestamp)
            elif info.queue_offset < waiting.next:
                return
            waiting.seen_next = max(waiting.seen_next, info.queue_offset + 1)
            waiting.bytes += info.size
            if self._due(waiting, 0):
                self._wake.set()

    def committed_offset(self) -> int:
        """Below this CommitLog offset every record was committed to the tier (as far as this
        process knows: see ``durable_offset``)."""
        with self._lock:
            return min([w.first_phys for w in self._waiting.values()], default=-1) \
                if self._waiting else self._dispatched_end

    def durable_offset(self) -> int:
        """Below this CommitLog offset every record is verified to be in the tier: what local
        clean-up may delete. The committed offset, lowered to what the last verification of
        the tier confirmed; a verification is made here when the committed offset passed a
        CommitLog file's end the last one did not cover (``TierCoverage.due``: a deletion
        could depend on it), not while the tier backs off. Never
        verified: the local CommitLog's start (nothing is deletable as held by the tier).

        The first call after ``attach`` is the store's replay start on open: the committed
        offset, unverified (replaying records the tier lost would not bring them back:
        dispatch skips what the metadata says is committed), so an open asks nothing of the
        tier."""
        committed = self.committed_offset()
        if self._opening:
            self._opening = False
            return committed
        reader = self.reader
        if self.health.ready() and self.coverage.due(
                committed, reader.segment_size if reader is not None else 0):
            self.verify_coverage(committed)
        floor = self.coverage.floor
        if floor is None:
            return min(committed, reader.min_offset if reader is not None else 0)
        return min(committed, floor)

    def verify_coverage(self, committed: int | None = None) -> int:
        """Verify the tier's coverage now (``TierCoverage.verify``) and return the offset
        below which every record is in the tier (``store clean --tiered-only`` calls it before
        deciding)."""
        if committed is None:
            committed = self.committed_offset()
        skip = self.skip_topic
        skipped = {(f.topic, f.queue_id) for f in self.files.files()
                   if skip is not None and skip(f.topic)}
        return self.coverage.verify(committed, skipped)

    def destroy_topic(self, topic: str) -> None:
        with self._lock:
            for key in [k for k in self._waiting if k[0] == topic]:
                del self._waiting[key]
        self.files.destroy_topic(topic)
        log.info("tier: topic %s deleted from the tier", topic)

    # -- status ----------------------------------------------------------------------------------

    def lag(self, topic: str, queue_id: int) -> tuple[int, int]:
        """(messages, bytes) dispatched for the queue and not yet in the tier."""
        with self._lock:
            waiting = self._waiting.get((topic, queue_id))
            if waiting is None:
                return 0, 0
            return max(0, waiting.seen_next - waiting.next), waiting.bytes

    def waiting_messages(self) -> int:
        with self._lock:
            return sum(max(0, w.seen_next - w.next) for w in self._waiting.values())

    def retention_hold_bytes(self) -> int:
        """Local CommitLog bytes kept only because the tier does not have them yet."""
        if self.reader is None:
            return 0
        floor = self.coverage.floor  # the last verdict: no verification from a status call
        held = self.committed_offset() if floor is None else min(self.committed_offset(), floor)
        return max(0, self.reader.end() - max(held, self.reader.min_offset))

    # -- the scheduler -----------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="tier-uploader", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(SCAN_INTERVAL_S)
            self._wake.clear()
            if self._stop.is_set():
                break
            if self.paused:
                continue
            try:
                self.run_round()
                self._housekeeping()
            except Exception:  # the scheduler must outlive any one failure
                log.exception("tier uploader round failed")

    def resume(self, local_queues: dict[str, list[int]]) -> None:
        """Elected master (controller mode): every local queue the tier lags is waiting from
        the tier's committed offset, whatever this broker dispatched while it was a slave
        (the metadata may have been replaced by the group's since)."""
        assert self.reader is not None, "attach() first (the store calls it on open)"
        for topic, queue_ids in local_queues.items():
            if is_filtered_topic(topic) or (self.skip_topic is not None
                                            and self.skip_topic(topic)):
                continue
            for queue_id in queue_ids:
                held = self.local.offsets(topic, queue_id)
                if held is None:
                    continue
                flat = self.files.get(topic, queue_id)
                start = flat.commit_offset if flat is not None and flat.is_init() else held[0]
                start = max(start, held[0])
                units = self.local.units(topic, queue_id, start, 1)
                if not units:
                    continue  # nothing the group acknowledged is waiting
                head = self.reader.read_bytes(units[0][0], min(units[0][1], HEADER_PEEK))
                stamp = codec.record_store_timestamp(head, 0) if head else 0
                with self._lock:
                    waiting = self._waiting.get((topic, queue_id))
                    if waiting is None:
                        waiting = self._waiting[(topic, queue_id)] = _Waiting(
                            start, units[0][0], stamp)
                    else:
                        waiting.next, waiting.first_phys = start, units[0][0]
                    waiting.seen_next = max(waiting.seen_next, held[1])
        self._wake.set()

    def _due(self, waiting: _Waiting, now_ms: int) -> bool:
        cfg = self.config
        if waiting.force or not cfg.tiered_store_group_commit:
            return True
        if waiting.seen_next - waiting.next >= cfg.tiered_store_group_commit_count:
            return True
        if waiting.bytes >= cfg.tiered_store_group_commit_size:
            return True
        return bool(now_ms) and waiting.first_ts + cfg.tiered_store_group_commit_timeout <= now_ms

    def run_round(self, *, force: bool = False) -> int:
        """Start an upload for every queue whose batch is due (every waiting queue with
        ``force``); returns how many were started."""
        if not self.health.ready():
            return 0  # backing off after a failure: waiting queues go at the next attempt
        now = int(time.time() * 1000)
        due: list[tuple[tuple[str, int], int]] = []
        with self._lock:
            for key, waiting in self._waiting.items():
                if force:
                    waiting.force = True
                if waiting.scheduled or not self._due(waiting, now):
                    continue
                waiting.scheduled = True
                due.append((key, waiting.next))
        try:
            self._start_new_queues(due)
        except Exception as exc:
            with self._progress:
                for key, _next in due:
                    if (left := self._waiting.get(key)) is not None:
                        left.scheduled = False
            if not isinstance(exc, OSError):
                raise
            self.health.failed("starting new tier queues", exc)
            return 0
        for key, _next in due:
            self._executor.submit(self._upload_task, key)
        return len(due)

    def _start_new_queues(self, due: list[tuple[tuple[str, int], int]]) -> None:
        """Start the tier files of the due queues the tier does not have yet, together: they
        must be recorded in the metadata before their first upload, and one write of it (two
        fsyncs) serves the round, where each queue's upload would write it for itself. Only
        the plain case (the first waiting offset still held locally); the upload itself
        starts the others, as before."""
        started = False
        try:
            for (topic, queue_id), next_offset in due:
                flat = self.files.get(topic, queue_id)
                if flat is not None and (flat.is_init() or flat.commit_log.segments):
                    continue
                held = self.local.offsets(topic, queue_id)
                if held is None or not held[0] <= next_offset < held[1]:
                    continue
                flat = self.files.get_or_create(topic, queue_id)
                with flat.file_lock:
                    if flat.closed or flat.is_init() or flat.commit_log.segments:
                        continue
                    if not flat.recovered:
                        flat.recover()  # nothing to reconcile: the queue has no tier file
                    flat.init_offset(next_offset, persist=False)
                    started = True
        finally:
            if started:
                self.metadata.persist()

    def _housekeeping(self) -> None:
        if self.index is not None:
            self.index.seal_idle(int(time.time() * 1000),
                                 self.config.tiered_store_index_file_rolling_idle_interval)
            self.index_feed.upload_sealed(self.persist)
        cfg = self.config
        interval_s = cfg.tiered_store_delete_file_interval / 1000
        if cfg.tiered_store_delete_file_enable and \
                time.monotonic() - self._last_expiry >= interval_s:
            self._last_expiry = time.monotonic()
            self.delete_expired()
        self.persist(deferred_too=True)

    def persist(self, *, deferred_too: bool = False) -> None:
        """Make the tier's progress durable: the index first, then the metadata (with the
        durable offset), so the metadata never claims what is not on disk. Only when
        something changed (``deferred_too``: also a deferred change, an uploaded index
        file's size)."""
        durable = self.committed_offset()  # where dispatch resumes after a restart
        if durable != self.metadata.durable_offset:
            self.metadata.durable_offset = durable
            self.metadata.mark_dirty()
        if not self.metadata.changed(deferred_too=deferred_too):
            return  # nothing to claim: the index needs no flush for it either
        if self.index is not None:
            self.index.flush()
        self.metadata.persist(deferred_too=deferred_too)

    def delete_expired(self, now_ms: int | None = None) -> int:
        """Tier retention (``retention.delete_expired_files``); how many tier files went."""
        return delete_expired_files(self.config, self.files, self.index, self.metadata,
                                    int(time.time() * 1000) if now_ms is None else now_ms)

    # -- one queue's upload ----------------------------------------------------------------------

    def _upload_task(self, key: tuple[str, int]) -> None:
        repeat = False
        try:
            repeat = self.upload_queue(*key)
        except OSError as exc:  # TierIOError, or a POSIX tier's own error
            self._count(failed=1)
            self.health.failed(f"upload of {key[0]}/{key[1]}", exc)
        except Exception as exc:
            self._count(failed=1)
            if self.health.failures == 0:  # once per failing run, not per attempt
                log.exception("tier upload of %s/%d failed", *key)
            self.health.failed(f"upload of {key[0]}/{key[1]}", exc)
        finally:
            with self._progress:
                waiting = self._waiting.get(key)
                if waiting is not None:
                    waiting.scheduled = False
                self._finished += 1
                self._progress.notify_all()
        if repeat:
            self._wake.set()

    def upload_queue(self, topic: str, queue_id: int) -> bool:
        """Upload the queue's next batch if it is due; True when another is due right away."""
        assert self.reader is not None, "attach() first (the store calls it on open)"
        flat = self.files.get_or_create(topic, queue_id)
        with flat.file_lock:
            if flat.closed:
                return False
            if not flat.recovered:
                notes = flat.recover()
                if notes:
                    log.warning("tier queue %s recovered: %s", flat.file_path, "; ".join(notes))
                self.index_feed.catch_up(flat)
            if flat.append_offset > flat.commit_offset:
                # The last batch failed: retry it, as it was, before anything new.
                if not self._commit(flat):
                    return False
                failed = self._failed.pop((topic, queue_id), None)
                if failed is not None:
                    self.index_feed.add(flat, *failed)
                    self._count(messages=len(failed[1]), nbytes=failed[0].nbytes())
            return self._upload_batch(flat)

    def _upload_batch(self, flat: FlatMessageFile) -> bool:
        cfg = self.config
        topic, queue_id = flat.topic, flat.queue_id
        key = (topic, queue_id)
        held = self.local.offsets(topic, queue_id)
        with self._lock:
            waiting = self._waiting.get(key)
        if held is None:
            self._settle(key, flat.commit_offset, None)
            return False
        low, high = held
        if flat.is_init():
            start = flat.commit_offset
            if waiting is not None and waiting.next > start:
                start = waiting.next  # past offsets found missing locally last time
        else:  # a queue new to the tier: from what was dispatched, or all the store has
            start = waiting.next if waiting is not None else low
        if start < low:
            self._skipped(flat, start, low, "the local store no longer has them")
            start = low
        if start >= high:
            self._settle(key, start, None)
            return False
        flat.try_rolling(cfg.commit_log_rolling_interval * 3_600_000,
                         cfg.commit_log_rolling_minimum_size, int(time.time() * 1000))
        units = self.local.units(topic, queue_id, start,
                                 min(high - start, cfg.tiered_store_group_commit_count))
        assert self.reader is not None
        # The records as one buffer (the usual case); record by record where a unit is blank
        # or its record is gone, to commit what comes before it and skip what is missing.
        block = gather(self.reader, start, units, cfg.tiered_store_group_commit_size)
        offset = start
        if block is None:
            block, offset, skipped = collect(self.reader, start, units,
                                             cfg.tiered_store_group_commit_size)
            for low, high in skipped:
                self._skipped(flat, low, high, "their records left the local CommitLog before "
                              "upload")
        flat_offsets = flat.append_block(block) if block is not None else np.empty(0)
        total = 0
        if block is not None and len(flat_offsets):
            block = block.head(len(flat_offsets))
            total = block.nbytes()
            if not self._commit(flat):
                self._count(failed=1)
                self._failed[key] = (block, flat_offsets)  # indexed once its retry lands
                return False
            self.index_feed.add(flat, block, flat_offsets)
            self._count(messages=len(block), nbytes=total)
            offset = flat.commit_offset
        elif block is not None:
            offset = block.first  # a full file could not be committed: nothing taken
        remaining = units[offset - start] if 0 <= offset - start < len(units) else None
        return self._settle(key, offset, remaining, total)

    def _commit(self, flat: FlatMessageFile) -> bool:
        """``flat.commit()``, its outcome told to ``health`` (a commit refused only because
        another was running is no failure of the tier)."""
        if flat.commit():
            self.health.succeeded()
            return True
        errors = [s.last_error for f in (flat.commit_log, flat.consume_queue)
                  for s in f.segments[-1:] if s.last_error]
        if errors:
            self.health.failed(f"upload of {flat.topic}/{flat.queue_id}", errors[0])
        return False

    def _settle(self, key: tuple[str, int], next_offset: int,
                unit: tuple[int, int, int] | None, uploaded: int = 0) -> bool:
        """Record that the queue is in the tier up to ``next_offset`` (``unit``: the local unit
        there, when known); True when the next batch is due at once."""
        first = None
        if unit is None and self.reader is not None:
            units = self.local.units(key[0], key[1], next_offset, 1)
            unit = units[0] if units else None
        if unit is not None and self.reader is not None and not is_blank_unit(*unit):
            head = self.reader.read_bytes(unit[0], min(unit[1], HEADER_PEEK))
            first = (unit[0], codec.record_store_timestamp(head, 0) if head else 0)
        with self._progress:
            waiting = self._waiting.get(key)
            if waiting is None:
                return False
            waiting.next = max(waiting.next, next_offset)
            waiting.bytes = max(0, waiting.bytes - uploaded)
            if waiting.next >= waiting.seen_next:
                del self._waiting[key]
                self._progress.notify_all()
                return False
            if first is not None:
                waiting.first_phys, waiting.first_ts = first
            waiting.force = False
            return self._due(waiting, int(time.time() * 1000))

    def _count(self, *, messages: int = 0, nbytes: int = 0, skipped: int = 0,
               failed: int = 0) -> None:
        with self._count_lock:
            self.uploaded_messages += messages
            self.uploaded_bytes += nbytes
            self.skipped_messages += skipped
            self.failed_uploads += failed

    def _skipped(self, flat: FlatMessageFile, start: int, end: int, why: str) -> None:
        self._count(skipped=end - start)
        log.warning("tier queue %s: queue offsets %d..%d were never tiered: %s; the tier resumes "
                    "at %d", flat.file_path, start, end - 1, why, end)

    # -- on demand -------------------------------------------------------------------------------

    def flush(self, timeout: float = 60.0, *, index: bool = True) -> bool:
        """Upload everything dispatched so far, now; True once it is all committed (and, with
        ``index``, every sealed index file uploaded too). The index file being written is
        sealed only by RocketMQ's rule (full, or idle for
        ``tieredStoreIndexFileRollingIdleInterval``), never because of a flush; until then
        lookups read it locally."""
        deadline = time.monotonic() + timeout
        with self._lock:
            targets = {k: w.seen_next for k, w in self._waiting.items()}
        while True:
            with self._lock:
                finished = self._finished
            self.run_round(force=True)
            with self._progress:
                left = [k for k, target in targets.items()
                        if (w := self._waiting.get(k)) is not None and w.next < target]
                if not left:
                    break
                if time.monotonic() >= deadline:
                    log.warning("tier flush: %d queues not uploaded in %.0f s%s", len(left),
                                timeout, f" (the tier fails: {self.health.last_error})"
                                if self.health.last_error else "")
                    return False
                if self._finished == finished or not self.health.ready():
                    # Wait for a batch to end, or out the tier's back-off: a broken tier is
                    # tried once per back-off step, not in a loop.
                    wait = max(0.2, self.health.retry_in())
                    self._progress.wait(min(wait, max(0.0, deadline - time.monotonic())))
        ok = True
        if index and self.index is not None:
            self.index.seal_idle(int(time.time() * 1000),
                                 self.config.tiered_store_index_file_rolling_idle_interval)
            # The write before an index upload is this flush's progress write too: one write
            # (two fsyncs) for the round, where there were two.
            ok = self.index_feed.upload_sealed(self.persist)
        self.persist()
        return ok

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self._executor.shutdown(wait=True)
        if self.paused:
            return  # not the group's master: its document stays as its last mastership left it
        try:
            self.persist(deferred_too=True)
        except OSError as exc:
            log.error("tier metadata not saved at close: %s", exc)
