"""A compaction topic read from a store directory is the table of its latest values: what the
store's own compaction read path (``PullMessage`` from offset 0) returns once a round compacted
everything, and the same reduction when records are not compacted yet (or compaction never
ran). Compared with the store's reads on the same data."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from compaction_util import HOUR, TOPIC, put_version, read_from, small_config
from conftest_spark import spark_session  # noqa: F401  (the shared `spark` fixture)

from stratamq.compaction.policy import StaticPolicies, TopicPolicy
from stratamq.compaction.service import CompactionStore
from stratamq.message import Message, StoredMessage
from stratamq.store.message_store import MessageStore

PLAIN = "Plain"


def _write_topics(root: Path) -> None:
    (root / "config").mkdir(parents=True, exist_ok=True)
    (root / "config" / "topics.json").write_text(json.dumps({"topicConfigTable": {
        TOPIC: {"topicName": TOPIC, "readQueueNums": 2, "writeQueueNums": 2, "perm": 6,
                "attributes": {"cleanup.policy": "COMPACTION",
                               "delete.retention.ms": str(HOUR)}},
        PLAIN: {"topicName": PLAIN, "readQueueNums": 1, "writeQueueNums": 1, "perm": 6}}}))


def _open(root: Path, compaction: bool = True) -> tuple[MessageStore, CompactionStore | None]:
    config = small_config(root, max_offset_map_size=64 << 20)
    store = MessageStore(config)
    comp = None
    if compaction:
        comp = CompactionStore(config, StaticPolicies({TOPIC: TopicPolicy(HOUR)}))
        comp.plug_into(store)
    store.open()
    return store, comp


def _close(store: MessageStore, comp: CompactionStore | None) -> None:
    store.close()
    if comp is not None:
        comp.close()


def _puts(store: MessageStore, start: int, count: int) -> None:
    """Updates of 50 keys over 2 queues, keyless messages, both kinds of tombstone, and a
    plain topic's messages with the same keys (never reduced)."""
    for i in range(start, start + count):
        put_version(store, i, keys=50)
        if i % 5 == 0:
            assert store.put_message(Message(PLAIN, b"p%d" % i, 0, {"KEYS": f"k{i % 50}"})).ok


def _key(m: StoredMessage) -> tuple:
    return (m.queue_id, m.queue_offset, m.physical_offset, m.msg_id, bytes(m.body),
            dict(m.properties))


def _row_key(r) -> tuple:
    return (r["queue_id"], r["queue_offset"], r["commitlog_offset"], r["msg_id"],
            bytes(r["body"]), dict(r["properties"]))


def _tombstone(m: StoredMessage) -> bool:
    return not m.body or m.properties.get("TOMBSTONE", "").lower() == "true"


def _store_reads(root: Path) -> list[StoredMessage]:
    """Both queues read from offset 0 through the store's compaction read path."""
    store, comp = _open(root)
    try:
        return [m for q in (0, 1) for m in read_from(store, 0, q)]
    finally:
        _close(store, comp)


def _reduced(messages: list[StoredMessage], tombstones: bool) -> list[tuple]:
    """The latest message per (queue, key) of what a consumer read: the model of the table."""
    latest: dict[tuple, StoredMessage] = {}
    for m in messages:
        key = m.properties.get("KEYS")
        if key:
            latest[(m.queue_id, key)] = m
    return sorted(_key(m) for m in latest.values() if tombstones or not _tombstone(m))


def _spark_rows(spark, root: Path, **options: str) -> list:
    reader = spark.read.format("stratamq")
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load(str(root)).collect()


@pytest.fixture(scope="module")
def compacted(tmp_path_factory) -> Path:
    """Every record of the topic compacted by one round (the file being written sealed first,
    as ``stratamq compaction run`` does)."""
    root = tmp_path_factory.mktemp("latest") / "store"
    _write_topics(root)
    store, comp = _open(root)
    try:
        _puts(store, 0, 900)
        assert store.wait_dispatched()
        assert comp is not None
        assert all(r.skipped is None for r in comp.run_now(TOPIC))
    finally:
        _close(store, comp)
    return root


@pytest.mark.parametrize("tombstones", [True, False])
def test_table_equals_pull_from_zero_after_compaction(spark, compacted, tombstones):
    pulled = _store_reads(compacted)
    # The round left one record per key (keyless ones removed): the read is already the table.
    assert len(pulled) == len({(m.queue_id, m.properties["KEYS"]) for m in pulled})
    assert any(_tombstone(m) for m in pulled)
    expected = sorted(_key(m) for m in pulled if tombstones or not _tombstone(m))
    rows = _spark_rows(spark, compacted, topics=TOPIC, includeTombstones=str(tombstones).lower())
    assert sorted(_row_key(r) for r in rows) == expected
    assert {r["topic"] for r in rows} == {TOPIC}


def test_whole_store_read_reduces_only_compaction_topics(spark, compacted):
    rows = _spark_rows(spark, compacted, minPartitions="3")
    table = sorted(_row_key(r) for r in rows if r["topic"] == TOPIC)
    assert table == sorted(_key(m) for m in _store_reads(compacted) if not _tombstone(m))
    assert len([r for r in rows if r["topic"] == PLAIN]) == 180  # every version of the rest


def test_records_after_the_round_are_reduced_too(spark, compacted, tmp_path):
    """Newer versions in the file being written (not compacted: a pull from 0 shows them all)
    and records the CommitLog holds that were never split out reduce with the compacted ones."""
    root = tmp_path / "store"
    shutil.copytree(compacted, root)
    store, comp = _open(root)
    try:
        _puts(store, 900, 300)
        assert store.wait_dispatched()
    finally:
        _close(store, comp)
    store, _ = _open(root, compaction=False)  # these only reach the ConsumeQueue
    try:
        _puts(store, 1200, 120)
        assert store.wait_dispatched()
    finally:
        store.close()
    store, comp = _open(root)  # the open splits them out: read them through the store too
    try:
        pulled = [m for q in (0, 1) for m in read_from(store, 0, q)]
    finally:
        _close(store, comp)
    assert len(pulled) > len(_reduced(pulled, True))  # several versions of some keys
    for tombstones in (False, True):
        rows = _spark_rows(spark, root, topics=TOPIC,
                           includeTombstones=str(tombstones).lower())
        assert sorted(_row_key(r) for r in rows) == _reduced(pulled, tombstones)
    # latestValues=false: every version the ConsumeQueue indexes.
    every = _spark_rows(spark, root, topics=TOPIC, latestValues="false")
    assert len(every) == 1320  # one message of the topic per put


def test_a_store_whose_compaction_never_ran_is_reduced_from_its_consume_queue(spark, tmp_path):
    root = tmp_path / "store"
    _write_topics(root)
    store, _ = _open(root, compaction=False)
    try:
        _puts(store, 0, 400)
        assert store.wait_dispatched()
        pulled = [m for q in (0, 1) for m in read_from(store, 0, q)]
    finally:
        store.close()
    assert not (root / "compaction" / "compactionLog").exists()
    rows = _spark_rows(spark, root, topics=TOPIC)
    assert sorted(_row_key(r) for r in rows) == _reduced(pulled, False)
    rows = _spark_rows(spark, root, topics=TOPIC, startingOffsets=json.dumps({TOPIC: {"0": 100}}))
    assert sorted(_row_key(r) for r in rows) == _reduced(
        [m for m in pulled if m.queue_id == 1 or m.queue_offset >= 100], False)


def test_include_tombstones_needs_latest_values(spark, compacted):
    with pytest.raises(Exception, match="includeTombstones") as info:
        spark.read.format("stratamq").option("latestValues", "false").option(
            "includeTombstones", "true").load(str(compacted))
    assert "latestValues=false" in str(info.value)
    with pytest.raises(Exception, match="latestValues"):
        spark.read.format("stratamq").option("latestValues", "maybe").load(str(compacted))


def test_a_queue_whose_older_files_are_only_in_the_tier_is_refused(compacted, tmp_path):
    """A table from the local files alone would silently lack the keys the tier holds."""
    from stratamq.compaction.log import CompactionLogError
    from stratamq.spark.datasource import plan_batch

    root = tmp_path / "store"
    shutil.copytree(compacted, root)
    state = root / "compaction" / "compactionLog" / TOPIC / "0" / "state.json"
    doc = json.loads(state.read_text())
    doc["tierFloor"] = 10
    state.write_text(json.dumps(doc))
    with pytest.raises(CompactionLogError, match=r"Kv/0: .*below offset 10 are in the tier"):
        plan_batch({"path": str(root), "topics": TOPIC})
    assert len(plan_batch({"path": str(root), "topics": TOPIC, "latestValues": "false"})) >= 1
