"""Broker sends over remoting: ``SEND_MESSAGE``, ``SEND_MESSAGE_V2``, ``SEND_BATCH_MESSAGE``.

After RocketMQ's ``SendMessageProcessor``: the request header (``SendMessageRequestHeader``,
or V2's one-letter names) becomes a store ``Message`` with the properties, flag, sys flag
(a compressed body stays compressed, flagged, as RocketMQ stores it), born time and host the
producer sent; the topic is checked (and auto-created) through the same ``Lookup`` the gRPC
adapter uses and the messages go through the same ``GroupWriter``, so both protocols store
identical records. A ``DELAY`` level property (``messageDelayLevel``'s levels) is held by the
timer service, as a gRPC DELAY send is. The response header is ``SendMessageResponseHeader``:
``msgId`` (the offset message id), ``queueId``, ``queueOffset``.

Thread-safety: handlers on the broker's event loop.
"""

from __future__ import annotations

import random
import struct
import time
from collections.abc import Callable
from typing import Any

from stratamq.broker.errors import BrokerError
from stratamq.broker.lookup import Lookup
from stratamq.broker.ports import Call
from stratamq.broker.writer import EntryResult, GroupWriter
from stratamq.message import Host, Message, Prop
from stratamq.record.codec import decode_properties
from stratamq.remoting.codec import RemotingCommand
from stratamq.remoting.codes import ResponseCode
from stratamq.remoting.errors import RemotingError, error_response
from stratamq.remoting.transport import Connection
from stratamq.store.results import PutMessageStatus
from stratamq.transactions.messages import HALF_TOPIC, half_message

__all__ = ["SendHandlers", "decode_batch", "v2_to_v1"]


# SendMessageRequestHeaderV2's one-letter names (RocketMQ keeps them short on the wire).
_V2_NAMES = {"a": "producerGroup", "b": "topic", "c": "defaultTopic",
             "d": "defaultTopicQueueNums", "e": "queueId", "f": "sysFlag",
             "g": "bornTimestamp", "h": "flag", "i": "properties", "j": "reconsumeTimes",
             "k": "unitMode", "l": "maxReconsumeTimes", "m": "batch", "n": "brokerName"}

_PUT_CODES = {PutMessageStatus.PUT_OK: ResponseCode.SUCCESS,
              PutMessageStatus.FLUSH_DISK_TIMEOUT: ResponseCode.FLUSH_DISK_TIMEOUT,
              PutMessageStatus.FLUSH_SLAVE_TIMEOUT: ResponseCode.FLUSH_SLAVE_TIMEOUT,
              PutMessageStatus.SLAVE_NOT_AVAILABLE: ResponseCode.SLAVE_NOT_AVAILABLE,
              PutMessageStatus.MESSAGE_ILLEGAL: ResponseCode.MESSAGE_ILLEGAL,
              PutMessageStatus.PROPERTIES_SIZE_EXCEEDED: ResponseCode.MESSAGE_ILLEGAL,
              PutMessageStatus.SERVICE_NOT_AVAILABLE: ResponseCode.SERVICE_NOT_AVAILABLE,
              PutMessageStatus.OS_PAGE_CACHE_BUSY: ResponseCode.SYSTEM_BUSY}
_STORED = frozenset({PutMessageStatus.PUT_OK, PutMessageStatus.FLUSH_DISK_TIMEOUT,
                     PutMessageStatus.FLUSH_SLAVE_TIMEOUT,
                     PutMessageStatus.SLAVE_NOT_AVAILABLE})
_BATCH_HEAD = struct.Struct(">iiiii")  # total size, magic, body CRC, flag, body length


def v2_to_v1(fields: dict[str, str]) -> dict[str, str]:
    return {_V2_NAMES.get(k, k): v for k, v in fields.items()}


def _int(fields: dict[str, str], name: str, default: int | None = None) -> int:
    text = fields.get(name)
    if text is None or text == "":
        if default is None:
            raise RemotingError(ResponseCode.INVALID_PARAMETER, f"the header needs {name}")
        return default
    try:
        return int(text)
    except ValueError:
        raise RemotingError(ResponseCode.INVALID_PARAMETER,
                          f"header field {name} is not a number: {text!r}") from None


def _properties(text: str) -> dict[str, str]:
    return decode_properties(text.encode()) if text else {}


def decode_batch(body: bytes) -> list[tuple[int, bytes, dict[str, str]]]:
    """A batch body (RocketMQ's ``MessageDecoder.encodeMessages``): per message total size,
    magic, body CRC, flag, body length + body, int16 properties length + properties."""
    out: list[tuple[int, bytes, dict[str, str]]] = []
    pos = 0
    while pos < len(body):
        if pos + _BATCH_HEAD.size > len(body):
            raise RemotingError(ResponseCode.MESSAGE_ILLEGAL, "batch body cut short")
        size, _magic, _crc, flag, body_len = _BATCH_HEAD.unpack_from(body, pos)
        start = pos + _BATCH_HEAD.size
        if size < _BATCH_HEAD.size + 2 or pos + size > len(body) or body_len < 0 \
                or start + body_len + 2 > pos + size:
            raise RemotingError(ResponseCode.MESSAGE_ILLEGAL,
                              f"batch message at {pos}: sizes do not add up")
        payload = body[start:start + body_len]
        (props_len,) = struct.unpack_from(">h", body, start + body_len)
        props_at = start + body_len + 2
        if props_len < 0 or props_at + props_len > pos + size:
            raise RemotingError(ResponseCode.MESSAGE_ILLEGAL,
                              f"batch message at {pos}: properties run past it")
        out.append((flag, payload, decode_properties(body[props_at:props_at + props_len])))
        pos += size
    return out


class SendHandlers:
    """The send codes, over the lookups, the single writer and the timer (None: off)."""

    def __init__(self, lookup: Lookup, writer: GroupWriter, max_message_size: int,
                 timer: Any, call_of: Callable[[RemotingCommand, Connection], Call],
                 run: Callable[..., Any], delay_levels_ms: list[int],
                 metrics: Callable[[], Any] | None = None) -> None:
        self.lookup = lookup
        self.metrics = metrics  # the broker's metrics sink (on_send), as gRPC sends count
        self.delay_levels_ms = delay_levels_ms  # messageDelayLevel: level n waits [n - 1]
        self.writer = writer
        self.max_message_size = max_message_size
        self.timer = timer
        self.call_of = call_of
        self.run = run

    async def send(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        fields = request.ext_fields if request.code != 310 else v2_to_v1(request.ext_fields)
        try:
            # On the loop, as the gRPC adapter's SendService.prepare: CPU only (an executor
            # hop per send cost more than the checks).
            started = time.perf_counter()
            messages = self._prepare(request, fields, conn)
            results = await self._put(messages)
        except (BrokerError, RemotingError) as exc:
            return error_response(request, exc)
        self._count(fields.get("topic", ""), messages, results, started)
        return self._answer(request, messages, results)

    async def send_batch(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        fields = v2_to_v1(request.ext_fields)
        try:
            started = time.perf_counter()
            messages = self._prepare(request, fields, conn, True)
            results = await self._put(messages)
        except (BrokerError, RemotingError) as exc:
            return error_response(request, exc)
        self._count(fields.get("topic", ""), messages, results, started)
        return self._answer(request, messages, results)

    def _count(self, topic: str, messages: list[Message], results: list[EntryResult],
               started: float) -> None:
        if self.metrics is None:
            return
        stored = [(len(m.body), r.appended.size) for m, r in zip(messages, results, strict=True)
                  if r.ok and r.appended is not None]
        if stored:
            cfg = self.lookup.meta.topic(topic)
            self.metrics().on_send(topic, [body for body, _ in stored],
                                   time.perf_counter() - started,
                                   cfg.message_type if cfg is not None else "NORMAL",
                                   [size for _, size in stored])

    async def _put(self, messages: list[Message]) -> list[EntryResult]:
        """As the gRPC adapter puts: at once when this is the loop turn's first put and
        nothing waits after an append, else combined with the turn's others."""
        results = self.writer.put_now(messages)
        return results if results is not None else await self.writer.put_async(messages)

    def _prepare(self, request: RemotingCommand, fields: dict[str, str], conn: Connection,
                 batch: bool = False) -> list[Message]:
        call = self.call_of(request, conn)
        name = fields.get("topic", "")
        self.lookup.authorize(call, f"Topic:{name}", "Pub")
        # A topic the send creates (autoCreateTopicEnable) gets the queues the producer asks
        # for (defaultTopicQueueNums, 4 in 4.x producers) up to TBW102's, as RocketMQ's
        # createTopicInSendMessageMethod gives it.
        asked = _int(fields, "defaultTopicQueueNums", self.lookup.config.default_topic_queue_nums)
        topic = self.lookup.topic(name, create=True, queues=max(1, min(
            asked, self.lookup.config.default_topic_queue_nums)))
        if not topic.perm & 2:
            raise RemotingError(ResponseCode.NO_PERMISSION,
                              f"the topic[{name}] sending message is forbidden")
        qid = _int(fields, "queueId", -1)
        if qid >= topic.write_queue_nums:
            raise RemotingError(ResponseCode.SYSTEM_ERROR,
                              f"request queueId[{qid}] is illegal, topic {name} has "
                              f"{topic.write_queue_nums} write queues")
        if qid < 0:
            qid = random.randrange(topic.write_queue_nums)
        header_props = _properties(fields.get("properties", ""))
        entries = (decode_batch(request.body) if batch
                   else [(_int(fields, "flag", 0), request.body, header_props)])
        if not entries:
            raise RemotingError(ResponseCode.MESSAGE_ILLEGAL, "the batch holds no message")
        born = _int(fields, "bornTimestamp", int(time.time() * 1000))
        sys_flag = _int(fields, "sysFlag", 0)
        reconsume = _int(fields, "reconsumeTimes", 0)
        host = Host(conn.host, conn.port) if ":" not in conn.host else call.peer_host()
        out: list[Message] = []
        for flag, body, props in entries:
            if len(body) > self.max_message_size:
                raise RemotingError(ResponseCode.MESSAGE_ILLEGAL,
                                  f"the message body size over max value, MAX: "
                                  f"{self.max_message_size}")
            msg = Message(name, body, qid, props, flag, sys_flag, born, host, reconsume)
            # SendMessageProcessor: TRAN_MSG=true (Boolean.parseBoolean) makes a half message,
            # unless it is a retry's delayed resend; a batch cannot hold one (the CommitLog
            # refuses a batch with transaction bits).
            if props.get(Prop.TRANSACTION_PREPARED, "").lower() == "true" and not (
                    reconsume > 0 and props.get(Prop.DELAY_LEVEL, "0") not in ("", "0")):
                if batch:
                    raise RemotingError(ResponseCode.MESSAGE_ILLEGAL,
                                        "a batch cannot hold a transactional message")
                out.append(half_message(msg, fields.get("producerGroup", "")))
                continue
            out.append(self.delayed(msg))
        return out

    def delayed(self, msg: Message) -> Message:
        level_text = msg.properties.get(Prop.DELAY_LEVEL)
        if not level_text:
            return msg
        try:
            level = min(int(level_text), len(self.delay_levels_ms))
        except ValueError:
            raise RemotingError(ResponseCode.MESSAGE_ILLEGAL,
                              f"DELAY level {level_text!r} is not a number") from None
        if level <= 0:
            return msg
        if self.timer is None:
            raise RemotingError(ResponseCode.SERVICE_NOT_AVAILABLE,
                              "delay levels need the timer service (timerWheelEnable)")
        return self.timer.hold(msg, int(time.time() * 1000) + self.delay_levels_ms[level - 1])

    @staticmethod
    def _answer(request: RemotingCommand, messages: list[Message],
                results: list[EntryResult]) -> RemotingCommand:
        """(A half is stored in the half topic's queue 0, but RocketMQ answers the queue the
        producer's message is for.)"""
        failed = next((r for r in results if r.status not in _STORED), None)
        if failed is not None:
            code = _PUT_CODES.get(failed.status, ResponseCode.SYSTEM_ERROR)
            return request.response(code, f"{failed.status.value} {failed.error}".strip())
        status = next((r.status for r in results if r.status is not PutMessageStatus.PUT_OK),
                      PutMessageStatus.PUT_OK)
        first = results[0].appended
        assert first is not None
        ids = ",".join(r.appended.msg_id for r in results if r.appended is not None)
        qid = (int(messages[0].properties[Prop.REAL_QUEUE_ID])
               if messages[0].topic == HALF_TOPIC else messages[0].queue_id)
        header = {"msgId": ids, "queueId": str(qid),
                  "queueOffset": str(first.queue_offset), "MSG_REGION": "DefaultRegion",
                  "TRACE_ON": "true"}
        return request.response(_PUT_CODES[status], None, header)
