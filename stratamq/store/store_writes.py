"""``MessageStore``'s writing side: puts, what a put waits for after its append, and topic
deletion. A mixin: ``MessageStore`` (``message_store.py``) holds the state and the parts it
uses (declared below); the methods live here so the facade stays short.

Thread-safety: as ``MessageStore``: puts from any thread once ``open()`` returned.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from stratamq.config import BrokerRole, StoreConfig
from stratamq.names import MAX_TOPIC_NAME_BYTES, topic_name_problem
from stratamq.record import Message
from stratamq.store.flush import Wake
from stratamq.store.put_waiters import (
    PutWaiter,
    all_call_back,
    end_to_wait_for,
    wait_in_turn,
    wait_in_turn_later,
)
from stratamq.store.results import PutMessageResult, PutMessageStatus

if TYPE_CHECKING:
    from stratamq.store.cleanup import CleanupService
    from stratamq.store.commitlog import CommitLog
    from stratamq.store.deleted_topics import DeletedTopics
    from stratamq.store.dispatch import ReputService
    from stratamq.store.layout import StoreLayout
    from stratamq.store.store_stats import StoreStats

__all__ = ["StoreWrites"]


class StoreWrites:
    """Puts and topic deletion of a ``MessageStore`` (see the module docstring)."""

    config: StoreConfig
    read_only: bool
    layout: StoreLayout
    commitlog: CommitLog
    reput: ReputService
    deleted_topics: DeletedTopics
    cleanup: CleanupService | None
    put_waiters: list[PutWaiter]
    put_guards: list[Callable[[], str | None]]
    stats: StoreStats
    _opened: bool
    _valid_topics: set[str]
    _max_topic_bytes: int | None

    def put_message(self, msg: Message) -> PutMessageResult:
        return self.put_messages([msg])

    def put_messages(self, messages: Sequence[Message], *, wait: bool = True
                     ) -> PutMessageResult:
        """Append messages in order; under SYNC_FLUSH return once they are on disk.

        ``wait=False``: return once they are appended; the caller then calls ``wait_put``
        (from a thread that may block) before it acknowledges them."""
        started = time.monotonic()
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
        self.stats.on_put(result, started)  # the append's outcome, as RocketMQ counts it
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
