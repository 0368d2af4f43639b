"""Results of puts and gets, with the status names RocketMQ users know."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NamedTuple

from stratamq import record as codec
from stratamq.message import StoredMessage


class PutMessageStatus(StrEnum):
    PUT_OK = "PUT_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"
    SERVICE_NOT_AVAILABLE = "SERVICE_NOT_AVAILABLE"
    CREATE_MAPPED_FILE_FAILED = "CREATE_MAPPED_FILE_FAILED"
    MESSAGE_ILLEGAL = "MESSAGE_ILLEGAL"
    PROPERTIES_SIZE_EXCEEDED = "PROPERTIES_SIZE_EXCEEDED"
    OS_PAGE_CACHE_BUSY = "OS_PAGE_CACHE_BUSY"
    UNKNOWN_ERROR = "UNKNOWN_ERROR"


class GetMessageStatus(StrEnum):
    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
    MESSAGE_WAS_REMOVING = "MESSAGE_WAS_REMOVING"
    OFFSET_FOUND_NULL = "OFFSET_FOUND_NULL"
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"


class AppendedMessage(NamedTuple):
    """Where one message landed (a tuple: one is built per message on the put path).

    ``msg_id`` is formatted on first use, not per put: most puts never read it, and the
    formatting was a measurable share of a batch put of small messages."""

    physical_offset: int
    size: int
    queue_offset: int
    store_timestamp: int
    msg_id_prefix: str  # the store host part of the offset message id (hex)

    @property
    def msg_id(self) -> str:
        """RocketMQ's offset message id: store host + physical offset, in hex."""
        return f"{self.msg_id_prefix}{self.physical_offset:016X}"


@dataclass
class PutMessageResult:
    status: PutMessageStatus
    messages: list[AppendedMessage] = field(default_factory=list)
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status is PutMessageStatus.PUT_OK

    # The single-message view most callers want.
    @property
    def physical_offset(self) -> int:
        return self.messages[0].physical_offset

    @property
    def queue_offset(self) -> int:
        return self.messages[0].queue_offset

    @property
    def msg_id(self) -> str:
        return self.messages[0].msg_id


class SelectedRecord:
    """A zero-copy view of one stored record; valid until its GetMessageResult is released."""

    __slots__ = ("buffer", "physical_offset", "queue_offset", "size")

    def __init__(self, buffer: memoryview, physical_offset: int, queue_offset: int) -> None:
        self.buffer = buffer
        self.physical_offset = physical_offset
        self.queue_offset = queue_offset
        self.size = len(buffer)

    def decode(self) -> StoredMessage:
        """The record decoded; RecordCorrupt says where it is in the CommitLog (the codec
        only knows the view's position 0) and which queue offset pointed at it."""
        try:
            return codec.decode(self.buffer)
        except codec.RecordCorrupt as exc:
            raise codec.RecordCorrupt(self.physical_offset + exc.position, exc.reason,
                                      self.queue_offset) from None


@dataclass
class GetMessageResult:
    """Records found in one queue. Holds references on the segments its views point into:
    call ``release()`` (or use ``with``) when done with the buffers."""

    status: GetMessageStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    records: list[SelectedRecord] = field(default_factory=list)
    _held: list = field(default_factory=list, repr=False)

    @property
    def buffer_total_size(self) -> int:
        return sum(r.size for r in self.records)

    def messages(self) -> Iterator[StoredMessage]:
        """Decode each record (copies bodies out, so they outlive ``release``)."""
        for record in self.records:
            yield record.decode()

    def release(self) -> None:
        for record in self.records:
            record.buffer.release()
        held, self._held = self._held, []
        for mf in held:
            mf.release()

    def __enter__(self) -> GetMessageResult:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
