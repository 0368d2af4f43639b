"""The CommitLog record codec: the one module that knows a record's byte layout.

Spec: ``docs/formats/commitlog-record.md`` (taken from seed 004 and checked byte for byte against
the store Apache RocketMQ 5.3 wrote in ``tests/data``).

A record is big-endian::

    total_size i32 | magic_code u32 | body_crc i32 | queue_id i32 | flag i32 | queue_offset i64 |
    physical_offset i64 | sys_flag i32 | born_timestamp i64 | born_host (ip 4|16, port i32) |
    store_timestamp i64 | store_host (ip 4|16, port i32) | reconsume_times i32 |
    prepared_transaction_offset i64 | body_length i32 | body | topic_length u8 (u16 in V2) |
    topic | properties_length u16 | properties

Everything else in StrataMQ goes through the functions here; nothing else slices record bytes.
This module does no I/O and holds no locks: callers hand it buffers.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    import mmap

    # What records are read from: bytes, a view of a segment, or the segment's map itself.
    Buffer = bytes | bytearray | memoryview | mmap.mmap

try:  # ISA-L's CRC-32 (same polynomial and values as zlib's) is ~5x faster on 1 KiB bodies
    from isal.isal_zlib import crc32 as _crc32
except ImportError:  # optional: zlib gives the same results, only slower
    from zlib import crc32 as _crc32

__all__ = [
    "BLANK_MAGIC_CODE",
    "END_FILE_MIN_BLANK_LENGTH",
    "MESSAGE_MAGIC_CODE_V1",
    "MESSAGE_MAGIC_CODE_V2",
    "DispatchInfo",
    "Host",
    "Message",
    "MessageIllegal",
    "PropertiesTooLarge",
    "RecordCorrupt",
    "ScanResult",
    "StoredMessage",
    "SysFlag",
    "Prop",
    "body_crc",
    "check_record",
    "decode",
    "decode_dispatch_info",
    "decode_properties",
    "encode",
    "encode_blank",
    "encode_properties",
    "encode_record",
    "offset_msg_id",
    "parse_offset_msg_id",
    "read_size_and_magic",
    "scan_records",
    "skip_covered",
    "stamp",
    "tags_hash_code",
]

MESSAGE_MAGIC_CODE_V1 = 0xDAA320A7  # topic length is one byte
MESSAGE_MAGIC_CODE_V2 = 0xDAA320AB  # topic length is two bytes (RocketMQ's MessageVersion.V2)
BLANK_MAGIC_CODE = 0xCBD43194  # fills the tail of a segment a record did not fit in
# A segment must keep room for a blank record's size and magic code, so readers always find one.
END_FILE_MIN_BLANK_LENGTH = 4 + 4

MAX_TOPIC_LENGTH_V1 = 127  # RocketMQ writes the V1 topic length as a signed byte
MAX_TOPIC_LENGTH_V2 = 32767
MAX_PROPERTIES_LENGTH = 32767  # properties length is a Java short
NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"


class SysFlag:
    """Bits of the record's ``sys_flag`` (RocketMQ's ``MessageSysFlag``)."""

    COMPRESSED = 0x1
    MULTI_TAGS = 0x1 << 1
    TRANSACTION_NOT_TYPE = 0
    TRANSACTION_PREPARED_TYPE = 0x1 << 2
    TRANSACTION_COMMIT_TYPE = 0x2 << 2
    TRANSACTION_ROLLBACK_TYPE = 0x3 << 2
    TRANSACTION_MASK = 0x3 << 2
    BORN_HOST_V6 = 0x1 << 4
    STORE_HOST_V6 = 0x1 << 5
    NEED_UNWRAP = 0x1 << 6
    INNER_BATCH = 0x1 << 7
    COMPRESSION_LZ4 = 0x1 << 8
    COMPRESSION_ZSTD = 0x2 << 8
    COMPRESSION_ZLIB = 0x3 << 8
    COMPRESSION_MASK = 0x7 << 8

    @staticmethod
    def transaction_type(sys_flag: int) -> int:
        return sys_flag & SysFlag.TRANSACTION_MASK

    @staticmethod
    def is_dispatchable(sys_flag: int) -> bool:
        """Prepared and rolled-back transactional records never reach a ConsumeQueue."""
        return (sys_flag & SysFlag.TRANSACTION_MASK) in (
            SysFlag.TRANSACTION_NOT_TYPE,
            SysFlag.TRANSACTION_COMMIT_TYPE,
        )


class Prop:
    """Property names RocketMQ gives meaning to (``MessageConst``)."""

    KEYS = "KEYS"
    TAGS = "TAGS"
    UNIQ_KEY = "UNIQ_KEY"
    WAIT_STORE_MSG_OK = "WAIT"
    DELAY_LEVEL = "DELAY"
    TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
    REAL_TOPIC = "REAL_TOPIC"
    REAL_QUEUE_ID = "REAL_QID"
    TRANSACTION_PREPARED = "TRAN_MSG"
    PRODUCER_GROUP = "PGROUP"
    MESSAGE_GROUP = "__SHARDINGKEY"
    CLUSTER = "CLUSTER"


class MessageIllegal(ValueError):
    """A message the store refuses to write (RocketMQ's MESSAGE_ILLEGAL)."""


class PropertiesTooLarge(MessageIllegal):
    """The encoded properties exceed 32,767 bytes (RocketMQ's PROPERTIES_SIZE_EXCEEDED)."""


class RecordCorrupt(ValueError):
    """Bytes at a position are not a valid record; ``reason`` says which check failed."""

    def __init__(self, position: int, reason: str) -> None:
        super().__init__(f"corrupt record at {position}: {reason}")
        self.position = position
        self.reason = reason


class Host(NamedTuple):
    """An IPv4 or IPv6 address and port as a record stores it."""

    ip: str
    port: int

    @property
    def is_v6(self) -> bool:
        return ":" in self.ip

    def packed(self) -> bytes:
        return _pack_ip(self.ip)

    def __str__(self) -> str:
        return f"[{self.ip}]:{self.port}" if self.is_v6 else f"{self.ip}:{self.port}"

    @classmethod
    def parse(cls, text: str) -> Host:
        """Parse ``ip:port`` or ``[ipv6]:port``."""
        host, _, port = text.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"not host:port: {text!r}")
        host = host.strip("[]")
        ipaddress.ip_address(host)  # raises a clear ValueError on a bad address
        return cls(host, int(port))


@lru_cache(maxsize=1024)
def _pack_ip(ip: str) -> bytes:
    return ipaddress.ip_address(ip).packed


def _ip_text(packed: bytes) -> str:
    return _ip_text_cached(bytes(packed))


# Decoding a record formats two addresses; a store sees few distinct ones, and ``ipaddress``
# costs microseconds each (a large part of a lookup by key), so remember them.
@lru_cache(maxsize=4096)
def _ip_text_cached(packed: bytes) -> str:
    return socket.inet_ntoa(packed) if len(packed) == 4 else str(ipaddress.ip_address(packed))


@lru_cache(maxsize=4096)
def _host(packed: bytes, port: int) -> Host:
    return Host(_ip_text_cached(packed), port)


# ---------------------------------------------------------------------------------------------
# Layout, written once. Field offsets are derived from this table, never typed twice.

_HOST_V4 = "4si"
_HOST_V6 = "16si"


def _fields(born_v6: bool, store_v6: bool) -> list[tuple[str, str]]:
    return [
        ("total_size", "i"),
        ("magic_code", "I"),
        ("body_crc", "i"),
        ("queue_id", "i"),
        ("flag", "i"),
        ("queue_offset", "q"),
        ("physical_offset", "q"),
        ("sys_flag", "i"),
        ("born_timestamp", "q"),
        ("born_host", _HOST_V6 if born_v6 else _HOST_V4),
        ("store_timestamp", "q"),
        ("store_host", _HOST_V6 if store_v6 else _HOST_V4),
        ("reconsume_times", "i"),
        ("prepared_transaction_offset", "q"),
        ("body_length", "i"),
    ]


class _Layout:
    """The fixed header (everything before the body) for one combination of host widths."""

    def __init__(self, born_v6: bool, store_v6: bool) -> None:
        fields = _fields(born_v6, store_v6)
        self.header = struct.Struct(">" + "".join(code for _, code in fields))
        self.offsets: dict[str, int] = {}
        position = 0
        for name, code in fields:
            self.offsets[name] = position
            position += struct.calcsize(">" + code)
        assert position == self.header.size
        self.store_timestamp_pos = self.offsets["store_timestamp"]


_LAYOUTS = {(b, s): _Layout(b, s) for b in (False, True) for s in (False, True)}
_V4 = _LAYOUTS[(False, False)]
HEADER_SIZE_V4 = _V4.header.size  # 88
assert HEADER_SIZE_V4 == 88

_SIZE_MAGIC = struct.Struct(">iI")
_INT = struct.Struct(">i")
_SHORT = struct.Struct(">H")
_BYTE = struct.Struct(">B")
_POSITIONS = struct.Struct(">qq")  # queue_offset, physical_offset: adjacent in every layout
_TIMESTAMP = struct.Struct(">q")
QUEUE_OFFSET_POS = _V4.offsets["queue_offset"]
PHYSICAL_OFFSET_POS = _V4.offsets["physical_offset"]
SYS_FLAG_POS = _V4.offsets["sys_flag"]
assert PHYSICAL_OFFSET_POS == QUEUE_OFFSET_POS + 8
# The smallest well-formed record: empty body, one-byte topic, no properties.
MIN_RECORD_SIZE = HEADER_SIZE_V4 + 1 + 1 + 2


def _layout_for(sys_flag: int) -> _Layout:
    return _LAYOUTS[(bool(sys_flag & SysFlag.BORN_HOST_V6), bool(sys_flag & SysFlag.STORE_HOST_V6))]


# ---------------------------------------------------------------------------------------------
# Small codecs RocketMQ defines alongside the record.


def body_crc(body: bytes | bytearray | memoryview) -> int:
    """CRC32 of the stored body as RocketMQ keeps it: masked to 31 bits (``UtilAll.crc32``)."""
    return _crc32(body) & 0x7FFFFFFF


@lru_cache(maxsize=4096)
def tags_hash_code(tags: str | None) -> int:
    """Java's ``String.hashCode`` of the tags: the ConsumeQueue's filter code (0 for no tags)."""
    if not tags:
        return 0
    h = 0
    raw = tags.encode("utf-16-be")  # Java hashes UTF-16 code units
    for i in range(0, len(raw), 2):
        h = (31 * h + ((raw[i] << 8) | raw[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


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
# Messages.


@dataclass
class Message:
    """A message as a producer hands it to the store (before it has a position)."""

    topic: str
    body: bytes
    queue_id: int = 0
    properties: dict[str, str] = field(default_factory=dict)
    flag: int = 0
    sys_flag: int = 0
    born_timestamp: int = 0
    born_host: Host = Host("127.0.0.1", 0)
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0

    @property
    def tags(self) -> str | None:
        return self.properties.get(Prop.TAGS)

    @property
    def keys(self) -> list[str]:
        return self.properties.get(Prop.KEYS, "").split()


class StoredMessage:
    """A record decoded from the CommitLog. ``body`` is as stored (see ``decompressed_body``)."""

    __slots__ = (
        "total_size", "magic_code", "body_crc", "queue_id", "flag", "queue_offset",
        "physical_offset", "sys_flag", "born_timestamp", "born_host", "store_timestamp",
        "store_host", "reconsume_times", "prepared_transaction_offset", "body", "topic",
        "properties",
    )  # fmt: skip

    def __init__(self, **values: object) -> None:
        for name, value in values.items():
            setattr(self, name, value)

    total_size: int
    magic_code: int
    body_crc: int
    queue_id: int
    flag: int
    queue_offset: int
    physical_offset: int
    sys_flag: int
    born_timestamp: int
    born_host: Host
    store_timestamp: int
    store_host: Host
    reconsume_times: int
    prepared_transaction_offset: int
    body: bytes
    topic: str
    properties: dict[str, str]

    @property
    def tags(self) -> str | None:
        return self.properties.get(Prop.TAGS)

    @property
    def keys(self) -> list[str]:
        return self.properties.get(Prop.KEYS, "").split()

    @property
    def msg_id(self) -> str:
        return offset_msg_id(self.store_host, self.physical_offset)

    def decompressed_body(self) -> bytes:
        return decompress_body(self.body, self.sys_flag)

    def __repr__(self) -> str:
        return (
            f"StoredMessage(topic={self.topic!r}, queue_id={self.queue_id}, "
            f"queue_offset={self.queue_offset}, physical_offset={self.physical_offset}, "
            f"size={self.total_size})"
        )


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


class ScanResult(NamedTuple):
    """Where a run of valid records ends and why (see :func:`scan_records`)."""

    end: int  # position where valid records end
    records: int  # valid records before it
    blank: bool  # stopped at a valid blank record (the segment's filler)
    problem: RecordCorrupt | None  # None: a blank, never-written zeros, or ``limit`` reached


def scan_records(buf: memoryview, pos: int, limit: int, file_from_offset: int,
                 check_crc: bool) -> ScanResult:
    """Validate consecutive records from ``buf[pos:]`` up to ``limit`` in one loop.

    The checks are exactly :func:`check_record`'s (recovery trusts them); this is its loop form,
    because one Python call per record was most of a crash recovery's cost. IPv4 records, the
    common case, are checked inline; anything else, and any record that fails a check, goes
    through :func:`check_record`, which also words the problem. ``problem`` positions are
    CommitLog offsets (``file_from_offset`` + position).
    """
    unpack_head = _V4.header.unpack_from
    size_magic = _SIZE_MAGIC.unpack_from
    crc32 = _crc32
    header_size = _V4.header.size
    v1, v2 = MESSAGE_MAGIC_CODE_V1, MESSAGE_MAGIC_CODE_V2
    records = 0
    while pos + 8 <= limit:
        total, magic = size_magic(buf, pos)
        end = pos + total
        if magic in (v1, v2) and total >= MIN_RECORD_SIZE and end <= limit:
            fields = unpack_head(buf, pos)
            body_len = fields[16]
            body_start = pos + header_size
            p = body_start + body_len
            if not fields[7] & _HOST_FLAGS and body_len >= 0 and p + 3 <= end:
                if magic == v1:
                    topic_len = buf[p]
                    p += 1 + topic_len
                else:
                    topic_len = (buf[p] << 8) | buf[p + 1]
                    p += 2 + topic_len
                if (topic_len and p + 2 <= end and p + 2 + ((buf[p] << 8) | buf[p + 1]) == end
                        and fields[6] == file_from_offset + pos
                        and (not check_crc or crc32(buf[body_start : body_start + body_len])
                             & 0x7FFFFFFF == fields[2])):
                    pos = end
                    records += 1
                    continue
        elif total == 0 and magic == 0:
            return ScanResult(pos, records, False, None)  # never written: a clean end
        try:  # the slow path: other layouts, blanks, and saying what is wrong
            length = check_record(buf, pos, limit, file_from_offset + pos, check_crc)
        except RecordCorrupt as exc:
            return ScanResult(pos, records, False,
                              RecordCorrupt(file_from_offset + pos, exc.reason))
        if length == 0:
            return ScanResult(pos, records, True, None)
        pos += length
        records += 1
    return ScanResult(pos, records, False, None)


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


class DispatchInfo(NamedTuple):
    """What the dispatchers need from a record, without copying its body."""

    topic: str
    queue_id: int
    queue_offset: int
    physical_offset: int
    size: int
    tags_code: int
    store_timestamp: int
    sys_flag: int
    properties: dict[str, str]

    @property
    def keys(self) -> list[str]:
        return self.properties.get(Prop.KEYS, "").split()

    @property
    def uniq_key(self) -> str | None:
        return self.properties.get(Prop.UNIQ_KEY)


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


# total_size, magic_code, queue_id, sys_flag and (IPv4 layout) body_length in one unpack; the
# gaps are derived from the layout table.
_ROUTE = struct.Struct(
    ">iI{}xi{}xi{}xi".format(
        _V4.offsets["queue_id"] - 8,
        SYS_FLAG_POS - _V4.offsets["queue_id"] - 4,
        _V4.offsets["body_length"] - SYS_FLAG_POS - 4,
    )
)
assert _ROUTE.size == HEADER_SIZE_V4


def skip_covered(
    buf: memoryview, pos: int, end: int, base: int,
    floors: dict[tuple[bytes, int], int],
    floor_of: Callable[[str, int], int],
) -> tuple[int, int]:
    """The position of the first record in ``buf[pos:end]`` that some dispatcher still needs,
    and the position of the last record skipped before it (-1 if none).

    A record is covered when its physical offset (``base`` + position) is below the floor of
    its (topic, queue id): ``floors`` caches them by raw topic bytes and ``floor_of(topic,
    queue_id)`` supplies a missing one. Used by crash-recovery replay, where nearly every
    record is already in the ConsumeQueues: reading its topic and queue id costs far less than
    :func:`decode_dispatch_info`. Stops, without judging it, at anything that is not a whole
    message record inside ``end`` (a blank, a torn tail): the caller's full path handles it.
    """
    route = _ROUTE.unpack_from
    v1 = MESSAGE_MAGIC_CODE_V1
    header_size = HEADER_SIZE_V4
    last = -1
    while pos + header_size <= end:
        total, magic, queue_id, sys_flag, body_len = route(buf, pos)
        if magic != v1 and magic != MESSAGE_MAGIC_CODE_V2 or pos + total > end or total <= 0:
            break
        if sys_flag & _HOST_FLAGS:
            layout = _layout_for(sys_flag)
            p = pos + layout.header.size + _INT.unpack_from(buf, pos + layout.header.size - 4)[0]
        else:
            p = pos + header_size + body_len
        if p < pos + header_size or p + 2 > pos + total:
            break  # a damaged body length: the full path names the record
        if magic == v1:
            key = (bytes(buf[p + 1 : p + 1 + buf[p]]), queue_id)
        else:
            key = (bytes(buf[p + 2 : p + 2 + ((buf[p] << 8) | buf[p + 1])]), queue_id)
        floor = floors.get(key)
        if floor is None:
            floor = floors[key] = floor_of(_topic_name(key[0]), queue_id)
        if base + pos >= floor:
            break
        last = pos
        pos += total
    return pos, last


def record_store_timestamp(buf: Buffer, pos: int) -> int:
    """The store time of the record at ``pos`` (used to pick where recovery starts)."""
    layout = _layout_for(_INT.unpack_from(buf, pos + SYS_FLAG_POS)[0])
    return _TIMESTAMP.unpack_from(buf, pos + layout.store_timestamp_pos)[0]


def record_tags(buf: Buffer, pos: int) -> str | None:
    """The TAGS property of the record at ``pos`` (for exact tag filtering after the hash)."""
    total, magic = _SIZE_MAGIC.unpack_from(buf, pos)
    layout = _layout_for(_INT.unpack_from(buf, pos + SYS_FLAG_POS)[0])
    body_len = _INT.unpack_from(buf, pos + layout.header.size - 4)[0]
    _, _, props_start, props_len = _tail(
        buf, pos, magic, pos + layout.header.size, body_len, pos + total
    )
    return decode_properties(buf[props_start : props_start + props_len]).get(Prop.TAGS)


# ---------------------------------------------------------------------------------------------
# Bulk reading (the Spark source): walk a segment, find a record start from anywhere, and locate
# the fields of many records at once. numpy is imported lazily: only bulk readers need it.


class Walk(NamedTuple):
    positions: Sequence[int]  # start of each record that begins in [pos, end) (numpy int64)
    stop: int  # where the walk stopped
    reason: str  # "end" (passed end), "blank" (segment filler), "zero" (never written), "corrupt"


def walk_records(buf: Buffer, pos: int, end: int, limit: int) -> Walk:
    """Positions of the records starting in ``[pos, end)``, walking from the record at ``pos``.

    Only sizes and magic codes are checked here; :func:`locate_fields` checks the rest.

    The size chain is sequential, but following it one record at a time in Python costs about
    half a microsecond a record. So the walk is done in bulk: every position in the window whose
    bytes read as a V1/V2 magic code with a plausible size is a candidate, and the chain is
    followed through the candidates with numpy (each candidate's successor must be the next
    candidate). The result is exactly the sequential walk: the first record is the one at
    ``pos``, and every record after it is the previous one's position plus its size. A body
    that happens to contain a magic code only breaks the chain there; the walk jumps to the
    record the chain points at and goes on. Where the chain leaves the candidates (blank filler,
    never-written bytes, corruption) one sequential step says why.
    """
    import numpy as np

    data = np.frombuffer(buf, dtype=np.uint8)
    cand, nxt = _candidates(np, data, pos, min(end, limit - 8), limit)
    breaks = np.flatnonzero(nxt[:-1] != cand[1:])  # chain from cand[i] stops after a break
    pieces = []
    while pos < end:
        j = int(np.searchsorted(cand, pos))
        if j < len(cand) and cand[j] == pos:
            b = int(breaks[np.searchsorted(breaks, j)]) if len(breaks) and breaks[-1] >= j \
                else len(cand) - 1
            pieces.append(cand[j : b + 1])
            pos = int(nxt[b])
            continue
        # Not a candidate: this is where the segment's records end (or are damaged).
        if pos + 8 > limit:
            return Walk(_join(np, pieces), pos, "zero" if pos == limit else "corrupt")
        total, magic = _SIZE_MAGIC.unpack_from(buf, pos)
        if magic in (MESSAGE_MAGIC_CODE_V1, MESSAGE_MAGIC_CODE_V2):
            return Walk(_join(np, pieces), pos, "corrupt")  # a candidate unless its size is bad
        if magic == BLANK_MAGIC_CODE:
            return Walk(_join(np, pieces), pos, "blank")
        if total == 0 and magic == 0:
            return Walk(_join(np, pieces), pos, "zero")
        return Walk(_join(np, pieces), pos, "corrupt")
    positions = _join(np, pieces)
    # A chain piece may run past ``end``; the walk stops at the first record starting after it.
    cut = int(np.searchsorted(positions, end))
    stop = pos if cut == len(positions) else int(positions[cut])
    return Walk(positions[:cut], stop, "end")


def _join(np: Any, pieces: list) -> Any:
    return np.concatenate(pieces) if pieces else np.empty(0, dtype=np.int64)


_MAGIC_BYTES = [struct.pack(">I", m) for m in (MESSAGE_MAGIC_CODE_V1, MESSAGE_MAGIC_CODE_V2)]


def _candidates(np, data, lo: int, hi: int, limit: int) -> tuple:
    """Positions p in ``[lo, hi)`` whose bytes read as a record header (V1/V2 magic code, size
    at least :data:`MIN_RECORD_SIZE` and inside ``limit``), and ``p + size`` for each."""
    if hi <= lo:
        empty = np.empty(0, dtype=np.int64)
        return empty, empty
    first = _MAGIC_BYTES[0]
    # One pass over the window for the magic code's first byte; the rest checked on the hits.
    starts = np.flatnonzero(data[lo + 4 : hi + 4] == first[0]) + lo  # record starts: magic - 4
    starts = starts[starts + 8 <= limit]
    ok = (data[starts + 5] == first[1]) & (data[starts + 6] == first[2])
    last = data[starts + 7]
    ok &= (last == _MAGIC_BYTES[0][3]) | (last == _MAGIC_BYTES[1][3])
    cand = starts[ok]
    size = _be(np, data, cand, 4).astype(np.int64)
    size = np.where(size >= 0x8000_0000, size - (1 << 32), size)
    good = (size >= MIN_RECORD_SIZE) & (cand + size <= limit)
    cand = cand[good]
    return cand, cand + size[good]


def _be(np, data, at, width: int):
    """Big-endian unsigned integers of ``width`` bytes at positions ``at`` (as uint64)."""
    value = np.zeros(len(at), dtype=np.uint64)
    for k in range(width):
        value = (value << np.uint64(8)) | data[at + k]
    return value


_MAGIC_PREFIX = struct.pack(">I", MESSAGE_MAGIC_CODE_V1)[:3]
assert struct.pack(">I", MESSAGE_MAGIC_CODE_V2)[:3] == _MAGIC_PREFIX


def resync(buf: Buffer, pos: int, limit: int, file_from_offset: int) -> int | None:
    """The first position >= ``pos`` where a record provably starts, or None before ``limit``.

    A candidate is a V1/V2 magic code; it is confirmed when the record's stored physical offset
    equals ``file_from_offset`` + its position and its lengths add up (:func:`check_record`).
    Body bytes that merely look like a magic code fail the offset check.
    """
    find = buf.find if hasattr(buf, "find") else bytes(buf).find
    at = pos + 4
    while True:
        hit = find(_MAGIC_PREFIX, at, limit)
        if hit < 0:
            return None
        start = hit - 4
        if hit + 4 <= limit and buf[hit + 3] in (0xA7, 0xAB):
            try:
                check_record(buf, start, limit, file_from_offset + start, False)
                return start
            except RecordCorrupt:
                pass
        at = hit + 1


_NUMPY_CODES = {"i": ">i4", "I": ">u4", "q": ">i8", "4si": (">u4", ">i4"),
                "16si": ("V16", ">i4")}  # fmt: skip


def _numpy_fields(layout_fields: list[tuple[str, str]]) -> list[tuple[str, str]]:
    out = []
    for name, code in layout_fields:
        np_code = _NUMPY_CODES[code]
        if isinstance(np_code, tuple):  # a host: address then port
            out += [(f"{name}_ip", np_code[0]), (f"{name}_port", np_code[1])]
        else:
            out.append((name, np_code))
    return out


def locate_fields(buf: Buffer, positions: Sequence[int],
                  file_from_offset: int) -> dict[str, Any]:
    """Header fields and the spans of body, topic and properties of many records, as numpy
    arrays (one element per position); raises :class:`RecordCorrupt` for the first record whose
    lengths do not add up or whose stored physical offset is not where it lies.

    Keys: every header field of :func:`_fields` (hosts as ``*_ip`` and ``*_port``; an IPv4
    address as a u32, IPv6 addresses in ``v6_hosts``: {row: (born Host, store Host)}), plus
    ``body_start``, ``topic_start``, ``topic_length``, ``props_start``, ``props_length``.
    """
    import numpy as np

    data = np.frombuffer(buf, dtype=np.uint8)
    pos = np.asarray(positions, dtype=np.int64)
    n = len(pos)
    sys_flag = _gather(np, data, pos + SYS_FLAG_POS, ">i4")
    out: dict[str, Any] = {}
    v6_rows = np.flatnonzero(sys_flag & _HOST_FLAGS)
    v4_dtype = np.dtype(_numpy_fields(_fields(False, False)))
    header = _gather_struct(np, data, pos, v4_dtype)
    for name in v4_dtype.names or ():
        out[name] = header[name].astype(v4_dtype[name].newbyteorder("="))
    header_size = np.full(n, _V4.header.size, dtype=np.int64)
    v6_hosts: dict[int, tuple[Host, Host]] = {}
    for row in v6_rows.tolist():  # rare: decode such headers one by one
        at = int(pos[row])
        layout = _layout_for(int(sys_flag[row]))
        values = layout.header.unpack_from(buf, at)
        for (name, _), value in zip(_fields(False, False)[9:], _split_hosts(values)[9:]):
            if name not in ("born_host", "store_host"):
                out[name][row] = value
        v = _split_hosts(values)
        v6_hosts[row] = (Host(_ip_text(v[9][0]), v[9][1]), Host(_ip_text(v[11][0]), v[11][1]))
        out["born_host_ip"][row] = out["store_host_ip"][row] = 0
        header_size[row] = layout.header.size
    out["v6_hosts"] = v6_hosts
    total = out["total_size"]
    body_start = pos + header_size
    p = body_start + out["body_length"]
    end = pos + total
    v1 = out["magic_code"] == MESSAGE_MAGIC_CODE_V1
    bad = (out["body_length"] < 0) | (p + np.where(v1, 1, 2) > end)
    p = np.where(bad, pos, p)  # keep gathers inside the buffer until the check below
    first = data[p].astype(np.int64)
    topic_len = np.where(v1, first, (first << 8) | data[np.minimum(p + 1, len(data) - 1)])
    topic_start = p + np.where(v1, 1, 2)
    props_len_pos = np.minimum(topic_start + topic_len, len(data) - 2)
    props_len = (data[props_len_pos].astype(np.int64) << 8) | data[props_len_pos + 1]
    props_start = topic_start + topic_len + 2
    bad |= (props_start + props_len != end) | (topic_len == 0)
    bad |= out["physical_offset"] != pos + file_from_offset
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        check_record(buf, int(pos[row]), len(data), file_from_offset + int(pos[row]), False)
        raise RecordCorrupt(int(pos[row]), "fields do not add up")  # check_record raised first
    out.update(body_start=body_start, topic_start=topic_start, topic_length=topic_len,
               props_start=props_start, props_length=props_len)
    return out


def _split_hosts(values: tuple) -> list:
    """A header tuple with each host's (ip, port) pair joined, aligned with :func:`_fields`."""
    v = list(values)
    return v[:9] + [(v[9], v[10])] + [v[11]] + [(v[12], v[13])] + v[14:]


def _rows(np, data, pos, width: int):
    """The ``width`` bytes at each position, one row each: numpy copies whole rows (one memcpy
    per record) from a strided view, much cheaper than a per-byte fancy index."""
    if len(pos) and int(pos.max()) + width > len(data):
        raise RecordCorrupt(int(pos.max()), "record header runs past the end of the data")
    view = np.lib.stride_tricks.as_strided(data, shape=(max(len(data) - width + 1, 0), width),
                                           strides=(1, 1), writeable=False)
    return view[pos]


def _gather(np, data, at, dtype: str):
    width = np.dtype(dtype).itemsize
    return _rows(np, data, at, width).view(dtype).ravel().astype(dtype[1:])


def _gather_struct(np, data, pos, dtype):
    return _rows(np, data, pos, dtype.itemsize).view(dtype).ravel()
