"""Batch reads of a whole cluster on etcd through one broker's endpoint (issue 28): offsets
naming the broker group (``{"topic": {"<brokerName>/<queueId>": offset}}``), a topic only
another group has, and offsets naming a group the cluster does not have (a stream's
startingOffsets too). Real etcd, two broker groups of real broker processes, a local Spark;
one cluster for the module."""

from __future__ import annotations

import json
import logging

import pytest
from broker_proc import create_topics
from conftest_spark import spark_session  # noqa: F401  (the shared `spark` fixture)
from pyspark.sql.streaming.datasource import ReadAllAvailable
from test_cluster_failover import stop_all
from test_cluster_routes import TOPIC, Member, masters, route, start
from test_spark_cluster import send
from waiting import wait_until

from stratamq.benchmarks.etcd_members import EtcdCluster
from stratamq.spark.datasource import StreamReader
from stratamq.spark.reading import DataLoss

ONLY_B = "OnlyInB"  # a topic only group b has


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Groups a and b of one broker each; TOPIC's 24 messages spread over both groups, ONLY_B's
    6 in group b."""
    root = tmp_path_factory.mktemp("batch-cluster")
    etcd = EtcdCluster(root, size=1)
    a, b = Member(root, etcd.endpoints, "a", 1), Member(root, etcd.endpoints, "b", 1)
    create_topics(b.store, [(ONLY_B, 2, "NORMAL")])
    try:
        start([a, b])
        wait_until(lambda: set(masters(route(a.endpoint))) == {"a", "b"}, timeout=30,
                   what="the route to name both groups")
        # Both groups hold some of TOPIC's.
        assert send(a.endpoint, [b"t-%d" % i for i in range(24)]) == {"a", "b"}
        assert send(b.endpoint, [b"only-%d" % i for i in range(6)], ONLY_B) == {"b"}
        yield a, b
    finally:
        stop_all([a, b], etcd)


def _rows(df, a: Member) -> dict[tuple[str, int, int], bytes]:
    """(group, queue id, queue offset) -> body of every row (the group from its store host)."""
    return {("a" if r.store_host.endswith(f":{a.port}") else "b", r.queue_id, r.queue_offset):
            bytes(r.body)
            for r in df.select("store_host", "queue_id", "queue_offset", "body").collect()}


def _read(spark, endpoint: str, **options: str):
    reader = spark.read.format("stratamq").option("endpoints", endpoint)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def test_group_offsets_read_exactly_the_messages_between_them(spark, cluster):  # noqa: F811
    a, b = cluster
    everything = _rows(_read(spark, b.endpoint, topics=TOPIC), a)
    assert sorted(everything.values()) == sorted(b"t-%d" % i for i in range(24))
    ends = {}
    for group, qid, offset in everything:
        ends[(group, qid)] = max(ends.get((group, qid), 0), offset + 1)
    assert set(ends) == {("a", 0), ("a", 1), ("b", 0), ("b", 1)}
    assert min(ends.values()) >= 3  # (the client spreads sends over every queue)
    # From offset 1 to the one before each queue's last (-2: earliest, -1: latest, too).
    starting = {f"{g}/{q}": 1 for g, q in ends}
    starting["b/1"] = -2
    ending = {f"{g}/{q}": end - 1 for (g, q), end in ends.items()}
    ending["a/1"] = -1
    df = _read(spark, a.endpoint, startingOffsets=json.dumps({TOPIC: starting}),
               endingOffsets=json.dumps({TOPIC: ending}))
    first = {(g, q): max(starting[f"{g}/{q}"], 0) for g, q in ends}
    last = {(g, q): end if ending[f"{g}/{q}"] == -1 else ending[f"{g}/{q}"]
            for (g, q), end in ends.items()}
    want = {k: v for k, v in everything.items() if first[k[:2]] <= k[2] < last[k[:2]]}
    assert {g for g, _q, _o in want} == {"a", "b"} and len(want) < len(everything)
    assert _rows(df, a) == want
    # Ending offsets alone: starting is earliest (the batch default) in every group.
    df = _read(spark, b.endpoint, startingOffsets="earliest",
               endingOffsets=json.dumps({TOPIC: {"a/0": 1, "b/0": 1}}))
    assert _rows(df, a) == {k: v for k, v in everything.items() if k[1] == 1 or k[2] < 1}


def test_a_topic_only_in_another_group_reads_through_the_first_groups_endpoint(
        spark, cluster):  # noqa: F811
    a, b = cluster
    rows = _rows(_read(spark, a.endpoint, topics=ONLY_B), a)
    assert sorted(rows.values()) == sorted(b"only-%d" % i for i in range(6))
    assert {g for g, _q, _o in rows} == {"b"}
    # Offsets naming its group, through group a's endpoint.
    after = _rows(_read(spark, a.endpoint, startingOffsets=json.dumps({ONLY_B: {"b/0": 1}})), a)
    assert after == {k: v for k, v in rows.items() if k[1] != 0 or k[2] >= 1}
    assert len(after) == 5


def test_offsets_naming_no_group_of_the_cluster_are_a_clear_error(spark, cluster):  # noqa: F811
    a, b = cluster
    bad = json.dumps({TOPIC: {"a/0": 0, "nosuch/0": 0}})
    with pytest.raises(Exception, match="broker group.s. nosuch.*not in .*cluster"):
        _read(spark, a.endpoint, startingOffsets=bad).collect()
    # failOnDataLoss=false: a WARNING, and every queue of the groups there is read.
    assert len(_read(spark, a.endpoint, startingOffsets=bad,
                     failOnDataLoss="false").collect()) == 24
    # A queue its group lacks, and a queue id without its group, are named.
    with pytest.raises(Exception, match="no queue a/7"):
        _read(spark, a.endpoint, endingOffsets=json.dumps({TOPIC: {"a/7": 1}})).collect()
    with pytest.raises(Exception, match=f"{TOPIC}/0 .*without its broker group"):
        _read(spark, a.endpoint, startingOffsets=json.dumps({TOPIC: {"0": 0}})).collect()


def test_a_streams_starting_offsets_naming_no_group_follow_fail_on_data_loss(cluster, caplog):
    a, _b = cluster
    bad = json.dumps({TOPIC: {"a/0": 1, "nosuch/0": 0}})
    options = {"endpoints": a.endpoint, "topics": TOPIC, "startingOffsets": bad}
    # As a batch read: DataLoss naming the group...
    with pytest.raises(DataLoss, match="broker group.s. nosuch.*not in .*cluster"):
        StreamReader(options).initialOffset()
    # ...or, with failOnDataLoss=false, a WARNING naming it and the groups there are read.
    lenient = StreamReader({**options, "failOnDataLoss": "false"})
    with caplog.at_level(logging.WARNING, logger="stratamq.spark.cluster_read"):
        start = lenient.initialOffset()
    assert start == {TOPIC: {"a/0": 1, "a/1": 0, "b/0": 0, "b/1": 0}}
    assert any("nosuch" in r.getMessage() and r.levelno == logging.WARNING
               for r in caplog.records)
    end = lenient.latestOffset(start, ReadAllAvailable())
    assert sum(end[TOPIC].values()) - sum(start[TOPIC].values()) == 23
