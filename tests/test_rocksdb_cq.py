"""The RocksDB ConsumeQueue store (storeType=defaultRocksDB): layout, reads, store types, double
write, expiry, truncation and migration, all on real RocksDB through rocksdict."""

from __future__ import annotations

import json
import struct

import pytest
from click.testing import CliRunner

from stratamq.cli import main
from stratamq.config import StoreConfig
from stratamq.message import Message
from stratamq.store import rocksdb_consume_queue
from stratamq.store.consume_queue_store import (
    STORE_TYPE_FILES,
    STORE_TYPE_ROCKSDB,
    StoreTypeMismatch,
    compare_stores,
    read_store_type,
)
from stratamq.store.message_store import MessageStore
from stratamq.store.results import GetMessageStatus
from stratamq.store.rocksdb_consume_queue import (
    CQ_VALUE,
    RocksDBConsumeQueueStore,
    cq_key,
    offset_key,
    queue_prefix,
    queue_range,
    topic_range,
)
from tests.conftest import REFERENCE_MESSAGES, reference_body

TOPICS = ("RdbA", "RdbB")


def config(root, **kw) -> StoreConfig:
    return StoreConfig(store_path_root_dir=str(root), mapped_file_size_commit_log=64 * 1024,
                       mapped_file_size_consume_queue=100 * 20, message_index_enable=False,
                       **kw)


def put_some(store: MessageStore, n: int, start: int = 0) -> list[tuple[str, int, int, bytes]]:
    """Put n messages over 2 topics x 3 queues; return (topic, queue, offset, body) each."""
    out = []
    for i in range(start, start + n):
        topic, queue_id = TOPICS[i % 2], (i // 2) % 3
        body = b"body-%06d-" % i + b"x" * (i % 50)
        result = store.put_message(Message(topic, body, queue_id,
                                           properties={"TAGS": f"tag{i % 3}"}))
        assert result.ok, result.status
        out.append((topic, queue_id, result.queue_offset, body))
    assert store.wait_dispatched()
    return out


def read_all(store: MessageStore, topic: str, queue_id: int, offset: int = 0) -> list[bytes]:
    result = store.get_messages("g", topic, queue_id, offset, max_count=10_000,
                                max_bytes=1 << 30)
    with result:
        return [m.body for m in result.messages()]


# -- layout ------------------------------------------------------------------------------------

def test_key_and_value_layout_is_seed_003():
    prefix = queue_prefix(b"TopicX", 7)
    key = cq_key(prefix, 5)
    assert key == (struct.pack(">i", 6) + b"\x01TopicX\x01" + struct.pack(">i", 7) + b"\x01"
                   + struct.pack(">q", 5))
    assert offset_key(b"TopicX", 7, True) == (struct.pack(">i", 6) + b"\x01TopicX\x01max\x01"
                                              + struct.pack(">i", 7))
    assert CQ_VALUE.size == 28
    # A queue's keys sort by offset and fall inside its range; the next queue's do not.
    keys = [cq_key(prefix, o) for o in (0, 1, 255, 256, 1 << 40)]
    assert keys == sorted(keys)
    start, end = queue_range(prefix)
    assert all(start < k < end for k in keys)
    other = cq_key(queue_prefix(b"TopicX", 8), 0)
    assert not start < other < end
    t_start, t_end = topic_range(b"TopicX")
    assert t_start < other < t_end and t_start < keys[-1] < t_end
    assert not t_start < cq_key(queue_prefix(b"TopicXY", 0), 0) < t_end


# -- the store through MessageStore ------------------------------------------------------------

def test_rocksdb_store_serves_reads_and_reopens_with_recorded_type(tmp_path):
    root = tmp_path / "s"
    with MessageStore(config(root, store_type=STORE_TYPE_ROCKSDB)).open() as s:
        sent = put_some(s, 120)
        assert s.store_type == STORE_TYPE_ROCKSDB
    assert read_store_type(root) == STORE_TYPE_ROCKSDB
    assert not (root / "consumequeue").exists()
    # Reopen without naming the type: the recorded one is used.
    with MessageStore(config(root)).open() as s:
        assert s.store_type == STORE_TYPE_ROCKSDB
        assert s.consume_queues._handles == {}  # start-up loaded the offset table only
        for topic in TOPICS:
            for q in range(3):
                expected = [b for t, qq, _, b in sent if (t, qq) == (topic, q)]
                assert read_all(s, topic, q) == expected
                assert s.get_max_offset_in_queue(topic, q) == len(expected)
                # From the middle, a few at a time.
                mid = len(expected) // 2
                got = s.get_messages("g", topic, q, mid, max_count=3)
                with got:
                    assert [m.body for m in got.messages()] == expected[mid:mid + 3]
                    assert got.next_begin_offset == mid + 3
        assert s.topics() == {t: [0, 1, 2] for t in TOPICS}
        # New puts continue the queue offsets where they were.
        more = put_some(s, 6, start=120)
        assert more[0][2] == 20
        assert s.get_messages("g", "RdbA", 0, 25).status is GetMessageStatus.OFFSET_OVERFLOW_BADLY


def test_offset_by_time_uses_the_store_time_in_the_value(tmp_path):
    with MessageStore(config(tmp_path / "s", store_type=STORE_TYPE_ROCKSDB)).open() as s:
        put_some(s, 60)
        cq = s.consume_queues.find("RdbA", 0)
        times = [row[3] for row in cq.get_units_with_time(0, 100)]
        assert times == sorted(times) and len(times) == 10

        def no_commitlog(_phys: int) -> int:
            raise AssertionError("RocksDB keeps the store time: no CommitLog read")

        assert cq.offset_by_time(0, no_commitlog) == 0
        assert cq.offset_by_time(times[-1] + 1, no_commitlog) == 10
        k = 6
        assert cq.offset_by_time(times[k], no_commitlog) == times.index(times[k])


def test_explicit_other_type_needs_a_migration(tmp_path):
    root = tmp_path / "s"
    with MessageStore(config(root)).open() as s:
        put_some(s, 10)
    with pytest.raises(StoreTypeMismatch, match="migrate-cq"):
        MessageStore(config(root, store_type=STORE_TYPE_ROCKSDB)).open()
    # The failed open released everything: the store opens again as it was.
    with MessageStore(config(root)).open() as s:
        assert s.store_type == STORE_TYPE_FILES and s.get_max_offset_in_queue("RdbA", 0) == 2


def test_double_write_keeps_both_stores_in_step(tmp_path):
    root = tmp_path / "s"
    with MessageStore(config(root, rocksdb_cq_double_write_enable=True)).open() as s:
        put_some(s, 90)
        assert len(s.cq_stores) == 2
        files, rocks = s.cq_stores
        assert (files.store_type, rocks.store_type) == (STORE_TYPE_FILES, STORE_TYPE_ROCKSDB)
        check = compare_stores(files, rocks)
        assert check["same"], check["problems"]
        assert check["units"] == 90
    # Either can serve: open explicitly as RocksDB (it exists, kept in step) and read.
    with MessageStore(config(root, store_type=STORE_TYPE_ROCKSDB)).open() as s:
        assert s.store_type == STORE_TYPE_ROCKSDB
        assert len(read_all(s, "RdbB", 2)) == 15


def test_destroy_queue_and_topic_are_range_deletes(tmp_path):
    with MessageStore(config(tmp_path / "s", store_type=STORE_TYPE_ROCKSDB)).open() as s:
        put_some(s, 60)
        rocks = s.consume_queues
        rocks.destroy_queue("RdbA", 1)
        assert rocks.find("RdbA", 1) is None
        assert rocks.topics() == {"RdbA": [0, 2], "RdbB": [0, 1, 2]}
        rocks.destroy_topic("RdbB")
        assert rocks.topics() == {"RdbA": [0, 2]}
        # Nothing of them is left in RocksDB either.
        db = rocks._db
        start, end = topic_range(b"RdbB")
        assert [k for k in db.keys(from_key=start) if k < end] == []
        start, end = queue_range(queue_prefix(b"RdbA", 1))
        assert [k for k in db.keys(from_key=start) if k < end] == []
        assert len(read_all(s, "RdbA", 0)) == 10


def test_truncate_dirty_drops_units_past_the_commitlog_end(tmp_path):
    path = tmp_path / "rdb"
    rocks = RocksDBConsumeQueueStore(path)
    rocks.load()
    from stratamq.message import DispatchInfo

    for i in range(10):
        rocks.dispatch(DispatchInfo("T", 0, i, i * 100, 100, 0, 1000 + i, 0, {}))
    rocks.commit_dispatch()
    assert rocks.truncate_dirty(1000) == 0
    assert rocks.truncate_dirty(650) == 4  # units at 600.. end past 650; the one at 500 ends at 600
    assert rocks.find("T", 0).max_offset() == 6
    assert rocks.max_physic_offset() == 650
    rocks.close()
    rocks = RocksDBConsumeQueueStore(path)
    rocks.load()  # the cut survived: the offset table says so without reading a unit
    assert rocks.find("T", 0).max_offset() == 6
    # Re-dispatching the cut records is accepted again (a recovered CommitLog re-grows).
    rocks.dispatch(DispatchInfo("T", 0, 6, 600, 100, 0, 1006, 0, {}))
    rocks.commit_dispatch()
    assert rocks.find("T", 0).get_units(5, 10) == [(500, 100, 0), (600, 100, 0)]
    rocks.close()


# -- expiry ------------------------------------------------------------------------------------

@pytest.mark.parametrize("call_delete_expired", [True, False])
def test_deleted_commitlog_files_expire_units(tmp_path, call_delete_expired):
    with MessageStore(config(tmp_path / "s", store_type=STORE_TYPE_ROCKSDB)).open() as s:
        sent = put_some(s, 1500)  # ~210 KiB: four 64 KiB CommitLog segments
        files = s.commitlog.files
        assert len(files.files) >= 3
        s.flush()
        cut = files.files[2].file_from_offset
        assert files.delete_below(cut)
        assert s.commitlog.min_offset == cut
        rocks = s.consume_queues
        if call_delete_expired:
            assert rocks.delete_expired(cut) > 0  # what the clean-up service calls
        for topic in TOPICS:
            for q in range(3):
                mine = [(off, body) for t, qq, off, body in sent if (t, qq) == (topic, q)]
                new_min = s.get_min_offset_in_queue(topic, q)
                assert 0 < new_min < len(mine)
                got = s.get_messages("g", topic, q, new_min - 1)
                assert got.status is GetMessageStatus.OFFSET_TOO_SMALL
                assert got.min_offset == new_min
                assert read_all(s, topic, q, new_min) == [b for o, b in mine if o >= new_min]
        if not call_delete_expired:
            # The read-time check removed the rows too, not just hid them.
            prefix = queue_prefix(b"RdbA", 0)
            assert rocks._db.get(cq_key(prefix, 0)) is None


# -- migration ---------------------------------------------------------------------------------

def test_migrate_both_ways_and_cli_store_type(tmp_path):
    root = tmp_path / "s"
    with MessageStore(config(root)).open() as s:
        put_some(s, 80)
    runner = CliRunner()
    before = runner.invoke(main, ["store", "dump", "--store", str(root)])
    assert before.exit_code == 0, before.output
    res = runner.invoke(main, ["store", "migrate-cq", "--store", str(root), "--to", "rocksdb"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output.strip().splitlines()[-1])
    assert summary["ok"] and summary["units"] == 80 and summary["to"] == STORE_TYPE_ROCKSDB
    assert read_store_type(root) == STORE_TYPE_ROCKSDB
    after = runner.invoke(main, ["store", "dump", "--store", str(root)])
    assert after.output == before.output
    stat = runner.invoke(main, ["store", "stat", "--store", str(root), "--store-type",
                                "defaultRocksDB"])
    assert stat.exit_code == 0 and json.loads(stat.output)["messages"] == 80
    # Back to files (rebuilt afresh from the CommitLog).
    res = runner.invoke(main, ["store", "migrate-cq", "--store", str(root), "--to", "files"])
    assert res.exit_code == 0, res.output
    assert read_store_type(root) == STORE_TYPE_FILES
    assert runner.invoke(main, ["store", "dump", "--store", str(root)]).output == before.output
    again = runner.invoke(main, ["store", "migrate-cq", "--store", str(root), "--to", "files"])
    assert again.exit_code != 0 and "already uses" in again.output


def test_reference_store_migrates_to_rocksdb_and_serves_every_message(reference_copy):
    runner = CliRunner()
    before = runner.invoke(main, ["store", "dump", "--store", str(reference_copy)])
    assert before.exit_code == 0, before.output
    res = runner.invoke(main, ["store", "migrate-cq", "--store", str(reference_copy),
                               "--to", "rocksdb"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output.strip().splitlines()[-1])
    assert summary["ok"], summary
    assert summary["units"] >= REFERENCE_MESSAGES
    assert read_store_type(reference_copy) == STORE_TYPE_ROCKSDB
    # Served through RocksDB now, every message is what the files served, at the same place.
    after = runner.invoke(main, ["store", "dump", "--store", str(reference_copy)])
    assert after.exit_code == 0, after.output
    assert after.output == before.output
    seen = set()
    with MessageStore(StoreConfig(store_path_root_dir=str(reference_copy))).open() as s:
        assert s.store_type == STORE_TYPE_ROCKSDB
        for topic, queue_ids in s.topics().items():
            for q in queue_ids:
                offset = s.get_min_offset_in_queue(topic, q)
                while offset < s.get_max_offset_in_queue(topic, q):
                    got = s.get_messages("g", topic, q, offset, max_count=512,
                                         max_bytes=1 << 30)
                    with got:
                        assert got.status is GetMessageStatus.FOUND
                        for expected_offset, m in enumerate(got.messages(), offset):
                            assert m.queue_offset == expected_offset
                            if m.body.startswith(b"msg-"):
                                i = int(m.body[4:14])
                                assert m.body == reference_body(i)
                                seen.add(i)
                        offset = got.next_begin_offset
    assert seen == set(range(REFERENCE_MESSAGES))


# -- lazy offset table, expiry watermark, reused iterators -------------------------------------

def test_restart_loads_no_queue_until_used_and_answers_like_a_full_load(tmp_path, monkeypatch):
    # As for a table too large to read whole on the first miss (100,000s of queues).
    monkeypatch.setattr(rocksdb_consume_queue, "FULL_LOAD_MAX_ROWS", 0)
    root = tmp_path / "s"
    with MessageStore(config(root, store_type=STORE_TYPE_ROCKSDB)).open() as s:
        sent = put_some(s, 90)
    with MessageStore(config(root)).open() as s:
        rocks = s.consume_queues
        assert rocks._max == {} and rocks._min == {} and not rocks._complete
        # A put to a queue never read yet continues its offsets (filled on first use).
        more = s.put_message(Message("RdbB", b"late", 2))
        assert more.ok and more.queue_offset == 15
        assert s.wait_dispatched()
        assert len(rocks._max) <= 2  # only the queue put to was parsed
        assert read_all(s, "RdbB", 2)[-1] == b"late"
        # Unknown queues are answered without loading the table, and stay unknown.
        assert s.get_max_offset_in_queue("NoSuchTopic", 0) == 0
        assert rocks.find("NoSuchTopic", 0) is None
        # Listing needs every queue: one bulk load, then the same answers as before.
        assert s.topics() == {t: [0, 1, 2] for t in TOPICS}
        assert rocks._complete
        for topic in TOPICS:
            for q in range(3):
                expected = [b for t, qq, _, b in sent if (t, qq) == (topic, q)]
                if (topic, q) == ("RdbB", 2):
                    expected.append(b"late")
                assert read_all(s, topic, q) == expected
        # Destroying a topic on a partly loaded store is remembered after a restart.
    with MessageStore(config(root)).open() as s:
        assert s.consume_queues.find("RdbA", 1) is not None  # one queue filled, not all
        s.consume_queues.destroy_topic("RdbA")
        assert s.consume_queues.find("RdbA", 0) is None
        assert s.consume_queues.find("RdbA", 1) is None
    with MessageStore(config(root)).open() as s:
        assert s.topics() == {"RdbB": [0, 1, 2]}
        assert s.get_max_offset_in_queue("RdbA", 0) == 0


def test_a_small_offset_table_is_read_whole_on_the_first_miss(tmp_path):
    root = tmp_path / "s"
    with MessageStore(config(root, store_type=STORE_TYPE_ROCKSDB)).open() as s:
        sent = put_some(s, 90)
    with MessageStore(config(root)).open() as s:
        rocks = s.consume_queues
        assert rocks._max == {} and not rocks._complete  # opening reads no queue's rows
        assert s.consume_queues.find("RdbA", 1) is not None
        assert rocks._complete  # six queues: one pass, then every first use is a dict hit
        assert s.consume_queues.find("NoSuchTopic", 0) is None
        for topic in TOPICS:
            for q in range(3):
                assert read_all(s, topic, q) == [b for t, qq, _, b in sent if (t, qq) == (topic, q)]


def test_expiry_watermark_survives_restart_and_skips_the_pass(tmp_path):
    root = tmp_path / "s"
    with MessageStore(config(root, store_type=STORE_TYPE_ROCKSDB)).open() as s:
        sent = put_some(s, 1500)
        files = s.commitlog.files
        s.flush()
        cut = files.files[2].file_from_offset
        assert files.delete_below(cut)
        assert s.consume_queues.delete_expired(cut) > 0
        mins = {(t, q): s.get_min_offset_in_queue(t, q) for t in TOPICS for q in range(3)}
    with MessageStore(config(root)).open() as s:
        rocks = s.consume_queues
        assert rocks._expired_below == cut
        assert rocks.delete_expired(cut) == 0 and not rocks._complete  # nothing looked at
        for (topic, q), low in mins.items():
            assert low > 0
            assert s.get_min_offset_in_queue(topic, q) == low
            mine = [b for t, qq, o, b in sent if (t, qq) == (topic, q) and o >= low]
            assert read_all(s, topic, q, low) == mine
            # The expired rows are really gone, not just hidden.
            assert rocks.get_row(cq_key(queue_prefix(topic.encode(), q), low - 1)) is None


def test_a_reading_thread_sees_every_write_after_its_iterator_was_made(tmp_path):
    from stratamq.message import DispatchInfo

    rocks = RocksDBConsumeQueueStore(tmp_path / "rdb")
    rocks.load()
    for i in range(3):
        rocks.dispatch(DispatchInfo("T", 0, i, i * 100, 100, 7, 1000 + i, 0, {}))
    rocks.commit_dispatch()
    q = rocks.find("T", 0)
    assert q.get_units(0, 10) == [(0, 100, 7), (100, 100, 7), (200, 100, 7)]
    it = rocks.reading_iterator()
    assert rocks.reading_iterator() is it  # reused while nothing was written
    rocks.dispatch(DispatchInfo("T", 0, 3, 300, 100, 7, 1003, 0, {}))
    rocks.commit_dispatch()
    assert rocks.reading_iterator() is not it
    assert q.get_units(2, 10) == [(200, 100, 7), (300, 100, 7)]
    # Reads stop at the queue's end and never run into the next queue's keys.
    rocks.dispatch(DispatchInfo("T", 1, 0, 400, 100, 9, 1004, 0, {}))
    rocks.commit_dispatch()
    assert q.get_units(3, 10) == [(300, 100, 7)]
    assert rocks.find("T", 1).get_units(0, 10) == [(400, 100, 9)]
    rocks.destroy_queue("T", 0)
    assert rocks.find("T", 0) is None and q.get_units(0, 10) == []
    del it  # an iterator keeps its database open
    rocks.close()
    rocks = RocksDBConsumeQueueStore(tmp_path / "rdb")
    rocks.load()
    assert rocks.find("T", 0) is None
    assert rocks.find("T", 1).get_units(0, 10) == [(400, 100, 9)]
    rocks.close()


@pytest.mark.parametrize("store_type", ["default", "defaultRocksDB"])
def test_a_woken_listener_finds_the_message_that_woke_it(tmp_path, store_type):
    """Long polls are woken by a dispatch listener; with the RocksDB ConsumeQueue units become
    visible when the round commits, so listeners hear of a record only after that: a woken
    receive finds the message instead of sleeping to its next poll."""
    cfg = StoreConfig(store_path_root_dir=str(tmp_path / "s"), store_type=store_type)
    with MessageStore(cfg) as store:
        seen: list[int] = []

        def on_dispatch(info) -> None:
            with store.get_messages("G", info.topic, info.queue_id, info.queue_offset,
                                    max_count=1) as got:
                seen.append(len(list(got.messages())))

        store.reput.listeners.append(on_dispatch)
        for i in range(20):
            assert store.put_message(Message("Woken", b"m%d" % i)).ok
            assert store.wait_dispatched()
        assert seen and all(n == 1 for n in seen), seen
