"""Replication between real broker processes on loopback (``stratamq broker start`` with
``brokerRole``): 100,000 messages copied byte for byte, SYNC_MASTER killed with SIGKILL under
load losing no acknowledged message, a slave killed and restarted, a link cut and healed by a
proxy, a slave ahead of a master that lost its tail, and the official client consuming from the
slave while the master is down."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import grpc
import pytest
from broker_proc import create_topics, free_port
from damage import records
from pulling import pull_queue
from rocketmq import ClientConfiguration, Credentials, FilterExpression, Producer, SimpleConsumer
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc
from test_broker_harness import BrokerProcess, create_topic, message
from waiting import wait_until

from stratamq.client.admin import AdminClient, AdminError

SEGMENT = 4 * 1024 * 1024
TOPIC = "Repl"
QUEUES = 4
BASE_CONF = {
    "mappedFileSizeCommitLog": str(SEGMENT),
    "mappedFileSizeConsumeQueue": str(50_000 * 20),
    "minInvisibleTimeMillsForRecv": "1000",
    "haSendHeartbeatInterval": "300",
    "haHousekeepingInterval": "3000",
    "haStateSyncInterval": "300",
    "grpcThreadPoolNums": "32",
}


class Node(BrokerProcess):
    """A broker process with a fixed client port and replication settings."""

    def __init__(self, store: Path, port: int, **settings: str) -> None:
        conf = "".join(f"{k}={v}\n" for k, v in {**BASE_CONF, **settings}.items())
        super().__init__(store, conf, listen=f"127.0.0.1:{port}")

    def ha(self) -> dict:
        with AdminClient(self.endpoint) as client:
            return client.call_service("stratamq.admin.v1.Replication", "HaStatus")

    def max_offset(self) -> int:
        info = self.ha()
        return (info["masterCommitLogMaxOffset"] if info["master"]
                else info["haClientRuntimeInfo"]["maxOffset"])

    def messages(self) -> int:
        """The topic's message count; 0 on a slave whose state sync has not copied the topic
        yet (a fresh slave copies it once its HA link has taken the master's lineage)."""
        with AdminClient(self.endpoint) as client:
            try:
                return client.call("TopicStatus", topic=TOPIC)["messages"]
            except AdminError as exc:
                if "NOT_FOUND" not in str(exc):
                    raise
                return 0


class Pair:
    def __init__(self, root: Path, master_role: str = "ASYNC_MASTER", **master_settings: str):
        self.root = root
        self.ha_port = free_port()
        self.master_port = free_port()
        self.slave_port = free_port()
        create_topics(root / "master", [(TOPIC, QUEUES, "NORMAL")])
        self.master = Node(root / "master", self.master_port, brokerRole=master_role,
                           haListenPort=str(self.ha_port), **master_settings)
        self.slave = self.make_slave(self.ha_port)

    def make_slave(self, ha_port: int) -> Node:
        return Node(self.root / "slave", self.slave_port, brokerRole="SLAVE",
                    haMasterAddress=f"127.0.0.1:{ha_port}",
                    haMasterEndpoint=f"127.0.0.1:{self.master_port}")

    def start(self) -> Pair:
        self.master.start()
        self.slave.start()
        wait_until(lambda: self.master.ha()["haConnectionInfo"], what="the slave to connect")
        return self

    def master_loses_tail(self, lost: int) -> int:
        """The master stops and its last ``lost`` records never reached its disk (a power cut,
        not a process kill, loses the page cache): zeros from the first of them on. Restarted,
        once the slave has cut its log back; returns the CommitLog offset of the cut."""
        self.master.kill()
        seg, pos, _ = records(self.master.store)[-lost]
        with seg.open("r+b") as f:
            f.seek(pos)
            f.write(bytes(SEGMENT - pos))
        self.master.start()
        wait_until(lambda: self.slave.ha()["haClientRuntimeInfo"]["lastTruncation"] is not None,
                   what="the slave to cut its log back")
        return int(seg.name) + pos

    def caught_up(self) -> bool:
        return self.slave.max_offset() == self.master.max_offset()

    def stop(self) -> None:
        for node in (self.slave, self.master):
            if node.proc is not None and node.proc.poll() is None:
                node.terminate()


@pytest.fixture
def pairs(tmp_path):
    made: list[Pair] = []

    def make(*args, **kwargs) -> Pair:
        pair = Pair(tmp_path, *args, **kwargs)
        made.append(pair)
        return pair

    yield make
    for pair in made:
        pair.stop()


def send_batch(stub, bodies: list[bytes], topic: str = TOPIC) -> list[svc.SendResultEntry]:
    msgs = []
    for body in bodies:
        sp = pb.SystemProperties(message_id=uuid.uuid4().hex.upper(), keys=[body[:16].hex()])
        sp.born_timestamp.GetCurrentTime()
        sp.born_host = "127.0.0.1"
        msgs.append(pb.Message(topic=pb.Resource(name=topic), body=body, system_properties=sp))
    reply = stub.SendMessage(svc.SendMessageRequest(messages=msgs), timeout=30)
    return list(reply.entries)


def pull_all(endpoint: str, topic: str = TOPIC) -> dict[bytes, tuple[int, int]]:
    """Every message of ``topic`` on the broker at ``endpoint``: body -> (queue, offset)."""
    return {m.body: (qid, m.system_properties.queue_offset) for qid in range(QUEUES)
            for m in pull_queue(endpoint, topic, qid, batch_size=512)}


def commitlog_bytes(store: Path, start: int, end: int) -> bytes:
    out = bytearray()
    for f in sorted((store / "commitlog").iterdir()):
        base = int(f.name)
        if base + SEGMENT <= start or base >= end:
            continue
        data = f.read_bytes()
        out += data[max(0, start - base): min(SEGMENT, end - base)]
    return bytes(out)


def assert_same_log(pair: Pair) -> int:
    """The slave's CommitLog equals the master's byte for byte, from where the slave's copy
    starts to the slave's end (both stopped). Returns that end."""
    slave_files = sorted((pair.slave.store / "commitlog").iterdir())
    start = int(slave_files[0].name)
    end = max(int(f.name) + len(f.read_bytes().rstrip(b"\0")) for f in slave_files)
    got = commitlog_bytes(pair.slave.store, start, end)
    want = commitlog_bytes(pair.master.store, start, end)
    assert len(got) == len(want) == end - start
    assert got == want
    return end


def test_100k_messages_replicated_byte_identical(pairs):
    pair = pairs(haNewSlaveTransferFrom="MIN_OFFSET").start()
    channel = grpc.insecure_channel(pair.master.endpoint)
    stub = service_pb2_grpc.MessagingServiceStub(channel)
    sent = 0
    while sent < 100_000:
        entries = send_batch(stub, [b"m%06d|" % i + b"x" * (i % 300)
                                    for i in range(sent, sent + 500)])
        assert all(e.status.code == pb.OK for e in entries)
        sent += 500
    channel.close()
    wait_until(pair.caught_up, what="the slave to catch up")
    wait_until(lambda: pair.slave.messages() == 100_000, what="the slave to dispatch")
    assert pair.master.max_offset() > 3 * SEGMENT
    pair.stop()
    end = assert_same_log(pair)
    assert end == max(int(f.name) + len(f.read_bytes().rstrip(b"\0"))
                      for f in (pair.master.store / "commitlog").iterdir())


def test_sync_master_killed_under_load_loses_no_acknowledged_message(pairs):
    pair = pairs("SYNC_MASTER").start()
    acked: list[bytes] = []
    failed: list[str] = []
    stop = threading.Event()

    def produce(worker: int) -> None:
        with grpc.insecure_channel(pair.master.endpoint) as channel:
            stub = service_pb2_grpc.MessagingServiceStub(channel)
            i = 0
            while not stop.is_set():
                bodies = [b"w%d-%06d-%d" % (worker, i, j) for j in range(5)]
                i += 1
                try:
                    entries = send_batch(stub, bodies)
                except grpc.RpcError as exc:
                    failed.append(str(exc.code()))
                    time.sleep(0.05)
                    continue
                for body, entry in zip(bodies, entries):
                    if entry.status.code == pb.OK:
                        acked.append(body)
                    else:
                        failed.append(pb.Code.Name(entry.status.code))

    workers = [threading.Thread(target=produce, args=(w,)) for w in range(4)]
    for w in workers:
        w.start()
    wait_until(lambda: len(acked) >= 2000, what="2,000 acknowledged sends")
    pair.master.kill()  # mid-stream: requests are in flight
    wait_until(lambda: bool(failed), what="a producer to see the master gone")
    stop.set()
    for w in workers:
        w.join(30)
    wait_until(lambda: pair.slave.messages() >= len(acked), what="the slave to dispatch")
    on_slave = pull_all(pair.slave.endpoint)
    missing = [b for b in acked if b not in on_slave]
    assert missing == [], f"{len(missing)} of {len(acked)} acknowledged messages not on the slave"


def test_a_killed_slave_restarts_and_catches_up(pairs):
    metrics_port = free_port()
    pair = pairs(metricsExporterType="PROM", metricsPromExporterPort=str(metrics_port)).start()
    channel = grpc.insecure_channel(pair.master.endpoint)
    stub = service_pb2_grpc.MessagingServiceStub(channel)
    send_batch(stub, [b"before-%d" % i for i in range(2000)])
    wait_until(pair.caught_up)
    pair.slave.kill()
    for k in range(10):
        send_batch(stub, [b"while-down-%d-%d" % (k, i) for i in range(1000)])
    pair.slave.start()
    wait_until(pair.caught_up, what="the restarted slave to catch up")
    wait_until(lambda: pair.slave.messages() == 12_000)
    channel.close()
    # What an operator sees: ha status on both sides, and the lag gauges at zero.
    status = pair.master.cli("ha", "status")
    assert status.returncode == 0, status.stderr
    master = json.loads(status.stdout)
    assert master["master"] and master["inSyncSlaveNums"] == 1
    assert [c["diff"] for c in master["haConnectionInfo"]] == [0]
    slave = json.loads(pair.slave.cli("ha", "status").stdout)
    assert slave["haClientRuntimeInfo"]["maxOffset"] == master["masterCommitLogMaxOffset"]
    assert slave["haClientRuntimeInfo"]["state"] == "TRANSFER" and slave["masterReachable"]
    scrape = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics").read().decode()
    lag = [line for line in scrape.splitlines()
           if line.startswith("stratamq_replication_lag_bytes{")]
    assert len(lag) == 1 and lag[0].endswith(" 0.0")
    pair.stop()
    assert_same_log(pair)


class LinkProxy:
    """A TCP proxy on loopback that can cut every connection it carries and refuse new ones
    until healed: the replication link's network failing and coming back."""

    def __init__(self, target_port: int) -> None:
        self.target = ("127.0.0.1", target_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.up = True
        self.socks: list[socket.socket] = []
        self.lock = threading.Lock()
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if not self.up:
                client.close()
                continue
            try:
                server = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self.lock:
                self.socks += [client, server]
                self.connections += 1
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        self.up = False
        with self.lock:
            socks, self.socks = self.socks, []
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def heal(self) -> None:
        self.up = True

    def close(self) -> None:
        self.cut()
        self.listener.close()


def test_the_link_cut_and_healed(pairs):
    pair = pairs("SYNC_MASTER", syncFlushTimeout="500")
    proxy = LinkProxy(pair.ha_port)
    pair.slave = pair.make_slave(proxy.port)
    try:
        pair.start()
        channel = grpc.insecure_channel(pair.master.endpoint)
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        assert all(e.status.code == pb.OK for e in send_batch(stub, [b"a%d" % i
                                                                    for i in range(500)]))
        proxy.cut()
        wait_until(lambda: not pair.master.ha()["haConnectionInfo"], what="the cut to be seen")
        # With no slave a SYNC_MASTER stores the message and answers HA_NOT_AVAILABLE.
        entries = send_batch(stub, [b"during-cut-%d" % i for i in range(300)])
        assert {pb.Code.Name(e.status.code) for e in entries} == {"HA_NOT_AVAILABLE"}
        assert pair.slave.ha()["haClientRuntimeInfo"]["state"] == "READY"
        proxy.heal()
        wait_until(pair.caught_up, what="the slave to catch up after the heal")
        assert proxy.connections >= 2
        assert all(e.status.code == pb.OK for e in send_batch(stub, [b"b%d" % i
                                                                    for i in range(500)]))
        wait_until(lambda: pair.slave.messages() == 1300)
        channel.close()
        pair.stop()
        assert_same_log(pair)
    finally:
        proxy.close()


def test_a_slave_ahead_of_a_restarted_master_cuts_back(pairs):
    pair = pairs().start()
    channel = grpc.insecure_channel(pair.master.endpoint)
    stub = service_pb2_grpc.MessagingServiceStub(channel)
    send_batch(stub, [b"kept-%d" % i for i in range(1000)])
    send_batch(stub, [b"lost-%d" % i for i in range(100)])
    wait_until(pair.caught_up)
    ahead = pair.slave.max_offset()
    channel.close()
    cut = pair.master_loses_tail(100)
    info = pair.slave.ha()["haClientRuntimeInfo"]
    assert info["lastTruncation"]["offset"] == cut
    assert info["lastTruncation"]["previous_end"] == ahead
    assert info["lastTruncation"]["records_cut"] == 100
    channel = grpc.insecure_channel(pair.master.endpoint)
    stub = service_pb2_grpc.MessagingServiceStub(channel)
    send_batch(stub, [b"after-%d" % i for i in range(300)])
    channel.close()
    wait_until(pair.caught_up)
    wait_until(lambda: pair.slave.messages() == 1300)
    on_slave = pull_all(pair.slave.endpoint)
    assert not any(b.startswith(b"lost-") for b in on_slave)
    assert sum(b.startswith(b"after-") for b in on_slave) == 300
    pair.stop()
    assert_same_log(pair)


def test_the_official_client_consumes_from_the_slave_while_the_master_is_down(pairs):
    pair = pairs().start()
    producer = Producer(ClientConfiguration(pair.master.endpoint, Credentials(),
                                            request_timeout=10), (TOPIC,))
    producer.startup()
    try:
        sent = [producer.send(message(TOPIC, b"official-%d" % i)).message_id
                for i in range(30)]
    finally:
        producer.shutdown()
    wait_until(pair.caught_up)
    # The topic table is copied by the state sync (haStateSyncInterval), not with the bytes.
    wait_until(lambda: slave_topic_known(pair), what="the slave to copy the topic")
    assert slave_route(pair) == ({pair.master.endpoint}, {"READ_WRITE"})
    pair.master.kill()
    wait_until(lambda: not pair.slave.ha()["masterReachable"], what="the master to be missed")
    # Broker id 0, read-only: consumers read from the slave, producers find nothing to write.
    assert slave_route(pair) == ({pair.slave.endpoint}, {"READ"})
    both = f"{pair.master.endpoint};{pair.slave.endpoint}"
    consumer = SimpleConsumer(ClientConfiguration(both, Credentials(), request_timeout=10),
                              "slave-readers", {TOPIC: FilterExpression()})
    consumer.startup()
    try:
        got = []
        deadline = time.monotonic() + 60
        while len(got) < len(sent) and time.monotonic() < deadline:
            for m in consumer.receive(16, 15):
                got.append(m.message_id)
                consumer.ack(m)
        assert sorted(got) == sorted(sent)
    finally:
        consumer.shutdown()
    assert pair.slave.ha()["masterReachable"] is False
    # The master returns: the slave's routes send clients back to it.
    pair.master.start()
    wait_until(lambda: pair.slave.ha()["masterReachable"], what="the slave to see its master")
    assert slave_route(pair) == ({pair.master.endpoint}, {"READ_WRITE"})


def slave_topic_known(pair: Pair) -> bool:
    with grpc.insecure_channel(pair.slave.endpoint) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        reply = stub.QueryRoute(svc.QueryRouteRequest(topic=pb.Resource(name=TOPIC)),
                                timeout=10)
    return reply.status.code != pb.TOPIC_NOT_FOUND


def slave_route(pair: Pair) -> tuple[set[str], set[str]]:
    """The endpoints and permissions the slave's QueryRoute answers for the topic."""
    with grpc.insecure_channel(pair.slave.endpoint) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        reply = stub.QueryRoute(svc.QueryRouteRequest(topic=pb.Resource(name=TOPIC)),
                                timeout=10)
    assert reply.status.code == pb.OK, reply.status
    return ({f"{a.host}:{a.port}" for q in reply.message_queues
             for a in q.broker.endpoints.addresses},
            {pb.Permission.Name(q.permission) for q in reply.message_queues})


def _slave_topics(pair: Pair) -> set[str]:
    return {json.loads(line)["topic"] for line in pair.slave.cli("topic", "list").stdout.split()}


def test_a_slave_deletes_a_topic_only_when_its_master_deleted_it(pairs):
    """A master restarted over an empty configuration directory no longer lists the topic, but
    nobody deleted it: the slave copies the configuration and keeps the messages (the copy
    people fall back to). A deletion made on the master removes the slave's queues too."""
    pair = pairs().start()

    def slave_holds(count: int) -> bool:
        try:
            return pair.slave.messages() == count
        except AdminError:  # the slave has not copied the topic (yet, or again) from its master
            return False

    with grpc.insecure_channel(pair.master.endpoint) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        assert all(e.status.code == pb.OK
                   for e in send_batch(stub, [b"kept-%d" % i for i in range(20)]))
    wait_until(lambda: slave_holds(20), what="the slave to dispatch")

    pair.master.terminate()
    (pair.master.store / "config" / "topics.json").unlink()
    pair.master.start()
    wait_until(lambda: TOPIC not in _slave_topics(pair), what="the slave to copy the config")
    create_topic(pair.master, TOPIC, QUEUES)
    wait_until(lambda: TOPIC in _slave_topics(pair), what="the topic back on the slave")
    assert pair.slave.messages() == 20
    assert sorted(pull_all(pair.slave.endpoint)) == sorted(b"kept-%d" % i for i in range(20))

    assert pair.master.cli("topic", "delete", "--topic", TOPIC).returncode == 0
    create_topic(pair.master, TOPIC, QUEUES)
    wait_until(lambda: slave_holds(0), what="the deletion to reach the slave")
    assert pull_all(pair.slave.endpoint) == {}
