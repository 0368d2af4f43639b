"""Admin codes over remoting, the ones ``mqadmin`` and RocketMQ Dashboard use most, after
RocketMQ's ``AdminBrokerProcessor``:

* ``UPDATE_AND_CREATE_TOPIC`` (17, ``mqadmin updateTopic``): create, or change the queue
  counts and perm of, a topic; ``GET_ALL_TOPIC_CONFIG`` (21): the topic table.
* ``UPDATE_AND_CREATE_SUBSCRIPTIONGROUP`` (200, ``updateSubGroup``) and
  ``GET_ALL_SUBSCRIPTIONGROUP_CONFIG`` (201).
* ``GET_BROKER_RUNTIME_INFO`` (28, ``brokerStatus``/``clusterList``): a ``KVTable``
  (``remoting/runtime_info.py``: ``putTps``, ``getTransferredTps``, ``msgPutTotal*``, ...).
* ``GET_TOPIC_STATS_INFO`` (202, ``topicStatus``), ``GET_CONSUME_STATS`` (208,
  ``consumerProgress``), ``GET_CONSUMER_CONNECTION_LIST`` (203).
* ``GET_TOPIC_CONFIG`` (351) and ``GET_SUBSCRIPTIONGROUP_CONFIG`` (352): one topic's or
  group's config (the Dashboard's topic and group pages); ``DELETE_SUBSCRIPTIONGROUP`` (207,
  ``mqadmin deleteSubGroup``): the group goes, its consumer offsets too with ``cleanOffset``;
  ``GET_BROKER_CONFIG`` (26, ``mqadmin getBrokerConfig``): every setting as ``key=value``
  lines, the data version in the ``version`` header field.
* ``VIEW_BROKER_STATS_DATA`` (315, the Dashboard's charts): one item of the broker's stats
  windows (``broker/stats_window.py``) as ``BrokerStatsData`` (``statsMinute``, ``statsHour``,
  ``statsDay``: ``sum``, ``tps``, ``avgpt``); an item never counted answers SYSTEM_ERROR
  ``The stats <name> <key> not exist``, as RocketMQ's.
* ``DELETE_TOPIC_IN_BROKER`` (215, ``mqadmin deleteTopic``): the gRPC admin's ``DeleteTopic``
  (metadata, consumer state and messages); a blank or system topic is refused with
  RocketMQ's remarks, a topic the broker does not have answers SUCCESS (as RocketMQ's does),
  a slave refuses (its topics are its master's).

Maps keyed by a ``MessageQueue`` are written as fastjson writes them, with the queue object as
the key (``{{"brokerName":..,"queueId":0,"topic":..}:{...}}``): not standard JSON, but what
RocketMQ's clients and tools parse. Every change needs an admin account with ACL on (the
``Create``/``Update`` actions, as the gRPC admin service).

Thread-safety: handlers on the event loop; store and metadata calls through ``run``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

from stratamq import __version__
from stratamq.broker.lookup import Lookup
from stratamq.broker.metadata import MetadataError, is_system_topic
from stratamq.broker.pop_state import PopState
from stratamq.broker.ports import Call, MessageReader
from stratamq.broker.pulling import consumer_offset
from stratamq.broker.stats_window import BrokerStatsWindow
from stratamq.message import StoredMessage
from stratamq.remoting.broker_send import _int
from stratamq.remoting.clients import ConsumerTable
from stratamq.remoting.codec import RemotingCommand
from stratamq.remoting.codes import ResponseCode
from stratamq.remoting.errors import RemotingError, answer_in
from stratamq.remoting.namesrv import to_json
from stratamq.remoting.runtime_info import runtime_table
from stratamq.remoting.transport import Connection

__all__ = ["AdminHandlers", "fastjson_queue_map"]

log = logging.getLogger(__name__)

UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, GET_ALL_SUBSCRIPTIONGROUP_CONFIG = 200, 201
GET_TOPIC_STATS_INFO, GET_CONSUMER_CONNECTION_LIST, GET_CONSUME_STATS = 202, 203, 208
DELETE_TOPIC_IN_BROKER, DELETE_SUBSCRIPTIONGROUP, GET_BROKER_CONFIG = 215, 207, 26
GET_TOPIC_CONFIG, GET_SUBSCRIPTIONGROUP_CONFIG, VIEW_BROKER_STATS_DATA = 351, 352, 315
_VERSION_DESC, _VERSION = "V4_9_4", 395  # the remoting generation StrataMQ speaks


def fastjson_queue_map(entries: list[tuple[str, str, int, Any]]) -> str:
    """``{MessageQueue: value}`` as fastjson writes a map with object keys."""
    items = []
    for topic, broker, qid, value in entries:
        key = json.dumps({"brokerName": broker, "queueId": qid, "topic": topic},
                         separators=(",", ":"))
        items.append(f"{key}:{json.dumps(value, separators=(',', ':'))}")
    return "{" + ",".join(items) + "}"


class AdminHandlers:
    def __init__(self, lookup: Lookup, reader: MessageReader, state: PopState,
                 consumers: ConsumerTable, broker_name: str, started_ms: int,
                 call_of: Callable[[RemotingCommand, Connection], Call],
                 run: Callable[..., Any],
                 delete_topic: Callable[[dict[str, Any]], Any] | None = None,
                 refusal: Callable[[str], str | None] = lambda method: None,
                 settings: Callable[[], dict[str, str]] = dict,
                 status: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
                 stats: BrokerStatsWindow | None = None,
                 store_stats: Callable[[], dict[str, str]] | None = None,
                 look_up: Callable[[int], StoredMessage | None] | None = None) -> None:
        # delete_topic: the gRPC admin's DeleteTopic; refusal: why an admin write may not
        # run here (a slave), as the gRPC admin asks; settings: every broker and store
        # setting by key (GET_BROKER_CONFIG); status: the gRPC admin's BrokerStatus (the
        # store's part of GET_BROKER_RUNTIME_INFO); stats: the put/get windows; store_stats:
        # the store's totals and rates (StoreStats.runtime_fields); look_up: the record at a
        # CommitLog offset (earliestMessageTimeStamp).
        self.stats = stats
        self.store_stats = store_stats
        self.look_up = look_up
        self.delete_topic = delete_topic
        self.refusal = refusal
        self.settings = settings
        self.status = status
        self.lookup = lookup
        self.reader = reader
        self.state = state
        self.consumers = consumers
        self.broker_name = broker_name
        self.started_ms = started_ms
        self.call_of = call_of
        self.run = run

    def handlers(self) -> dict[int, Any]:
        def guarded(fn: Callable[[RemotingCommand, Connection], RemotingCommand]) -> Any:
            def checked(request: RemotingCommand, conn: Connection) -> RemotingCommand:
                try:
                    return fn(request, conn)
                except MetadataError as exc:
                    return request.response(ResponseCode.SYSTEM_ERROR, str(exc))

            async def handler(request: RemotingCommand, conn: Connection) -> RemotingCommand:
                return await answer_in(self.run, checked, request, conn)
            return handler

        return {17: guarded(self._update_topic), 21: guarded(self._all_topics),
                28: guarded(self._runtime_info),
                UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: guarded(self._update_group),
                GET_ALL_SUBSCRIPTIONGROUP_CONFIG: guarded(self._all_groups),
                GET_TOPIC_STATS_INFO: guarded(self._topic_stats),
                GET_CONSUME_STATS: guarded(self._consume_stats),
                GET_CONSUMER_CONNECTION_LIST: guarded(self._connections),
                DELETE_TOPIC_IN_BROKER: guarded(self._delete_topic),
                GET_TOPIC_CONFIG: guarded(self._topic_config),
                GET_SUBSCRIPTIONGROUP_CONFIG: guarded(self._group_config),
                DELETE_SUBSCRIPTIONGROUP: guarded(self._delete_group),
                GET_BROKER_CONFIG: guarded(self._broker_config),
                VIEW_BROKER_STATS_DATA: guarded(self._stats_data)}

    # -- topics and groups ----------------------------------------------------------------------

    def _update_topic(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        h = request.ext_fields
        name = h.get("topic", "")
        meta = self.lookup.meta
        existing = meta.topic(name)
        self.lookup.authorize(self.call_of(request, conn), f"Topic:{name}",
                              "Update" if existing else "Create")
        read, write = _int(h, "readQueueNums", 8), _int(h, "writeQueueNums", 8)
        perm = _int(h, "perm", 6)
        if existing is None:
            kind = "FIFO" if h.get("order") == "true" else "NORMAL"
            attrs = h.get("attributes", "")
            if "message.type=" in attrs:
                kind = attrs.split("message.type=", 1)[1].split(",", 1)[0]
            meta.create_topic(name, max(read, write), kind)
        meta.update_topic(name, None, None, perm, read_queues=read, write_queues=write)
        return request.response(ResponseCode.SUCCESS)

    def _delete_topic(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        name = request.ext_fields.get("topic", "")
        self.lookup.authorize(self.call_of(request, conn), "Cluster", "Delete")
        if not name.strip():
            return request.response(ResponseCode.SYSTEM_ERROR, "The specified topic is blank.")
        if is_system_topic(name):
            return request.response(ResponseCode.SYSTEM_ERROR,
                                    f"The topic[{name}] is conflict with system topic.")
        refused = self.refusal("DeleteTopic")
        if self.delete_topic is None or refused is not None:
            return request.response(ResponseCode.SYSTEM_ERROR,
                                    refused or "topic deletion is not served by this broker")
        try:
            self.delete_topic({"topic": name})
        except MetadataError as exc:
            if exc.kind != "not_found":
                raise
        return request.response(ResponseCode.SUCCESS)

    def _all_topics(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        self.lookup.authorize(self.call_of(request, conn), "Cluster", "List")
        meta = self.lookup.meta
        return request.response(ResponseCode.SUCCESS, body=to_json({
            "topicConfigTable": {t.name: t.to_json() for t in meta.topics()},
            "dataVersion": {"counter": meta.topics_version, "stateVersion": 0,
                            "timestamp": self.started_ms}}))

    def _update_group(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        try:
            doc = json.loads(request.body)
            name = str(doc["groupName"])
        except (ValueError, KeyError, TypeError) as exc:
            raise RemotingError(ResponseCode.SYSTEM_ERROR,
                                f"the body is not a SubscriptionGroupConfig: {exc}") from None
        meta = self.lookup.meta
        existing = meta.group(name)
        self.lookup.authorize(self.call_of(request, conn), f"Group:{name}",
                              "Update" if existing else "Create")
        retry = int(doc.get("retryMaxTimes", meta.default_retry_max_times))
        orderly = bool(doc.get("consumeMessageOrderly", False))
        if existing is None:
            meta.create_group(name, retry_max_times=retry, orderly=orderly)
        meta.update_group(name, retry_max_times=retry, consume_message_orderly=orderly,
                          consume_enable=bool(doc.get("consumeEnable", True)))
        return request.response(ResponseCode.SUCCESS)

    def _all_groups(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        self.lookup.authorize(self.call_of(request, conn), "Cluster", "List")
        return request.response(ResponseCode.SUCCESS, body=to_json({
            "subscriptionGroupTable": {g.name: g.to_json() for g in self.lookup.meta.groups()},
            "dataVersion": {"counter": 0, "stateVersion": 0, "timestamp": self.started_ms}}))

    def _topic_config(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        name = request.ext_fields.get("topic", "")
        self.lookup.authorize(self.call_of(request, conn), f"Topic:{name}", "Get")
        topic = self.lookup.meta.topic(name)
        if topic is None:
            return request.response(ResponseCode.TOPIC_NOT_EXIST,
                                    f"No topic in this broker. topic: {name}")
        # TopicConfigAndQueueMapping: the TopicConfig, no static-topic mapping (null, omitted).
        return request.response(ResponseCode.SUCCESS, body=to_json(topic.to_json()))

    def _group_config(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        name = request.ext_fields.get("group", "")
        self.lookup.authorize(self.call_of(request, conn), f"Group:{name}", "Get")
        group = self.lookup.meta.group(name)
        if group is None:
            return request.response(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                                    "No group in this broker")
        return request.response(ResponseCode.SUCCESS, body=to_json(group.to_json()))

    def _delete_group(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        h = request.ext_fields
        name = h.get("groupName", "")
        self.lookup.authorize(self.call_of(request, conn), "Cluster", "Delete")
        refused = self.refusal("DeleteGroup")
        if refused is not None:
            return request.response(ResponseCode.SYSTEM_ERROR, refused)
        # As RocketMQ's deleteSubscriptionGroup: a group it does not have is no error.
        if self.lookup.meta.group(name) is not None:
            self.lookup.meta.delete_group(name)
        if h.get("cleanOffset") == "true":
            self.state.drop_group(name)
        if self.stats is not None:  # autoDeleteUnusedStats: its get items go with it
            self.stats.on_group_deleted(name)
        return request.response(ResponseCode.SUCCESS)

    def _broker_config(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        self.lookup.authorize(self.call_of(request, conn), "Cluster", "Get")
        # Configuration.getAllConfigsFormatString: "key=value" lines.
        text = "".join(f"{k}={v}\n" for k, v in sorted(self.settings().items()))
        version = to_json({"counter": self.lookup.meta.topics_version, "stateVersion": 0,
                           "timestamp": self.started_ms}).decode()
        return request.response(ResponseCode.SUCCESS, None, {"version": version},
                                text.encode())

    # -- status ---------------------------------------------------------------------------------

    def _runtime_info(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        self.lookup.authorize(self.call_of(request, conn), "Cluster", "Get")
        status = self.status({}) if self.status is not None else None
        earliest = None
        if status is not None and self.look_up is not None:  # getEarliestMessageTime
            low, high = status["commitlog"]["min_offset"], status["commitlog"]["max_offset"]
            try:
                first = self.look_up(low) if low < high else None
            except Exception as exc:  # (a damaged first record must not cost the whole table)
                log.warning("earliestMessageTimeStamp: the record at CommitLog offset %d "
                            "cannot be read: %s", low, exc)
                first = None
            earliest = first.store_timestamp if first is not None else -1
        table = runtime_table(
            version_desc=_VERSION_DESC, version=_VERSION, stratamq_version=__version__,
            started_ms=self.started_ms, now_ms=int(time.time() * 1000),
            daily=self.stats.runtime_fields() if self.stats is not None else None,
            store=self.store_stats() if self.store_stats is not None else None,
            status=status, earliest_ms=earliest)
        return request.response(ResponseCode.SUCCESS, body=to_json({"table": table}))

    def _stats_data(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        h = request.ext_fields
        name, key = h.get("statsName", ""), h.get("statsKey", "")
        self.lookup.authorize(self.call_of(request, conn), "Cluster", "Get")
        data = self.stats.stats_data(name, key) if self.stats is not None else None
        if data is None:
            return request.response(ResponseCode.SYSTEM_ERROR,
                                    f"The stats <{name}> <{key}> not exist")
        return request.response(ResponseCode.SUCCESS, body=to_json(data))

    def _queues(self, topic: str) -> list[tuple[int, int, int]]:
        cfg = self.lookup.topic(topic)
        return [(q, self.reader.get_min_offset_in_queue(topic, q),
                 self.reader.get_max_offset_in_queue(topic, q)) for q in range(cfg.queue_count)]

    def _topic_stats(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        topic = request.ext_fields.get("topic", "")
        self.lookup.authorize(self.call_of(request, conn), f"Topic:{topic}", "Get")
        rows = [(topic, self.broker_name, q, {"lastUpdateTimestamp": 0, "maxOffset": high,
                                                 "minOffset": low})
                for q, low, high in self._queues(topic)]
        body = '{"offsetTable":' + fastjson_queue_map(rows) + "}"
        return request.response(ResponseCode.SUCCESS, body=body.encode())

    def _consume_stats(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        h = request.ext_fields
        group = h.get("consumerGroup", "")
        self.lookup.authorize(self.call_of(request, conn), f"Group:{group}", "Get")
        topics = [h["topic"]] if h.get("topic") else sorted(
            t for g, t in self.state.groups_of() if g == group)
        rows = []
        for topic in topics:
            for q, _low, high in self._queues(topic):
                done = consumer_offset(self.state, group, topic, q)
                rows.append((topic, self.broker_name, q, {
                    "brokerOffset": high, "consumerOffset": -1 if done is None else done,
                    "pullOffset": -1 if done is None else done, "lastTimestamp": 0}))
        body = '{"consumeTps":0.0,"offsetTable":' + fastjson_queue_map(rows) + "}"
        return request.response(ResponseCode.SUCCESS, body=body.encode())

    def _connections(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        group = request.ext_fields.get("consumerGroup", "")
        self.lookup.authorize(self.call_of(request, conn), f"Group:{group}", "Get")
        clients = self.consumers.describe(group)
        if not clients:
            raise RemotingError(ResponseCode.CONSUMER_NOT_ONLINE,
                                "the consumer group not online")
        first = clients[-1][1]
        return request.response(ResponseCode.SUCCESS, body=to_json({
            "connectionSet": [{"clientId": cid, "clientAddr": info.get("clientAddr", ""),
                               "language": info.get("language", "JAVA"),
                               "version": info.get("version", 0)} for cid, info in clients],
            "subscriptionTable": {str(s.get("topic")): s
                                  for s in first.get("subscriptionDataSet") or []},
            "consumeType": first.get("consumeType") or "CONSUME_PASSIVELY",
            "messageModel": first.get("messageModel") or "CLUSTERING",
            "consumeFromWhere": first.get("consumeFromWhere") or "CONSUME_FROM_LAST_OFFSET"}))
