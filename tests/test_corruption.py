"""Damaged files on disk, and input the store must refuse.

Each damage test writes a store, closes it cleanly, damages real bytes of its files, and reopens
it (usually with an ``abort`` marker, as a crash leaves it): the damaged record and everything
after it must be cut, everything before it must be served unchanged, the ConsumeQueues must
forget the cut records, and new puts must continue from the cut.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from conftest import REFERENCE_MESSAGES, reference_body
from damage import patch

from stratamq import record as codec
from stratamq.config import StoreConfig
from stratamq.message import Message
from stratamq.store.layout import StoreLayout, parse_segment_name, segment_name
from stratamq.store.message_store import MessageStore
from stratamq.store.results import GetMessageStatus, PutMessageStatus

SEGMENT = 64 * 1024  # small_config's CommitLog segment size
TOPICS = ("DamageT0", "DamageT1")

# Byte positions of header fields in a record with IPv4 hosts (docs/formats/commitlog-record.md).
TOTAL_SIZE_POS = 0
MAGIC_POS = 4
PHYSICAL_OFFSET_POS = 28
BODY_LENGTH_POS = 84
BODY_POS = 88


def body_for(i: int, length: int | None = None) -> bytes:
    unit = b"rec-%06d|" % i
    if length is None:
        length = 600 + (i * 53) % 700
    return (unit * (length // len(unit) + 1))[:length]


def message_for(i: int) -> Message:
    return Message(
        topic=TOPICS[i % 2],
        queue_id=(i // 2) % 2,
        body=body_for(i),
        properties={"TAGS": f"Tag{i % 3}", "KEYS": f"key-{i}"},
    )


class Written:
    """What a put returned for one message: enough to find and check it later."""

    def __init__(self, msg: Message, appended) -> None:
        self.topic = msg.topic
        self.queue_id = msg.queue_id
        self.body = msg.body
        self.properties = dict(msg.properties)
        self.queue_offset = appended.queue_offset
        self.physical_offset = appended.physical_offset
        self.size = appended.size

    def __repr__(self) -> str:
        return (f"Written({self.topic}/{self.queue_id}@{self.queue_offset}, "
                f"phys={self.physical_offset})")


def put_all(store: MessageStore, messages: list[Message]) -> list[Written]:
    out = []
    for msg in messages:
        result = store.put_message(msg)
        assert result.ok, result
        out.append(Written(msg, result.messages[0]))
    assert store.wait_dispatched(30)
    return out


def write_store(cfg: StoreConfig, count: int = 240) -> list[Written]:
    with MessageStore(cfg) as store:
        written = put_all(store, [message_for(i) for i in range(count)])
    assert len({w.physical_offset // SEGMENT for w in written}) >= 3, "store should roll over"
    return written


def segment_of(cfg: StoreConfig, physical_offset: int, size: int = SEGMENT) -> tuple[Path, int]:
    start = physical_offset - physical_offset % size
    return cfg.root / "commitlog" / segment_name(start), physical_offset - start


def flip_bit(path: Path, pos: int, bit: int = 0) -> None:
    with path.open("r+b") as f:
        f.seek(pos)
        byte = f.read(1)[0]
        f.seek(pos)
        f.write(bytes([byte ^ (1 << bit)]))


def open_store(cfg: StoreConfig, crashed: bool = True) -> MessageStore:
    """Open the store, first leaving the ``abort`` marker a crash would have left."""
    if crashed:
        StoreLayout(cfg.root).abort.touch()
    return MessageStore(cfg).open()


def queue_contents(store: MessageStore, topic: str, queue_id: int) -> list:
    """Every message of a queue, in queue-offset order, checking the offsets are dense."""
    max_offset = store.get_max_offset_in_queue(topic, queue_id)
    out = []
    while len(out) < max_offset:
        with store.get_messages("g", topic, queue_id, len(out), max_count=500,
                                max_bytes=1 << 30) as got:
            assert got.status is GetMessageStatus.FOUND, (topic, queue_id, len(out), got)
            out.extend(got.messages())
    assert [m.queue_offset for m in out] == list(range(max_offset))
    return out


def assert_store_holds(store: MessageStore, expected: list[Written]) -> None:
    """The store serves exactly ``expected``: same queues, offsets, positions and bytes."""
    by_queue: dict[tuple[str, int], list[Written]] = {}
    for w in expected:
        by_queue.setdefault((w.topic, w.queue_id), []).append(w)
    for (topic, queue_id), want in by_queue.items():
        got = queue_contents(store, topic, queue_id)
        assert len(got) == len(want), f"{topic}/{queue_id}: {len(got)} messages, want {len(want)}"
        for g, w in zip(got, want):
            assert g.queue_offset == w.queue_offset
            assert g.physical_offset == w.physical_offset
            assert g.body == w.body, f"{w}: body differs"
            assert g.properties.get("KEYS") == w.properties.get("KEYS")
            assert g.tags == w.properties.get("TAGS")


def assert_put_continues_at(store: MessageStore, cut: Written, body: bytes) -> Written:
    """A new message for the cut record's queue takes its queue offset and its position."""
    before = store.get_max_offset_in_queue(cut.topic, cut.queue_id)
    assert before == cut.queue_offset
    msg = Message(topic=cut.topic, queue_id=cut.queue_id, body=body)
    result = store.put_message(msg)
    assert result.ok, result
    assert result.queue_offset == cut.queue_offset
    assert result.physical_offset == cut.physical_offset
    assert store.wait_dispatched(30)
    with store.get_messages("g", cut.topic, cut.queue_id, cut.queue_offset, max_count=1) as got:
        assert got.status is GetMessageStatus.FOUND
        assert next(got.messages()).body == body
    return Written(msg, result.messages[0])


def check_cut(cfg: StoreConfig, written: list[Written], index: int, crashed: bool,
              reason: str | None) -> None:
    """Reopen after record ``index`` was damaged: it and everything after it are gone."""
    cut = written[index]
    kept = written[:index]
    with open_store(cfg, crashed) as store:
        report = store.recovery
        assert report.abnormal is crashed
        assert report.problem is not None, "recovery did not say why it cut the log"
        if reason is not None:
            assert reason in report.problem, report.problem
        assert report.end_offset == cut.physical_offset
        assert store.max_physical_offset == cut.physical_offset
        assert report.dropped_units == len(written) - index
        for w in written[index:]:
            # The queue no longer has units for cut records: reading there finds nothing.
            with store.get_messages("g", w.topic, w.queue_id, w.queue_offset) as got:
                assert got.status in (GetMessageStatus.OFFSET_OVERFLOW_ONE,
                                      GetMessageStatus.OFFSET_OVERFLOW_BADLY), (w, got)
        assert_store_holds(store, kept)
        new = assert_put_continues_at(store, cut, b"after-the-cut" * 10)
    # The repaired store opens cleanly and keeps both the old and the new messages.
    with open_store(cfg, crashed=False) as store:
        assert store.recovery.problem is None
        assert store.recovery.dropped_units == 0
        assert_store_holds(store, [*kept, new])


# -- torn and flipped records -------------------------------------------------------------------


@pytest.mark.parametrize("crashed", [True, False], ids=["abort", "clean"])
@pytest.mark.parametrize("tear", ["zero_second_half", "short_total_size"])
def test_torn_last_record_is_cut(small_config, tear, crashed):
    written = write_store(small_config)
    last = written[-1]
    path, rel = segment_of(small_config, last.physical_offset)
    if tear == "zero_second_half":
        half = last.size // 2
        patch(path, rel + half, bytes(last.size - half))
    else:
        patch(path, rel + TOTAL_SIZE_POS, (last.size // 2).to_bytes(4, "big"))
    check_cut(small_config, written, len(written) - 1, crashed, reason=None)


@pytest.mark.parametrize("crashed", [True, False], ids=["abort", "clean"])
def test_body_bit_flip_near_tail_is_cut_there(small_config, crashed):
    written = write_store(small_config)
    index = len(written) - 3  # two valid records follow the damaged one
    victim = written[index]
    path, rel = segment_of(small_config, victim.physical_offset)
    flip_bit(path, rel + BODY_POS + len(victim.body) // 2, bit=3)
    check_cut(small_config, written, index, crashed, reason="CRC")


@pytest.mark.parametrize(
    ("field", "pos", "bit", "reason"),
    [
        ("magic_code", MAGIC_POS + 3, 0, "magic"),
        ("total_size_low_bit", TOTAL_SIZE_POS + 3, 2, None),
        ("total_size_high_bit", TOTAL_SIZE_POS + 1, 6, "size"),
        ("physical_offset", PHYSICAL_OFFSET_POS + 6, 1, "physical offset"),
        ("body_length", BODY_LENGTH_POS + 3, 3, None),
    ],
)
def test_header_bit_flip_is_cut_there(small_config, field, pos, bit, reason):
    written = write_store(small_config)
    index = len(written) - 2
    victim = written[index]
    path, rel = segment_of(small_config, victim.physical_offset)
    flip_bit(path, rel + pos, bit)
    check_cut(small_config, written, index, crashed=True, reason=reason)


def test_recovery_problem_names_the_commitlog_offset(small_config):
    """The report must point at the damaged record's CommitLog offset, which is what a user
    looks up (``stratamq`` tools, msg ids); a position inside one segment file is ambiguous."""
    written = write_store(small_config)
    victim = written[-1]
    assert victim.physical_offset >= SEGMENT  # not in the first segment: the two differ
    path, rel = segment_of(small_config, victim.physical_offset)
    flip_bit(path, rel + BODY_POS, bit=0)
    with open_store(small_config) as store:
        assert f"corrupt record at {victim.physical_offset}:" in store.recovery.problem


def tree_digest(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def test_read_only_open_of_a_damaged_store_changes_nothing(small_config):
    """``read_only=True`` is for inspecting a store (a damaged one above all) without changing
    a byte: it must serve what is intact and leave the files exactly as they were."""
    written = write_store(small_config)
    victim = written[-1]
    path, rel = segment_of(small_config, victim.physical_offset)
    flip_bit(path, rel + BODY_POS, bit=0)
    StoreLayout(small_config.root).abort.touch()
    before = tree_digest(small_config.root)
    with MessageStore(small_config, read_only=True) as store:
        assert store.recovery.problem is not None
        assert store.max_physical_offset == victim.physical_offset
        assert_store_holds(store, written[:-1])
    assert tree_digest(small_config.root) == before


# -- garbage segments ----------------------------------------------------------------------------


def stale_copy(cfg: StoreConfig) -> bytes:
    """A whole, well-formed old segment: valid records with valid CRCs at the wrong offsets."""
    return (cfg.root / "commitlog" / segment_name(0)).read_bytes()


@pytest.mark.parametrize("crashed", [True, False], ids=["abort", "clean"])
@pytest.mark.parametrize("content", ["random", "stale_copy"])
def test_garbage_segment_after_the_last_is_deleted(small_config, content, crashed):
    written = write_store(small_config)
    end = written[-1].physical_offset + written[-1].size
    segments = sorted((small_config.root / "commitlog").iterdir())
    next_start = parse_segment_name(segments[-1].name) + SEGMENT
    garbage = small_config.root / "commitlog" / segment_name(next_start)
    data = random.Random(7).randbytes(SEGMENT) if content == "random" else stale_copy(small_config)
    garbage.write_bytes(data)

    with open_store(small_config, crashed) as store:
        assert store.recovery.end_offset == end
        assert store.max_physical_offset == end
        assert garbage.name in store.recovery.deleted_segments
        assert not garbage.exists()
        assert store.recovery.dropped_units == 0
        assert_store_holds(store, written)
        extra = put_all(store, [message_for(i) for i in range(1000, 1010)])
        assert extra[0].physical_offset == end
    with open_store(small_config) as store:
        assert store.recovery.problem is None
        assert_store_holds(store, written + extra)


def test_garbage_in_place_of_the_newest_segment(small_config):
    """The newest segment (begun right after the previous one filled up and got its blank
    record) holds garbage: the log ends where that segment begins."""
    with MessageStore(small_config) as store:
        written = put_all(store, [message_for(i) for i in range(200)])
        i = 200
        while written[-1].physical_offset % SEGMENT != 0:  # until a put opens a new segment
            written += put_all(store, [message_for(i)])
            i += 1
    newest, rel = segment_of(small_config, written[-1].physical_offset)
    assert rel == 0
    newest.write_bytes(random.Random(11).randbytes(SEGMENT))
    with open_store(small_config) as store:
        report = store.recovery
        assert report.problem is not None
        assert report.end_offset == written[-1].physical_offset
        assert report.dropped_units == 1
        assert_store_holds(store, written[:-1])
        new = assert_put_continues_at(store, written[-1], b"fresh" * 50)
    with open_store(small_config) as store:
        assert store.recovery.problem is None
        assert store.recovery.dropped_units == 0
        assert_store_holds(store, [*written[:-1], new])


# -- the cut tail must stay dead ------------------------------------------------------------------


def test_stale_records_behind_a_cut_are_not_resurrected(small_config):
    """Records after a damaged one are cut. If their bytes stayed on disk, a new record of the
    same size written at the cut would end exactly where the first stale record begins, with
    the physical offset that stale record claims: a later crash recovery would then take the
    stale records back as valid and re-dispatch them."""
    topic, queue_id = "SameSize", 1
    size = 700

    def msg(i: int) -> Message:
        return Message(topic=topic, queue_id=queue_id, body=body_for(i, size),
                       properties={"KEYS": f"k{i:04d}"})

    with MessageStore(small_config) as store:
        written = put_all(store, [msg(i) for i in range(60)])
    assert len({w.size for w in written}) == 1
    index = len(written) - 3
    cut = written[index]
    path, rel = segment_of(small_config, cut.physical_offset)
    assert rel + 3 * cut.size <= SEGMENT, "the three last records share one segment"
    flip_bit(path, rel + BODY_POS + 5, bit=1)

    with open_store(small_config) as store:
        assert store.recovery.end_offset == cut.physical_offset
        assert store.recovery.dropped_units == 3
        new = put_all(store, [msg(5000)])  # same size: ends where written[index + 1] began
        assert new[0].physical_offset == cut.physical_offset
        assert new[0].queue_offset == cut.queue_offset
        assert new[0].size == cut.size
    # Crash again (the marker is back) and recover from scratch.
    with open_store(small_config) as store:
        report = store.recovery
        assert report.abnormal is True
        assert report.end_offset == cut.physical_offset + cut.size, "stale records came back"
        assert report.dropped_units == 0, "stale ConsumeQueue units came back"
        assert store.get_max_offset_in_queue(topic, queue_id) == cut.queue_offset + 1
        assert_store_holds(store, written[:index] + new)
        # New puts take the offsets the stale records once had, with their own bytes.
        more = put_all(store, [msg(6000), msg(6001)])
        assert [w.queue_offset for w in more] == [cut.queue_offset + 1, cut.queue_offset + 2]
        assert_store_holds(store, written[:index] + new + more)
    # And the bytes after the end really are zero on disk.
    end = more[-1].physical_offset + more[-1].size
    seg, rel = segment_of(small_config, end)
    assert seg.read_bytes()[rel:].count(0) == SEGMENT - rel


# -- the reference store -------------------------------------------------------------------------


def reference_position(i: int) -> tuple[str, int, int]:
    """Topic, queue id and queue offset of reference message i."""
    return f"BenchTopic{i % 4}", (i // 4) % 4, i // 16


def test_reference_store_with_flipped_last_record(reference_copy):
    cfg = StoreConfig(store_path_root_dir=str(reference_copy))
    last = REFERENCE_MESSAGES - 1
    topic, queue_id, queue_offset = reference_position(last)
    with MessageStore(cfg, read_only=True) as store:
        with store.get_messages("g", topic, queue_id, queue_offset, max_count=1) as got:
            (record,) = got.records
            phys, size = record.physical_offset, record.size
            assert record.decode().body == reference_body(last)
        segment_size = store.commitlog.files.mapped_file_size
        assert store.max_physical_offset == phys + size
    path, rel = segment_of(cfg, phys, segment_size)
    flip_bit(path, rel + BODY_POS + 100, bit=5)
    StoreLayout(reference_copy).abort.touch()

    with MessageStore(cfg) as store:
        report = store.recovery
        assert report.abnormal is True
        assert "CRC" in (report.problem or "")
        assert report.end_offset == phys
        assert report.dropped_units == 1
        seen = 0
        for t in range(4):
            for q in range(4):
                for m in queue_contents(store, f"BenchTopic{t}", q):
                    i = (m.queue_offset * 4 + q) * 4 + t
                    assert reference_position(i) == (m.topic, m.queue_id, m.queue_offset)
                    assert m.body == reference_body(i), i
                    assert m.keys == [f"key-{i}"]
                    seen += 1
        assert seen == REFERENCE_MESSAGES - 1
        result = store.put_message(Message(topic=topic, queue_id=queue_id, body=b"new"))
        assert result.ok
        assert (result.queue_offset, result.physical_offset) == (queue_offset, phys)


# -- refused input ------------------------------------------------------------------------------


def good(i: int) -> Message:
    return Message(topic="Good", queue_id=0, body=body_for(i, 100), properties={"TAGS": "g"})


BAD_INPUT = {
    "body_over_max_message_size": (
        lambda: Message(topic="Good", queue_id=0, body=b"x" * 4097),
        PutMessageStatus.MESSAGE_ILLEGAL,
    ),
    "properties_over_32767_bytes": (
        lambda: Message(topic="Good", queue_id=0, body=b"b",
                        properties={"KEYS": "k" * 32767}),
        PutMessageStatus.PROPERTIES_SIZE_EXCEEDED,
    ),
    "properties_over_32767_utf8_bytes": (  # 20,000 characters, 40,000 bytes
        lambda: Message(topic="Good", queue_id=0, body=b"b", properties={"KEYS": "é" * 20_000}),
        PutMessageStatus.PROPERTIES_SIZE_EXCEEDED,
    ),
    "property_value_with_x01": (
        lambda: Message(topic="Good", queue_id=0, body=b"b", properties={"KEYS": "a\x01b"}),
        PutMessageStatus.MESSAGE_ILLEGAL,
    ),
    "property_value_with_x02": (
        lambda: Message(topic="Good", queue_id=0, body=b"b", properties={"TAGS": "a\x02b"}),
        PutMessageStatus.MESSAGE_ILLEGAL,
    ),
    "property_name_with_x01": (
        lambda: Message(topic="Good", queue_id=0, body=b"b", properties={"a\x01b": "v"}),
        PutMessageStatus.MESSAGE_ILLEGAL,
    ),
    "empty_topic": (
        lambda: Message(topic="", queue_id=0, body=b"b"),
        PutMessageStatus.MESSAGE_ILLEGAL,
    ),
    "negative_queue_id": (
        lambda: Message(topic="Good", queue_id=-1, body=b"b"),
        PutMessageStatus.MESSAGE_ILLEGAL,
    ),
    "record_bigger_than_a_segment": (  # max_message_size is raised for this one
        lambda: Message(topic="Good", queue_id=0, body=b"x" * SEGMENT),
        PutMessageStatus.MESSAGE_ILLEGAL,
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUT))
@pytest.mark.parametrize("batch", [False, True], ids=["single", "in_batch"])
def test_refused_input_writes_nothing(small_config, case, batch):
    make, status = BAD_INPUT[case]
    max_size = 1024 * 1024 if case == "record_bigger_than_a_segment" else 4096
    # No segment pre-allocation: the allocator creates the next segment in the background
    # whenever it gets to it, which a listing of the directory before and after would race.
    cfg = StoreConfig(**{**vars(small_config), "max_message_size": max_size,
                         "pre_allocate_mapped_file": False})
    with MessageStore(cfg) as store:
        before = put_all(store, [good(i) for i in range(3)])
        end = store.max_physical_offset
        segments = sorted(os.listdir(cfg.root / "commitlog"))
        bad = make()
        if batch:  # one bad message refuses the whole batch: none of it is written
            result = store.put_messages([good(10), bad, good(11)])
        else:
            result = store.put_message(bad)
        assert result.status is status, result
        assert not result.messages
        assert result.error, "a refusal must say why"
        assert store.max_physical_offset == end
        assert store.get_max_offset_in_queue("Good", 0) == 3
        assert sorted(os.listdir(cfg.root / "commitlog")) == segments
        # The store still takes a good message, right where the refused one would have gone.
        after = put_all(store, [good(3)])
        assert after[0].physical_offset == end
        assert after[0].queue_offset == 3
        assert_store_holds(store, before + after)
    with open_store(cfg) as store:
        assert store.recovery.problem is None
        assert_store_holds(store, before + after)


def test_body_of_exactly_max_message_size_is_accepted(small_config):
    cfg = StoreConfig(**{**vars(small_config), "max_message_size": 4096})
    with MessageStore(cfg) as store:
        written = put_all(store, [Message(topic="Edge", body=b"m" * 4096)])
        assert_store_holds(store, written)


def test_properties_of_exactly_32767_bytes_are_accepted(small_config):
    value = "v" * (32767 - len("KEYS\x01\x02"))
    assert len(codec.encode_properties({"KEYS": value})) == 32767
    with MessageStore(small_config) as store:
        written = put_all(store, [Message(topic="Edge", body=b"b", properties={"KEYS": value})])
    with open_store(small_config) as store:
        assert_store_holds(store, written)
        with store.get_messages("g", "Edge", 0, 0) as got:
            assert next(got.messages()).properties == {"KEYS": value}


def test_largest_record_that_fits_a_segment(small_config):
    """A record may fill a segment but for the 8 bytes a blank record needs; one byte more is
    refused. The largest one starts a fresh segment, and the next message the one after."""
    cfg = StoreConfig(**{**vars(small_config), "max_message_size": 1024 * 1024})
    overhead = len(codec.encode(Message(topic="Edge", body=b""), cfg.store_host,
                                max_message_size=1).data)
    largest = SEGMENT - 8 - overhead
    with MessageStore(cfg) as store:
        first = put_all(store, [good(0)])
        refused = store.put_message(Message(topic="Edge", body=b"L" * (largest + 1)))
        assert refused.status is PutMessageStatus.MESSAGE_ILLEGAL
        big = put_all(store, [Message(topic="Edge", body=b"L" * largest)])
        assert big[0].size == SEGMENT - 8
        assert big[0].physical_offset == SEGMENT
        following = put_all(store, [good(1)])
        assert following[0].physical_offset == 2 * SEGMENT
    with open_store(cfg) as store:
        assert store.recovery.problem is None
        assert_store_holds(store, first + big + following)

