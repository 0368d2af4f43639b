"""The broker's single writer: puts from concurrent requests combined into one batch append.

Every ``SendMessage`` hands its messages (converted and checked once) to ``GroupWriter``. The
puts the event loop handled in one turn reach the writer together and are appended with a
single ``put_messages`` call, the way group commit combines flushes: under load the batches
grow by themselves, and the CommitLog's lock is taken once per batch instead of once per
message. Each put is then answered with its own entries' results once its records are written
and, when the store waits after an append (``SYNC_FLUSH``'s group commit, replication), once
that wait is over.

The first put of a turn is the exception: when nothing waits after an append (``ASYNC_FLUSH``,
no put waiter) it is appended at once and answered at once (``put_now`` returns its results;
``put_async``'s future is done before the caller awaits it), so the request's coroutine
finishes without suspending; the turn's later puts are combined as above. Under ``SYNC_FLUSH``
every put waits for the end of its turn (the wait is combined too).

Who does what: the append itself (a copy into the mapped CommitLog, segments pre-allocated by
the store) runs on the loop, in one callback per turn: handing every batch to another thread
and back cost more than the append, because each hop waits for the GIL. Waiting never runs on
the loop, which goes on appending the next batches: under SYNC_FLUSH alone the group commit
answers by callback (``MessageStore.wait_put_later``), from its flush thread, one wake-up of
the loop for its whole group (``_Inbox``), and a saturated loop's puts may linger there for
company (``LoopLoad``); with a slave to wait for, the writer thread waits
(``MessageStore.wait_put``). Puts from threads (``put``, ``put_wait``) are appended and
waited for on the writer thread.

Per-entry results: the store answers one status for a batch, plus the prefix it wrote (a
batch cut short by a full disk). Entries in that prefix are stored (``PUT_OK``, or the status
a put waiter refused with, such as ``FLUSH_DISK_TIMEOUT``); the rest get the failure. A batch
the store refuses before writing anything because of one message (``MESSAGE_ILLEGAL``,
``PROPERTIES_SIZE_EXCEEDED``) is appended again put by put, and a put by message, so only the
entry at fault is refused, as when every message was put on its own.

Thread-safety: ``put_now``/``put_async`` on an event loop; ``put``/``put_wait`` from any other
thread; callbacks run on the loop a put came from, or on the writer thread. ``start``/``close``
from the owner. The writer owns nothing of the store's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import NamedTuple

from stratamq.broker.ports import MessageWriter
from stratamq.message import Message
from stratamq.store.results import AppendedMessage, PutMessageResult, PutMessageStatus

log = logging.getLogger(__name__)

__all__ = ["EntryResult", "GroupWriter", "LoopLoad", "split_result"]

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
    __slots__ = ("messages", "done", "loop")

    def __init__(self, messages: Sequence[Message], done: Done,
                 loop: asyncio.AbstractEventLoop | None) -> None:
        self.messages = messages
        self.done = done
        self.loop = loop


Part = tuple[_Put, int, int]  # a put's messages [start, stop) within one append


class _Append(NamedTuple):
    """One ``put_messages`` call: which puts' messages it held, in order, and its result."""

    parts: list[Part]
    messages: list[Message]
    result: PutMessageResult


def split_result(result: PutMessageResult, sizes: Sequence[int]) -> list[list[EntryResult]]:
    """One store result for a combined batch, as per-put lists of per-message results
    (``sizes``: how many messages each put contributed, in batch order)."""
    written = result.messages
    failure = result.status
    if failure in _WAITER_STATUSES and len(written) < sum(sizes):
        failure = PutMessageStatus.UNKNOWN_ERROR  # the cut-short status was overwritten
    stored = (result.status if result.status in _WAITER_STATUSES else PutMessageStatus.PUT_OK)
    stored_error = result.error if stored is not PutMessageStatus.PUT_OK else ""
    out: list[list[EntryResult]] = []
    new = tuple.__new__  # a NamedTuple's own constructor is a Python call, once per message
    count = len(written)
    i = 0
    for size in sizes:
        if i + size <= count:  # the usual case: all of this put's messages were written
            out.append([new(EntryResult, (stored, w, stored_error))
                        for w in written[i : i + size]])
        else:
            out.append([EntryResult(stored, written[j], stored_error) if j < count
                        else EntryResult(failure, None, result.error)
                        for j in range(i, i + size)])
        i += size
    return out


class GroupWriter:
    """Combines concurrent puts into single appends; see the module docstring."""

    def __init__(self, store: MessageWriter, name: str = "broker-writer") -> None:
        self._store = store
        # Jobs for the writer thread: a put from a thread (append, then wait) or a list of
        # appends made on a loop (wait only).
        self._jobs: deque[_Put | list[_Append]] = deque()
        self._lock = threading.Lock()
        # Set to wake the writer; only when it sleeps (``_sleeping``), so a burst of jobs pays
        # for one wake-up, not one each.
        self._wake = threading.Event()
        self._sleeping = False
        self._closed = False
        # Set (under the lock) once the thread takes no more jobs: after close, or if it died.
        # ``_submit`` checks it rather than ``is_alive()``, which stays true for a moment after
        # the thread's last look at the queue, long enough for a job to be queued and lost.
        self._finished = False
        # Puts made on an event loop during its current turn (see put_async); loop only.
        self._from_loop: dict[asyncio.AbstractEventLoop, list[_Put]] = {}
        # Loops whose current turn already appended its first put at once (see put_async).
        self._turn_open: set[asyncio.AbstractEventLoop] = set()
        # Per loop, the results other threads hand it (see _Inbox); setdefault is atomic.
        self._inboxes: dict[asyncio.AbstractEventLoop, _Inbox] = {}
        self._loads: dict[asyncio.AbstractEventLoop, LoopLoad] = {}  # loop only
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        # How much combining happened (logged at close; read by tests).
        self.appends = 0
        self.puts = 0

    def start(self) -> GroupWriter:
        self._thread.start()
        return self

    # -- from an event loop ---------------------------------------------------------------------

    def put_async(self, messages: Sequence[Message]) -> asyncio.Future[list[EntryResult]]:
        """Append ``messages`` (in order) with the other puts of this turn of the running
        loop: a future of their results, one ``EntryResult`` per message."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[EntryResult]] = loop.create_future()
        results = self.put_now(messages)
        if results is not None:
            future.set_result(results)
            return future

        def done(results: list[EntryResult]) -> None:
            if not future.done():  # the caller went away: its messages are stored all the same
                future.set_result(results)

        pending = self._from_loop.get(loop)
        if pending is None:
            pending = self._from_loop[loop] = []
            loop.call_soon(self._append_turn, loop)  # after every task ready this turn
        pending.append(_Put(messages, done, loop))
        return future

    def put_now(self, messages: Sequence[Message]) -> list[EntryResult] | None:
        """On an event loop: the results of ``messages``, appended at once, when this is the
        first put of the loop's turn and nothing waits after an append (``ASYNC_FLUSH``, no
        put waiter); None otherwise, with nothing appended (then ``put_async`` them).

        Appending the turn's first put at once, rather than with the turn's later puts,
        spares its request a suspension (an extra pass of the loop and of gRPC's task
        machinery), which saved more CPU than combining it would; answering it here, not
        through a future and a callback, spares the rest. The turn's later puts still wait
        for the end of the turn and go as one append (``_turn_open`` marks the turn)."""
        if not messages:
            raise ValueError("a put needs at least one message")
        loop = asyncio.get_running_loop()
        if (loop in self._turn_open or loop in self._from_loop or self._closed
                or self._store.waits_on_put):
            return None
        self._turn_open.add(loop)
        loop.call_soon(self._turn_open.discard, loop)
        count = len(messages)
        try:
            result = self._store.put_messages(messages, wait=False)
            if not result.messages and result.status in _ONE_MESSAGE_REFUSALS and count > 1:
                # One message spoiled the put: message by message, as ``_append`` does.
                put = _Put(messages, _nobody, None)
                appends = [a for k in range(count)
                           for a in self._append([(put, k, k + 1)], wait=False)]
                self.appends += len(appends)
                self.puts += 1
                return _results(appends)[0][1]
        except Exception as exc:  # a bug must fail this put, not the loop
            log.exception("batch put failed")
            return _failed(count, _why(exc))
        self.appends += 1
        self.puts += 1
        return split_result(result, (count,))[0]

    def _append_turn(self, loop: asyncio.AbstractEventLoop,
                     puts: list[_Put] | None = None) -> None:
        if puts is None:
            puts = self._from_loop.pop(loop, [])
        if self._closed:
            self._deliver([(p, _refused(len(p.messages))) for p in puts])
            return
        try:
            appends = self._append([(p, 0, len(p.messages)) for p in puts], wait=False)
        except Exception as exc:  # a bug must fail these puts, not the loop
            log.exception("batch put failed")
            self._deliver([(p, _failed(len(p.messages), _why(exc))) for p in puts])
            return
        self.appends += len(appends)
        self.puts += len(puts)
        if self._store.waits_on_put and any(a.result.messages for a in appends):
            if self._store.put_waits_call_back:
                self._wait_later(appends)  # answered from the thread that ends the wait
                return
            if self._submit(appends):
                return  # answered once the writer thread has waited
            # The writer has stopped (the broker is stopping): wait here.
            self._deliver(self._wait_all(appends))
            return
        self._deliver(_results(appends))

    def _wait_later(self, appends: list[_Append]) -> None:
        """Wait for each append by callback (SYNC_FLUSH alone: the group commit's flush
        thread answers, and no thread of ours wakes up for it); answer the puts once every
        append's wait is over."""
        left = len(appends)
        failed: dict[int, Exception] = {}
        lock = threading.Lock()

        def settle(_result: PutMessageResult | None = None) -> Callable[[], None] | None:
            nonlocal left
            with lock:
                left -= 1
                if left:
                    return None
            # The answering thread wakes the loop once it has answered its whole group.
            return self._deliver(_results(appends, failed), defer_wake=True)

        linger = self._loop_load(asyncio.get_running_loop()).saturated()
        for a in appends:
            try:
                self._store.wait_put_later(a.result, a.messages, settle, linger)
            except Exception as exc:  # a waiter's bug answers these puts; the loop goes on
                log.exception("waiting for a put failed")
                failed[id(a)] = exc
                wake = settle()
                if wake is not None:
                    wake()

    # -- from threads ---------------------------------------------------------------------------

    def put(self, messages: Sequence[Message], done: Done) -> None:
        """From a thread: append ``messages`` and call ``done(results)`` (on the writer
        thread) once they are written and waited for."""
        if not messages:
            raise ValueError("a put needs at least one message")
        put = _Put(messages, done, None)
        if not self._submit(put):
            self._deliver([(put, _refused(len(messages)))])

    def put_wait(self, messages: Sequence[Message], timeout: float | None = None
                 ) -> list[EntryResult]:
        """``put`` that blocks until the results are in."""
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
        """Finish the queued jobs, then stop; later puts are answered SERVICE_NOT_AVAILABLE.
        False if the thread did not finish within ``timeout``."""
        with self._lock:
            self._closed = True
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        log.info("writer: %d puts in %d appends", self.puts, self.appends)
        return not self._thread.is_alive()

    # -- the writer thread ----------------------------------------------------------------------

    def _submit(self, job: _Put | list[_Append]) -> bool:
        with self._lock:
            if self._finished or (self._closed and isinstance(job, _Put)):
                return False
            self._jobs.append(job)
            wake, self._sleeping = self._sleeping, False
        if wake:
            self._wake.set()
        return True

    def _take(self) -> list[_Put | list[_Append]]:
        """Every job waiting; none (and asleep) when there are none."""
        with self._lock:
            if not self._jobs:
                self._finished = self._closed
                self._sleeping = not self._closed
                self._wake.clear()
                return []
            jobs = list(self._jobs)
            self._jobs.clear()
            return jobs

    def _run(self) -> None:
        try:
            self._serve()
        finally:
            # Normally nothing is left; if the thread died of a bug, whoever is queued gets an
            # answer instead of waiting forever (and retrying into a duplicate).
            with self._lock:
                self._finished = True
                left = list(self._jobs)
                self._jobs.clear()
            crash = _WriterStopped("the broker's writer thread stopped")
            for job in left:
                if isinstance(job, _Put):
                    self._deliver([(job, _failed(len(job.messages), _why(crash)))])
                else:
                    self._deliver(_results(job, {id(a): crash for a in job}))

    def _serve(self) -> None:
        while True:
            jobs = self._take()
            if not jobs:
                if self._finished:
                    return
                self._wake.wait()
                continue
            puts = [j for j in jobs if isinstance(j, _Put)]
            waits = [a for j in jobs if not isinstance(j, _Put) for a in j]
            if waits:  # appended on a loop: only the wait is left
                self._deliver(self._wait_all(waits))
            if puts:
                try:
                    appends = self._append([(p, 0, len(p.messages)) for p in puts], wait=True)
                    outcome = _results(appends)
                except Exception as exc:
                    log.exception("batch put failed")
                    outcome = [(p, _failed(len(p.messages), _why(exc))) for p in puts]
                    appends = []
                self.appends += len(appends)
                self.puts += len(puts)
                self._deliver(outcome)

    def _wait_all(self, appends: list[_Append]) -> list[tuple[_Put, list[EntryResult]]]:
        """Wait for each append (flush, slaves) and assemble the puts' results."""
        failed: dict[int, Exception] = {}
        for a in appends:
            try:
                self._store.wait_put(a.result, a.messages)
            except Exception as exc:  # a waiter's bug answers these puts; the writer goes on
                log.exception("waiting for a put failed")
                failed[id(a)] = exc
        return _results(appends, failed)

    def _loop_load(self, loop: asyncio.AbstractEventLoop) -> LoopLoad:
        load = self._loads.get(loop)
        if load is None:
            load = self._loads[loop] = LoopLoad()
        return load

    def _deliver(self, outcome: list[tuple[_Put, list[EntryResult]]],
                 defer_wake: bool = False) -> Callable[[], None] | None:
        """Call each put's callback: on its loop (directly when already there, else through
        the loop's inbox), or here for puts from threads. ``defer_wake``: leave waking the
        loop to the caller, who gets the function that does it (None if none is needed)."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Done, list[EntryResult]]]] = {}
        for put, results in outcome:
            if put.loop is None:
                _call(put.done, results)
            else:
                by_loop.setdefault(put.loop, []).append((put.done, results))
        wakes: list[Callable[[], None]] = []
        for loop, calls in by_loop.items():
            if _running_loop() is loop:
                _call_all(calls)
                continue
            inbox = self._inboxes.get(loop)
            if inbox is None:
                inbox = self._inboxes.setdefault(loop, _Inbox(loop))
            if inbox.post(calls):
                wakes.append(inbox.wake)

        def wake_all() -> None:
            for wake in wakes:
                wake()

        if not defer_wake:
            wake_all()
            return None
        return wake_all if len(wakes) > 1 else wakes[0] if wakes else None

    # -- appending ------------------------------------------------------------------------------

    def _append(self, parts: list[Part], wait: bool) -> list[_Append]:
        messages = [m for p, i, j in parts for m in p.messages[i:j]]
        result = self._store.put_messages(messages, wait=wait)
        if not result.messages and result.status in _ONE_MESSAGE_REFUSALS and len(messages) > 1:
            # One message spoiled the batch before anything was written: append again in
            # smaller pieces so only the message at fault is refused.
            if len(parts) > 1:
                return [a for part in parts for a in self._append([part], wait)]
            put, i, j = parts[0]
            return [a for k in range(i, j) for a in self._append([(put, k, k + 1)], wait)]
        return [_Append(parts, messages, result)]


def _results(appends: list[_Append], failed: dict[int, Exception] | None = None
             ) -> list[tuple[_Put, list[EntryResult]]]:
    """Each put's entry results, assembled from the appends that held its messages;
    ``failed`` (by ``id`` of the append) holds the appends whose wait raised."""
    entries: dict[_Put, list[EntryResult]] = {}
    for a in appends:
        sizes = [j - i for _p, i, j in a.parts]
        exc = failed.get(id(a)) if failed else None
        per_part = (split_result(a.result, sizes) if exc is None
                    else [_failed(size, _why(exc)) for size in sizes])
        for (put, _i, _j), results in zip(a.parts, per_part):
            entries.setdefault(put, []).extend(results)
    return list(entries.items())


def _nobody(results: list[EntryResult]) -> None:
    """The callback of a put answered by its return value (``put_now``)."""


def _refused(count: int) -> list[EntryResult]:
    return [EntryResult(PutMessageStatus.SERVICE_NOT_AVAILABLE, None,
                        "the broker is shutting down")] * count


def _failed(count: int, why: str) -> list[EntryResult]:
    return [EntryResult(PutMessageStatus.UNKNOWN_ERROR, None, why)] * count


def _why(exc: Exception) -> str:
    """What a client is told of a put that raised (already logged with its traceback): the
    system's reason for a file-system error, never Python's text for anything else."""
    if isinstance(exc, OSError):
        return f"the store could not write: {exc}"
    if isinstance(exc, _WriterStopped):
        return str(exc)
    return "an internal error in the broker's writer (logged at the broker)"


class _WriterStopped(RuntimeError):
    """The writer thread ended with puts still queued (a bug): they are answered with this."""


class LoopLoad:
    """Whether an event loop's thread is saturated: the CPU time it used over the wall time
    that passed, sampled when ``saturated`` is asked and ``WINDOW`` seconds have gone by
    (a thread's CPU clock is a system call; the wall clock is not). Saturated, a SYNC_FLUSH
    put lingers for company in the group commit: fewer ``fdatasync`` calls leave the CPU to
    the loop, which is what limits it then; unsaturated, waiting would only add latency.

    ``cpu_clock``/``wall_clock`` are for tests; call from the loop's own thread."""

    WINDOW = 0.05  # seconds between samples
    SATURATED = 0.8  # share of the wall time the thread spent on a CPU

    def __init__(self, cpu_clock: Callable[[], float] = time.thread_time,
                 wall_clock: Callable[[], float] = time.monotonic) -> None:
        self._cpu_clock = cpu_clock
        self._wall_clock = wall_clock
        self._wall = wall_clock()
        self._cpu = cpu_clock()
        self._saturated = False

    def saturated(self) -> bool:
        wall = self._wall_clock()
        if wall - self._wall >= self.WINDOW:
            cpu = self._cpu_clock()
            self._saturated = (cpu - self._cpu) >= self.SATURATED * (wall - self._wall)
            self._wall, self._cpu = wall, cpu
        return self._saturated


class _Inbox:
    """Results bound for one loop from other threads: one wake-up of the loop for all that
    arrive before it runs (each ``call_soon_threadsafe`` writes to the loop's self-pipe, and
    each write lets go of the GIL and must win it back from the loop)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._lock = threading.Lock()
        self._calls: list[tuple[Done, list[EntryResult]]] = []
        self._scheduled = False

    def post(self, calls: list[tuple[Done, list[EntryResult]]]) -> bool:
        """Queue ``calls`` for the loop; True if the loop must now be woken (``wake``)."""
        with self._lock:
            self._calls.extend(calls)
            if self._scheduled:
                return False
            self._scheduled = True
            return True

    def wake(self) -> None:
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
            self.loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        with self._lock:
            calls, self._calls = self._calls, []
            self._scheduled = False
        _call_all(calls)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _call_all(calls: list[tuple[Done, list[EntryResult]]]) -> None:
    for done, results in calls:
        _call(done, results)


def _call(done: Done, results: list[EntryResult]) -> None:
    try:
        done(results)
    except Exception:
        log.exception("put callback failed")
