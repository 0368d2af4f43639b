"""The CommitLog record layout, written once: magic codes, ``sys_flag`` bits and the header
table every field offset is derived from. Spec: ``docs/formats/commitlog-record.md``.

A record is big-endian::

    total_size i32 | magic_code u32 | body_crc i32 | queue_id i32 | flag i32 | queue_offset i64 |
    physical_offset i64 | sys_flag i32 | born_timestamp i64 | born_host (ip 4|16, port i32) |
    store_timestamp i64 | store_host (ip 4|16, port i32) | reconsume_times i32 |
    prepared_transaction_offset i64 | body_length i32 | body | topic_length u8 (u16 in V2) |
    topic | properties_length u16 | properties
"""

from __future__ import annotations

import struct

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

