"""The CommitLog record codec: encode, stamp, check, scan and decode records, and the small
codecs RocketMQ defines beside them (body CRC, tags hash, properties, offset message ids).

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
    DispatchInfo,
    Host,
    Message,
    MessageIllegal,
    Prop,
    PropertiesTooLarge,
    RecordCorrupt,
    StoredMessage,
    _host,
    _ip_text,
    _pack_ip,
)
from stratamq.record.layout import (
    _INT,
    _LAYOUTS,
    _POSITIONS,
    _SHORT,
    _SIZE_MAGIC,
    _TIMESTAMP,
    _V4,
    BLANK_MAGIC_CODE,
    END_FILE_MIN_BLANK_LENGTH,
    MAX_PROPERTIES_LENGTH,
    MAX_TOPIC_LENGTH_V1,
    MAX_TOPIC_LENGTH_V2,
    MESSAGE_MAGIC_CODE_V1,
    MESSAGE_MAGIC_CODE_V2,
    MIN_RECORD_SIZE,
    NAME_VALUE_SEPARATOR,
    PROPERTY_SEPARATOR,
    QUEUE_OFFSET_POS,
    SYS_FLAG_POS,
    SysFlag,
    _layout_for,
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


# ---------------------------------------------------------------------------------------------
# Decoding.


def read_size_and_magic(buf: Buffer, pos: int) -> tuple[int, int]:
    return _SIZE_MAGIC.unpack_from(buf, pos)


def _tail(buf: Buffer, pos: int, magic: int, body_start: int, body_len: int,
          end: int) -> tuple[int, int, int, int]:
    """Locate topic and properties after the body: (topic_start, topic_len, props_start, props_len).

    Raises RecordCorrupt if a length points past ``end``.
    """
    p = body_start + body_len
    if magic == MESSAGE_MAGIC_CODE_V1:
        if p + 1 > end:
            raise RecordCorrupt(pos, "record ends inside the topic length")
        topic_len = buf[p]
        p += 1
    else:
        if p + 2 > end:
            raise RecordCorrupt(pos, "record ends inside the topic length")
        topic_len = _SHORT.unpack_from(buf, p)[0]
        p += 2
    topic_start = p
    p += topic_len
    if p + 2 > end:
        raise RecordCorrupt(pos, "record ends inside the topic or properties length")
    props_len = _SHORT.unpack_from(buf, p)[0]
    return topic_start, topic_len, p + 2, props_len


def check_record(
    buf: Buffer, pos: int, limit: int, expected_offset: int | None, check_crc: bool
) -> int:
    """Validate the record at ``buf[pos:]`` and return its total size, or 0 for a blank record.

    ``limit`` is where readable bytes end; ``expected_offset`` is the record's physical offset if
    the caller knows it (the stored offset must match, which catches stale or shifted bytes).
    Raises :class:`RecordCorrupt` saying which check failed. This is what recovery trusts.
    """
    if pos + 8 > limit:
        raise RecordCorrupt(pos, "fewer than 8 bytes left for size and magic code")
    total, magic = _SIZE_MAGIC.unpack_from(buf, pos)
    if magic == BLANK_MAGIC_CODE:
        if total < END_FILE_MIN_BLANK_LENGTH or pos + total > limit:
            raise RecordCorrupt(pos, f"blank record of impossible size {total}")
        return 0
    if magic not in (MESSAGE_MAGIC_CODE_V1, MESSAGE_MAGIC_CODE_V2):
        raise RecordCorrupt(pos, f"bad magic code {magic:#010x}")
    if total < MIN_RECORD_SIZE or pos + total > limit:
        raise RecordCorrupt(pos, f"total size {total} is impossible here")
    end = pos + total
    sys_flag = _INT.unpack_from(buf, pos + SYS_FLAG_POS)[0]
    layout = _layout_for(sys_flag)
    if layout.header.size > total:
        raise RecordCorrupt(pos, "total size smaller than the header")
    fields = layout.header.unpack_from(buf, pos)
    stored_crc, physical_offset, body_len = fields[2], fields[6], fields[-1]
    body_start = pos + layout.header.size
    if body_len < 0 or body_start + body_len > end:
        raise RecordCorrupt(pos, f"body length {body_len} runs past the record")
    _, topic_len, props_start, props_len = _tail(buf, pos, magic, body_start, body_len, end)
    if props_start + props_len != end:
        raise RecordCorrupt(pos, "field lengths do not add up to the total size")
    if topic_len == 0:
        raise RecordCorrupt(pos, "empty topic")
    if expected_offset is not None and physical_offset != expected_offset:
        raise RecordCorrupt(
            pos, f"stored physical offset {physical_offset} is not its position {expected_offset}"
        )
    if check_crc and body_crc(buf[body_start : body_start + body_len]) != stored_crc:
        raise RecordCorrupt(pos, "body CRC mismatch")
    return total


def decode(buf: Buffer, pos: int = 0, *, check_crc: bool = False) -> StoredMessage:
    """Decode the whole record at ``buf[pos:]`` (properties parsed, body copied)."""
    total, magic = _SIZE_MAGIC.unpack_from(buf, pos)
    if magic not in (MESSAGE_MAGIC_CODE_V1, MESSAGE_MAGIC_CODE_V2):
        raise RecordCorrupt(pos, f"bad magic code {magic:#010x}")
    end = pos + total
    if total < MIN_RECORD_SIZE or end > len(buf):
        raise RecordCorrupt(pos, f"total size {total} is impossible here")
    layout = _layout_for(_INT.unpack_from(buf, pos + SYS_FLAG_POS)[0])
    (
        total, magic, crc, queue_id, flag, queue_offset, physical_offset, sys_flag,
        born_ts, born_ip, born_port, store_ts, store_ip, store_port, reconsume,
        prepared, body_len,
    ) = layout.header.unpack_from(buf, pos)  # fmt: skip
    body_start = pos + layout.header.size
    if body_len < 0 or body_start + body_len > end:
        raise RecordCorrupt(pos, f"body length {body_len} runs past the record")
    body = bytes(buf[body_start : body_start + body_len])
    if check_crc and body_crc(body) != crc:
        raise RecordCorrupt(pos, "body CRC mismatch")
    topic_start, topic_len, props_start, props_len = _tail(
        buf, pos, magic, body_start, body_len, end
    )
    if props_start + props_len > end:
        raise RecordCorrupt(pos, "properties run past the record")
    # Attributes set directly: StoredMessage(**fields) costs a third of a decode.
    msg = _new_stored_message(StoredMessage)
    msg.total_size = total
    msg.magic_code = magic
    msg.body_crc = crc
    msg.queue_id = queue_id
    msg.flag = flag
    msg.queue_offset = queue_offset
    msg.physical_offset = physical_offset
    msg.sys_flag = sys_flag
    msg.born_timestamp = born_ts
    msg.born_host = _host(born_ip, born_port)
    msg.store_timestamp = store_ts
    msg.store_host = _host(store_ip, store_port)
    msg.reconsume_times = reconsume
    msg.prepared_transaction_offset = prepared
    msg.body = body
    msg.topic = _topic_name(bytes(buf[topic_start : topic_start + topic_len]))
    msg.properties = decode_properties(buf[props_start : props_start + props_len])
    return msg


_new_stored_message = object.__new__



_TOPIC_NAMES: dict[bytes, str] = {}  # topic bytes -> str: few distinct topics, decoded once


def _topic_name(raw: bytes) -> str:
    name = _TOPIC_NAMES.get(raw)
    if name is None:
        name = raw.decode("utf-8", "replace")
        if len(_TOPIC_NAMES) < 100_000:
            _TOPIC_NAMES[raw] = name
    return name


def decode_dispatch_info(buf: Buffer, pos: int) -> DispatchInfo:
    """Decode just the dispatch fields of a record already validated by :func:`check_record`.

    This runs once per record on the dispatcher thread, so it takes the IPv4 layout's single
    unpack as the common case and reads lengths in place rather than through ``_tail``.
    """
    fields = _V4.header.unpack_from(buf, pos)
    sys_flag = fields[7]
    header_size = _V4.header.size
    if sys_flag & _HOST_FLAGS:
        layout = _layout_for(sys_flag)
        fields = layout.header.unpack_from(buf, pos)
        header_size = layout.header.size
    total = fields[0]
    p = pos + header_size + fields[-1]
    if fields[1] == MESSAGE_MAGIC_CODE_V1:
        topic_len = buf[p]
        p += 1
    else:
        topic_len = (buf[p] << 8) | buf[p + 1]
        p += 2
    topic = _topic_name(bytes(buf[p : p + topic_len]))
    p += topic_len
    props_len = (buf[p] << 8) | buf[p + 1]
    if p + 2 + props_len > pos + total:
        raise RecordCorrupt(pos, "properties run past the record")
    properties = decode_properties(buf[p + 2 : p + 2 + props_len])
    return DispatchInfo(
        topic, fields[3], fields[5], fields[6], total,
        tags_hash_code(properties.get(Prop.TAGS)), fields[11], sys_flag, properties,
    )  # fmt: skip


def record_store_timestamp(buf: Buffer, pos: int) -> int:
    """The store time of the record at ``pos`` (used to pick where recovery starts)."""
    layout = _layout_for(_INT.unpack_from(buf, pos + SYS_FLAG_POS)[0])
    return _TIMESTAMP.unpack_from(buf, pos + layout.store_timestamp_pos)[0]


def record_body_length(buf: Buffer, pos: int) -> int:
    """The body length of the record at ``pos`` (an empty body is a compaction tombstone)."""
    layout = _layout_for(_INT.unpack_from(buf, pos + SYS_FLAG_POS)[0])
    return _INT.unpack_from(buf, pos + layout.header.size - 4)[0]


def record_positions(buf: Buffer, pos: int) -> tuple[int, int]:
    """(queue offset, physical offset) stored in the record at ``pos``."""
    return _POSITIONS.unpack_from(buf, pos + QUEUE_OFFSET_POS)


def record_property(buf: bytes, name: str) -> str | None:
    """One property of the whole record ``buf`` (the tier uploader's KEYS and UNIQ_KEY), found
    in the raw properties without decoding all of them."""
    total, magic = _SIZE_MAGIC.unpack_from(buf, 0)
    layout = _layout_for(_INT.unpack_from(buf, SYS_FLAG_POS)[0])
    body_len = _INT.unpack_from(buf, layout.header.size - 4)[0]
    _, _, start, length = _tail(buf, 0, magic, layout.header.size, body_len, total)
    raw = buf[start : start + length]
    tag = (name + NAME_VALUE_SEPARATOR).encode()
    at = 0 if raw.startswith(tag) else raw.find(PROPERTY_SEPARATOR.encode() + tag) + 1
    if at < 0 or (at == 0 and not raw.startswith(tag)):
        return None
    at += len(tag)
    stop = raw.find(PROPERTY_SEPARATOR.encode(), at)
    return raw[at : stop if stop >= 0 else len(raw)].decode("utf-8", "replace")


def record_topic(buf: Buffer, pos: int) -> str:
    """The topic of the record at ``pos`` (lengths already checked by :func:`check_record`)."""
    total, magic = _SIZE_MAGIC.unpack_from(buf, pos)
    layout = _layout_for(_INT.unpack_from(buf, pos + SYS_FLAG_POS)[0])
    body_len = _INT.unpack_from(buf, pos + layout.header.size - 4)[0]
    start, length, _, _ = _tail(buf, pos, magic, pos + layout.header.size, body_len,
                                pos + total)
    return _topic_name(bytes(buf[start : start + length]))


def record_tags(buf: Buffer, pos: int) -> str | None:
    """The TAGS property of the record at ``pos`` (for exact tag filtering after the hash)."""
    total, magic = _SIZE_MAGIC.unpack_from(buf, pos)
    layout = _layout_for(_INT.unpack_from(buf, pos + SYS_FLAG_POS)[0])
    body_len = _INT.unpack_from(buf, pos + layout.header.size - 4)[0]
    _, _, props_start, props_len = _tail(
        buf, pos, magic, pos + layout.header.size, body_len, pos + total
    )
    return decode_properties(buf[props_start : props_start + props_len]).get(Prop.TAGS)


