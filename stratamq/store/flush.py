"""Flushing: making appended bytes durable, asynchronously or before a put returns.

* ``AsyncFlushService`` (RocketMQ's FlushRealTimeService): wakes every 500 ms, flushes once at
  least 4 pages are dirty, and flushes whatever is dirty at least every 10 s. It is not woken
  per put: an Event per append cost more than the flush decision it would speed up.
* ``GroupCommitService``: a put under SYNC_FLUSH waits until the flushed offset passes its
  record; one ``fdatasync`` serves every put waiting at that moment (group commit), and the
  flush thread answers them itself. ``FlushDiskWatcher`` answers a put still waiting after
  ``syncFlushTimeout`` (then FLUSH_DISK_TIMEOUT).
* ``ConsumeQueueFlushService``: flushes ConsumeQueues and, on its thorough round, writes the
  checkpoint.

Each is handed what it flushes and a callback to report progress; none knows about the store.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

from stratamq.store.mapped_file_queue import MappedFileQueue
from stratamq.store.service import ServiceThread

log = logging.getLogger(__name__)


def _timed_flush(files: MappedFileQueue, least_pages: int,
                 observers: list[Callable[[float], None]]) -> None:
    """One flush pass; each observer (e.g. a metrics histogram) gets its seconds."""
    if not observers:
        files.flush(least_pages)
        return
    start = time.perf_counter()
    files.flush(least_pages)
    elapsed = time.perf_counter() - start
    for observe in observers:
        observe(elapsed)


class AsyncFlushService(ServiceThread):
    def __init__(
        self,
        files: MappedFileQueue,
        interval_ms: int,
        least_pages: int,
        thorough_interval_ms: int,
        on_flushed: Callable[[], None] | None = None,
        observers: list[Callable[[float], None]] | None = None,
    ) -> None:
        super().__init__("flush-commitlog")
        self.files = files
        self.observers = observers if observers is not None else []
        self.interval = interval_ms / 1000
        self.least_pages = least_pages
        self.thorough_interval = thorough_interval_ms / 1000
        self.on_flushed = on_flushed
        self._last_thorough = time.monotonic()

    def run(self) -> None:
        while not self._stop.is_set():
            self.wait(self.interval)
            least = self.least_pages
            now = time.monotonic()
            if now - self._last_thorough >= self.thorough_interval:
                self._last_thorough = now
                least = 0
            _timed_flush(self.files, least, self.observers)
            if self.on_flushed is not None:
                self.on_flushed()
        self.files.flush_all()
        if self.on_flushed is not None:
            self.on_flushed()


# What a group-commit request's ``done`` may hand back: a function for the answering thread to
# call once it has answered its whole group (such as waking an event loop), each distinct one
# once, so a group of answers bound for one loop wakes it once.
Wake = Callable[[], None]
FlushDone = Callable[[bool], Wake | None]


class FlushRequest:
    """One put's wait for the group commit: ``done(flushed)`` is called exactly once."""

    __slots__ = ("offset", "deadline", "done", "linger", "answered")

    def __init__(self, offset: int, deadline: float, done: FlushDone, linger: bool) -> None:
        self.offset = offset  # the put's records end here
        self.deadline = deadline  # time.monotonic() after which it is answered False
        self.done = done
        self.linger = linger  # may wait for company (see GroupCommitService.request_flush)
        self.answered = False  # under the service's lock: the flush and the watcher race


class GroupCommitService(ServiceThread):
    """SYNC_FLUSH's group commit (RocketMQ's GroupCommitService): puts hand in requests, the
    flush thread takes all of them at once, makes the log durable past the furthest one with
    one ``fdatasync`` and answers each, on its own thread (``request_flush``'s ``done``).

    Answering from the flush thread, rather than waking a thread blocked per put, is what a
    busy event loop needs: every thread that wakes up must win the GIL from the loop, and
    each attempt costs the loop a wake-up of its own while it holds the GIL. One thread,
    woken once per group, is the least a durable put can cost.

    A request not answered ``timeout_ms`` after it was made (a disk stuck in ``fdatasync``
    holds the flush thread) is answered False by ``FlushDiskWatcher``, as RocketMQ's is
    answered FLUSH_DISK_TIMEOUT."""

    def __init__(self, files: MappedFileQueue, on_flushed: Callable[[], None] | None = None,
                 observers: list[Callable[[float], None]] | None = None,
                 timeout_ms: int = 5000, linger_ms: int = 0) -> None:
        super().__init__("flush-group-commit")
        self.files = files
        self.observers = observers if observers is not None else []
        self.on_flushed = on_flushed
        self.timeout = timeout_ms / 1000
        self.linger = linger_ms / 1000
        self._lock = threading.Lock()
        self._requests: list[FlushRequest] = []  # made since the flush thread last took them
        self._sleeping = False  # the flush thread waits for a request: the next one wakes it
        self._closed = False  # the thread has answered its last requests
        self._flushing = False  # an fdatasync with something to write runs (the flush thread's)
        self.watcher = FlushDiskWatcher(self._lock, self.timeout)

    def start(self) -> None:
        self.watcher.start()
        super().start()

    def request_flush(self, offset: int, done: FlushDone, linger: bool = False) -> None:
        """Call ``done(True)`` once the bytes before ``offset`` are on disk, on the flush
        thread (here, at once, if they already are); ``done(False)`` if they are not within
        the timeout (on the watcher's thread), or the service stopped short of them. What
        ``done`` returns (a ``Wake``) is called after the group's answers.

        ``linger``: the caller's appender is saturated, so this put may wait for company: if
        it arrives while an ``fdatasync`` runs and that one does not cover it, the next
        starts no sooner than ``linger_ms`` after that one began (``syncFlushGroupLinger``).
        Fewer, larger groups cost less CPU per message (each ``fdatasync`` costs the machine
        some 0.3 ms here) exactly when CPU is what limits the appender; a put that finds the
        flush idle never waits."""
        if self.files.flushed_where >= offset:
            _answer_all([(done, True)])
            return
        linger = linger and self._flushing  # read without the lock: a hint, either way is safe
        with self._lock:
            if not self._closed:
                request = FlushRequest(offset, time.monotonic() + self.timeout, done, linger)
                self._requests.append(request)
                self.watcher.watch(request)
                wake, self._sleeping = self._sleeping, False
                if wake:
                    self._wake.set()
                return
        _answer_all([(done, self.files.flushed_where >= offset)])  # after the last flush

    def wait_for_flush(self, offset: int) -> bool:
        """Block until the bytes before ``offset`` are on disk; False after the timeout."""
        answered = threading.Event()
        flushed: list[bool] = []

        def done(ok: bool) -> None:
            flushed.append(ok)
            answered.set()
            return None

        self.request_flush(offset, done)
        # The watcher answers within the timeout; the bound only guards against its death.
        if not answered.wait(self.timeout + self.join_timeout):
            return self.files.flushed_where >= offset
        return flushed[0]

    def _take(self, idle: bool) -> list[FlushRequest]:
        with self._lock:
            requests, self._requests = self._requests, []
            self._sleeping = idle and not requests
        return requests

    def run(self) -> None:
        last_start = 0.0
        while not self._stop.is_set():
            requests = self._take(idle=True)
            if not requests:
                # RocketMQ's waitForRunning(10): also flushes puts that asked not to wait.
                self.wait(0.01)
                requests = self._take(idle=False)
            elif (self.linger > 0 and any(r.linger for r in requests)
                  and max(r.offset for r in requests) > self.files.flushed_where):
                # These came while the last group was being flushed, from a saturated
                # appender, and it did not cover them: let more join them (request_flush).
                left = last_start + self.linger - time.monotonic()
                if left > 0 and not self._stop.wait(left):
                    requests += self._take(idle=False)
            last_start = time.monotonic()
            self._commit(requests)
        self.files.flush_all()
        with self._lock:
            self._closed = True
            requests, self._requests = self._requests, []
        self._answer(requests)
        if self.on_flushed is not None:
            self.on_flushed()

    def _commit(self, requests: list[FlushRequest]) -> None:
        files = self.files
        target = max((r.offset for r in requests), default=0)
        # Requests the last flush already covered are answered without another; a pass
        # with no request flushes what puts that asked not to wait left (RocketMQ's too).
        if not requests or target > files.flushed_where:
            self._flushing = files.flushed_where < files.max_offset()
            try:
                # Up to two rounds: a request may end in the segment after the one flushed.
                for _ in range(2):
                    _timed_flush(files, 0, self.observers)
                    if files.flushed_where >= target:
                        break
            except OSError:
                log.exception("group commit: flushing the CommitLog failed; retrying")
                self.wait(0.01)  # not a hot loop; the watcher answers requests past their time
            finally:
                self._flushing = False
        flushed = files.flushed_where
        if flushed < target:  # left for the next round (unless the watcher answered them)
            with self._lock:
                self._requests[:0] = [r for r in requests
                                      if r.offset > flushed and not r.answered]
            requests = [r for r in requests if r.offset <= flushed]
        self._answer(requests)
        if self.on_flushed is not None:
            self.on_flushed()

    def _answer(self, requests: list[FlushRequest]) -> None:
        flushed = self.files.flushed_where
        with self._lock:
            ready = [r for r in requests if not r.answered]
            for r in ready:
                r.answered = True
        _answer_all([(r.done, r.offset <= flushed) for r in ready])

    def shutdown(self) -> None:
        super().shutdown()  # the last flush answers every request made before it
        self.watcher.shutdown()


class FlushDiskWatcher(ServiceThread):
    """Answers False to group-commit requests still unanswered at their deadline (RocketMQ's
    FlushDiskWatcher). Requests are watched in the order they were made, which is the order
    of their deadlines; the thread sleeps until the oldest one's, so it wakes about once per
    timeout, not per request, and never needs waking: a request made while it sleeps has a
    later deadline than the time it wakes at."""

    def __init__(self, lock: threading.Lock, timeout: float) -> None:
        super().__init__("flush-disk-watcher")
        self._lock = lock  # the group commit's: ``answered`` is decided under it
        self.timeout = timeout
        self._watched: deque[FlushRequest] = deque()

    def watch(self, request: FlushRequest) -> None:
        """Under the lock: watch ``request``; forget the answered ones at the front."""
        watched = self._watched
        while watched and watched[0].answered:
            watched.popleft()
        watched.append(request)

    def run(self) -> None:
        while True:
            now = time.monotonic()
            late: list[FlushRequest] = []
            with self._lock:
                watched = self._watched
                while watched and (watched[0].answered or watched[0].deadline <= now):
                    request = watched.popleft()
                    if not request.answered:
                        request.answered = True
                        late.append(request)
                sleep = watched[0].deadline - now if watched else self.timeout
            for request in late:
                log.warning("group commit: offset %d not flushed within %.0f ms",
                            request.offset, self.timeout * 1000)
            _answer_all([(request.done, False) for request in late])
            if self.wait(sleep):
                return


def _answer_all(answers: list[tuple[FlushDone, bool]]) -> None:
    """Call each ``done``, then each distinct ``Wake`` they handed back."""
    wakes: dict[Wake, None] = {}
    for done, flushed in answers:
        try:
            wake = done(flushed)
        except Exception:  # one waiter's bug must not stop the flush thread
            log.exception("a group commit callback failed")
            continue
        if wake is not None:
            wakes[wake] = None
    for wake in wakes:
        try:
            wake()
        except Exception:
            log.exception("a group commit wake-up failed")


class ConsumeQueueFlushService(ServiceThread):
    """Flushes ConsumeQueues; on thorough rounds also persists the checkpoint."""

    def __init__(
        self,
        flush_queues: Callable[[int], None],
        interval_ms: int,
        least_pages: int,
        thorough_interval_ms: int,
        sample_progress: Callable[[], int],
        on_thorough_flush: Callable[[int], None],
        after_round: Callable[[], None] | None = None,
    ) -> None:
        super().__init__("flush-consumequeue")
        self.after_round = after_round  # after each round that flushed (controller mode)
        self.flush_queues = flush_queues
        self.interval = interval_ms / 1000
        self.least_pages = least_pages
        self.thorough_interval = thorough_interval_ms / 1000
        self.sample_progress = sample_progress
        self.on_thorough_flush = on_thorough_flush
        self._last_thorough = time.monotonic()
        self._last_error = ""  # of the last failed round, logged once

    def flush_now(self, thorough: bool) -> None:
        # Sample before flushing: units dispatched up to the sample are covered by the flush.
        progress = self.sample_progress()
        try:
            self.flush_queues(0 if thorough else self.least_pages)
        except OSError as exc:
            # Units that are not on disk (a ConsumeQueue file that could not be created or
            # synced): the checkpoint keeps its last progress, so a crash re-dispatches them.
            # The next round tries again; the same error is logged once.
            if str(exc) != self._last_error:
                log.error("ConsumeQueue flush failed (the checkpoint keeps its last "
                          "progress): %s", exc)
            self._last_error = str(exc)
            return
        self._last_error = ""
        if thorough:
            self.on_thorough_flush(progress)
        elif self.after_round is not None:
            try:
                self.after_round()
            except OSError as exc:  # the checkpoint keeps its older confirm offset: safe
                log.error("writing the checkpoint's confirm offset failed: %s", exc)

    def run(self) -> None:
        while not self._stop.is_set():
            self.wait(self.interval)
            now = time.monotonic()
            thorough = now - self._last_thorough >= self.thorough_interval
            if thorough:
                self._last_thorough = now
            self.flush_now(thorough)
        self.flush_now(True)
