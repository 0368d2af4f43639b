"""What the broker's logic needs from the store and from an RPC, as small interfaces.

The send, receive and pull logic (``sending.py``, ``receiving.py``, ``pulling.py``) is handed
these instead of a ``MessageStore`` or a gRPC context, so tests drive it with the real store
and a ``Call`` they build, no socket in between, and the store's internals stay its own.
``MessageStore`` satisfies every store protocol here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Protocol

from stratamq.message import DispatchInfo, Host, Message
from stratamq.store.filter import TagFilter
from stratamq.store.results import GetMessageResult, PutMessageResult

__all__ = ["Call", "DispatchEvents", "MessageReader", "MessageWriter", "QueueStore"]


class MessageWriter(Protocol):
    """Appends messages, in order, as one batch; ``wait=False`` returns once they are
    appended, and ``wait_put`` then waits as ``put_messages`` would have (SYNC_FLUSH's flush,
    a slave). ``waits_on_put``: whether there is ever anything to wait for;
    ``put_waits_call_back``: whether ``wait_put_later`` can wait without blocking a thread."""

    def put_messages(self, messages: Sequence[Message], *, wait: bool = True
                     ) -> PutMessageResult: ...

    def wait_put(self, result: PutMessageResult, messages: Sequence[Message]
                 ) -> PutMessageResult: ...

    @property
    def waits_on_put(self) -> bool: ...

    @property
    def put_waits_call_back(self) -> bool: ...

    def wait_put_later(self, result: PutMessageResult, messages: Sequence[Message],
                       done: Callable[[PutMessageResult], Callable[[], None] | None],
                       linger: bool = False) -> None: ...


class MessageReader(Protocol):
    """Reads a queue by offset, and the offsets a queue holds."""

    def get_messages(self, group: str, topic: str, queue_id: int, offset: int,
                     max_count: int | None = None, max_bytes: int | None = None,
                     tag_filter: str | TagFilter | None = None) -> GetMessageResult: ...

    def get_min_offset_in_queue(self, topic: str, queue_id: int) -> int: ...

    def get_max_offset_in_queue(self, topic: str, queue_id: int) -> int: ...

    def get_offset_in_queue_by_time(self, topic: str, queue_id: int,
                                    timestamp_ms: int) -> int: ...


class QueueStore(MessageReader, MessageWriter, Protocol):
    """Both: the pop engine reads queues and writes dead letters."""


class DispatchEvents(Protocol):
    """Where long polls learn that a topic has new readable messages."""

    def add_dispatch_listener(self, listener: Callable[[DispatchInfo], None]) -> None: ...

    def remove_dispatch_listener(self, listener: Callable[[DispatchInfo], None]) -> None: ...


@dataclass(frozen=True)
class Call:
    """One RPC as the logic sees it: who called, with which metadata, how long it waits.

    Built by the gRPC adapter from its context (or by a test); immutable, so any thread may
    read it. ``time_remaining`` is the client's deadline in seconds from the call's start
    (None: no deadline)."""

    metadata: Mapping[str, str] = field(default_factory=dict)
    peer: str = "ipv4:127.0.0.1:0"
    time_remaining: float | None = None

    @property
    def client_id(self) -> str:
        """The client's id (``x-mq-client-id``, which every official client sends), else its
        address: what per-client limits and the connection list count by."""
        return self.metadata.get("x-mq-client-id") or self.peer

    def peer_host(self) -> Host:
        """The caller's address as a store host (born host of what it sends)."""
        return _peer_host(self.peer)


@lru_cache(maxsize=4096)  # one parse per connection, not per request
def _peer_host(peer: str) -> Host:
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        try:
            return Host.parse(rest)
        except ValueError:
            pass
    return Host("127.0.0.1", 0)
