"""``record.copy_check``: records read back from a copy (the tier) with exact bytes broken on
purpose; the bulk path (numpy, many records) and the one-at-a-time path (a few records, or an
IPv6 host) find the same records for the same reasons."""

from __future__ import annotations

import struct

import pytest

from stratamq import record as codec
from stratamq.message import Host, Message
from stratamq.record.copy_check import CopyChecks, check_copies

V4 = Host("127.0.0.1", 10911)
V6 = Host("::1", 10911)


def records(n: int, topic: str = "Orders", host: Host = V4) -> list[bytearray]:
    out = []
    for i in range(n):
        data, _size, _ = codec.encode_record(
            Message(topic, b"body-%04d-" % i + bytes(range(256)), 3, {"KEYS": f"k{i}"}),
            host, 1 << 20)
        rec = bytearray(data)
        struct.pack_into(">qq", rec, codec.QUEUE_OFFSET_POS, 100 + i, 5000 + 400 * i)
        out.append(rec)
    return out


def layout(recs: list[bytearray]) -> tuple[bytes, list[int], list[int]]:
    starts, at = [], 0
    for r in recs:
        starts.append(at)
        at += len(r)
    return b"".join(recs), starts, [len(r) for r in recs]


@pytest.mark.parametrize("n,host", [(60, V4), (12, V4), (60, V6)])
def test_each_kind_of_damage_is_found_for_its_reason(n, host):
    recs = records(n, host=host)
    buf, starts, sizes = layout(recs)
    assert check_copies(buf, starts, sizes, "Orders", 3, 100) == {}
    recs[1][recs[1].find(b"body-") + 3] ^= 0x20  # a flipped body byte
    struct.pack_into(">q", recs[2], codec.QUEUE_OFFSET_POS, 90)  # another offset's record
    recs[3][:] = records(4, topic="Orderz", host=host)[3]  # another topic's record
    struct.pack_into(">i", recs[4], 12, 7)  # another queue's record
    recs[5][4:8] = b"\0\0\0\0"  # no record starts there
    buf, starts, sizes = layout(recs)
    sizes[6] -= 1  # the unit says one byte less
    found = check_copies(buf, starts, sizes, "Orders", 3, 100)
    assert set(found) == {1, 2, 3, 4, 5, 6}
    assert "body CRC" in found[1]
    assert "Orders/3 at queue offset 90" in found[2]
    assert "Orderz/3" in found[3]
    assert "Orders/7" in found[4]
    assert "magic code" in found[5]
    assert "size" in found[6]
    # The same answer a record at a time (as a read of a few records checks them).
    few = {i: check_copies(buf, starts[i:i + 1], sizes[i:i + 1], "Orders", 3, 100 + i)
           for i in range(8)}
    assert {i for i, f in few.items() if f} == set(found)


def test_a_unit_pointing_outside_what_was_read_is_found():
    buf, starts, sizes = layout(records(60))
    starts[10] = len(buf) - 10  # past the end of the buffer
    starts[11] = -40  # before its start
    assert set(check_copies(buf, starts, sizes, "Orders", 3, 100)) == {10, 11}


def test_a_block_checked_a_window_at_a_time_says_each_record_in_its_own_window():
    recs = records(100)
    recs[10][recs[10].find(b"body-") + 3] ^= 0x20  # a flipped body byte
    struct.pack_into(">q", recs[70], codec.QUEUE_OFFSET_POS, 5)  # another offset's record
    recs[95][4:8] = b"\0\0\0\0"  # no record starts there
    buf, starts, sizes = layout(recs)
    checks = CopyChecks(buf, starts, sizes, "Orders", 3, 100)
    later = checks.window(40, 96)
    assert set(later) == {70, 95} and "queue offset 5" in later[70]
    assert set(checks.window(0, 40)) == {10}
    assert checks.window(96, 100) == {}
    assert check_copies(buf, starts, sizes, "Orders", 3, 100).keys() == {10, 70, 95}
