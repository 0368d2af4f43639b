"""The ``stratamq`` Spark data source and the export pipeline, on a real local[2] Spark."""

from __future__ import annotations

import json
import time

import pytest
from conftest import REFERENCE_MESSAGES, reference_body
from conftest_spark import spark_session  # noqa: F401  (the shared `spark` fixture)

from stratamq.config import StoreConfig
from stratamq.message import Message
from stratamq.spark import planning
from stratamq.spark.reading import read_log_split
from stratamq.store.message_store import MessageStore


def expected_position(i: int) -> tuple[str, int, int]:
    """(topic, queue id, queue offset) of reference message i (tests/test_reference_store.py)."""
    return f"BenchTopic{i % 4}", (i // 4) % 4, i // 16


def put(config: StoreConfig, messages: list[Message]) -> None:
    with MessageStore(config).open() as store:
        assert store.put_messages(messages).ok
        store.wait_dispatched()


def small(root, **extra) -> StoreConfig:
    return StoreConfig(store_path_root_dir=str(root), mapped_file_size_commit_log=16 * 1024,
                       mapped_file_size_consume_queue=50 * 20, **extra)


def messages(topic: str, start: int, count: int, queues: int = 2) -> list[Message]:
    return [Message(topic, b"%s-%d" % (topic.encode(), i) * 7, i % queues,
                    {"TAGS": f"t{i % 3}", "KEYS": f"k{i}"}) for i in range(start, start + count)]


# -- batch reads of the RocketMQ reference store ------------------------------------------------


def test_batch_read_of_reference_store_is_exact_and_byte_identical(spark, reference_store):
    rows = (spark.read.format("stratamq").load(str(reference_store))
            .select("topic", "queue_id", "queue_offset", "body", "keys", "tags", "msg_id",
                    "commitlog_offset", "store_host", "born_host", "properties").collect())
    assert len(rows) == REFERENCE_MESSAGES
    by_position = {(r.topic, r.queue_id, r.queue_offset): r for r in rows}
    assert len(by_position) == REFERENCE_MESSAGES
    for i in range(REFERENCE_MESSAGES):
        row = by_position[expected_position(i)]
        assert row.body == reference_body(i)
        assert row.keys == f"key-{i}" and row.tags == "TagA"
        assert row.properties["CLUSTER"] == "DefaultCluster"
        assert row.store_host == "127.0.0.1:10911" and row.born_host == "127.0.0.1:50000"
    first = by_position[("BenchTopic0", 0, 0)]
    assert first.commitlog_offset == 0 and first.msg_id == "7F00000100002A9F0000000000000000"


@pytest.mark.parametrize("min_partitions", [1, 3, 50, 331])
def test_any_number_of_splits_covers_every_record_once(spark, reference_store, min_partitions):
    df = (spark.read.format("stratamq").option("minPartitions", str(min_partitions))
          .load(str(reference_store)))
    assert df.rdd.getNumPartitions() >= min(min_partitions, 24)
    stats = df.selectExpr("count(*) AS n", "count(DISTINCT commitlog_offset) AS d").first()
    assert (stats.n, stats.d) == (REFERENCE_MESSAGES, REFERENCE_MESSAGES)


def test_splits_starting_mid_record_resync_without_spark(reference_store):
    """Cut the CommitLog at awkward byte boundaries (mid-header, mid-body, inside the blank
    record): every record is read exactly once, by the split it starts in."""
    root = str(reference_store)
    catalog = planning.Catalog.load(root)
    low, end = planning.commitlog_bounds(root)
    whole = [o for s in planning.log_splits(root, catalog, low, end, 1)
             for b in read_log_split(s) for o in b.column("commitlog_offset").to_pylist()]
    assert len(whole) == REFERENCE_MESSAGES
    for parts in (97, 1000, 7919):  # piece sizes that fall anywhere inside records
        got = [o for s in planning.log_splits(root, catalog, low, end, parts)
               for b in read_log_split(s) for o in b.column("commitlog_offset").to_pylist()]
        assert sorted(got) == sorted(whole), parts


def test_topic_list_and_pattern(spark, reference_store):
    path = str(reference_store)
    listed = spark.read.format("stratamq").option("topics", "BenchTopic1, BenchTopic3").load(path)
    assert sorted(r.topic for r in listed.groupBy("topic").count().collect()) == [
        "BenchTopic1", "BenchTopic3"]
    assert listed.count() == REFERENCE_MESSAGES // 2
    pattern = spark.read.format("stratamq").option("topics", "Bench.*[02]").load(path)
    counts = {r.topic: r["count"] for r in pattern.groupBy("topic").count().collect()}
    assert counts == {"BenchTopic0": 5000, "BenchTopic2": 5000}
    row = pattern.where("topic = 'BenchTopic2' AND queue_id = 1 AND queue_offset = 7").first()
    i = next(i for i in range(REFERENCE_MESSAGES) if expected_position(i) == ("BenchTopic2", 1, 7))
    assert row.body == reference_body(i)


def test_starting_and_ending_offsets(spark, reference_store):
    df = (spark.read.format("stratamq").option("topics", "BenchTopic0")
          .option("startingOffsets", json.dumps({"BenchTopic0": {"0": 10, "1": -2, "2": 1200}}))
          .option("endingOffsets", json.dumps({"BenchTopic0": {"0": 20, "3": 5}}))
          .load(str(reference_store)))
    counts = {r.queue_id: (r.n, r.lo, r.hi) for r in df.groupBy("queue_id").agg(
        {"*": "count", "queue_offset": "min"}).withColumnRenamed("count(1)", "n")
        .withColumnRenamed("min(queue_offset)", "lo")
        .join(df.groupBy("queue_id").agg({"queue_offset": "max"})
              .withColumnRenamed("max(queue_offset)", "hi"), "queue_id").collect()}
    assert counts == {0: (10, 10, 19), 1: (1250, 0, 1249), 2: (50, 1200, 1249), 3: (5, 0, 4)}


@pytest.mark.parametrize(("option", "value", "named"), [
    ("topics", "NoSuchTopic", "topics"),
    ("startingOffsets", "{not json", "startingOffsets"),
    ("endingOffsets", '{"BenchTopic0": {"0": "x"}}', "endingOffsets"),
    ("minPartitions", "zero", "minPartitions"),
    ("endpoints", "127.0.0.1:8081", "endpoints"),  # a path and endpoints at once
])
def test_bad_options_fail_at_planning_naming_the_option(spark, reference_store, option, value,
                                                        named):
    with pytest.raises(Exception, match=named):
        spark.read.format("stratamq").option(option, value).load(str(reference_store))


def test_missing_path_is_named(spark, tmp_path):
    with pytest.raises(Exception, match="'path'"):
        spark.read.format("stratamq").load()
    with pytest.raises(Exception, match="'path'"):
        spark.read.format("stratamq").load(str(tmp_path / "nothing-here"))


def test_starting_timestamp_is_resolved_through_the_index(spark, tmp_path):
    config = small(tmp_path / "store")
    put(config, messages("Orders", 0, 30))
    stored_by = int(time.time() * 1000)  # no store time of the first batch is later
    while (cut := int(time.time() * 1000)) <= stored_by:
        time.sleep(0.001)  # until the clock passes it: cut is after every first-batch time
    put(config, messages("Orders", 30, 17))  # stored at or after cut (store times never fall)
    df = (spark.read.format("stratamq").option("startingTimestamp", str(cut))
          .load(config.store_path_root_dir))
    rows = df.select("body", "queue_offset", "store_timestamp").collect()
    assert sorted(r.body for r in rows) == sorted(m.body for m in messages("Orders", 30, 17))
    assert min(r.queue_offset for r in rows) == 15  # 30 messages over 2 queues came before
    later = str(cut + 3_600_000)
    assert spark.read.format("stratamq").option("startingTimestamp", later).load(
        config.store_path_root_dir).count() == 0


# -- streaming ----------------------------------------------------------------------------------


def _stream_once(spark, path: str, out: str, checkpoint: str, **options: str) -> None:
    reader = spark.readStream.format("stratamq").option("startingOffsets", "earliest")
    for key, value in options.items():
        reader = reader.option(key, value)
    query = (reader.load(path).writeStream.format("parquet").option("path", out)
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    query.awaitTermination()
    assert query.exception() is None


def test_streaming_available_now_resumes_from_checkpoint(spark, tmp_path):
    config = small(tmp_path / "store")
    put(config, messages("Orders", 0, 120) + messages("Audit", 0, 30, queues=1))
    out, ckpt = str(tmp_path / "out"), str(tmp_path / "ckpt")
    _stream_once(spark, config.store_path_root_dir, out, ckpt, topics="Orders",
                 maxOffsetsPerTrigger="50")
    first = spark.read.parquet(out)
    assert first.count() == 120 and first.select("topic").distinct().count() == 1
    put(config, messages("Orders", 120, 41))
    _stream_once(spark, config.store_path_root_dir, out, ckpt, topics="Orders",
                 maxOffsetsPerTrigger="50")
    rows = spark.read.parquet(out).select("queue_id", "queue_offset", "body").collect()
    assert len(rows) == 161
    assert len({(r.queue_id, r.queue_offset) for r in rows}) == 161
    assert sorted(r.body for r in rows) == sorted(m.body for m in messages("Orders", 0, 161))


def test_streaming_processing_time_trigger_follows_new_messages(spark, tmp_path):
    # A long-running query (not availableNow) picks up what a writer appends while it runs.
    config = small(tmp_path / "store")
    put(config, messages("Orders", 0, 20))
    query = (spark.readStream.format("stratamq").option("topics", "Orders")
             .option("startingOffsets", "earliest").load(config.store_path_root_dir)
             .writeStream.format("memory").queryName("orders_live")
             .trigger(processingTime="300 milliseconds").start())
    try:
        for total in (20, 45, 70):
            if total > 20:
                put(config, messages("Orders", total - 25, 25))
            deadline = time.monotonic() + 60
            while (spark.sql("SELECT count(*) FROM orders_live").first()[0] < total
                   and time.monotonic() < deadline):
                assert query.exception() is None
                time.sleep(0.2)
            rows = spark.sql("SELECT queue_id, queue_offset, body FROM orders_live").collect()
            assert len({(r.queue_id, r.queue_offset) for r in rows}) == len(rows) == total
        assert sorted(r.body for r in rows) == sorted(m.body for m in messages("Orders", 0, 70))
    finally:
        query.stop()


def _data_lost_after_first_run(spark, tmp_path) -> tuple[StoreConfig, str, str, int]:
    """A first streaming run reads 100 messages; then 500 more arrive and a forced clean-up
    deletes the oldest CommitLog (and ConsumeQueue) files, unread messages among them."""
    config = small(tmp_path / "store")
    put(config, messages("Orders", 0, 100))
    out, ckpt = str(tmp_path / "out"), str(tmp_path / "ckpt")
    _stream_once(spark, config.store_path_root_dir, out, ckpt, topics="Orders")
    assert spark.read.parquet(out).count() == 100
    put(config, messages("Orders", 100, 500))
    with MessageStore(config).open() as store:
        read_upto = 50  # per queue: what the first run read
        for _ in range(20):
            store.cleanup.run_once(force=True, manual=True)
            if min(store.get_min_offset_in_queue("Orders", q) for q in (0, 1)) > read_upto:
                break
        low = min(store.get_min_offset_in_queue("Orders", q) for q in (0, 1))
    assert low > read_upto, "the clean-up did not delete unread messages"
    return config, out, ckpt, low


def test_fail_on_data_loss_true_fails_naming_the_lost_offsets(spark, tmp_path):
    config, out, ckpt, _low = _data_lost_after_first_run(spark, tmp_path)
    with pytest.raises(Exception, match=r"Orders/[01]: offsets \[50, \d+\) were deleted"):
        _stream_once(spark, config.store_path_root_dir, out, ckpt, topics="Orders")
    assert spark.read.parquet(out).count() == 100  # nothing written by the failed run


def test_fail_on_data_loss_false_continues_from_the_new_minimum(spark, tmp_path):
    config, out, ckpt, _low = _data_lost_after_first_run(spark, tmp_path)
    _stream_once(spark, config.store_path_root_dir, out, ckpt, topics="Orders",
                 failOnDataLoss="false")
    with MessageStore(config, read_only=True).open() as store:
        mins = {q: store.get_min_offset_in_queue("Orders", q) for q in (0, 1)}
    rows = spark.read.parquet(out).select("queue_id", "queue_offset").collect()
    assert len({(r.queue_id, r.queue_offset) for r in rows}) == len(rows)
    second = sorted((r.queue_id, r.queue_offset) for r in rows if r.queue_offset >= 50)
    assert second == sorted((q, o) for q in (0, 1) for o in range(mins[q], 300))


# -- writes -------------------------------------------------------------------------------------


def test_write_then_read_round_trip(spark, tmp_path):
    path = str(tmp_path / "written")
    data = [(f"body-{i}".encode(), "Events" if i % 2 else "Clicks", f"tag{i % 3}", f"key-{i}",
             {"src": "spark", "n": str(i)}) for i in range(300)]
    df = spark.createDataFrame(data, "body BINARY, topic STRING, tags STRING, keys STRING, "
                                     "properties MAP<STRING, STRING>").repartition(3)
    (df.write.format("stratamq").mode("append").option("mappedFileSizeCommitLog", "65536")
     .save(path))
    back = spark.read.format("stratamq").load(path).collect()
    assert len(back) == 300
    got = sorted((r.body, r.topic, r.tags, r.keys, r.properties["src"], r.properties["n"])
                 for r in back)
    assert got == sorted((b, t, tg, k, p["src"], p["n"]) for b, t, tg, k, p in data)
    by_queue = {}
    for r in back:
        by_queue.setdefault((r.topic, r.queue_id), []).append(r.queue_offset)
    for offsets in by_queue.values():  # every queue numbered 0..n-1, no gaps, no repeats
        assert sorted(offsets) == list(range(len(offsets)))
    with pytest.raises(Exception, match="'topic'"):
        spark.createDataFrame([(b"x",)], "body BINARY").write.format("stratamq").mode(
            "append").save(path)


def test_streaming_write_appends_each_micro_batch(spark, tmp_path):
    source = small(tmp_path / "source")
    put(source, messages("In", 0, 40))
    target = str(tmp_path / "target")
    query = (spark.readStream.format("stratamq").option("startingOffsets", "earliest")
             .load(source.store_path_root_dir).select("body", "tags")
             .writeStream.format("stratamq").option("topic", "Out")
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True)
             .start(target))
    query.awaitTermination()
    back = spark.read.format("stratamq").option("topics", "Out").load(target).collect()
    assert sorted(r.body for r in back) == sorted(m.body for m in messages("In", 0, 40))


# -- export -------------------------------------------------------------------------------------


def test_export_twice_exports_each_message_once(spark, tmp_path):
    from stratamq.spark.export import planned_rows, run_export

    config = small(tmp_path / "store")
    put(config, messages("Orders", 0, 60) + messages("Refunds", 0, 9))
    out = str(tmp_path / "export")
    source = {"path": config.store_path_root_dir}
    checkpoint = str(tmp_path / "export" / "_checkpoint")
    assert planned_rows(source, checkpoint) == 69  # the progress total, known up front
    first = run_export(spark, source, out, progress=False)
    assert first["exported"] == 69
    put(config, messages("Orders", 60, 15))
    assert planned_rows(source, checkpoint) == 15  # from where the checkpoint ended
    second = run_export(spark, source, out, progress=False)
    assert second["exported"] == 15
    third = run_export(spark, source, out, progress=False)
    assert third["exported"] == 0
    exported = spark.read.parquet(out)
    assert exported.count() == 84
    assert exported.select("topic", "queue_id", "queue_offset").distinct().count() == 84
    dirs = sorted(p.name for p in (tmp_path / "export").iterdir() if p.name.startswith("topic="))
    assert dirs == ["topic=Orders", "topic=Refunds"]
    assert all(p.name.startswith("date=") for p in (tmp_path / "export" / "topic=Orders").iterdir())


def test_export_from_a_running_broker_with_endpoints(spark, tmp_path):
    """``--endpoints``: the export reads the broker over gRPC; a second run adds only what is
    new."""
    from broker_proc import queue_sizes_when_visible, start_broker

    from stratamq.spark.export import run_export, source_options

    broker = start_broker(tmp_path, topics=[("Orders", 2, "NORMAL"), ("Other", 1, "NORMAL")])
    try:
        def send(start: int, count: int) -> None:
            data = [(f"order-{i}".encode(), "Orders") for i in range(start, start + count)]
            (spark.createDataFrame(data, "body BINARY, topic STRING").write.format("stratamq")
             .mode("append").option("endpoints", broker.endpoint).save())

        send(0, 25)
        queue_sizes_when_visible(spark, broker.endpoint, "Orders", 25)
        source = source_options(None, broker.endpoint, "Orders")
        out = str(tmp_path / "export")
        assert run_export(spark, source, out, progress=False)["exported"] == 25
        send(25, 6)
        queue_sizes_when_visible(spark, broker.endpoint, "Orders", 31)
        assert run_export(spark, source, out, progress=False)["exported"] == 6
        bodies = sorted(r.body for r in spark.read.parquet(out).collect())
        assert bodies == sorted(f"order-{i}".encode() for i in range(31))
    finally:
        broker.stop()
