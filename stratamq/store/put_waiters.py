"""What a put waits for after its append: the put waiters, in turn, blocking or by callback.

A put waiter is a condition every put that asks to wait (``WAIT`` not false) waits for after
its append: ``waiter(end_offset)`` returns None once the bytes before ``end_offset`` are where
it wants them, or the status the put then answers. Under SYNC_FLUSH the group commit is the
first (``GroupCommitWaiter``: on disk, else FLUSH_DISK_TIMEOUT); a replication master adds
"a slave has the bytes" (else FLUSH_SLAVE_TIMEOUT). The first refusal decides.

A ``CallbackPutWaiter`` can also be waited for without blocking a thread: ``later(end, done,
linger)`` returns at once and calls ``done`` with what ``waiter(end)`` would have returned. A
broker's event loop waits that way (``wait_in_turn_later``) when every waiter can.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, cast

from stratamq.record import Message, Prop
from stratamq.store.flush import GroupCommitService, Wake
from stratamq.store.results import PutMessageResult, PutMessageStatus

__all__ = ["CallbackPutWaiter", "GroupCommitWaiter", "PutWaiter", "all_call_back",
           "end_to_wait_for", "wait_in_turn", "wait_in_turn_later"]

PutWaiter = Callable[[int], PutMessageStatus | None]


class CallbackPutWaiter(Protocol):
    """A put waiter that can also answer by a callback: ``later(end, done)`` returns at once
    and calls ``done`` with what ``waiter(end)`` would have returned; it calls what ``done``
    returns (a ``Wake``) once it has answered the other puts it answers with this one.
    ``linger``: the appender is saturated; the wait may be longer if that makes it cheaper."""

    def __call__(self, end: int) -> PutMessageStatus | None: ...

    def later(self, end: int, done: Callable[[PutMessageStatus | None], Wake | None],
              linger: bool = False) -> None: ...


class GroupCommitWaiter:
    """SYNC_FLUSH's put waiter: the group commit, waited for by blocking or by a callback."""

    def __init__(self, group_commit: GroupCommitService) -> None:
        self.group_commit = group_commit

    def __call__(self, end: int) -> PutMessageStatus | None:
        return None if self.group_commit.wait_for_flush(end) else _FLUSH_TIMEOUT

    def later(self, end: int, done: Callable[[PutMessageStatus | None], Wake | None],
              linger: bool = False) -> None:
        self.group_commit.request_flush(end, lambda ok: done(None if ok else _FLUSH_TIMEOUT),
                                        linger)


_FLUSH_TIMEOUT = PutMessageStatus.FLUSH_DISK_TIMEOUT


def end_to_wait_for(result: PutMessageResult, messages: Sequence[Message]) -> int | None:
    """Where a put's records end, if it waits (something was written, and a message did not
    say ``WAIT=false``); else None."""
    if result.messages and any(
            m.properties.get(Prop.WAIT_STORE_MSG_OK, "true") != "false" for m in messages):
        last = result.messages[-1]
        return last.physical_offset + last.size
    return None


def all_call_back(waiters: Sequence[PutWaiter]) -> bool:
    """Whether every waiter can answer by a callback."""
    return all(hasattr(w, "later") for w in waiters)  # isinstance of a Protocol is slow


def wait_in_turn(waiters: Sequence[PutWaiter], result: PutMessageResult, end: int) -> None:
    """Wait on each waiter in order, blocking; the first refusal becomes ``result.status``."""
    for wait in waiters:
        refusal = wait(end)
        if refusal is not None:
            result.status = refusal
            return


def wait_in_turn_later(waiters: Sequence[PutWaiter], result: PutMessageResult, end: int,
                       done: Callable[[PutMessageResult], Wake | None],
                       linger: bool = False) -> None:
    """``wait_in_turn`` by callbacks (every waiter must ``all_call_back``): ``done(result)``
    on the thread of the waiter that answered last; what it returns goes back to that
    waiter, which calls it after the rest of its group's answers."""
    if not all_call_back(waiters):
        raise RuntimeError("a put waiter can only be waited for by blocking: wait_put")
    chain = cast(list[CallbackPutWaiter], list(waiters))

    def step(index: int, refusal: PutMessageStatus | None) -> Wake | None:
        if refusal is not None or index == len(chain):
            if refusal is not None:
                result.status = refusal
            return done(result)
        chain[index].later(end, lambda refused: step(index + 1, refused), linger)
        return None

    step(0, None)
