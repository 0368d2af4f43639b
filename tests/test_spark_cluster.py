"""The Spark source given one broker of a cluster on etcd reads every broker group (issue 28):
real etcd, two groups of one broker each, a local Spark."""

from __future__ import annotations

import json

import pytest
from conftest_spark import spark_session  # noqa: F401  (the shared `spark` fixture)
from rocketmq import Producer
from test_broker_harness import config, message
from test_cluster_routes import TOPIC, etcd, masters, route, two_groups  # noqa: F401
from waiting import wait_until

from stratamq.spark.datasource import StreamReader
from stratamq.spark.planning import OptionError


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
    # Queue ids repeat across groups: options naming queues are refused, not misapplied.
    with pytest.raises(Exception, match="names queues"):
        spark.read.format("stratamq").option("endpoints", b.endpoint).option(
            "startingOffsets", json.dumps({TOPIC: {"0": 0}})).load().collect()
    # A streaming read of the cluster is refused at load(), never one group's quietly.
    with pytest.raises(OptionError, match="a streaming read reads one group only"):
        StreamReader({"endpoints": b.endpoint})
