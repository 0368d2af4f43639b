"""``MessageStore``'s reading side: reads by queue offset, lookups by key, message id, time and
physical offset, all through the read chain (the local ConsumeQueues first, then whatever is
plugged in: ``read_chain.py``). A mixin: ``MessageStore`` (``message_store.py``) holds the
state (declared below); the methods live here so the facade stays short.

Thread-safety: as ``MessageStore``: reads from any thread once ``open()`` returned.
"""

from __future__ import annotations

import time

from stratamq.config import StoreConfig
from stratamq.record import Prop, StoredMessage, parse_offset_msg_id
from stratamq.store.filter import TagFilter
from stratamq.store.read_chain import ReadChain, ReadRequest, ReadSource
from stratamq.store.results import GetMessageResult
from stratamq.store.store_stats import StoreStats

__all__ = ["StoreReads"]


class StoreReads:
    """Reads and lookups of a ``MessageStore`` (see the module docstring)."""

    config: StoreConfig
    read_chain: ReadChain
    stats: StoreStats
    _opened: bool
    _plugged_sources: list[tuple[ReadSource, bool]]

    def get_messages(
        self,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int | None = None,
        max_bytes: int | None = None,
        tag_filter: str | TagFilter | None = None,
    ) -> GetMessageResult:
        """Read from ``topic``/``queue_id`` starting at queue ``offset``, through the read chain
        (the local queues first, then whatever is plugged in: see ``add_read_source``).

        ``group`` names the reader (kept for RocketMQ parity; the store tracks no progress).
        Records come back as zero-copy views: release the result when done with them.
        """
        max_count = max_count or self.config.max_transfer_count_on_message_in_memory
        max_bytes = max_bytes or self.config.max_transfer_bytes_on_message_in_memory
        filt = tag_filter if isinstance(tag_filter, TagFilter) else TagFilter(tag_filter)
        started = time.monotonic()
        got = self.read_chain.read(ReadRequest(topic, queue_id, offset, max_count, max_bytes,
                                               filt))
        self.stats.on_get(got, started)
        return got

    def add_read_source(self, source: ReadSource, *, first: bool = False) -> None:
        """Plug in a read source (a tier fetcher, a compaction log): asked after the local
        ConsumeQueues, or before them with ``first=True``. A read is answered by the first
        source that holds the offset; min/max offsets, offsets by time and lookups by key or
        id ask every source (see ``read_chain``)."""
        if self._opened:
            self.read_chain.add(source, first=first)
        else:
            self._plugged_sources.append((source, first))

    def get_min_offset_in_queue(self, topic: str, queue_id: int) -> int:
        held = self.read_chain.offsets(topic, queue_id)
        return held.low if held else 0

    def get_max_offset_in_queue(self, topic: str, queue_id: int) -> int:
        held = self.read_chain.offsets(topic, queue_id)
        return held.high if held else 0

    def look_message_by_offset(self, physical_offset: int) -> StoredMessage | None:
        """Decode the record at a CommitLog offset (e.g. from an offset message id)."""
        return self.read_chain.read_by_physical_offset(physical_offset)

    # lookups by key, message id and time (index: docs/formats/index-file.md)

    def query_messages(self, topic: str, key: str, max_num: int = 64, begin_ms: int = 0,
                       end_ms: int | None = None) -> list[StoredMessage]:
        """Messages of ``topic`` carrying ``key`` (a word of KEYS, or the unique id) stored
        in [begin_ms, end_ms], newest first, at most ``max_num``; [] with the index off."""
        if max_num <= 0:
            return []
        end = 2**63 - 1 if end_ms is None else end_ms
        return self.read_chain.query_by_key(topic, key, max_num, begin_ms, end)

    def look_message_by_msg_id(self, msg_id: str, topic: str | None = None
                               ) -> StoredMessage | None:
        """The message with this id: an offset message id (store host + CommitLog offset) or
        a unique client id (``UNIQ_KEY``, found through the index, in ``topic`` or any)."""
        msg_id = msg_id.strip()
        try:
            host, phys = parse_offset_msg_id(msg_id)
        except ValueError:
            pass
        else:
            msg = self.read_chain.read_by_physical_offset(phys)
            if msg is not None and msg.physical_offset == phys and msg.store_host == host:
                return msg
        for name in [topic] if topic is not None else list(self.topics()):
            for hit in self.read_chain.query_by_key(name, msg_id, 8, 0, 2**63 - 1):
                if hit.properties.get(Prop.UNIQ_KEY) == msg_id:
                    return hit
        return None

    def get_offset_in_queue_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """First queue offset whose message was stored at or after ``timestamp_ms``; the
        queue's max offset if none was (0 for an unknown queue)."""
        return self.read_chain.offset_by_time(topic, queue_id, timestamp_ms)

    def topics(self) -> dict[str, list[int]]:
        """Every topic any read source holds (the local ConsumeQueues first), with its queue
        ids."""
        return self.read_chain.topics()
