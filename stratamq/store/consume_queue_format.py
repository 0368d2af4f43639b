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


def written_units(buf: bytes | memoryview, limit: int) -> int:
    """How many units at the head of ``buf[:limit]`` were written: the count before the first
    unit whose CommitLog offset is negative or whose size is not positive (a never-written,
    zeroed unit or a torn one). That unit is where recovery cuts a queue.

    One pass in numpy, not a Python step per unit: a 6 MB file holds 300,000 units, and
    recovery (and every Spark plan of a store directory) reads the newest files of every queue.
    """
    count = limit // UNIT_SIZE
    # The first units in Python: numpy's fixed cost (and its import) is more than a few units'
    # loop, and a queue of few messages ends within them (its data is a block of 204 units).
    head = min(count, _PYTHON_UNITS_MAX)
    for n, (offset, size, _code) in enumerate(UNIT.iter_unpack(buf[:head * UNIT_SIZE])):
        if offset < 0 or size <= 0:
            return n
    if count == head:
        return count
    import numpy as np

    units = np.frombuffer(buf, dtype=_UNIT_DTYPE, count=count)
    bad = (units["commitlog_offset"] < 0) | (units["size"] <= 0)
    first_bad = int(bad.argmax())
    return first_bad if bad[first_bad] else count


_PYTHON_UNITS_MAX = 32
_UNIT_DTYPE = [("commitlog_offset", ">i8"), ("size", ">i4"), ("tags_code", ">i8")]
