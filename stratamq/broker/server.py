"""The gRPC broker: ``apache.rocketmq.v2.MessagingService`` for the official RocketMQ 5 clients,
plus a small StrataMQ admin service, on one port.

Protocol definitions come from the generated modules shipped in the official client package
(``rocketmq.grpc_protocol``), never from hand-copied ``.proto`` files.

RPCs (every failure is answered with a ``Status``; nothing a client sends crashes the broker):

* ``QueryRoute``: one ``MessageQueue`` per queue id with READ/WRITE permission, this broker
  (id 0) and the endpoints the client used, and the topic's message type as the only accepted
  type. Unknown topic: ``TOPIC_NOT_FOUND`` (auto-create is off by default).
* ``Heartbeat`` / ``NotifyClientTermination``: the broker tracks live clients per group.
* ``Telemetry``: each ``settings`` command is answered with the broker's settings: for a
  producer max body size (``maxMessageSize``), type validation on and an exponential send
  backoff; for a consumer the subscription (``fifo`` when the group consumes orderly),
  batch size, long-polling timeout and the group's retry policy (``max_attempts`` =
  ``retryMaxTimes`` + 1, customized backoff).
* ``SendMessage``: NORMAL / FIFO (the message group picks the queue by hash) / DELAY (handed to
  ``Broker.timer``; refused with ``UNSUPPORTED`` when no timer service runs). The message type
  must match the topic's.
* ``ReceiveMessage`` (server stream: status, then the messages, then the delivery timestamp),
  ``AckMessage``, ``ChangeInvisibleDuration``, ``ForwardMessageToDeadLetterQueue``,
  ``QueryAssignment`` (one assignment per topic with queue id -1: a receive pops across every
  queue, as RocketMQ's proxy does): see ``engine.py`` for the semantics.

Offset-based reads, for replaying a queue from any offset (what the Spark source uses):

* ``QueryOffset(message_queue{topic.name, id}, query_offset_policy)``: ``BEGINNING`` -> the
  queue's min offset, ``END`` -> its max offset (the next offset to be written),
  ``TIMESTAMP`` (+ ``timestamp``) -> the first offset stored at or after that time (the max
  offset if none). Unknown topic: ``TOPIC_NOT_FOUND``; queue id out of range: ``BAD_REQUEST``.
* ``PullMessage(group.name, message_queue{topic.name, id}, offset, batch_size,
  filter_expression, long_polling_timeout)``: a server stream of ``status``, then up to
  ``batch_size`` messages in offset order (``system_properties.queue_offset`` is each
  message's offset; bodies are byte-identical; no receipt handle), then ``next_offset``: the
  offset to pull from next (it moves past messages the tag filter skipped). Status ``OK`` when
  the pull read something (possibly zero messages after filtering, with ``next_offset``
  advanced); ``MESSAGE_NOT_FOUND`` when ``offset`` is the end of the queue and nothing arrived
  within ``long_polling_timeout``; ``ILLEGAL_OFFSET`` when ``offset`` is below the min offset
  (retention removed it) or past the end, with ``next_offset`` set to the min / max offset to
  resume from. A reader replays ``[start, end)`` by pulling from ``start`` and following
  ``next_offset`` until it reaches ``end`` (from ``QueryOffset END`` taken at the start).
  Pulls keep no state and need no consumer group registration (the group name is only used
  for logging and access control).
  With request metadata ``x-stratamq-pull-format: records`` (StrataMQ's Spark source) the
  broker answers with the same metadata and each message's ``body`` is the whole stored
  CommitLog record (``system_properties`` carry only ``queue_id`` and ``queue_offset``).
* ``UpdateOffset`` / ``GetOffset``: a pull consumer's committed offset per (group, queue),
  durable; ``GetOffset`` falls back to the group's pop progress, else ``OFFSET_NOT_FOUND``.

Not supported (answered ``NOT_IMPLEMENTED``): transactions (``EndTransaction``),
``RecallMessage``, lite topics (``SyncLiteSubscription``), SQL92 filters
(``ILLEGAL_FILTER_EXPRESSION``).

Admin (``stratamq.admin.v1.Admin``, JSON request and response bodies, gRPC status codes for
errors; the client package's ``admin_pb2`` only changes log levels): see ``admin.py``.

Hook points for the parts other modules provide (all off by default):

* ``Broker._authorize(context, resource, action)`` runs at the start of every RPC; with
  ``Broker.acl`` None it does nothing, else it calls ``acl.authorize(metadata, resource,
  action)`` which raises ``BrokerError(UNAUTHORIZED | FORBIDDEN, ...)``. Resources are
  ``"Topic:<name>"``, ``"Group:<name>"`` or ``"Cluster"``; actions ``"Pub"``, ``"Sub"``,
  ``"Get"``, ``"Create"``, ``"Update"``, ``"Delete"``, ``"List"``.
* ``Broker.metrics``: ``on_send(topic, sizes, seconds, message_type)``, ``on_receive(group,
  topic, count, nbytes)``, ``on_ack(group, topic, count)``, ``on_dlq(group, topic)``,
  ``on_rpc(method, code, seconds)``; ``NullMetrics`` by default (``broker/metrics.py``).
* ``Broker.timer``: ``submit(message, deliver_at_ms) -> PutMessageResult`` for DELAY sends.
* ``Broker.server_credentials``: a ``grpc.ServerCredentials`` for TLS (plaintext if None).
"""

from __future__ import annotations

import functools
import itertools
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc

from stratamq.broker.convert import to_pb_message, to_store_message, valid_timestamp_ms
from stratamq.broker.engine import Notifier, PopEngine, now_ms
from stratamq.broker.errors import BrokerError
from stratamq.broker.metadata import (
    GroupConfig,
    MetadataError,
    MetadataStore,
    TopicConfig,
)
from stratamq.broker.metrics import NullMetrics
from stratamq.broker.pop_state import PopState
from stratamq.broker.validate import (
    RECEIVE_BATCH_MAX,
    check_group,
    check_invisible_time,
    check_topic,
    client_type_name,
    put_status,
)
from stratamq.config import BrokerConfig, BrokerRole, StoreConfig
from stratamq.record import Host, Prop, tags_hash_code
from stratamq.store.filter import TagFilter
from stratamq.store.message_store import MessageStore
from stratamq.store.results import GetMessageStatus, PutMessageStatus

log = logging.getLogger(__name__)
Code = pb.Code

__all__ = ["Broker", "BrokerStopError", "NullMetrics"]



# PullMessage metadata asking for raw CommitLog records as bodies (see PullMessage).
PULL_FORMAT_KEY, PULL_FORMAT_RECORDS = "x-stratamq-pull-format", "records"


def _record_message(record: Any, topic: str, qid: int) -> pb.Message:
    out = pb.Message(body=bytes(record.buffer))
    out.topic.name = topic
    out.system_properties.queue_id = qid
    out.system_properties.queue_offset = record.queue_offset
    return out


def _status(code: int = Code.OK, message: str = "OK") -> pb.Status:
    return pb.Status(code=code, message=message)


def _peer_host(context: grpc.ServicerContext) -> Host:
    peer = context.peer() or ""
    try:
        kind, _, rest = peer.partition(":")
        if kind in ("ipv4", "ipv6"):
            return Host.parse(rest)
    except ValueError:
        pass
    return Host("127.0.0.1", 0)


def _code_name(code: int) -> str:
    return pb.Code.Name(code) if code in pb.Code.values() else str(code)


def _unary(response_cls: type) -> Callable:
    """Turn BrokerError (and any bug) into a Status response instead of a failed RPC, and time
    the call for ``rocketmq_rpc_latency``."""

    def wrap(fn: Callable) -> Callable:
        name = fn.__name__

        @functools.wraps(fn)
        def handler(self: MessagingServicer, request: Any, context: grpc.ServicerContext) -> Any:
            started = time.perf_counter()
            try:
                response = fn(self, request, context)
            except BrokerError as exc:
                response = response_cls(status=_status(exc.code, exc.message))
            except MetadataError as exc:
                response = response_cls(status=_status(Code.BAD_REQUEST, str(exc)))
            except Exception as exc:  # a bug must cost one request, not the broker
                log.exception("%s failed", name)
                response = response_cls(status=_status(Code.INTERNAL_ERROR,
                                                       f"{type(exc).__name__}: {exc}"))
            self.b.metrics.on_rpc(name, _code_name(response.status.code),
                                  time.perf_counter() - started)
            return response

        return handler

    return wrap


def _streaming(response_cls: type) -> Callable:
    def wrap(fn: Callable) -> Callable:
        name = fn.__name__

        @functools.wraps(fn)
        def handler(self: MessagingServicer, request: Any, context: grpc.ServicerContext
                    ) -> Iterator[Any]:
            started = time.perf_counter()
            code = Code.OK
            try:
                for response in fn(self, request, context):
                    if response.HasField("status"):
                        code = response.status.code
                    yield response
            except BrokerError as exc:
                code = exc.code
                yield response_cls(status=_status(exc.code, exc.message))
            except Exception as exc:
                log.exception("%s failed", name)
                code = Code.INTERNAL_ERROR
                yield response_cls(status=_status(Code.INTERNAL_ERROR,
                                                  f"{type(exc).__name__}: {exc}"))
            self.b.metrics.on_rpc(name, _code_name(code), time.perf_counter() - started)

        return handler

    return wrap


class MessagingServicer(service_pb2_grpc.MessagingServiceServicer):
    """Thin adapter: validate, authorize, call the engine/store, build the response."""

    def __init__(self, broker: Broker) -> None:
        self.b = broker
        self._round_robin = itertools.count(random.randrange(1 << 16))

    # -- helpers --------------------------------------------------------------------------------

    def _topic(self, name: str, *, create: bool = False) -> TopicConfig:
        # System topics (e.g. the timer's rmq_sys_wheel_timer, holding not-yet-due DELAY
        # messages) are internal: neither routed, written, read nor auto-created for clients.
        check_topic(name)
        cfg = self.b.meta.topic(name)
        if cfg is None and create and self.b.config.auto_create_topic_enable:
            cfg = self.b.meta.create_topic(name, self.b.config.default_topic_queue_nums,
                                           exist_ok=True)
        if cfg is None:
            raise BrokerError(Code.TOPIC_NOT_FOUND, f"topic {name!r} does not exist")
        return cfg

    def _subscription(self, context, group_name: str,
                      topic_name: str) -> tuple[GroupConfig, TopicConfig]:
        """Check that the caller may consume ``topic_name`` as ``group_name``; both configs."""
        self.b._authorize(context, f"Group:{group_name}", "Sub")
        self.b._authorize(context, f"Topic:{topic_name}", "Sub")
        return self._group(group_name, context), self._topic(topic_name)

    def _group(self, name: str, context: grpc.ServicerContext) -> GroupConfig:
        """The group's config; an unknown group is created when autoCreateSubscriptionGroup
        is on, and with ACL only for an account that may create groups (the admin): any
        signed-in client could otherwise fill the broker with groups."""
        check_group(name)
        cfg = self.b.meta.group(name)
        if cfg is None and self.b.config.auto_create_subscription_group:
            try:
                self.b._authorize(context, f"Group:{name}", "Create")
            except BrokerError as exc:
                if exc.code != Code.FORBIDDEN:
                    raise
                raise BrokerError(Code.FORBIDDEN, f"group {name!r} does not exist, and only "
                                  "an admin account may create it (stratamq group create)"
                                  ) from None
            try:
                cfg = self.b.meta.create_group(name, exist_ok=True)
            except MetadataError as exc:
                raise BrokerError(Code.ILLEGAL_CONSUMER_GROUP, str(exc)) from None
        if cfg is None:
            raise BrokerError(Code.CONSUMER_GROUP_NOT_FOUND, f"group {name!r} does not exist")
        if not cfg.consume_enable:
            raise BrokerError(Code.FORBIDDEN, f"group {name!r} has consumeEnable=false")
        return cfg

    def _named_queue(self, mq) -> tuple[TopicConfig, int]:
        """The topic config and checked queue id a request's ``message_queue`` names."""
        topic = self._topic(mq.topic.name)
        return topic, self._queue_id(topic, mq.id)

    def _queue_id(self, topic: TopicConfig, qid: int) -> int:
        if not 0 <= qid < topic.queue_count:
            raise BrokerError(Code.BAD_REQUEST,
                              f"queue {qid} out of range: topic {topic.name!r} has "
                              f"{topic.queue_count} queues")
        return qid

    def _endpoints(self, requested: pb.Endpoints | None) -> pb.Endpoints:
        if requested is not None and requested.addresses:
            return requested  # the address the client reached us on: right behind NAT too
        host, port = self.b.advertised
        return pb.Endpoints(scheme=pb.IPv6 if ":" in host else pb.IPv4,
                            addresses=[pb.Address(host=host, port=port)])

    def _message_queue(self, topic: TopicConfig, qid: int, endpoints: pb.Endpoints,
                       may_write: bool = True) -> pb.MessageQueue:
        readable = qid < topic.read_queue_nums and topic.perm & 4
        writable = may_write and qid < topic.write_queue_nums and topic.perm & 2
        perm = {(True, True): pb.READ_WRITE, (True, False): pb.READ,
                (False, True): pb.WRITE}.get((bool(readable), bool(writable)), pb.NONE)
        return pb.MessageQueue(
            topic=pb.Resource(name=topic.name), id=qid, permission=perm,
            broker=pb.Broker(name=self.b.config.broker_name, id=0, endpoints=endpoints),
            accept_message_types=[pb.MessageType.Value(topic.message_type)])

    @staticmethod
    def _check_batch_size(batch_size: int, most: int = 1024) -> None:
        if not 1 <= batch_size <= most:
            raise BrokerError(Code.BAD_REQUEST, f"batch_size must be 1..{most}, not {batch_size}")

    def _poll_ms(self, wanted_ms: int, context: grpc.ServicerContext) -> int:
        """How long a receive or pull may wait: capped by the broker, and short enough to
        answer before the client gives up on the call."""
        poll = min(wanted_ms, self.b.config.max_long_polling_time_mills)
        remaining = context.time_remaining()
        if remaining is not None:
            poll = max(0, min(poll, int((remaining - 1.0) * 1000)))
        return poll

    @staticmethod
    def _filter(expr: pb.FilterExpression) -> TagFilter:
        if expr.type == pb.SQL:
            raise BrokerError(Code.ILLEGAL_FILTER_EXPRESSION,
                              "SQL92 filter expressions are not supported; use tags")
        try:
            return TagFilter(expr.expression or "*")
        except ValueError as exc:
            raise BrokerError(Code.ILLEGAL_FILTER_EXPRESSION, str(exc)) from None

    # -- route, heartbeat, telemetry ------------------------------------------------------------

    @_unary(svc.QueryRouteResponse)
    def QueryRoute(self, request, context):
        self.b._authorize(context, f"Topic:{request.topic.name}", "Get")
        topic = self._topic(request.topic.name, create=True)
        # A slave names its master while it reaches it, else itself, read-only (replication.py).
        endpoints, writable = self.b.replication.route(self._endpoints(request.endpoints))
        return svc.QueryRouteResponse(status=_status(), message_queues=[
            self._message_queue(topic, q, endpoints, writable)
            for q in range(topic.queue_count)])

    @_unary(svc.HeartbeatResponse)
    def Heartbeat(self, request, context):
        self.b._authorize(context, "Cluster", "Get")
        group = request.group.name if request.HasField("group") else ""
        if group and request.client_type != pb.PRODUCER:
            self.b._authorize(context, f"Group:{group}", "Sub")
            self._group(group, context)
        self.b.note_client(context, group, client_type_name(request.client_type))
        return svc.HeartbeatResponse(status=_status())

    @_unary(svc.NotifyClientTerminationResponse)
    def NotifyClientTermination(self, request, context):
        self.b._authorize(context, "Cluster", "Get")
        self.b.forget_client(context)
        return svc.NotifyClientTerminationResponse(status=_status())

    def Telemetry(self, request_iterator, context):
        try:
            self.b._authorize(context, "Cluster", "Get")
            for cmd in request_iterator:
                if cmd.HasField("settings"):
                    yield self._settings_reply(cmd.settings, context)
        except BrokerError as exc:
            yield svc.TelemetryCommand(status=_status(exc.code, exc.message))
        except Exception as exc:
            if context.is_active():
                log.exception("Telemetry failed")
                yield svc.TelemetryCommand(status=_status(Code.INTERNAL_ERROR, str(exc)))

    def _settings_reply(self, s: pb.Settings, context) -> svc.TelemetryCommand:
        out = pb.Settings()
        out.CopyFrom(s)
        if s.HasField("publishing"):
            out.publishing.max_body_size = self.b.store_config.max_message_size
            out.publishing.validate_message_type = True
            backoff = out.backoff_policy
            backoff.Clear()
            backoff.max_attempts = 3
            backoff.exponential_backoff.initial.FromMilliseconds(10)
            backoff.exponential_backoff.max.FromMilliseconds(1000)
            backoff.exponential_backoff.multiplier = 2.0
        elif s.HasField("subscription"):
            self.b._authorize(context, f"Group:{s.subscription.group.name}", "Sub")
            group = self._group(s.subscription.group.name, context)
            sub = out.subscription
            orderly = group.consume_message_orderly or any(
                (t := self.b.meta.topic(e.topic.name)) is not None and t.message_type == "FIFO"
                for e in s.subscription.subscriptions)
            sub.fifo = orderly
            sub.receive_batch_size = self.b.config.receive_batch_size
            wanted = (s.subscription.long_polling_timeout.ToMilliseconds()
                      if s.subscription.HasField("long_polling_timeout") else 30_000)
            sub.long_polling_timeout.FromMilliseconds(
                max(1000, min(wanted, self.b.config.max_long_polling_time_mills)))
            backoff = out.backoff_policy
            backoff.Clear()
            backoff.max_attempts = group.max_delivery_attempts
            for ms in group.retry_backoff_ms:
                backoff.customized_backoff.next.add().FromMilliseconds(ms)
            self.b.note_client(context, group.name, client_type_name(s.client_type))
        out.metric.on = False
        return svc.TelemetryCommand(status=_status(), settings=out)

    # -- send -----------------------------------------------------------------------------------

    @_unary(svc.SendMessageResponse)
    def SendMessage(self, request, context):
        # SendMessageActivity: one topic per request, every entry converted and checked before
        # anything is stored, so a bad entry never leaves its neighbours stored but unacked
        # (the client's retry would store them twice).
        if not request.messages:
            raise BrokerError(Code.MESSAGE_CORRUPTED, "no message to send")
        topic_name = request.messages[0].topic.name
        check_topic(topic_name)
        if any(m.topic.name != topic_name for m in request.messages):
            raise BrokerError(Code.MESSAGE_CORRUPTED, "topic in message is not same")
        self.b._authorize(context, f"Topic:{topic_name}", "Pub")
        topic = self._topic(topic_name, create=True)
        if not topic.perm & 2:
            raise BrokerError(Code.FORBIDDEN, f"topic {topic.name!r} is not writable")
        peer = _peer_host(context)
        prepared: list[tuple[Any, int | None] | BrokerError] = []
        for m in request.messages:
            try:
                prepared.append(self._prepare(m, topic, peer))
            except BrokerError as exc:
                prepared.append(exc)
        failures = [(i, p) for i, p in enumerate(prepared) if isinstance(p, BrokerError)]
        if failures:
            first_index, first = failures[0]
            entries = [svc.SendResultEntry(status=_status(p.code, p.message))
                       if isinstance(p, BrokerError) else svc.SendResultEntry(status=_status(
                           first.code, f"not stored: message {first_index} of this request "
                           f"is invalid ({first.message})")) for p in prepared]
            return svc.SendMessageResponse(status=_status(first.code, first.message),
                                           entries=entries)
        started = time.perf_counter()
        entries: list[svc.SendResultEntry] = []
        sizes: list[int] = []
        for m, p in zip(request.messages, prepared, strict=True):
            assert not isinstance(p, BrokerError)
            try:
                entries.append(self._store(m, *p))
                sizes.append(len(m.body))
            except BrokerError as exc:
                entries.append(svc.SendResultEntry(status=_status(exc.code, exc.message)))
        if sizes:
            self.b.metrics.on_send(topic_name, sizes, time.perf_counter() - started,
                                   topic.message_type)
        codes = {e.status.code for e in entries}
        status = entries[0].status if len(codes) == 1 else _status(Code.MULTIPLE_RESULTS,
                                                                    "MULTIPLE_RESULTS")
        return svc.SendMessageResponse(status=status, entries=entries)

    def _prepare(self, m: pb.Message, topic: TopicConfig, peer: Host
                 ) -> tuple[Any, int | None]:
        """The store message for one entry and its delivery time, checked; stores nothing."""
        msg, deliver_at = to_store_message(m, peer, self.b.store_config.max_message_size)
        sp = m.system_properties
        declared = sp.message_type
        if declared == pb.MESSAGE_TYPE_UNSPECIFIED:
            declared = (pb.FIFO if sp.message_group else
                        pb.DELAY if deliver_at is not None else pb.NORMAL)
        if declared not in pb.MessageType.values():
            raise BrokerError(Code.BAD_REQUEST, f"unknown message type {declared}")
        if pb.MessageType.Name(declared) != topic.message_type:
            raise BrokerError(Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                              f"topic {topic.name!r} accepts {topic.message_type} messages, "
                              f"not {pb.MessageType.Name(declared)}")
        if topic.message_type == "FIFO" and not sp.message_group:
            raise BrokerError(Code.ILLEGAL_MESSAGE_GROUP, "a FIFO message needs a message group")
        if topic.message_type == "DELAY" and deliver_at is None:
            raise BrokerError(Code.ILLEGAL_DELIVERY_TIME, "a DELAY message needs a delivery time")
        writable = topic.write_queue_nums
        if sp.message_group:
            # Java String.hashCode, as RocketMQ's selectors use: a group always lands on one
            # queue while the queue count stays the same.
            msg.queue_id = abs(tags_hash_code(sp.message_group)) % writable
        else:
            msg.queue_id = next(self._round_robin) % writable
        if deliver_at is not None and deliver_at > now_ms():
            if self.b.timer is None or not self.b.config.timer_enable:
                raise BrokerError(Code.UNSUPPORTED,
                                  "DELAY messages need the timer service, which is not running "
                                  "on this broker (timerWheelEnable)")
            self.b.timer.check_delay(deliver_at)
        else:
            deliver_at = None
        return msg, deliver_at

    def _store(self, m: pb.Message, msg: Any, deliver_at: int | None) -> svc.SendResultEntry:
        if deliver_at is not None:
            result = self.b.timer.submit(msg, deliver_at)
        else:
            result = self.b.store.put_message(msg)
        if result.status is not PutMessageStatus.PUT_OK:
            code, text = put_status(result.status)
            raise BrokerError(code, f"{text} ({result.error})" if result.error else text)
        return svc.SendResultEntry(status=_status(Code.OK, "OK"),
                                   message_id=m.system_properties.message_id,
                                   offset=result.queue_offset if result.messages else 0)

    # -- pop consumption ------------------------------------------------------------------------

    @_streaming(svc.ReceiveMessageResponse)
    def ReceiveMessage(self, request, context):
        group, topic = self._subscription(context, request.group.name,
                                          request.message_queue.topic.name)
        if not topic.perm & 4:
            raise BrokerError(Code.FORBIDDEN, f"topic {topic.name!r} is not readable")
        cfg = self.b.config
        # RocketMQ's broker pops at most 32 messages a request (PopMessageProcessor).
        self._check_batch_size(request.batch_size, RECEIVE_BATCH_MAX)
        filt = self._filter(request.filter_expression)
        if request.HasField("invisible_duration"):
            invisible = request.invisible_duration.ToMilliseconds()
            check_invisible_time(invisible, cfg.min_invisible_time_mills_for_recv,
                                 cfg.max_invisible_time_mills)
        else:
            invisible = cfg.default_invisible_time_mills
        poll = (request.long_polling_timeout.ToMilliseconds()
                if request.HasField("long_polling_timeout") else 0)
        if poll < 0:
            raise BrokerError(Code.ILLEGAL_POLLING_TIME, f"long polling timeout {poll} ms < 0")
        poll = self._poll_ms(poll, context)
        qid = request.message_queue.id
        start = qid if 0 <= qid < topic.read_queue_nums else random.randrange(
            topic.read_queue_nums)
        popped = self.b.engine.receive(group, topic, filt, request.batch_size, invisible, poll,
                                       start, alive=context.is_active)
        if not popped:
            yield svc.ReceiveMessageResponse(status=_status(Code.MESSAGE_NOT_FOUND,
                                                            "no new message"))
            return
        yield svc.ReceiveMessageResponse(status=_status())
        nbytes = 0
        for p in popped:
            nbytes += len(p.message.body)
            yield svc.ReceiveMessageResponse(message=to_pb_message(
                p.message, message_type=self._type_of(p.message, topic),
                receipt=self.b.engine.handle(group.name, topic.name, p.receipt),
                attempt=p.attempt, invisible_ms=p.invisible_ms))
        self.b.metrics.on_receive(group.name, topic.name, len(popped), nbytes)
        ts = svc.ReceiveMessageResponse()
        ts.delivery_timestamp.GetCurrentTime()
        yield ts

    @staticmethod
    def _type_of(msg, topic: TopicConfig) -> str:
        if Prop.MESSAGE_GROUP in msg.properties:
            return "FIFO"
        if Prop.TIMER_DELIVER_MS in msg.properties:
            return "DELAY"
        return topic.message_type

    @_unary(svc.AckMessageResponse)
    def AckMessage(self, request, context):
        group, topic = self._subscription(context, request.group.name, request.topic.name)
        if not request.entries:
            raise BrokerError(Code.BAD_REQUEST, "AckMessageRequest has no entries")
        results = []
        for entry in request.entries:
            try:
                self.b.engine.ack(group.name, topic.name, entry.receipt_handle)
                status = _status()
            except BrokerError as exc:
                status = _status(exc.code, exc.message)
            results.append(svc.AckMessageResultEntry(
                message_id=entry.message_id, receipt_handle=entry.receipt_handle, status=status))
        ok = sum(1 for r in results if r.status.code == Code.OK)
        if ok:
            self.b.metrics.on_ack(group.name, topic.name, ok)
        codes = {r.status.code for r in results}
        status = results[0].status if len(codes) == 1 else _status(Code.MULTIPLE_RESULTS,
                                                                    "mixed results")
        return svc.AckMessageResponse(status=status, entries=results)

    @_unary(svc.ChangeInvisibleDurationResponse)
    def ChangeInvisibleDuration(self, request, context):
        group, topic = self._subscription(context, request.group.name, request.topic.name)
        # The handle first: a client whose duration we refused would otherwise retry a handle
        # it can never get an answer about. 0 ms is a nack (deliver again now), as the proxy
        # accepts it; clients send it when a listener fails.
        self.b.engine.check_handle(group.name, topic.name, request.receipt_handle)
        ms = request.invisible_duration.ToMilliseconds()
        check_invisible_time(ms, 0, self.b.config.max_invisible_time_mills)
        handle = self.b.engine.change_invisible(group.name, topic.name, request.receipt_handle,
                                                ms)
        return svc.ChangeInvisibleDurationResponse(status=_status(), receipt_handle=handle)

    @_unary(svc.ForwardMessageToDeadLetterQueueResponse)
    def ForwardMessageToDeadLetterQueue(self, request, context):
        group, topic = self._subscription(context, request.group.name, request.topic.name)
        self.b.engine.forward_to_dlq(group.name, topic.name, request.receipt_handle)
        return svc.ForwardMessageToDeadLetterQueueResponse(status=_status())

    @_unary(svc.QueryAssignmentResponse)
    def QueryAssignment(self, request, context):
        _, topic = self._subscription(context, request.group.name, request.topic.name)
        endpoints, writable = self.b.replication.route(self._endpoints(request.endpoints))
        mq = self._message_queue(topic, 0, endpoints, writable)
        mq.id = -1  # "any queue": a receive pops across all of them
        return svc.QueryAssignmentResponse(status=_status(),
                                           assignments=[pb.Assignment(message_queue=mq)])

    # -- offsets and pull -----------------------------------------------------------------------

    @_unary(svc.QueryOffsetResponse)
    def QueryOffset(self, request, context):
        self.b._authorize(context, f"Topic:{request.message_queue.topic.name}", "Get")
        topic, qid = self._named_queue(request.message_queue)
        store = self.b.store
        policy = request.query_offset_policy
        if policy == pb.BEGINNING:
            offset = store.get_min_offset_in_queue(topic.name, qid)
        elif policy == pb.END:
            offset = store.get_max_offset_in_queue(topic.name, qid)
        elif policy == pb.TIMESTAMP:
            if not request.HasField("timestamp"):
                raise BrokerError(Code.BAD_REQUEST, "TIMESTAMP policy needs a timestamp")
            ms = valid_timestamp_ms(request.timestamp)
            if ms is None:
                raise BrokerError(Code.BAD_REQUEST, f"timestamp {request.timestamp.seconds}s "
                                  "is not a valid time (years 1 to 9999)")
            offset = store.get_offset_in_queue_by_time(topic.name, qid, ms)
        else:
            raise BrokerError(Code.BAD_REQUEST, f"unknown query_offset_policy {policy}")
        return svc.QueryOffsetResponse(status=_status(), offset=offset)

    @_streaming(svc.PullMessageResponse)
    def PullMessage(self, request, context):
        self.b._authorize(context, f"Group:{request.group.name}", "Sub")
        self.b._authorize(context, f"Topic:{request.message_queue.topic.name}", "Sub")
        topic, qid = self._named_queue(request.message_queue)
        self._check_batch_size(request.batch_size)
        if request.offset < 0:
            raise BrokerError(Code.ILLEGAL_OFFSET, f"offset {request.offset} < 0")
        filt = self._filter(request.filter_expression)
        poll = self._poll_ms(request.long_polling_timeout.ToMilliseconds(), context)
        deadline = time.monotonic() + poll / 1000
        group = request.group.name or "stratamq-pull"
        store = self.b.store
        # Opt-in for StrataMQ's Spark source: each message's body is the whole CommitLog record
        # (header included), so a remote reader builds exactly the rows a directory read does.
        records = (PULL_FORMAT_KEY, PULL_FORMAT_RECORDS) in context.invocation_metadata()
        if records:
            context.send_initial_metadata(((PULL_FORMAT_KEY, PULL_FORMAT_RECORDS),))
        while True:
            seen = self.b.notifier.seq(topic.name)
            got = store.get_messages(group, topic.name, qid, request.offset,
                                     max_count=request.batch_size, tag_filter=filt)
            with got:
                st = got.status
                if st in (GetMessageStatus.FOUND, GetMessageStatus.NO_MATCHED_MESSAGE,
                          GetMessageStatus.MESSAGE_WAS_REMOVING):
                    messages = [_record_message(r, topic.name, qid) for r in got.records] \
                        if records else [to_pb_message(m, message_type=self._type_of(m, topic))
                                         for m in got.messages()]
                    yield svc.PullMessageResponse(status=_status())
                    for m in messages:
                        yield svc.PullMessageResponse(message=m)
                    yield svc.PullMessageResponse(next_offset=got.next_begin_offset)
                    return
                if st is GetMessageStatus.OFFSET_TOO_SMALL:
                    yield svc.PullMessageResponse(status=_status(
                        Code.ILLEGAL_OFFSET, f"offset {request.offset} is below the queue's min "
                        f"offset {got.min_offset}"))
                    yield svc.PullMessageResponse(next_offset=got.min_offset)
                    return
                if st is GetMessageStatus.OFFSET_OVERFLOW_BADLY or (
                        st is not GetMessageStatus.OFFSET_OVERFLOW_ONE and request.offset > 0):
                    yield svc.PullMessageResponse(status=_status(
                        Code.ILLEGAL_OFFSET, f"offset {request.offset} is past the queue's end "
                        f"{got.max_offset}"))
                    yield svc.PullMessageResponse(next_offset=got.max_offset)
                    return
            # At the end of the queue (or the queue was never written): wait for more.
            left = deadline - time.monotonic()
            if left <= 0 or not context.is_active() or self.b.engine.closing:
                yield svc.PullMessageResponse(status=_status(Code.MESSAGE_NOT_FOUND,
                                                             "no new message"))
                yield svc.PullMessageResponse(next_offset=request.offset)
                return
            self.b.notifier.wait(topic.name, seen, min(left, 1.0))

    @_unary(svc.UpdateOffsetResponse)
    def UpdateOffset(self, request, context):
        # Both the group and the topic, before either is looked up: a caller without the
        # right gets the same answer whether the topic exists or not.
        self.b._authorize(context, f"Group:{request.group.name}", "Sub")
        self.b._authorize(context, f"Topic:{request.message_queue.topic.name}", "Sub")
        group = self._group(request.group.name, context)
        topic, qid = self._named_queue(request.message_queue)
        if request.offset < 0:
            raise BrokerError(Code.ILLEGAL_OFFSET, f"offset {request.offset} < 0")
        self.b.state.set_offset(group.name, topic.name, qid, request.offset)
        return svc.UpdateOffsetResponse(status=_status())

    @_unary(svc.GetOffsetResponse)
    def GetOffset(self, request, context):
        self.b._authorize(context, f"Group:{request.group.name}", "Get")
        self.b._authorize(context, f"Topic:{request.message_queue.topic.name}", "Get")
        group = self._group(request.group.name, context)
        topic, qid = self._named_queue(request.message_queue)
        offset = self.b.state.offset(group.name, topic.name, qid)
        if offset is None:
            offset = self.b.state.committed(group.name, topic.name, qid)
        if offset is None:
            raise BrokerError(Code.OFFSET_NOT_FOUND,
                              f"group {group.name!r} has no offset for {topic.name}/{qid}")
        return svc.GetOffsetResponse(status=_status(), offset=offset)

    # -- not supported --------------------------------------------------------------------------

    @_unary(svc.EndTransactionResponse)
    def EndTransaction(self, request, context):
        raise BrokerError(Code.NOT_IMPLEMENTED, "transactional messages are not supported yet")

    @_unary(svc.RecallMessageResponse)
    def RecallMessage(self, request, context):
        raise BrokerError(Code.NOT_IMPLEMENTED, "recalling messages is not supported")

    @_unary(svc.SyncLiteSubscriptionResponse)
    def SyncLiteSubscription(self, request, context):
        raise BrokerError(Code.NOT_IMPLEMENTED, "lite topics are not supported")


_SERVER_STOP_MARGIN_S = 5.0  # past the grace period, how long gRPC's own shutdown may take


class BrokerStopError(RuntimeError):
    """One or more shutdown steps failed (all of them ran); ``errors`` names each."""

    def __init__(self, errors: list[tuple[str, BaseException]]) -> None:
        super().__init__("; ".join(f"{name}: {type(exc).__name__}: {exc}"
                                   for name, exc in errors))
        self.errors = errors


class Broker:
    """One broker process: a store, its metadata and pop state, and the gRPC server.

    ``start()`` binds the port first (so ``--listen host:0`` learns its port and the store
    writes the real endpoint into offset message ids), then opens the store, then serves.
    ``stop()``: refuse new calls, let in-flight ones finish for ``shutdownGraceSeconds``, close
    the pop state and the store (which flushes, writes the checkpoint and removes ``abort``).
    """

    def __init__(self, store_config: StoreConfig, config: BrokerConfig | None = None,
                 listen: str | None = None) -> None:
        self.store_config = store_config
        self.config = config or BrokerConfig()
        if listen is None:
            listen = f"{self.config.listen_host}:{store_config.listen_port}"
        host, _, port = listen.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"--listen must be HOST:PORT, not {listen!r}")
        self.listen_host, self.listen_port = host.strip("[]"), int(port)
        # Hook points (see the module docstring); set before start() or by _install_extensions.
        self.acl: Any = None
        self.metrics: Any = NullMetrics()
        self.timer: Any = None
        self.replication: Any = None  # broker/replication.py, made in start()
        self.server_credentials: grpc.ServerCredentials | None = None
        self.clients: dict[str, dict[str, Any]] = {}
        self._clients_lock = threading.Lock()
        self.server: grpc.Server | None = None
        self.store: MessageStore
        self.advertised: tuple[str, int] = (self.listen_host, self.listen_port)
        self.started_at = time.monotonic()

    @property
    def endpoint(self) -> str:
        host, port = self.advertised
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def _authorize(self, context: grpc.ServicerContext, resource: str, action: str) -> None:
        """Called first by every RPC; a no-op unless ACL is configured."""
        if self.acl is not None:
            self.acl.authorize(dict(context.invocation_metadata()), resource, action)

    def _install_extensions(self) -> None:
        """Where the timer, ACL, TLS and metrics services are wired in from ``self.config``.

        Runs after the store is open and before the server starts; each part sets one of
        ``self.timer``, ``self.acl``, ``self.server_credentials`` (before binding, in start),
        ``self.metrics``. Each is built from ``self.config`` unless a caller set it already.
        """
        cfg = self.config
        if self.acl is None and cfg.acl_enable:
            from stratamq.broker.acl import AclChecker

            self.acl = AclChecker.from_config(cfg.acl_file, cfg.acl_access_key,
                                              cfg.acl_secret_key, cfg.acl_signature_window_sec)
        if (self.timer is None and cfg.timer_enable
                and self.store_config.broker_role is not BrokerRole.SLAVE):  # puts refused
            from stratamq.broker.timer import TimerMessageStore

            self.timer = TimerMessageStore(self.store,
                                           max_delay_ms=cfg.timer_max_delay_sec * 1000,
                                           flush_interval_ms=cfg.timer_flush_interval_ms)
            self.timer.start()
        if cfg.metrics_exporter_type == "PROM" and isinstance(self.metrics, NullMetrics):
            from stratamq.broker.metrics import BrokerMetrics, BrokerView

            def progress() -> Iterator[tuple[str, str, int, int]]:
                for group in self.meta.groups():
                    for row in self.engine.progress(group.name):
                        yield group.name, row["topic"], row["lag"], row["inflight"]

            def clients() -> list[tuple[str, str]]:
                cutoff = now_ms() - 60_000  # clients heartbeat every 10 s
                with self._clients_lock:
                    return [(c["type"], c["group"]) for c in self.clients.values()
                            if c["last_seen"] >= cutoff]

            view = BrokerView(progress, clients,
                              lambda: (len(self.meta.topics()), len(self.meta.groups())))
            self.metrics = BrokerMetrics(self.store, cluster=cfg.broker_cluster_name,
                                         node_id=cfg.broker_name, view=view, timer=self.timer)
            port = self.metrics.serve(cfg.metrics_host, cfg.metrics_port)
            log.info("Prometheus metrics on %s:%d/metrics", cfg.metrics_host, port)
        self.engine.on_dlq = self.metrics.on_dlq

    def _tls_credentials(self) -> grpc.ServerCredentials | None:
        """TLS from ``tls.server.*`` when ``tlsEnable``; TlsConfigError says what is wrong."""
        cfg = self.config
        if self.server_credentials is not None or not cfg.tls_enable:
            return self.server_credentials
        from stratamq.broker.tls import server_credentials

        return server_credentials(cfg.tls_server_cert_path, cfg.tls_server_key_path,
                                  cfg.tls_server_trust_cert_path,
                                  cfg.tls_server_need_client_auth)

    def _close_extensions(self) -> None:
        """Stop the timer (it puts to the store) and the metrics exporter before the store."""
        if self.timer is not None and hasattr(self.timer, "close"):
            self.timer.close()
        if hasattr(self.metrics, "close"):
            self.metrics.close()

    def start(self) -> str:
        cfg = self.config
        max_len = self.store_config.max_message_size + 1024 * 1024
        self.server = grpc.server(
            ThreadPoolExecutor(max_workers=cfg.grpc_thread_pool_nums,
                               thread_name_prefix="grpc-broker"),
            options=[("grpc.max_receive_message_length", max_len),
                     ("grpc.max_send_message_length", max_len),
                     ("grpc.so_reuseport", 0)])
        address = (f"[{self.listen_host}]:{self.listen_port}" if ":" in self.listen_host
                   else f"{self.listen_host}:{self.listen_port}")
        self.server_credentials = self._tls_credentials()
        try:
            if self.server_credentials is not None:
                port = self.server.add_secure_port(address, self.server_credentials)
            else:
                port = self.server.add_insecure_port(address)
        except RuntimeError as exc:
            raise OSError(f"cannot listen on {address}: {exc}") from None
        if not port:
            raise OSError(f"cannot listen on {address}")
        advertised = self.listen_host
        if advertised in ("0.0.0.0", "::", ""):
            advertised = self.store_config.broker_ip
        self.advertised = (advertised, port)
        # The store host in every record and offset message id is this broker's real endpoint.
        self.store_config = replace(self.store_config, listen_port=port)
        self.store = MessageStore(self.store_config).open()
        try:
            root = self.store_config.root
            self.meta = MetadataStore(root, cfg.default_retry_max_times)
            self.state = PopState(root / "config" / "popState", cfg.pop_state_sync_write)
            self.notifier = Notifier()
            self.engine = PopEngine(self.store, self.meta, self.state, self.notifier)
            self.store.reput.listeners.append(self.notifier.on_dispatch)
            self._install_extensions()
            from stratamq.broker.admin import admin_handler
            from stratamq.broker.replication import BrokerReplication, replication_handler

            self.replication = BrokerReplication(self)
            self.replication.start()
            self.server.add_generic_rpc_handlers((replication_handler(self),))

            service_pb2_grpc.add_MessagingServiceServicer_to_server(MessagingServicer(self),
                                                                    self.server)
            self.server.add_generic_rpc_handlers((admin_handler(self),))
            self.server.start()
        except BaseException:
            if self.replication is not None:
                self.replication.stop()
            self._close_extensions()
            self.store.close()
            raise
        log.info("broker %s serving on %s", cfg.broker_name, self.endpoint)
        return self.endpoint

    def stop(self, grace: float | None = None) -> bool:
        """Stop serving, then close the timer, metrics, pop state and store, each step run
        whatever the others did: a failing step must not leave the store unflushed with its
        ``abort`` marker behind.

        gRPC gets ``grace`` seconds to finish in-flight calls, then they are cancelled; if its
        shutdown still has not completed a few seconds later (a handler wedged in grpcio), the
        broker closes everything anyway. Returns False in that case: the caller should then
        end the process without waiting for gRPC's threads. Raises ``BrokerStopError`` naming
        every step that failed, after all of them ran."""
        if self.server is None:
            return True
        grace = self.config.shutdown_grace_seconds if grace is None else grace
        errors: list[tuple[str, BaseException]] = []
        stopped = True

        def step(name: str, action: Callable[[], object]) -> None:
            try:
                action()
            except BaseException as exc:  # every step runs; all failures are reported
                log.error("broker stop: %s failed: %s", name, exc)
                errors.append((name, exc))

        def stop_server() -> None:
            nonlocal stopped
            self.engine.closing = True
            self.notifier.wake_all()  # long polls answer now instead of holding the shutdown
            assert self.server is not None
            done = self.server.stop(grace)
            stopped = done.wait(grace + _SERVER_STOP_MARGIN_S)
            if not stopped:
                log.warning("gRPC did not stop within %.0f s; closing the store anyway",
                            grace + _SERVER_STOP_MARGIN_S)

        step("stopping the gRPC server", stop_server)
        self.server = None
        if self.replication is not None:
            step("stopping replication", self.replication.stop)
        step("closing the timer and metrics", self._close_extensions)
        step("closing the pop state", self.state.close)
        step("closing the store", self.store.close)
        if errors:
            raise BrokerStopError(errors)
        return stopped

    # -- clients --------------------------------------------------------------------------------

    def note_client(self, context: grpc.ServicerContext, group: str, client_type: str) -> None:
        md = dict(context.invocation_metadata())
        client_id = md.get("x-mq-client-id") or context.peer()
        with self._clients_lock:
            self.clients[client_id] = {"client_id": client_id, "group": group,
                                       "type": client_type, "peer": context.peer(),
                                       "last_seen": now_ms()}  # fmt: skip

    def forget_client(self, context: grpc.ServicerContext) -> None:
        md = dict(context.invocation_metadata())
        with self._clients_lock:
            self.clients.pop(md.get("x-mq-client-id") or context.peer(), None)

    def live_clients(self, group: str) -> list[dict[str, Any]]:
        cutoff = now_ms() - 60_000  # clients heartbeat every 10 s
        with self._clients_lock:
            return [c for c in self.clients.values()
                    if c["group"] == group and c["last_seen"] >= cutoff]

