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
import hmac
import re
import time
import zlib
from functools import lru_cache
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp
from rocketmq.grpc_protocol import definition_pb2 as pb

from stratamq.broker.errors import BrokerError
from stratamq.broker.validate import (
    MAX_MESSAGE_GROUP_SIZE,
    MAX_USER_PROPERTY_SIZE,
    USER_PROPERTY_MAX_NUM,
    body_checksum,
    check_body_digest,
    has_control_character,
)
from stratamq.message import Host, Message, Prop, StoredMessage
from stratamq.record.layout import SysFlag

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


# A broker sees few distinct producer addresses; parsing one (``ipaddress``) was a visible
# share of a send of small messages.
@lru_cache(maxsize=4096)
def parse_born_host(text: str) -> Host | None:
    """The producer's address as a record stores it (port 0), None if it is no address."""
    try:
        return Host.parse(f"{text}:0" if ":" not in text else f"[{text}]:0")._replace(port=0)
    except ValueError:
        return None


def to_store_message(m: pb.Message, peer: Host, max_body: int, *,
                     allow_empty_body: bool = False) -> tuple[Message, int | None, int]:
    """The store message for a SendMessage entry, its delivery time (ms) if it has one, and
    the size of the body as sent (before a GZIP body is inflated). ``allow_empty_body``: a
    compaction topic's tombstone (a key with an empty body).

    Raises BrokerError with the status RocketMQ's proxy answers for each bad field, checked in
    the proxy's order (SendMessageActivity.buildMessage / buildMessageProperty). Nothing here
    writes: the servicer converts every entry of a request before it stores any.
    """
    # Each field is read once: every read of a protobuf field builds a new Python object (and
    # copies a bytes field), and this runs for every message a broker stores.
    sp = m.system_properties
    topic = m.topic.name
    if not topic:
        raise BrokerError(Code.ILLEGAL_TOPIC, "message has no topic")
    body = m.body
    if not body and not allow_empty_body:
        raise BrokerError(Code.MESSAGE_BODY_EMPTY, "message body cannot be empty")
    if len(body) > max_body:
        raise BrokerError(Code.MESSAGE_BODY_TOO_LARGE,
                          f"message body cannot exceed the max {max_body}")
    if sp.HasField("body_digest"):
        check_body_digest(sp.body_digest, body)
    tag = sp.tag
    sp_keys = sp.keys
    keys = list(sp_keys) if len(sp_keys) else []
    user_properties = m.user_properties
    # Most messages carry no user property, tag or key: nothing to check then.
    props = (_user_properties(user_properties, tag, keys)
             if tag or keys or len(user_properties) else {})
    if tag:  # an empty tag is no tag, as the proxy has it
        props[Prop.TAGS] = tag
    if keys:
        # Stored space-separated in KEYS (RocketMQ's MessageConst.KEY_SEPARATOR), so a space
        # inside a key would split it in two.
        if any(" " in k for k in keys):
            raise BrokerError(Code.ILLEGAL_MESSAGE_KEY, "key cannot contain a space")
        props[Prop.KEYS] = " ".join(k for k in keys if k)
    message_id = sp.message_id
    if not message_id.strip():
        raise BrokerError(Code.ILLEGAL_MESSAGE_ID, "message id cannot be empty")
    props[Prop.UNIQ_KEY] = message_id
    deliver_at = None
    if sp.HasField("delivery_timestamp"):
        deliver_at = valid_timestamp_ms(sp.delivery_timestamp)
        if deliver_at is None:
            raise BrokerError(Code.ILLEGAL_DELIVERY_TIME,
                              f"delivery timestamp {sp.delivery_timestamp.seconds}s is not a "
                              "valid time")
        props[Prop.TIMER_DELIVER_MS] = str(deliver_at)
    group = sp.message_group
    if group:
        _check_message_group(group)
        props[Prop.MESSAGE_GROUP] = group
    # The proxy ignores a born timestamp outside protobuf's valid range (Timestamps.isValid);
    # the store time then stands in for it, as it does for a message sent with none.
    born = valid_timestamp_ms(sp.born_timestamp) if sp.HasField("born_timestamp") else None
    encoding = sp.body_encoding
    if encoding == pb.GZIP:
        # Stored inflated: consumers get IDENTITY bodies, whatever encoding the producer chose.
        body = inflate_gzip(body, max_body)
    elif encoding != pb.IDENTITY and encoding != pb.ENCODING_UNSPECIFIED:
        raise BrokerError(Code.BAD_REQUEST, f"unknown body encoding {encoding}")
    msg = Message(topic, body, 0, props, 0, 0,
                  born if born is not None else int(time.time() * 1000),
                  parse_born_host(sp.born_host) or peer)
    return msg, deliver_at, len(m.body) if encoding == pb.GZIP else len(body)


def _user_properties(user_properties: Any, tag: str, keys: list[str]) -> dict[str, str]:
    """User properties (a message's protobuf map), tag and keys checked as
    buildMessageProperty does, in its order."""
    if len(user_properties) > USER_PROPERTY_MAX_NUM:
        raise BrokerError(Code.MESSAGE_PROPERTIES_TOO_LARGE,
                          f"too many user properties, max is {USER_PROPERTY_MAX_NUM}")
    size = 0
    props: dict[str, str] = {}
    # ``items()`` of a protobuf map goes through the generic Mapping mixin (slow per call);
    # most messages carry no user property at all.
    for key, value in (user_properties.items() if len(user_properties) else ()):
        if key in SYSTEM_PROPERTIES:
            raise BrokerError(Code.ILLEGAL_MESSAGE_PROPERTY_KEY,
                              f"property is used by system: {key}")
        if not key:
            # The store's property encoding cannot hold an empty name.
            raise BrokerError(Code.ILLEGAL_MESSAGE_PROPERTY_KEY, "the key of property is empty")
        if has_control_character(key):
            raise BrokerError(Code.ILLEGAL_MESSAGE_PROPERTY_KEY,
                              "the key of property cannot contain control character")
        if has_control_character(value):
            raise BrokerError(Code.ILLEGAL_MESSAGE_PROPERTY_KEY,
                              "the value of property cannot contain control character")
        size += len(key.encode()) + len(value.encode())
        props[key] = value
    if tag:
        if not tag.strip():
            raise BrokerError(Code.ILLEGAL_MESSAGE_TAG,
                              "tag cannot be the char sequence of whitespace")
        if "|" in tag:
            raise BrokerError(Code.ILLEGAL_MESSAGE_TAG, "tag cannot contain '|'")
        if has_control_character(tag):
            raise BrokerError(Code.ILLEGAL_MESSAGE_TAG, "tag cannot contain control character")
    size += len(tag.encode())
    for key in keys:
        if key and not key.strip():
            raise BrokerError(Code.ILLEGAL_MESSAGE_KEY,
                              "key cannot be the char sequence of whitespace")
        if has_control_character(key):
            raise BrokerError(Code.ILLEGAL_MESSAGE_KEY, "key cannot contain control character")
        size += len(key.encode())
    if size > MAX_USER_PROPERTY_SIZE:
        raise BrokerError(Code.MESSAGE_PROPERTIES_TOO_LARGE,
                          f"the total size of user property is too large, max is "
                          f"{MAX_USER_PROPERTY_SIZE}")
    return props


def _check_message_group(group: str) -> None:
    if not group.strip():
        raise BrokerError(Code.ILLEGAL_MESSAGE_GROUP,
                          "message group cannot be the char sequence of whitespace")
    if len(group.encode()) >= MAX_MESSAGE_GROUP_SIZE:
        raise BrokerError(Code.ILLEGAL_MESSAGE_GROUP,
                          f"message group exceed the max size {MAX_MESSAGE_GROUP_SIZE}")
    if has_control_character(group):
        raise BrokerError(Code.ILLEGAL_MESSAGE_GROUP,
                          "message group cannot contain control character")


# protobuf's Timestamp range (Timestamps.isValid): 0001-01-01 to 9999-12-31.
MIN_TIMESTAMP_SECONDS, MAX_TIMESTAMP_SECONDS = -62_135_596_800, 253_402_300_799


def valid_timestamp_ms(ts: Timestamp) -> int | None:
    """Milliseconds since the epoch, or None for a Timestamp outside protobuf's range."""
    if not (MIN_TIMESTAMP_SECONDS <= ts.seconds <= MAX_TIMESTAMP_SECONDS
            and 0 <= ts.nanos <= 999_999_999):
        return None
    return _ms(ts)


def inflate_gzip(data: bytes, limit: int) -> bytes:
    """Inflate a gzip body (one member or several, as ``gzip.decompress`` accepts), stopping
    as soon as the output passes ``limit``: a small bomb must not cost the broker gigabytes
    before it is refused."""
    out: list[bytes] = []
    total = 0
    rest = data
    try:
        while rest:
            inflater = zlib.decompressobj(wbits=31)  # gzip framing, CRC and size checked
            chunk = inflater.decompress(rest, limit + 1 - total)
            total += len(chunk)
            out.append(chunk)
            if total > limit or inflater.unconsumed_tail:
                raise BrokerError(Code.MESSAGE_BODY_TOO_LARGE,
                                  f"message body inflates to more than maxMessageSize {limit}")
            if not inflater.eof:
                raise BrokerError(Code.MESSAGE_CORRUPTED, "GZIP body does not inflate: "
                                  "truncated stream")
            rest = inflater.unused_data.lstrip(b"\0")  # gzip allows zero padding after members
    except zlib.error as exc:
        raise BrokerError(Code.MESSAGE_CORRUPTED, f"GZIP body does not inflate: {exc}") from None
    return b"".join(out)


def message_id_of(msg: StoredMessage) -> str:
    return msg.properties.get(Prop.UNIQ_KEY) or msg.msg_id


# Built once: the enum wrapper's Value() is a Python-level lookup per call.
_PB_MESSAGE_TYPES = {name: pb.MessageType.Value(name)
                     for name in ("NORMAL", "FIFO", "DELAY", "TRANSACTION")}


@lru_cache(maxsize=1024)
def _host_text(host: Host) -> str:
    return str(host)  # a broker sees few store hosts: one string each, not one per message


def to_pb_message(msg: StoredMessage, *, message_type: str, topic: str | None = None,
                  receipt: str | None = None, attempt: int | None = None,
                  invisible_ms: int | None = None, out: pb.Message | None = None
                  ) -> pb.Message:
    """A stored record as the client expects it; the body is byte-identical to what was sent.

    Filled into ``out`` (an empty message, e.g. a response's field) when given, else into a
    new message. Runs for every message a consumer receives: fields are set in place rather
    than built as messages of their own and copied in."""
    body = msg.body
    if msg.sys_flag & SysFlag.COMPRESSED or type(body) is not bytes:
        body = msg.decompressed_body()
    if out is None:
        out = pb.Message()
    out.topic.name = topic or msg.topic
    out.body = body
    props = msg.properties
    user = [item for item in props.items() if item[0] not in SYSTEM_PROPERTIES]
    if user:
        out.user_properties.update(user)
    sp = out.system_properties
    tag = props.get(Prop.TAGS)
    if tag is not None:
        sp.tag = tag
    keys = props.get(Prop.KEYS)
    if keys:
        sp.keys.extend(keys.split())
    sp.message_id = props.get(Prop.UNIQ_KEY) or msg.msg_id
    digest = sp.body_digest
    digest.type = pb.MD5
    digest.checksum = body_checksum(body)
    sp.body_encoding = pb.IDENTITY
    sp.message_type = _PB_MESSAGE_TYPES.get(message_type, pb.NORMAL)
    ms = msg.born_timestamp
    ts = sp.born_timestamp
    ts.seconds, ts.nanos = ms // 1000, (ms % 1000) * 1_000_000
    sp.born_host = msg.born_host.ip
    ms = msg.store_timestamp
    ts = sp.store_timestamp
    ts.seconds, ts.nanos = ms // 1000, (ms % 1000) * 1_000_000
    sp.store_host = _host_text(msg.store_host)
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
        duration = sp.invisible_duration  # Duration.FromMilliseconds is Python, per message
        duration.seconds, duration.nanos = invisible_ms // 1000, (invisible_ms % 1000) * 1_000_000
    if DLQ_ORIGIN_TOPIC in props:
        sp.dead_letter_queue.topic = props[DLQ_ORIGIN_TOPIC]
        sp.dead_letter_queue.message_id = props.get(DLQ_ORIGIN_MESSAGE_ID, "")
    return out


class Receipt:
    """A receipt handle: ``<queue_id>_<queue_offset>_<generation>_<visible_at_ms>_<mac>``.

    The group and topic come with every request that carries a handle, so they are not repeated
    here. ``generation`` identifies one delivery (or one invisible-time change); a handle whose
    generation is no longer current belongs to a delivery that was superseded. ``mac`` is a
    truncated HMAC-SHA256 of the rest, the group and the topic under the broker's persistent
    receipt key: a handle the broker did not issue, for this group and topic, is refused as
    INVALID_RECEIPT_HANDLE instead of being acked as "already acked".
    """

    __slots__ = ("queue_id", "offset", "generation", "visible_at")

    def __init__(self, queue_id: int, offset: int, generation: int, visible_at: int) -> None:
        self.queue_id = queue_id
        self.offset = offset
        self.generation = generation
        self.visible_at = visible_at

    def _fields(self) -> str:
        return f"{self.queue_id}_{self.offset}_{self.generation}_{self.visible_at}"

    def encode(self, key: bytes, group: str, topic: str) -> str:
        fields = self._fields()
        return f"{fields}_{_mac(key, group, topic, fields)}"

    @classmethod
    def decode(cls, text: str, key: bytes, group: str, topic: str) -> Receipt:
        match = _HANDLE.fullmatch(text)
        if match is None:
            raise BrokerError(Code.INVALID_RECEIPT_HANDLE,
                              f"malformed receipt handle {text[:80]!r}")
        qid_text, off_text, gen_text, vis_text, mac = match.groups()
        qid, off, gen, vis = int(qid_text), int(off_text), int(gen_text), int(vis_text)
        fields = text[:-17]  # all but "_<16 hex digits of MAC>"
        if (qid > _MAX_I32 or max(off, gen, vis) > _MAX_I64
                or not hmac.compare_digest(mac, _mac(key, group, topic, fields))):
            raise BrokerError(Code.INVALID_RECEIPT_HANDLE,
                              f"receipt handle {text[:80]!r} was not issued by this broker for "
                              f"group {group!r} and topic {topic!r}")
        return cls(qid, off, gen, vis)


# ASCII digits only (``int`` would take full-width digits, signs, spaces and underscores), no
# leading zeros, and a 16-hex-digit MAC.
_NUMBER = "(0|[1-9][0-9]{0,18})"
_HANDLE = re.compile("_".join([_NUMBER] * 4) + "_([0-9a-f]{16})", re.ASCII)
_MAX_I32, _MAX_I64 = (1 << 31) - 1, (1 << 63) - 1


# Per (key, group, topic), an HMAC already fed "group\0topic\0": a handle's MAC is a copy of
# it plus the fields (half the cost of keying a new HMAC for every handle made or checked).
# Only pairs a request named and the lookup accepted get here; cleared if it ever grows large.
_MAC_BASES: dict[tuple[bytes, str, str], hmac.HMAC] = {}


def _mac(key: bytes, group: str, topic: str, fields: str) -> str:
    base = _MAC_BASES.get((key, group, topic))
    if base is None:
        if len(_MAC_BASES) >= 4096:
            _MAC_BASES.clear()
        base = _MAC_BASES[(key, group, topic)] = hmac.new(key, f"{group}\0{topic}\0".encode(),
                                                          "sha256")
    mac = base.copy()
    mac.update(fields.encode())
    return mac.hexdigest()[:16]
