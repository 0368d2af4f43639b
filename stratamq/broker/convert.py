"""Protocol <-> store conversion, free of I/O: what a client's message becomes in the CommitLog
and what a stored record becomes on the wire, plus receipt handles.

Properties are stored exactly as Apache RocketMQ's proxy stores them (``MessageConst`` names):
the client's message id as ``UNIQ_KEY``, the tag as ``TAGS``, keys space-separated in ``KEYS``,
the FIFO message group as ``__SHARDINGKEY``, a delivery time as ``TIMER_DELIVER_MS``, and user
properties under their own names; so the index finds a message by key or client id and a
RocketMQ consumer reading the same store sees the same message.
"""

from __future__ import annotations

import contextlib
import gzip
import zlib

from google.protobuf.timestamp_pb2 import Timestamp
from rocketmq.grpc_protocol import definition_pb2 as pb

from stratamq.broker.errors import BrokerError
from stratamq.message import Host, Message, Prop, StoredMessage

Code = pb.Code

__all__ = ["Receipt", "to_store_message", "to_pb_message", "SYSTEM_PROPERTIES"]

# Properties RocketMQ reserves (MessageConst.STRING_HASH_SET, the ones a 5.x client can reach).
SYSTEM_PROPERTIES = frozenset({
    Prop.KEYS, Prop.TAGS, Prop.UNIQ_KEY, Prop.WAIT_STORE_MSG_OK, Prop.DELAY_LEVEL,
    Prop.TIMER_DELIVER_MS, Prop.REAL_TOPIC, Prop.REAL_QUEUE_ID, Prop.TRANSACTION_PREPARED,
    Prop.PRODUCER_GROUP, Prop.MESSAGE_GROUP, Prop.CLUSTER, "MIN_OFFSET", "MAX_OFFSET",
    "RETRY_TOPIC", "ORIGIN_MESSAGE_ID", "RECONSUME_TIME", "MAX_RECONSUME_TIMES",
    "DLQ_ORIGIN_TOPIC", "DLQ_ORIGIN_MESSAGE_ID", "TIMER_DELAY_SEC", "TIMER_DELAY_MS",
    "TIMER_OUT_MS", "TRACE_ON", "MSG_REGION", "POP_CK", "1ST_POP_TIME", "CONSUME_START_TIME",
    "TRAN_PREPARED_QUEUE_OFFSET", "TRANSACTION_CHECK_TIMES", "CHECK_IMMUNITY_TIME_IN_SECONDS",
    "INNER_NUM", "INNER_MULTI_QUEUE_OFFSET", "__STARTDELIVERTIME", "BORN_HOST",
})  # fmt: skip
DLQ_ORIGIN_TOPIC = "DLQ_ORIGIN_TOPIC"
DLQ_ORIGIN_MESSAGE_ID = "DLQ_ORIGIN_MESSAGE_ID"


def _ms(ts: Timestamp) -> int:
    return ts.seconds * 1000 + ts.nanos // 1_000_000


def _ts(ms: int) -> Timestamp:
    return Timestamp(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def _born_host(text: str, peer: Host) -> Host:
    try:
        return Host.parse(f"{text}:0" if ":" not in text else f"[{text}]:0")._replace(port=0)
    except ValueError:
        return peer


def to_store_message(m: pb.Message, peer: Host, max_body: int) -> tuple[Message, int | None]:
    """The store message for a SendMessage entry, and its delivery time (ms) if it has one.

    Raises BrokerError with the status RocketMQ's proxy answers for each bad field.
    """
    sp = m.system_properties
    if not m.topic.name:
        raise BrokerError(Code.ILLEGAL_TOPIC, "message has no topic")
    if not m.body:
        raise BrokerError(Code.MESSAGE_BODY_EMPTY, "message body is empty")
    if len(m.body) > max_body:
        raise BrokerError(Code.MESSAGE_BODY_TOO_LARGE,
                          f"message body is {len(m.body)} bytes, more than maxMessageSize "
                          f"{max_body}")
    if not sp.message_id:
        raise BrokerError(Code.ILLEGAL_MESSAGE_ID, "message has no message_id")
    props: dict[str, str] = {}
    for key, value in m.user_properties.items():
        if key in SYSTEM_PROPERTIES:
            raise BrokerError(Code.ILLEGAL_MESSAGE_PROPERTY_KEY,
                              f"user property {key!r} is reserved by the system")
        if not key or "\x01" in key or "\x02" in key or "\x01" in value or "\x02" in value:
            raise BrokerError(Code.ILLEGAL_MESSAGE_PROPERTY_KEY,
                              f"user property {key!r} has an empty name or a control character")
        props[key] = value
    if sp.HasField("tag"):
        if not sp.tag.strip() or "|" in sp.tag:
            raise BrokerError(Code.ILLEGAL_MESSAGE_TAG, f"illegal tag {sp.tag!r}")
        props[Prop.TAGS] = sp.tag
    if sp.keys:
        if any(not k.strip() or " " in k for k in sp.keys):
            raise BrokerError(Code.ILLEGAL_MESSAGE_KEY, "a key is empty or contains a space")
        props[Prop.KEYS] = " ".join(sp.keys)
    props[Prop.UNIQ_KEY] = sp.message_id
    if sp.HasField("message_group"):
        if not sp.message_group.strip():
            raise BrokerError(Code.ILLEGAL_MESSAGE_GROUP, "message group is blank")
        props[Prop.MESSAGE_GROUP] = sp.message_group
    deliver_at = None
    if sp.HasField("delivery_timestamp"):
        deliver_at = _ms(sp.delivery_timestamp)
        props[Prop.TIMER_DELIVER_MS] = str(deliver_at)
    born = _ms(sp.born_timestamp) if sp.HasField("born_timestamp") else 0
    body = bytes(m.body)
    if sp.body_encoding == pb.GZIP:
        # Stored inflated: consumers get IDENTITY bodies, whatever encoding the producer chose.
        try:
            body = gzip.decompress(body)
        except (OSError, EOFError, zlib.error) as exc:
            raise BrokerError(Code.MESSAGE_CORRUPTED,
                              f"GZIP body does not inflate: {exc}") from None
        if len(body) > max_body:
            raise BrokerError(Code.MESSAGE_BODY_TOO_LARGE, "inflated body exceeds maxMessageSize")
    msg = Message(m.topic.name, body, properties=props, born_timestamp=born,
                  born_host=_born_host(sp.born_host, peer))
    return msg, deliver_at


def message_id_of(msg: StoredMessage) -> str:
    return msg.properties.get(Prop.UNIQ_KEY) or msg.msg_id


def to_pb_message(msg: StoredMessage, *, message_type: str, topic: str | None = None,
                  receipt: str | None = None, attempt: int | None = None,
                  invisible_ms: int | None = None) -> pb.Message:
    """A stored record as the client expects it; the body is byte-identical to what was sent."""
    body = msg.decompressed_body()
    out = pb.Message()
    out.topic.name = topic or msg.topic
    out.body = body
    props = msg.properties
    for key, value in props.items():
        if key not in SYSTEM_PROPERTIES:
            out.user_properties[key] = value
    sp = out.system_properties
    if Prop.TAGS in props:
        sp.tag = props[Prop.TAGS]
    sp.keys.extend(msg.keys)
    sp.message_id = message_id_of(msg)
    sp.body_digest.type = pb.CRC32
    sp.body_digest.checksum = f"{zlib.crc32(body) & 0xFFFFFFFF:08X}"
    sp.body_encoding = pb.IDENTITY
    sp.message_type = pb.MessageType.Value(message_type) if message_type in (
        "NORMAL", "FIFO", "DELAY", "TRANSACTION") else pb.NORMAL
    sp.born_timestamp.CopyFrom(_ts(msg.born_timestamp))
    sp.born_host = msg.born_host.ip
    sp.store_timestamp.CopyFrom(_ts(msg.store_timestamp))
    sp.store_host = str(msg.store_host)
    sp.queue_id = msg.queue_id
    sp.queue_offset = msg.queue_offset
    if Prop.MESSAGE_GROUP in props:
        sp.message_group = props[Prop.MESSAGE_GROUP]
    if Prop.TIMER_DELIVER_MS in props:
        with contextlib.suppress(ValueError):  # a foreign writer's garbage: leave it unset
            sp.delivery_timestamp.CopyFrom(_ts(int(props[Prop.TIMER_DELIVER_MS])))
    if receipt is not None:
        sp.receipt_handle = receipt
    if attempt is not None:
        sp.delivery_attempt = attempt
    if invisible_ms is not None:
        sp.invisible_duration.FromMilliseconds(invisible_ms)
    if DLQ_ORIGIN_TOPIC in props:
        sp.dead_letter_queue.topic = props[DLQ_ORIGIN_TOPIC]
        sp.dead_letter_queue.message_id = props.get(DLQ_ORIGIN_MESSAGE_ID, "")
    return out


class Receipt:
    """A receipt handle: ``<queue_id>_<queue_offset>_<generation>_<visible_at_ms>``.

    The group and topic come with every request that carries a handle, so they are not repeated
    here. ``generation`` identifies one delivery (or one invisible-time change); a handle whose
    generation is no longer current belongs to a delivery that was superseded.
    """

    __slots__ = ("queue_id", "offset", "generation", "visible_at")

    def __init__(self, queue_id: int, offset: int, generation: int, visible_at: int) -> None:
        self.queue_id = queue_id
        self.offset = offset
        self.generation = generation
        self.visible_at = visible_at

    def encode(self) -> str:
        return f"{self.queue_id}_{self.offset}_{self.generation}_{self.visible_at}"

    @classmethod
    def decode(cls, text: str) -> Receipt:
        parts = text.split("_")
        try:
            if len(parts) != 4:
                raise ValueError
            qid, off, gen, vis = (int(p) for p in parts)
            if qid < 0 or off < 0:
                raise ValueError
        except ValueError:
            raise BrokerError(Code.INVALID_RECEIPT_HANDLE,
                              f"malformed receipt handle {text[:80]!r}") from None
        return cls(qid, off, gen, vis)
