"""Compaction topics on a real store: the CompactionLog split out of the CommitLog, rounds,
tombstones, reads across holes, restarts, recovery of damaged files."""

from __future__ import annotations

import json
import os

import pytest
from compaction_util import (
    HOUR,
    TOPIC,
    as_table,
    close,
    compact,
    open_store,
    put,
    read_from,
    small_config,
)
from damage import patch
from waiting import wait_until

from stratamq.compaction import bcq_format as bcq
from stratamq.compaction.layout import CompactionLayout
from stratamq.compaction.log import CompactionLogError
from stratamq.compaction.policy import StaticPolicies, TopicPolicy
from stratamq.compaction.service import CompactionStore
from stratamq.compaction.state_format import StateError
from stratamq.config import InvalidSetting
from stratamq.store.layout import StoreLayout


@pytest.fixture
def cfg(tmp_path):
    return small_config(tmp_path / "store")


def queue_dir(cfg, kind="compactionLog", topic=TOPIC, queue_id=0):
    return CompactionLayout(StoreLayout(cfg.root)).base / kind / topic / str(queue_id)


def test_records_of_a_compaction_topic_are_split_into_its_compaction_log(cfg):
    store, comp = open_store(cfg)
    try:
        put(store, "a", b"1")
        put(store, "x", b"other topic", topic="Plain")
        put(store, "b", b"2", queue_id=3)
        assert store.wait_dispatched()
        assert comp.topics() == {TOPIC: [0, 3]}  # Plain is not a compaction topic
        assert [m.body for m in read_from(store)] == [b"1"]
        assert [m.body for m in read_from(store, queue_id=3)] == [b"2"]
    finally:
        close(store, comp)
    names = sorted(p.name for p in queue_dir(cfg).iterdir())
    assert names == ["00000000000000000000"]  # state.json comes with the first round
    assert sorted(p.name for p in queue_dir(cfg, "compactionCq").iterdir()) == [
        "00000000000000000000"]


def test_a_round_keeps_the_latest_value_per_key_and_offsets_never_change(cfg):
    store, comp = open_store(cfg)
    try:
        offsets = {}
        for i in range(300):
            key = f"k{i % 20}"
            offsets[key] = put(store, key, b"value-%d" % i)
        before = read_from(store)
        assert len(before) == 300  # before a round: everything
        [report] = compact(store, comp)
        assert report.skipped is None
        assert (report.records_read, report.kept, report.removed) == (300, 20, 280)
        assert report.bytes_after < report.bytes_before / 10
        after = read_from(store)
        # Exactly the latest value of each key, in offset order, at its original offset.
        assert [(m.keys[0], m.queue_offset) for m in after] == sorted(
            offsets.items(), key=lambda kv: kv[1])
        assert as_table(after) == as_table(before)
        # Same bytes as the CommitLog held: ids and CRCs unchanged.
        by_offset = {m.queue_offset: m for m in before}
        for m in after:
            assert m.msg_id == by_offset[m.queue_offset].msg_id
            assert m.body_crc == by_offset[m.queue_offset].body_crc
        assert store.get_max_offset_in_queue(TOPIC, 0) == 300
    finally:
        close(store, comp)


def test_reading_from_a_removed_offset_starts_at_the_next_kept_message(cfg):
    store, comp = open_store(cfg)
    try:
        for i in range(10):
            put(store, "same", b"%d" % i)  # offsets 0..9, only 9 survives
        put(store, "other", b"x")  # 10
        compact(store, comp)
        for offset in (0, 4, 8):
            with store.get_messages("g", TOPIC, 0, offset, 5) as got:
                assert got.status.value == "FOUND"
                assert [r.queue_offset for r in got.records] == [9, 10]
                assert got.next_begin_offset == 11
        # A new group starts at the minimum offset: the first kept message.
        assert comp.offsets(TOPIC, 0) == (9, 11)
    finally:
        close(store, comp)


def test_tombstones_delete_and_stay_for_delete_retention_ms_after_the_round_that_saw_them(cfg):
    store, comp = open_store(cfg)
    t0 = 1_700_000_000_000
    try:
        put(store, "a", b"1")
        put(store, "b", b"2")
        put(store, "a", b"")  # empty body: a tombstone
        put(store, "b", b"keep-me", TOMBSTONE="true")  # the property makes one too
        put(store, "c", b"3")
        [first] = compact(store, comp, now_ms=t0)
        assert first.tombstones_dropped == 0
        kept = read_from(store)
        # The deletes are still there for readers that started before; the values are gone.
        assert [(m.keys[0], m.body) for m in kept] == [("a", b""), ("b", b"keep-me"),
                                                       ("c", b"3")]
        assert as_table(kept) == {"c": b"3"}
        put(store, "d", b"4")
        [second] = compact(store, comp, now_ms=t0 + HOUR - 1)  # not yet past retention
        assert second.tombstones_dropped == 0
        [third] = compact(store, comp, now_ms=t0 + HOUR)
        assert third.tombstones_dropped == 2
        assert [(m.keys[0], m.body) for m in read_from(store)] == [("c", b"3"), ("d", b"4")]
    finally:
        close(store, comp)


def test_a_round_with_only_expired_tombstones_to_drop_still_runs(cfg):
    store, comp = open_store(cfg)
    try:
        put(store, "a", b"1")
        put(store, "a", b"")
        compact(store, comp, now_ms=1000)
        assert [m.body for m in read_from(store)] == [b""]
        # No new message since: the round runs for the tombstone alone, once it expired.
        [report] = compact(store, comp, now_ms=1000 + HOUR, seal=False)
        assert report.skipped is None and report.tombstones_dropped == 1
        assert read_from(store) == []
        assert store.get_max_offset_in_queue(TOPIC, 0) == 2  # the queue still ends at 2
        [idle] = compact(store, comp, now_ms=2000 + HOUR, seal=False)
        assert idle.skipped is not None and idle.records_read == 0
    finally:
        close(store, comp)


def test_messages_without_a_key_are_removed_by_the_round_that_covers_them(cfg):
    store, comp = open_store(cfg)
    try:
        put(store, None, b"no key")
        put(store, "k", b"v")
        assert [m.body for m in read_from(store)] == [b"no key", b"v"]
        [report] = compact(store, comp)
        assert report.removed == 1
        assert [m.body for m in read_from(store)] == [b"v"]
    finally:
        close(store, comp)


def test_the_file_being_written_is_never_compacted(cfg):
    store, comp = open_store(cfg)
    try:
        for i in range(5):
            put(store, "k", b"%d" % i)
        # One file, being written: a scheduled round (no sealing) leaves it alone.
        [report] = compact(store, comp, seal=False)
        assert report.skipped.startswith("fewer than two files")
        assert len(read_from(store)) == 5
        compact(store, comp)  # sealed first: compacts it
        assert [m.body for m in read_from(store)] == [b"4"]
        put(store, "k", b"5")  # lands in the new file being written
        [again] = compact(store, comp, seal=False)
        assert again.skipped == "nothing new since the last round"
        assert [m.body for m in read_from(store)] == [b"4", b"5"]
    finally:
        close(store, comp)


def test_a_small_offset_map_compacts_in_several_rounds(tmp_path):
    """Seed 001's incremental build: the map holds a part of the keys; the next round goes on
    from where it ended, and keys it does not hold keep their previous value."""
    cfg = small_config(tmp_path / "store", max_offset_map_size=24 * 1024,
                       compaction_thread_num=1, compaction_mapped_file_size=200 * 1024,
                       compaction_cq_mapped_file_size=8192 * 64)
    store, comp = open_store(cfg)
    try:
        expected = {}
        for i in range(3000):
            key = f"k{i % 1500}"  # 1,500 keys: more than the 921 the map takes
            put(store, key, b"%d" % i)
            expected[key] = b"%d" % i
        reports = []
        while True:
            [report] = compact(store, comp)
            if report.skipped:
                break
            reports.append(report)
            assert report.keys_mapped <= 921
        assert len(reports) >= 3
        assert [r.cleaned_to for r in reports][-1] == 3000
        final = read_from(store)
        assert len(final) == 1500 and as_table(final) == expected
    finally:
        close(store, comp)


def test_tag_filters_and_offsets_by_time_work_on_a_compacted_queue(cfg):
    store, comp = open_store(cfg)
    try:
        put(store, "a", b"1", TAGS="red")
        put(store, "b", b"2", TAGS="blue")
        put(store, "a", b"3", TAGS="red")
        compact(store, comp)
        with store.get_messages("g", TOPIC, 0, 0, 10, tag_filter="blue") as got:
            assert [m.body for m in got.messages()] == [b"2"]
        with store.get_messages("g", TOPIC, 0, 0, 10, tag_filter="green") as got:
            assert got.records == [] and got.status.value == "NO_MATCHED_MESSAGE"
            assert got.next_begin_offset == 3
        first = read_from(store)[0]
        assert store.get_offset_in_queue_by_time(TOPIC, 0, first.store_timestamp) <= 1
    finally:
        close(store, comp)


def test_compaction_and_its_reads_survive_a_restart(cfg):
    store, comp = open_store(cfg)
    for i in range(200):
        put(store, f"k{i % 7}", b"%d" % i)
    compact(store, comp)
    for i in range(200, 230):
        put(store, f"k{i % 7}", b"%d" % i)
    expected = read_from(store)
    close(store, comp)
    store, comp = open_store(cfg)
    try:
        assert [(m.queue_offset, m.body) for m in read_from(store)] == [
            (m.queue_offset, m.body) for m in expected]
        assert comp.status()[0]["cleaned_to"] == 200
        [report] = compact(store, comp)
        assert report.skipped is None and report.kept == 7
    finally:
        close(store, comp)


def test_the_scheduler_compacts_in_the_background_after_a_restart(tmp_path):
    cfg = small_config(tmp_path / "store", compaction_schedule_internal=50)
    store, comp = open_store(cfg)
    for i in range(400):  # enough to roll several files: the scheduler never seals
        put(store, "k", b"%d" % i)
    close(store, comp)
    store, comp = open_store(cfg, start=True)
    try:
        wait_until(lambda: comp.status()[0]["cleaned_to"] > 0, what="a background round")
        assert len(read_from(store)) < 400
    finally:
        close(store, comp)


def test_a_replay_after_an_unflushed_stop_adds_nothing_twice(cfg):
    store, comp = open_store(cfg)
    for i in range(50):
        put(store, f"k{i}", b"%d" % i)
    store.close()
    for clog in comp.queues():  # closed without a flush: its checkpoint stays at 0
        clog.close()
    assert not CompactionLayout(StoreLayout(cfg.root)).dispatch_checkpoint.exists()
    store, comp = open_store(cfg)
    try:
        assert [m.queue_offset for m in read_from(store)] == list(range(50))
        assert comp.status()[0]["messages"] == 50
    finally:
        close(store, comp)


def test_deleting_the_topic_removes_its_compaction_log(cfg):
    store, comp = open_store(cfg)
    try:
        put(store, "a", b"1")
        compact(store, comp)
        store.delete_topic(TOPIC)
        assert comp.topics() == {}
        assert not queue_dir(cfg).exists()
        put(store, "a", b"again")
        assert [m.body for m in read_from(store)] == [b"again"]
    finally:
        close(store, comp)


def test_a_torn_batch_cq_tail_is_cut_and_dispatched_again_from_the_commitlog(cfg):
    store, comp = open_store(cfg)
    for i in range(20):
        put(store, f"k{i}", b"%d" % i)
    close(store, comp)
    cq = queue_dir(cfg, "compactionCq") / "00000000000000000000"
    log_file = queue_dir(cfg) / "00000000000000000000"
    # The last unit points at garbage, the log's last record loses its magic code.
    patch(cq, 19 * bcq.UNIT_SIZE, (12345678).to_bytes(8, "big"))
    unit = bcq.unpack_unit(cq.read_bytes(), 18 * bcq.UNIT_SIZE)
    patch(log_file, unit.position + 4, b"\0\0\0\0")
    # ... and the checkpoint says only half was flushed, as after a crash.
    ckpt = CompactionLayout(StoreLayout(cfg.root)).dispatch_checkpoint
    ckpt.write_text(json.dumps({"version": 1, "dispatchedTo": 0}))
    store, comp = open_store(cfg)
    try:
        [queue] = comp.queues()
        assert queue.recovered[0].dropped_units == 2
        assert [m.body for m in read_from(store)] == [b"%d" % i for i in range(20)]
    finally:
        close(store, comp)


def test_a_log_file_without_its_batch_cq_file_is_refused_with_a_clear_error(cfg):
    store, comp = open_store(cfg)
    for i in range(100):
        put(store, "k", b"%d" % i)
    close(store, comp)
    first_cq = queue_dir(cfg, "compactionCq") / "00000000000000000000"
    os.rename(first_cq, first_cq.with_name("moved-away"))
    with pytest.raises(CompactionLogError, match="has no matching batch CQ file"):
        open_store(cfg)


def test_a_damaged_state_file_is_refused_naming_it(cfg):
    store, comp = open_store(cfg)
    put(store, "k", b"v")
    compact(store, comp)
    close(store, comp)
    state_file = queue_dir(cfg) / "state.json"
    state = json.loads(state_file.read_text())
    state_file.write_text(json.dumps({**state, "cleanedTo": -4}))
    with pytest.raises(StateError, match="state.json.*cleanedTo"):
        open_store(cfg)


def test_a_compaction_log_file_must_hold_the_largest_record(tmp_path):
    cfg = small_config(tmp_path / "store", max_message_size=4 * 1024 * 1024)
    with pytest.raises(InvalidSetting, match="compactionMappedFileSize"):
        CompactionStore(cfg, StaticPolicies({}))


def test_a_read_only_store_reads_the_compacted_queue(cfg):
    store, comp = open_store(cfg)
    for i in range(30):
        put(store, f"k{i % 3}", b"%d" % i)
    compact(store, comp)
    close(store, comp)
    store, comp = open_store(cfg, read_only=True)
    try:
        assert [m.body for m in read_from(store)] == [b"27", b"28", b"29"]
        with pytest.raises(RuntimeError, match="open for writing"):
            compact(store, comp)
    finally:
        close(store, comp)


def test_policies_come_from_topic_attributes_in_topics_json(tmp_path):
    from stratamq.compaction.policy import PolicyError, policies_from_topics_json

    path = tmp_path / "topics.json"
    path.write_text(json.dumps({"topicConfigTable": {
        "Kv": {"topicName": "Kv", "attributes": {"+cleanup.policy": "COMPACTION",
                                                   "delete.retention.ms": "60000"}},
        "Plain": {"topicName": "Plain", "attributes": {"cleanup.policy": "DELETE"}},
        "Old": {"topicName": "Old"}}}))
    policies = policies_from_topics_json(path)
    assert policies.policy("Kv") == TopicPolicy(60000)
    assert policies.policy("Plain") is None and policies.policy("Old") is None
    assert policies_from_topics_json(tmp_path / "missing.json").topics() == []
    path.write_text(json.dumps({"topicConfigTable": {
        "Kv": {"topicName": "Kv", "attributes": {"cleanup.policy": "COMPACT"}}}}))
    with pytest.raises(PolicyError, match="'Kv'.*cleanup.policy must be DELETE|COMPACTION"):
        policies_from_topics_json(path)


def test_a_batch_cq_of_rocketmq_46_byte_units_is_refused_not_rewritten(cfg):
    store, comp = open_store(cfg)
    put(store, "k", b"v")
    close(store, comp)
    cq = queue_dir(cfg, "compactionCq") / "00000000000000000000"
    foreign = b"\x01" * (46 * 40)  # RocketMQ's BatchConsumeQueue file size: whole 46-byte units
    cq.write_bytes(foreign)
    with pytest.raises(CompactionLogError, match="not whole 64-byte units.*46-byte"):
        open_store(cfg)
    assert cq.read_bytes() == foreign  # left as it was
