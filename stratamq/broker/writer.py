"""The broker's single writer: puts from concurrent requests combined into one batch append.

Every ``SendMessage`` hands its messages (converted and checked once) to ``GroupWriter.put``.
One thread takes whatever puts are waiting, appends them with a single ``put_messages`` call
and hands each put its own entries' results, the way group commit combines flushes: under
load the batches grow by themselves, and the CommitLog's lock is taken once per batch instead
of once per message from dozens of threads. A put's callback runs once its records are written
and, under ``SYNC_FLUSH``, on disk (``put_messages`` waits for the flush before it returns).

Per-entry results: the store answers one status for a batch, plus the prefix it wrote (a
batch cut short by a full disk). Entries in that prefix are stored (``PUT_OK``, or the status
a put waiter refused with, such as ``FLUSH_DISK_TIMEOUT``); the rest get the failure. A batch
the store refuses before writing anything because of one message (``MESSAGE_ILLEGAL``,
``PROPERTIES_SIZE_EXCEEDED``) is retried put by put, and a put by message, so only the entry at
fault is refused, as when every message was put on its own.

Thread-safety: ``put`` from any thread (or an event loop); callbacks run on the writer thread,
or on the loop passed to ``put`` (one ``call_soon_threadsafe`` per batch and loop, not per
put). ``start``/``close`` from the owner. The writer owns nothing of the store's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import NamedTuple

from stratamq.broker.ports import MessageWriter
from stratamq.message import Message
from stratamq.store.results import AppendedMessage, PutMessageResult, PutMessageStatus

log = logging.getLogger(__name__)

__all__ = ["EntryResult", "GroupWriter"]

# How many bytes of bodies one append may combine: enough to fill a batch under any load, small
# enough that the first put of a batch does not wait long for the last one's copy.
DEFAULT_MAX_BATCH_BYTES = 4 * 1024 * 1024

# Statuses a put waiter answers after the records were written (the records stay stored).
_WAITER_STATUSES = frozenset({PutMessageStatus.FLUSH_DISK_TIMEOUT,
                              PutMessageStatus.FLUSH_SLAVE_TIMEOUT,
                              PutMessageStatus.SLAVE_NOT_AVAILABLE})
# Refusals caused by one message, before anything of the batch was written.
_ONE_MESSAGE_REFUSALS = frozenset({PutMessageStatus.MESSAGE_ILLEGAL,
                                   PutMessageStatus.PROPERTIES_SIZE_EXCEEDED})


class EntryResult(NamedTuple):
    """What became of one message of a put: its status, where it landed if it was written."""

    status: PutMessageStatus
    appended: AppendedMessage | None = None
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status is PutMessageStatus.PUT_OK


Done = Callable[[list[EntryResult]], None]


class _Put:
    __slots__ = ("messages", "done", "loop", "nbytes")

    def __init__(self, messages: Sequence[Message], done: Done,
                 loop: asyncio.AbstractEventLoop | None) -> None:
        self.messages = messages
        self.done = done
        self.loop = loop
        self.nbytes = sum(len(m.body) for m in messages)


def split_result(result: PutMessageResult, sizes: Sequence[int]) -> list[list[EntryResult]]:
    """One store result for a combined batch, as per-put lists of per-message results
    (``sizes``: how many messages each put contributed, in batch order)."""
    written = result.messages
    failure = result.status
    if failure in _WAITER_STATUSES and len(written) < sum(sizes):
        failure = PutMessageStatus.UNKNOWN_ERROR  # the cut-short status was overwritten
    stored_status = (result.status if result.status in _WAITER_STATUSES
                     else PutMessageStatus.PUT_OK)
    out: list[list[EntryResult]] = []
    i = 0
    for size in sizes:
        entries = []
        for j in range(i, i + size):
            if j < len(written):
                entries.append(EntryResult(stored_status, written[j], result.error
                                           if stored_status is not PutMessageStatus.PUT_OK
                                           else ""))
            else:
                entries.append(EntryResult(failure, None, result.error))
        out.append(entries)
        i += size
    return out


class GroupWriter:
    """Combines concurrent puts into single appends on one thread; see the module docstring."""

    def __init__(self, store: MessageWriter, max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
                 name: str = "broker-writer") -> None:
        self._store = store
        self._max_batch_bytes = max_batch_bytes
        self._queue: deque[_Put] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        # Figures for the benchmark and the tests: how much combining happened.
        self.batches = 0
        self.puts = 0

    def start(self) -> GroupWriter:
        self._thread.start()
        return self

    def put(self, messages: Sequence[Message], done: Done,
            loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Append ``messages`` (in order, after every put handed in earlier) and call
        ``done(results)``, one ``EntryResult`` per message, once they are written."""
        if not messages:
            raise ValueError("a put needs at least one message")
        put = _Put(messages, done, loop)
        with self._cond:
            if not self._closed:
                self._queue.append(put)
                self._cond.notify()
                return
        _deliver([(put, [EntryResult(PutMessageStatus.SERVICE_NOT_AVAILABLE, None,
                                     "the broker is shutting down")] * len(messages))])

    def put_async(self, messages: Sequence[Message]) -> asyncio.Future[list[EntryResult]]:
        """``put`` for a coroutine on the running loop: a future of the results."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[EntryResult]] = loop.create_future()

        def done(results: list[EntryResult]) -> None:
            if not future.done():  # the caller went away: its messages are stored all the same
                future.set_result(results)

        self.put(messages, done, loop)
        return future

    def put_wait(self, messages: Sequence[Message], timeout: float | None = None
                 ) -> list[EntryResult]:
        """``put`` for a thread: block until the results are in."""
        ready = threading.Event()
        box: list[list[EntryResult]] = []

        def done(results: list[EntryResult]) -> None:
            box.append(results)
            ready.set()

        self.put(messages, done)
        if not ready.wait(timeout):
            raise TimeoutError(f"put not written within {timeout} s")
        return box[0]

    def close(self, timeout: float = 30.0) -> bool:
        """Write what is queued, then stop; later puts are answered SERVICE_NOT_AVAILABLE.
        False if the thread did not finish within ``timeout``."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)
        return not self._thread.is_alive()

    # -- the writer thread ----------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    return
                batch = [self._queue.popleft()]
                nbytes = batch[0].nbytes
                while self._queue and nbytes + self._queue[0].nbytes <= self._max_batch_bytes:
                    put = self._queue.popleft()
                    nbytes += put.nbytes
                    batch.append(put)
            try:
                outcome = self._write(batch)
            except Exception as exc:  # a bug must fail these puts, not stop every later one
                log.exception("batch put failed")
                outcome = [(p, [EntryResult(PutMessageStatus.UNKNOWN_ERROR, None,
                                            f"{type(exc).__name__}: {exc}")] * len(p.messages))
                           for p in batch]
            self.batches += 1
            self.puts += len(batch)
            _deliver(outcome)

    def _write(self, batch: list[_Put]) -> list[tuple[_Put, list[EntryResult]]]:
        messages = (batch[0].messages if len(batch) == 1
                    else [m for p in batch for m in p.messages])
        result = self._store.put_messages(messages)
        if not result.messages and result.status in _ONE_MESSAGE_REFUSALS and len(messages) > 1:
            # One message spoiled the batch before anything was written: put again in smaller
            # pieces so only the message at fault is refused.
            if len(batch) > 1:
                return [pair for p in batch for pair in self._write([p])]
            put = batch[0]
            return [(put, [self._write_one(m) for m in put.messages])]
        return list(zip(batch, split_result(result, [len(p.messages) for p in batch])))

    def _write_one(self, message: Message) -> EntryResult:
        return split_result(self._store.put_messages([message]), [1])[0][0]


def _deliver(outcome: list[tuple[_Put, list[EntryResult]]]) -> None:
    """Call each put's callback: directly, or on its loop in one hop per loop."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Done, list[EntryResult]]]] = {}
    for put, results in outcome:
        if put.loop is None:
            _call(put.done, results)
        else:
            by_loop.setdefault(put.loop, []).append((put.done, results))
    for loop, calls in by_loop.items():
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody is waiting any more
            loop.call_soon_threadsafe(_call_all, calls)


def _call_all(calls: list[tuple[Done, list[EntryResult]]]) -> None:
    for done, results in calls:
        _call(done, results)


def _call(done: Done, results: list[EntryResult]) -> None:
    try:
        done(results)
    except Exception:
        log.exception("put callback failed")
