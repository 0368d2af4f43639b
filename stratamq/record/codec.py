"""The CommitLog record codec: encode and stamp records, and the small codecs RocketMQ defines
beside them (body CRC, tags hash, properties, offset message ids); checking and decoding
records is in ``decoding.py``.

Spec: ``docs/formats/commitlog-record.md`` (taken from seed 004 and checked byte for byte against
the store Apache RocketMQ 5.3 wrote in ``tests/data``). Everything else in StrataMQ goes through
this package; nothing else slices record bytes. No I/O, no locks: callers hand it buffers.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, NamedTuple

from stratamq.javahash import java_string_hash
from stratamq.message import (
    Host,
    Message,
    MessageIllegal,
    PropertiesTooLarge,
    _ip_text,
    _pack_ip,
)
from stratamq.record.layout import (
    _LAYOUTS,
    _POSITIONS,
    _SHORT,
    _SIZE_MAGIC,
    _TIMESTAMP,
    BLANK_MAGIC_CODE,
    MAX_PROPERTIES_LENGTH,
    MAX_TOPIC_LENGTH_V1,
    MAX_TOPIC_LENGTH_V2,
    MESSAGE_MAGIC_CODE_V1,
    MESSAGE_MAGIC_CODE_V2,
    NAME_VALUE_SEPARATOR,
    PROPERTY_SEPARATOR,
    QUEUE_OFFSET_POS,
    SysFlag,
)

if TYPE_CHECKING:
    import mmap

    # What records are read from: bytes, a view of a segment, or the segment's map itself.
    Buffer = bytes | bytearray | memoryview | mmap.mmap

try:  # ISA-L's CRC-32 (same polynomial and values as zlib's) is ~5x faster on 1 KiB bodies
    from isal.isal_zlib import crc32 as _crc32
except ImportError:  # optional: zlib gives the same results, only slower
    from zlib import crc32 as _crc32


# ---------------------------------------------------------------------------------------------
# Small codecs RocketMQ defines alongside the record.


def body_crc(body: bytes | bytearray | memoryview) -> int:
    """CRC32 of the stored body as RocketMQ keeps it: masked to 31 bits (``UtilAll.crc32``)."""
    return _crc32(body) & 0x7FFFFFFF


@lru_cache(maxsize=4096)
def tags_hash_code(tags: str | None) -> int:
    """Java's ``String.hashCode`` of the tags: the ConsumeQueue's filter code (0 for no tags)."""
    return java_string_hash(tags) if tags else 0


def encode_properties(properties: Mapping[str, str]) -> bytes:
    """``key\x01value\x02`` for every pair, as RocketMQ's ``messageProperties2String``."""
    if not properties:
        return b""
    text = "".join([f"{key}\x01{value}\x02" for key, value in properties.items()])
    count = len(properties)
    # One pass each instead of checking every name and value: a separator inside a name or a
    # value shows up as an extra separator.
    if text.count(NAME_VALUE_SEPARATOR) != count or text.count(PROPERTY_SEPARATOR) != count:
        bad = next(k for k, v in properties.items()
                   if any(sep in f"{k}{v}" for sep in (NAME_VALUE_SEPARATOR, PROPERTY_SEPARATOR)))
        raise MessageIllegal(f"property {bad!r} contains a reserved separator (\\x01/\\x02)")
    if "" in properties:
        raise MessageIllegal("a property name is empty")
    return text.encode("utf-8")


def decode_properties(raw: bytes | bytearray | memoryview) -> dict[str, str]:
    if not raw:
        return {}
    text = bytes(raw).decode("utf-8", "replace")
    try:
        return dict(item.split(NAME_VALUE_SEPARATOR, 1) for item in text.split(PROPERTY_SEPARATOR)
                    if item)
    except ValueError:  # a pair without a name/value separator: keep the well-formed ones
        result: dict[str, str] = {}
        for item in text.split(PROPERTY_SEPARATOR):
            key, sep, value = item.partition(NAME_VALUE_SEPARATOR)
            if sep:
                result[key] = value
        return result


def offset_msg_id(store_host: Host, physical_offset: int) -> str:
    """RocketMQ's offset message id: hex of store ip, port (i32) and physical offset (i64)."""
    raw = store_host.packed() + struct.pack(">iq", store_host.port, physical_offset)
    return raw.hex().upper()


def parse_offset_msg_id(msg_id: str) -> tuple[Host, int]:
    """Inverse of :func:`offset_msg_id`; raises ValueError on anything else."""
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError as exc:
        raise ValueError(f"offset message id is not hex: {msg_id!r}") from exc
    if len(raw) not in (16, 28):
        raise ValueError(f"offset message id has {len(raw)} bytes, want 16 (IPv4) or 28 (IPv6)")
    ip_len = len(raw) - 12
    port, offset = struct.unpack_from(">iq", raw, ip_len)
    return Host(_ip_text(raw[:ip_len]), port), offset


def decompress_body(body: bytes | memoryview, sys_flag: int) -> bytes:
    """The body as its producer sent it: compressed bodies are inflated per the sys_flag."""
    if not sys_flag & SysFlag.COMPRESSED:
        return bytes(body)
    kind = sys_flag & SysFlag.COMPRESSION_MASK
    if kind in (0, SysFlag.COMPRESSION_ZLIB):  # 0: written before the type bits existed
        return zlib.decompress(body)
    if kind == SysFlag.COMPRESSION_ZSTD:
        import zstandard

        return zstandard.ZstdDecompressor().decompressobj().decompress(bytes(body))
    if kind == SysFlag.COMPRESSION_LZ4:
        import lz4.frame

        return lz4.frame.decompress(bytes(body))
    raise ValueError(f"unknown compression type bits {kind >> 8} in sys_flag {sys_flag:#x}")




# ---------------------------------------------------------------------------------------------
# Encoding.


class EncodedRecord(NamedTuple):
    """A record ready to append, still without queue offset, physical offset and store time."""

    data: bytes
    store_timestamp_pos: int  # where :func:`stamp` writes the store time


@lru_cache(maxsize=4096)
def _topic_part(topic: str, auto_v2_for_long_topic: bool) -> tuple[int, bytes]:
    """Magic code and the encoded (length, topic) bytes; raises MessageIllegal."""
    topic_bytes = topic.encode("utf-8") if topic else b""
    if not topic_bytes:
        raise MessageIllegal("topic is empty")
    if len(topic_bytes) <= MAX_TOPIC_LENGTH_V1:
        return MESSAGE_MAGIC_CODE_V1, bytes((len(topic_bytes),)) + topic_bytes
    if not auto_v2_for_long_topic or len(topic_bytes) > MAX_TOPIC_LENGTH_V2:
        raise MessageIllegal(f"topic is {len(topic_bytes)} bytes, longer than allowed")
    return MESSAGE_MAGIC_CODE_V2, _SHORT.pack(len(topic_bytes)) + topic_bytes


_HOST_FLAGS = SysFlag.BORN_HOST_V6 | SysFlag.STORE_HOST_V6


@lru_cache(maxsize=1024)
def _host_part(born: Host, store_host: Host) -> tuple[struct.Struct, int, int, bytes, int,
                                                      bytes, int, int]:
    """Everything about a record's header that only depends on its two hosts: the layout,
    its size, the host sysflag bits, the packed addresses and ports, and where the store time
    goes. A store sees few distinct (born, store) pairs, and working these out per message was
    a visible share of a batch put."""
    born_v6 = ":" in born.ip
    store_v6 = ":" in store_host.ip
    layout = _LAYOUTS[(born_v6, store_v6)]
    flags = (SysFlag.BORN_HOST_V6 if born_v6 else 0) | (SysFlag.STORE_HOST_V6 if store_v6 else 0)
    return (layout.header, layout.header.size, flags, _pack_ip(born.ip), born.port,
            _pack_ip(store_host.ip), store_host.port, layout.store_timestamp_pos)


def encode(
    msg: Message,
    store_host: Host,
    *,
    max_message_size: int,
    auto_v2_for_long_topic: bool = True,
) -> EncodedRecord:
    """Encode everything about ``msg`` that does not depend on where it lands.

    Raises :class:`MessageIllegal` (or :class:`PropertiesTooLarge`) with a reason a user can act
    on. The store stamps the position fields under its write lock with :func:`stamp`.
    """
    data, _, store_timestamp_pos = encode_record(msg, store_host, max_message_size,
                                                 auto_v2_for_long_topic)
    return EncodedRecord(data, store_timestamp_pos)


_FIELD_RANGES = (("flag", -(1 << 31), (1 << 31) - 1), ("sys_flag", -(1 << 31), (1 << 31) - 1),
                 ("born_timestamp", -(1 << 63), (1 << 63) - 1),
                 ("reconsume_times", -(1 << 31), (1 << 31) - 1),
                 ("prepared_transaction_offset", -(1 << 63), (1 << 63) - 1))


def _field_out_of_range(msg: Message) -> str:
    for name, low, high in _FIELD_RANGES:
        value = getattr(msg, name)
        if not isinstance(value, int) or not low <= value <= high:
            return f"{name} {value!r} does not fit the record (must be {low}..{high})"
    port = msg.born_host.port
    return f"born host port {port!r} is out of range"


def encode_record(
    msg: Message, store_host: Host, max_message_size: int, auto_v2_for_long_topic: bool = True,
) -> tuple[bytes, int, int]:
    """:func:`encode` as a plain ``(data, size, store_timestamp_pos)`` tuple: the append path
    calls this once per message, where building a NamedTuple and a keyword call add up."""
    magic, topic_part = _topic_part(msg.topic, auto_v2_for_long_topic)
    body = msg.body
    if type(body) is not bytes:
        body = bytes(body)
    body_len = len(body)
    if body_len > max_message_size:
        raise MessageIllegal(
            f"body is {body_len} bytes, more than maxMessageSize ({max_message_size})"
        )
    properties = msg.properties
    props = b""
    props_len = 0
    if properties:
        # encode_properties' fast case inlined: names and values joined in C by
        # ``map(str.join)``; the final separator is its own piece of the record join below.
        # Anything unusual (a non-str value, a separator inside a name or value, an empty
        # name) goes through encode_properties, which formats or refuses it.
        count = len(properties)
        try:
            text = "\x02".join(map("\x01".join, properties.items()))
        except TypeError:
            text = None
        if (text is None or text.count("\x01") != count or text.count("\x02") != count - 1
                or "" in properties):
            props = encode_properties(properties)
            props_len = len(props)
        else:
            props = text.encode()
            props_len = len(props) + 1
        if props_len > MAX_PROPERTIES_LENGTH:
            raise PropertiesTooLarge(
                f"properties are {props_len} bytes, more than {MAX_PROPERTIES_LENGTH}"
            )
    queue_id = msg.queue_id
    if not 0 <= queue_id <= 0x7FFFFFFF:
        raise MessageIllegal(f"queue id {queue_id} is out of range")
    header, header_size, host_flags, born_ip, born_port, store_ip, store_port, ts_pos = (
        _host_part(msg.born_host, store_host)
    )
    total = header_size + body_len + len(topic_part) + 2 + props_len
    try:
        head = header.pack(
            total, magic, _crc32(body) & 0x7FFFFFFF, queue_id, msg.flag, 0, 0,
            (msg.sys_flag & ~_HOST_FLAGS) | host_flags, msg.born_timestamp, born_ip, born_port,
            0, store_ip, store_port, msg.reconsume_times, msg.prepared_transaction_offset,
            body_len,
        )  # fmt: skip
    except struct.error:
        # Only a caller's field can be out of its width here (the sizes were checked above):
        # name it rather than fail the put with a bare struct.error.
        raise MessageIllegal(_field_out_of_range(msg)) from None
    tail = _PROPS_TAIL if props_len > len(props) else b""
    return (b"".join((head, body, topic_part, _SHORT.pack(props_len), props, tail)), total,
            ts_pos)


_PROPS_TAIL = PROPERTY_SEPARATOR.encode()
_UNSET = object()  # no topic or host seen yet (None would equal a message's None)


def encode_records(
    messages: Sequence[Message], store_host: Host, max_message_size: int,
    auto_v2_for_long_topic: bool = True,
) -> list[tuple[bytes, int, int]]:
    """:func:`encode_record` of each message, in one loop: the same bytes (a test holds the
    two to it), raising what the first message that fails would raise.

    Why a loop of its own: a broker's put is a batch whose messages share their topic, hosts
    and property names; the topic and host parts are looked up once per change instead of
    once per message, and the call per message is gone. Anything unusual about a message
    (properties that need checking, a field out of range) goes to :func:`encode_record`."""
    out: list[tuple[bytes, int, int]] = []
    append = out.append
    join = b"".join
    crc = _crc32
    short = _SHORT.pack
    tail_bytes = _PROPS_TAIL
    max_props = MAX_PROPERTIES_LENGTH
    topic: object = _UNSET
    born: object = _UNSET
    magic = 0
    topic_part = b""
    header = None
    header_size = host_flags = born_port = store_port = ts_pos = 0
    born_ip = store_ip = b""
    checked_name: object = _UNSET  # the property name last found fit to encode here
    name_part = b""
    for msg in messages:
        properties = msg.properties
        body = msg.body
        if type(body) is not bytes or len(properties) != 1:
            # One property (UNIQ_KEY, what a plain send carries) is the shape this loop
            # handles; anything else is checked and joined by the general encoder.
            append(encode_record(msg, store_host, max_message_size,
                                 auto_v2_for_long_topic))
            continue
        ((name, value),) = properties.items()
        if name is not checked_name:  # the batch's messages share their property's name
            if (type(name) is not str or not name or "\x01" in name or "\x02" in name):
                append(encode_record(msg, store_host, max_message_size,
                                     auto_v2_for_long_topic))
                continue
            checked_name = name
            name_part = f"{name}\x01".encode()
        if type(value) is not str or "\x01" in value or "\x02" in value:
            append(encode_record(msg, store_host, max_message_size,
                                 auto_v2_for_long_topic))
            continue
        if msg.topic != topic:  # checked first, as encode_record does
            magic, topic_part = _topic_part(msg.topic, auto_v2_for_long_topic)
            topic = msg.topic
        body_len = len(body)
        if body_len > max_message_size:
            raise MessageIllegal(
                f"body is {body_len} bytes, more than maxMessageSize ({max_message_size})"
            )
        if msg.born_host is not born:
            born = msg.born_host
            header, header_size, host_flags, born_ip, born_port, store_ip, store_port, ts_pos = (
                _host_part(born, store_host))
        props = name_part + value.encode()
        props_len = len(props) + 1
        if props_len > max_props:
            raise PropertiesTooLarge(
                f"properties are {props_len} bytes, more than {MAX_PROPERTIES_LENGTH}"
            )
        queue_id = msg.queue_id
        if not 0 <= queue_id <= 0x7FFFFFFF:
            raise MessageIllegal(f"queue id {queue_id} is out of range")
        total = header_size + body_len + len(topic_part) + 2 + props_len
        try:
            head = header.pack(  # type: ignore[union-attr]
                total, magic, crc(body) & 0x7FFFFFFF, queue_id, msg.flag, 0, 0,
                (msg.sys_flag & ~_HOST_FLAGS) | host_flags, msg.born_timestamp, born_ip,
                born_port, 0, store_ip, store_port, msg.reconsume_times,
                msg.prepared_transaction_offset, body_len,
            )  # fmt: skip
        except struct.error:
            raise MessageIllegal(_field_out_of_range(msg)) from None
        append((join((head, body, topic_part, short(props_len), props, tail_bytes)), total,
                ts_pos))
    return out

# For appenders that stamp a whole batch in one loop (what :func:`stamp` does, without a call
# per record): ``STAMP_POSITIONS.pack_into(buf, pos + QUEUE_OFFSET_POS, queue_offset,
# physical_offset)`` then ``STAMP_TIMESTAMP.pack_into(buf, pos + store_timestamp_pos, time)``.
STAMP_POSITIONS = _POSITIONS
STAMP_TIMESTAMP = _TIMESTAMP


def stamp(
    buf: bytearray | memoryview,
    pos: int,
    queue_offset: int,
    physical_offset: int,
    store_timestamp: int,
    store_timestamp_pos: int,
) -> None:
    """Write the fields only the appender knows into the record at ``buf[pos:]``."""
    _POSITIONS.pack_into(buf, pos + QUEUE_OFFSET_POS, queue_offset, physical_offset)
    _TIMESTAMP.pack_into(buf, pos + store_timestamp_pos, store_timestamp)


def encode_blank(length: int) -> bytes:
    """The end-of-segment filler: size and BLANK magic code; the rest of it is don't-care."""
    return _SIZE_MAGIC.pack(length, BLANK_MAGIC_CODE)
