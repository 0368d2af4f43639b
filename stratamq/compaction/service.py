"""``CompactionStore``: compaction topics, plugged into a ``MessageStore`` through its seams.

- **Dispatcher** (``add_dispatcher``): every record of a compaction topic (as the handed
  :class:`TopicPolicies` says) is copied out of the CommitLog into its topic/queue's
  ``CompactionLog`` (RocketMQ's ``CompactionService.putRequest``). Replays are harmless: a queue
  takes only queue offsets past its newest. ``durable_offset()`` is the ``dispatch-checkpoint``,
  written by the flush thread once every CompactionLog is flushed past it; an open replays the
  CommitLog from there, and clean-up keeps the CommitLog files above it.
- **Read source** (``add_read_source(first=True)``): reads of the queues it holds are answered
  from the CompactionLogs, before the local ConsumeQueues (which still index every record of
  the topic until clean-up).
- **Scheduler**: a thread that gives every queue a round each ``compactionScheduleInternal``
  ms, on up to ``compactionThreadNum`` worker threads (each with ``maxOffsetMapSize /
  threads`` of OffsetMap); it starts with ``start()``, so compaction resumes after a restart.
- **Flush**: a thread that flushes the CompactionLogs every ``flushIntervalConsumeQueue`` ms
  and then writes the dispatch checkpoint.

Handed what it needs (the store layout, the settings, the policies), never the store.
Thread-safety: ``dispatch`` from the dispatch thread; reads from any thread; ``run_now`` and
``status`` from any thread; ``start``/``close`` from the owner's thread.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import logging
import os
import random
import shutil
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from stratamq import record as codec
from stratamq.compaction import bcq_format as bcq
from stratamq.compaction.layout import CompactionLayout
from stratamq.compaction.log import CompactionLog
from stratamq.compaction.policy import TOMBSTONE_PROPERTY, TopicPolicies, TopicPolicy
from stratamq.compaction.round import RoundReport, round_due, run_round_held
from stratamq.compaction.state_format import DispatchCheckpoint
from stratamq.config import BrokerRole, InvalidSetting, StoreConfig
from stratamq.message import DispatchInfo, Prop, StoredMessage
from stratamq.record import SysFlag
from stratamq.store.layout import StoreLayout
from stratamq.store.log_reader import CommitLogReader
from stratamq.store.read_chain import QueueOffsets, ReadRequest
from stratamq.store.results import GetMessageResult

if TYPE_CHECKING:
    from stratamq.compaction.tiering import CompactionTier
    from stratamq.store.message_store import MessageStore

__all__ = ["CompactionStore"]

log = logging.getLogger(__name__)

NO_KEY = bytes(16)
# A CompactionLog file must hold the largest record a put accepts: body, headers and the
# largest properties and topic a record may carry.
RECORD_OVERHEAD = 32767 + 255 + 256  # properties, topic, header with IPv6 hosts


def _key_digest_and_flags(info: DispatchInfo, record: bytes | memoryview) -> tuple[bytes, int]:
    """A batch ConsumeQueue unit's key md5 and flags (has a key, is a tombstone)."""
    key = info.properties.get(Prop.KEYS)
    flags, digest = 0, NO_KEY
    if key:
        flags |= bcq.FLAG_HAS_KEY
        digest = hashlib.md5(key.encode("utf-8")).digest()
    if (codec.record_body_length(record, 0) == 0
            or info.properties.get(TOMBSTONE_PROPERTY, "").lower() == "true"):
        flags |= bcq.FLAG_TOMBSTONE
    return digest, flags


class CompactionStore:
    """Compaction topics for one store (see the module docstring)."""

    name = "compaction"

    def __init__(self, config: StoreConfig, policies: TopicPolicies, *,
                 read_only: bool = False) -> None:
        needed = config.max_message_size + RECORD_OVERHEAD
        if config.compaction_mapped_file_size < needed:
            raise InvalidSetting(
                f"compactionMappedFileSize={config.compaction_mapped_file_size} cannot hold the "
                f"largest record a put accepts (maxMessageSize={config.max_message_size} plus "
                f"headers): make it at least {needed}")
        self.config = config
        self.policies = policies
        self.read_only = read_only
        self.layout = CompactionLayout(StoreLayout(config.root))
        self._queues: dict[tuple[str, int], CompactionLog] = {}
        self._queues_lock = threading.Lock()
        self._reader: CommitLogReader | None = None
        self._checkpoint = DispatchCheckpoint()
        self._seen_to = 0  # CommitLog end of the last record dispatched (all topics)
        # The checkpoint is moved by the flush thread and by a slave's cut-back, one at a time.
        self._checkpoint_lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        workers = max(1, min(config.compaction_thread_num, os.cpu_count() or 1))
        self.map_memory = config.max_offset_map_size // workers
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._workers = workers
        self.last_reports: dict[tuple[str, int], RoundReport] = {}
        # The compacted files in the tier (tiering.link, before the store opens), or None.
        self.tier: CompactionTier | None = None
        self._loaded = False

    def plug_into(self, store: MessageStore) -> CompactionStore:
        """Add this to ``store`` (before it is opened) as a dispatcher and a first read
        source."""
        store.add_dispatcher(self)
        store.add_read_source(self, first=True)
        return self

    # -- dispatcher -----------------------------------------------------------------------------

    def attach(self, reader: CommitLogReader) -> None:
        """On store open, before replay: load every queue on disk and the checkpoint."""
        self._reader = reader
        self._checkpoint = DispatchCheckpoint.read(self.layout.dispatch_checkpoint)
        self._seen_to = self._checkpoint.dispatched_to
        self._load_queues()
        if not self.read_only:
            self._cut_past(reader.end())

    def _load_queues(self) -> None:
        """Every queue on disk, and each one the tier holds (once: the store may ask
        ``physical_end`` before it attaches this)."""
        if self._loaded:
            return
        self._loaded = True
        for topic, queue_id in self.layout.queues_on_disk():
            self._queue(topic, queue_id)
        if self.tier is not None:
            for topic, queue_id in sorted(self.tier.manifest.queues):
                self._adopt_tier(self._queue(topic, queue_id))
            for (topic, queue_id), clog in sorted(self._queues.items()):
                if clog.state.tier_floor and self.tier.entry(topic, queue_id) is None:
                    raise OSError(f"compaction queue {topic}:{queue_id}: offsets below "
                                  f"{clog.state.tier_floor} were released to the tier, but "
                                  "the tier's manifest does not hold the queue (another "
                                  "tier configured?)")

    def _adopt_tier(self, clog: CompactionLog) -> None:
        """Serve the queue's released files from the tier; a queue with no local files at
        all (a new broker on an existing tier) is served from the tier whole."""
        assert self.tier is not None
        entry = self.tier.entry(clog.topic, clog.queue_id)
        if entry is None:
            return
        if not any(s.units for s in clog.segments) and not clog.state.tier_floor:
            state = entry.state
            held_to = entry.next_offset
            if self.config.broker_role is BrokerRole.SLAVE and entry.files:
                # The entry's next offset also covers the master's file being written, which
                # the tier does not hold: a slave pulls that from its master, from where this
                # queue ends, so it must end where the tier's files do.
                held_to = entry.files[-1].last_offset + 1
            clog.state = type(state)(min(state.cleaned_to, held_to), held_to,
                                     min(state.expired_below, held_to),
                                     [m for m in state.rounds if m.end_offset <= held_to],
                                     state.last_round, held_to)
            clog.next_offset = max(clog.next_offset, held_to)
        clog.set_tiered(self.tier.tier_segments(clog.topic, clog.queue_id,
                                                clog.state.tier_floor))

    def _queue(self, topic: str, queue_id: int) -> CompactionLog:
        key = (topic, queue_id)
        clog = self._queues.get(key)
        if clog is not None:
            return clog
        with self._queues_lock:
            clog = self._queues.get(key)
            if clog is None:
                clog = CompactionLog(self.layout.queue(topic, queue_id),
                                     self.config.compaction_mapped_file_size,
                                     bcq.cq_file_size(self.config.compaction_cq_mapped_file_size),
                                     read_only=self.read_only,
                                     destroy_interval_ms=(
                                         self.config.destroy_mapped_file_interval_forcibly))
                clog.load()
                self._queues = {**self._queues, key: clog}  # replaced: readers need no lock
        return clog

    def dispatch(self, info: DispatchInfo) -> None:
        policy = self.policies.policy(info.topic)
        end = info.physical_offset + info.size
        if policy is None or not SysFlag.is_dispatchable(info.sys_flag):
            self._seen_to = end
            return
        clog = self._queue(info.topic, info.queue_id)
        if info.queue_offset >= clog.next_offset:
            assert self._reader is not None, "attach() is called before dispatch"
            data = self._reader.read_bytes(info.physical_offset, info.size)
            if data is None:
                raise OSError(f"the record at CommitLog offset {info.physical_offset} is gone "
                              "before compaction copied it")
            clog.append(data, info.queue_offset, end, info.tags_code, info.store_timestamp,
                        *_key_digest_and_flags(info, data))
        self._seen_to = end  # after the append: the flush thread trusts what is below it

    def dispatch_batch(self, infos: list[DispatchInfo],
                       failed: Callable[[DispatchInfo, OSError], None]) -> None:
        """``dispatch`` of each record in order (a dispatch round's run): a topic's policy is
        looked up once a run, and a record of a topic without one (almost all) costs a
        dictionary lookup."""
        policies: dict[str, TopicPolicy | None] = {}
        policy = self.policies.policy
        for info in infos:
            topic = info.topic
            if topic in policies:
                compacted = policies[topic]
            else:
                compacted = policies[topic] = policy(topic)
            if compacted is None:
                self._seen_to = info.physical_offset + info.size
                continue
            try:
                self.dispatch(info)
            except OSError as exc:
                failed(info, exc)

    def put_replicated(self, record: bytes | memoryview) -> bool:
        """Append one CommitLog record pulled from the master (message-based replication,
        ``stratamq.ha.message_replication``; RocketMQ's ``putMessageFromRemote``) to its
        topic/queue's CompactionLog, as ``dispatch`` does for a local record: the same bytes,
        queue offset, key digest and tombstone flag. The record keeps the master's physical
        offset, which is the slave's too (byte replication copies at the same offsets), so
        the queue's replay floor stays meaningful. False if the queue has that offset already
        or the record is not a compaction topic's message."""
        info = codec.decode_dispatch_info(record, 0)
        if self.policies.policy(info.topic) is None or not SysFlag.is_dispatchable(info.sys_flag):
            return False
        return self._queue(info.topic, info.queue_id).append(
            record, info.queue_offset, info.physical_offset + info.size, info.tags_code,
            info.store_timestamp, *_key_digest_and_flags(info, record))

    def durable_offset(self) -> int:
        return self._checkpoint.dispatched_to

    def replay_floor(self, topic: str, queue_id: int) -> int:
        if self.policies.policy(topic) is None:
            return 2**63 - 1  # nothing of this topic is needed here
        clog = self._queues.get((topic, queue_id))
        return clog.physical_end if clog is not None else 0

    def destroy_topic(self, topic: str) -> None:
        with self._queues_lock:
            doomed = [c for k, c in self._queues.items() if k[0] == topic]
            self._queues = {k: c for k, c in self._queues.items() if k[0] != topic}
        for clog in doomed:
            with clog.compacting:
                clog.destroy()
        if self.tier is not None:
            self.tier.destroy_topic(topic)
        for directory in self.layout.topic_dirs(topic):
            shutil.rmtree(directory, ignore_errors=True)

    # -- flushing -------------------------------------------------------------------------------

    def flush(self) -> None:
        """Flush every CompactionLog, then record how far the CommitLog is split out."""
        if self.read_only:
            return
        with self._checkpoint_lock:
            upto = self._seen_to
            for clog in list(self._queues.values()):
                clog.flush()
            if upto != self._checkpoint.dispatched_to:
                self._write_checkpoint(upto)

    def _write_checkpoint(self, upto: int) -> None:
        checkpoint = DispatchCheckpoint(upto)
        checkpoint.write(self.layout.dispatch_checkpoint)
        self._checkpoint = checkpoint

    # -- a slave's cut-back (store/replica.py: ReplicaLog.truncate) ----------------------------

    def truncate_from(self, physical_offset: int) -> None:
        """The CommitLog was cut back to ``physical_offset`` (a slave ahead of its master; the
        dispatch is paused and goes on from there): cut every CompactionLog back to its records
        below it (``cutback.py``), dispatch again the CommitLog records a round removed in
        favour of a cut one, and move the dispatch checkpoint back, so the master's
        replacement records are split out, also after a crash."""
        if self.read_only:
            return
        from stratamq.compaction.cutback import apply_cut, plan_cut

        with self._checkpoint_lock, contextlib.ExitStack() as held:
            queues = self.queues()
            for clog in queues:
                held.enter_context(clog.compacting)  # no round while the queues are cut
            plans = [(clog, plan_cut(clog, physical_offset)) for clog in queues]
            plans = [(clog, plan) for clog, plan in plans if plan.units_cut]
            # First the checkpoint: a crash from here on replays what the cut and the
            # dispatch below redo.
            low = min([physical_offset] + [p.last_kept_end for _c, p in plans])
            if self._checkpoint.dispatched_to > low:
                self._write_checkpoint(low)
            before = self._seen_to  # below it every queue holds its records already
            for clog, plan in plans:
                apply_cut(clog, plan)
            if plans:
                self._dispatch_again({(c.topic, c.queue_id) for c, _p in plans}, low,
                                     physical_offset)
            self._seen_to = min(before, physical_offset)

    def _cut_past(self, end: int) -> None:
        """On open: the CommitLog recovered to ``end`` but this split out records past it (its
        tail was lost: a power cut, a disk that lost pages); cut back as a slave does, so the
        records written at those offsets now are split out. On a slave the CompactionLogs also
        hold records pulled from the master (``put_replicated``) at the master's physical
        offsets, which lie past this CommitLog's end while it catches up: there only the
        checkpoint (what dispatch split out of this CommitLog) tells a lost tail."""
        pulled = self.config.broker_role is BrokerRole.SLAVE
        if (self._checkpoint.dispatched_to > end
                or (not pulled and any(c.physical_end > end for c in self._queues.values()))):
            log.warning("compaction: the CommitLog ends at %d, before what the CompactionLogs "
                        "hold (checkpoint %d): cutting them back", end,
                        self._checkpoint.dispatched_to)
            self.truncate_from(end)

    def _dispatch_again(self, queues: set[tuple[str, int]], start: int, end: int) -> None:
        """Dispatch ``queues``' records of CommitLog ``[start, end)`` again (each queue takes
        only offsets past its newest): versions a round removed because a later version
        replaced them, and that later version was cut."""
        assert self._reader is not None, "attach() is called before truncate_from"
        if start < self._reader.min_offset:
            log.warning("compaction cut-back: the CommitLog starts at %d, after %d: versions "
                        "compaction removed in favour of cut ones before it cannot come back",
                        self._reader.min_offset, start)
        for rec in self._reader.records(start, end):
            info = codec.decode_dispatch_info(rec.data, 0)
            if (info.topic, info.queue_id) in queues:
                self.dispatch(info)

    # -- rounds ---------------------------------------------------------------------------------

    def queues(self, topic: str | None = None) -> list[CompactionLog]:
        return [c for (t, _q), c in sorted(self._queues.items()) if topic is None or t == topic]

    def run_round(self, clog: CompactionLog, *, seal: bool = False,
                  now_ms: int | None = None) -> RoundReport:
        """One round of one queue now. ``seal`` first seals the file being written, so the
        round covers everything written so far."""
        policy = self.policies.policy(clog.topic) or TopicPolicy()
        # One clock reading for "is a round due" and the round itself: a tombstone retention
        # running out between the two would otherwise start a round that restored nothing.
        now = int(time.time() * 1000) if now_ms is None else now_ms
        if seal:
            clog.seal_active()
        if not clog.compacting.acquire(blocking=False):
            return RoundReport(clog.topic, clog.queue_id, time_ms=now,
                               skipped="a round of this queue is already running")
        try:
            # Restore and round under one hold of the lock: a tier pass (scheduler, admin
            # command) cannot release the restored files before the round has seen them.
            if self.tier is not None and clog.tier_only() and round_due(clog, policy, now):
                try:
                    self.tier.restore(clog)  # the round sees every key
                except OSError as exc:
                    log.warning("compaction queue %s:%d: cannot restore its files from the "
                                "tier for a round, round skipped: %s", clog.topic,
                                clog.queue_id, exc)
                    return RoundReport(
                        clog.topic, clog.queue_id, time_ms=now,
                        skipped=f"the tier could not restore released files: {exc}")
            report = run_round_held(clog, policy, self.map_memory, now)
        finally:
            clog.compacting.release()
        self.last_reports[(clog.topic, clog.queue_id)] = report
        if self.tier is not None:
            self.tier_pass(clog, release=False)
        if report.skipped is None:
            log.info("compacted %s:%d: %d records read, %d kept, %d removed, %d tombstones "
                     "dropped, %d -> %d bytes in %.0f ms", clog.topic, clog.queue_id,
                     report.records_read, report.kept, report.removed,
                     report.tombstones_dropped, report.bytes_before, report.bytes_after,
                     report.elapsed_ms)
        return report

    def tier_pass(self, clog: CompactionLog, *, release: bool = True,
                  now_ms: int | None = None) -> int:
        """Upload the queue's sealed files the tier does not hold, then (``release``) delete
        the local ones local retention lets go; the number of local files deleted. A tier
        failure is logged: the local files stay, and the next pass tries again."""
        if self.tier is None or self.read_only:
            return 0
        with clog.compacting:
            try:
                self.tier.upload(clog)
                return self.tier.release_local(clog, now_ms) if release else 0
            except OSError as exc:
                log.warning("compaction queue %s:%d: tiering failed, local files kept: %s",
                            clog.topic, clog.queue_id, exc)
                return 0

    def run_now(self, topic: str | None = None, *, seal: bool = True,
                now_ms: int | None = None) -> list[RoundReport]:
        """A round of every queue (of ``topic``) now, on the calling thread."""
        if self.read_only:
            raise RuntimeError("compaction needs the store open for writing")
        return [self.run_round(c, seal=seal, now_ms=now_ms) for c in self.queues(topic)]

    def status(self) -> list[dict[str, Any]]:
        rows = []
        for clog in self.queues():
            held = clog.offsets()
            rows.append({
                "topic": clog.topic, "queue_id": clog.queue_id,
                "files": len(clog.segments),
                "bytes": sum(s.log_bytes for s in clog.segments),
                "messages": sum(s.units for s in clog.segments),
                "min_offset": held.low if held else 0,
                "max_offset": held.high if held else 0,
                "cleaned_to": clog.state.cleaned_to,
                "last_round": clog.state.last_round or None,
            })
        return rows

    # -- background threads ---------------------------------------------------------------------

    def start(self) -> None:
        """Start the flush and schedule threads (after the store is open)."""
        if self.read_only or self._threads or not self.config.enable_compaction:
            return
        self._stop.clear()
        self._pool = concurrent.futures.ThreadPoolExecutor(self._workers,
                                                           thread_name_prefix="compaction")
        for name, target in (("compaction-flush", self._flush_loop),
                             ("compaction-schedule", self._schedule_loop)):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def _flush_loop(self) -> None:
        interval = self.config.flush_interval_consume_queue / 1000
        while not self._stop.wait(interval):
            try:
                self.flush()
            except Exception:  # keep trying: the checkpoint only moves once a flush worked
                log.exception("flushing the CompactionLogs failed")

    def _schedule_loop(self) -> None:
        interval = self.config.compaction_schedule_internal / 1000
        # RocketMQ spreads queues' first rounds with a random delay; one jitter for all here.
        wait = interval + random.uniform(0, min(interval, 1.0))
        while not self._stop.wait(wait):
            wait = interval
            started = time.monotonic()
            pool = self._pool
            if pool is None:
                return
            futures = [pool.submit(self._scheduled, clog) for clog in self.queues()]
            for future in futures:
                try:
                    future.result()
                except Exception:
                    log.exception("a compaction round failed; the queue keeps its old files")
            log.debug("compaction pass over %d queues took %.1f s", len(futures),
                      time.monotonic() - started)

    def _scheduled(self, clog: CompactionLog) -> None:
        self.run_round(clog)
        self.tier_pass(clog)

    def close(self) -> None:
        """Stop the threads, flush, write the checkpoint and unmap (after the store's
        ``close``, so dispatch has drained)."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)
        self._threads = []
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        try:
            self.flush()
        finally:
            for clog in list(self._queues.values()):
                clog.close()
            self._queues = {}

    # -- read source ----------------------------------------------------------------------------

    def offsets(self, topic: str, queue_id: int) -> QueueOffsets | None:
        clog = self._queues.get((topic, queue_id))
        return clog.offsets() if clog is not None else None

    def read(self, request: ReadRequest) -> GetMessageResult | None:
        clog = self._queues.get((request.topic, request.queue_id))
        return clog.read(request) if clog is not None else None

    def offset_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int | None:
        clog = self._queues.get((topic, queue_id))
        return clog.offset_by_time(timestamp_ms) if clog is not None else None

    def query_by_key(self, topic: str, key: str, max_num: int, begin_ms: int,
                     end_ms: int) -> list[StoredMessage]:
        return []  # no key index of its own: the store's index answers while it holds them

    def read_by_physical_offset(self, physical_offset: int) -> StoredMessage | None:
        return None  # records are found by queue offset only

    def physical_end(self) -> int:
        """Where the records the compaction queues hold, locally or in the tier, end in the
        CommitLog they were split out of. The store asks it before it opens an empty local
        CommitLog (a new broker on a compaction tier, or one that lost its CommitLog): that
        log starts past it, so new records' offsets, and the offset message ids built on
        them, never name a record these queues still serve; and the open does not take the
        queues for a lost CommitLog tail and cut them."""
        self._load_queues()
        end = 0
        for (topic, queue_id), clog in sorted(self._queues.items()):
            try:
                end = max(end, clog.records_end())
            except OSError as exc:
                raise OSError(
                    f"compaction queue {topic}:{queue_id}: cannot read where the tier's "
                    f"records end ({exc}); an empty CommitLog must start past them, so the "
                    "store does not open until the tier can be read") from exc
        return end

    def topics(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for topic, queue_id in sorted(self._queues):
            out.setdefault(topic, []).append(queue_id)
        return out
