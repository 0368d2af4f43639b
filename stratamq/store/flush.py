"""Flushing: making appended bytes durable, asynchronously or before a put returns.

* ``AsyncFlushService`` (RocketMQ's FlushRealTimeService): wakes every 500 ms, flushes once at
  least 4 pages are dirty, and flushes whatever is dirty at least every 10 s. It is not woken
  per put: an Event per append cost more than the flush decision it would speed up.
* ``GroupCommitService``: a put under SYNC_FLUSH waits until the flushed offset passes its
  record; one ``fdatasync`` serves every put waiting at that moment (group commit). A put that
  waits longer than ``syncFlushTimeout`` gets FLUSH_DISK_TIMEOUT.
* ``ConsumeQueueFlushService``: flushes ConsumeQueues and, on its thorough round, writes the
  checkpoint.

Each is handed what it flushes and a callback to report progress; none knows about the store.
"""

from __future__ import annotations

import logging
import threading
import time
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


class GroupCommitService(ServiceThread):
    def __init__(self, files: MappedFileQueue, on_flushed: Callable[[], None] | None = None,
                 observers: list[Callable[[float], None]] | None = None):
        super().__init__("flush-group-commit")
        self.files = files
        self.observers = observers if observers is not None else []
        self.on_flushed = on_flushed
        self._cond = threading.Condition()
        self._requested = 0

    def wait_for_flush(self, offset: int, timeout_ms: int) -> bool:
        """Block until bytes before ``offset`` are on disk; False after ``timeout_ms``."""
        if self.files.flushed_where >= offset:
            return True
        deadline = time.monotonic() + timeout_ms / 1000
        with self._cond:
            if offset > self._requested:
                self._requested = offset
            self._wake.set()
            while self.files.flushed_where < offset:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._stop.is_set():
                    return self.files.flushed_where >= offset
                self._cond.wait(remaining)
        return True

    def run(self) -> None:
        while not self._stop.is_set():
            self.wait(0.01)
            target = self._requested
            # Up to two rounds: a request may end in the segment after the one flushed first.
            for _ in range(2):
                if self.files.flushed_where >= target:
                    break
                _timed_flush(self.files, 0, self.observers)
            if self.on_flushed is not None:
                self.on_flushed()
            with self._cond:
                self._cond.notify_all()
        self.files.flush_all()
        with self._cond:
            self._cond.notify_all()
        if self.on_flushed is not None:
            self.on_flushed()


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
    ) -> None:
        super().__init__("flush-consumequeue")
        self.flush_queues = flush_queues
        self.interval = interval_ms / 1000
        self.least_pages = least_pages
        self.thorough_interval = thorough_interval_ms / 1000
        self.sample_progress = sample_progress
        self.on_thorough_flush = on_thorough_flush
        self._last_thorough = time.monotonic()

    def flush_now(self, thorough: bool) -> None:
        # Sample before flushing: units dispatched up to the sample are covered by the flush.
        progress = self.sample_progress()
        self.flush_queues(0 if thorough else self.least_pages)
        if thorough:
            self.on_thorough_flush(progress)

    def run(self) -> None:
        while not self._stop.is_set():
            self.wait(self.interval)
            now = time.monotonic()
            thorough = now - self._last_thorough >= self.thorough_interval
            if thorough:
                self._last_thorough = now
            self.flush_now(thorough)
        self.flush_now(True)
