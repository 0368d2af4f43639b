"""The ``stratamq`` Spark source refusing what it cannot honour, when the DataFrame or the writer
is made, naming the option or column: write column types, write paths, batch offsets that name
missing queues or cannot be read, and the hints for unknown topics. Real local[2] Spark, real
stores, a real broker subprocess."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from broker_proc import queue_sizes_when_visible, start_broker
from conftest_spark import spark_session  # noqa: F401  (the shared `spark` fixture)
from test_spark import messages, put, small


def write(df, path: Path | None = None, **options: str) -> None:
    writer = df.write.format("stratamq").mode("append")
    for key, value in options.items():
        writer = writer.option(key, value)
    writer.save(str(path)) if path is not None else writer.save()


def read(spark, path: Path | str | None = None, **options: str):
    reader = spark.read.format("stratamq")
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load(str(path)) if path is not None else reader.load()


def store_with_a(tmp_path: Path) -> Path:
    """Topic A, queues 0 and 1 with 250 messages each (offsets 0..249)."""
    config = small(tmp_path / "store")
    put(config, messages("A", 0, 500))
    return Path(config.store_path_root_dir)


# -- write: column types ------------------------------------------------------------------------


@pytest.mark.parametrize(("ddl", "value", "column", "accepted"), [
    ("body INT", 5, "'body' is INT", "BINARY or STRING"),
    ("body ARRAY<INT>", [1, 2], "'body' is ARRAY<INT>", "BINARY or STRING"),
    ("topic BINARY", b"T", "'topic' is BINARY", "STRING"),
    ("tags INT", 7, "'tags' is INT", "STRING"),
    ("keys ARRAY<INT>", [1], "'keys' is ARRAY<INT>", "STRING or ARRAY<STRING>"),
    ("properties STRING", "a=1", "'properties' is STRING", "MAP<STRING,STRING>"),
    ("properties MAP<STRING,INT>", {"a": 1}, "'properties' is MAP<STRING,INT>",
     "MAP<STRING,STRING>"),
    ("queue_id STRING", "1", "'queue_id' is STRING", "TINYINT, SMALLINT, INT or BIGINT"),
])
def test_a_column_of_the_wrong_type_is_refused_before_anything_is_written(
        spark, tmp_path, ddl, value, column, accepted):
    name = ddl.split()[0]
    if name == "body":
        df = spark.createDataFrame([(value,)], ddl).selectExpr("*", "'T' AS topic")
    else:
        df = spark.createDataFrame([(b"x", value)], f"body BINARY, {ddl}")
    target = tmp_path / "new-store"
    with pytest.raises(Exception, match="column " + column) as refused:
        write(df, target, topic="T")
    assert accepted in str(refused.value)
    assert not target.exists()


def test_a_refused_write_leaves_an_existing_store_as_it_was(spark, tmp_path):
    root = store_with_a(tmp_path)
    before = sorted(p.name for p in (root / "commitlog").iterdir())
    with pytest.raises(Exception, match="column 'tags' is INT"):
        write(spark.createDataFrame([(b"x", "A", 7)], "body BINARY, topic STRING, tags INT"),
              root)
    assert read(spark, root).count() == 500
    assert sorted(p.name for p in (root / "commitlog").iterdir()) == before


def test_a_column_in_another_case_or_a_bad_topic_option_is_refused(spark, tmp_path):
    df = spark.createDataFrame([(b"x", "T", "t1")], "body BINARY, topic STRING, Tags STRING")
    with pytest.raises(Exception, match="column 'Tags' is not read: the writer reads 'tags'"):
        write(df, tmp_path / "s")
    with pytest.raises(Exception, match="no 'body' column"):
        write(spark.createDataFrame([(b"x", "T")], "Body BINARY, topic STRING"), tmp_path / "s")
    with pytest.raises(Exception, match="option 'topic': topic 'a/b' contains '/'"):
        write(spark.createDataFrame([(b"x",)], "body BINARY"), tmp_path / "s", topic="a/b")
    assert not (tmp_path / "s").exists()


def test_null_property_values_are_dropped_and_accepted_types_round_trip(spark, tmp_path):
    """A null map value is left out (never the text "None"); ARRAY<STRING> keys drop their
    nulls; a NULL-typed column (lit(None)) is a column of nulls; STRING bodies are UTF-8."""
    df = spark.createDataFrame(
        [("héllo", "P", {"a": None, "b": "x"}, ["k1", None, "k2"], 1)],
        "body STRING, topic STRING, properties MAP<STRING,STRING>, keys ARRAY<STRING>, "
        "queue_id SMALLINT").selectExpr("*", "NULL AS tags")
    write(df, tmp_path / "s")
    (row,) = read(spark, tmp_path / "s", topics="P").collect()
    assert (row.body, row.keys, row.tags, row.queue_id) == ("héllo".encode(), "k1 k2", None, 1)
    assert row.properties["b"] == "x"
    assert "a" not in row.properties and "None" not in row.properties.values()


def test_a_streaming_write_with_a_wrong_column_type_is_refused_at_start(spark, tmp_path):
    source = small(tmp_path / "source")
    put(source, messages("In", 0, 5))
    stream = (spark.readStream.format("stratamq").option("startingOffsets", "earliest")
              .load(source.store_path_root_dir).selectExpr("body", "queue_offset AS tags"))
    with pytest.raises(Exception, match="column 'tags' is BIGINT"):
        (stream.writeStream.format("stratamq").option("topic", "Out")
         .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True)
         .start(str(tmp_path / "target")).awaitTermination())
    assert not (tmp_path / "target").exists()


# -- write: the path ----------------------------------------------------------------------------


def test_a_path_that_is_a_file_is_refused_naming_path(spark, tmp_path):
    df = spark.createDataFrame([(b"x", "T")], "body BINARY, topic STRING")
    afile = tmp_path / "afile"
    afile.write_text("mine")
    with pytest.raises(Exception, match="option 'path': .*afile is a file"):
        write(df, afile)
    with pytest.raises(Exception, match="option 'path': .*afile is a file"):
        write(df, afile / "store")
    assert afile.read_text() == "mine"


def test_a_non_empty_directory_that_is_not_a_store_is_refused(spark, tmp_path):
    df = spark.createDataFrame([(b"x", "T")], "body BINARY, topic STRING")
    other = tmp_path / "other"
    other.mkdir()
    (other / "readme.txt").write_text("mine")
    with pytest.raises(Exception, match=r"option 'path': .*other is not a store directory "
                                        r"\(no commitlog/\) and not empty \(readme.txt\)"):
        write(df, other)
    assert sorted(p.name for p in other.iterdir()) == ["readme.txt"]
    empty = tmp_path / "empty"
    empty.mkdir()
    write(df, empty)  # an empty directory becomes a store
    assert [r.body for r in read(spark, empty, topics="T").collect()] == [b"x"]


# -- batch reads: offsets that cannot be honoured -----------------------------------------------


@pytest.mark.parametrize(("options", "named"), [
    ({"startingOffsets": {"A": {"0": 100}}, "endingOffsets": {"A": {"0": 50}}},
     r"option 'endingOffsets': A/0: the starting offset 100 \(option 'startingOffsets'\) is "
     r"after the ending offset 50"),
    ({"startingOffsets": {"A": {"0": 10000}}},
     r"option 'startingOffsets': A/0: offset 10000 is after the end of the queue \(250"),
    ({"startingOffsets": {"A": {"7": 0}}},
     r"option 'startingOffsets': topic A has no queue 7; its queues are 0, 1"),
    ({"endingOffsets": {"A": {"0": 5, "7": 5}}},
     r"option 'endingOffsets': topic A has no queue 7"),
    ({"startingOffsets": {"Nope": {"0": 0}}},
     r"option 'startingOffsets': unknown topic\(s\) Nope; the topics are A"),
])
def test_batch_offsets_that_cannot_be_honoured_are_refused(spark, tmp_path, options, named):
    root = store_with_a(tmp_path)
    with pytest.raises(Exception, match=named):
        read(spark, root, **{k: json.dumps(v) for k, v in options.items()}).count()


def test_offsets_at_or_past_the_end_that_can_be_honoured_still_read(spark, tmp_path):
    root = store_with_a(tmp_path)
    at_end = read(spark, root, startingOffsets=json.dumps({"A": {"0": 250, "1": 240}}))
    assert sorted(r.queue_offset for r in at_end.collect()) == list(range(240, 250))
    # An end past a queue's end is clamped to it (as spark-sql-kafka's "latest").
    past = read(spark, root, endingOffsets=json.dumps({"A": {"0": 100000, "1": -1}}))
    assert past.count() == 500
    # Start equal to the end: an empty range, not an error.
    assert read(spark, root, startingOffsets=json.dumps({"A": {"0": 30}}),
                endingOffsets=json.dumps({"A": {"0": 30, "1": 0}})).count() == 0


def test_a_streaming_read_names_a_missing_queue_at_load(spark, tmp_path):
    root = store_with_a(tmp_path)
    with pytest.raises(Exception, match="option 'startingOffsets': topic A has no queue 3"):
        (spark.readStream.format("stratamq")
         .option("startingOffsets", json.dumps({"A": {"0": 0, "3": 0}})).load(str(root)))


# -- hints for unknown topics -------------------------------------------------------------------


def test_a_pipe_in_topics_is_a_topic_name_and_the_error_says_how_to_write_a_regex(spark,
                                                                                   tmp_path):
    config = small(tmp_path / "store")
    put(config, messages("A", 0, 10) + messages("B", 0, 4))
    root = config.store_path_root_dir
    with pytest.raises(Exception, match=r"unknown topic\(s\) A\|B.*'\(A\|B\)' or 'A\|B\$'"):
        read(spark, root, topics="A|B")
    assert read(spark, root, topics="(A|B)").count() == 14


def test_a_store_without_consume_queues_points_to_store_verify(spark, tmp_path):
    root = store_with_a(tmp_path)
    shutil.rmtree(root / "consumequeue")
    with pytest.raises(Exception, match="CommitLog records but no ConsumeQueues.*"
                                        "stratamq store verify"):
        read(spark, root, topics="A")
    with pytest.raises(Exception, match="unknown topic.*stratamq store verify"):
        read(spark, root, startingOffsets=json.dumps({"A": {"0": 0}}))
    assert read(spark, root).count() == 500  # the whole-store read needs no ConsumeQueue


# -- the same through a running broker ----------------------------------------------------------


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    proc = start_broker(tmp_path_factory.mktemp("broker"),
                        topics=[("Orders", 3, "NORMAL"), ("Empty", 2, "NORMAL")])
    yield proc
    proc.stop()


def test_broker_write_refuses_wrong_types_and_drops_null_properties(spark, broker):
    good = spark.createDataFrame([(b"one", {"a": None, "b": "x"}, ["k1", None])],
                                 "body BINARY, properties MAP<STRING,STRING>, keys ARRAY<STRING>")
    write(good, endpoints=broker.endpoint, topic="Orders")
    queue_sizes_when_visible(spark, broker.endpoint, "Orders", 1)
    with pytest.raises(Exception, match="column 'body' is INT; the writer takes body as BINARY"):
        write(spark.createDataFrame([(5,)], "body INT"), endpoints=broker.endpoint,
              topic="Orders")
    write(spark.createDataFrame([(b"two",)], "body BINARY"), endpoints=broker.endpoint,
          topic="Orders")
    # Sends are dispatched in order: had the refused write sent its row, it would be counted
    # by the time the later one is.
    assert sum(queue_sizes_when_visible(spark, broker.endpoint, "Orders", 2).values()) == 2
    rows = read(spark, endpoints=broker.endpoint, topics="Orders").collect()
    one = next(r for r in rows if r.body == b"one")
    assert one.properties.get("b") == "x" and "a" not in one.properties
    assert one.keys == "k1"


@pytest.mark.parametrize(("options", "named"), [
    ({"startingOffsets": {"Orders": {"5": 0}}},
     r"option 'startingOffsets': topic Orders has no queue 5; its queues are 0 to 2"),
    ({"topics": "Empty", "startingOffsets": {"Empty": {"0": 10}}},
     r"option 'startingOffsets': Empty/0: offset 10 is after the end of the queue \(0"),
    ({"topics": "Orders|Empty"}, r"'\(Orders\|Empty\)'"),
    ({"topics": "Orders", "startingOffsets": {"Empty": {"0": 0}}},
     r"option 'startingOffsets': topic\(s\) Empty not read: option 'topics' leaves them out"),
])
def test_broker_reads_refuse_offsets_that_cannot_be_honoured(spark, broker, options, named):
    values = {k: v if isinstance(v, str) else json.dumps(v) for k, v in options.items()}
    with pytest.raises(Exception, match=named):
        read(spark, endpoints=broker.endpoint, **values).count()


def test_a_negative_queue_id_is_refused_not_spread_over_the_queues(spark, tmp_path):
    root = store_with_a(tmp_path)
    df = spark.createDataFrame([(b"ok", "A", None), (b"bad", "A", -3)],
                               "body BINARY, topic STRING, queue_id INT")
    with pytest.raises(Exception, match="column 'queue_id': -3 is not a queue id"):
        write(df, root)
    assert b"bad" not in {bytes(r.body) for r in read(spark, root).collect()}


# -- option names ---------------------------------------------------------------------------


def _two_topics(tmp_path: Path) -> Path:
    config = small(tmp_path / "store")
    put(config, messages("A", 0, 40) + messages("B", 0, 10))
    return Path(config.store_path_root_dir)


@pytest.mark.parametrize(("options", "says"), [
    ({"startingOffset": "earliest"}, "unknown read option 'startingoffset': did you mean "
                                     "'startingOffsets'"),
    ({"startingOffsetsByTimestampStrategy": "latest"}, "is spark-sql-kafka's"),
    ({"assign": '{"A": [7]}'}, "option 'assign': no such queue: A/7"),
    ({"assign": '{"A": [0]}', "topics": "A"}, "topics and assign both name topics"),
    ({"kafka.bootstrap.servers": "x:9092"}, "spark-sql-kafka's"),
    ({"topics": "A", "subscribe": "B"}, "topics and subscribe both name topics"),
    ({"subscribe": "A.*"}, "not a comma list of topic names"),
])
def test_unknown_options_fail_at_load_naming_the_option(spark, tmp_path, options, says):
    root = _two_topics(tmp_path)
    with pytest.raises(Exception) as refused:
        read(spark, root, **options)
    assert says in str(refused.value)


def test_subscribe_and_subscribe_pattern_read_as_in_spark_sql_kafka(spark, tmp_path):
    root = _two_topics(tmp_path)
    only = read(spark, root, assign=json.dumps({"A": [1], "B": [0]})).collect()
    assert {(r.topic, r.queue_id) for r in only} == {("A", 1), ("B", 0)}
    assert len(only) == 20 + 5
    assert read(spark, root, subscribe="B").count() == 10
    assert read(spark, root, subscribe="A, B").count() == 50
    assert read(spark, root, subscribePattern="[AB]").count() == 50
    assert read(spark, root, subscribePattern="B").count() == 10
    assert read(spark, root).count() == 50


def test_unknown_write_options_are_refused(spark, tmp_path):
    df = spark.createDataFrame([(b"x",)], "body BINARY")
    with pytest.raises(Exception, match="unknown write option 'topics': did you mean 'topic'"):
        write(df, tmp_path / "s", topics="T")
    assert not (tmp_path / "s").exists()


def test_a_write_to_a_store_a_broker_holds_fails_at_once(spark, tmp_path):
    root = store_with_a(tmp_path)
    broker = start_broker(tmp_path, store=root)
    try:
        df = spark.createDataFrame([(b"x", "A")], "body BINARY, topic STRING")
        with pytest.raises(Exception, match="is locked by another process") as refused:
            write(df, root)
        assert "endpoints" in str(refused.value)
    finally:
        assert broker.stop() == 0
    write(spark.createDataFrame([(b"x", "A")], "body BINARY, topic STRING"), root)
    assert read(spark, root).count() == 501


# -- spark-sql-kafka's shapes ---------------------------------------------------------------


def test_include_headers_and_a_kafka_sink_frame(spark, tmp_path):
    root = tmp_path / "kafka"
    frame = spark.createDataFrame(
        [("K", b"v-1", [("h1", b"one"), ("h2", b"two")], "T")],
        "key STRING, value BINARY, headers ARRAY<STRUCT<key: STRING, value: BINARY>>, "
        "topic STRING")
    write(frame, root)
    [row] = read(spark, root, includeHeaders="true").collect()
    assert row.body == b"v-1" and row.keys == "K"
    headers = {h.key: h.value for h in row.headers}
    assert headers["h1"] == b"one" and headers["h2"] == b"two"
    assert headers["KEYS"] == b"K"  # every property, as Kafka headers are every header
    assert "headers" not in read(spark, root).columns
    both = spark.createDataFrame([(b"a", b"b", "T")], "body BINARY, value BINARY, topic STRING")
    with pytest.raises(Exception, match="both 'body' and 'value'"):
        write(both, root)


def _store_time_boundary(tmp_path: Path) -> tuple[Path, int]:
    """Topic T (one queue): messages 0..9, then a boundary time, then 10..19 stored after it."""
    config = small(tmp_path / "store")
    put(config, messages("T", 0, 10, queues=1))
    boundary = int(time.time() * 1000) + 1
    while int(time.time() * 1000) <= boundary:  # store times are ms: the next ones are later
        pass
    put(config, messages("T", 10, 10, queues=1))
    return Path(config.store_path_root_dir), boundary


def test_offsets_by_timestamp_and_ending_timestamp(spark, tmp_path):
    root, boundary = _store_time_boundary(tmp_path)
    per_queue = json.dumps({"T": {"0": boundary}})
    later = read(spark, root, startingOffsetsByTimestamp=per_queue)
    assert sorted(r.queue_offset for r in later.collect()) == list(range(10, 20))
    earlier = read(spark, root, endingTimestamp=str(boundary))
    assert sorted(r.queue_offset for r in earlier.collect()) == list(range(10))
    assert read(spark, root, endingOffsetsByTimestamp=per_queue).count() == 10
    with pytest.raises(Exception, match="no such queue"):
        read(spark, root, startingOffsetsByTimestamp=json.dumps({"T": {"7": 0}})).count()


def test_min_offsets_per_trigger_waits_for_enough_messages(tmp_path):
    from pyspark.sql.datasource import ReadAllAvailable

    from stratamq.spark.datasource import StreamReader

    config = small(tmp_path / "store")
    put(config, messages("T", 0, 3, queues=1))
    reader = StreamReader({"path": config.store_path_root_dir, "startingOffsets": "earliest",
                           "minOffsetsPerTrigger": "5", "maxTriggerDelay": "10m"})
    start = reader.initialOffset()
    assert reader.latestOffset(start, ReadAllAvailable()) == start  # 3 < 5: no batch yet
    put(config, messages("T", 3, 2, queues=1))
    assert reader.latestOffset(start, ReadAllAvailable()) == {"T": {"0": 5}}
    eager = StreamReader({"path": config.store_path_root_dir, "startingOffsets": "earliest",
                          "minOffsetsPerTrigger": "50", "maxTriggerDelay": "0"})
    assert eager.latestOffset(eager.initialOffset(), ReadAllAvailable()) == {"T": {"0": 5}}
