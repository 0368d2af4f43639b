"""The admin service's message lookups (``/stratamq.admin.v1.Admin/<Method>``, JSON bodies,
same errors as ``broker/admin.py``): RocketMQ's ``QUERY_MESSAGE`` and ``VIEW_MESSAGE_BY_ID``,
which ``mqadmin queryMsgByKey`` / ``queryMsgById`` use, answered through the store's read chain,
so messages the local store no longer holds are found in the tier as well.

* ``QueryMessage {"topic", "key"? | "msg_id"? | "begin" and "end", "max"?}`` -> ``{"messages":
  [ROW]}``: by key (a word of KEYS, or the unique id) stored in [begin, end] (ms; default every
  time), newest first; by id (a unique client id or an offset message id) in the topic; or,
  with neither, the messages stored in [begin, end], each queue scanned from the offset its
  ConsumeQueue gives for ``begin`` (``get_offset_in_queue_by_time``) until a message stored
  after ``end``, oldest first. ``max`` (default 64) is capped at ``maxMsgsNumBatch`` (64), as
  RocketMQ caps a query.
* ``ViewMessage {"msg_id"}`` -> ``{"message": ROW}``; NOT_FOUND when no message has it.

ROW is what ``stratamq message consume`` prints (``client.messaging.message_row``) plus
``offset_msg_id`` (store host and CommitLog offset). ACL: a signed request (Cluster Get) and
SUB permission on the message's topic, the permission a consumer needs to read it; a topic
named in the request is checked before it is searched.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import grpc

from stratamq.broker.admin import _field, json_methods_handler
from stratamq.broker.convert import to_pb_message
from stratamq.broker.metadata import MetadataError
from stratamq.broker.ports import Call
from stratamq.client.admin import SERVICE
from stratamq.client.messaging import message_row
from stratamq.message import StoredMessage
from stratamq.store.results import GetMessageStatus

if TYPE_CHECKING:
    from stratamq.broker.server import Broker

__all__ = ["message_admin_handler"]

NO_END = 2**63 - 1
_SCAN_BATCH = 32  # messages read per step of a time-range scan


class MessageLookups:
    """The two lookups; any executor thread (the store's reads are thread-safe)."""

    def __init__(self, broker: Broker) -> None:
        self.b = broker

    def _row(self, msg: StoredMessage) -> dict[str, Any]:
        topic = self.b.meta.topic(msg.topic)
        row = message_row(to_pb_message(
            msg, message_type=topic.message_type if topic is not None else "NORMAL"))
        row["offset_msg_id"] = msg.msg_id
        return row

    def _topic_sub(self, call: Call, topic: str) -> None:
        self.b.lookup.authorize(call, f"Topic:{topic}", "Sub")

    def query(self, req: dict[str, Any], call: Call) -> dict[str, Any]:
        topic = _field(req, "topic", str)
        key, msg_id = _field(req, "key", str, False), _field(req, "msg_id", str, False)
        begin, end = _field(req, "begin", int, False), _field(req, "end", int, False)
        limit = _field(req, "max", int, False)
        if key is not None and msg_id is not None:
            raise MetadataError("invalid", "give key or msg_id, not both")
        if key is None and msg_id is None and (begin is None or end is None):
            raise MetadataError("invalid", "give key, msg_id, or begin and end")
        if limit is not None and limit < 1:
            raise MetadataError("invalid", "max must be at least 1")
        if begin is not None and end is not None and end < begin:
            raise MetadataError("invalid", f"end {end} is before begin {begin}")
        self._topic_sub(call, topic)
        cfg = self.b.meta.topic(topic)
        store = self.b.store
        if cfg is None and topic not in store.topics():
            raise MetadataError("not_found", f"topic {topic!r} does not exist")
        cap = min(limit or 64, self.b.store_config.max_msgs_num_batch)
        if msg_id is not None:
            found = store.look_message_by_msg_id(msg_id, topic)
            messages = [found] if found is not None and found.topic == topic else []
        elif key is not None:
            messages = store.query_messages(topic, key, cap, begin or 0, end)
        else:
            assert begin is not None and end is not None
            queues = (range(cfg.queue_count) if cfg is not None
                      else store.topics().get(topic, []))
            messages = self._scan(topic, queues, begin, end, cap)
        return {"messages": [self._row(m) for m in messages]}

    def _scan(self, topic: str, queues: Any, begin: int, end: int,
              cap: int) -> list[StoredMessage]:
        """Messages of ``topic`` stored in [begin, end], oldest first, at most ``cap``: each
        queue read from its offset for ``begin`` to the first message stored after ``end``
        (or ``cap`` messages), then merged by store time."""
        store = self.b.store
        found: list[StoredMessage] = []
        for queue_id in queues:
            offset = store.get_offset_in_queue_by_time(topic, queue_id, begin)
            taken = 0
            while taken < cap:
                with store.get_messages("stratamq-admin", topic, queue_id, offset,
                                        max_count=_SCAN_BATCH) as got:
                    if got.status is not GetMessageStatus.FOUND:
                        break
                    batch = list(got.messages())
                    next_offset = got.next_begin_offset
                past_end = False
                for msg in batch:
                    if msg.store_timestamp > end:
                        past_end = True
                        break
                    if msg.store_timestamp >= begin:
                        found.append(msg)
                        taken += 1
                        if taken >= cap:
                            break
                if past_end or next_offset <= offset:
                    break
                offset = next_offset
        found.sort(key=lambda m: (m.store_timestamp, m.physical_offset))
        return found[:cap]

    def view(self, req: dict[str, Any], call: Call) -> dict[str, Any]:
        msg_id = _field(req, "msg_id", str)
        found = self.b.store.look_message_by_msg_id(msg_id)
        if found is None:
            raise MetadataError("not_found", f"no message with id {msg_id.strip()!r}")
        self._topic_sub(call, found.topic)
        return {"message": self._row(found)}


def message_admin_handler(broker: Broker) -> grpc.GenericRpcHandler:
    lookups = MessageLookups(broker)
    return json_methods_handler(
        broker, SERVICE, {"QueryMessage": (lookups.query, "Get"),
                          "ViewMessage": (lookups.view, "Get")},
        broker.run, with_call=frozenset({"QueryMessage", "ViewMessage"}))
