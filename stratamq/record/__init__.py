"""The CommitLog record: its layout (``layout``), codec (``codec``) and bulk readers (``bulk``).

The one package that knows a record's bytes (spec: ``docs/formats/commitlog-record.md``). It
re-exports the domain types its functions take and return (``stratamq.message``), so callers
write ``from stratamq import record as codec`` and find everything there.
"""

from stratamq.message import (
    DispatchInfo,
    Host,
    Message,
    MessageIllegal,
    Prop,
    PropertiesTooLarge,
    RecordCorrupt,
    StoredMessage,
)
from stratamq.record.bulk import (
    Walk,
    gather_longs,
    locate_fields,
    records_pass,
    resync,
    stamped_runs,
    walk_records,
)
from stratamq.record.codec import (
    STAMP_POSITIONS,
    STAMP_TIMESTAMP,
    EncodedRecord,
    body_crc,
    decode_properties,
    decompress_body,
    encode,
    encode_blank,
    encode_properties,
    encode_record,
    encode_records,
    offset_msg_id,
    parse_offset_msg_id,
    stamp,
    tags_hash_code,
)
from stratamq.record.decoding import (
    check_record,
    decode,
    decode_dispatch_info,
    read_size_and_magic,
    record_body_length,
    record_positions,
    record_property,
    record_store_timestamp,
    record_tags,
)
from stratamq.record.layout import (
    BLANK_MAGIC_CODE,
    END_FILE_MIN_BLANK_LENGTH,
    HEADER_SIZE_V4,
    MAX_PROPERTIES_LENGTH,
    MAX_TOPIC_LENGTH_V1,
    MAX_TOPIC_LENGTH_V2,
    MESSAGE_MAGIC_CODE_V1,
    MESSAGE_MAGIC_CODE_V2,
    MIN_RECORD_SIZE,
    NAME_VALUE_SEPARATOR,
    PHYSICAL_OFFSET_POS,
    PROPERTY_SEPARATOR,
    QUEUE_OFFSET_POS,
    SYS_FLAG_POS,
    SysFlag,
)
from stratamq.record.scan import ScanResult, scan_records, skip_covered

__all__ = [
    "BLANK_MAGIC_CODE", "END_FILE_MIN_BLANK_LENGTH", "HEADER_SIZE_V4", "MAX_PROPERTIES_LENGTH",
    "MAX_TOPIC_LENGTH_V1", "MAX_TOPIC_LENGTH_V2", "MESSAGE_MAGIC_CODE_V1",
    "MESSAGE_MAGIC_CODE_V2", "MIN_RECORD_SIZE", "NAME_VALUE_SEPARATOR", "PHYSICAL_OFFSET_POS",
    "PROPERTY_SEPARATOR", "QUEUE_OFFSET_POS", "STAMP_POSITIONS", "STAMP_TIMESTAMP",
    "SYS_FLAG_POS", "DispatchInfo", "EncodedRecord", "Host", "Message", "MessageIllegal",
    "Prop", "PropertiesTooLarge", "RecordCorrupt", "ScanResult", "StoredMessage", "SysFlag",
    "Walk", "body_crc", "check_record", "decode", "decode_dispatch_info", "decode_properties",
    "decompress_body", "encode", "encode_blank", "encode_properties", "encode_record",
    "encode_records", "gather_longs", "locate_fields", "offset_msg_id", "parse_offset_msg_id",
    "read_size_and_magic", "record_body_length", "record_positions", "record_property",
    "record_store_timestamp", "record_tags", "records_pass", "resync", "scan_records",
    "skip_covered", "stamp", "stamped_runs", "tags_hash_code", "walk_records",
]  # fmt: skip
