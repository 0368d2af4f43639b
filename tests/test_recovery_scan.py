"""scan_records (recovery's loop) and skip_covered (replay's peek) agree with the per-record
codec functions on every layout: IPv4/IPv6 hosts, V1/V2 topics, and damaged bytes."""

from __future__ import annotations

import pytest

from stratamq import record as codec
from stratamq.message import Host, Message
from stratamq.record.layout import _layout_for

STORE = Host("127.0.0.1", 10911)


def _log(messages: list[Message]) -> tuple[bytearray, list[int]]:
    buf, starts = bytearray(), []
    for i, msg in enumerate(messages):
        rec = codec.encode(msg, STORE, max_message_size=1 << 20)
        starts.append(len(buf))
        buf += rec.data
        codec.stamp(buf, starts[-1], i, starts[-1], 1_700_000_000_000 + i, rec.store_timestamp_pos)
    buf += codec.encode_blank(64) + bytes(56)
    return buf, starts


def _mixed() -> list[Message]:
    return [
        Message("T", b"a" * 10, 0, {"TAGS": "x"}),
        Message("T" * 200, b"long topic: V2 magic", 1),
        Message("T", b"v6", 2, born_host=Host("::1", 7)),
        Message("U", b"", 3, {"KEYS": "k1 k2"}),
    ]


def test_scan_accepts_every_layout_and_stops_at_the_blank() -> None:
    buf, starts = _log(_mixed())
    scan = codec.scan_records(memoryview(buf), 0, len(buf), 0, True)
    assert (scan.records, scan.blank, scan.problem) == (4, True, None)
    assert scan.end == len(buf) - 64


@pytest.mark.parametrize("record", [0, 1, 2, 3])
@pytest.mark.parametrize("where", ["body", "size", "offset"])
def test_scan_stops_where_check_record_fails(record: int, where: str) -> None:
    buf, starts = _log(_mixed())
    at = starts[record]
    if where == "body":  # a flipped body byte (or, for an empty body, the topic length)
        buf[at + _layout_for(buf[at + codec.SYS_FLAG_POS + 3]).header.size] ^= 0x40
    elif where == "size":
        buf[at + 3] ^= 0x01
    else:
        buf[at + codec.PHYSICAL_OFFSET_POS + 7] ^= 0x08
    scan = codec.scan_records(memoryview(buf), 0, len(buf), 0, True)
    assert scan.records == record and scan.end == at and scan.problem is not None
    with pytest.raises(codec.RecordCorrupt) as exc:
        codec.check_record(buf, at, len(buf), at, True)
    assert scan.problem.reason == exc.value.reason


def test_skip_covered_stops_at_the_first_record_a_queue_lacks() -> None:
    msgs = _mixed()
    buf, starts = _log(msgs)
    asked: list[tuple[str, int]] = []

    def floor_of(topic: str, queue_id: int) -> int:
        asked.append((topic, queue_id))
        return starts[2] + 1 if queue_id == 2 else starts[1]  # queue 1 lacks its record

    pos, last = codec.skip_covered(memoryview(buf), 0, len(buf), 0, {}, floor_of)
    assert (pos, last) == (starts[1], starts[0])
    assert asked == [("T", 0), ("T" * 200, 1)]
    # Everything covered: it walks to the blank record and leaves it to the caller.
    pos, last = codec.skip_covered(memoryview(buf), 0, len(buf), 0, {}, lambda t, q: 1 << 40)
    assert (pos, last) == (len(buf) - 64, starts[3])
