"""Long polls as registered waiters on the broker's event loop, woken by the dispatcher.

A receive or a pull that finds nothing registers a ``Waiter`` and awaits it; a waiting call
holds a future and a few small objects, no thread. Wake-ups:

* ``notify(topic)`` runs on the store's dispatcher thread once a dispatch round made new
  records of ``topic`` readable (``MessageStore.add_dispatch_listener``), and on whichever thread
  acks or changes an invisible time (a FIFO queue may have become free). It bumps the topic's
  sequence number and, only when somebody waits on the topic, schedules one wake-up on the
  loop (``call_soon_threadsafe``; wake-ups of a topic already scheduled are not repeated).
* On the loop, a topic's wake-up wakes every pull waiting on it (pulls are stateless readers,
  each needs its own read) and, per consumer group, the receive waiting longest: one pop can
  serve what arrived. A receive that took a full batch passes the wake on to the next receive
  of its group (``pass_on``); so 1,000 polls of one group do not all pop for one message.
* ``expect(topic, seconds)``: a receive popped messages that turn visible again then (unless
  acked); the topic's waiters are woken at that time to redeliver them. One timer per topic,
  the earliest: a woken receive works out the next due time from the group's state.

A waiter must not miss a wake-up between its last look and its wait: it reads ``seq(topic)``
before it pops, and ``wait`` returns at once if the sequence moved since.

Limits (RocketMQ's broker answers ``POLLING_FULL``, which its proxy turns into
``TOO_MANY_REQUESTS`` "polling full"): at most ``max_total`` waiting calls
(``maxPopPollingSize``), ``max_per_group`` receives of one group and topic (``popPollingSize``)
and ``max_per_client`` calls of one client (``popPollingSizePerClient``).

Thread-safety: ``notify`` and ``seq`` from any thread; everything else on the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from dataclasses import dataclass, field

from rocketmq.grpc_protocol import definition_pb2 as pb

from stratamq.broker.errors import BrokerError

__all__ = ["LongPolls", "Waiter"]

Code = pb.Code


@dataclass(eq=False)
class Waiter:
    """One waiting receive (``group`` set) or pull (``group`` None)."""

    topic: str
    group: str | None
    client: str
    future: asyncio.Future[None] | None = None
    # Woken by a notify and not yet done with the pop that follows (the caller clears it):
    # a waiter that leaves in between hands the wake-up on.
    woken: bool = field(default=False)


class LongPolls:
    """The waiting receives and pulls of one broker; see the module docstring."""

    def __init__(self, loop: asyncio.AbstractEventLoop, *, max_total: int = 100_000,
                 max_per_group: int = 1024, max_per_client: int = 1024) -> None:
        self._loop = loop
        self.max_total = max_total
        self.max_per_group = max_per_group
        self.max_per_client = max_per_client
        self._seq: dict[str, int] = {}
        # notify runs on the dispatcher thread and on executor threads (acks, invisible-time
        # changes): without the lock two increments could collapse into one, and a receive that
        # read the sequence between them would sleep through the wake-up.
        self._seq_lock = threading.Lock()
        # Read by notify on other threads (membership only); changed on the loop.
        self._topics: dict[str, int] = {}  # topic -> waiters registered
        self._scheduled: set[str] = set()  # topics with a wake-up queued on the loop
        self._receives: dict[str, dict[str, deque[Waiter]]] = {}  # topic -> group -> waiters
        self._pulls: dict[str, set[Waiter]] = {}
        self._per_client: dict[str, int] = {}
        self._per_group: dict[tuple[str, str], int] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self.total = 0
        self.closing = False

    # -- any thread -----------------------------------------------------------------------------

    def seq(self, topic: str) -> int:
        return self._seq.get(topic, 0)

    def notify(self, topic: str) -> None:
        with self._seq_lock:
            self._seq[topic] = self._seq.get(topic, 0) + 1
        if topic in self._topics and topic not in self._scheduled:
            self._scheduled.add(topic)
            with contextlib.suppress(RuntimeError):  # a closed loop: the broker is stopping
                self._loop.call_soon_threadsafe(self._wake_topic, topic)

    # -- the loop -------------------------------------------------------------------------------

    def register(self, topic: str, group: str | None, client: str) -> Waiter:
        """A waiter for a receive (``group``) or a pull; TOO_MANY_REQUESTS past a limit."""
        if self.total >= self.max_total:
            raise BrokerError(Code.TOO_MANY_REQUESTS, "polling full")
        if self._per_client.get(client, 0) >= self.max_per_client:
            raise BrokerError(Code.TOO_MANY_REQUESTS, "polling full: too many long polls of "
                              f"this client (popPollingSizePerClient={self.max_per_client})")
        if group is not None and self._per_group.get((group, topic), 0) >= self.max_per_group:
            raise BrokerError(Code.TOO_MANY_REQUESTS, "polling full: too many long polls of "
                              f"group {group!r} on {topic!r} (popPollingSize="
                              f"{self.max_per_group})")
        waiter = Waiter(topic, group, client)
        self.total += 1
        self._per_client[client] = self._per_client.get(client, 0) + 1
        self._topics[topic] = self._topics.get(topic, 0) + 1
        if group is None:
            self._pulls.setdefault(topic, set()).add(waiter)
        else:
            self._per_group[(group, topic)] = self._per_group.get((group, topic), 0) + 1
            self._receives.setdefault(topic, {}).setdefault(group, deque()).append(waiter)
        return waiter

    def unregister(self, waiter: Waiter) -> None:
        topic, group, client = waiter.topic, waiter.group, waiter.client
        self.total -= 1
        _decrement(self._per_client, client)
        _decrement(self._topics, topic)
        if group is None:
            pulls = self._pulls.get(topic)
            if pulls is not None:
                pulls.discard(waiter)
                if not pulls:
                    del self._pulls[topic]
            return
        _decrement(self._per_group, (group, topic))
        groups = self._receives.get(topic, {})
        queue = groups.get(group)
        if queue is not None:
            queue.remove(waiter)
            if not queue:
                del groups[group]
                if not groups:
                    self._receives.pop(topic, None)
        if waiter.woken and not self.closing:
            # Woken, then gone before its pop finished (cancelled): the wake-up goes on.
            self._wake_one(topic, group)

    async def wait(self, waiter: Waiter, seen: int, timeout: float) -> None:
        """Until a wake-up for the waiter's topic, ``timeout`` seconds, or the broker closes;
        at once if ``seq(topic)`` moved past ``seen`` already."""
        if self.closing or self.seq(waiter.topic) != seen or timeout <= 0:
            return
        future = self._loop.create_future()
        waiter.future, waiter.woken = future, False
        timer = self._loop.call_later(timeout, _resolve, future)
        try:
            await future
        finally:
            timer.cancel()
            waiter.future = None

    def pass_on(self, waiter: Waiter) -> None:
        """The receive took a full batch: more may be waiting for its group's other polls."""
        if waiter.group is not None:
            self._wake_one(waiter.topic, waiter.group)

    def expect(self, topic: str, seconds: float) -> None:
        """Wake the topic's receives in ``seconds`` (popped messages turn visible again)."""
        if topic not in self._receives:
            return  # nobody waits: a receive arriving later works the due time out itself
        when = self._loop.time() + seconds
        timer = self._timers.get(topic)
        if timer is not None and timer.when() <= when:
            return
        if timer is not None:
            timer.cancel()
        self._timers[topic] = self._loop.call_at(when, self._timer_fired, topic)

    def close(self) -> None:
        """Every waiter returns now, and later waits return at once (the broker is stopping)."""
        self.closing = True
        for groups in self._receives.values():
            for queue in groups.values():
                for waiter in queue:
                    _resolve(waiter.future)
        for pulls in self._pulls.values():
            for waiter in pulls:
                _resolve(waiter.future)
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()

    def _timer_fired(self, topic: str) -> None:
        self._timers.pop(topic, None)
        for group in list(self._receives.get(topic, {})):
            self._wake_one(topic, group)

    def _wake_topic(self, topic: str) -> None:
        self._scheduled.discard(topic)
        for waiter in self._pulls.get(topic, ()):
            if _resolve(waiter.future):
                waiter.woken = True
        for group in list(self._receives.get(topic, {})):
            self._wake_one(topic, group)

    def _wake_one(self, topic: str, group: str) -> None:
        for waiter in self._receives.get(topic, {}).get(group, ()):
            if waiter.future is not None and _resolve(waiter.future):
                waiter.woken = True
                return


def _resolve(future: asyncio.Future[None] | None) -> bool:
    if future is None or future.done():
        return False
    future.set_result(None)
    return True


def _decrement(counts: dict, key: object) -> None:
    left = counts.get(key, 0) - 1
    if left > 0:
        counts[key] = left
    else:
        counts.pop(key, None)
