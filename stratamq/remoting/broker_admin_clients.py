"""Admin codes about a broker's clients, the ones RocketMQ Dashboard and ``mqadmin`` send
through ``MQAdminExt``, after RocketMQ's ``AdminBrokerProcessor`` and ``Broker2Client``:

* ``GET_PRODUCER_CONNECTION_LIST`` (204, ``producerConnection``): a producer group's
  connections (``ProducerConnection``); a group with none: ``SYSTEM_ERROR``.
* ``QUERY_TOPIC_CONSUME_BY_WHO`` (300): the groups consuming a topic, online (subscribed) or
  with consumer offsets in it (``GroupList``); ``QUERY_TOPICS_BY_CONSUMER`` (343): the topics
  a group has offsets in (``TopicList`` with the broker's address).
* ``GET_CONSUMER_RUNNING_INFO`` (307) and ``CONSUME_MESSAGE_DIRECTLY`` (309): passed on to the
  consumer's own connection (the message read at its offset id), its answer returned as it
  is; a consumer not online: ``SYSTEM_ERROR``, no answer in 10 s: ``CONSUME_MSG_TIMEOUT``.
* ``INVOKE_BROKER_TO_RESET_OFFSET`` (222, the Dashboard's and ``mqadmin resetOffsetByTime``):
  per write queue the offset of the first message stored at ``timestamp`` (-1: the queue's
  end), only backwards unless ``isForce``; a group with no offset in a queue: ``SYSTEM_ERROR``;
  no consumer online: ``CONSUMER_NOT_ONLINE`` (the Dashboard then sets offsets one by one).
  Otherwise the offsets are committed here (as RocketMQ 5's server-side reset does, the same
  reset the gRPC admin's ``ResetOffset`` makes) and each consumer is told with a oneway
  ``RESET_CONSUMER_CLIENT_OFFSET`` (``ResetOffsetBody``), as 4.x brokers tell them.

Thread-safety: handlers on the event loop; store and metadata calls through ``run``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from stratamq import record
from stratamq.broker.errors import BrokerError
from stratamq.broker.lookup import Lookup
from stratamq.broker.polling import LongPolls
from stratamq.broker.pop_state import PopState
from stratamq.broker.ports import Call, MessageReader
from stratamq.broker.pulling import consumer_offset, reset_offsets
from stratamq.remoting.broker_admin import fastjson_queue_map
from stratamq.remoting.broker_send import _int
from stratamq.remoting.clients import ConsumerTable
from stratamq.remoting.codec import FLAG_ONEWAY, RemotingCommand
from stratamq.remoting.codes import ResponseCode
from stratamq.remoting.errors import RemotingError, answer_in, error_response
from stratamq.remoting.namesrv import to_json
from stratamq.remoting.transport import Connection, RemotingTimeout

log = logging.getLogger(__name__)

__all__ = ["ClientAdminHandlers"]

GET_PRODUCER_CONNECTION_LIST, RESET_CONSUMER_CLIENT_OFFSET = 204, 220
INVOKE_BROKER_TO_RESET_OFFSET, QUERY_TOPIC_CONSUME_BY_WHO = 222, 300
GET_CONSUMER_RUNNING_INFO, CONSUME_MESSAGE_DIRECTLY, QUERY_TOPICS_BY_CONSUMER = 307, 309, 343
CONSUME_MSG_TIMEOUT = 207  # ResponseCode
CALL_CLIENT_TIMEOUT_S = 10.0  # Broker2Client.callClient


class ClientAdminHandlers:
    def __init__(self, lookup: Lookup, reader: MessageReader, state: PopState, polls: LongPolls,
                 consumers: ConsumerTable, producers: ConsumerTable, broker_name: str,
                 broker_addr: Callable[[], str],
                 record_at: Callable[[int], bytes | None],
                 call_of: Callable[[RemotingCommand, Connection], Call],
                 run: Callable[..., Any],
                 refusal: Callable[[str], str | None] = lambda method: None) -> None:
        # record_at: the stored record at a CommitLog offset (CONSUME_MESSAGE_DIRECTLY);
        # refusal: why an offset reset may not run here (a slave), as the gRPC admin asks.
        self.lookup, self.reader, self.state, self.polls = lookup, reader, state, polls
        self.consumers, self.producers = consumers, producers
        self.broker_name, self.broker_addr = broker_name, broker_addr
        self.record_at = record_at
        self.call_of, self.run, self.refusal = call_of, run, refusal

    def handlers(self) -> dict[int, Any]:
        def in_executor(fn: Callable[[RemotingCommand, Connection], RemotingCommand]) -> Any:
            async def handler(request: RemotingCommand, conn: Connection) -> RemotingCommand:
                return await answer_in(self.run, fn, request, conn)
            return handler

        return {GET_PRODUCER_CONNECTION_LIST: in_executor(self._producer_connections),
                QUERY_TOPIC_CONSUME_BY_WHO: in_executor(self._consumed_by),
                QUERY_TOPICS_BY_CONSUMER: in_executor(self._topics_of_group),
                GET_CONSUMER_RUNNING_INFO: self._running_info,
                CONSUME_MESSAGE_DIRECTLY: self._consume_directly,
                INVOKE_BROKER_TO_RESET_OFFSET: self._reset_offset}

    # -- listings -------------------------------------------------------------------------------

    def _producer_connections(self, request: RemotingCommand, conn: Connection
                              ) -> RemotingCommand:
        group = request.ext_fields.get("producerGroup", "")
        self.lookup.authorize(self.call_of(request, conn), f"Group:{group}", "Get")
        clients = self.producers.describe(group)
        if not clients:
            raise RemotingError(ResponseCode.SYSTEM_ERROR,
                                f"the producer group[{group}] not exist")
        return request.response(ResponseCode.SUCCESS, body=to_json({"connectionSet": [
            {"clientAddr": info.get("clientAddr", ""), "clientId": cid,
             "language": info.get("language", "JAVA"), "version": info.get("version", 0)}
            for cid, info in clients]}))

    def _consumed_by(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        topic = request.ext_fields.get("topic", "")
        self.lookup.authorize(self.call_of(request, conn), f"Topic:{topic}", "Get")
        groups = self.consumers.groups_subscribed_to(topic) | {
            g for g, t in self.state.groups_of() if t == topic}
        return request.response(ResponseCode.SUCCESS,
                                body=to_json({"groupList": sorted(groups)}))

    def _topics_of_group(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        group = request.ext_fields.get("group", "")
        self.lookup.authorize(self.call_of(request, conn), f"Group:{group}", "Get")
        topics = sorted(t for g, t in self.state.groups_of() if g == group)
        return request.response(ResponseCode.SUCCESS, body=to_json(
            {"brokerAddr": self.broker_addr(), "topicList": topics}))

    # -- calls passed on to a consumer ----------------------------------------------------------

    async def _call_consumer(self, request: RemotingCommand, conn: Connection,
                             body: bytes) -> RemotingCommand:
        h = request.ext_fields
        group, client_id = h.get("consumerGroup", ""), h.get("clientId", "")
        found = self.consumers.find(group, client_id)
        if found is None:
            return request.response(ResponseCode.SYSTEM_ERROR,
                                    f"The Consumer <{group}> <{client_id}> not online")
        consumer: Connection = found[0]
        try:
            return await consumer.invoke(RemotingCommand(request.code, ext_fields=dict(h),
                                                         body=body), CALL_CLIENT_TIMEOUT_S)
        except RemotingTimeout as exc:
            return request.response(CONSUME_MSG_TIMEOUT,
                                    f"consumer <{group}> <{client_id}> Timeout: {exc}")
        except (ConnectionError, OSError) as exc:
            return request.response(ResponseCode.SYSTEM_ERROR,
                                    f"invoke consumer <{group}> <{client_id}> Exception: {exc}")

    async def _running_info(self, request: RemotingCommand, conn: Connection
                            ) -> RemotingCommand:
        group = request.ext_fields.get("consumerGroup", "")
        try:
            self.lookup.authorize(self.call_of(request, conn), f"Group:{group}", "Get")
        except BrokerError as exc:
            return error_response(request, exc)
        return await self._call_consumer(request, conn, request.body)

    async def _consume_directly(self, request: RemotingCommand, conn: Connection
                                ) -> RemotingCommand:
        h = request.ext_fields
        try:
            self.lookup.authorize(self.call_of(request, conn),
                                  f"Group:{h.get('consumerGroup', '')}", "Get")
            _host, offset = record.parse_offset_msg_id(h.get("msgId", ""))
        except BrokerError as exc:
            return error_response(request, exc)
        except ValueError as exc:
            return request.response(ResponseCode.SYSTEM_ERROR, f"bad msgId: {exc}")
        raw = await self.run(self.record_at, offset)
        if raw is None:
            return request.response(ResponseCode.SYSTEM_ERROR,
                                    f"can not find message by the offset, {offset}")
        request.ext_fields["brokerName"] = self.broker_name
        return await self._call_consumer(request, conn, raw)

    # -- offsets --------------------------------------------------------------------------------

    def _reset_table(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        h = request.ext_fields
        topic, group = h.get("topic", ""), h.get("group", "")
        self.lookup.authorize(self.call_of(request, conn), "Cluster", "Update")
        refused = self.refusal("ResetOffset")
        if refused is not None:
            raise RemotingError(ResponseCode.SYSTEM_ERROR, refused)
        config = self.lookup.meta.topic(topic)
        if config is None:
            raise RemotingError(ResponseCode.TOPIC_NOT_EXIST, "[reset-offset] reset offset "
                                f"failed, no topic in this broker. topic={topic}")
        timestamp, force = _int(h, "timestamp"), h.get("isForce") == "true"
        table: dict[int, int] = {}
        for q in range(config.write_queue_nums):
            current = consumer_offset(self.state, group, topic, q)
            if current is None:
                raise RemotingError(ResponseCode.SYSTEM_ERROR,
                                    f"THe consumer group <{group}> not exist")
            at = (self.reader.get_max_offset_in_queue(topic, q) if timestamp == -1
                  else max(0, self.reader.get_offset_in_queue_by_time(topic, q, timestamp)))
            table[q] = at if force or at < current else current
        if not self.consumers.connections(group):
            raise RemotingError(
                ResponseCode.CONSUMER_NOT_ONLINE, "Consumer not online, so can not reset "
                f"offset, Group: {group} Topic: {topic} Timestamp: {timestamp}")
        dropped = reset_offsets(self.state, self.polls, group, topic, table)
        log.info("remoting: offsets of %s in %s reset to %s (%d in flight dropped)", group,
                 topic, table, dropped)
        body = ('{"offsetTable":' + fastjson_queue_map(
            [(topic, self.broker_name, q, o) for q, o in table.items()]) + "}").encode()
        return request.response(ResponseCode.SUCCESS, body=body)

    async def _reset_offset(self, request: RemotingCommand, conn: Connection
                            ) -> RemotingCommand:
        response = await answer_in(self.run, self._reset_table, request, conn)
        if response.code == ResponseCode.SUCCESS:
            h = request.ext_fields
            notice = RemotingCommand(RESET_CONSUMER_CLIENT_OFFSET, flag=FLAG_ONEWAY, ext_fields={
                "topic": h.get("topic", ""), "group": h.get("group", ""),
                "timestamp": h.get("timestamp", "0"), "isForce": "false"}, body=response.body)
            for consumer in self.consumers.connections(h.get("group", "")):
                consumer.send(notice)
        return response
