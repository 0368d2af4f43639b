"""Message-based replication of compaction topics (seed 001): the pull loop against a real
broker's PullMessage, every message arriving with its original queue offset, physical offset
and body; stopping where the slave's own log takes over; a forced compaction at the end. The
sink is a stand-in until the compaction package provides the real one."""

from __future__ import annotations

from test_broker_harness import BrokerProcess, create_topic, raw_stub

from stratamq import record as codec
from stratamq.ha.message_replication import CompactionGate, GrpcPullSource, replicate_queue
from stratamq.message import DispatchInfo


class Collected:
    def __init__(self) -> None:
        self.messages = []

    def put_replicated(self, record) -> bool:
        self.messages.append(codec.decode(record))
        return True


def replicate_topic(source, sink, topic, until):
    return {qid: replicate_queue(source, sink, topic, qid, 0, until=end)[0]
            for qid, end in until.items()}


def test_a_topic_is_pulled_from_the_master_up_to_where_the_slaves_log_takes_over(tmp_path):
    from rocketmq.grpc_protocol import definition_pb2 as pb
    from rocketmq.grpc_protocol import service_pb2 as svc

    broker = BrokerProcess(tmp_path / "master").start()
    try:
        create_topic(broker, "Kv", 2)
        channel, stub = raw_stub(broker)
        with channel:
            for i in range(40):
                msg = pb.Message(topic=pb.Resource(name="Kv"), body=b"value-%d" % i,
                                 system_properties=pb.SystemProperties(
                                     message_id=f"{i:032X}", keys=[f"key-{i % 7}"]))
                msg.system_properties.born_timestamp.GetCurrentTime()
                reply = stub.SendMessage(svc.SendMessageRequest(messages=[msg]), timeout=10)
                assert reply.status.code == pb.OK
        source = GrpcPullSource(broker.endpoint)
        sink, partial = Collected(), Collected()
        try:
            # Everything (the limits are past what exists), then queue 1 up to offset 5 only.
            pulled = replicate_topic(source, sink, "Kv", {0: 10_000, 1: 10_000})
            replicate_topic(source, partial, "Kv", {1: 5})
        finally:
            source.close()
    finally:
        broker.terminate()
    assert sorted(m.body for m in sink.messages) == sorted(b"value-%d" % i for i in range(40))
    assert [(m.queue_id, m.queue_offset) for m in partial.messages] == [(1, i) for i in range(5)]
    by_queue: dict[int, list] = {0: [], 1: []}
    for m in sink.messages:
        by_queue[m.queue_id].append(m)
    assert pulled == {0: len(by_queue[0]), 1: len(by_queue[1])}
    for msgs in by_queue.values():
        assert [m.queue_offset for m in msgs] == list(range(len(msgs)))
        assert all(m.topic == "Kv" and m.body.startswith(b"value-") for m in msgs)
    offsets = [m.physical_offset for m in sink.messages]
    assert len(set(offsets)) == len(offsets)


class Inner:
    def __init__(self) -> None:
        self.got: list[tuple[str, int, int]] = []

    def dispatch(self, info) -> None:
        self.got.append((info.topic, info.queue_id, info.queue_offset))


class Policies:
    def policy(self, topic):
        return object() if topic == "Kv" else None


def info(topic: str, queue_id: int, queue_offset: int) -> DispatchInfo:
    return DispatchInfo(topic, queue_id, queue_offset, 0, 100, 0, 0, 0, {})


def test_the_gate_holds_a_queue_back_until_the_pull_is_past_everything_it_held():
    inner = Inner()
    gate = CompactionGate(inner, Policies())
    gate.dispatch(info("Plain", 0, 7))  # not a compaction topic: straight through
    gate.dispatch(info("Kv", 0, 40))
    gate.dispatch(info("Kv", 0, 41))
    gate.dispatch(info("Kv", 1, 3))
    assert inner.got == [("Plain", 0, 7)]
    # A pull that stopped at 41 (the master served up to 40) has not covered 41 yet.
    assert not gate.try_open("Kv", 0, 41) and not gate.is_open("Kv", 0)
    assert gate.try_open("Kv", 0, 42) and gate.is_open("Kv", 0)
    gate.dispatch(info("Kv", 0, 42))
    gate.dispatch(info("Kv", 1, 4))  # queue 1 is still closed
    assert inner.got == [("Plain", 0, 7), ("Kv", 0, 42)]
    assert gate.try_open("Kv", 1, 5)
    gate.dispatch(info("Kv", 1, 5))
    assert inner.got[-1] == ("Kv", 1, 5)
