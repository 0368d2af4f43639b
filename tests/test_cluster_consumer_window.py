"""What a consumer may see again after a failover (docs/CLUSTER.md, "Consumers across a
failover"), between real broker processes and a real etcd: a slave copies its master's pop
state and consumer offsets every haStateSyncInterval, so what was acknowledged before the last
copy is never delivered again by the new master, what was acknowledged after it may be, and
nothing unacknowledged is lost."""

from __future__ import annotations

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc
from test_cluster_failover import TOPIC, _start, group, send  # noqa: F401 - the fixture
from waiting import wait_until

from stratamq.client.admin import AdminClient

GROUP = "WindowGroup"


def receive(endpoint: str, batch: int, poll_s: float = 1.0) -> list[pb.Message]:
    req = svc.ReceiveMessageRequest(
        group=pb.Resource(name=GROUP), message_queue=pb.MessageQueue(
            topic=pb.Resource(name=TOPIC), id=-1), batch_size=batch,
        filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"))
    req.invisible_duration.FromSeconds(120)  # never visible again within the test
    req.long_polling_timeout.FromMilliseconds(int(poll_s * 1000))
    with grpc.insecure_channel(endpoint) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        return [r.message for r in stub.ReceiveMessage(req, timeout=poll_s + 30)
                if r.HasField("message")]


def ack(endpoint: str, msgs: list[pb.Message]) -> None:
    with grpc.insecure_channel(endpoint) as channel:
        reply = service_pb2_grpc.MessagingServiceStub(channel).AckMessage(svc.AckMessageRequest(
            group=pb.Resource(name=GROUP), topic=pb.Resource(name=TOPIC),
            entries=[svc.AckMessageEntry(message_id=m.system_properties.message_id,
                                         receipt_handle=m.system_properties.receipt_handle)
                     for m in msgs]), timeout=30)
    assert all(e.status.code == pb.OK for e in reply.entries), reply


def take(endpoint: str, count: int) -> list[pb.Message]:
    got: list[pb.Message] = []

    def enough() -> bool:
        got.extend(receive(endpoint, min(32, count - len(got))))
        return len(got) >= count

    wait_until(enough, timeout=60, what=f"{count} messages received")
    return got


def state_syncs(endpoint: str) -> int:
    with AdminClient(endpoint, timeout=5) as client:
        return client.call_service("stratamq.admin.v1.Replication",
                                   "HaStatus")["stateSync"]["syncs"]


def test_a_consumer_sees_again_at_most_what_it_acked_after_the_last_state_copy(
        group):  # noqa: F811 - the fixture imported above
    master, slave = _start(group)
    bodies = [b"w-%03d" % i for i in range(120)]
    assert send(master.endpoint, bodies) == [pb.OK] * len(bodies)
    before = take(master.endpoint, 60)
    ack(master.endpoint, before)
    # Two copies after the acknowledgements: the second began after they were made.
    copies = state_syncs(slave.endpoint)
    wait_until(lambda: state_syncs(slave.endpoint) >= copies + 2, timeout=30,
               what="the slave to copy the pop state after the acknowledgements")
    window = take(master.endpoint, 30)
    ack(master.endpoint, window)  # acknowledged, then the master dies before the next copy
    master.kill()
    wait_until(slave.is_writable_master, timeout=60, what="the slave to be elected")

    unacked = set(bodies) - {m.body for m in before + window}
    seen: list[bytes] = []

    def all_unacked_seen() -> bool:
        seen.extend(m.body for m in receive(slave.endpoint, 32))
        return unacked <= set(seen)

    wait_until(all_unacked_seen, timeout=60, what="every unacknowledged message")
    seen.extend(m.body for m in receive(slave.endpoint, 32, poll_s=2))  # anything more
    assert not {m.body for m in before} & set(seen)  # acknowledged before the last copy
    assert set(seen) <= unacked | {m.body for m in window}
    assert len(seen) == len(set(seen))
