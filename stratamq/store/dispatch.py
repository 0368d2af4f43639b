"""Dispatch: follow the CommitLog and feed each new record to a list of dispatchers.

A dispatcher is anything with ``dispatch(info: DispatchInfo) -> None``. The ConsumeQueue store
is the first; the index, RocksDB ConsumeQueue, compaction and tier dispatchers are added to the
same list by appending one object (see ``MessageStore._dispatchers``).

Contracts: whoever holds the round lock owns ``reput_from`` and calls the dispatchers: the
dispatcher thread, or an appender that found it idle (``dispatch_now``, right after its append),
so dispatchers see one round at a time, in log order, but not always on the same thread.
``replay`` runs on the caller's thread before the thread starts (recovery). Records are read in
place from the map, never copied.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol

from stratamq import record as codec
from stratamq.message import DispatchInfo
from stratamq.store.deleted_topics import DeletedTopics
from stratamq.store.mapped_file_queue import MappedFileQueue
from stratamq.store.service import ServiceThread

log = logging.getLogger(__name__)

# OSErrors that come from one record (its topic cannot be a ConsumeQueue directory name), not
# from the disk: dispatch skips that record instead of stopping for good, since every later
# open would replay it and fail the same way.
RECORD_ERRNOS = frozenset({errno.ENAMETOOLONG, errno.EINVAL})

# The idle dispatcher thread's longest sleep, in dispatchIntervalMs (see ReputService.run).
IDLE_BACKOFF = 64
# An appender dispatches its own records (dispatch_now) only while this little is undispatched:
# a big batch is left to the dispatcher thread, so an appender on an event loop is not held for
# the whole of its dispatch (about 12 us a record) where the thread would share the GIL.
INLINE_DISPATCH_MAX_BYTES = 128 * 1024


# A dispatcher's dispatch_batch(infos, failed): see Dispatcher.
BatchHook = Callable[[list[DispatchInfo], Callable[[DispatchInfo, OSError], None]], None]


class DispatchError(RuntimeError):
    """Dispatching one record failed; the message names the record and what to do."""


class Dispatcher(Protocol):
    """``dispatch`` must be idempotent: recovery replays records a dispatcher may already have.

    A dispatcher may also offer ``replay_floor(topic, queue_id) -> int``: every record of that
    queue whose physical offset is below the returned offset is already in it. When all
    dispatchers offer it, a replay skips covered records without decoding them.

    One plugged in with ``MessageStore.add_dispatcher`` may offer ``durable_offset() -> int``:
    the CommitLog offset below which it has processed every record durably (a tier uploader:
    what the tier committed). An open replays from the lowest such offset, and clean-up keeps
    the CommitLog files above it (up to ``dispatcherRetentionHoldMaxBytes``). It may offer
    ``attach(reader)``: called on open, before any replay, with the store's
    ``CommitLogReader`` (how it reads record bytes). It may offer
    ``dispatch_batch(infos, failed)``: ``dispatch`` of each info in order, calling
    ``failed(info, exc)`` for an ``OSError`` of one record and going on; when every dispatcher
    offers it, a run of records the appender decoded is handed to each dispatcher at once
    (one call per dispatcher instead of one per record and dispatcher). Optional hooks are
    looked up with ``getattr`` once, not per record.
    """

    def dispatch(self, info: DispatchInfo) -> None: ...


class ReputService(ServiceThread):
    """RocketMQ's ReputMessageService: turns CommitLog bytes into dispatch calls."""

    def __init__(
        self,
        files: MappedFileQueue,
        dispatchers: list[Dispatcher],
        reput_from: int,
        idle_wait_ms: int = 1,
        recent: deque[DispatchInfo] | None = None,
    ) -> None:
        super().__init__("reput")
        self.files = files
        self.dispatchers = dispatchers
        self.reput_from = reput_from
        # Where dispatch stops: the log's end, or lower while a bound is set
        # (``MessageStore.set_dispatch_bound``: a controller-mode master's confirm offset).
        self.end: Callable[[], int] = files.max_offset
        # Everything before this is visible to readers: dispatchers that batch their writes
        # (the RocksDB ConsumeQueue store) commit at the end of each round, then it moves.
        self.committed_to = reput_from
        # Decoded-by-the-appender infos (CommitLog.recent_dispatch): used only when an entry's
        # offset is exactly the record being dispatched; anything else is decoded from the log.
        self.recent: deque[DispatchInfo] = recent if recent is not None else deque()
        self.last_store_timestamp = 0  # of the newest dispatched record: for the checkpoint
        self.idle_wait = idle_wait_ms / 1000
        self.listeners: list[Callable[[DispatchInfo], None]] = []  # e.g. long-poll wake-ups
        # The newest record of each topic dispatched this round: listeners hear of it only once
        # the round is committed, so a woken reader finds what woke it (a batching dispatcher,
        # the RocksDB ConsumeQueue, makes units visible at commit).
        self._to_notify: dict[str, DispatchInfo] = {}
        self._caught_up = threading.Condition()
        self._caught_up_waiters = 0  # threads in wait_caught_up: only then is it notified
        self._idle = False
        # The idle wait: a bare lock used as a binary semaphore (released = "wake up"). Cheaper
        # than an Event on both sides, which matters because with one-message appends every
        # record is its own round: one wake-up and one wait each.
        self._wake_lock = threading.Lock()
        self._wake_lock.acquire()
        # (dispatcher, its commit_dispatch) for the dispatchers list as last seen: optional hooks
        # are looked up once, not once per round.
        self._hooks_of: list[Dispatcher] | None = None
        self._hooks_len = 0
        self._commit_hooks: list[Callable[[], None]] = []
        # Every dispatcher's dispatch_batch, or None when one lacks it (then record by record).
        self._batch_hooks: list[BatchHook] | None = None
        # Held by the thread for each round; ``paused()`` takes it so a replica can cut the
        # log back between rounds.
        self._round = threading.Lock()
        self.error: BaseException | None = None
        self.skipped = 0  # records no ConsumeQueue could take (RECORD_ERRNOS); logged each
        # (topic bytes, queue id) -> replay floor, only while a skip_covered replay runs.
        self._floors: dict[tuple[bytes, int], int] | None = None
        # Records of deleted topics below their deletion offset are passed over (see
        # deleted_topics.py); topic deletions wait here for dispatch to reach their offset.
        self.deleted: DeletedTopics | None = None
        self._deletions: list[tuple[int, str, threading.Event]] = []
        self._deletions_lock = threading.Lock()

    def delete_topic_at(self, cutoff: int, topic: str) -> threading.Event:
        """Destroy ``topic``'s ConsumeQueues once dispatch reaches ``cutoff`` (on the
        dispatcher thread, before any later record of the topic is dispatched into them); the
        event is set when done. Call with the CommitLog's append lock held, so no record of
        the topic's next generation can be dispatched before this is registered."""
        done = threading.Event()
        with self._deletions_lock:
            self._deletions.append((cutoff, topic, done))
            self._deletions.sort(key=lambda d: d[0])
        self._signal()
        return done

    def delete_topic_behind(self, cutoff: int, topic: str, *, timeout: float | None = None,
                            before: Callable[[], None] | None = None) -> threading.Event:
        """Destroy ``topic``'s ConsumeQueues as of ``cutoff``, which dispatch may already have
        passed: a slave applies its master's deletion only at the next state sync, and by then
        it may have dispatched records of the topic's next generation (at or past ``cutoff``)
        into the old generation's queues. Dispatch is rewound to ``cutoff``, the queues are
        destroyed there, and what follows is dispatched again into the new ones; the other
        topics' records in between come again too, which every dispatcher takes as the replay
        it already handles after recovery. The event is set when the queues are gone.

        ``timeout``: how long to wait for the running round (a slave catching up holds one for
        as long as its dispatch is held back), else ``TimeoutError`` and nothing registered;
        ``before`` runs once the round lock is held, before anything else (the caller's
        durable note of the deletion: never written for a deletion that then timed out)."""
        with self.paused(timeout):
            if before is not None:
                before()
            done = self.delete_topic_at(cutoff, topic)
            if self.reput_from > cutoff:
                self.rewind(cutoff)
        return done

    def _run_deletions(self, reached: int) -> None:
        with self._deletions_lock:
            due = [d for d in self._deletions if d[0] <= reached]
            self._deletions = [d for d in self._deletions if d[0] > reached]
        for _cutoff, topic, done in due:
            self._commit_round()  # what this round gave the queues goes before they go
            for dispatcher in self.dispatchers:
                destroy = getattr(dispatcher, "destroy_topic", None)
                if destroy is not None:
                    destroy(topic)
            log.info("topic %s deleted: its ConsumeQueues are gone", topic)
            done.set()

    @contextmanager
    def paused(self, timeout: float | None = None) -> Iterator[None]:
        """No dispatch round runs inside this block (it waits for the current one to end, at
        most ``timeout`` seconds if given: then ``TimeoutError``)."""
        if not self._round.acquire(timeout=-1 if timeout is None else timeout):
            raise TimeoutError(f"a dispatch round was still running after {timeout} s")
        try:
            yield
        finally:
            self._round.release()

    def rewind(self, offset: int) -> None:
        """Dispatch again from ``offset``: a replica cut its log back to there (call inside
        ``paused()``, after the dispatchers dropped what they held past it)."""
        self.reput_from = min(self.reput_from, offset)
        self.committed_to = min(self.committed_to, offset)
        self._to_notify.clear()
        self.recent.clear()
        self._signal()

    def wakeup(self) -> None:
        # Called on every append: only pay for a wake-up when the thread is actually waiting.
        if self._idle:
            self._signal()

    def _signal(self) -> None:
        with contextlib.suppress(RuntimeError):  # raised when a wake-up is already pending
            self._wake_lock.release()

    def on_shutdown(self) -> None:
        self._signal()

    def behind_bytes(self) -> int:
        return max(0, self.end() - self.reput_from)

    def replay(self, end: int | None = None, *, skip_covered: bool = False) -> int:
        """Dispatch every record from ``reput_from`` up to ``end`` (default: the end of the log)
        on this thread; return how many records were dispatched.

        ``skip_covered`` (recovery): pass over records every dispatcher already has, judged by
        their ``replay_floor``, reading only topic and queue id; it has no effect unless every
        dispatcher has ``replay_floor`` and nobody listens."""
        limit = self.end() if end is None else end
        if self.reput_from >= limit and not self._deletions:
            return 0  # nothing new: the common case of the idle loop, kept cheap
        count = 0
        if (skip_covered and not self.listeners
                and all(hasattr(d, "replay_floor") for d in self.dispatchers)):
            self._floors = {}
        try:
            if self._deletions:
                self._run_deletions(self.reput_from)
            while self.reput_from < limit:
                before = self.reput_from
                n = self._dispatch_some(limit)
                self._commit_round()
                if n < 0 or self.reput_from == before:
                    break
                count += n
        finally:
            self._floors = None
        return count

    def _floor_of(self, topic: str, queue_id: int) -> int:
        floors: list[int] = [d.replay_floor(topic, queue_id)  # type: ignore[attr-defined]
                             for d in self.dispatchers]
        return min(floors)

    def _commit_round(self) -> None:
        """Let batching dispatchers write what this round gave them (group commit)."""
        if self._hooks_of is not self.dispatchers or self._hooks_len != len(self.dispatchers):
            self._refresh_hooks()
        for commit in self._commit_hooks:
            commit()
        self.committed_to = self.reput_from
        if self._to_notify:
            infos, self._to_notify = list(self._to_notify.values()), {}
            for info in infos:
                for listener in self.listeners:
                    listener(info)

    def _refresh_hooks(self) -> None:
        self._hooks_of = self.dispatchers
        self._hooks_len = len(self.dispatchers)
        self._commit_hooks = [commit for d in self.dispatchers
                              if (commit := getattr(d, "commit_dispatch", None)) is not None]
        batches = [getattr(d, "dispatch_batch", None) for d in self.dispatchers]
        self._batch_hooks = None if None in batches else batches  # type: ignore[assignment]

    def _dispatch_some(self, limit: int) -> int:
        """Dispatch the records of the segment holding ``reput_from``; -1 if stuck."""
        mf = self.files.find_by_offset(self.reput_from)
        if mf is None:
            first = self.files.first()
            if first is not None and self.reput_from < first.file_from_offset:
                if self.reput_from == 0:  # nothing dispatched yet: a log that starts later
                    log.info("the CommitLog starts at offset %d (the history before it is not "
                             "in this store, e.g. in a tier this broker took over): "
                             "dispatching from there", first.file_from_offset)
                else:
                    log.warning("CommitLog records from offset %d to %d were deleted before "
                                "they were dispatched: their messages are in no ConsumeQueue; "
                                "dispatching from %d", self.reput_from, first.file_from_offset,
                                first.file_from_offset)
                self.reput_from = first.file_from_offset
                return 0
            return -1
        if not mf.hold():
            return -1
        count = 0
        try:
            buf = mf.buffer
            pos = self.reput_from - mf.file_from_offset
            end = min(mf.read_position, limit - mf.file_from_offset)
            dispatchers = self.dispatchers
            to_notify = self._to_notify if self.listeners else None
            recent = self.recent
            base = mf.file_from_offset
            floors = self._floors
            deleted = self.deleted.cutoffs if self.deleted is not None else None
            if self._hooks_of is not dispatchers or self._hooks_len != len(dispatchers):
                self._refresh_hooks()
            batches = self._batch_hooks if floors is None else None
            while pos + 8 <= end:
                run: list[DispatchInfo] = []
                at = pos
                if (batches is not None and recent and not self._deletions
                        and recent[0].physical_offset == base + pos):
                    # The usual round: records the appender decoded, in order. Each
                    # dispatcher takes the run in one call; the round's bookkeeping once.
                    # (Positions as CommitLog offsets here: fewer steps per record.)
                    take, keep = recent.popleft, run.append
                    at, stop = base + pos, base + end
                    while recent:
                        head = recent[0]
                        if head.physical_offset != at:
                            break
                        next_at = at + head.size
                        if next_at > stop:
                            break
                        keep(take())
                        at = next_at
                    at -= base
                if run and batches is not None:
                    if deleted:  # a deleted topic's old records: never served again
                        live = [i for i in run
                                if i.physical_offset >= deleted.get(i.topic, -1)]
                    else:
                        live = run
                    if live:
                        for dispatch_batch in batches:
                            dispatch_batch(live, self._dispatch_failed)
                        if to_notify is not None:
                            for record in live:
                                to_notify[record.topic] = record
                    self.last_store_timestamp = run[-1].store_timestamp
                    pos = at
                    count += len(run)
                    self.reput_from = base + pos
                    continue
                if self._deletions and self._deletions[0][0] <= base + pos:
                    self._run_deletions(base + pos)
                if floors is not None:
                    pos, last = codec.skip_covered(buf, pos, end, base, floors, self._floor_of)
                    if last >= 0:
                        self.last_store_timestamp = codec.record_store_timestamp(buf, last)
                        self.reput_from = base + pos
                        if pos + 8 > end:
                            break
                info = None
                while recent:
                    head = recent[0]
                    if head.physical_offset < base + pos:
                        recent.popleft()  # stale: a record this thread already decoded
                        continue
                    if head.physical_offset == base + pos:
                        info = recent.popleft()
                    break
                if info is not None and pos + info.size <= end:
                    size = info.size
                else:
                    size, magic = codec.read_size_and_magic(buf, pos)
                    if magic == codec.BLANK_MAGIC_CODE:
                        self.reput_from = mf.file_end_offset  # the rest is filler
                        return count
                    if size <= 0 or pos + size > end:
                        if pos + size > mf.file_size or size <= 0:
                            raise codec.RecordCorrupt(
                                base + pos, f"dispatcher met a record of size {size}"
                            )
                        break  # the rest of the record is not written yet
                    info = codec.decode_dispatch_info(buf, pos)
                if deleted and info.physical_offset < deleted.get(info.topic, -1):
                    pass  # a deleted topic's old record: never served again
                else:
                    for dispatcher in dispatchers:
                        try:
                            dispatcher.dispatch(info)
                        except OSError as exc:
                            self._dispatch_failed(info, exc)
                    if to_notify is not None:
                        to_notify[info.topic] = info
                self.last_store_timestamp = info.store_timestamp
                pos += size
                count += 1
                self.reput_from = mf.file_from_offset + pos
            if pos >= mf.file_size:
                self.reput_from = mf.file_end_offset
        finally:
            mf.release()
        return count

    def _dispatch_failed(self, info: DispatchInfo, exc: OSError) -> None:
        where = (f"the record at CommitLog offset {info.physical_offset} (topic "
                 f"{info.topic[:80]!r}, queue {info.queue_id}, queue offset {info.queue_offset})")
        if exc.errno in RECORD_ERRNOS:
            self.skipped += 1
            log.error("skipped %s: %s. It stays in the CommitLog, but no ConsumeQueue serves "
                      "it: its topic cannot be a directory name", where, exc)
            return
        raise DispatchError(
            f"cannot dispatch {where}: {exc}. Fix the cause (disk space, permissions, open-file "
            "limit) and open the store again: dispatch resumes at this record") from exc

    def dispatch_now(self) -> bool:
        """Dispatch what was appended on the caller's thread (the appender's, right after its
        append), if the dispatcher thread is idle, no round is running and little is waiting
        (``INLINE_DISPATCH_MAX_BYTES``); False if not (the thread then does it: wake it).
        Rounds are serialised by the round lock whichever thread runs them, so dispatchers
        still see one round at a time, in log order.

        Why: with one-message appends every record is a round of its own, and handing each to
        the dispatcher thread (a wake-up, then the GIL handed over and back) cost several
        times the dispatch itself."""
        if (not self._idle or self.error is not None or self._stop.is_set() or self._deletions
                or self.end() - self.reput_from > INLINE_DISPATCH_MAX_BYTES
                or not self._round.acquire(blocking=False)):
            # A pending topic deletion goes to the thread: it waits for compaction rounds and
            # deletes tier objects, which must not hold an appender (the broker's event loop).
            return False
        try:
            if self._stop.is_set():
                return False  # shutdown began since the check: close() waits on rounds, not us
            self.replay()
        except Exception as exc:
            self._failed(exc)
        finally:
            self._round.release()
        if self._caught_up_waiters and self.reput_from >= self.end():
            with self._caught_up:
                self._caught_up.notify_all()
        return True

    def fail(self, exc: Exception) -> None:
        """Stop dispatch for good from another thread: a dispatcher's own background step
        failed (a ConsumeQueue file the flush thread could not create)."""
        if self.error is None:
            self._failed(DispatchError(f"{exc}. Fix the cause (disk space, permissions, "
                                       "open-file limit) and open the store again: its "
                                       "records are dispatched again"))

    def _failed(self, exc: Exception) -> None:
        """Dispatch stopped for good (until the store is opened again): keep serving reads,
        refuse puts (``MessageStore.put_messages`` checks ``error``), report loudly."""
        self.error = exc
        log.error("dispatch stopped at offset %d", self.reput_from, exc_info=exc)
        with self._caught_up:  # waiters learn of it now, not at their timeout
            self._caught_up.notify_all()

    def run(self) -> None:
        wait = self.idle_wait
        while not self._stop.is_set() and self.error is None:
            try:
                with self._round:
                    progressed = self.replay() > 0
            except Exception as exc:
                self._failed(exc)
                return
            caught_up = self.reput_from >= self.end()
            if caught_up and self._caught_up_waiters:
                with self._caught_up:
                    self._caught_up.notify_all()
            if progressed:
                wait = self.idle_wait
                if not caught_up:
                    continue  # more to do (the next segment, or records appended meanwhile)
            # Idle: raise the flag, then look once more, so an append either sees the flag
            # (and dispatches itself or wakes us) or is seen here.
            self._idle = True
            if self.reput_from >= self.end():
                # Every append wakes us or dispatches itself (dispatch_now), so the timeout is
                # only a safety net: after a round of our own it is dispatchIntervalMs, then it
                # doubles while we find nothing, up to IDLE_BACKOFF times that. Each wake-up
                # costs a GIL hand-over, which under one-message appends (dispatched by the
                # appender) was most of this thread's CPU.
                self._wake_lock.acquire(timeout=wait)
                wait = min(wait * 2, self.idle_wait * IDLE_BACKOFF)
            elif not progressed:
                # Not caught up, yet nothing dispatched: a record being written, or a log
                # that lost its segment; look again shortly rather than spin.
                self._wake_lock.acquire(timeout=self.idle_wait)
            self._idle = False

    def wait_caught_up(self, timeout: float) -> bool:
        """Block until everything appended so far is dispatched (or ``timeout`` seconds)."""
        target = self.end()
        with self._caught_up:
            self._caught_up_waiters += 1
            try:
                return self._caught_up.wait_for(
                    lambda: self.committed_to >= target or self.error is not None, timeout
                ) and self.error is None
            finally:
                self._caught_up_waiters -= 1

    def shutdown(self, drain_timeout: float = 10.0) -> None:
        if self._thread.is_alive():
            self.wait_caught_up(drain_timeout)
        super().shutdown()
