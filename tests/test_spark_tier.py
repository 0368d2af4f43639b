"""The Spark source reading a tier directly (a POSIX tier directory, or ``s3://`` on a real S3
server on loopback), without a broker or a store: the same rows, column for column, as a read
of the store directory the messages were written to, one split per tier CommitLog file."""

from __future__ import annotations

import pytest
from conftest_spark import spark_session  # noqa: F401  (the shared `spark` fixture)
from s3_server import S3Server
from test_tier_store import TOPIC, fill, open_tiered, tier_config

COLUMNS = ("topic", "queue_id", "queue_offset", "commitlog_offset", "msg_id", "tags", "keys",
           "properties", "body", "born_timestamp", "store_timestamp", "born_host", "store_host",
           "reconsume_times", "sys_flag")


def rows_of(df) -> list[tuple]:
    out = [tuple(sorted(r[c].items()) if c == "properties" else r[c] for c in COLUMNS)
           for r in df.collect()]
    return sorted(out, key=lambda t: (t[0], t[1], t[2]))


@pytest.mark.parametrize("kind", ["posix", "s3"])
def test_tier_read_equals_store_read(kind, spark, tmp_path):
    server = S3Server().start() if kind == "s3" else None
    try:
        cfg = tier_config(tmp_path, kind, server, tiered_store_commit_log_max_size=16 * 1024)
        store, tier = open_tiered(cfg)
        fill(store, 300, queues=3)
        assert tier.flush(60)
        files = sum(len(f.commit_log.segments) for f in tier.files.files())
        store.close()
        tier.close()
        expected = rows_of(spark.read.format("stratamq").load(str(tmp_path / "store")))
        reader = spark.read.format("stratamq")
        if server is not None:
            reader = reader.option("tieredStoreS3Endpoint", server.endpoint)
        frame = reader.load(cfg.tiered_store_file_path)
        assert frame.rdd.getNumPartitions() == files > 3  # one split per tier CommitLog file
        assert rows_of(frame) == expected and len(expected) == 300
        one = reader.option("topics", TOPIC).load(cfg.tiered_store_file_path)
        assert one.count() == 300
        with pytest.raises(Exception, match="not supported when reading a tier"):
            reader.option("startingOffsets", "latest").load(
                cfg.tiered_store_file_path).collect()
    finally:
        if server is not None:
            server.stop()


def test_a_stream_of_a_tier_reads_what_the_uploader_committed(tmp_path):
    """A tier a broker's uploader wrote (appended in place) streams by queue offsets taken
    from its ConsumeQueue files: the same messages as the store held."""
    from stratamq.spark.datasource import StreamReader, _read

    cfg = tier_config(tmp_path)
    store, tier = open_tiered(cfg)
    fill(store, 10)
    assert tier.flush(60)
    with store.get_messages("g", TOPIC, 1, 0, 100) as got:
        expected = [bytes(m.body) for m in got.messages()]
    store.close()
    tier.close()
    reader = StreamReader({"path": cfg.tiered_store_file_path, "startingOffsets": "earliest"})
    assert reader.queue_bounds() == {(TOPIC, 0): (0, 5), (TOPIC, 1): (0, 5)}
    start = reader.initialOffset()
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    rows = [row for part in reader.partitions(start, end) for batch in _read(part)
            for row in batch.to_pylist()]
    assert len(rows) == 10
    assert [r["body"] for r in sorted(rows, key=lambda r: r["queue_offset"])
            if r["queue_id"] == 1] == expected
