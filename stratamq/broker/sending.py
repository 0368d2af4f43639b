"""``SendMessage``: entries checked and converted once, stored as one batch, answered per entry.

``SendService.prepare`` does what RocketMQ's ``SendMessageActivity`` does before anything is
stored: one topic per request, access, every entry converted and checked. A bad entry refuses
the whole request (nothing of it stored) with its own status on its entry and "not stored:
message i of this request is invalid" on the others: storing the good ones would leave them
stored but unacknowledged, and the client's retry would store them twice. A request that
passes becomes one list of store messages (DELAY ones already wrapped for the timer topic),
which the caller hands to the ``GroupWriter`` as one put; ``complete`` turns the writer's
per-entry results into the response and counts the stored messages in the metrics.

Queue choice: a message group picks its queue by hash (FIFO order per group), anything else
round-robin over the writable queues.

No gRPC and no waiting here. Thread-safety: any thread (the round-robin counter is an
``itertools.count``, atomic under the GIL).
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc

from stratamq.broker.clients import ok_status
from stratamq.broker.compaction_topics import route_by_key
from stratamq.broker.convert import (
    MAX_TIMESTAMP_SECONDS,
    MIN_TIMESTAMP_SECONDS,
    parse_born_host,
    to_store_message,
)
from stratamq.broker.engine import now_ms
from stratamq.broker.errors import BrokerError
from stratamq.broker.lookup import Lookup
from stratamq.broker.metadata import TopicConfig
from stratamq.broker.ports import Call
from stratamq.broker.transactions import recovery_duration
from stratamq.broker.validate import check_topic, put_status
from stratamq.broker.writer import EntryResult
from stratamq.message import Host, Message, Prop
from stratamq.record import tags_hash_code
from stratamq.store.results import PutMessageStatus
from stratamq.transactions.messages import half_message

__all__ = ["SendPlan", "SendService"]

Code = pb.Code
# Built once: the enum wrapper's values() and Name() build lists per call.
_OK = ok_status()  # copied into each entry (protobuf copies on assignment)
_OK_CODE = int(Code.OK)  # ``Code.X`` is a Python-level lookup per use
_TYPE_NAMES = {value: pb.MessageType.Name(value) for value in pb.MessageType.values()}
_PLAIN_TYPES = frozenset({int(pb.MESSAGE_TYPE_UNSPECIFIED), int(pb.NORMAL)})
_PLAIN_ENCODINGS = frozenset({int(pb.ENCODING_UNSPECIFIED), int(pb.IDENTITY)})
_UNIQ_KEY = Prop.UNIQ_KEY


@dataclass(slots=True)
class SendPlan:
    """A checked request: the messages to put (in entry order), or the answer already."""

    topic: TopicConfig
    message_ids: list[str]  # the clients' ids, answered back per entry
    messages: list[Message] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)  # body sizes, for the metrics
    response: svc.SendMessageResponse | None = None  # set when nothing is to be stored
    started: float = 0.0  # time.perf_counter() once checked: where the put's latency starts


class SendService:
    """Checks and converts sends, and answers them from the store's per-entry results.

    ``timer`` is the DELAY service (``hold(message, deliver_ms)``), None when off;
    ``metrics`` a callable giving the current metrics sink (``on_send``)."""

    def __init__(self, lookup: Lookup, max_message_size: int, timer: Any,
                 metrics: Callable[[], Any]) -> None:
        self.lookup = lookup
        self.max_message_size = max_message_size
        self.timer = timer
        self.metrics = metrics
        self._round_robin = itertools.count(random.randrange(1 << 16))
        self.plain_path = True  # off only in the test that compares it with ``_convert``

    def prepare(self, request: svc.SendMessageRequest, call: Call) -> SendPlan:
        """Check and convert every entry; raises BrokerError for a refused request as a whole
        (no message, mixed topics, access, unknown or unwritable topic)."""
        entries = request.messages  # each read of a repeated field builds a wrapper
        if not entries:
            raise BrokerError(Code.MESSAGE_CORRUPTED, "no message to send")
        topic_name = entries[0].topic.name
        check_topic(topic_name)
        if len(entries) > 1 and any(m.topic.name != topic_name for m in entries):
            raise BrokerError(Code.MESSAGE_CORRUPTED, "topic in message is not same")
        lookup = self.lookup
        if lookup.acl is not None:  # (the resource name is not built when access is open)
            lookup.authorize(call, f"Topic:{topic_name}", "Pub")
        topic = lookup.topic(topic_name, create=True)
        if not topic.perm & 2:
            raise BrokerError(Code.FORBIDDEN, f"topic {topic.name!r} is not writable")
        plan = SendPlan(topic, [], [], [])
        failures: list[tuple[int, BrokerError]] = []
        messages, sizes, message_ids = plan.messages, plan.sizes, plan.message_ids
        # The plain path: a NORMAL topic's entry with nothing but an id, a body and a born
        # host and time (what producers send most) becomes the Message ``_convert`` would
        # make, without its calls and second reads of each field (each read of a protobuf
        # field builds a Python object). Any other entry, or one a check would refuse, goes
        # through ``_convert``, which answers it as before. A test holds the two equal.
        plain = self.plain_path and topic.message_type == "NORMAL" and topic.compaction is None
        max_body = self.max_message_size
        writable = topic.write_queue_nums
        round_robin = self._round_robin
        for i, m in enumerate(entries):
            if plain:
                sp = m.system_properties
                body = m.body
                message_id = sp.message_id
                if (body and len(body) <= max_body and sp.message_type in _PLAIN_TYPES
                        and sp.body_encoding in _PLAIN_ENCODINGS and message_id.strip()
                        and not sp.tag and not sp.message_group and not len(sp.keys)
                        and not len(m.user_properties)
                        and not sp.HasField("delivery_timestamp")
                        and not sp.HasField("body_digest")):
                    born = None
                    if sp.HasField("born_timestamp"):
                        ts = sp.born_timestamp
                        seconds, nanos = ts.seconds, ts.nanos
                        if (MIN_TIMESTAMP_SECONDS <= seconds <= MAX_TIMESTAMP_SECONDS
                                and 0 <= nanos <= 999_999_999):
                            born = seconds * 1000 + nanos // 1_000_000
                    messages.append(Message(
                        topic_name, body, next(round_robin) % writable,
                        {_UNIQ_KEY: message_id}, 0, 0,
                        born if born is not None else int(time.time() * 1000),
                        parse_born_host(sp.born_host) or call.peer_host()))
                    sizes.append(len(body))
                    message_ids.append(message_id)
                    continue
            try:
                msg, size = self._convert(m, topic, call.peer_host())
            except BrokerError as exc:
                failures.append((i, exc))
                continue
            messages.append(msg)
            sizes.append(size)
            message_ids.append(msg.properties[_UNIQ_KEY])
        if failures:
            plan.messages.clear()
            first_index, first = failures[0]
            refused = dict(failures)
            entries = [svc.SendResultEntry(status=ok_status(refused[i].code, refused[i].message))
                       if i in refused else svc.SendResultEntry(status=ok_status(
                           first.code, f"not stored: message {first_index} of this request "
                           f"is invalid ({first.message})"))
                       for i in range(len(entries))]
            plan.response = svc.SendMessageResponse(status=ok_status(first.code, first.message),
                                                    entries=entries)
        plan.started = time.perf_counter()  # put latency: from here to the writer's answer
        return plan

    def _convert(self, m: pb.Message, topic: TopicConfig, peer: Host) -> tuple[Message, int]:
        """The store message for one entry (DELAY: the timer topic's record), checked, and
        its body size as sent."""
        msg, deliver_at, size = to_store_message(m, peer, self.max_message_size,
                                                 allow_empty_body=topic.compaction is not None)
        sp = m.system_properties
        declared = sp.message_type
        if declared == pb.MESSAGE_TYPE_UNSPECIFIED:
            declared = (pb.FIFO if sp.message_group else
                        pb.DELAY if deliver_at is not None else pb.NORMAL)
        declared_name = _TYPE_NAMES.get(declared)
        if declared_name is None:
            raise BrokerError(Code.BAD_REQUEST, f"unknown message type {declared}")
        if declared_name != topic.message_type:
            raise BrokerError(Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                              f"topic {topic.name!r} accepts {topic.message_type} messages, "
                              f"not {declared_name}")
        if topic.message_type == "FIFO" and not sp.message_group:
            raise BrokerError(Code.ILLEGAL_MESSAGE_GROUP, "a FIFO message needs a message group")
        if topic.message_type == "DELAY" and deliver_at is None:
            raise BrokerError(Code.ILLEGAL_DELIVERY_TIME, "a DELAY message needs a delivery time")
        writable = topic.write_queue_nums
        if topic.compaction is not None:
            route_by_key(topic, msg)  # every value of a key in one queue
        elif sp.message_group:
            # Java String.hashCode, as RocketMQ's selectors use: a group always lands on one
            # queue while the queue count stays the same.
            msg.queue_id = abs(tags_hash_code(sp.message_group)) % writable
        else:
            msg.queue_id = next(self._round_robin) % writable
        if topic.message_type == "TRANSACTION":
            if deliver_at is not None:
                raise BrokerError(Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                                  "a TRANSACTION message cannot have a delivery time")
            # Stored as RocketMQ's half message; the producer group is the topic, as the
            # proxy has it for gRPC producers.
            msg.properties.update(recovery_duration(sp))
            return half_message(msg, topic.name), size
        if deliver_at is not None and deliver_at > now_ms():
            if self.timer is None:
                raise BrokerError(Code.UNSUPPORTED,
                                  "DELAY messages need the timer service, which is not running "
                                  "on this broker (timerWheelEnable)")
            return self.timer.hold(msg, deliver_at), size
        return msg, size

    def complete(self, plan: SendPlan, results: list[EntryResult]) -> svc.SendMessageResponse:
        """The response for a stored plan, from the writer's per-entry results."""
        response = svc.SendMessageResponse()
        add = response.entries.add  # built in place: a measurable share of a 16-message send
        sizes: list[int] = []
        stored: list[int] = []  # their records' sizes (the Dashboard's TOPIC_PUT_SIZE)
        codes: set[int] = set()  # of the entries not stored (all stored: empty)
        first: pb.Status | None = None
        put_ok = PutMessageStatus.PUT_OK
        # A half message's transaction id is its message id (RocketMQ's broker answers the
        # unique id, which the proxy hands on).
        transactional = plan.topic.message_type == "TRANSACTION"
        for message_id, size, r in zip(plan.message_ids, plan.sizes, results, strict=True):
            appended = r.appended
            if r.status is put_ok and appended is not None:
                # (a status copied in: cheaper than one passed to ``add``, which is converted)
                entry = add(message_id=message_id, offset=appended.queue_offset)
                entry.status.CopyFrom(_OK)
                if transactional:
                    entry.transaction_id = message_id
                sizes.append(size)
                stored.append(appended.size)
                if first is None:
                    first = _OK
            else:
                code, text = put_status(r.status)
                status = ok_status(code, f"{text} ({r.error})" if r.error else text)
                add(status=status)
                codes.add(code)
                if first is None:
                    first = status
        if sizes:
            self.metrics().on_send(plan.topic.name, sizes, time.perf_counter() - plan.started,
                                   plan.topic.message_type, stored)
            if codes:
                codes.add(_OK_CODE)
        response.status.CopyFrom(first if len(codes) <= 1 and first is not None else ok_status(
            Code.MULTIPLE_RESULTS, "MULTIPLE_RESULTS"))
        return response
