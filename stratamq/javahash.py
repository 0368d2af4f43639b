"""Java's ``String.hashCode``, written once: RocketMQ hashes tags (the ConsumeQueue's filter
code), index keys and message groups (queue selection) with it, over UTF-16 code units."""

from __future__ import annotations

import sys
from itertools import accumulate, repeat
from operator import mul

__all__ = ["POW31", "hash_u32", "java_string_hash", "to_signed"]

# 31**j mod 2**32: Java's hash is sum(unit[i] * 31**(n-1-i)) mod 2**32, so with the units
# reversed it is a dot product with this table, done in C by ``map``/``sum`` (a Python loop
# over the units costs ~100 ns a unit; the dispatcher hashes every key of every record).
# Built by running products (one multiply per entry), not a ``pow`` per entry: every process
# that imports the store builds it, and 65,536 ``pow`` calls took ~85 ms of each start-up.
POW31 = tuple(accumulate(repeat(31, (1 << 16) - 1), lambda p, b: p * b & 0xFFFFFFFF,
                          initial=1))


def to_signed(h: int) -> int:
    return h - (1 << 32) if h & 0x80000000 else h


def hash_u32(text: str) -> tuple[int, int]:
    """(Java hashCode as unsigned 32 bits, length in UTF-16 code units)."""
    if text.isascii():
        units: bytes | memoryview = text.encode("ascii")
    else:
        raw = text.encode("utf-16-le" if sys.byteorder == "little" else "utf-16-be")
        units = memoryview(raw).cast("H")
    if len(units) <= len(POW31):
        return sum(map(mul, reversed(units), POW31)) & 0xFFFFFFFF, len(units)
    h = 0
    for unit in units:
        h = (31 * h + unit) & 0xFFFFFFFF
    return h, len(units)


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode()`` (signed 32 bits, over UTF-16 code units)."""
    return to_signed(hash_u32(text)[0])
