"""Spark reads of a compacted queue split in many partitions: every split yields exactly the
records of its own offset range, so six partitions give the rows one partition gives.

A compacted queue has gaps (the offsets compaction removed); a pull of ``end - start``
messages from a split's start then runs past the split's end, into the next split's."""

from __future__ import annotations

import uuid

import pytest
from conftest_spark import spark_session  # noqa: F401  (the shared `spark` fixture)
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from test_broker_harness import BrokerProcess, raw_stub
from waiting import wait_until

TOPIC = "Ledger"
KEYS, VERSIONS = 15, 20  # 300 offsets, 15 kept by compaction


def _offsets(df) -> list[int]:
    return sorted(r.queue_offset for r in df.select("queue_offset").collect())


def _pulled_offsets(stub) -> list[int]:
    """What PullMessage from offset 0 serves of the compacted queue (a consumer's view)."""
    out, offset = [], 0
    while True:
        request = svc.PullMessageRequest(
            group=pb.Resource(name="Check"),
            message_queue=pb.MessageQueue(topic=pb.Resource(name=TOPIC), id=0), offset=offset,
            batch_size=32, filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"))
        answer = list(stub.PullMessage(request, timeout=30))
        if answer[0].status.code != pb.OK:
            return out
        out += [r.message.system_properties.queue_offset for r in answer if r.HasField("message")]
        offset = answer[-1].next_offset


@pytest.fixture(scope="module")
def compacted(tmp_path_factory):
    b = BrokerProcess(tmp_path_factory.mktemp("splits") / "store").start()
    try:
        made = b.cli("topic", "create", "--topic", TOPIC, "--queues", "1",
                     "--attribute", "cleanup.policy=COMPACTION")
        assert made.returncode == 0, made.stderr
        channel, stub = raw_stub(b)
        for version in range(VERSIONS):
            sent = stub.SendMessage(svc.SendMessageRequest(messages=[
                pb.Message(topic=pb.Resource(name=TOPIC), body=b"v%d of k%d" % (version, k),
                           system_properties=pb.SystemProperties(
                               message_id=uuid.uuid4().hex, keys=[f"k{k}"]))
                for k in range(KEYS)]))
            assert sent.status.code == pb.OK, sent.status
        end = svc.QueryOffsetRequest(message_queue=pb.MessageQueue(
            topic=pb.Resource(name=TOPIC), id=0), query_offset_policy=pb.END)
        wait_until(lambda: stub.QueryOffset(end).offset == KEYS * VERSIONS, 30,
                   "the messages dispatched")
        done = b.cli("compaction", "run")
        assert done.returncode == 0, done.stderr
        kept = _pulled_offsets(stub)
        channel.close()
        assert len(kept) == KEYS  # the queue has gaps now
        yield b, kept
    finally:
        if b.proc.poll() is None:
            b.terminate()


def test_broker_splits_of_a_compacted_queue_hold_only_their_own_offsets(spark, compacted):
    broker, kept = compacted

    def read(parts: int) -> list[int]:
        return _offsets(spark.read.format("stratamq").option("endpoints", broker.endpoint)
                        .option("topics", TOPIC).option("minPartitions", str(parts)).load())

    one = read(1)
    assert one == kept
    assert read(6) == one  # was 525 rows for 150 before: records past a split's end kept


def test_store_splits_of_a_compacted_queue_equal_one_partition(spark, compacted):
    broker, kept = compacted
    assert broker.terminate() == 0

    def read(parts: int, latest: str) -> list[int]:
        return _offsets(spark.read.format("stratamq").option("topics", TOPIC)
                        .option("latestValues", latest).option("minPartitions", str(parts))
                        .load(str(broker.store)))

    history = read(1, "false")
    assert history == list(range(KEYS * VERSIONS))  # the ConsumeQueue: every offset
    assert read(6, "false") == history
    assert read(1, "true") == kept  # the latest value of each key: what a pull serves
    assert read(6, "true") == kept
