"""``offload``: the RocketMQ-written reference store moved into a tier (a POSIX directory, and a
real S3-compatible server on loopback), then a store with that tier and nothing local serves
every message, byte for byte, through every read path; a rerun writes nothing; a driver killed
mid-run and run again ends with exactly the bytes of an uninterrupted run, and at no moment is
a tier file half written."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import PROJECT, REFERENCE_MESSAGES, reference_body
from conftest_spark import spark_session  # noqa: F401  (the shared `spark` fixture)
from s3_server import S3Server

from stratamq import tiered
from stratamq.config import StoreConfig
from stratamq.record import Prop
from stratamq.spark.pipelines.offload import run_offload
from stratamq.store.message_store import MessageStore
from stratamq.tiered.naming import file_name_to_offset

TOPICS = [f"BenchTopic{i}" for i in range(4)]
# Small tier files so the 25 MB history spans many: index files of 14,999 items (3 for the
# 40,000 keys), CommitLog chunks of about 512 KB (several per queue).
SETTINGS = {"tieredStoreIndexFileMaxHashSlotNum": "211",
            "tieredStoreIndexFileMaxIndexNum": "15000"}
PARTITION = 512 * 1024


def _config(**extra) -> StoreConfig:
    return StoreConfig(tiered_store_index_file_max_hash_slot_num=211,
                       tiered_store_index_file_max_index_num=15000, **extra)


def _tier_files(tier: Path) -> dict[str, bytes]:
    return {str(p.relative_to(tier)): p.read_bytes() for p in sorted(tier.rglob("*"))
            if p.is_file()}


def _reference_records(reference: Path) -> dict[tuple[str, int], list[bytes]]:
    """Every record of every queue of the reference store, read from its own files."""
    out: dict[tuple[str, int], list[bytes]] = {}
    with MessageStore(StoreConfig(store_path_root_dir=str(reference)), read_only=True) as s:
        for topic in TOPICS:
            for q in range(4):
                offset, records = 0, []
                while True:
                    with s.get_messages("g", topic, q, offset, 256) as got:
                        if not got.records:
                            break
                        records += [bytes(r.buffer) for r in got.records]
                        offset = got.next_begin_offset
                out[(topic, q)] = records
    return out


def _open_on_tier(tmp_path: Path, **where) -> tuple[MessageStore, tiered.TieredStore]:
    """A store with nothing local but the tier (it adopts what the offload registered)."""
    config = _config(store_path_root_dir=str(tmp_path / "empty-store"), **where)
    store = MessageStore(config)
    tier = tiered.wire(store, cluster="DefaultCluster", broker="broker-a", background=False)
    assert tier is not None
    store.open()
    tier.start()
    return store, tier


def _serves_every_message(store: MessageStore, expected: dict[tuple[str, int], list[bytes]]
                          ) -> None:
    assert sorted(store.topics()) == TOPICS
    for (topic, q), records in expected.items():
        assert store.get_min_offset_in_queue(topic, q) == 0
        assert store.get_max_offset_in_queue(topic, q) == len(records)
        offset, got = 0, []
        while offset < len(records):
            with store.get_messages("g", topic, q, offset, 300) as result:
                assert result.records, (topic, q, offset, result.status)
                got += [bytes(r.buffer) for r in result.records]
                offset = result.next_begin_offset
        assert got == records, (topic, q)
    # Key lookups (KEYS and the producer's id, UNIQ_KEY) and the offset message id.
    for i in (0, 1, 4321, REFERENCE_MESSAGES - 1):
        topic = f"BenchTopic{i % 4}"
        [hit] = store.query_messages(topic, f"key-{i}")
        assert bytes(hit.body) == reference_body(i)
        by_uniq = store.look_message_by_msg_id(hit.properties[Prop.UNIQ_KEY], topic)
        assert by_uniq is not None and by_uniq.physical_offset == hit.physical_offset
        by_offset_id = store.look_message_by_msg_id(hit.msg_id)
        assert by_offset_id is not None and bytes(by_offset_id.body) == reference_body(i)


@pytest.fixture(scope="module")
def offloaded(spark, reference_store, tmp_path_factory):
    tier = tmp_path_factory.mktemp("offload") / "tier"
    summary = run_offload(spark, str(reference_store), str(tier), config=_config(),
                          progress=False, partition_bytes=PARTITION)
    return tier, summary


@pytest.fixture(scope="module")
def expected(reference_store):
    return _reference_records(reference_store)


def test_offloaded_history_is_served_by_a_store_with_nothing_local(offloaded, expected,
                                                                   tmp_path):
    tier, summary = offloaded
    assert summary["messages"] == REFERENCE_MESSAGES and summary["queues"] == 16
    assert summary["index_items"] == 2 * REFERENCE_MESSAGES
    names = [p for p in tier.rglob("*") if p.is_file()]
    assert len([p for p in names if p.parent.name == "INDEX"]) == 3
    assert len([p for p in names if p.parent.name == "COMMIT_LOG"]) > 16  # chunks
    # Every data file is named as the tier names them (no temporary left behind).
    assert all(file_name_to_offset(p.name) is not None for p in names
               if p.parent.name in ("COMMIT_LOG", "CONSUME_QUEUE", "INDEX"))

    store, tier_store = _open_on_tier(tmp_path, tiered_backend_service_provider="posix",
                                      tiered_store_file_path=str(tier))
    try:
        _serves_every_message(store, expected)
    finally:
        store.close()
        tier_store.close()
    topics = json.loads((tmp_path / "empty-store" / "config" / "topics.json").read_text())
    assert sorted(topics["topicConfigTable"]) == TOPICS
    assert topics["topicConfigTable"]["BenchTopic0"]["readQueueNums"] == 4


def test_the_spark_source_reads_the_offloaded_tier(spark, offloaded):
    tier, _ = offloaded
    rows = spark.read.format("stratamq").load(str(tier)).select(
        "topic", "queue_id", "queue_offset", "body").collect()
    assert len(rows) == REFERENCE_MESSAGES
    for row in rows[::997]:  # message i's placement, as tests/data/REFERENCE.md gives it
        i = row.queue_offset * 16 + row.queue_id * 4 + int(row.topic[-1])
        assert bytes(row.body) == reference_body(i)


def test_a_rerun_writes_nothing(spark, offloaded, reference_store):
    tier, _ = offloaded
    before = {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in tier.rglob("*")}
    again = run_offload(spark, str(reference_store), str(tier), config=_config(),
                        progress=False, partition_bytes=PARTITION)
    assert again["noop"] and again["files_written"] == 0
    assert {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in tier.rglob("*")} == before


def test_a_killed_driver_then_a_rerun_ends_with_the_same_bytes(spark, offloaded,
                                                               reference_store, tmp_path):
    """The CLI's driver (and its Spark) is SIGKILLed once the write stage has put files in the
    tier; every file then present is whole, nothing is registered; a rerun ends with exactly
    the bytes of the uninterrupted offload."""
    clean_tier, _ = offloaded
    clean = _tier_files(clean_tier)
    tier = tmp_path / "tier"
    conf = tmp_path / "broker.conf"
    conf.write_text("".join(f"{k}={v}\n" for k, v in SETTINGS.items()))
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "stratamq.cli", "spark", "offload", "--store",
         str(reference_store), "--tier", str(tier), "--config", str(conf), "--master",
         "local[1]", "--partition-mb", str(PARTITION / 2**20), "--quiet"], cwd=PROJECT,
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)  # its own group: the JVM goes too
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            if len([p for p in tier.rglob("*") if p.parent.name == "COMMIT_LOG"]) >= 3:
                break
            time.sleep(0.05)
        assert proc.poll() is None, "the offload ended before it could be killed"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    partial = _tier_files(tier)
    assert partial and "DefaultCluster" in next(iter(partial))
    named = {k: v for k, v in partial.items() if file_name_to_offset(Path(k).name) is not None}
    assert named and all(clean[k] == v for k, v in named.items())  # whole, or not there
    assert not any(k.endswith("offload.json") for k in partial)  # nothing registered

    summary = run_offload(spark, str(reference_store), str(tier), config=_config(),
                          progress=False, partition_bytes=PARTITION)
    assert not summary["noop"] and summary["files_written"] < summary["tier_files"]
    done = _tier_files(tier)
    leftovers = sorted(set(done) - set(clean))
    assert all(".tmp" in k for k in leftovers)  # a write the kill cut short, never read
    assert {k: v for k, v in done.items() if k not in leftovers} == clean


def test_offload_to_s3_is_served_from_s3(spark, reference_store, expected, tmp_path):
    server = S3Server().start()
    try:
        fs = server.filesystem()
        bucket = server.new_bucket(fs)
        url = f"s3://{bucket}/history"
        summary = run_offload(spark, str(reference_store), url, config=_config(),
                              s3_endpoint=server.endpoint, progress=False,
                              partition_bytes=4 * 1024 * 1024)
        assert summary["messages"] == REFERENCE_MESSAGES
        assert fs.exists(f"{bucket}/history/{summary_prefix()}/broker-a/config/offload.json")
        store, tier_store = _open_on_tier(
            tmp_path, tiered_backend_service_provider="s3", tiered_store_file_path=url,
            tiered_store_s3_endpoint=server.endpoint)
        try:
            _serves_every_message(store, expected)
        finally:
            store.close()
            tier_store.close()
    finally:
        server.stop()


def summary_prefix() -> str:
    from stratamq.tiered.naming import cluster_dir

    return cluster_dir("DefaultCluster")


def test_a_broker_on_an_empty_store_serves_the_offloaded_history(offloaded, expected,
                                                                  tmp_path):
    """A real broker process, configured with the tier and nothing else: the official client
    (a new group) receives a topic's whole history, PullMessage returns the same records byte
    for byte, and key lookups find messages. (Tier retention is off: the reference's messages
    are older than tieredStoreFileReservedTime, and the tier's retention applies to offloaded
    history as to any.)"""
    from broker_proc import start_broker
    from rocketmq import FilterExpression, SimpleConsumer
    from test_broker_harness import config, receive_until
    from test_tier_broker import cli, json_lines, pull_records

    tier, _ = offloaded
    settings = {**SETTINGS, "tieredBackendServiceProvider": "posix",
                "tieredStoreFilePath": str(tier), "tieredStoreDeleteFileEnable": "false"}
    broker = start_broker(tmp_path, settings)
    try:
        consumer = SimpleConsumer(config(broker.endpoint), "OffloadReader",
                                  {"BenchTopic2": FilterExpression("*")}, await_duration=2)
        consumer.startup()
        try:
            got = receive_until(consumer, REFERENCE_MESSAGES // 4, deadline_s=240)
        finally:
            consumer.shutdown()
        assert sorted(m.body for m in got) == sorted(
            reference_body(i) for i in range(2, REFERENCE_MESSAGES, 4))
        for q in range(4):  # whole records (x-stratamq-pull-format: records), byte for byte
            records = pull_records_of(broker.endpoint, "BenchTopic1", q, pull_records)
            assert [r[1] for r in records] == expected[("BenchTopic1", q)]
    finally:
        assert broker.stop() == 0
    hits = json_lines(cli("store", "query", "--store", str(broker.store), "--config",
                          str(broker.conf), "--topic", "BenchTopic3", "--key", "key-7").stdout)
    assert [h["queue_offset"] for h in hits] == [7 // 16]


def pull_records_of(endpoint: str, topic: str, queue_id: int, pull) -> list:
    import test_tier_broker

    saved, test_tier_broker.TOPIC = test_tier_broker.TOPIC, topic
    try:
        return pull(endpoint, queue_id)
    finally:
        test_tier_broker.TOPIC = saved



def test_export_lands_the_tiers_history_in_parquet_once(spark, offloaded, tmp_path):
    """The export pipeline reads the tier as a stream: every message of the offloaded history
    becomes a row; a second run finds nothing new."""
    import pyarrow.dataset as ds

    from stratamq.spark.export import run_export, source_options

    tier, _ = offloaded
    out = tmp_path / "out"
    source = source_options(None, None, "BenchTopic0,BenchTopic3", 3000, tier=str(tier))
    first = run_export(spark, source, str(out), progress=False)
    assert first["exported"] == REFERENCE_MESSAGES // 2 and first["micro_batches"] >= 4
    again = run_export(spark, source, str(out), progress=False)
    assert again["exported"] == 0
    table = ds.dataset(out, format="parquet", partitioning="hive").to_table(
        columns=["topic", "queue_id", "queue_offset", "body"])
    rows = {(t, q, o): b for t, q, o, b in zip(*(table.column(c).to_pylist() for c in
                                                 ("topic", "queue_id", "queue_offset", "body")))}
    assert len(rows) == REFERENCE_MESSAGES // 2
    for i in range(0, REFERENCE_MESSAGES, 4):
        for t in (0, 3):
            j = i + t
            assert rows[(f"BenchTopic{t}", (j // 4) % 4, j // 16)] == reference_body(j)
