"""The Spark source given one broker of a cluster on etcd reads every broker group (issue 28):
real etcd, broker groups of real broker processes, a local Spark. Batch reads; streaming
reads whose offsets name the group, through the export pipeline (``stratamq spark export``)
and across a SIGKILLed master."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from conftest_spark import spark_session  # noqa: F401  (the shared `spark` fixture)
from pyspark.sql.streaming.datasource import ReadAllAvailable
from rocketmq import Producer
from test_broker_harness import config, message
from test_cluster_routes import (  # noqa: F401
    TOPIC,
    Member,
    etcd,
    masters,
    route,
    start,
    two_groups,
)
from waiting import wait_until

from stratamq.spark.broker_io import BrokerConnection
from stratamq.spark.cluster_read import GroupSplit, read_group_split
from stratamq.spark.datasource import StreamReader
from stratamq.spark.export import planned_rows, run_export, source_options
from stratamq.spark.planning import OptionError
from stratamq.spark.reading import DataLoss


def test_one_endpoint_reads_every_group(spark, two_groups):  # noqa: F811
    a, b = two_groups
    wait_until(lambda: set(masters(route(a.endpoint))) == {"a", "b"}, timeout=30,
               what="the route to name both groups")
    producer = Producer(config(a.endpoint), (TOPIC,))
    producer.startup()
    try:
        receipts = [producer.send(message(TOPIC, b"row-%d" % i)) for i in range(20)]
    finally:
        producer.shutdown()
    groups = {r.message_queue.message_queue0().broker.name for r in receipts}
    assert groups == {"a", "b"}  # the rows are spread over both groups
    df = spark.read.format("stratamq").option("endpoints", b.endpoint).option(
        "topics", TOPIC).load()
    rows = df.select("body", "store_host").collect()
    assert sorted(bytes(r.body) for r in rows) == sorted(b"row-%d" % i for i in range(20))
    assert {r.store_host.rpartition(":")[2] for r in rows} == {str(a.port), str(b.port)}
    # Queue ids repeat across groups: offsets naming queues without their group are refused,
    # not misapplied.
    with pytest.raises(Exception, match="without its broker group"):
        spark.read.format("stratamq").option("endpoints", b.endpoint).option(
            "startingOffsets", json.dumps({TOPIC: {"0": 0}})).load().collect()
    # A stream's offsets name each queue's group.
    reader = StreamReader({"endpoints": b.endpoint, "topics": TOPIC,
                           "startingOffsets": "earliest"})
    start_at = reader.initialOffset()
    assert start_at == {TOPIC: {"a/0": 0, "a/1": 0, "b/0": 0, "b/1": 0}}
    end = reader.latestOffset(start_at, ReadAllAvailable())
    assert sum(end[TOPIC].values()) == 20
    # A group the offsets do not name yet (registered later) is read from its beginning.
    only_a = {TOPIC: {k: v for k, v in start_at[TOPIC].items() if k.startswith("a/")}}
    assert reader.latestOffset(only_a, ReadAllAvailable()) == end
    assert sum(p.end - p.start for p in reader.partitions(only_a, end)) == 20
    # Queue ids without their group cannot be placed in a cluster of two groups.
    with pytest.raises(OptionError, match="without its broker group"):
        reader.latestOffset({TOPIC: {"0": 0}}, ReadAllAvailable())
    with pytest.raises(OptionError, match="without its broker group"):
        StreamReader({"endpoints": b.endpoint, "startingOffsets": json.dumps(
            {TOPIC: {"0": 0}})}).initialOffset()
    # A group that left the cluster: failOnDataLoss says.
    with pytest.raises(DataLoss, match="broker group.s. c left"):
        reader.latestOffset({TOPIC: {**end[TOPIC], "c/0": 3}}, ReadAllAvailable())
    # Offsets past a group master's end: its log was cut at a failover after the stream read
    # what the old master had not replicated; new messages there would be skipped.
    ahead = {TOPIC: {**end[TOPIC], "a/0": end[TOPIC]["a/0"] + 3}}
    with pytest.raises(DataLoss, match="log was cut"):
        reader.latestOffset(ahead, ReadAllAvailable())
    lenient = StreamReader({"endpoints": b.endpoint, "topics": TOPIC,
                            "failOnDataLoss": "false"})
    assert lenient.latestOffset({TOPIC: {**end[TOPIC], "c/0": 3}}, ReadAllAvailable()) == {
        TOPIC: {**end[TOPIC], "c/0": 3}}  # its offsets kept, should it return


def send(endpoint: str, bodies: list[bytes], topic: str = TOPIC) -> set[str]:
    """Send through ``endpoint`` (the client spreads them over the groups); the groups used."""
    producer = Producer(config(endpoint), (topic,))
    producer.startup()
    try:
        return {producer.send(message(topic, body)).message_queue.message_queue0().broker.name
                for body in bodies}
    finally:
        producer.shutdown()


def _visible(endpoint: str) -> int:
    """Messages the stream would read from the queues' beginnings now."""
    bounds = StreamReader({"endpoints": endpoint, "topics": TOPIC}).queue_bounds()
    return sum(high - low for low, high in bounds.values())


@pytest.fixture
def failover_cluster(tmp_path, etcd):  # noqa: F811
    """Group a: a master and a slave; group b: one broker."""
    members = [Member(tmp_path, etcd.endpoints, "a", 1), Member(tmp_path, etcd.endpoints, "a", 2),
               Member(tmp_path, etcd.endpoints, "b", 1)]
    yield members
    for m in members:
        if m.proc is not None and m.proc.poll() is None:
            os.kill(m.proc.pid, signal.SIGCONT)
            m.terminate()


def test_stream_of_a_cluster_exactly_once_across_a_failover(spark, failover_cluster, tmp_path):
    a1, a2, b = failover_cluster
    start([a1, a2])  # a cluster of one group first
    a_master = next(m for m in (a1, a2) if m.is_writable_master())
    a_slave = a2 if a_master is a1 else a1
    # Offsets without a group (a checkpoint of a one-group cluster from before groups were
    # named) are its group's; the next offsets name the group.
    one = StreamReader({"endpoints": a_master.endpoint, "topics": TOPIC})
    assert one.latestOffset({TOPIC: {"0": 0, "1": 0}}, ReadAllAvailable()) == {
        TOPIC: {"a/0": 0, "a/1": 0}}
    start([b])  # the cluster grows: group b's queues are read from their beginnings
    wait_until(lambda: len(one.latestOffset({TOPIC: {"a/0": 0, "a/1": 0}},
                                            ReadAllAvailable())[TOPIC]) == 4,
               timeout=30, what="the stream to see group b's queues")
    wait_until(lambda: a_master.cluster()["syncStateSet"] == [1, 2], timeout=60,
               what="group a's slave to join its SyncStateSet")
    wait_until(lambda: masters(route(b.endpoint)) == {"a": a_master.endpoint, "b": b.endpoint},
               timeout=30, what="the route to name both groups' masters")
    out = str(tmp_path / "export")
    bodies: list[bytes] = []

    def export(count: int, per_trigger: int | None = None) -> dict:
        """Send ``count`` more, then one export run (the CLI's) from group b's endpoint."""
        new = [b"m-%d" % i for i in range(len(bodies), len(bodies) + count)]
        assert send(b.endpoint, new) == {"a", "b"}  # both groups get some
        bodies.extend(new)
        wait_until(lambda: _visible(b.endpoint) == len(bodies), timeout=30,
                   what=f"{len(bodies)} messages in the groups' queues")
        return run_export(spark, source_options(None, b.endpoint, TOPIC, per_trigger), out,
                          progress=False)

    def exported() -> list[bytes]:
        return sorted(bytes(r.body) for r in spark.read.parquet(out).select("body").collect())

    first = export(40, per_trigger=15)  # maxOffsetsPerTrigger shared across the groups
    assert first["exported"] == 40 and first["micro_batches"] == 3
    assert exported() == sorted(bodies)
    offsets = json.loads((Path(out) / "_checkpoint" / "offsets" / "2").read_text()
                         .strip().splitlines()[-1])
    assert set(offsets[TOPIC]) == {"a/0", "a/1", "b/0", "b/1"}  # naming the group
    assert sum(offsets[TOPIC].values()) == 40

    # More, acknowledged (so on a's slave too: its SyncStateSet); a's master is SIGKILLed.
    new = [b"m-%d" % i for i in range(len(bodies), len(bodies) + 20)]
    send(b.endpoint, new)
    bodies.extend(new)
    a_master.kill()
    wait_until(a_slave.is_writable_master, timeout=60, what="a's slave to be elected")
    wait_until(lambda: masters(route(b.endpoint)) == {"a": a_slave.endpoint, "b": b.endpoint},
               timeout=30, what="the route to follow the failover")
    wait_until(lambda: _visible(b.endpoint) == len(bodies), timeout=30,
               what="the acknowledged messages in the groups' queues")
    assert planned_rows(source_options(None, b.endpoint, TOPIC),
                        os.path.join(out, "_checkpoint")) == 20
    # A split planned before the kill (at a's old master) and run after it: it asks the
    # cluster status and reads its whole range at the new master.
    a0 = StreamReader({"endpoints": b.endpoint, "topics": TOPIC}).queue_bounds()[(TOPIC, "a/0")]
    planned = GroupSplit(BrokerConnection(a_master.endpoint), TOPIC, 0, a0[0], a0[1], True,
                         "stratamq-spark", broker_group="a", peers=[BrokerConnection(b.endpoint)])
    got = [bytes(v) for batch in read_group_split(planned)
           for v in batch.column("body").to_pylist()]
    assert len(got) == a0[1] - a0[0] > 0 and set(got) <= set(bodies)
    # The next run continues from the checkpoint, reading group a at its new master (with
    # what that one took since): nothing lost, nothing read twice.
    second = export(10)
    assert second["exported"] == 30
    assert exported() == sorted(bodies) and len(bodies) == 70
