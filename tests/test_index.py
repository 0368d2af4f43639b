"""The index: RocketMQ's index file layout, lookups by key / unique id / offset id / time,
roll-over, restart, crash (a real SIGKILL) and damaged files, and the CLI lookups."""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import reference_body
from hypothesis import given, settings
from hypothesis import strategies as st
from killing import reap, sigkill

from stratamq.config import StoreConfig
from stratamq.message import Host, Message, Prop
from stratamq.store.checkpoint import StoreCheckpoint
from stratamq.store.index_file import (
    ENTRY,
    HEADER,
    SLOT,
    IndexFile,
    build_key,
    file_size,
    is_index_file_name,
    java_string_hash,
    key_hash,
    key_hashes,
    topic_key_hash,
)
from stratamq.store.index_geometry import infer_geometry
from stratamq.store.index_service import UNCONFIRMED_SUFFIX
from stratamq.store.layout import StoreLayout
from stratamq.store.message_store import MessageStore

PROJECT = Path(__file__).resolve().parents[1]
SLOTS, ENTRIES = 1000, 4000  # small index files: 24 KB of entries, 4 KB of slots
REF_STORE_HOST = Host("127.0.0.1", 10911)


def index_config(tmp_path: Path, **overrides) -> StoreConfig:
    settings = {
        "store_path_root_dir": str(tmp_path / "store"),
        "mapped_file_size_commit_log": 256 * 1024,
        "mapped_file_size_consume_queue": 100 * 20,
        "max_hash_slot_num": SLOTS,
        "max_index_num": ENTRIES,
        **overrides,
    }
    return StoreConfig(**settings)


def uniq_id(seq: int) -> str:
    # The shape of a client unique id (32 hex digits); unique per message in these tests.
    return f"7F000001{os.getpid() & 0xFFFF:04X}{seq:020X}"


def keyed(topic: str, seq: int, keys: str, queue_id: int = 0) -> Message:
    return Message(topic, b"body-%d" % seq, queue_id=queue_id,
                   properties={"KEYS": keys, "UNIQ_KEY": uniq_id(seq), "TAGS": "T"})


def index_files(root: Path) -> list[Path]:
    return sorted(p for p in (root / "index").iterdir() if is_index_file_name(p.name))


# -- the format ------------------------------------------------------------------------------


def test_java_string_hash_matches_java():
    # Values of java.lang.String.hashCode(), including overflow, a non-BMP character (two UTF-16
    # units) and the one string whose hash is Integer.MIN_VALUE (whose abs stays negative).
    assert java_string_hash("") == 0
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("BenchTopic0#key-0") == -1018007472
    assert java_string_hash("\U0001F600") == 0xD83D * 31 + 0xDE00
    assert java_string_hash("é") == 233
    assert java_string_hash("polygenelubricants") == -(2**31)
    assert key_hash("polygenelubricants") == 0
    assert key_hash("BenchTopic0#key-0") == 1018007472


def test_batch_and_prefix_hashing_equal_hashing_each_key():
    # The dispatcher hashes a round's keys in one batch (numpy) and lookups reuse the topic's
    # hash: both must give exactly key_hash(topic#key), including non-ASCII keys (UTF-16
    # units, surrogate pairs), the Integer.MIN_VALUE key and keys longer than a short batch.
    keys = [f"BenchTopic{i % 3}#key-{i}" for i in range(200)]
    keys += ["polygenelubricants", "a", "T#" + "x" * 5000, "Tö#é\U0001F600", "主题#键"]
    keys += [f"T#{uniq_id(i)}" for i in range(50)]
    expected = [key_hash(k) for k in keys]
    assert key_hashes(keys) == expected
    assert key_hashes(keys[-5:]) == expected[-5:]  # below the batch threshold
    assert key_hashes(keys[-10:]) == expected[-10:]  # a short batch
    assert key_hashes(keys[-3:] * 20) == expected[-3:] * 20  # non-ASCII batch
    assert 0 in expected  # polygenelubricants: abs(Integer.MIN_VALUE) indexes as 0
    for key in [k for k in keys if "#" in k]:
        topic, _, word = key.partition("#")
        assert topic_key_hash(topic, word) == key_hash(key), key
    assert topic_key_hash("polygenelubrican", "s") == key_hash("polygenelubrican#s")


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 300).flatmap(lambda size: st.lists(
    st.text(alphabet=st.characters(max_codepoint=127), min_size=size, max_size=size),
    min_size=1, max_size=40)))
def test_batch_hashing_of_keys_of_one_length_equals_hashing_each(keys):
    # A round of one topic's message ids: keys of one length take the matrix product path.
    keys = keys + ["polygenelubricants"] if len(keys[0]) == 18 else keys
    assert key_hashes(keys) == [key_hash(k) for k in keys]


def test_a_round_put_at_once_writes_the_bytes_of_one_put_per_record(tmp_path):
    """The dispatcher writes a round's records with one ``put_records`` call: the file must
    be byte for byte what one ``put_keys`` per record makes (slot collisions, a record with
    several keys, store times a few seconds apart), and a round that does not fit is refused
    whole, leaving the file untouched for the record-by-record path to roll over."""
    records = [(1000 + 100 * i, 1_700_000_000_000 + 1500 * i,
                [key_hash(f"T#{uniq_id(i)}")] + ([key_hash(f"T#k{i}"), 15] if i % 3 else []))
               for i in range(40)]
    one = IndexFile(tmp_path / "20260101000000000", 7, 200, create=True)
    for phys, ts, hashes in records:
        assert one.put_keys(hashes, phys, ts) == len(hashes)
    batch = IndexFile(tmp_path / "20260101000000001", 7, 200, create=True)
    assert batch.put_records(*_flat(records[:10])) and batch.put_records(*_flat(records[10:]))
    assert bytes(batch._map) == bytes(one._map)
    assert list(batch.select(15, 0, 10**13)) == list(one.select(15, 0, 10**13))
    small = IndexFile(tmp_path / "20260101000000002", 7, 20, create=True)
    before = bytes(small._map)
    assert not small.put_records(*_flat(records))  # 94 keys do not fit in 19 entries
    assert bytes(small._map) == before and small.entries == 0
    for f in (one, batch, small):
        f.close()


def _flat(records):
    """``put_records``' arguments for (offset, store time, hashes) records: one element per key."""
    hashes = [h for _, _, hs in records for h in hs]
    offsets = [phys for phys, _, hs in records for _ in hs]
    stamps = [ts for _, ts, hs in records for _ in hs]
    return hashes, offsets, stamps


# (offset step, store time, hashes): offsets grow from record to record, as in a CommitLog.
_record = st.tuples(st.integers(1, 2**32), st.integers(0, 2**41),
                    st.lists(st.integers(0, 2**31 - 1), max_size=4))


@settings(max_examples=150, deadline=None)
@given(st.lists(_record, max_size=30), st.lists(st.integers(1, 29), max_size=6),
       st.lists(st.tuples(st.integers(0, 6), st.integers(-2, 12)), max_size=7),
       st.integers(0, 2**41), st.booleans())
def test_put_records_writes_the_bytes_of_put_keys_per_record(tmp_path_factory, records, cuts,
                                                              stale_slots, begin, seeded):
    """Random rounds (records without keys, keys sharing slots, store times going back or
    years apart, slots left pointing anywhere by a crash, a file seeded with the previous
    one's end or not): ``put_records`` round by round leaves exactly the bytes of one
    ``put_keys`` per record, or refuses a round that does not fit and leaves the file as it
    was."""
    tmp = tmp_path_factory.mktemp("rounds")
    records = [(sum(step for step, _, _ in records[: i + 1]), ts, hashes)
               for i, (_, ts, hashes) in enumerate(records)]
    seed = {"begin_phy_offset": 77, "begin_timestamp": begin} if seeded else {}
    one = IndexFile(tmp / "20260101000000000", 7, 40, create=True, **seed)
    batch = IndexFile(tmp / "20260101000000001", 7, 40, create=True, **seed)
    for slot, value in stale_slots:
        for f in (one, batch):
            SLOT.pack_into(f._map, 40 + 4 * slot, value)
    bounds = [0, *sorted(set(c for c in cuts if c < len(records))), len(records)]
    for lo, hi in zip(bounds, bounds[1:]):
        round_ = records[lo:hi]
        before = bytes(batch._map)
        if batch.put_records(*_flat(round_)):
            for phys, ts, hashes in round_:
                one.put_keys(hashes, phys, ts)
            assert bytes(batch._map) == bytes(one._map)
            assert batch.header == one.header
        else:
            assert bytes(batch._map) == before
            assert batch.index_count + sum(len(h) for _, _, h in round_) > 40
    for f in (one, batch):
        f.close()


def test_record_with_several_keys_is_counted_only_when_all_are_written(tmp_path):
    f = IndexFile(tmp_path / "20260101000000000", 7, 10, create=True)
    assert f.put_keys([15, 22, 3], 1000, 5_000) == 3  # 15 and 22 share slot 1
    assert HEADER.unpack_from(f._map, 0) == (5_000, 5_000, 1000, 1000, 2, 4)
    assert list(f.select(15, 0, 10**12)) == [1000] and list(f.select(22, 0, 10**12)) == [1000]
    # Mid-record, as the writer leaves it between keys: entry 4 written and linked into slot
    # 1, the header not yet counting it. A reader steps over it to the counted list.
    ENTRY.pack_into(f._map, 40 + 7 * 4 + 4 * 20, 8, 2000, 1, 2)
    f._map[44:48] = (4).to_bytes(4, "big")  # slot 1
    assert list(f.select(15, 0, 10**12)) == [1000]
    assert list(f.select(22, 0, 10**12)) == [1000]
    assert list(f.select(8, 0, 10**12)) == []  # not counted: not visible yet
    assert f.damage() is not None  # and a file left like this after a crash is rebuilt
    f.close()
    g = IndexFile(tmp_path / "20260101000000001", 7, 4, create=True)
    assert g.put_keys([1, 2, 3, 4], 500, 1_000) == 3  # full after 3: the caller rolls over
    assert g.is_full() and g.put_keys([4], 500, 1_000) == 0
    assert g.damage() is None
    g.close()


def test_header_slot_and_entry_byte_layout(tmp_path):
    path = tmp_path / "20260101000000000"
    f = IndexFile(path, 7, 10, create=True)
    assert path.stat().st_size == 40 + 7 * 4 + 10 * 20 == file_size(7, 10)
    h1, h2 = 15, 22  # both land in slot 1 (15 % 7 == 22 % 7 == 1)
    assert f.put_key(h1, 1000, 5_000)
    assert f.put_key(h2, 2000, 7_500)
    assert f.put_key(3, 3000, 9_000)
    f.flush()
    raw = path.read_bytes()
    # Header: begin/end timestamp, begin/end offset, used slots, next entry number.
    assert HEADER.unpack_from(raw, 0) == (5_000, 9_000, 1000, 3000, 2, 4)
    slot = lambda s: int.from_bytes(raw[40 + 4 * s : 44 + 4 * s], "big", signed=True)  # noqa: E731
    assert [slot(s) for s in range(7)] == [0, 2, 0, 3, 0, 0, 0]
    entry = lambda n: ENTRY.unpack_from(raw, 40 + 7 * 4 + 20 * n)  # noqa: E731
    assert entry(0) == (0, 0, 0, 0)  # entry 0 is never used
    # key hash, offset, seconds since the file's begin time, previous entry of the slot
    assert entry(1) == (15, 1000, 0, 0)
    assert entry(2) == (22, 2000, 2, 1)  # head insertion: links to the older entry
    assert entry(3) == (3, 3000, 4, 0)
    assert list(f.select(h1, 0, 10**12)) == [1000]  # same slot, other hash: skipped
    assert list(f.select(h2, 0, 10**12)) == [2000]
    for n in range(4, 10):
        assert f.put_key(n, 4000 + n, 9_000)
    assert f.is_full() and not f.put_key(1, 1, 1)  # 9 entries fit in 10 (entry 0 unused)
    assert f.damage() is None
    f.close()


def test_reference_index_file_is_read_as_rocketmq_wrote_it(reference_store):
    path = index_files(reference_store)[0]
    cfg = StoreConfig()
    f = IndexFile(path, cfg.max_hash_slot_num, cfg.max_index_num, read_only=True)
    try:
        assert f.damage() is None
        assert f.entries == 2 * 20_000  # UNIQ_KEY and KEYS of every message
        # RocketMQ indexes UNIQ_KEY first, then KEYS: entry 2 is message 0's "key-0".
        hash_, phys, _, _ = ENTRY.unpack_from(f._map, f.entry_pos(2))
        assert (hash_, phys) == (key_hash(build_key("BenchTopic0", "key-0")), 0)
        last = ENTRY.unpack_from(f._map, f.entry_pos(f.entries))
        assert last[0] == key_hash(build_key("BenchTopic3", "key-19999"))
    finally:
        f.close()


# -- queries on the reference store ------------------------------------------------------------

SAMPLE = (0, 1, 5, 4242, 9999, 13_331, 19_998, 19_999)


def check_reference_message(msg, i: int) -> None:
    assert msg.topic == f"BenchTopic{i % 4}"
    assert msg.queue_id == (i // 4) % 4
    assert msg.queue_offset == i // 16
    assert msg.body == reference_body(i)
    assert msg.keys == [f"key-{i}"]
    assert msg.store_host == REF_STORE_HOST


def test_reference_store_answers_by_key_unique_id_and_offset_id(reference_store):
    before = {p: p.stat().st_mtime_ns for p in index_files(reference_store)}
    with MessageStore(StoreConfig(store_path_root_dir=str(reference_store)),
                      read_only=True) as s:
        for i in SAMPLE:
            got = s.query_messages(f"BenchTopic{i % 4}", f"key-{i}")
            assert len(got) == 1, i
            check_reference_message(got[0], i)
            uniq = got[0].properties[Prop.UNIQ_KEY]
            check_reference_message(s.look_message_by_msg_id(uniq), i)
            check_reference_message(s.look_message_by_msg_id(got[0].msg_id), i)
            assert s.query_messages(f"BenchTopic{(i + 1) % 4}", f"key-{i}") == []
        assert s.query_messages("BenchTopic0", "key-20000") == []
        assert s.look_message_by_msg_id("00" * 16) is None
    assert {p: p.stat().st_mtime_ns for p in index_files(reference_store)} == before


def test_writing_on_into_rocketmq_index_file(reference_copy):
    """StrataMQ appends to the index file RocketMQ left open, and both generations answer."""
    cfg = StoreConfig(store_path_root_dir=str(reference_copy))
    with MessageStore(cfg) as s:
        assert s.index.dropped == []
        assert s.put_message(keyed("BenchTopic1", 1, "key-5 fresh", queue_id=1)).ok
        s.wait_dispatched()
    with MessageStore(cfg, read_only=True) as s:
        assert len(s.index.files()) == 1 and s.index.files()[0].entries == 40_003
        got = s.query_messages("BenchTopic1", "key-5")
        assert [m.body for m in got] == [b"body-1", reference_body(5)]  # newest first
        assert s.query_messages("BenchTopic1", "fresh")[0].queue_offset == 1250
        check_reference_message(s.query_messages("BenchTopic1", "key-4241")[0], 4241)


def test_own_index_of_reference_messages_answers_like_rocketmq(reference_store, tmp_path):
    """Re-put the first reference messages (same topics, queues, keys, unique ids) into a
    StrataMQ store with small index files; both indexes give the same answers and StrataMQ's
    entries carry the same key hashes in the same order as RocketMQ's."""
    count = 1500
    ref = MessageStore(StoreConfig(store_path_root_dir=str(reference_store)), read_only=True)
    ref.open()
    cfg = index_config(tmp_path, mapped_file_size_commit_log=1024 * 1024)
    try:
        originals = []
        with MessageStore(cfg) as own:
            for i in range(count):
                msg = ref.query_messages(f"BenchTopic{i % 4}", f"key-{i}")[0]
                originals.append(msg)
                put = own.put_message(Message(msg.topic, msg.body, msg.queue_id,
                                              dict(msg.properties)))
                assert put.ok
            own.wait_dispatched()
            for i in (*range(0, count, 97), count - 1):
                topic, key = f"BenchTopic{i % 4}", f"key-{i}"
                mine, theirs = own.query_messages(topic, key), ref.query_messages(topic, key)
                assert [(m.topic, m.queue_id, m.queue_offset, m.body) for m in mine] == [
                    (m.topic, m.queue_id, m.queue_offset, m.body) for m in theirs]
                uniq = theirs[0].properties[Prop.UNIQ_KEY]
                assert own.look_message_by_msg_id(uniq).body == reference_body(i)
        # Entry by entry: the same key hashes, in the same order, as RocketMQ wrote them.
        own_hashes = []
        for path in index_files(cfg.root):
            f = IndexFile(path, SLOTS, ENTRIES, read_only=True)
            own_hashes += [ENTRY.unpack_from(f._map, f.entry_pos(n))[0]
                           for n in range(1, f.entries + 1)]
            f.close()
        ref_file = ref.index.files()[0]
        ref_hashes = [ENTRY.unpack_from(ref_file._map, ref_file.entry_pos(n))[0]
                      for n in range(1, 2 * count + 1)]
        assert own_hashes == ref_hashes
    finally:
        ref.close()


# -- queries on StrataMQ's own index -----------------------------------------------------------


def put_in_batches(s: MessageStore, batches: list[list[Message]]):
    """Put each batch, waiting between them until the clock has passed the batch's store time,
    so that each batch is stored at a later millisecond than the one before."""
    results = []
    for batch in batches:
        result = s.put_messages(batch)
        assert result.ok, result
        results.append(result)
        stored = result.messages[-1].store_timestamp
        deadline = time.monotonic() + 60  # a hang guard (a clock set back), not a measurement
        while int(time.time() * 1000) <= stored:
            assert time.monotonic() < deadline, "the wall clock did not move past a put"
            time.sleep(0.001)
    assert s.wait_dispatched()
    return results


def test_time_range_max_count_and_newest_first(tmp_path):
    with MessageStore(index_config(tmp_path)) as s:
        batches = [[keyed("Orders", b * 10 + j, f"order-{j % 2} batch-{b}") for j in range(10)]
                   for b in range(3)]
        results = put_in_batches(s, batches)
        middle = results[1].messages
        begin, end = middle[0].store_timestamp, middle[-1].store_timestamp
        assert results[0].messages[-1].store_timestamp < begin
        assert end < results[2].messages[0].store_timestamp

        got = s.query_messages("Orders", "order-1", max_num=100, begin_ms=begin, end_ms=end)
        assert [m.body for m in got] == [b"body-%d" % n for n in (19, 17, 15, 13, 11)]
        every = s.query_messages("Orders", "order-0", max_num=100)
        assert [m.queue_offset for m in every] == list(range(28, -1, -2))  # newest first
        three = s.query_messages("Orders", "order-0", max_num=3)
        assert [m.queue_offset for m in three] == [28, 26, 24]
        assert len(s.query_messages("Orders", "batch-2")) == 10
        assert s.query_messages("Orders", "batch-2", end_ms=begin) == []
        assert s.query_messages("Other", "order-0") == []
        assert s.query_messages("Orders", "order") == []  # whole words only
        # offset message ids and unique ids both find the message
        first = results[0].messages[3]
        assert s.look_message_by_msg_id(first.msg_id).body == b"body-3"
        assert s.look_message_by_msg_id(uniq_id(3)).body == b"body-3"
        assert s.look_message_by_msg_id(uniq_id(3), topic="Other") is None


def test_roll_over_to_several_files_and_restart_keeps_answers(tmp_path):
    cfg = index_config(tmp_path, max_index_num=100)  # 99 entries a file: 33 messages
    n = 200
    with MessageStore(cfg) as s:
        for seq in range(0, n, 4):
            assert s.put_messages([keyed("Roll", q, f"k-{q} all", q % 2)
                                   for q in range(seq, seq + 4)]).ok
        s.wait_dispatched()
        before = {q: [m.physical_offset for m in s.query_messages("Roll", f"k-{q}")]
                  for q in range(n)}
        newest_all = [m.body for m in s.query_messages("Roll", "all", max_num=n)]
    files = index_files(cfg.root)
    assert len(files) >= 3 * n // 99  # three entries per message, 99 per file
    assert files == sorted(files) and len({p.name for p in files}) == len(files)
    assert all(len(v) == 1 for v in before.values())
    assert newest_all == [b"body-%d" % q for q in range(n - 1, -1, -1)]  # across files
    for read_only in (False, True):
        with MessageStore(cfg, read_only=read_only) as s:
            assert s.index.dropped == []
            assert {q: [m.physical_offset for m in s.query_messages("Roll", f"k-{q}")]
                    for q in range(n)} == before
            assert s.look_message_by_msg_id(uniq_id(n - 1)).body == b"body-%d" % (n - 1)
    assert StoreCheckpoint.read(cfg.root / "checkpoint").index_msg_timestamp > 0


def test_delete_expired_files_keeps_the_newest(tmp_path):
    cfg = index_config(tmp_path, max_index_num=20)  # 19 entries: one file per ~9 messages
    with MessageStore(cfg) as s:
        offsets = [s.put_message(keyed("Exp", q, f"e-{q}")).messages[0].physical_offset
                   for q in range(40)]
        s.wait_dispatched()
        files = s.index.files()
        assert len(files) >= 4
        cut = files[1].end_phy_offset + 1  # the first two files point below this only
        removed = s.index.delete_expired_files(cut)
        assert removed == [files[0].path, files[1].path]
        assert not files[0].path.exists() and files[2].path.exists()
        assert s.query_messages("Exp", "e-39")[0].physical_offset == offsets[39]
        assert s.index.delete_expired_files(10**12) == [f.path for f in files[2:-1]]
        assert s.index.files() == [files[-1]]


def test_index_disabled_writes_no_index(tmp_path):
    cfg = index_config(tmp_path, message_index_enable=False)
    with MessageStore(cfg) as s:
        assert s.put_message(keyed("Off", 1, "k")).ok
        s.wait_dispatched()
        assert s.query_messages("Off", "k") == []
        assert s.look_message_by_msg_id(uniq_id(1)) is None
    assert not (cfg.root / "index").exists()


# -- offset by time ----------------------------------------------------------------------------


def test_offset_by_time_is_first_offset_stored_at_or_after(tmp_path):
    with MessageStore(index_config(tmp_path)) as s:
        batches = [[keyed("Timed", b * 3 + j, "t", queue_id=1) for j in range(3)]
                   for b in range(6)]
        results = put_in_batches(s, batches)
        stamps = [(m.queue_offset, m.store_timestamp) for r in results for m in r.messages]
        assert len({t for _, t in stamps}) >= 2
        probes = {t + d for _, t in stamps for d in (-1, 0, 1)}
        for t in sorted(probes):
            expected = next((q for q, ts in stamps if ts >= t), len(stamps))
            assert s.get_offset_in_queue_by_time("Timed", 1, t) == expected, t
        assert s.get_offset_in_queue_by_time("Timed", 1, 0) == 0
        assert s.get_offset_in_queue_by_time("Timed", 1, 2**62) == len(stamps)
        assert s.get_offset_in_queue_by_time("Timed", 7, 0) == 0


def test_offset_by_time_on_reference_store(reference_store):
    with MessageStore(StoreConfig(store_path_root_dir=str(reference_store)),
                      read_only=True) as s:
        for probe in (0, 100, 700, 1249):
            with s.get_messages("g", "BenchTopic2", 3, probe, max_count=1) as got:
                ts = next(got.messages()).store_timestamp
            offset = s.get_offset_in_queue_by_time("BenchTopic2", 3, ts)
            assert offset <= probe
            with s.get_messages("g", "BenchTopic2", 3, offset, max_count=1) as got:
                assert next(got.messages()).store_timestamp == ts
            if offset:
                with s.get_messages("g", "BenchTopic2", 3, offset - 1, max_count=1) as got:
                    assert next(got.messages()).store_timestamp < ts


# -- damage and crashes ------------------------------------------------------------------------


def fill(cfg: StoreConfig, n: int, topic: str = "Dmg") -> None:
    with MessageStore(cfg) as s:
        for q in range(0, n, 5):
            assert s.put_messages([keyed(topic, i, f"d-{i}") for i in range(q, q + 5)]).ok
        s.wait_dispatched()


def assert_each_found_once(s: MessageStore, topic: str, seqs, key=lambda i: f"d-{i}") -> None:
    for i in seqs:
        hits = list(s.index.query_offsets(topic, key(i)))
        found = [m for m in s.query_messages(topic, key(i)) if m.body == b"body-%d" % i]
        assert len(found) == 1 and hits.count(found[0].physical_offset) == 1, i
        uniq_hits = list(s.index.query_offsets(topic, uniq_id(i)))
        assert uniq_hits.count(found[0].physical_offset) == 1, i
        assert s.look_message_by_msg_id(uniq_id(i)).body == b"body-%d" % i


@pytest.mark.parametrize("damage", ["uncounted-entry", "header-garbage", "truncated"])
def test_damaged_index_file_is_rebuilt_not_trusted(tmp_path, damage):
    cfg = index_config(tmp_path, max_index_num=50)
    n = 60
    fill(cfg, n)
    files = index_files(cfg.root)
    assert len(files) >= 2
    victim = files[-1]
    raw = bytearray(victim.read_bytes())
    count = HEADER.unpack_from(raw, 0)[5]
    if damage == "uncounted-entry":
        # An entry written but the crash came before the header counted it.
        pos = 40 + SLOTS * 4 + count * 20
        raw[pos : pos + 20] = ENTRY.pack(key_hash("Dmg#ghost"), 123, 0, 0)
        victim.write_bytes(raw)
    elif damage == "header-garbage":
        raw[32:40] = b"\xff" * 8
        victim.write_bytes(raw)
    else:
        os.truncate(victim, len(raw) // 2)
    # Read-only: the damaged file is skipped, nothing on disk changes.
    with MessageStore(cfg, read_only=True) as s:
        assert [name for name, _ in s.index.dropped] == [victim.name]
    assert victim.exists()
    with MessageStore(cfg) as s:
        assert victim.name in [name for name, _ in s.index.dropped]
        assert_each_found_once(s, "Dmg", range(n))
        assert s.query_messages("Dmg", "ghost") == []
    with MessageStore(cfg) as s:  # and the rebuilt files are trusted afterwards
        assert s.index.dropped == []
        assert_each_found_once(s, "Dmg", range(0, n, 7))


def test_crash_without_index_checkpoint_rebuilds_from_commitlog(tmp_path):
    """After a crash, files ending past the checkpoint's index time are rebuilt."""
    cfg = index_config(tmp_path, max_index_num=50)
    fill(cfg, 60)
    layout = StoreLayout(cfg.root)
    ckpt = StoreCheckpoint.read(layout.checkpoint)
    ckpt.index_msg_timestamp = 0  # as if no index flush ever reached the disk
    ckpt.write(layout.checkpoint)
    layout.abort.touch()  # and the last run died
    with MessageStore(cfg) as s:
        assert len(s.index.dropped) >= 2
        assert_each_found_once(s, "Dmg", range(60))


WRITER = r"""
import json, os, sys, time
from stratamq.config import StoreConfig
from stratamq.message import Message
from stratamq.store.message_store import MessageStore

settings = json.loads(sys.argv[1])
store = MessageStore(StoreConfig(**settings)).open()
seq = 0
while True:
    size = 1 + seq % 3
    msgs = [Message("Crash", b"body-%d" % i, queue_id=i % 2,
                    properties={"KEYS": "d-%d" % i, "UNIQ_KEY": sys.argv[2] % i})
            for i in range(seq, seq + size)]
    result = store.put_messages(msgs)
    if not result.ok:
        sys.stderr.write("put failed: %s\n" % result.status)
        sys.exit(3)
    sys.stdout.write("".join("%d\n" % i for i in range(seq, seq + size)))
    sys.stdout.flush()
    seq += size
    time.sleep(0.002)
"""


def test_sigkill_mid_stream_every_acknowledged_message_found_once(tmp_path):
    cfg = index_config(tmp_path, max_index_num=200, mapped_file_size_commit_log=64 * 1024,
                       flush_interval_consume_queue=20,
                       flush_consume_queue_thorough_interval=150)
    settings = {k: getattr(cfg, k) for k in (
        "store_path_root_dir", "mapped_file_size_commit_log", "mapped_file_size_consume_queue",
        "max_hash_slot_num", "max_index_num", "flush_interval_consume_queue",
        "flush_consume_queue_thorough_interval")}
    env = {**os.environ, "PYTHONPATH": str(PROJECT)}
    uniq_format = uniq_id(0)[:-20] + "%020X"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, json.dumps(settings), uniq_format],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=PROJECT)
    lines: queue.Queue[bytes | None] = queue.Queue()

    def pump() -> None:
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    acked: list[int] = []
    deadline = time.monotonic() + 180
    try:
        while len(acked) < 700:
            assert time.monotonic() < deadline, "writer too slow"
            line = lines.get(timeout=180)
            assert line is not None, proc.stderr.read().decode()[-2000:]
            acked.append(int(line))
        sigkill(proc)
    finally:
        reap(proc)
    while (line := lines.get(timeout=60)) is not None:
        if line.endswith(b"\n"):
            acked.append(int(line))
    assert acked == list(range(len(acked)))
    assert (cfg.root / "abort").exists()
    assert len(index_files(cfg.root)) >= 4
    with MessageStore(cfg) as s:
        assert s.recovery.abnormal
        assert_each_found_once(s, "Crash", acked)
    with MessageStore(cfg) as s:  # a clean reopen changes nothing
        assert s.index.dropped == []
        assert_each_found_once(s, "Crash", acked[::17])


# -- the command line ------------------------------------------------------------------------


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "stratamq.cli", *args], capture_output=True, text=True,
        timeout=300, env={**os.environ, "PYTHONPATH": str(PROJECT)},
    )


def test_cli_query_and_offset_by_time_on_reference_store(reference_store):
    store = str(reference_store)
    proc = cli("store", "query", "--store", store, "--topic", "BenchTopic1", "--key", "key-4241")
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(rows) == 1
    row = rows[0]
    assert (row["topic"], row["queue_id"], row["queue_offset"]) == ("BenchTopic1", 0, 265)
    assert row["keys"] == ["key-4241"] and "body_b64" in row
    for msg_id in (row["properties"]["UNIQ_KEY"],
                   f"7F00000100002A9F{row['commitlog_offset']:016X}"):
        by_id = cli("store", "query", "--store", store, "--msg-id", msg_id)
        assert by_id.returncode == 0, by_id.stderr
        assert json.loads(by_id.stdout)["commitlog_offset"] == row["commitlog_offset"]
    ts = row["store_timestamp"]
    proc = cli("store", "offset-by-time", "--store", store, "--topic", "BenchTopic1",
               "--queue-id", "0", "--timestamp", str(ts))
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert {"topic", "queue_id", "timestamp", "offset"} <= set(out)
    assert out["offset"] <= 265 and out["store_timestamp"] == ts
    narrow = cli("store", "query", "--store", store, "--topic", "BenchTopic1", "--key",
                 "key-4241", "--begin", str(ts + 1), "--end", str(ts + 10_000))
    assert narrow.returncode == 0 and narrow.stdout == ""


def test_cli_errors_are_clear(reference_store, tmp_path):
    store = str(reference_store)
    cases = [
        (("store", "query", "--store", store), "exactly one of --key"),
        (("store", "query", "--store", store, "--key", "k"), "--key needs --topic"),
        (("store", "query", "--store", store, "--topic", "Nope", "--key", "k"), "not found"),
        (("store", "query", "--store", store, "--msg-id", "0" * 32), "no message with id"),
        (("store", "query", "--store", str(tmp_path), "--msg-id", "x"), "no store at"),
        (("store", "offset-by-time", "--store", store, "--topic", "BenchTopic0",
          "--queue-id", "9", "--timestamp", "0"), "has no queue 9"),
    ]
    for args, message in cases:
        proc = cli(*args)
        assert proc.returncode != 0, args
        assert message in proc.stderr, (args, proc.stderr)
        assert "Traceback" not in proc.stderr


# -- files of another geometry ---------------------------------------------------------------


@pytest.mark.parametrize("written, configured", [
    ((997, 3_001), (SLOTS, ENTRIES)),  # a broker with other settings wrote them
    ((SLOTS, ENTRIES), (211, 503)),  # the reader is configured smaller
])
def test_index_files_of_another_geometry_are_served_never_deleted(tmp_path, written, configured):
    cfg = index_config(tmp_path, max_hash_slot_num=written[0], max_index_num=written[1])
    n = 600
    with MessageStore(cfg) as s:
        assert s.put_messages([keyed("Geo", q, f"k-{q} all", q % 2) for q in range(n)]).ok
        s.wait_dispatched()
    before = {p.name: p.stat().st_size for p in index_files(cfg.root)}
    assert before and all(size == file_size(*written) for size in before.values())
    other = dataclasses.replace(cfg, max_hash_slot_num=configured[0],
                                max_index_num=configured[1])
    for read_only in (True, False):
        with MessageStore(other, read_only=read_only) as s:
            assert s.index.dropped == []
            for q in (0, 1, n // 2, n - 1):
                [m] = s.query_messages("Geo", f"k-{q}")
                assert m.body == b"body-%d" % q
                assert s.look_message_by_msg_id(uniq_id(q)).body == b"body-%d" % q
        assert {p.name: p.stat().st_size for p in index_files(cfg.root)} == before
    # Writing on: the newest file (of the old geometry) fills, later files get the new one,
    # and after a restart every generation answers.
    with MessageStore(other) as s:
        assert s.put_messages([keyed("Geo", q, f"k-{q}", q % 2) for q in range(n, 2 * n)]).ok
        s.wait_dispatched()
    with MessageStore(other, read_only=True) as s:
        assert s.index.dropped == []
        for q in (0, n - 1, n, 2 * n - 1):
            assert [m.body for m in s.query_messages("Geo", f"k-{q}")] == [b"body-%d" % q]
    sizes = {p.stat().st_size for p in index_files(cfg.root)}
    assert file_size(*written) in sizes
    assert sizes <= {file_size(*written), file_size(*configured)}


def test_geometry_is_read_from_the_file(tmp_path):
    for slots, entries in ((7, 50), (1009, 4099), (5, 5000)):
        path = tmp_path / f"{slots}-{entries}"
        f = IndexFile(path, slots, entries, create=True)
        for i in range(min(entries - 1, 300)):
            f.put_keys([key_hash(f"t#k{i}")], 1000 + i * 10, 1_700_000_000_000 + i)
        f.flush()
        f.close()
        assert infer_geometry(path) == (slots, entries)
    # An empty file of a size no preferred geometry has: nothing says which one it is.
    empty = tmp_path / "empty"
    IndexFile(empty, 31, 77, create=True).close()
    assert infer_geometry(empty) is None
    assert infer_geometry(empty, [(31, 77)]) == (31, 77)


def test_a_file_whose_geometry_cannot_be_confirmed_is_set_aside_not_deleted(tmp_path):
    cfg = index_config(tmp_path)
    with MessageStore(cfg) as s:
        assert s.put_messages([keyed("Odd", q, f"k-{q}") for q in range(50)]).ok
        s.wait_dispatched()
    [path] = index_files(cfg.root)
    with path.open("ab") as fh:
        fh.write(b"\xff" * 7)  # a size no geometry has
    with MessageStore(cfg) as s:
        assert [m.body for m in s.query_messages("Odd", "k-7")] == [b"body-7"]  # re-indexed
    assert (path.parent / (path.name + UNCONFIRMED_SUFFIX)).exists()


def test_rocketmq_default_index_read_with_other_settings(reference_store):
    cfg = StoreConfig(store_path_root_dir=str(reference_store), max_hash_slot_num=1000,
                      max_index_num=4000)
    with MessageStore(cfg, read_only=True) as s:
        assert s.index.dropped == []
        for i in SAMPLE:
            [got] = s.query_messages(f"BenchTopic{i % 4}", f"key-{i}")
            check_reference_message(got, i)
