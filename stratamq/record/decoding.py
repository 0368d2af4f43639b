"""Decoding CommitLog records: check a record, decode it whole or only the fields a reader
needs (dispatch info, store time, body length, positions, topic, tags, one property).

Spec: ``docs/formats/commitlog-record.md``; encoding and the small codecs beside the record are
in ``codec.py``. No I/O, no locks: callers hand it buffers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stratamq.message import (
    DispatchInfo,
    Prop,
    RecordCorrupt,
    StoredMessage,
    _host,
)
from stratamq.record.codec import _HOST_FLAGS, body_crc, decode_properties, tags_hash_code
from stratamq.record.layout import (
    _INT,
    _POSITIONS,
    _SHORT,
    _SIZE_MAGIC,
    _TIMESTAMP,
    _V4,
    BLANK_MAGIC_CODE,
    END_FILE_MIN_BLANK_LENGTH,
    MESSAGE_MAGIC_CODE_V1,
    MESSAGE_MAGIC_CODE_V2,
    MIN_RECORD_SIZE,
    NAME_VALUE_SEPARATOR,
    PROPERTY_SEPARATOR,
    QUEUE_OFFSET_POS,
    SYS_FLAG_POS,
    _layout_for,
)

if TYPE_CHECKING:
    from stratamq.record.codec import Buffer


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
    msg.topic = topic_name(bytes(buf[topic_start : topic_start + topic_len]))
    msg.properties = decode_properties(buf[props_start : props_start + props_len])
    return msg


_new_stored_message = object.__new__



_TOPIC_NAMES: dict[bytes, str] = {}  # topic bytes -> str: few distinct topics, decoded once


def topic_name(raw: bytes) -> str:
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
    topic = topic_name(bytes(buf[p : p + topic_len]))
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
    return topic_name(bytes(buf[start : start + length]))


def record_tags(buf: Buffer, pos: int) -> str | None:
    """The TAGS property of the record at ``pos`` (for exact tag filtering after the hash)."""
    total, magic = _SIZE_MAGIC.unpack_from(buf, pos)
    layout = _layout_for(_INT.unpack_from(buf, pos + SYS_FLAG_POS)[0])
    body_len = _INT.unpack_from(buf, pos + layout.header.size - 4)[0]
    _, _, props_start, props_len = _tail(
        buf, pos, magic, pos + layout.header.size, body_len, pos + total
    )
    return decode_properties(buf[props_start : props_start + props_len]).get(Prop.TAGS)


