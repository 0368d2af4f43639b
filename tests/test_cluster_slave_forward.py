"""A slave in controller mode sends pop consumption to its group's master (broker/forwarding.py),
between real broker processes and a real etcd member: after a planned switch, a consumer whose
route still names the old master receives from the new master's pop state through it, and an
acknowledgement sent through it holds on the master."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from rocketmq import ClientConfiguration, Credentials, Producer
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc
from test_broker_harness import message
from test_cluster_failover import TOPIC, Member, _cli, _start, send, stop_all
from waiting import wait_until

from stratamq.benchmarks.etcd_members import EtcdCluster
from stratamq.broker.errors import BrokerError
from stratamq.broker.forwarding import MasterForwarding
from stratamq.broker.metadata import MetadataStore
from stratamq.client.admin import AdminClient
from stratamq.signature import auth_metadata

GROUP = "ForwardGroup"


@pytest.fixture
def pair(tmp_path):
    etcd = EtcdCluster(tmp_path, size=1)
    members = [Member(tmp_path, etcd.endpoints, i) for i in (1, 2)]
    yield etcd.endpoints, members
    stop_all(members, etcd)


def receive(endpoint: str, batch: int, invisible_s: int, poll_s: float = 1.0,
            metadata: tuple[tuple[str, str], ...] = (),
            connect: Callable[[str], grpc.Channel] = grpc.insecure_channel
            ) -> tuple[int, list[pb.Message]]:
    """One ReceiveMessage at ``endpoint`` (on a channel ``connect`` makes): its status code
    and messages."""
    req = svc.ReceiveMessageRequest(
        group=pb.Resource(name=GROUP), message_queue=pb.MessageQueue(
            topic=pb.Resource(name=TOPIC), id=-1), batch_size=batch,
        filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"))
    req.invisible_duration.FromSeconds(invisible_s)
    req.long_polling_timeout.FromMilliseconds(int(poll_s * 1000))
    with connect(endpoint) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        replies = list(stub.ReceiveMessage(req, timeout=poll_s + 30, metadata=metadata))
    code = next(r.status.code for r in replies if r.HasField("status"))
    return code, [r.message for r in replies if r.HasField("message")]


def ack(endpoint: str, msgs: list[pb.Message], metadata: tuple[tuple[str, str], ...] = (),
        connect: Callable[[str], grpc.Channel] = grpc.insecure_channel
        ) -> svc.AckMessageResponse:
    with connect(endpoint) as channel:
        return service_pb2_grpc.MessagingServiceStub(channel).AckMessage(svc.AckMessageRequest(
            group=pb.Resource(name=GROUP), topic=pb.Resource(name=TOPIC),
            entries=[svc.AckMessageEntry(message_id=m.system_properties.message_id,
                                         receipt_handle=m.system_properties.receipt_handle)
                     for m in msgs]), timeout=30, metadata=metadata)


def take(endpoint: str, count: int, invisible_s: int,
         connect: Callable[[str], grpc.Channel] = grpc.insecure_channel) -> list[pb.Message]:
    got: list[pb.Message] = []

    def enough() -> bool:
        code, msgs = receive(endpoint, min(32, count - len(got)), invisible_s,
                             connect=connect)
        assert code in (pb.OK, pb.MESSAGE_NOT_FOUND), pb.Code.Name(code)
        got.extend(msgs)
        return len(got) >= count

    wait_until(enough, timeout=60, what=f"{count} messages received")
    return got


def switched(etcd: str, old: Member, new: Member) -> None:
    """A planned switch to ``new``, and ``old`` following it."""
    [line] = _cli("elect", "--broker-name", "g", "--broker-id", str(new.broker_id),
                  "--etcd", etcd, "--cluster", "c1")
    assert line["masterBrokerId"] == new.broker_id
    wait_until(new.is_writable_master, timeout=60, what="the new master to take writes")
    wait_until(lambda: old.cluster()["masterBrokerId"] == new.broker_id, timeout=60,
               what="the old master to follow the new one")


def test_receives_and_acks_at_the_old_master_after_a_switch_reach_the_new_one(pair):
    etcd, group = pair
    old, new = _start(group)
    switched(etcd, old, new)
    bodies = [b"f-%03d" % i for i in range(40)]
    assert send(new.endpoint, bodies) == [pb.OK] * len(bodies)

    # Received through the old master, now a slave: popped from the new master's state, so
    # the new master has nothing more to hand out while they are invisible.
    via_slave = take(old.endpoint, len(bodies), invisible_s=120)
    assert sorted(m.body for m in via_slave) == bodies
    code, again = receive(new.endpoint, 32, invisible_s=120, poll_s=2)
    assert (pb.Code.Name(code), [m.body for m in again]) == ("MESSAGE_NOT_FOUND", [])

    # An acknowledgement sent through the slave holds on the master: nothing acknowledged
    # comes back once the invisible time (2 s) has passed; what was not acknowledged does.
    assert send(new.endpoint, [b"g-%03d" % i for i in range(10)]) == [pb.OK] * 10
    short = take(old.endpoint, 10, invisible_s=2)
    acked, kept = short[:6], short[6:]
    reply = ack(old.endpoint, acked)
    assert reply.status.code == pb.OK, reply
    assert [e.status.code for e in reply.entries] == [pb.OK] * len(acked)
    again = {m.body for m in take(new.endpoint, len(kept), invisible_s=120)}
    assert again == {m.body for m in kept}
    code, late = receive(new.endpoint, 32, invisible_s=120, poll_s=3)
    assert (pb.Code.Name(code), [m.body for m in late]) == ("MESSAGE_NOT_FOUND", [])


ROOT = ("root", "rootsecret")  # the brokers' own account (aclAccessKey), admin
READER = ("reader", "readersecret")


class SecuredMember(Member):
    def __init__(self, root: Path, etcd: str, broker_id: int, acl: Path) -> None:
        super().__init__(root, etcd, broker_id, extra={
            "aclEnable": "true", "aclFile": str(acl), "aclAccessKey": ROOT[0],
            "aclSecretKey": ROOT[1]})
        MetadataStore(self.store).create_group(GROUP)  # as an admin would

    def cluster(self) -> dict:
        with AdminClient(self.endpoint, timeout=5, access_key=ROOT[0],
                         secret_key=ROOT[1]) as client:
            return client.call_service("stratamq.admin.v1.Replication", "HaStatus")["cluster"]


def signed(account: tuple[str, str]) -> tuple[tuple[str, str], ...]:
    return (*auth_metadata(*account), ("x-mq-client-id", "forward-test-client"))


def test_the_clients_signature_goes_with_a_forwarded_call_and_the_masters_answer_back(
        tmp_path):
    acl = tmp_path / "acl.json"
    acl.write_text(json.dumps({"accounts": [
        {"accessKey": READER[0], "secretKey": READER[1], "defaultTopicPerm": "SUB",
         "defaultGroupPerm": "SUB"}]}))
    etcd = EtcdCluster(tmp_path, size=1)
    group = [SecuredMember(tmp_path, etcd.endpoints, i, acl) for i in (1, 2)]
    try:
        old, new = _start(group)
        switched(etcd.endpoints, old, new)
        producer = Producer(ClientConfiguration(new.endpoint, Credentials(*ROOT)), (TOPIC,))
        producer.startup()
        try:
            for i in range(5):
                producer.send(message(TOPIC, b"s-%d" % i))
        finally:
            producer.shutdown()
        # The reader's signature reaches the master, which checks it: a receive through the
        # old master is served, and the master's refusal of a wrong one comes back as it is.
        code, msgs = receive(old.endpoint, 5, 120, metadata=signed(("reader", "wrong")))
        assert pb.Code.Name(code) == "UNAUTHORIZED"
        msgs = take_signed(old.endpoint, 5)
        assert sorted(m.body for m in msgs) == [b"s-%d" % i for i in range(5)]
        reply = ack(old.endpoint, msgs, metadata=signed(READER))
        assert reply.status.code == pb.OK, reply
        code, late = receive(new.endpoint, 32, 120, poll_s=2, metadata=signed(READER))
        assert (pb.Code.Name(code), late) == ("MESSAGE_NOT_FOUND", [])
    finally:
        for m in group:
            if m.proc is not None and m.proc.poll() is None:
                m.terminate()
        etcd.stop()


def take_signed(endpoint: str, count: int) -> list[pb.Message]:
    got: list[pb.Message] = []

    def enough() -> bool:
        code, msgs = receive(endpoint, count - len(got), 120, metadata=signed(READER))
        assert code in (pb.OK, pb.MESSAGE_NOT_FOUND), pb.Code.Name(code)
        got.extend(msgs)
        return len(got) >= count

    wait_until(enough, timeout=60, what=f"{count} messages received")
    return got


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Slave(service_pb2_grpc.MessagingServiceServicer):
    """A gRPC server whose calls go through forwarding as a slave's do (the real call context:
    the client's metadata and deadline), keeping the refusals it raised."""

    def __init__(self, forwarding: MasterForwarding, target: str) -> None:
        self.forwarding = forwarding
        self.target = target
        self.failures: list[BrokerError] = []

    async def ReceiveMessage(self, request, context):
        try:
            for response in await self.forwarding.receive(request, context, self.target):
                yield response
        except BrokerError as exc:
            self.failures.append(exc)

    async def AckMessage(self, request, context):
        try:
            return await self.forwarding.unary("AckMessage", request, context, self.target)
        except BrokerError as exc:
            self.failures.append(exc)
            return svc.AckMessageResponse()


def test_a_master_that_cannot_be_reached_or_none_at_all_is_a_clear_status():
    endpoint = f"127.0.0.1:{_closed_port()}"

    async def run() -> list[BrokerError]:
        forwarding = MasterForwarding(lambda: endpoint, grpc.aio.insecure_channel, "g")
        slave = _Slave(forwarding, endpoint)
        server = grpc.aio.server()
        service_pb2_grpc.add_MessagingServiceServicer_to_server(slave, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        metadata = (("x-mq-client-id", "c1"),)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = service_pb2_grpc.MessagingServiceStub(channel)
                for target in (endpoint, ""):
                    slave.target = target
                    async for _ in stub.ReceiveMessage(svc.ReceiveMessageRequest(),
                                                       metadata=metadata, timeout=5):
                        pass
                slave.target = endpoint
                await stub.AckMessage(svc.AckMessageRequest(), metadata=metadata, timeout=5)
        finally:
            await forwarding.close()
            await server.stop(None)
        return slave.failures

    unreachable, none, ack_unreachable = asyncio.run(run())
    assert unreachable.code == pb.INTERNAL_SERVER_ERROR
    assert f"connect to {endpoint} failed" in unreachable.message
    assert (none.code, none.message.split(":")[0]) == (pb.FORBIDDEN, "no readable queue")
    assert "has no master" in none.message
    assert ack_unreachable.code == pb.INTERNAL_SERVER_ERROR
    assert ack_unreachable.message.startswith(f"AckMessage: connect to {endpoint} failed")
