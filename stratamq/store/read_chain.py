"""The read chain: reads by (topic, queue, offset) served by an ordered list of sources.

The local ConsumeQueue + CommitLog is one source (``LocalSource``); parts from outside the store
plug theirs in with ``MessageStore.add_read_source`` (the tier's fetcher after the local source,
a compaction log before it for its topics). A read asks each source in turn; the first that
*holds* the offset answers, and ``OFFSET_TOO_SMALL`` / ``OFFSET_OVERFLOW_*`` come from the
chain only when none does, measured against the offsets of every source together. So a
message whose local segment was deleted is still served by the tier, with the same offset.

Contracts: sources are called from any reading thread and must be thread-safe. A source never
raises for an offset it does not hold: it answers ``None`` and the next one is asked. The
records of a result may come from any source; its single ``release()`` lets go of everything
they hold (mapped segments, cache pins).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, runtime_checkable

from stratamq.message import StoredMessage
from stratamq.store.filter import TagFilter
from stratamq.store.results import GetMessageResult, GetMessageStatus

__all__ = ["QueueOffsets", "ReadChain", "ReadRequest", "ReadSource"]


class QueueOffsets(tuple[int, int]):
    """(min offset, max offset) of a queue in one source: ``max`` is the next offset to be
    written there, so the source holds ``[min, max)``."""

    __slots__ = ()

    def __new__(cls, low: int, high: int) -> QueueOffsets:
        return super().__new__(cls, (low, high))

    @property
    def low(self) -> int:
        return self[0]

    @property
    def high(self) -> int:
        return self[1]


class ReadRequest:
    """One read: where to start and how much to return."""

    __slots__ = ("topic", "queue_id", "offset", "max_count", "max_bytes", "filter")

    def __init__(self, topic: str, queue_id: int, offset: int, max_count: int, max_bytes: int,
                 filt: TagFilter) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.offset = offset
        self.max_count = max_count
        self.max_bytes = max_bytes
        self.filter = filt


@runtime_checkable
class ReadSource(Protocol):
    """A place messages can be read from. Every method answers ``None`` (or nothing) for what
    the source does not hold, so the chain asks the next source."""

    name: str

    def offsets(self, topic: str, queue_id: int) -> QueueOffsets | None:
        """The queue offsets this source holds, or None when it has nothing of the queue."""
        ...

    def read(self, request: ReadRequest) -> GetMessageResult | None:
        """Records from ``request.offset`` on, or None when this source does not hold that
        offset. A result may stop early (at the end of what the source holds); the chain does
        not stitch sources inside one read: the next read asks again from
        ``next_begin_offset``."""
        ...

    def offset_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int | None:
        """The first offset it holds stored at or after ``timestamp_ms``; None when it holds
        none (or nothing of the queue)."""
        ...

    def query_by_key(self, topic: str, key: str, max_num: int, begin_ms: int,
                     end_ms: int) -> list[StoredMessage]:
        """Messages of ``topic`` with ``key`` (a KEYS word or the unique id) stored in
        [begin_ms, end_ms], newest first."""
        ...

    def read_by_physical_offset(self, physical_offset: int) -> StoredMessage | None:
        """The record that was at this CommitLog offset, if the source keeps it."""
        ...

    def topics(self) -> dict[str, list[int]]:
        """Topics (and their queue ids) the source holds."""
        ...

    # Optional, looked up with getattr: ``physical_end() -> int``, where the source's records
    # end in the CommitLog they came from; an empty local CommitLog starts past it
    # (``MessageStore._start_after_sources``).


class ReadChain:
    """The ordered sources, and the answers that need all of them.

    The order is the order of preference: a source placed before the local one
    (``first=True``) claims reads before it (a compaction log for its topics, a tier under the
    ``FORCE`` policy); the others are asked when the local source does not hold an offset.
    """

    def __init__(self, sources: Iterable[ReadSource] = ()) -> None:
        self._sources: tuple[ReadSource, ...] = tuple(sources)

    @property
    def sources(self) -> tuple[ReadSource, ...]:
        return self._sources

    def add(self, source: ReadSource, *, first: bool = False) -> None:
        # Replaced, never changed in place: readers iterate a snapshot without a lock.
        self._sources = (source, *self._sources) if first else (*self._sources, source)

    def offsets(self, topic: str, queue_id: int) -> QueueOffsets | None:
        """The union of what the sources hold of a queue: lowest min, highest max."""
        low = high = None
        for source in self._sources:
            held = source.offsets(topic, queue_id)
            if held is None:
                continue
            low = held.low if low is None else min(low, held.low)
            high = held.high if high is None else max(high, held.high)
        return None if low is None or high is None else QueueOffsets(low, high)

    def read(self, request: ReadRequest) -> GetMessageResult:
        sources = self._sources
        removed: GetMessageResult | None = None
        for source in sources:
            result = source.read(request)
            if result is None:
                continue
            if result.records or result.status is not GetMessageStatus.MESSAGE_WAS_REMOVING:
                if removed is not None:
                    removed.release()
                return result
            # The source's units point at records it no longer has (local clean-up went past
            # them): a later source (the tier) may still hold them.
            if removed is None:
                removed = result
            else:
                result.release()
        if removed is not None:
            return removed
        held = self.offsets(request.topic, request.queue_id)
        if held is None:
            return GetMessageResult(GetMessageStatus.NO_MATCHED_LOGIC_QUEUE, 0, 0, 0)
        low, high = held
        offset = request.offset
        if high == 0:
            return GetMessageResult(GetMessageStatus.NO_MESSAGE_IN_QUEUE, 0, 0, 0)
        if offset < low:
            return GetMessageResult(GetMessageStatus.OFFSET_TOO_SMALL, low, low, high)
        if offset == high:
            return GetMessageResult(GetMessageStatus.OFFSET_OVERFLOW_ONE, offset, low, high)
        if offset > high:
            return GetMessageResult(GetMessageStatus.OFFSET_OVERFLOW_BADLY,
                                    low if low == 0 else high, low, high)
        # Inside [low, high) but no source holds it: a gap between sources (the tier has not
        # uploaded what local clean-up removed). Skip to the next offset one holds.
        nxt = min((h.low for s in sources if (h := s.offsets(request.topic, request.queue_id))
                   is not None and h.low > offset), default=high)
        return GetMessageResult(GetMessageStatus.OFFSET_FOUND_NULL, nxt, low, high)

    def offset_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        found = [o for s in self._sources
                 if (o := s.offset_by_time(topic, queue_id, timestamp_ms)) is not None]
        if found:
            return min(found)
        held = self.offsets(topic, queue_id)
        return 0 if held is None else held.high

    def query_by_key(self, topic: str, key: str, max_num: int, begin_ms: int,
                     end_ms: int) -> list[StoredMessage]:
        """Every source's hits, newest first, each record once (by CommitLog offset)."""
        found: dict[int, StoredMessage] = {}
        for source in self._sources:
            for msg in source.query_by_key(topic, key, max_num, begin_ms, end_ms):
                found.setdefault(msg.physical_offset, msg)
        ordered = sorted(found.values(), key=lambda m: (m.store_timestamp, m.physical_offset),
                         reverse=True)
        return ordered[:max_num]

    def read_by_physical_offset(self, physical_offset: int) -> StoredMessage | None:
        for source in self._sources:
            msg = source.read_by_physical_offset(physical_offset)
            if msg is not None:
                return msg
        return None

    def topics(self) -> dict[str, list[int]]:
        merged: dict[str, set[int]] = {}
        for source in self._sources:
            for topic, queues in source.topics().items():
                merged.setdefault(topic, set()).update(queues)
        return {topic: sorted(queues) for topic, queues in merged.items()}
