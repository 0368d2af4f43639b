"""``compact``: a compaction topic compacted by Spark (a distributed reduce over the keys) ends
with exactly the files and state a single-machine round leaves when its OffsetMap holds every
key; the store then serves the latest value per key, tombstones dropped per retention."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from compaction_util import HOUR, TOPIC, as_table, put, put_version, read_from, small_config
from conftest_spark import spark_session  # noqa: F401  (the shared `spark` fixture)

from stratamq.compaction.policy import StaticPolicies, TopicPolicy
from stratamq.compaction.service import CompactionStore
from stratamq.spark.pipelines.common import PipelineError
from stratamq.spark.pipelines.compact import run_compact
from stratamq.store.message_store import MessageStore

T0 = 1_800_000_000_000  # the first round's time
T1 = T0 + 2 * HOUR  # the second's: the first round's tombstones are past their retention


def _write_topics(root: Path) -> None:
    (root / "config").mkdir(parents=True, exist_ok=True)
    (root / "config" / "topics.json").write_text(json.dumps({"topicConfigTable": {TOPIC: {
        "topicName": TOPIC, "readQueueNums": 2, "writeQueueNums": 2, "perm": 6,
        "attributes": {"cleanup.policy": "COMPACTION", "delete.retention.ms": str(HOUR)}}}}))


def _open(root: Path, big_map: bool = True) -> tuple[MessageStore, CompactionStore]:
    config = small_config(root, max_offset_map_size=(64 << 20) if big_map else 24 * 1024)
    store = MessageStore(config)
    compaction = CompactionStore(config, StaticPolicies({TOPIC: TopicPolicy(HOUR)}))
    compaction.plug_into(store)
    store.open()
    return store, compaction


def _puts(store: MessageStore, start: int, count: int) -> None:
    """Updates of 60 keys over 2 queues, keyless messages, and both kinds of tombstone."""
    for i in range(start, start + count):
        put_version(store, i, keys=60)


def _compaction_files(root: Path) -> dict[str, bytes]:
    base = root / "compaction"
    out = {}
    for p in sorted(base.rglob("*")):
        if not p.is_file() or p.name in ("dispatch-checkpoint", "position-checkpoint"):
            continue
        data = p.read_bytes()
        if p.name == "state.json":  # the last round's report carries its own timing
            doc = json.loads(data)
            for key in ("elapsed_ms", "keys_mapped", "map_bytes"):
                doc["lastRound"].pop(key, None)
            data = json.dumps(doc, sort_keys=True).encode()
        out[str(p.relative_to(base))] = data
    return out


@pytest.fixture(scope="module")
def history(tmp_path_factory) -> Path:
    """A store whose topic had one round at T0 and got more messages after it."""
    root = tmp_path_factory.mktemp("compact") / "store"
    _write_topics(root)
    store, compaction = _open(root)
    try:
        _puts(store, 0, 700)
        for j in range(10):  # keys deleted before T0 and never written again
            put(store, f"dead-{j}", b"last value", j % 2)
            put(store, f"dead-{j}", b"", j % 2)
        _puts(store, 700, 40)
        assert store.wait_dispatched()
        reports = compaction.run_now(TOPIC, now_ms=T0)
        assert all(r.skipped is None for r in reports)
        _puts(store, 740, 500)
        assert store.wait_dispatched()
    finally:
        store.close()
        compaction.close()
    return root


def test_spark_compact_equals_the_single_machine_round(spark, history, tmp_path):
    single = tmp_path / "single"
    shutil.copytree(history, single)
    store, compaction = _open(single)
    try:
        expected = [r.to_json() for r in compaction.run_now(TOPIC, now_ms=T1)]
    finally:
        store.close()
        compaction.close()

    distributed = tmp_path / "spark"
    shutil.copytree(history, distributed)
    summary = run_compact(spark, str(distributed), TOPIC, config=small_config(distributed),
                          now_ms=T1, progress=False, partition_bytes=4096)

    assert _compaction_files(distributed) == _compaction_files(single)
    assert summary["removed"] == sum(r["removed"] for r in expected) > 100
    assert summary["tombstones_dropped"] == sum(r["tombstones_dropped"] for r in expected) > 0
    # What a consumer reads: the latest value per key, from either store.
    tables = []
    for root in (single, distributed):
        store, compaction = _open(root)
        try:
            tables.append([as_table(read_from(store, 0, q)) for q in (0, 1)])
        finally:
            store.close()
            compaction.close()
    assert tables[0] == tables[1] and all(tables[0])


def test_keys_beyond_one_offset_map_are_compacted_in_one_pass(spark, tmp_path):
    """2,000 distinct keys: a single-machine round with the smallest OffsetMap
    (maxOffsetMapSize=24 KiB, about 920 keys) covers only part of the queue; Spark covers all
    of it in one pass, with the files a round whose map held every key leaves."""
    base = tmp_path / "base"
    _write_topics(base)
    store, compaction = _open(base)
    try:
        for i in range(2600):
            put(store, f"key-{i % 2000}", b"v%d" % i)
        assert store.wait_dispatched()
    finally:
        store.close()
        compaction.close()
    copies = {name: tmp_path / name for name in ("small", "big", "spark")}
    for root in copies.values():
        shutil.copytree(base, root)
    covered = {}
    for name in ("small", "big"):
        store, compaction = _open(copies[name], big_map=name == "big")
        try:
            compaction.run_now(TOPIC, now_ms=T1)
            covered[name] = compaction.queues(TOPIC)[0].state.cleaned_to
        finally:
            store.close()
            compaction.close()
    run_compact(spark, str(copies["spark"]), TOPIC, config=small_config(copies["spark"]),
                now_ms=T1, progress=False)
    store, compaction = _open(copies["spark"])
    try:
        covered["spark"] = compaction.queues(TOPIC)[0].state.cleaned_to
        latest = as_table(read_from(store, 0, 0))
    finally:
        store.close()
        compaction.close()
    assert covered["small"] < covered["big"] == covered["spark"]
    assert _compaction_files(copies["spark"]) == _compaction_files(copies["big"])
    # Every key's latest value, once: key k was written at i = k and, for k < 600, again at
    # i = k + 2000.
    assert latest == {f"key-{k}": b"v%d" % (k + 2000 if k < 600 else k) for k in range(2000)}


def test_a_topic_that_is_not_compacted_is_refused(spark, history, tmp_path):
    root = tmp_path / "store"
    shutil.copytree(history, root)
    with pytest.raises(PipelineError, match="not a compaction topic"):
        run_compact(spark, str(root), "Orders", config=small_config(root), progress=False)
