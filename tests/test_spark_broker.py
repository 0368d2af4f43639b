"""The ``stratamq`` Spark source against a running broker subprocess (``endpoints``): batch and
streaming reads through PullMessage, batch and streaming writes through SendMessage."""

from __future__ import annotations

import json

import pytest
from broker_proc import queue_sizes_when_visible, start_broker
from conftest_spark import spark_session  # noqa: F401  (the shared `spark` fixture)

COLUMNS = ("topic", "queue_id", "queue_offset", "commitlog_offset", "msg_id", "tags", "keys",
           "properties", "body", "born_timestamp", "store_timestamp", "born_host", "store_host",
           "reconsume_times", "sys_flag")


def rows_of(df) -> list[tuple]:
    out = []
    for r in df.collect():
        out.append(tuple(sorted(r[c].items()) if c == "properties" else r[c] for c in COLUMNS))
    return sorted(out, key=lambda t: (t[0], t[1], t[2]))


def frame(spark, start: int, count: int, topic: str = "Orders"):
    data = [(f"{topic}-{i}".encode() * (1 + i % 5) + bytes([i % 256, 0, 255]), topic,
             f"tag{i % 3}", f"key-{i}", {"n": str(i), "src": "spark"})
            for i in range(start, start + count)]
    return spark.createDataFrame(data, "body BINARY, topic STRING, tags STRING, keys STRING, "
                                       "properties MAP<STRING, STRING>")


@pytest.fixture
def broker(tmp_path):
    proc = start_broker(tmp_path, topics=[("Orders", 3, "NORMAL"), ("Audit", 2, "NORMAL")])
    yield proc
    proc.stop()


def read_broker(spark, endpoint: str, **options: str):
    reader = spark.read.format("stratamq").option("endpoints", endpoint)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def test_broker_read_equals_directory_read(spark, broker):
    """Rows written through the broker, read back through PullMessage while it runs, equal
    (every column, bodies byte for byte) the rows read from its directory once it stopped."""
    frame(spark, 0, 150).repartition(2).write.format("stratamq").mode("append").option(
        "endpoints", broker.endpoint).save()
    frame(spark, 0, 20, topic="Audit").write.format("stratamq").mode("append").option(
        "endpoints", broker.endpoint).save()
    queue_sizes_when_visible(spark, broker.endpoint, "Orders", 150)
    queue_sizes_when_visible(spark, broker.endpoint, "Audit", 20)
    remote = rows_of(read_broker(spark, broker.endpoint, minPartitions="4"))
    assert len(remote) == 170
    assert sorted(r[8] for r in remote if r[0] == "Orders") == sorted(
        r.body for r in frame(spark, 0, 150).collect())
    assert {r[0] for r in remote} == {"Orders", "Audit"}
    assert broker.stop() == 0  # graceful: flushed, checkpoint written
    local = rows_of(spark.read.format("stratamq").load(str(broker.store)))
    assert remote == local
    one = next(r for r in remote if r[0] == "Orders" and r[8].startswith(b"Orders-7O"))
    assert (one[5], one[6], dict(one[7])["n"], dict(one[7])["src"]) == ("tag1", "key-7", "7",
                                                                         "spark")


def test_broker_read_offsets_and_topics(spark, broker):
    frame(spark, 0, 60).write.format("stratamq").mode("append").option(
        "endpoints", broker.endpoint).save()
    # The broker spreads sends over queues as it likes.
    sizes = queue_sizes_when_visible(spark, broker.endpoint, "Orders", 60)
    assert sum(sizes.values()) == 60
    df = read_broker(spark, broker.endpoint, topics="Orders",
                     startingOffsets=json.dumps({"Orders": {"0": 5, "1": -2}}),
                     endingOffsets=json.dumps({"Orders": {"0": 15, "2": 3}}))
    got = {}
    for r in df.select("queue_id", "queue_offset").collect():
        got.setdefault(r.queue_id, []).append(r.queue_offset)
    want = {0: list(range(5, min(15, sizes.get(0, 0)))), 1: list(range(sizes.get(1, 0))),
            2: list(range(min(3, sizes.get(2, 0))))}
    assert {q: sorted(v) for q, v in got.items()} == {q: v for q, v in want.items() if v}


@pytest.mark.parametrize(("option", "value", "named"), [
    ("topics", "NoSuchTopic", "topics"),
    ("startingOffsets", "{oops", "startingOffsets"),
    ("endpoints", "no-port-here", "endpoints"),
])
def test_bad_broker_options_fail_at_planning(spark, broker, option, value, named):
    reader = spark.read.format("stratamq").option("endpoints", broker.endpoint)
    with pytest.raises(Exception, match=named):
        reader.option(option, value).load()


def test_unreachable_broker_is_named(spark, tmp_path):
    from broker_proc import free_port

    with pytest.raises(Exception, match="endpoints"):
        spark.read.format("stratamq").option("endpoints", f"127.0.0.1:{free_port()}").load()


def test_streaming_read_and_write_through_the_broker(spark, broker, tmp_path):
    """availableNow from the broker twice (more messages in between): every message once; the
    second query writes what it reads back to the broker with writeStream."""
    endpoint = broker.endpoint
    frame(spark, 0, 40).write.format("stratamq").mode("append").option("endpoints",
                                                                        endpoint).save()
    queue_sizes_when_visible(spark, endpoint, "Orders", 40)
    out, ckpt = str(tmp_path / "out"), str(tmp_path / "ckpt")

    def run() -> None:
        query = (spark.readStream.format("stratamq").option("endpoints", endpoint)
                 .option("topics", "Orders").option("startingOffsets", "earliest")
                 .option("maxOffsetsPerTrigger", "25").load()
                 .writeStream.format("parquet").option("path", out)
                 .option("checkpointLocation", ckpt).trigger(availableNow=True).start())
        query.awaitTermination()
        assert query.exception() is None

    run()
    assert spark.read.parquet(out).count() == 40
    frame(spark, 40, 23).write.format("stratamq").mode("append").option("endpoints",
                                                                         endpoint).save()
    queue_sizes_when_visible(spark, endpoint, "Orders", 63)
    run()
    rows = spark.read.parquet(out).select("queue_id", "queue_offset", "body").collect()
    assert len({(r.queue_id, r.queue_offset) for r in rows}) == len(rows) == 63
    assert sorted(r.body for r in rows) == sorted(r.body for r in frame(spark, 0, 63).collect())

    query = (spark.readStream.format("stratamq").option("endpoints", endpoint)
             .option("topics", "Orders").option("startingOffsets", "earliest").load()
             .select("body", "keys").writeStream.format("stratamq")
             .option("endpoints", endpoint).option("topic", "Audit")
             .option("checkpointLocation", str(tmp_path / "ck2")).trigger(availableNow=True)
             .start())
    query.awaitTermination()
    assert query.exception() is None
    queue_sizes_when_visible(spark, endpoint, "Audit", 63)
    audit = read_broker(spark, endpoint, topics="Audit").select("body", "keys").collect()
    assert sorted((r.body, r.keys) for r in audit) == sorted(
        (r.body, r.keys) for r in frame(spark, 0, 63).collect())


def test_write_to_broker_refusal_is_reported(spark, broker):
    with pytest.raises(Exception, match="NoSuchTopic"):
        frame(spark, 0, 3, topic="NoSuchTopic").write.format("stratamq").mode("append").option(
            "endpoints", broker.endpoint).save()
