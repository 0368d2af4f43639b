"""Message lookups over remoting: ``VIEW_MESSAGE_BY_ID`` and ``QUERY_MESSAGE``.

After RocketMQ's ``QueryMessageProcessor``: ``VIEW_MESSAGE_BY_ID`` answers the record at a
CommitLog offset (the client takes it from an offset message id), ``QUERY_MESSAGE`` the
records of a topic carrying a key (a word of ``KEYS``, or the unique id) stored in a time
range, newest first, at most ``maxNum``; ``QUERY_NOT_FOUND`` when there are none. Bodies are
the CommitLog records as stored, read through the same read chain as pulls (local files, then
the tier), so a client decodes them as it decodes pulled messages.

Thread-safety: handlers on the event loop; reads through ``run``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stratamq.broker.lookup import Lookup
from stratamq.broker.ports import Call, MessageReader
from stratamq.message import StoredMessage
from stratamq.remoting.broker_send import _int
from stratamq.remoting.codec import RemotingCommand
from stratamq.remoting.codes import ResponseCode
from stratamq.remoting.errors import RemotingError, answer_in
from stratamq.remoting.transport import Connection

__all__ = ["LookupHandlers"]

Query = Callable[[str, str, int, int, int | None], list[StoredMessage]]


class LookupHandlers:
    def __init__(self, lookup: Lookup, reader: MessageReader,
                 look_up: Callable[[int], StoredMessage | None], query: Query,
                 call_of: Callable[[RemotingCommand, Connection], Call],
                 run: Callable[..., Any]) -> None:
        self.lookup = lookup
        self.reader = reader
        self.look_up = look_up
        self.query = query
        self.call_of = call_of
        self.run = run

    def _record(self, msg: StoredMessage) -> bytes | None:
        """The stored bytes of a decoded message (its queue unit names them)."""
        got = self.reader.get_messages("stratamq-lookup", msg.topic, msg.queue_id,
                                       msg.queue_offset, max_count=1)
        with got:
            for r in got.records:
                if r.queue_offset == msg.queue_offset:
                    return bytes(r.buffer)
        return None

    def record_at(self, offset: int) -> bytes | None:
        """The stored record starting at a CommitLog offset, None where none starts."""
        msg = self.look_up(offset)
        return self._record(msg) if msg is not None and msg.physical_offset == offset else None

    def _view(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        offset = _int(request.ext_fields, "offset")
        msg = self.look_up(offset)
        if msg is not None:
            self.lookup.authorize(self.call_of(request, conn), f"Topic:{msg.topic}", "Get")
        raw = self._record(msg) if msg is not None and msg.physical_offset == offset else None
        if raw is None:
            raise RemotingError(ResponseCode.SYSTEM_ERROR,
                                f"can not find message by the offset, {offset}")
        return request.response(ResponseCode.SUCCESS, body=raw)

    def _query(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        h = request.ext_fields
        topic, key = h.get("topic", ""), h.get("key", "")
        self.lookup.authorize(self.call_of(request, conn), f"Topic:{topic}", "Get")
        most = 1 if h.get("_UNIQUE_KEY_QUERY") == "true" else max(1, _int(h, "maxNum", 32))
        found = self.query(topic, key, most, _int(h, "beginTimestamp", 0),
                           _int(h, "endTimestamp", 2**63 - 1))
        records = [raw for raw in map(self._record, found) if raw is not None]
        if not records:
            raise RemotingError(ResponseCode.QUERY_NOT_FOUND,
                                "can not find message, maybe time range not correct")
        newest = max(m.store_timestamp for m in found)
        return request.response(ResponseCode.SUCCESS, None, {
            "indexLastUpdateTimestamp": str(newest),
            "indexLastUpdatePhyoffset": str(max(m.physical_offset for m in found))},
            b"".join(records))

    async def view_by_id(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        return await answer_in(self.run, self._view, request, conn)

    async def query_message(self, request: RemotingCommand, conn: Connection
                            ) -> RemotingCommand:
        return await answer_in(self.run, self._query, request, conn)
