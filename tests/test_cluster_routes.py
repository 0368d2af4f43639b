"""One route table across a cluster's broker groups (issue 28): real etcd, real broker
processes in controller mode, the official Python client given one endpoint; and the
NameServer answering from the same table (issue 30)."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
from pathlib import Path

import grpc
import pytest
from broker_proc import create_topics, free_port
from pulling import pull_queue
from remoting_env import invoke, start_namesrv
from rocketmq import FilterExpression, Producer, SimpleConsumer
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc
from test_broker_harness import BrokerProcess, config, message, receive_until
from test_cluster_failover import Member as FailoverMember
from waiting import wait_until

from stratamq.benchmarks.etcd_members import EtcdCluster
from stratamq.remoting.codes import RequestCode, ResponseCode

TOPIC = "Routed"
QUEUES = 2
TTL_MS = 3000


class Member(FailoverMember):
    """A broker of group ``group`` in controller mode, with a remoting port (NameServers)."""

    def __init__(self, root: Path, etcd: str, group: str, broker_id: int,
                 remoting_port: int | None = None) -> None:
        self.group, self.broker_id = group, broker_id
        self.port, self.ha_port = free_port(), free_port()
        self.remoting_port = free_port() if remoting_port is None else remoting_port
        store = root / f"{group}-b{broker_id}"
        create_topics(store, [(TOPIC, QUEUES, "NORMAL")])
        settings = {
            "mappedFileSizeCommitLog": str(4 << 20), "mappedFileSizeConsumeQueue": "200000",
            "minInvisibleTimeMillsForRecv": "1000",
            "enableControllerMode": "true", "etcdEndpoints": etcd, "brokerName": group,
            "brokerClusterName": "c1", "brokerId": str(broker_id),
            "etcdLeaseTtlMs": str(TTL_MS), "haListenPort": str(self.ha_port),
            "remotingListenPort": str(self.remoting_port),
            "haSendHeartbeatInterval": "300", "haHousekeepingInterval": "3000",
            "haStateSyncInterval": "300", "grpcThreadPoolNums": "16"}
        BrokerProcess.__init__(self, store, "".join(f"{k}={v}\n" for k, v in settings.items()),
                               listen=f"127.0.0.1:{self.port}")


def route(endpoint: str) -> list[pb.MessageQueue]:
    with grpc.insecure_channel(endpoint) as channel:
        reply = service_pb2_grpc.MessagingServiceStub(channel).QueryRoute(
            svc.QueryRouteRequest(topic=pb.Resource(name=TOPIC)), timeout=10)
    assert reply.status.code == pb.OK, reply.status
    return list(reply.message_queues)


def masters(queues: list[pb.MessageQueue]) -> dict[str, str]:
    """group -> the endpoint its writable broker-id-0 queues name."""
    out = {}
    for q in queues:
        if q.broker.id == 0 and q.permission == pb.READ_WRITE:
            a = q.broker.endpoints.addresses[0]
            out[q.broker.name] = f"{a.host}:{a.port}"
    return out


def start(members: list[Member]) -> None:
    for m in members:
        m.start()
    groups = {m.group for m in members}
    wait_until(lambda: {m.group for m in members if m.is_writable_master()} == groups,
               timeout=60, what="a master in every group")


@pytest.fixture
def etcd(tmp_path):
    cluster = EtcdCluster(tmp_path, size=1)
    yield cluster
    cluster.stop()


def _stop(members: list[Member]) -> None:
    for m in members:
        if m.proc is not None and m.proc.poll() is None:
            m.terminate()


@pytest.fixture
def two_groups(tmp_path, etcd):
    # Group b's remoting port is bound at start (0): announced once known.
    members = [Member(tmp_path, etcd.endpoints, "a", 1),
               Member(tmp_path, etcd.endpoints, "b", 1, remoting_port=0)]
    start(members)
    yield members
    _stop(members)


def test_one_endpoint_reaches_every_group(two_groups):
    a, b = two_groups
    expected = {"a": a.endpoint, "b": b.endpoint}
    # Every broker answers for the whole cluster, once the other group's topics are in etcd.
    for m in two_groups:
        wait_until(lambda m=m: masters(route(m.endpoint)) == expected, timeout=30,
                   what=f"{m.endpoint}'s route to name both groups' masters")
    queues = route(b.endpoint)
    # Interleaved across groups: a send retried on the route's next queue changes group.
    assert [q.broker.name for q in queues] == ["a", "b", "a", "b"]
    # A push consumer's assignments: one per group, at its master.
    with grpc.insecure_channel(b.endpoint) as channel:
        reply = service_pb2_grpc.MessagingServiceStub(channel).QueryAssignment(
            svc.QueryAssignmentRequest(topic=pb.Resource(name=TOPIC),
                                       group=pb.Resource(name="RoutedReaders")), timeout=10)
    assert reply.status.code == pb.OK, reply.status
    assert masters([a.message_queue for a in reply.assignments]) == expected
    assert [a.message_queue.id for a in reply.assignments] == [-1, -1]
    producer = Producer(config(a.endpoint), (TOPIC,))  # group a's endpoint only
    producer.startup()
    try:
        receipts = [producer.send(message(TOPIC, b"m-%d" % i)) for i in range(24)]
    finally:
        producer.shutdown()
    on_group: dict[str, set[str]] = {}
    for r in receipts:
        on_group.setdefault(r.message_queue.message_queue0().broker.name, set()).add(r.message_id)
    assert set(on_group) == {"a", "b"}
    for group, ids in on_group.items():  # each stored on its own group's broker
        stored = {m.system_properties.message_id for qid in range(QUEUES)
                  for m in pull_queue(expected[group], TOPIC, qid, batch_size=256)}
        assert ids <= stored
    consumer = SimpleConsumer(config(b.endpoint), "RoutedReaders",  # group b's endpoint only
                              {TOPIC: FilterExpression("*")}, await_duration=1)
    consumer.startup()
    try:
        got = receive_until(consumer, len(receipts), deadline_s=30)
    finally:
        consumer.shutdown()
    assert sorted(m.message_id for m in got) == sorted(r.message_id for r in receipts)


def routed(namesrv: str) -> dict | None:
    got = invoke(namesrv, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": TOPIC})
    return json.loads(got.body) if got.code == ResponseCode.SUCCESS else None


def test_every_namesrv_on_etcd_routes_every_group(two_groups, etcd):
    a, b = two_groups
    assert b.proc is not None and b.proc.stdout is not None
    lines = [b.proc.stdout.readline() for _ in range(2)]  # replication's, then remoting's
    b_remoting = re.search(r"remoting \(RocketMQ 4.x clients\) on port (\d+)", "".join(lines))
    assert b_remoting, lines
    want = {"a": {"0": f"127.0.0.1:{a.remoting_port}"},
            "b": {"0": f"127.0.0.1:{b_remoting.group(1)}"}}
    # Two NameServers, neither registered with by any broker.
    servers = [start_namesrv("--etcd", etcd.endpoints, "--cluster", "c1") for _ in range(2)]
    try:
        for ns in servers:
            wait_until(lambda ns=ns: (r := routed(ns.address)) is not None and {
                d["brokerName"]: d["brokerAddrs"] for d in r["brokerDatas"]} == want,
                timeout=30, what=f"NameServer {ns.address} to route both groups")
            r = routed(ns.address)
            assert r is not None
            assert sorted((q["brokerName"], q["readQueueNums"], q["writeQueueNums"], q["perm"])
                          for q in r["queueDatas"]) == [("a", 2, 2, 6), ("b", 2, 2, 6)]
            info = invoke(ns.address, RequestCode.GET_BROKER_CLUSTER_INFO)
            assert info.code == ResponseCode.SUCCESS
            doc = json.loads(info.body)
            assert doc["clusterAddrTable"] == {"c1": ["a", "b"]}
            assert {n: d["brokerAddrs"] for n, d in doc["brokerAddrTable"].items()} == want
    finally:
        for ns in servers:
            ns.stop()


def test_a_killed_master_loses_no_acknowledged_send_and_routes_follow(tmp_path, etcd):
    a1, a2 = (Member(tmp_path, etcd.endpoints, "a", i) for i in (1, 2))
    b = Member(tmp_path, etcd.endpoints, "b", 1)
    members = [a1, a2, b]
    try:
        start(members)
        a_master = next(m for m in (a1, a2) if m.is_writable_master())
        a_slave = a2 if a_master is a1 else a1
        wait_until(lambda: a_master.cluster()["syncStateSet"] == [1, 2], timeout=60,
                   what="group a's slave to join its SyncStateSet")
        for m in (b, a_slave):  # a slave answers for the whole cluster too
            wait_until(lambda m=m: masters(route(m.endpoint)) == {"a": a_master.endpoint,
                                                                  "b": b.endpoint},
                       timeout=30, what=f"{m.endpoint}'s route to name both masters")
        slaves = {(q.broker.name, q.broker.id, q.permission) for q in route(b.endpoint)
                  if q.broker.id != 0}
        assert slaves == {("a", a_slave.broker_id, pb.READ)}  # a slave: readable only
        acked: dict[str, str] = {}  # message id -> group
        failed: list[str] = []
        stop = threading.Event()

        def produce() -> None:
            producer = Producer(config(b.endpoint), (TOPIC,))  # one endpoint
            producer.startup()
            i = 0
            try:
                while not stop.is_set():
                    i += 1
                    try:
                        r = producer.send(message(TOPIC, b"p-%d" % i))
                    except Exception as exc:  # noqa: BLE001 - counted and shown
                        failed.append(f"{type(exc).__name__}: {exc}")
                        continue
                    acked[r.message_id] = r.message_queue.message_queue0().broker.name
            finally:
                producer.shutdown()

        thread = threading.Thread(target=produce, daemon=True)
        thread.start()
        wait_until(lambda: sorted(set(acked.values())) == ["a", "b"] and len(acked) >= 60,
                   timeout=60, what="sends acknowledged by both groups")
        a_master.kill()
        count = len(acked)
        # The client's sends to the dead master fail; each is retried on group b.
        wait_until(lambda: len(acked) >= count + 60, timeout=60,
                   what="sends acknowledged after the kill")
        wait_until(a_slave.is_writable_master, timeout=60, what="a's slave to be elected")
        # The next route query names the new master.
        wait_until(lambda: masters(route(b.endpoint)) == {"a": a_slave.endpoint,
                                                         "b": b.endpoint},
                   timeout=30, what="the route to follow the failover")
        stop.set()
        thread.join(60)
        assert not failed, failed[:5]
        readable = {m.system_properties.message_id: group
                    for group, at in (("a", a_slave.endpoint), ("b", b.endpoint))
                    for qid in range(QUEUES)
                    for m in pull_queue(at, TOPIC, qid, batch_size=512)}
        missing = [mid for mid in acked if mid not in readable]
        assert not missing, f"{len(missing)} of {len(acked)} acknowledged sends lost"
        assert all(readable[mid] == group for mid, group in acked.items())
    finally:
        for m in members:
            if m.proc is not None and m.proc.poll() is None:
                os.kill(m.proc.pid, signal.SIGCONT)
        _stop(members)
