"""The ``stratamq`` source on a store whose ConsumeQueues live in RocksDB
(``storeType=defaultRocksDB``): topic-filtered, offset-bounded and streaming reads go through
the RocksDB ConsumeQueue, opened read-only beside (or after) the store that writes it."""

from __future__ import annotations

import time

from conftest_spark import spark_session  # noqa: F401  (the shared `spark` fixture)
from pyspark.errors import AnalysisException

from stratamq.config import StoreConfig
from stratamq.message import Message
from stratamq.store.consume_queue_store import STORE_TYPE_ROCKSDB
from stratamq.store.message_store import MessageStore


def rocksdb_config(root, **extra) -> StoreConfig:
    return StoreConfig(store_path_root_dir=str(root), mapped_file_size_commit_log=16 * 1024,
                       store_type=STORE_TYPE_ROCKSDB, **extra)


def messages(topic: str, start: int, count: int, queues: int = 2) -> list[Message]:
    return [Message(topic, b"%s-%d" % (topic.encode(), i), i % queues, {"KEYS": f"k{i}"})
            for i in range(start, start + count)]


def put(config: StoreConfig, batch: list[Message]) -> None:
    with MessageStore(config).open() as store:
        assert store.put_messages(batch).ok
        store.wait_dispatched()


def bodies(df) -> list[bytes]:
    return sorted(bytes(r.body) for r in df.select("body").collect())


def test_topic_filtered_and_offset_bounded_reads(spark, tmp_path):
    config = rocksdb_config(tmp_path / "store")
    put(config, messages("Orders", 0, 40) + messages("Audit", 0, 7, queues=1))
    assert not (tmp_path / "store" / "consumequeue").exists()  # no ConsumeQueue files at all
    path = config.store_path_root_dir

    def reader():  # a DataFrameReader keeps its options: a fresh one per read
        return spark.read.format("stratamq")

    orders = reader().option("topics", "Orders").load(path)
    assert bodies(orders) == sorted(m.body for m in messages("Orders", 0, 40))
    assert reader().load(path).count() == 47  # the whole-log read is unchanged

    bounded = (reader().option("topics", "Orders")
               .option("startingOffsets", '{"Orders": {"0": 5, "1": -2}}')
               .option("endingOffsets", '{"Orders": {"0": 15, "1": 3}}').load(path))
    got = sorted((r.queue_id, r.queue_offset) for r in bounded.collect())
    assert got == [(0, o) for o in range(5, 15)] + [(1, o) for o in range(3)]


def test_streaming_available_now_resumes_from_checkpoint(spark, tmp_path):
    config = rocksdb_config(tmp_path / "store")
    put(config, messages("Orders", 0, 30))
    out, ckpt = str(tmp_path / "out"), str(tmp_path / "ckpt")

    def run() -> None:
        query = (spark.readStream.format("stratamq").option("topics", "Orders")
                 .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "8")
                 .load(config.store_path_root_dir).writeStream.format("parquet")
                 .option("path", out).option("checkpointLocation", ckpt)
                 .trigger(availableNow=True).start())
        query.awaitTermination()
        assert query.exception() is None

    run()
    assert spark.read.parquet(out).count() == 30
    put(config, messages("Orders", 30, 11))
    run()
    rows = spark.read.parquet(out).select("queue_id", "queue_offset", "body").collect()
    assert len({(r.queue_id, r.queue_offset) for r in rows}) == len(rows) == 41
    assert sorted(bytes(r.body) for r in rows) == sorted(m.body for m in messages("Orders", 0, 41))


def test_read_beside_the_open_store_sees_what_it_has_flushed(spark, tmp_path):
    # The writer keeps the store open; the reader opens RocksDB read-only in other processes
    # (Spark's Python workers). Without a WAL, RocksDB shows a reader what the writer has
    # flushed, which its ConsumeQueue flush service does on every thorough round.
    config = rocksdb_config(tmp_path / "store", flush_consume_queue_thorough_interval=200)
    with MessageStore(config).open() as store:
        assert store.put_messages(messages("Orders", 0, 25)).ok
        store.wait_dispatched()
        deadline = time.monotonic() + 60
        while True:
            try:  # until the flush, the topic is not there yet: an unknown topic
                got = bodies(spark.read.format("stratamq").option("topics", "Orders")
                             .load(config.store_path_root_dir))
            except AnalysisException as exc:
                assert "unknown topic(s) Orders" in str(exc)
                got = []
            if len(got) == 25 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert got == sorted(m.body for m in messages("Orders", 0, 25))
