"""``LocalSource``: the read chain's source for what this store holds on its own disk.

Reads go ConsumeQueue unit -> CommitLog record (zero-copy views of the mapped segments, held
until the result is released); lookups by key go through the local index; lookups by time
through the ConsumeQueues. It is handed those parts, never the store.

Thread-safety: every method may be called from any reading thread.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from stratamq.message import Prop, StoredMessage
from stratamq.record import record_tags
from stratamq.store.commitlog import CommitLog
from stratamq.store.consume_queue_format import is_blank_unit
from stratamq.store.consume_queue_store import ConsumeQueueHandle, ConsumeQueueStore
from stratamq.store.deleted_topics import DeletedTopics
from stratamq.store.index_service import IndexService
from stratamq.store.read_chain import QueueOffsets, ReadRequest
from stratamq.store.results import GetMessageResult, GetMessageStatus, SelectedRecord

__all__ = ["LocalSource"]


class LocalSource:
    """The local ConsumeQueues, CommitLog and index as a ``ReadSource``."""

    name = "local"

    def __init__(self, consume_queues: Callable[[], ConsumeQueueStore], commitlog: CommitLog,
                 index: IndexService | None, deleted_topics: DeletedTopics) -> None:
        # A callable: the primary ConsumeQueue store can be swapped (migration) under a reader.
        self._queues = consume_queues
        self._commitlog = commitlog
        self._index = index
        self._deleted = deleted_topics

    def offsets(self, topic: str, queue_id: int) -> QueueOffsets | None:
        cq = self._queues().find(topic, queue_id)
        if cq is None:
            return None
        return QueueOffsets(cq.min_offset(), cq.max_offset())

    def read(self, request: ReadRequest) -> GetMessageResult | None:
        cq = self._queues().find(request.topic, request.queue_id)
        if cq is None:
            return None
        min_offset, max_offset = cq.min_offset(), cq.max_offset()
        if not min_offset <= request.offset < max_offset:
            return None
        return self._read_units(cq, request, min_offset, max_offset)

    def _read_units(self, cq: ConsumeQueueHandle, request: ReadRequest, min_offset: int,
                    max_offset: int) -> GetMessageResult:
        offset, max_count, max_bytes, filt = (request.offset, request.max_count,
                                              request.max_bytes, request.filter)
        # Scan more units than we return when filtering, as RocketMQ does (16,000 bytes' worth).
        scan = max_count if filt.accepts_all else max(max_count, 800)
        units = cq.get_units(offset, scan)
        result = GetMessageResult(GetMessageStatus.NO_MATCHED_MESSAGE, offset, min_offset,
                                  max_offset)
        records = result.records
        held = result._held
        files = self._commitlog.files
        commitlog_min = self._commitlog.min_offset
        current = None
        total = 0
        next_offset = offset
        for queue_offset, (phys, size, code) in enumerate(units, offset):
            if is_blank_unit(phys, size, code):
                next_offset = queue_offset + 1
                continue
            if len(records) >= max_count or (records and total + size > max_bytes):
                break
            if phys < commitlog_min:
                if records:  # what follows is served by the next read (maybe by the tier)
                    break
                next_offset = queue_offset + 1
                result.status = GetMessageStatus.MESSAGE_WAS_REMOVING
                continue
            next_offset = queue_offset + 1
            if not filt.matches_code(code):
                continue
            if current is None or not (
                current.file_from_offset <= phys < current.file_end_offset
            ):
                current = files.find_by_offset(phys)
                if current is None or not current.hold():
                    current = None
                    result.status = GetMessageStatus.MESSAGE_WAS_REMOVING
                    continue
                held.append(current)
            rel = phys - current.file_from_offset
            if rel + size > current.read_position:
                next_offset = queue_offset  # dispatched ahead of a recovery cut: stop here
                break
            view = current.buffer[rel : rel + size]
            if filt.tags is not None and not filt.matches_tags(record_tags(view, 0)):
                view.release()
                continue
            records.append(SelectedRecord(view, phys, queue_offset))
            total += size
        result.next_begin_offset = next_offset
        if records:
            result.status = GetMessageStatus.FOUND
        return result

    def offset_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int | None:
        cq = self._queues().find(topic, queue_id)
        if cq is None:
            return None
        found = cq.offset_by_time(timestamp_ms, self._commitlog.store_timestamp_at)
        return None if found >= cq.max_offset() else found

    def query_by_key(self, topic: str, key: str, max_num: int, begin_ms: int,
                     end_ms: int) -> list[StoredMessage]:
        return self.query_index(topic, key, max_num, begin_ms, end_ms, unique_only=False)

    def query_index(self, topic: str, key: str, max_num: int, begin_ms: int, end_ms: int, *,
                    unique_only: bool) -> list[StoredMessage]:
        if self._index is None or max_num <= 0:
            return []
        found: list[StoredMessage] = []
        seen: set[int] = set()
        # Entry times are whole seconds, rounded down: ask from a second earlier, then judge by
        # the record's exact store time. Entries hold only a hash, so check the record's keys.
        for phys in self._index.query_offsets(topic, key, max(0, begin_ms - 1000), end_ms):
            if phys in seen:
                continue
            seen.add(phys)
            msg = self.read_by_physical_offset(phys)
            if (msg is None or msg.topic != topic or not begin_ms <= msg.store_timestamp <= end_ms
                    or self._deleted.covers(topic, phys)):
                continue
            props = msg.properties
            if props.get(Prop.UNIQ_KEY) != key and (
                unique_only or key not in props.get(Prop.KEYS, "").split(" ")
            ):
                continue
            found.append(msg)
            if len(found) >= max_num:
                break
        return found

    def read_by_physical_offset(self, physical_offset: int) -> StoredMessage | None:
        if physical_offset < 0:
            return None
        try:
            return self._commitlog.read(physical_offset)
        except (ValueError, struct.error):  # not a record boundary: an id pointing nowhere
            return None

    def topics(self) -> dict[str, list[int]]:
        return self._queues().topics()
