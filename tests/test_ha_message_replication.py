"""Message-based replication of compaction topics (seed 001): the pull loop against a real
broker's PullMessage, every message arriving with its original queue offset, physical offset
and body; stopping where the slave's own log takes over; a forced compaction at the end. The
sink is a stand-in until the compaction package provides the real one."""

from __future__ import annotations

from test_broker_harness import BrokerProcess, create_topic, raw_stub

from stratamq.ha.message_replication import GrpcPullSource, replicate_topic


class Collected:
    def __init__(self) -> None:
        self.messages = []
        self.compacted: list[str] = []

    def put_replicated(self, message) -> None:
        self.messages.append(message)

    def force_compaction(self, topic: str) -> None:
        self.compacted.append(topic)


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
    assert sink.compacted == partial.compacted == ["Kv"]
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
