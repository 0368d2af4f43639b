"""A compaction topic on a running broker, used as a user would: created with
``--attribute cleanup.policy=COMPACTION``, written by the official producer (keys routed to
queues by the broker, deletes as TOMBSTONE=true), compacted with ``stratamq compaction run
--endpoint``, read by a new SimpleConsumer group from the minimum offset and by PullMessage."""

from __future__ import annotations

import json
from collections import defaultdict

import grpc
import pytest
from rocketmq import SimpleConsumer
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from test_broker_harness import (
    BrokerProcess,
    FilterExpression,
    Producer,
    config,
    message,
    raw_stub,
    receive_until,
)

pytestmark = pytest.mark.slow
TOPIC = "Accounts"


@pytest.fixture
def broker(tmp_path):
    b = BrokerProcess(tmp_path / "store").start()
    yield b
    b.terminate()


def test_a_compaction_topic_end_to_end_with_the_official_client(broker, tmp_path):
    made = broker.cli("topic", "create", "--topic", TOPIC, "--queues", "3",
                      "--attribute", "cleanup.policy=COMPACTION",
                      "--attribute", "delete.retention.ms=0")
    assert made.returncode == 0, made.stderr
    listed = {json.loads(t)["topic"]: json.loads(t)
              for t in broker.cli("topic", "list").stdout.splitlines()}
    assert listed[TOPIC]["attributes"] == {"cleanup.policy": "COMPACTION",
                                           "delete.retention.ms": "0"}
    producer = Producer(config(broker.endpoint), (TOPIC,))
    producer.startup()
    model: dict[str, bytes] = {}
    try:
        for i in range(240):
            key = f"acct-{i % 24}"
            body = b"balance %d" % i
            producer.send(message(TOPIC, body, keys=(key,)))
            model[key] = body
        for i in range(0, 24, 5):  # delete a few accounts
            producer.send(message(TOPIC, b"-", keys=(f"acct-{i}",),
                                  props={"TOMBSTONE": "true"}))
            model.pop(f"acct-{i}")
        # A message without a key has nothing to be the latest value of: refused.
        with pytest.raises(Exception, match="needs a key"):
            producer.send(message(TOPIC, b"no key"))
    finally:
        producer.shutdown()

    # Every key went to exactly one queue.
    channel, stub = raw_stub(broker)
    try:
        queues_of: dict[str, set[int]] = defaultdict(set)
        for qid in range(3):
            for m in pull_all(stub, qid):
                queues_of[m.keys[0]].add(qid)
        assert len(queues_of) == 24 and all(len(q) == 1 for q in queues_of.values())

        done = broker.cli("compaction", "run")
        assert done.returncode == 0, done.stderr
        rows = [json.loads(line) for line in done.stdout.splitlines()]
        assert sorted(r["queue_id"] for r in rows) == [0, 1, 2]
        assert sum(r["records_read"] for r in rows) == 245
        assert sum(r["kept"] for r in rows) == 24  # the latest of each key, tombstones too
        # With delete.retention.ms=0 the next round drops the tombstones.
        again = [json.loads(line) for line in broker.cli("compaction", "run").stdout.split()]
        assert sum(r["tombstones_dropped"] for r in again) == 5
        status = [json.loads(line) for line in
                  broker.cli("compaction", "status").stdout.splitlines()]
        assert sum(s["messages"] for s in status) == 19

        # PullMessage from offset 0 skips what compaction removed.
        pulled = {m.keys[0]: m.body for qid in range(3) for m in pull_all(stub, qid)}
        assert pulled == model
    finally:
        channel.close()

    # A new group starts at the minimum offset and reads exactly the table.
    consumer = SimpleConsumer(config(broker.endpoint), "FreshReaders",
                              {TOPIC: FilterExpression("*")})
    consumer.startup()
    try:
        got = receive_until(consumer, len(model))
        assert {next(iter(m.keys)): m.body for m in got} == model
    finally:
        consumer.shutdown()


def test_the_broker_refuses_what_a_compaction_topic_cannot_take(broker):
    bad = broker.cli("topic", "create", "--topic", "Bad", "--queues", "1",
                     "--attribute", "cleanup.policy=COMPACT")
    assert bad.returncode != 0 and "cleanup.policy must be DELETE|COMPACTION" in bad.stderr
    fifo = broker.cli("topic", "create", "--topic", "Fifo", "--queues", "1", "--type", "FIFO",
                      "--attribute", "cleanup.policy=COMPACTION")
    assert fifo.returncode != 0 and "needs a NORMAL topic" in fifo.stderr
    unknown = broker.cli("topic", "create", "--topic", "X", "--queues", "1",
                         "--attribute", "retention.bytes=5")
    assert unknown.returncode != 0 and "unknown topic attribute" in unknown.stderr
    assert broker.cli("topic", "create", "--topic", "Kv", "--queues", "2",
                      "--attribute", "+cleanup.policy=COMPACTION").returncode == 0
    grow = broker.cli("topic", "update", "--topic", "Kv", "--queues", "4")
    assert grow.returncode != 0 and "compaction topic" in grow.stderr
    flip = broker.cli("topic", "update", "--topic", "Kv", "--attribute", "cleanup.policy=DELETE")
    assert flip.returncode != 0 and "cannot be changed" in flip.stderr
    ok = broker.cli("topic", "update", "--topic", "Kv", "--attribute", "delete.retention.ms=5")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["attributes"]["delete.retention.ms"] == "5"
    plain = broker.cli("compaction", "run", "--topic", "Nope")
    assert plain.returncode != 0 and "does not exist" in plain.stderr

    # An empty body is a tombstone on a compaction topic and refused anywhere else.
    assert broker.cli("topic", "create", "--topic", "Plain", "--queues", "1").returncode == 0
    channel, stub = raw_stub(broker)
    try:
        def send(topic: str, body: bytes) -> int:
            m = pb.Message(topic=pb.Resource(name=topic), body=body)
            m.system_properties.message_id = f"01{topic}{len(body)}"
            m.system_properties.keys.append("k")
            m.system_properties.message_type = pb.NORMAL
            m.system_properties.body_encoding = pb.IDENTITY
            return stub.SendMessage(svc.SendMessageRequest(messages=[m]), timeout=10).status.code

        assert send("Kv", b"") == pb.OK
        assert send("Plain", b"") == pb.MESSAGE_BODY_EMPTY
    except grpc.RpcError as exc:  # pragma: no cover - a transport failure is a failure
        raise AssertionError(exc) from None
    finally:
        channel.close()


def pull_all(stub, qid: int) -> list:
    mq = pb.MessageQueue(topic=pb.Resource(name=TOPIC), id=qid)
    out, offset = [], 0
    while True:
        replies = list(stub.PullMessage(svc.PullMessageRequest(
            group=pb.Resource(name="Puller"), message_queue=mq, offset=offset, batch_size=32,
            filter_expression=pb.FilterExpression(type=pb.TAG, expression="*")), timeout=10))
        msgs = [r.message for r in replies if r.HasField("message")]
        out += [Msg(m) for m in msgs]
        nxt = replies[-1].next_offset
        if not msgs and nxt <= offset or replies[0].status.code != pb.OK:
            return out
        offset = nxt


class Msg:
    def __init__(self, m) -> None:
        self.keys = list(m.system_properties.keys)
        self.body = m.body
