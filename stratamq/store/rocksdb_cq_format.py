"""The RocksDB ConsumeQueue's rows: keys, values and table options, written once.

Spec: ``docs/formats/rocksdb-consumequeue.md`` (seed 003; RocketMQ's RocksDBConsumeQueueTable
and RocksDBConsumeQueueOffsetTable). Pure byte layouts and the options both column families are
opened with; ``rocksdb_consume_queue.py`` does the reading and writing.
"""

from __future__ import annotations

import struct

from rocksdict import BlockBasedOptions, Cache, DBCompressionType, Options

CTRL_0, CTRL_1, CTRL_2 = b"\x00", b"\x01", b"\x02"
I32 = struct.Struct(">i")
I64 = struct.Struct(">q")
CQ_VALUE = struct.Struct(">qiqq")  # phys, size, tags code, store time
assert CQ_VALUE.size == 28
OFFSET_VALUE = struct.Struct(">qq")  # phys, queue offset
assert OFFSET_VALUE.size == 16
CQ_KEY_TAIL = 1 + I64.size  # CTRL_1 + queue offset, after the queue prefix
MAX_MARK, MIN_MARK = b"max", b"min"
OFFSET_CF = "offset"
CHECKPOINT_TOPIC = "CHECKPOINT_TOPIC"  # RocketMQ's RMQ_SYS_ROCKSDB_OFFSET_TOPIC
BATCH_MAX = 4096  # units per WriteBatch before it is written even mid-round
CqRow = tuple[int, int, int, int]  # a decoded value: phys, size, tags code, store time
MAX_RECORD_SPAN = 1 << 26  # bytes: more than any record (maxMessageSize is 4 MiB + header)


# -- keys ---------------------------------------------------------------------------------------

def topic_head(topic_bytes: bytes) -> bytes:
    """``topicLen | CTRL_1 | topic | CTRL_1``: the start of every key of a topic."""
    return I32.pack(len(topic_bytes)) + CTRL_1 + topic_bytes + CTRL_1


def queue_prefix(topic_bytes: bytes, queue_id: int) -> bytes:
    return topic_head(topic_bytes) + I32.pack(queue_id)


def cq_key(prefix: bytes, queue_offset: int) -> bytes:
    return prefix + CTRL_1 + I64.pack(queue_offset)


def queue_range(prefix: bytes) -> tuple[bytes, bytes]:
    """[start, end) holding exactly one queue's units (CTRL_0 < CTRL_1 < CTRL_2)."""
    return prefix + CTRL_0, prefix + CTRL_2


def topic_range(topic_bytes: bytes) -> tuple[bytes, bytes]:
    """[start, end) holding every key of one topic, in either column family."""
    head = I32.pack(len(topic_bytes)) + CTRL_1 + topic_bytes
    return head + CTRL_0, head + CTRL_2


def offset_key(topic_bytes: bytes, queue_id: int, is_max: bool) -> bytes:
    return (topic_head(topic_bytes) + (MAX_MARK if is_max else MIN_MARK) + CTRL_1
            + I32.pack(queue_id))


def parse_offset_key(key: bytes) -> tuple[str, bool, int] | None:
    """(topic, is_max, queue id) of an offset-table key, or None if it is malformed."""
    if len(key) < 4 + 1 + 1 + 3 + 1 + 4:
        return None
    (n,) = I32.unpack_from(key, 0)
    if n < 0 or len(key) != 4 + 1 + n + 1 + 3 + 1 + 4:
        return None
    mark = key[4 + 1 + n + 1: 4 + 1 + n + 4]
    if mark not in (MAX_MARK, MIN_MARK):
        return None
    (queue_id,) = I32.unpack_from(key, len(key) - 4)
    return key[5:5 + n].decode("utf-8", "replace"), mark == MAX_MARK, queue_id


CHECKPOINT_KEY = offset_key(CHECKPOINT_TOPIC.encode(), 0, True)
# The CommitLog min offset the last full expiry pass ran for (i64); see the module docstring.
EXPIRED_BELOW_KEY = offset_key(CHECKPOINT_TOPIC.encode(), 0, False)
SYSTEM_KEYS = (CHECKPOINT_KEY, EXPIRED_BELOW_KEY)


def rocksdb_options() -> Options:
    """Options for both column families, each chosen for rows of 28 or 16 bytes:

    * no compression: a value is offsets and sizes (little to gain) and reads would pay to
      decompress every block;
    * a bloom filter (10 bits per key) so a ``get`` for a row that is not in a file skips it:
      first use of a queue's offset rows, the binary searches of expiry and truncation, and
      offset-by-time all ``get`` single keys. No prefix bloom: a prefix extractor needs a fixed
      prefix length and a queue's prefix varies with its topic's length;
    * a 64 MiB block cache shared by both column families, index and filter blocks included, so
      a restart re-reads hot blocks from memory rather than through the page cache's syscalls.
    """
    opts = Options(raw_mode=True)
    opts.set_compression_type(DBCompressionType.none())
    table = BlockBasedOptions()
    table.set_bloom_filter(10, False)
    table.set_block_cache(_BLOCK_CACHE)
    table.set_cache_index_and_filter_blocks(True)
    opts.set_block_based_table_factory(table)
    return opts


_BLOCK_CACHE = Cache(64 * 1024 * 1024)
