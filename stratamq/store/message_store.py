"""``MessageStore``: the embedded store, composed of its parts.

It owns the lifecycle (lock, abort marker, recovery, services, clean shutdown) and the public
put/get API; the work itself lives in the parts it hands their dependencies to: ``CommitLog``,
``FileConsumeQueueStore``, ``ReputService`` and the flush services.

Thread-safety: ``put_message(s)`` and every read may be called from any thread once ``open()``
returned; ``open`` and ``close`` from one thread.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from stratamq.config import BrokerRole, FlushDiskType, StoreConfig
from stratamq.names import MAX_TOPIC_NAME_BYTES, topic_name_problem
from stratamq.store.checkpoint import ConfirmOffsetSlot, StoreCheckpoint
from stratamq.store.cleanup import CleanupService
from stratamq.store.commitlog import CommitLog
from stratamq.store.consume_queue_store import (
    ConsumeQueueStore,
)
from stratamq.store.consumption import ConsumedOffsets
from stratamq.store.deleted_topics import DeletedTopics
from stratamq.store.dispatch import Dispatcher, ReputService
from stratamq.store.dispatch_bound import DispatchBound
from stratamq.store.flush import (
    AsyncFlushService,
    ConsumeQueueFlushService,
    GroupCommitService,
)
from stratamq.store.identity import StoreIdentity
from stratamq.store.index_service import IndexService
from stratamq.store.layout import StoreLayout
from stratamq.store.loader import (
    dispatch_start,
    open_consume_queue_stores,
    open_index,
    reindex,
)
from stratamq.store.local_source import LocalSource
from stratamq.store.log_reader import CommitLogReader
from stratamq.store.mapped_file_queue import AllocateMappedFileService, MappedFileQueue
from stratamq.store.parts import StoreParts
from stratamq.store.prefault import Prefaulter
from stratamq.store.put_waiters import (
    GroupCommitWaiter,
    PutWaiter,
)
from stratamq.store.read_chain import ReadChain, ReadSource
from stratamq.store.recovery import RecoveryReport, confirm_offset_at_open, recover_commitlog
from stratamq.store.replica import ReplicaLog
from stratamq.store.store_lock import StoreLocked, lock_store
from stratamq.store.store_reads import StoreReads
from stratamq.store.store_stats import StoreStats
from stratamq.store.store_writes import StoreWrites

log = logging.getLogger(__name__)


class StoreDiskFull(OSError):
    """The store cannot open: its file system has no space for what opening must write (a
    segment's reserved blocks, a replayed ConsumeQueue unit, the checkpoint)."""


class MessageStore(StoreWrites, StoreReads, DispatchBound):
    """An embedded, RocketMQ-compatible message store rooted at ``config.store_path_root_dir``.

    ``read_only=True`` opens an existing store without changing a byte (no lock, no recovery
    writes, no dispatch): for dumps and for inspecting a directory someone else owns.
    ``controller_mode=True`` (a cluster broker): the checkpoint keeps the confirm offset and an
    open holds dispatch there until the role moves the bound (``note_confirmed``).
    """

    def __init__(self, config: StoreConfig | None = None, *, read_only: bool = False,
                 force_store_type: bool = False, controller_mode: bool = False,
                 **overrides: Any) -> None:
        if config is None:
            config = StoreConfig(**overrides)
        elif overrides:
            config = StoreConfig(**{**vars(config), **overrides})
        self.config = config
        self.read_only = read_only
        # True: open with config.store_type even where the directory records the other type.
        self.force_store_type = force_store_type
        self.layout = StoreLayout(config.root)
        self.cq_stores: list[ConsumeQueueStore] = []  # the primary first; two with double write
        self.recovery: RecoveryReport | None = None
        self.identity: StoreIdentity | None = None
        self.checkpoint = StoreCheckpoint()
        self._lock_fd: int | None = None
        self._opened = False
        # Called with the seconds of each CommitLog flush pass (the broker's metrics).
        self.flush_observers: list[Callable[[float], None]] = []
        self.stats = StoreStats()  # put/get totals and rates (the broker's runtime info)
        self._plugged: list[Dispatcher] = []  # add_dispatcher's, dispatched after the queues
        self.put_waiters: list[PutWaiter] = []  # what a put waits for (add_put_waiter)
        # Asked before each put: a reason to refuse it (a cluster master's fence), or None.
        self.put_guards: list[Callable[[], str | None]] = []
        self._plugged_sources: list[tuple[ReadSource, bool]] = []  # add_read_source's
        # What forced clean-up asks before it deletes unexpired files (see cleanup.py):
        self._consumed_offsets: ConsumedOffsets | None = None  # set_consumed_offsets
        self._record_holders: list[Callable[[], int]] = []  # add_record_holder
        self.read_chain = ReadChain()
        self._allocator: AllocateMappedFileService | None = None
        self._flusher: AsyncFlushService | GroupCommitService | None = None
        self._cq_flusher: ConsumeQueueFlushService | None = None
        self._prefaulter: Prefaulter | None = None
        self.cleanup: CleanupService | None = None  # retention and the disk-full mark
        self.index: IndexService | None = None  # key / unique-id lookups (messageIndexEnable)
        # Topics put_messages has already found valid: one set lookup per message after that.
        # Writers share it without a lock: a set's add, clear and ``in`` are atomic under the GIL.
        self._valid_topics: set[str] = set()
        self._max_topic_bytes: int | None = None  # NAME_MAX of the store's file system, <= 255
        # Controller mode: the checkpoint keeps the confirm offset (``confirm_phy_offset``:
        # where dispatch may go, written with the checkpoint and after each ConsumeQueue flush
        # round that finds it moved), and an open holds dispatch there (``hold_dispatch_at``)
        # until the broker's role moves the bound, so a restarted master's tail that its group
        # never confirmed, which a failover may cut, is read by no consumer; what was
        # dispatched before stays readable. RocketMQ's ``StoreCheckpoint.confirmPhyOffset``
        # and its recovery in controller mode.
        self._tracks_confirm = controller_mode
        self._confirm_slot: ConfirmOffsetSlot | None = None  # open while tracked

    # -- lifecycle ------------------------------------------------------------------------------

    def open(self) -> MessageStore:
        cfg = self.config
        root = self.layout.root
        if self.read_only:
            if not self.layout.commitlog_dir.is_dir():
                raise FileNotFoundError(f"no store at {root} (no commitlog/ directory)")
        else:
            root.mkdir(parents=True, exist_ok=True)
            self._take_lock()
        try:
            self._open_parts(cfg)
        except BaseException as exc:
            self._close_cq_stores()  # RocksDB holds a lock of its own until closed
            self._release_lock()
            if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
                raise StoreDiskFull(
                    errno.ENOSPC, f"cannot open store {root}: its file system is full "
                    f"({exc}); free some space (or move the store) and start again") from exc
            raise
        self._opened = True
        self.stats.start()
        return self

    def _open_parts(self, cfg: StoreConfig) -> None:
        abnormal = self.layout.abort.exists()
        self.checkpoint = StoreCheckpoint.read(self.layout.checkpoint)
        segment_size = (MappedFileQueue.size_on_disk(self.layout.commitlog_dir)
                        or cfg.mapped_file_size_commit_log)
        if not self.read_only and cfg.pre_allocate_mapped_file:
            self._allocator = AllocateMappedFileService()
            self._allocator.start()
        files = MappedFileQueue(self.layout.commitlog_dir, segment_size,
                                allocator=self._allocator, read_only=self.read_only)
        files.load()
        # Made with the store (before its first segment), kept for its life; replication
        # compares lineages (identity.py). None only for a read-only look at an old directory.
        self.identity = StoreIdentity.open(self.layout.identity, has_data=bool(files.files),
                                           read_only=self.read_only)
        self.store_type, self.cq_stores = open_consume_queue_stores(
            cfg, self.layout, has_data=bool(files.files), read_only=self.read_only,
            force=self.force_store_type, clean_shutdown=not abnormal)
        self.consume_queues = self.cq_stores[0]

        report = recover_commitlog(files, abnormal, self.checkpoint, cfg.check_crc_on_recover,
                                   damaged_root=self.layout.damaged_dir)
        dropped = []
        for cq_store in self.cq_stores:
            cq_store.recover()
            dropped.append(cq_store.truncate_dirty(report.end_offset))
        report.dropped_units = dropped[0]  # the primary's: a double-written copy drops the same
        self.recovery = report
        files.flushed_where = files.committed_where = report.end_offset
        if not files.files and not self.read_only and cfg.broker_role is not BrokerRole.SLAVE:
            self._start_after_sources(files)

        self.commitlog = CommitLog(files, cfg.store_host, cfg.max_message_size)
        self.log_reader = CommitLogReader(files)
        for plugged in self._plugged:  # before replay feeds them
            attach = getattr(plugged, "attach", None)
            if attach is not None:
                attach(self.log_reader)
        self.index = open_index(cfg, self.layout, self.checkpoint, abnormal=abnormal,
                                read_only=self.read_only)
        # Adding a dispatcher (index, RocksDB ConsumeQueue, compaction, tier) is one line here.
        self._dispatchers: list[Dispatcher] = [*self.cq_stores]  # both with double write
        self._dispatchers.extend(self._plugged)
        if self.index is not None and not self.read_only:
            self._dispatchers.append(self.index)
        start = dispatch_start(self.cq_stores, self._plugged_progress(),
                               self.commitlog.min_offset, report)
        self.reput = ReputService(files, self._dispatchers, start, cfg.dispatch_interval,
                                  recent=self.commitlog.recent_dispatch)
        if self._tracks_confirm and not self.read_only:  # before replay and re-indexing
            self.hold_dispatch_at(confirm_offset_at_open(
                self.checkpoint.confirm_phy_offset, self.commitlog.min_offset,
                report.end_offset))
        self.deleted_topics = DeletedTopics(self.layout.deleted_topics, read_only=self.read_only)
        self.deleted_topics.prune(self.commitlog.min_offset)
        self.reput.deleted = self.deleted_topics
        for cq_store in self.cq_stores:
            if hasattr(cq_store, "refill_source"):  # files: refills a queue found short
                cq_store.refill_source = (files, self.deleted_topics)
            pending = getattr(cq_store, "pending", None)
            if pending is not None:  # files: a new file the flush thread could not create
                pending.on_error = self.reput.fail
        # A slave's raw appends and cuts (stratamq/ha drives them; see replica.py).
        self.replica = ReplicaLog(self.commitlog, self.cq_stores, self.reput, self._plugged,
                                  cfg.check_crc_on_recover)
        self.local_source = LocalSource(lambda: self.consume_queues, self.commitlog, self.index,
                                        self.deleted_topics)
        self.read_chain = ReadChain([self.local_source])
        for source, first in self._plugged_sources:
            self.read_chain.add(source, first=first)
        if not self.read_only:
            reindex(self.index, files, self.commitlog.min_offset, self.reput.end())
            # Skips, undecoded, records every dispatcher has: most of them after a crash.
            replayed = self.reput.replay(skip_covered=True)
            if replayed:
                log.info("re-dispatched %d records from offset %d", replayed, report.start_offset)
        for cq_store in self.cq_stores:
            cq_store.correct_min_offsets(self.commitlog.min_offset)
            if hasattr(cq_store, "commitlog_min_offset"):  # RocksDB: expiry seen at read time
                cq_store.commitlog_min_offset = lambda: self.commitlog.min_offset
        self.commitlog.queue_offsets = self.consume_queues.queue_offset_table()
        self._continue_queues_of_sources()
        if self.read_only:
            return
        self.layout.abort.touch()
        # Give the checkpoint its disk blocks now: rewriting them later needs no free space,
        # so a store that fills its disk can still checkpoint and close cleanly.
        self.checkpoint.write(self.layout.checkpoint)
        if self._tracks_confirm:
            self._confirm_slot = ConfirmOffsetSlot(self.layout.checkpoint, self.checkpoint)
            self._confirm_slot.set(self.reput.end())
        self._start_services(cfg, files)

    def _start_after_sources(self, files: MappedFileQueue) -> None:
        """An empty CommitLog next to a plugged read source that holds records (a tier whose
        history outlived the local files, or an offloaded history this store adopted) starts
        at the first segment boundary past them, so the CommitLog offsets of new messages, and
        the offset message ids built on them, never name a record of that history. A source
        tells where its records end with an optional ``physical_end()``. (A slave's log
        follows its master's offsets instead.)"""
        end = 0
        for source, _first in self._plugged_sources:
            physical_end = getattr(source, "physical_end", None)
            if physical_end is not None:
                end = max(end, int(physical_end()))
        if end <= 0:
            return
        size = files.mapped_file_size
        start = -(-end // size) * size
        files.last_mapped_file(start_offset=start)
        files.flushed_where = files.committed_where = start
        log.info("empty CommitLog starts at offset %d, past the history its read sources hold "
                 "(up to %d)", start, end)

    def recover_topic_queue_table(self, timeout: float = 30.0) -> None:
        """Before a slave's store takes puts as a master (a cluster's election): wait until
        every replicated record is dispatched, then take each queue's next offset from the
        ConsumeQueues (RocketMQ's ``recoverTopicQueueTable`` in ``changeToMaster``). A slave's
        appends are copies that assign no queue offsets, so the table it opened with is stale.
        TimeoutError if dispatch does not catch up (the caller must not take puts then)."""
        deadline = time.monotonic() + timeout
        while self.reput.behind_bytes() > 0:
            if self.reput.error is not None:
                raise RuntimeError(f"dispatch failed: {self.reput.error}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"dispatch is {self.reput.behind_bytes()} bytes behind "
                                   f"after {timeout:g} s")
            self.reput.wakeup()
            time.sleep(0.01)
        with self.reput.paused(timeout):  # no dispatch round half done while the table moves
            self.commitlog.queue_offsets = self.consume_queues.queue_offset_table()
            self._continue_queues_of_sources()

    def _continue_queues_of_sources(self) -> None:
        """A queue that a plugged read source holds further than the local ConsumeQueues (a
        broker that adopted an offloaded tier's history, or lost its local files) continues
        after it: its next message gets the next offset, not one the history already uses.
        The local queue then starts there, with blank units before, as after expiry."""
        offsets = self.commitlog.queue_offsets
        for source in self.read_chain.sources:
            if source is self.local_source:
                continue
            for topic, queue_ids in source.topics().items():
                for queue_id in queue_ids:
                    held = source.offsets(topic, queue_id)
                    if held is not None and held.high > offsets.get((topic, queue_id), 0):
                        offsets[(topic, queue_id)] = held.high

    def _close_cq_stores(self) -> None:
        for cq_store in self.cq_stores:
            cq_store.close()

    def _flush_cq_stores(self, least_pages: int) -> None:
        for cq_store in self.cq_stores:
            cq_store.flush(least_pages)

    def add_dispatcher(self, dispatcher: Dispatcher) -> None:
        """Plug in a dispatcher (a tier uploader, a compaction log) before ``open``: it is fed
        every record after the ConsumeQueues and the index, replayed from its
        ``durable_offset()`` on open, and holds clean-up back while it lags (see
        ``Dispatcher``)."""
        if self._opened:
            raise RuntimeError("add dispatchers before the store is opened")
        self._plugged.append(dispatcher)

    def parts(self) -> StoreParts:
        """The open store's parts, for tools that work on them (verify, inspections)."""
        return StoreParts(self.config, self.layout, self.read_only, self.commitlog,
                          list(self.cq_stores), self.index, self.recovery, self._quiesce)

    def _quiesce(self) -> None:
        if self.read_only:
            return
        self.reput.shutdown()
        if self.cleanup is not None:
            self.cleanup.shutdown()

    def _plugged_progress(self) -> int | None:
        """The lowest ``durable_offset()`` of the plugged-in dispatchers (None: none says)."""
        offsets = [f() for d in self._plugged
                   if (f := getattr(d, "durable_offset", None)) is not None]
        return min(offsets) if offsets else None

    def _start_services(self, cfg: StoreConfig, files: MappedFileQueue) -> None:
        if cfg.flush_disk_type is FlushDiskType.SYNC_FLUSH:
            group_commit = GroupCommitService(files, self._note_commitlog_flushed,
                                              self.flush_observers, cfg.sync_flush_timeout,
                                              cfg.sync_flush_group_linger)
            self._flusher = group_commit
            # First, and only one: a store opened again must not wait on its last service.
            self.put_waiters[:] = [GroupCommitWaiter(group_commit), *(
                w for w in self.put_waiters if not isinstance(w, GroupCommitWaiter))]
        else:
            self._flusher = AsyncFlushService(
                files, cfg.flush_interval_commit_log, cfg.flush_commit_log_least_pages,
                cfg.flush_commit_log_thorough_interval, self._note_commitlog_flushed,
                self.flush_observers,
            )
        self._cq_flusher = ConsumeQueueFlushService(
            self._flush_cq_stores, cfg.flush_interval_consume_queue,
            cfg.flush_consume_queue_least_pages, cfg.flush_consume_queue_thorough_interval,
            sample_progress=lambda: self.reput.last_store_timestamp,
            on_thorough_flush=self._write_checkpoint,
            after_round=self._save_confirm_offset if self._tracks_confirm else None,
        )
        if cfg.broker_role is not BrokerRole.SLAVE:
            self.start_prefaulter()
        self.commitlog.on_append = self._on_append
        self._flusher.start()
        self._cq_flusher.start()
        self.reput.start()
        # Files go only once dispatched and flushed past (see CleanupService.safe_offset).
        self.cleanup = CleanupService(
            cfg, self.layout.root, files, self.cq_stores, index_service=self.index,
            safe_offset=self._cleanup_safe_offset,
            consumed_offsets=lambda: (self._consumed_offsets()
                                      if self._consumed_offsets is not None else None),
            held_elsewhere=self._held_elsewhere,
        )
        self.cleanup.start()

    def start_prefaulter(self) -> None:
        """Fault the CommitLog's next pages in ahead of the appends (a master's; a broker
        elected at run time calls it, ``stop_prefaulter`` when it steps down). Not on a slave:
        its appends come in big copies (pwrite). Under SYNC_FLUSH pages are faulted in for
        reading: faulted in for writing they would be dirty, and the group commit's next
        fdatasync would write them out as zeros inside a put's wait."""
        if self._prefaulter is not None or self.read_only:
            return
        self._prefaulter = Prefaulter(
            self.commitlog.files, write=self.config.flush_disk_type is FlushDiskType.ASYNC_FLUSH)
        self._prefaulter.start()

    def stop_prefaulter(self) -> None:
        prefaulter, self._prefaulter = self._prefaulter, None
        if prefaulter is not None:
            prefaulter.shutdown()

    def set_consumed_offsets(self, provider: ConsumedOffsets) -> None:
        """Register what consumer groups have consumed (the broker's offsets and pop
        progress; ``store/consumption.py`` says the shape), any time. Under
        ``diskFullPolicy=REFUSE_PUTS`` forced clean-up deletes only files below it; without
        one, no message counts as consumed."""
        self._consumed_offsets = provider

    def add_record_holder(self, durable_offset: Callable[[], int]) -> None:
        """Register a place that keeps the CommitLog's records below ``durable_offset()``
        away from the local disk (a tier's uploader): forced clean-up may delete files below
        it whatever the consumers have consumed, as nothing is lost."""
        self._record_holders.append(durable_offset)

    def _held_elsewhere(self) -> int | None:
        offsets = [f() for f in self._record_holders]
        return min(offsets) if offsets else None

    def _cleanup_safe_offset(self) -> int:
        """Below this, CommitLog files may go: flushed, dispatched, and processed durably by
        every plugged-in dispatcher, unless one lags more than dispatcherRetentionHoldMaxBytes
        (a tier that cannot keep up must not fill the local disk)."""
        files = self.commitlog.files
        safe = min(files.flushed_where, self.reput.reput_from)
        plugged = self._plugged_progress()
        if plugged is not None and plugged < safe:
            floor = safe - self.config.dispatcher_hold_max_bytes
            if plugged < floor:
                log.warning("a plugged-in dispatcher is %d bytes behind, more than "
                            "dispatcherRetentionHoldMaxBytes (%d): clean-up no longer waits "
                            "for it", safe - plugged, self.config.dispatcher_hold_max_bytes)
                return floor
            return plugged
        return safe

    def _on_append(self) -> None:
        # The async flusher is not woken per put: it looks every flushIntervalCommitLog ms and
        # flushes once flushCommitLogLeastPages are dirty, which is what that setting means.
        # Dispatch runs here when the dispatcher thread is idle (see ReputService.dispatch_now),
        # except on a slave: its only appender, the replication thread, may hold dispatch back
        # (ReplicaLog.hold_dispatch) and would wait on itself; its appends are big anyway.
        prefaulter = self._prefaulter  # (a role switch may stop it meanwhile)
        if prefaulter is not None:
            prefaulter.appended()
        reput = self.reput
        if self.config.broker_role is BrokerRole.SLAVE or not reput.dispatch_now():
            reput.wakeup()

    def _note_commitlog_flushed(self) -> None:
        ts = self.commitlog.files.store_timestamp
        if ts > self.checkpoint.physic_msg_timestamp:
            self.checkpoint.physic_msg_timestamp = ts

    def _write_checkpoint(self, logics_timestamp: int) -> None:
        # Where dispatch may go now: the bound (a master's confirm offset, a held value), else
        # the log's end (a slave in step with its master, as RocketMQ's slave takes its
        # master's confirm offset). Never past what the group held when it was read.
        self._save_confirm_offset()
        if logics_timestamp > self.checkpoint.logics_msg_timestamp:
            self.checkpoint.logics_msg_timestamp = logics_timestamp
        if self.index is not None and not self.read_only:
            indexed = self.index.flush()  # entries up to this store time are now on disk
            if indexed > self.checkpoint.index_msg_timestamp:
                self.checkpoint.index_msg_timestamp = indexed
        self.checkpoint.write(self.layout.checkpoint)

    def _take_lock(self) -> None:
        self._lock_fd = lock_store(self.layout)

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing drops the flock
            self._lock_fd = None

    def close(self) -> None:
        """Drain dispatch, flush everything, write the checkpoint, remove ``abort``."""
        if not self._opened:
            return
        self._opened = False
        self.stats.stop()
        if not self.read_only:
            if self.cleanup is not None:
                self.cleanup.shutdown()
            self.reput.shutdown()
            # An appender's inline round (dispatch_now) that began before the stop ends before
            # the queues close (bounded like the thread's join).
            with contextlib.suppress(TimeoutError), self.reput.paused(self.reput.join_timeout):
                pass
            if self._flusher is not None:
                self._flusher.shutdown()
            if self._cq_flusher is not None:
                self._cq_flusher.shutdown()
            self.stop_prefaulter()
            if self._allocator is not None:
                self._allocator.shutdown()
            self.commitlog.files.flush_all()
            self._note_commitlog_flushed()
            # File ConsumeQueues create the files still waiting in memory; where they cannot
            # (a full disk) the store is left as after a crash: ConsumeQueue progress not
            # advanced, no snapshot, the abort marker kept, so the next open re-dispatches
            # those units from the CommitLog.
            settled = all([settle() for s in self.cq_stores
                           if (settle := getattr(s, "settle", None)) is not None])
            self._write_checkpoint(self.reput.last_store_timestamp if settled else 0)
            if settled:
                for cq_store in self.cq_stores:
                    # Positions for the next open, which then reads no queue it does not use
                    # (file ConsumeQueues, consume_queue_snapshot.py); saved before ``abort``
                    # goes.
                    save = getattr(cq_store, "save_snapshot", None)
                    if save is not None:
                        save(self.commitlog.min_offset, self.commitlog.max_offset)
                self.layout.abort.unlink(missing_ok=True)
            else:
                log.error("store closed with ConsumeQueue units in memory only (their files "
                          "could not be created): the next open re-dispatches them from the "
                          "CommitLog")
        slot, self._confirm_slot = self._confirm_slot, None
        if slot is not None:
            slot.close()
        self._close_cq_stores()
        if self.index is not None:
            self.index.close()
        self.commitlog.files.close()
        self._release_lock()

    def __enter__(self) -> MessageStore:
        return self if self._opened else self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def flush(self) -> None:
        """Force everything appended so far to disk (CommitLog and ConsumeQueues)."""
        self.commitlog.files.flush_all()
        self._flush_cq_stores(0)

    def wait_dispatched(self, timeout: float = 10.0) -> bool:
        """Block until every appended record is visible through the ConsumeQueues (up to the
        dispatch bound, when one is set: ``set_dispatch_bound``)."""
        if self.read_only:
            return True
        return self.reput.wait_caught_up(timeout)

    @property
    def min_physical_offset(self) -> int:
        return self.commitlog.min_offset

    @property
    def max_physical_offset(self) -> int:
        return self.commitlog.max_offset

    @property
    def is_open(self) -> bool:
        return self._opened

    @property
    def flushed_offset(self) -> int:
        """CommitLog bytes below this offset are on disk."""
        return self.commitlog.files.flushed_where

    def oldest_store_timestamp(self) -> int:
        """Store time of the oldest record still in the CommitLog (0 if none)."""
        return self.commitlog.store_timestamp_at(self.commitlog.min_offset) or 0

__all__ = ["MAX_TOPIC_NAME_BYTES", "MessageStore", "StoreDiskFull", "StoreLocked",
           "lock_store", "topic_name_problem"]
