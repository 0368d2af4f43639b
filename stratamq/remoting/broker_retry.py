"""``CONSUMER_SEND_MSG_BACK``: a push consumer hands back a message it failed to consume.

After RocketMQ's ``AbstractSendMessageProcessor.consumerSendMsgBack``: the message is looked
up by its CommitLog offset and stored again in ``%RETRY%<group>`` (created with one queue),
with ``reconsumeTimes`` + 1, ``RETRY_TOPIC`` (its first topic) and ``ORIGIN_MESSAGE_ID``, to be
delivered after delay level ``delayLevel`` (0: the broker's choice, 3 + reconsume times, as
RocketMQ) through the timer. Once its reconsume times reach ``maxReconsumeTimes`` (the client's,
as RocketMQ takes it from clients since 3.4.9; else the group's ``retryMaxTimes``), or when the
client asks with a negative level, it goes to ``%DLQ%<group>`` instead, with an ERROR log line:
a dead letter is a visible outcome.

Thread-safety: the handler on the event loop; the store lookup through ``run``.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from typing import Any

from stratamq.broker.errors import BrokerError
from stratamq.broker.lookup import Lookup
from stratamq.broker.metadata import dlq_topic, retry_topic
from stratamq.broker.ports import Call
from stratamq.message import Message, Prop, StoredMessage
from stratamq.remoting.broker_send import SendHandlers, _int
from stratamq.remoting.codec import RemotingCommand
from stratamq.remoting.codes import ResponseCode
from stratamq.remoting.errors import RemotingError, error_response
from stratamq.remoting.transport import Connection
from stratamq.store.results import PutMessageStatus

log = logging.getLogger(__name__)

__all__ = ["SendBackHandler"]

RETRY_TOPIC, ORIGIN_MESSAGE_ID = "RETRY_TOPIC", "ORIGIN_MESSAGE_ID"  # MessageConst


class SendBackHandler:
    """Over the lookups, a CommitLog lookup by offset, and the send path (writer, timer)."""

    def __init__(self, lookup: Lookup, look_up: Callable[[int], StoredMessage | None],
                 sending: SendHandlers, call_of: Callable[[RemotingCommand, Connection], Call],
                 run: Callable[..., Any],
                 on_dlq: Callable[[str, str], None] | None = None) -> None:
        self.lookup = lookup
        self.on_dlq = on_dlq  # the metrics' dead-letter count (group, original topic)
        self.look_up = look_up
        self.sending = sending
        self.call_of = call_of
        self.run = run

    def _prepare(self, request: RemotingCommand, conn: Connection) -> tuple[Message, bool]:
        h = request.ext_fields
        group_name = h.get("group", "")
        call = self.call_of(request, conn)
        self.lookup.authorize(call, f"Group:{group_name}", "Sub")
        meta = self.lookup.meta
        group = meta.group(group_name)
        if group is None:
            raise RemotingError(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                                f"subscription group not exist, {group_name}")
        offset = _int(h, "offset")
        found = self.look_up(offset)
        if found is None:
            raise RemotingError(ResponseCode.SYSTEM_ERROR,
                                f"look message by offset failed, {offset}")
        props = dict(found.properties)
        props.setdefault(RETRY_TOPIC, found.topic)
        props.pop(Prop.WAIT_STORE_MSG_OK, None)
        props[ORIGIN_MESSAGE_ID] = h.get("originMsgId") or props.get(
            ORIGIN_MESSAGE_ID) or found.msg_id
        max_times = _int(h, "maxReconsumeTimes", group.retry_max_times)
        level = _int(h, "delayLevel", 0)
        dead = found.reconsume_times >= max_times or level < 0
        if dead:
            name = dlq_topic(group_name)
            meta.create_topic(name, 1, exist_ok=True)
            props.pop(Prop.DELAY_LEVEL, None)
        else:
            name = retry_topic(group_name)
            meta.create_topic(name, 1, exist_ok=True)
            props[Prop.DELAY_LEVEL] = str(level or 3 + found.reconsume_times)
        topic = self.lookup.topic(name)
        msg = Message(name, found.body, random.randrange(topic.write_queue_nums), props,
                      found.flag, found.sys_flag, found.born_timestamp, found.born_host,
                      found.reconsume_times + 1)
        return (msg if dead else self.sending.delayed(msg)), dead

    async def send_back(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        try:
            msg, dead = await self.run(self._prepare, request, conn)
        except (BrokerError, RemotingError) as exc:
            return error_response(request, exc)
        (result,) = await self.sending.writer.put_async([msg])
        if result.status is not PutMessageStatus.PUT_OK:
            return request.response(ResponseCode.SYSTEM_ERROR,
                                    f"{result.status.value} {result.error}".strip())
        if dead:
            log.error("message %s of group %s moved to %s after %d consume attempts",
                      msg.properties.get(ORIGIN_MESSAGE_ID), request.ext_fields.get("group"),
                      msg.topic, msg.reconsume_times)
            if self.on_dlq is not None:
                self.on_dlq(request.ext_fields.get("group", ""),
                            msg.properties.get(RETRY_TOPIC, ""))
        return request.response(ResponseCode.SUCCESS)
