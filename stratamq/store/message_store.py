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
import fcntl
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from stratamq.config import BrokerRole, FlushDiskType, StoreConfig
from stratamq.names import MAX_TOPIC_NAME_BYTES, topic_name_problem
from stratamq.record import DispatchInfo, Message, Prop, StoredMessage, parse_offset_msg_id
from stratamq.store.checkpoint import ConfirmOffsetSlot, StoreCheckpoint
from stratamq.store.cleanup import CleanupService
from stratamq.store.commitlog import CommitLog
from stratamq.store.consume_queue_store import (
    ConsumeQueueStore,
)
from stratamq.store.consumption import ConsumedOffsets
from stratamq.store.deleted_topics import DeletedTopics
from stratamq.store.dispatch import Dispatcher, ReputService
from stratamq.store.filter import TagFilter
from stratamq.store.flush import (
    AsyncFlushService,
    ConsumeQueueFlushService,
    GroupCommitService,
    Wake,
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
    all_call_back,
    end_to_wait_for,
    wait_in_turn,
    wait_in_turn_later,
)
from stratamq.store.read_chain import ReadChain, ReadRequest, ReadSource
from stratamq.store.recovery import RecoveryReport, confirm_offset_at_open, recover_commitlog
from stratamq.store.replica import ReplicaLog
from stratamq.store.results import (
    GetMessageResult,
    PutMessageResult,
    PutMessageStatus,
)

log = logging.getLogger(__name__)


class StoreLocked(RuntimeError):
    """Another process has the store open."""


def lock_store(layout: StoreLayout) -> int:
    """Take the store directory's lock; the descriptor holds it until closed. StoreLocked
    when another process (or store) holds it."""
    fd = os.open(layout.lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        # flock excludes other StrataMQ stores, even in this process; a POSIX record lock on
        # byte 0 is what Apache RocketMQ takes (FileChannel.tryLock(0, 1, false)), so a
        # RocketMQ broker and StrataMQ never open one directory together either.
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
    except OSError:
        os.close(fd)
        raise StoreLocked(f"store {layout.root} is open in another process") from None
    return fd


class StoreDiskFull(OSError):
    """The store cannot open: its file system has no space for what opening must write (a
    segment's reserved blocks, a replayed ConsumeQueue unit, the checkpoint)."""


class MessageStore:
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

    def _save_confirm_offset(self) -> None:
        """Every ConsumeQueue flush round in controller mode: the confirm offset as dispatch's
        bound says now. A slave's follows its log (back too, after a cut); a master's only
        rises: its acknowledged puts raised it (``note_confirmed``), and a SyncStateSet that
        grew may bound dispatch lower for a moment without unconfirming them."""
        slot = self._confirm_slot
        if slot is None:
            return
        if self.config.broker_role is BrokerRole.SLAVE:
            slot.set(self.reput.end())
        else:
            slot.raise_to(self.reput.end())

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

    # -- writing --------------------------------------------------------------------------------

    def put_message(self, msg: Message) -> PutMessageResult:
        return self.put_messages([msg])

    def put_messages(self, messages: Sequence[Message], *, wait: bool = True
                     ) -> PutMessageResult:
        """Append messages in order; under SYNC_FLUSH return once they are on disk.

        ``wait=False``: return once they are appended; the caller then calls ``wait_put``
        (from a thread that may block) before it acknowledges them."""
        if not self._opened or self.read_only:
            return PutMessageResult(PutMessageStatus.SERVICE_NOT_AVAILABLE,
                                    error="store is not open for writing")
        if self.config.broker_role is BrokerRole.SLAVE:  # RocketMQ's checkStoreStatus
            return PutMessageResult(PutMessageStatus.SERVICE_NOT_AVAILABLE,
                                    error="broker role is SLAVE: puts are forbidden")
        if self.reput.error is not None:
            return PutMessageResult(PutMessageStatus.SERVICE_NOT_AVAILABLE,
                                    error=f"dispatch failed: {self.reput.error}")
        for guard in self.put_guards:
            refusal = guard()
            if refusal is not None:
                return PutMessageResult(PutMessageStatus.SERVICE_NOT_AVAILABLE, error=refusal)
        refusal = self.cleanup.put_refusal() if self.cleanup is not None else None
        if refusal is not None:  # past diskSpaceWarningLevelRatio: RocketMQ's DISK_FULL flag
            return PutMessageResult(PutMessageStatus.SERVICE_NOT_AVAILABLE, error=refusal)
        # Checked before anything of the batch is written: a topic that cannot be a ConsumeQueue
        # directory would otherwise be acknowledged and then stop dispatch for good.
        valid = self._valid_topics
        for m in messages:
            if m.topic not in valid:
                problem = self._topic_problem(m.topic)
                if problem is not None:
                    return PutMessageResult(PutMessageStatus.MESSAGE_ILLEGAL, error=problem)
        now = 0
        for m in messages:
            if not m.born_timestamp:  # none given: "now", not 1970 (RocketMQ's producer sets it)
                m.born_timestamp = now or (now := int(time.time() * 1000))
        result = self.commitlog.append(messages)
        return self.wait_put(result, messages) if wait else result

    @property
    def waits_on_put(self) -> bool:
        """Whether a put may have to wait after its append (SYNC_FLUSH, put waiters)."""
        return bool(self.put_waiters)

    def wait_put(self, result: PutMessageResult, messages: Sequence[Message]
                 ) -> PutMessageResult:
        """What ``put_messages`` waits for after its append: each put waiter in turn (group
        commit first under SYNC_FLUSH), unless every message said ``WAIT=false``; the first
        refusal becomes ``result.status``. Returns ``result``."""
        end = end_to_wait_for(result, messages) if self.put_waiters else None
        if end is not None:
            wait_in_turn(self.put_waiters, result, end)
        return result

    @property
    def put_waits_call_back(self) -> bool:
        """Whether ``wait_put_later`` can wait: every put waiter answers by a callback."""
        return all_call_back(self.put_waiters)

    def wait_put_later(self, result: PutMessageResult, messages: Sequence[Message],
                       done: Callable[[PutMessageResult], Wake | None],
                       linger: bool = False) -> None:
        """``wait_put`` without blocking (when ``put_waits_call_back``): ``done(result)`` once
        every waiter is satisfied or one refused, on the thread of the waiter that answered
        last (the group commit's flush thread), or here if there is nothing to wait for.
        ``done`` may return a ``Wake``: the answering thread calls it after the rest of its
        group's answers (one wake-up of a loop for them all). ``linger``: the caller's
        appender is saturated (see ``GroupCommitService.request_flush``)."""
        end = end_to_wait_for(result, messages) if self.put_waiters else None
        if end is not None:
            wait_in_turn_later(self.put_waiters, result, end, done, linger)
            return
        wake = done(result)
        if wake is not None:
            wake()

    def add_put_waiter(self, waiter: PutWaiter) -> None:
        """A condition every put (that asks to wait, ``WAIT`` not false) waits for after its
        append: ``waiter(end_offset)`` returns None once the bytes before ``end_offset`` are
        where it wants them, or the status the put then answers (a replication master: "a
        slave has the bytes", else FLUSH_SLAVE_TIMEOUT). SYNC_FLUSH's group commit is the
        first. A ``CallbackPutWaiter`` can also be waited for without blocking a thread
        (``store/put_waiters.py``)."""
        self.put_waiters.append(waiter)

    def delete_topic(self, topic: str, timeout: float = 30.0, *, at: int | None = None) -> None:
        """Delete ``topic``'s messages as RocketMQ's ``deleteTopics`` does: its ConsumeQueues
        go, and its records, which stay in the CommitLog until retention, are never served for
        it again (a topic created later under the name starts empty, at queue offset 0, even
        after a crash and a replay). Returns once the ConsumeQueues are gone.

        ``at`` is for a slave applying its master's deletion: the master's cutoff (where the
        topic's next generation starts in the shared CommitLog), which this log must already
        hold. The slave's own end would be later, and the next generation's records between
        the two would be deleted with the old ones."""
        if not self._opened or self.read_only:
            raise RuntimeError("store is not open for writing")
        if at is not None:
            if not 0 <= at <= self.commitlog.max_offset:
                raise ValueError(f"cannot delete topic {topic!r} at CommitLog offset {at}: this "
                                 f"log ends at {self.commitlog.max_offset}")
            def note_cutoff() -> None:  # durable before the queues go, and only if they will
                self.deleted_topics.add(topic, at)
                self.deleted_topics.save()

            # A bounded wait for the round lock: a slave catching up holds a round for as long
            # as its dispatch is held back, and the state-sync thread calling this must not
            # hang for all of it (nothing is noted then: the next sync tries again).
            if not self.reput.delete_topic_behind(at, topic, timeout=timeout,
                                                  before=note_cutoff).wait(timeout):
                raise TimeoutError(f"dispatch did not reach the deletion of topic {topic!r} "
                                   f"in {timeout} s (dispatch error: {self.reput.error})")
            return

        def note(cutoff: int) -> None:
            self.deleted_topics.add(topic, cutoff)
            pending.append(self.reput.delete_topic_at(cutoff, topic))

        pending: list[threading.Event] = []
        self.commitlog.restart_topic(topic, note)
        self.deleted_topics.save()  # durable before the queues go
        if not pending[0].wait(timeout):
            raise TimeoutError(f"dispatch did not reach the deletion of topic {topic!r} in "
                               f"{timeout} s (dispatch error: {self.reput.error})")

    def _topic_problem(self, topic: object) -> str | None:
        """``topic_name_problem`` against this store's file system; remembers valid topics."""
        if self._max_topic_bytes is None:
            try:
                name_max = os.pathconf(self.layout.root, "PC_NAME_MAX")
            except (OSError, ValueError):
                name_max = MAX_TOPIC_NAME_BYTES
            # Never past 255 even where the file system allows more: the store must stay
            # copyable to an ordinary one (and readable by RocketMQ there).
            self._max_topic_bytes = min(name_max, MAX_TOPIC_NAME_BYTES)
        problem = topic_name_problem(topic, self._max_topic_bytes)
        if problem is None:
            if len(self._valid_topics) >= 100_000:  # bounded; a miss costs only a regex match
                self._valid_topics.clear()
            self._valid_topics.add(topic)  # type: ignore[arg-type]
        return problem

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

    # -- reading --------------------------------------------------------------------------------

    def get_messages(
        self,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int | None = None,
        max_bytes: int | None = None,
        tag_filter: str | TagFilter | None = None,
    ) -> GetMessageResult:
        """Read from ``topic``/``queue_id`` starting at queue ``offset``, through the read chain
        (the local queues first, then whatever is plugged in: see ``add_read_source``).

        ``group`` names the reader (kept for RocketMQ parity; the store tracks no progress).
        Records come back as zero-copy views: release the result when done with them.
        """
        max_count = max_count or self.config.max_transfer_count_on_message_in_memory
        max_bytes = max_bytes or self.config.max_transfer_bytes_on_message_in_memory
        filt = tag_filter if isinstance(tag_filter, TagFilter) else TagFilter(tag_filter)
        return self.read_chain.read(ReadRequest(topic, queue_id, offset, max_count, max_bytes,
                                                filt))

    def add_read_source(self, source: ReadSource, *, first: bool = False) -> None:
        """Plug in a read source (a tier fetcher, a compaction log): asked after the local
        ConsumeQueues, or before them with ``first=True``. A read is answered by the first
        source that holds the offset; min/max offsets, offsets by time and lookups by key or
        id ask every source (see ``read_chain``)."""
        if self._opened:
            self.read_chain.add(source, first=first)
        else:
            self._plugged_sources.append((source, first))

    def get_min_offset_in_queue(self, topic: str, queue_id: int) -> int:
        held = self.read_chain.offsets(topic, queue_id)
        return held.low if held else 0

    def get_max_offset_in_queue(self, topic: str, queue_id: int) -> int:
        held = self.read_chain.offsets(topic, queue_id)
        return held.high if held else 0

    def look_message_by_offset(self, physical_offset: int) -> StoredMessage | None:
        """Decode the record at a CommitLog offset (e.g. from an offset message id)."""
        return self.read_chain.read_by_physical_offset(physical_offset)

    # -- lookups by key, message id and time (index: docs/formats/index-file.md) --------------

    def query_messages(self, topic: str, key: str, max_num: int = 64, begin_ms: int = 0,
                       end_ms: int | None = None) -> list[StoredMessage]:
        """Messages of ``topic`` carrying ``key`` (a word of KEYS, or the unique id) stored
        in [begin_ms, end_ms], newest first, at most ``max_num``; [] with the index off."""
        if max_num <= 0:
            return []
        end = 2**63 - 1 if end_ms is None else end_ms
        return self.read_chain.query_by_key(topic, key, max_num, begin_ms, end)

    def look_message_by_msg_id(self, msg_id: str, topic: str | None = None
                               ) -> StoredMessage | None:
        """The message with this id: an offset message id (store host + CommitLog offset) or
        a unique client id (``UNIQ_KEY``, found through the index, in ``topic`` or any)."""
        msg_id = msg_id.strip()
        try:
            host, phys = parse_offset_msg_id(msg_id)
        except ValueError:
            pass
        else:
            msg = self.read_chain.read_by_physical_offset(phys)
            if msg is not None and msg.physical_offset == phys and msg.store_host == host:
                return msg
        for name in [topic] if topic is not None else list(self.topics()):
            for hit in self.read_chain.query_by_key(name, msg_id, 8, 0, 2**63 - 1):
                if hit.properties.get(Prop.UNIQ_KEY) == msg_id:
                    return hit
        return None

    def get_offset_in_queue_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """First queue offset whose message was stored at or after ``timestamp_ms``; the
        queue's max offset if none was (0 for an unknown queue)."""
        return self.read_chain.offset_by_time(topic, queue_id, timestamp_ms)

    def topics(self) -> dict[str, list[int]]:
        """Every topic any read source holds (the local ConsumeQueues first), with its queue
        ids."""
        return self.read_chain.topics()

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

    def add_dispatch_listener(self, listener: Callable[[DispatchInfo], None]) -> None:
        """Call ``listener(info)`` on the dispatcher thread with the newest record of each topic
        a dispatch round made readable (long-poll wake-ups). Open store only; keep it quick."""
        if not self._opened:
            raise RuntimeError("add dispatch listeners once the store is open")
        self.reput.listeners.append(listener)

    def remove_dispatch_listener(self, listener: Callable[[DispatchInfo], None]) -> None:
        """Stop calling ``listener``; a listener never added (or a closed store) is fine."""
        listeners = self.reput.listeners if self._opened else []
        if listener in listeners:
            listeners.remove(listener)

    def oldest_store_timestamp(self) -> int:
        """Store time of the oldest record still in the CommitLog (0 if none)."""
        return self.commitlog.store_timestamp_at(self.commitlog.min_offset) or 0

    def dispatch_behind_bytes(self) -> int:
        return self.reput.behind_bytes()

    def set_dispatch_bound(self, bound: Callable[[], int] | None) -> None:
        """Dispatch (ConsumeQueues, index, dispatch listeners) goes no further than
        ``bound()``, a record boundary (None: the log's end). A controller-mode master's bound
        is RocketMQ's confirm offset: what its SyncStateSet holds, so no consumer reads a
        message a failover may cut (it would then skip the message that takes its offset).
        Call ``wake_dispatch`` when the bound moves."""
        files = self.reput.files
        self.reput.end = (files.max_offset if bound is None
                          else lambda: min(files.max_offset(), bound()))
        self.reput.wakeup()

    def note_confirmed(self, end: int) -> None:
        """Controller mode: a put ending at ``end`` is about to be acknowledged (its group
        has it): the checkpoint's confirm offset covers it first, so a restart never holds
        an acknowledged message back. No-op otherwise."""
        slot = self._confirm_slot
        if slot is not None:
            slot.raise_to(end)

    def hold_dispatch_at(self, offset: int) -> None:
        """Dispatch goes no further than ``offset`` until ``set_dispatch_bound`` moves the
        bound (a controller-mode slave, until its log is in step with its master's)."""
        self.set_dispatch_bound(lambda: offset)

    def hold_dispatch_where_bound(self) -> None:
        """``hold_dispatch_at`` where dispatch may go now (the bound's value, else the log's
        end): a master stepping down keeps its unconfirmed tail unread."""
        self.hold_dispatch_at(self.reput.end())

    def wake_dispatch(self) -> None:
        """Dispatch looks again: its bound (``set_dispatch_bound``) moved."""
        self.reput.wakeup()

    def dispatch_progress(self) -> tuple[int, int]:
        """(offset dispatch has reached, where it stops now: the log's end or its bound)."""
        return self.reput.reput_from, self.reput.end()


__all__ = ["MAX_TOPIC_NAME_BYTES", "MessageStore", "StoreDiskFull", "StoreLocked",
           "lock_store", "topic_name_problem"]
