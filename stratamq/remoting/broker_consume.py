"""Broker consumption over remoting: pulls, consumer offsets, heartbeats, queue offsets.

After RocketMQ's ``PullMessageProcessor``, ``ConsumerManageProcessor``,
``ClientManageProcessor`` and ``AdminBrokerProcessor`` (offset lookups):

* ``PULL_MESSAGE``: one store read; the body is the found CommitLog records back to back
  (RocketMQ's transfer format, which clients decode with ``MessageDecoder``), tag-filtered at
  the broker by the pull's subscription (or the one the heartbeat registered). At the end of a
  queue with the suspend flag it waits for the topic's next dispatch (``LongPolls``, the same
  waiters as gRPC's pulls) up to ``suspendTimeoutMillis`` (at most
  ``grpcClientConsumerMaxLongPollingTimeoutMillis``). A commit-offset flag stores
  ``commitOffset`` first, as RocketMQ does.
* Consumer offsets live in the same ``PopState`` table gRPC's ``UpdateOffset`` /
  ``GetOffset`` use, so a group's offsets are the same whichever protocol commits them.
* ``HEART_BEAT`` records the client's consumer groups and subscriptions (``ConsumerTable``)
  and creates each group's ``%RETRY%<group>`` topic (1 queue) as RocketMQ does.

Thread-safety: handlers on the broker's event loop; store calls go through ``run``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from stratamq.broker.errors import BrokerError
from stratamq.broker.lookup import Lookup
from stratamq.broker.metadata import retry_topic
from stratamq.broker.polling import LongPolls
from stratamq.broker.pop_state import PopState
from stratamq.broker.ports import Call, MessageReader
from stratamq.broker.pulling import consumer_offset
from stratamq.remoting.broker_send import _int
from stratamq.remoting.clients import ConsumerTable
from stratamq.remoting.codec import FLAG_ONEWAY, RemotingCommand
from stratamq.remoting.codes import RequestCode, ResponseCode
from stratamq.remoting.errors import RemotingError, answer_in, error_response
from stratamq.remoting.namesrv import to_json
from stratamq.remoting.transport import Connection
from stratamq.store.filter import TagFilter
from stratamq.store.results import GetMessageStatus as St

__all__ = ["ConsumeHandlers"]

FLAG_COMMIT_OFFSET, FLAG_SUSPEND, FLAG_SUBSCRIPTION = 1, 2, 4  # PullSysFlag
_MAX_PULL = 1024


def _pull_code(status: St, offset: int) -> int:
    """PullMessageProcessor's status to response code (a master's answers)."""
    if status is St.FOUND:
        return ResponseCode.SUCCESS
    if status in (St.MESSAGE_WAS_REMOVING, St.NO_MATCHED_MESSAGE):
        return ResponseCode.PULL_RETRY_IMMEDIATELY
    if status in (St.NO_MATCHED_LOGIC_QUEUE, St.NO_MESSAGE_IN_QUEUE):
        return ResponseCode.PULL_OFFSET_MOVED if offset != 0 else ResponseCode.PULL_NOT_FOUND
    if status in (St.OFFSET_FOUND_NULL, St.OFFSET_OVERFLOW_ONE):
        return ResponseCode.PULL_NOT_FOUND
    return ResponseCode.PULL_OFFSET_MOVED  # OFFSET_OVERFLOW_BADLY, OFFSET_TOO_SMALL


class ConsumeHandlers:
    """The consuming codes, over the lookups, a queue reader, the offsets, the long polls and
    the remoting consumers' table."""

    def __init__(self, lookup: Lookup, reader: MessageReader, state: PopState,
                 polls: LongPolls, consumers: ConsumerTable,
                 call_of: Callable[[RemotingCommand, Connection], Call],
                 run: Callable[..., Any], producers: ConsumerTable | None = None,
                 on_pulled: Callable[[str, str, int, int], None] | None = None) -> None:
        self.on_pulled = on_pulled  # the metrics' receive count (group, topic, count, bytes)
        self.lookup = lookup
        self.reader = reader
        self.state = state
        self.polls = polls
        self.consumers = consumers
        self.producers = producers if producers is not None else ConsumerTable()
        self.call_of = call_of
        self.run = run

    async def _guard(self, request: RemotingCommand, fn: Callable[..., RemotingCommand],
                     *args: Any) -> RemotingCommand:
        return await answer_in(self.run, fn, request, *args)

    # -- pulls ----------------------------------------------------------------------------------

    def _read(self, request: RemotingCommand, conn: Connection, offset: int
              ) -> tuple[RemotingCommand, str, int]:
        """One read: the response, the topic, and its wake-up sequence before the read."""
        h = request.ext_fields
        group, name = h.get("consumerGroup", ""), h.get("topic", "")
        call = self.call_of(request, conn)
        self.lookup.authorize(call, f"Group:{group}", "Sub")
        self.lookup.authorize(call, f"Topic:{name}", "Sub")
        topic = self.lookup.topic(name)
        if not topic.perm & 4:
            raise RemotingError(ResponseCode.NO_PERMISSION,
                                f"the topic[{name}] pulling message is forbidden")
        qid = _int(h, "queueId")
        if not 0 <= qid < topic.read_queue_nums:
            raise RemotingError(ResponseCode.SYSTEM_ERROR,
                                f"queueId[{qid}] is illegal, topic:[{name}] topicConfig."
                                f"readQueueNums:[{topic.read_queue_nums}]")
        sys_flag = _int(h, "sysFlag", 0)
        expression = (h.get("subscription") if sys_flag & FLAG_SUBSCRIPTION
                      else self.consumers.subscription(group, name)) or "*"
        try:
            filt = TagFilter(expression)
        except ValueError as exc:
            raise RemotingError(ResponseCode.SUBSCRIPTION_PARSE_FAILED, str(exc)) from None
        commit = _int(h, "commitOffset", -1)
        if sys_flag & FLAG_COMMIT_OFFSET and commit >= 0:
            self.lookup.group(group, call)
            self.state.set_offset(group, name, qid, commit)
        seen = self.polls.seq(name)
        most = max(1, min(_int(h, "maxMsgNums", 32), _MAX_PULL))
        got = self.reader.get_messages(group, name, qid, offset, max_count=most,
                                       tag_filter=filt)
        with got:
            code = _pull_code(got.status, offset)
            body = b"".join(bytes(r.buffer) for r in got.records) if code == 0 else b""
            if code == 0 and self.on_pulled is not None:
                self.on_pulled(group, name, len(got.records), len(body))
            header = {"nextBeginOffset": str(got.next_begin_offset),
                      "minOffset": str(got.min_offset), "maxOffset": str(got.max_offset),
                      "suggestWhichBrokerId": "0"}
        return request.response(code, None if code == 0 else got.status.value, header,
                                body), name, seen

    async def pull(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        h = request.ext_fields
        try:
            offset = _int(h, "queueOffset")
            response, topic, seen = await self.run(self._read, request, conn, offset)
            suspend = _int(h, "sysFlag", 0) & FLAG_SUSPEND
            wait_ms = min(_int(h, "suspendTimeoutMillis", 0),
                          self.lookup.config.max_long_polling_time_mills)
        except (BrokerError, RemotingError) as exc:
            return error_response(request, exc)
        if response.code != ResponseCode.PULL_NOT_FOUND or not suspend or wait_ms <= 0:
            return response
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_ms / 1000
        polls = self.polls
        try:
            waiter = polls.register(topic, None, conn.address)
        except BrokerError as exc:  # polling full (maxPopPollingSize): SYSTEM_BUSY
            return error_response(request, exc)
        try:
            while response.code == ResponseCode.PULL_NOT_FOUND and not polls.closing:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                await polls.wait(waiter, seen, remaining)
                try:
                    response, _, seen = await self.run(self._read, request, conn, offset)
                except (BrokerError, RemotingError) as exc:
                    return error_response(request, exc)
        finally:
            polls.unregister(waiter)
        return response

    # -- consumer offsets -----------------------------------------------------------------------

    def _query_offset(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        h = request.ext_fields
        group, name, qid = h.get("consumerGroup", ""), h.get("topic", ""), _int(h, "queueId")
        self.lookup.authorize(self.call_of(request, conn), f"Group:{group}", "Get")
        topic = self.lookup.topic(name)
        Lookup.queue_id(topic, qid)
        offset = consumer_offset(self.state, group, name, qid)
        if offset is None and self.reader.get_min_offset_in_queue(name, qid) <= 0:
            offset = 0  # a new group on a queue that still has its first message: from 0
        if offset is None:
            return request.response(ResponseCode.QUERY_NOT_FOUND,
                                    "Not found, V3_0_6_SNAPSHOT maybe this group consumer "
                                    "boot first")
        return request.response(ResponseCode.SUCCESS, None, {"offset": str(offset)})

    async def query_offset(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        return await self._guard(request, self._query_offset, conn)

    def _update_offset(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        h = request.ext_fields
        group, name, qid = h.get("consumerGroup", ""), h.get("topic", ""), _int(h, "queueId")
        offset = _int(h, "commitOffset")
        call = self.call_of(request, conn)
        self.lookup.authorize(call, f"Group:{group}", "Sub")
        self.lookup.group(group, call)
        topic = self.lookup.topic(name)
        Lookup.queue_id(topic, qid)
        if offset < 0:
            raise RemotingError(ResponseCode.SYSTEM_ERROR, f"commitOffset {offset} < 0")
        self.state.set_offset(group, name, qid, offset)
        return request.response(ResponseCode.SUCCESS)

    async def update_offset(self, request: RemotingCommand, conn: Connection
                            ) -> RemotingCommand:
        return await self._guard(request, self._update_offset, conn)

    # -- queue offsets --------------------------------------------------------------------------

    def _queue_offset(self, request: RemotingCommand, conn: Connection,
                      which: str) -> RemotingCommand:
        h = request.ext_fields
        name, qid = h.get("topic", ""), _int(h, "queueId")
        self.lookup.authorize(self.call_of(request, conn), f"Topic:{name}", "Get")
        Lookup.queue_id(self.lookup.topic(name), qid)
        if which == "earliest":  # GetEarliestMsgStoretimeResponseHeader.timestamp
            low = self.reader.get_min_offset_in_queue(name, qid)
            got = self.reader.get_messages("stratamq-lookup", name, qid, low, max_count=1)
            with got:
                stamps = [m.store_timestamp for m in got.messages()]
            if not stamps:
                raise RemotingError(ResponseCode.SYSTEM_ERROR,
                                    f"no message in {name}/{qid} to take a store time from")
            return request.response(ResponseCode.SUCCESS, None, {"timestamp": str(stamps[0])})
        if which == "max":
            offset = self.reader.get_max_offset_in_queue(name, qid)
        elif which == "min":
            offset = self.reader.get_min_offset_in_queue(name, qid)
        else:
            offset = self.reader.get_offset_in_queue_by_time(name, qid, _int(h, "timestamp"))
        return request.response(ResponseCode.SUCCESS, None, {"offset": str(offset)})

    async def max_offset(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        return await self._guard(request, self._queue_offset, conn, "max")

    async def min_offset(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        return await self._guard(request, self._queue_offset, conn, "min")

    async def search_offset(self, request: RemotingCommand, conn: Connection
                            ) -> RemotingCommand:
        return await self._guard(request, self._queue_offset, conn, "time")

    async def earliest_store_time(self, request: RemotingCommand, conn: Connection
                                  ) -> RemotingCommand:
        return await self._guard(request, self._queue_offset, conn, "earliest")

    # -- clients --------------------------------------------------------------------------------

    def _heartbeat(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        try:
            data = json.loads(request.body or b"{}")
            client_id = str(data.get("clientID", ""))
            consumers = list(data.get("consumerDataSet") or [])
            producers = [str(p.get("groupName", "")) for p in data.get("producerDataSet") or []]
        except (ValueError, AttributeError, TypeError) as exc:
            raise RemotingError(ResponseCode.SYSTEM_ERROR,
                                f"the heartbeat is not HeartbeatData JSON: {exc}") from None
        call = self.call_of(request, conn)
        for consumer in consumers:
            group = str(consumer.get("groupName", ""))
            self.lookup.group(group, call)
            subs = {str(s.get("topic")): str(s.get("subString") or "*")
                    for s in consumer.get("subscriptionDataSet") or []}
            retry = retry_topic(group)
            if self.lookup.meta.topic(retry) is None:
                # (the NameServer registration hears of it through the metadata's listener)
                self.lookup.meta.create_topic(retry, 1, exist_ok=True)
            info = {"clientAddr": conn.address, "language": request.language,
                    "version": request.version,
                    **{k: consumer.get(k) for k in ("consumeType", "messageModel",
                                                    "consumeFromWhere")},
                    "subscriptionDataSet": list(consumer.get("subscriptionDataSet") or [])}
            if self.consumers.register(group, client_id, conn, subs, info):
                self.notify_changed(group)
        for group in producers:  # (transaction checks go to them: broker_transactions.py)
            if group:
                self.producers.register(group, client_id, conn, {},
                                        {"clientAddr": conn.address,
                                         "language": request.language,
                                         "version": request.version})
        return request.response(ResponseCode.SUCCESS)

    async def heartbeat(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        return await self._guard(request, self._heartbeat, conn)

    def notify_changed(self, group: str) -> None:
        """NOTIFY_CONSUMER_IDS_CHANGED (oneway) to the group's consumers: they rebalance."""
        for conn in self.consumers.connections(group):
            conn.send(RemotingCommand(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, flag=FLAG_ONEWAY,
                                      ext_fields={"consumerGroup": group}))

    async def unregister_client(self, request: RemotingCommand, conn: Connection
                                ) -> RemotingCommand:
        h = request.ext_fields
        group = h.get("consumerGroup", "")
        if group and self.consumers.unregister(group, h.get("clientID", "")):
            self.notify_changed(group)
        if h.get("producerGroup"):
            self.producers.unregister(h["producerGroup"], h.get("clientID", ""))
        return request.response(ResponseCode.SUCCESS)

    async def consumer_list(self, request: RemotingCommand, conn: Connection
                            ) -> RemotingCommand:
        group = request.ext_fields.get("consumerGroup", "")
        ids = self.consumers.client_ids(group)
        if not ids:
            return request.response(ResponseCode.SYSTEM_ERROR,
                                    f"no consumer for this group, {group}")
        return request.response(ResponseCode.SUCCESS, body=to_json({"consumerIdList": ids}))

    def connection_closed(self, conn: Connection) -> None:
        self.producers.drop_connection(conn)
        for group in self.consumers.drop_connection(conn):
            self.notify_changed(group)
