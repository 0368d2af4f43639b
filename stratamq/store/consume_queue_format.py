"""The ConsumeQueue unit: 20 bytes per message of a topic/queue.

Spec: ``docs/formats/consumequeue-unit.md`` (seed 004, section 1.4)::

    0  commitlog_offset  i64  physical offset of the record in the CommitLog
    8  size              i32  record size in bytes
    12 tags_code         i64  Java hashCode of the TAGS property (a delivery time for timers)

The unit for queue offset ``n`` is at byte ``n * 20`` of the queue's byte space; files are named
by the byte offset of their first unit. RocketMQ fills the head of a queue that starts past 0
with blank units (offset 0, size Integer.MAX_VALUE, code 0).
"""

from __future__ import annotations

import struct

UNIT = struct.Struct(">qiq")
UNIT_SIZE = UNIT.size
assert UNIT_SIZE == 20
BLANK_UNIT = UNIT.pack(0, 0x7FFFFFFF, 0)


def is_blank_unit(commitlog_offset: int, size: int, tags_code: int) -> bool:
    return commitlog_offset == 0 and size == 0x7FFFFFFF and tags_code == 0
