"""A controller-mode master that crashes and restarts holds dispatch at the confirm offset its
checkpoint kept (RocketMQ's ``confirmPhyOffset``): a tail only it holds, which its group never
confirmed and the new master's log does not have, is read by no consumer at the restarted
broker, neither before its role is known nor after it follows the new master and cuts the tail
off. (Read there, a consumer would commit an offset past it and skip the message the new
master puts at that offset.) Every acknowledged message stays readable.

Real processes: one etcd member, a master and a slave broker; the slave is SIGKILLed and the
master takes a put it cannot confirm, then the master is SIGKILLed; the slave restarts and is
elected, then is frozen (SIGSTOP) while the old master restarts (so that one cannot reach its
new master, and the tail stays in its log), then woken."""

from __future__ import annotations

import os
import signal
import uuid

import grpc
import pytest
from killing import sigkill
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc
from test_cluster_failover import TOPIC, _start, assert_all_readable, one_etcd_pair, readable
from waiting import wait_until

from stratamq.client.admin import SERVICE, AdminClient

# The dead slave must stay in the SyncStateSet until the master is killed (else the master
# acknowledges alone and the put is confirmed): its lease outlasts the put's wait.
SETTINGS = {"etcdLeaseTtlMs": "8000", "haMaxTimeSlaveNotCatchup": "600000",
            "syncFlushTimeout": "1000"}


@pytest.fixture
def pair(tmp_path):
    yield from one_etcd_pair(tmp_path, SETTINGS)


def send_one(endpoint: str, body: bytes) -> tuple[int, str]:
    """Send ``body``; its status code and its message id (the unique key a query finds)."""
    msg_id = uuid.uuid4().hex.upper()
    sp = pb.SystemProperties(message_id=msg_id)
    sp.born_timestamp.GetCurrentTime()
    sp.born_host = "127.0.0.1"
    msg = pb.Message(topic=pb.Resource(name=TOPIC), body=body, system_properties=sp)
    with grpc.insecure_channel(endpoint) as channel:
        reply = service_pb2_grpc.MessagingServiceStub(channel).SendMessage(
            svc.SendMessageRequest(messages=[msg]), timeout=10)
    return reply.entries[0].status.code, msg_id


def found_by_id(endpoint: str, msg_id: str) -> bool:
    """Whether the broker's message query (``mqadmin queryMsgById``) finds ``msg_id``."""
    with AdminClient(endpoint, timeout=10) as client:
        reply = client.call_service(SERVICE, "QueryMessage", topic=TOPIC, msg_id=msg_id)
    return bool(reply["messages"])


def test_a_restarted_master_never_serves_the_tail_its_group_did_not_confirm(pair):
    master, slave = _start(pair)
    acked: dict[bytes, str] = {}
    for i in range(6):
        code, _ = send_one(master.endpoint, b"confirmed-%d" % i)
        assert code == pb.OK
        acked[b"confirmed-%d" % i] = "old master"
    assert_all_readable(master.endpoint, acked)
    assert master.proc is not None and slave.proc is not None
    # The slave dies (killed, not frozen: a frozen one would still find the record in its
    # socket's buffer when woken), still a member of the SyncStateSet: the put waits for it
    # and is refused, the record in the master's log only. Then the master dies.
    sigkill(slave.proc)
    slave.proc.stdout.close()
    code, tail_id = send_one(master.endpoint, b"unconfirmed")
    assert code != pb.OK, "a put no slave got was acknowledged"
    sigkill(master.proc)
    master.proc.stdout.close()
    # The slave returns and is elected (the only live member of the SyncStateSet).
    slave.start()
    wait_until(slave.is_writable_master, timeout=60, what="the slave to be elected")

    # The new master frozen: the old one restarts with the tail in its log and cannot reach
    # the master it must follow (nor be elected: it is not in the SyncStateSet).
    os.kill(slave.proc.pid, signal.SIGSTOP)
    try:
        master.start()
        assert_all_readable(master.endpoint, acked)
        assert b"unconfirmed" not in readable(master.endpoint)
        assert not found_by_id(master.endpoint, tail_id)
    finally:
        os.kill(slave.proc.pid, signal.SIGCONT)

    # Woken, the new master takes puts; the old one follows it, its tail cut off.
    wait_until(slave.is_writable_master, timeout=60, what="the new master to take puts")
    for i in range(3):
        code, _ = send_one(slave.endpoint, b"after-%d" % i)
        assert code == pb.OK
        acked[b"after-%d" % i] = "new master"
    wait_until(lambda: master.cluster()["masterBrokerId"] == slave.broker_id, timeout=60,
               what="the old master to follow the new one")
    assert_all_readable(master.endpoint, acked)
    assert_all_readable(slave.endpoint, acked)
    on_old = readable(master.endpoint)
    assert b"unconfirmed" not in on_old
    assert not found_by_id(master.endpoint, tail_id)
    # Each message at the same queue offset on both: the old master serves the new one's log.
    assert on_old == readable(slave.endpoint)
