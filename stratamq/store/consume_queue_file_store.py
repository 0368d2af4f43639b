"""The file ConsumeQueue store (``storeType=default``): every topic/queue's ``ConsumeQueue``
(consume_queue.py), created on first dispatch, loaded from the directory or, after a clean
close, from the snapshot it saved (consume_queue_snapshot.py). A dispatcher.

Contracts: the dispatcher thread writes (``dispatch_batch``, ``commit_dispatch``); readers on
any thread use ``find`` and the queue it returns; ``load``/``recover``/``truncate_dirty``/
``correct_min_offsets`` run on the opening thread before any other.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from stratamq.record import DispatchInfo
from stratamq.store.consume_queue import (
    PREPARED_OR_ROLLED_BACK,
    STAGED_UNITS_MAX,
    ConsumeQueue,
    segment_listing,
)
from stratamq.store.consume_queue_format import UNIT, UNIT_SIZE
from stratamq.store.consume_queue_pending import PendingFiles
from stratamq.store.consume_queue_snapshot import (
    ConsumeQueueSnapshot,
    directory_mtime_ns,
    take_snapshot,
    write_snapshot,
)
from stratamq.store.deleted_topics import DeletedTopics
from stratamq.store.layout import StoreLayout
from stratamq.store.mapped_file_queue import MappedFileQueue

log = logging.getLogger(__name__)

class FileConsumeQueueStore:
    """Every file ConsumeQueue of a store, created on first use. A dispatcher.

    ``storeType=default``; see ``consume_queue_store.ConsumeQueueStore`` for the interface."""

    store_type = "default"

    def __init__(self, layout: StoreLayout, default_file_size: int, *, read_only: bool = False):
        self.layout = layout
        self.default_file_size = default_file_size
        self.read_only = read_only
        # New queues' first files wait in memory until the flush thread creates them: 10,000
        # new queues cost no file creation on the dispatch path (consume_queue_pending.py).
        self.pending = None if read_only else PendingFiles()
        self._queues: dict[tuple[str, int], ConsumeQueue] = {}
        self._lock = threading.Lock()
        # Queues holding staged units of the current dispatch round, and how many units.
        self._staged: dict[ConsumeQueue, None] = {}
        self._staged_units = 0
        # Set by the opener when the store was closed cleanly (no abort marker): ``load`` may
        # then take the queues' positions from the snapshot that close saved.
        self.clean_shutdown = False
        # (CommitLog min, end) the snapshot loaded from was saved with: checked once recovery
        # knows them (``truncate_dirty``, ``correct_min_offsets``); None when none is in use.
        self._snapshot_span: tuple[int, int] | None = None
        # The CommitLog min offset the unloaded queues' saved min offsets were corrected for.
        self._lazy_as_of_min: int | None = None
        # The CommitLog's segments and the deleted topics' cutoffs, set by the opener: a queue
        # opened from a snapshot whose files turn out short is refilled from them (``_refill``).
        self.refill_source: tuple[MappedFileQueue, DeletedTopics] | None = None

    def load(self) -> None:
        root = self.layout.consumequeue_dir
        snapshot = None if self.read_only else take_snapshot(self.layout.cq_snapshot)
        if snapshot is not None:
            if not self.clean_shutdown:
                log.info("ConsumeQueue snapshot ignored: the store was not closed cleanly")
            elif snapshot.directory_mtime_ns != directory_mtime_ns(root):
                log.warning("ConsumeQueue snapshot ignored: %s changed after it was saved", root)
            else:
                self._load_snapshot(snapshot)
                return
        if not root.is_dir():
            return
        # scandir: the directory entries say what is a directory, so a store of many queues
        # costs a listing per queue and one stat, not several of each.
        for topic_entry in sorted(os.scandir(root), key=lambda e: e.name):
            if not topic_entry.is_dir():
                continue
            topic_dir = Path(topic_entry.path)
            for queue_entry in sorted(os.scandir(topic_dir), key=lambda e: e.name):
                if not queue_entry.name.isdigit() or not queue_entry.is_dir():
                    continue
                queue_dir = topic_dir / queue_entry.name
                segments = segment_listing(queue_entry.path)
                if not segments:
                    continue
                size = segments[0][1].stat().st_size or self.default_file_size
                if size % UNIT_SIZE:
                    raise ValueError(f"{queue_dir}: file size {size} is not a multiple of 20")
                cq = ConsumeQueue(topic_dir.name, int(queue_entry.name), queue_dir, size,
                                  read_only=self.read_only, pending=self.pending)
                cq.load(segments)
                self._queues[(cq.topic, cq.queue_id)] = cq

    def _load_snapshot(self, snapshot: ConsumeQueueSnapshot) -> None:
        """Every queue of the snapshot, none of them loaded: no directory is listed and no file
        opened until a queue is used."""
        queues = self._queues
        root = self.layout.consumequeue_dir
        topic_dirs: dict[str, Path] = {}  # paths are costly to build: one per topic, for now
        for (topic, queue_id), positions in snapshot.queues.items():
            topic_dir = topic_dirs.get(topic)
            if topic_dir is None:
                topic_dir = topic_dirs[topic] = self.layout.consume_queue_topic_dir(topic, root)
            cq = queues[(topic, queue_id)] = ConsumeQueue(
                topic, queue_id, None, positions.file_size, read_only=self.read_only,
                positions=positions, topic_dir=topic_dir, pending=self.pending)
            cq.refill = self._refill
        self._snapshot_span = (snapshot.commitlog_min, snapshot.commitlog_end)
        self._lazy_as_of_min = snapshot.commitlog_min
        log.info("ConsumeQueues: %d queues opened from the snapshot of the last clean close",
                 len(queues))

    def _refill(self, cq: ConsumeQueue, start: int, end: int) -> int:
        """Dispatch ``cq``'s records of ``[start, end)`` of the CommitLog to it again (units it
        has are skipped by ``put_unit``); return how many were dispatched."""
        if self.refill_source is None:
            return -1  # not before the open has wired the CommitLog and the deleted topics
        files, deleted = self.refill_source
        from stratamq.store.dispatch import ReputService  # it imports the store's parts

        replay = ReputService(files, [_OneQueue(cq)], max(start, files.min_offset()))
        replay.deleted = deleted  # a deleted topic's old records are never served again
        return replay.replay(end)

    def _check_snapshot_span(self, *, commitlog_min: int | None = None,
                             commitlog_end: int | None = None) -> None:
        """Load every queue the usual way if the CommitLog is not what the snapshot saw
        (another writer, a restored backup): its positions cannot be trusted then."""
        span = self._snapshot_span
        if span is None:
            return
        if (commitlog_min is None or commitlog_min == span[0]) and (
                commitlog_end is None or commitlog_end == span[1]):
            return
        log.warning("ConsumeQueue snapshot ignored: the CommitLog spans %s..%s, it was saved "
                    "at %d..%d; reading every queue", commitlog_min, commitlog_end, *span)
        self._snapshot_span = None
        for cq in self.queues():
            cq._materialize()

    def save_snapshot(self, commitlog_min: int, commitlog_end: int) -> bool:
        """Save every queue's positions for the next open (a clean close, after the CommitLog
        and these queues are flushed); False if it could not be written (the next open reads
        every queue, as without one)."""
        if self.read_only or not self.settle():
            return False  # a snapshot never names files that do not exist
        # The saved min offsets must hold for the CommitLog as it is now, which the next open
        # checks the snapshot against and then trusts (it corrects no queue): records deleted
        # while the broker ran (clean-up, `tier clean`) may leave a queue's first units
        # pointing below the CommitLog's min, read from the tier, not from local files. A queue
        # still unloaded keeps the min offset of the snapshot it came from: right if the
        # CommitLog's min has not moved since, else it is loaded and corrected too.
        for cq in self.queues():
            if cq.loaded or self._lazy_as_of_min != commitlog_min:
                cq.correct_min_offset(commitlog_min)
        queues = {}
        for key, cq in list(self._queues.items()):
            positions = cq.positions()
            if positions is not None:
                queues[key] = positions
        snapshot = ConsumeQueueSnapshot(commitlog_min, commitlog_end,
                                        directory_mtime_ns(self.layout.consumequeue_dir), queues)
        try:
            write_snapshot(self.layout.cq_snapshot, snapshot)
        except OSError as exc:
            log.warning("cannot save the ConsumeQueue snapshot (%s): the next open reads every "
                        "queue", exc)
            return False
        return True

    def recover(self) -> None:
        for cq in self._queues.values():
            cq.recover()

    def queues(self) -> list[ConsumeQueue]:
        return list(self._queues.values())

    def __iter__(self) -> Iterator[ConsumeQueue]:
        return iter(list(self._queues.values()))

    def find(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        return self._queues.get((topic, queue_id))

    def find_or_create(self, topic: str, queue_id: int) -> ConsumeQueue:
        key = (topic, queue_id)
        cq = self._queues.get(key)
        if cq is None:
            with self._lock:
                cq = self._queues.get(key)
                if cq is None:
                    directory = self.layout.consume_queue_dir(topic, queue_id)
                    cq = ConsumeQueue(topic, queue_id, directory, self.default_file_size,
                                      read_only=self.read_only, pending=self.pending)
                    self._queues[key] = cq
        return cq

    # -- the dispatcher interface ---------------------------------------------------------------

    def replay_floor(self, topic: str, queue_id: int) -> int:
        """Records of this queue below the returned offset are here (see ``put_unit``)."""
        cq = self._queues.get((topic, queue_id))
        return cq.max_physic_offset if cq is not None else -1

    def dispatch(self, info: DispatchInfo) -> None:
        """One record: ``dispatch_batch`` of it, a unit that cannot be written raising."""
        self.dispatch_batch([info], _raise_failure)

    def dispatch_batch(self, infos: list[DispatchInfo],
                       failed: Callable[[DispatchInfo, OSError], None]) -> None:
        """``dispatch`` of each record in order (a dispatch round's run, see ``Dispatcher``),
        its lookups made once; ``failed(info, exc)`` for a record whose unit cannot be
        written.

        A unit its queue's staging cursor takes (the next queue offset, in the cursor's
        file, not a replay: what ``stage_unit`` checks first) is staged here without a call:
        that is nearly every unit, and a call per unit was most of its cost."""
        queues = self._queues
        staged = self._staged
        pack = UNIT.pack
        for info in infos:
            # SysFlag.is_dispatchable as one bit test (a call per record otherwise): prepared
            # and rolled-back transactional records are not consumable.
            if info.sys_flag & PREPARED_OR_ROLLED_BACK:
                continue
            cq = queues.get((info.topic, info.queue_id))
            end = info.physical_offset + info.size
            if (cq is not None and info.queue_offset == cq._staged_next
                    and info.queue_offset < cq._staged_stop and end > cq._staged_end):
                cq._staged += pack(info.physical_offset, info.size, info.tags_code)
                cq._staged_next = info.queue_offset + 1
                cq._staged_end = end
            else:
                try:
                    if cq is None:
                        cq = self.find_or_create(info.topic, info.queue_id)
                    if not cq.stage_unit(info.queue_offset, info.physical_offset, info.size,
                                         info.tags_code):
                        # Units are written at the end of the round (commit_dispatch), one
                        # copy per queue; one that is not staged goes after what is.
                        cq.write_staged()
                        cq.put_unit(info.queue_offset, info.physical_offset, info.size,
                                    info.tags_code)
                        continue
                except OSError as exc:
                    failed(info, exc)
                    continue
            staged[cq] = None
            self._staged_units += 1
            if self._staged_units >= STAGED_UNITS_MAX:
                # As in ``dispatch``: a failed write of the staged units fails the round.
                self.commit_dispatch()
                staged = self._staged

    # -- whole-store operations -----------------------------------------------------------------

    def max_physic_offset(self) -> int:
        return max((cq.max_physic_offset for cq in self._queues.values()), default=-1)

    def truncate_dirty(self, commitlog_end: int) -> int:
        self._check_snapshot_span(commitlog_end=commitlog_end)
        return sum(cq.truncate_dirty(commitlog_end) for cq in self._queues.values())

    def correct_min_offsets(self, commitlog_min_offset: int) -> None:
        self._check_snapshot_span(commitlog_min=commitlog_min_offset)
        if self._snapshot_span is not None:
            # The CommitLog is as the snapshot saw it: the queues it holds were corrected
            # against this very min offset before the close.
            self._snapshot_span = None
            queues = [cq for cq in self._queues.values() if cq.loaded]
        else:
            queues = list(self._queues.values())
        for cq in queues:
            cq.correct_min_offset(commitlog_min_offset)

    def delete_expired(self, min_commitlog_offset: int) -> int:
        """Delete every queue's files wholly below the CommitLog's min; return the count."""
        return sum(cq.delete_expired(min_commitlog_offset) for cq in self.queues())

    def queue_offset_table(self) -> dict[tuple[str, int], int]:
        return {key: cq.max_offset() for key, cq in self._queues.items()}

    # -- the rest of the ConsumeQueueStore interface (consume_queue_store.py) -------------------

    def commit_dispatch(self) -> None:
        """Write the units staged this round (the dispatcher, end of each round): readers
        see a round's units once it is committed, as with the RocksDB ConsumeQueue store.
        Raises the error that keeps new files from being created (a full disk): dispatch
        stops on it, as on a file it could not create itself."""
        self._write_staged()
        pending = self.pending
        if pending is not None and pending.error is not None:
            pending.check()

    def _write_staged(self) -> None:
        if not self._staged:
            return
        queues, self._staged = self._staged, {}
        self._staged_units = 0
        for cq in queues:
            cq.write_staged()

    def in_memory_files(self) -> int:
        """ConsumeQueue files whose units are in memory only (not created yet)."""
        return len(self.pending) if self.pending is not None else 0

    def settle(self) -> bool:
        """Create every pending file and flush every queue (a close); False if units remain
        in memory only (their files could not be created: the caller must leave the store
        for recovery to re-dispatch them)."""
        if self.read_only:
            return True
        self._write_staged()
        try:
            self.flush(0)
        except OSError as exc:
            log.error("ConsumeQueues not settled at close: %s", exc)
        return not self.in_memory_files()

    def topics(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for topic, queue_id in list(self._queues):
            out.setdefault(topic, []).append(queue_id)
        return {t: sorted(q) for t, q in sorted(out.items())}

    def destroy_queue(self, topic: str, queue_id: int) -> None:
        with self._lock:
            cq = self._queues.pop((topic, queue_id), None)
        if cq is not None:
            self._staged.pop(cq, None)  # normally none: deletions commit the round first
            cq.destroy()

    def destroy_topic(self, topic: str) -> None:
        for cq in [q for q in self.queues() if q.topic == topic]:
            self.destroy_queue(topic, cq.queue_id)

    def disk_bytes(self) -> int:
        return sum(cq.disk_bytes() for cq in self.queues())

    def flush(self, least_pages: int) -> None:
        """Create the pending files, then flush every queue (the flush thread). Raises
        the creation's error after flushing the rest: the checkpoint's ConsumeQueue progress
        must not pass units that are in memory only."""
        failed = self.pending.create_all() if self.pending is not None else None
        for cq in list(self._queues.values()):
            cq.flush(least_pages)
        if failed is not None:
            raise failed

    def close(self) -> None:
        if not self.read_only:
            # Normally nothing left (a store's close settled it): units staged or waiting for
            # their files are written and created, else logged (recovery re-dispatches them).
            self.settle()
        for cq in self._queues.values():
            cq.close()


def _raise_failure(info: DispatchInfo, exc: OSError) -> None:
    """``dispatch``'s ``failed``: the error is the caller's, as for any single dispatch."""
    raise exc


class _OneQueue:
    """A dispatcher feeding one queue's records to it (``FileConsumeQueueStore._refill``)."""

    def __init__(self, cq: ConsumeQueue) -> None:
        self.cq = cq

    def dispatch(self, info: DispatchInfo) -> None:
        if ((info.topic, info.queue_id) == (self.cq.topic, self.cq.queue_id)
                and not info.sys_flag & PREPARED_OR_ROLLED_BACK):
            self.cq.put_unit(info.queue_offset, info.physical_offset, info.size,
                             info.tags_code)
