"""A broker group in controller mode between real processes: 3 etcd members (Debian's
etcd-server on loopback), a master and a slave broker (``enableControllerMode``); one etcd
member killed, the master SIGKILLed or SIGSTOPped past its lease, a planned switch (the
official client producing throughout, and consuming through the kill and the switch): every
acknowledged message stays readable and no two brokers acknowledge writes as master.
Partitions and failsafe mode: test_cluster_partition.py."""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from broker_proc import create_topics, free_port
from cluster_traffic import Acked, OfficialConsumer, OfficialProducer
from pulling import pull_queue
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc
from test_broker_harness import BrokerProcess
from waiting import wait_until

from stratamq.benchmarks.etcd_members import EtcdCluster
from stratamq.client.admin import AdminClient, AdminError

TOPIC = "Fail"
QUEUES = 2
TTL_MS = 3000


class Member(BrokerProcess):
    def __init__(self, root: Path, etcd: str, broker_id: int, group: str = "g",
                 host: str = "127.0.0.1", extra: dict[str, str] | None = None,
                 command_prefix: tuple[str, ...] = ()) -> None:
        self.broker_id = broker_id
        self.etcd: EtcdCluster | None = None
        self.port, self.ha_port = free_port(), free_port()
        store = root / f"{group}-b{broker_id}"
        create_topics(store, [(TOPIC, QUEUES, "NORMAL")])
        settings = {
            "mappedFileSizeCommitLog": str(4 << 20), "mappedFileSizeConsumeQueue": "200000",
            "enableControllerMode": "true", "etcdEndpoints": etcd, "brokerName": group,
            "brokerClusterName": "c1", "brokerId": str(broker_id),
            "etcdLeaseTtlMs": str(TTL_MS), "haListenPort": str(self.ha_port),
            "haSendHeartbeatInterval": "300", "haHousekeepingInterval": "3000",
            "haStateSyncInterval": "300", "grpcThreadPoolNums": "16",
            "minInvisibleTimeMillsForRecv": "1000", **(extra or {})}
        super().__init__(store, "".join(f"{k}={v}\n" for k, v in settings.items()),
                         listen=f"{host}:{self.port}", command_prefix=command_prefix)

    def cluster(self) -> dict:
        with AdminClient(self.endpoint, timeout=5) as client:
            return client.call_service("stratamq.admin.v1.Replication", "HaStatus")["cluster"]

    def is_writable_master(self) -> bool:
        try:
            return bool(self.cluster()["writable"])
        except (AdminError, OSError, grpc.RpcError):
            return False


def send(endpoint: str, bodies: list[bytes],
         connect: Callable[[str], grpc.Channel] = grpc.insecure_channel) -> list[int]:
    """Send ``bodies`` in one request (on a channel ``connect`` makes); the status code of
    each."""
    return [code for code, _ in send_replies(endpoint, bodies, connect)]


def send_replies(endpoint: str, bodies: list[bytes],
                 connect: Callable[[str], grpc.Channel] = grpc.insecure_channel
                 ) -> list[tuple[int, str]]:
    """Send ``bodies`` in one request; the status code and message of each."""
    msgs = []
    for body in bodies:
        sp = pb.SystemProperties(message_id=uuid.uuid4().hex.upper())
        sp.born_timestamp.GetCurrentTime()
        sp.born_host = "127.0.0.1"
        msgs.append(pb.Message(topic=pb.Resource(name=TOPIC), body=body, system_properties=sp))
    with connect(endpoint) as channel:
        reply = service_pb2_grpc.MessagingServiceStub(channel).SendMessage(
            svc.SendMessageRequest(messages=msgs), timeout=10)
    return [(e.status.code, e.status.message) for e in reply.entries]


def readable_ids(endpoint: str) -> dict[str, list[tuple[int, int]]]:
    """Message id -> every (queue, offset) it is readable at, at ``endpoint``: more than one
    when a send's first attempt was stored but not acknowledged (a put that timed out waiting
    for its slave, which kept it) and the client sent it again."""
    found: dict[str, list[tuple[int, int]]] = {}
    for qid in range(QUEUES):
        for m in pull_queue(endpoint, TOPIC, qid, batch_size=512):
            found.setdefault(m.system_properties.message_id, []).append(
                (qid, m.system_properties.queue_offset))
    return found


def assert_readable_where_acked(endpoint: str, acked: dict[str, Acked]) -> None:
    """Every message the official client had acknowledged is readable at ``endpoint``, by
    its id, at the offset its receipt named: a message acknowledged by a master whose log was
    later cut (two masters at once) would be missing or elsewhere. (Not the receipt's queue:
    the gRPC answer carries none, and the client names the queue it picked, while the broker
    picks its own, round robin.) A copy elsewhere besides (an unacknowledged earlier attempt
    of the same send) is at-least-once delivery, not a loss."""
    wrong: list[str] = []

    def all_there() -> bool:
        on_broker = readable_ids(endpoint)
        wrong[:] = [f"{i} {a.body!r} acked at offset {a.offset} via {a.endpoint}, read at "
                    f"(queue, offset) {on_broker.get(i)}" for i, a in acked.items()
                    if a.offset not in {off for _, off in on_broker.get(i, [])}]
        return not wrong

    try:
        wait_until(all_there, timeout=30, what="every acknowledged message", interval=0.5)
    except AssertionError:
        raise AssertionError(f"{len(wrong)} of {len(acked)} acknowledged messages are not "
                             f"readable where acknowledged at {endpoint}: {wrong[:5]}") from None


def readable(endpoint: str) -> dict[bytes, tuple[int, int]]:
    return {m.body: (qid, m.system_properties.queue_offset) for qid in range(QUEUES)
            for m in pull_queue(endpoint, TOPIC, qid, batch_size=512)}


def assert_all_readable(endpoint: str, acked: dict[bytes, str]) -> None:
    """Every acknowledged message is readable at ``endpoint`` once its dispatch caught up."""
    missing: list[bytes] = []

    def none_missing() -> bool:
        on_broker = readable(endpoint)
        missing[:] = [b for b in acked if b not in on_broker]
        return not missing

    try:
        wait_until(none_missing, timeout=30, what="every acknowledged message", interval=0.5)
    except AssertionError:
        by = sorted({acked[b] for b in missing})
        raise AssertionError(f"{len(missing)} of {len(acked)} acknowledged messages are not "
                             f"readable at {endpoint} (acknowledged by {by}): "
                             f"{sorted(missing)[:10]}") from None


def stop_all(members: list[Member], etcd: EtcdCluster) -> None:
    """End the brokers (woken first: a frozen one cannot stop) and then etcd."""
    for m in members:
        if m.proc is not None and m.proc.poll() is None:
            os.kill(m.proc.pid, signal.SIGCONT)
            m.terminate()
    etcd.stop()


def one_etcd_pair(tmp_path: Path, extra: dict[str, str]) -> Iterator[list[Member]]:
    """For a fixture: one etcd member and two brokers of group ``g`` with ``extra`` settings,
    all stopped after the test."""
    etcd = EtcdCluster(tmp_path, size=1)
    members = [Member(tmp_path, etcd.endpoints, i, extra=extra) for i in (1, 2)]
    yield members
    stop_all(members, etcd)


@pytest.fixture
def group(tmp_path):
    etcd = EtcdCluster(tmp_path, size=3)
    members = [Member(tmp_path, etcd.endpoints, i) for i in (1, 2)]
    for m in members:
        m.etcd = etcd
    yield members
    stop_all(members, etcd)


def _start(group: list[Member]) -> tuple[Member, Member]:
    for m in group:
        m.start()
    wait_until(lambda: any(m.is_writable_master() for m in group), timeout=60,
               what="a master to be elected")
    master = next(m for m in group if m.is_writable_master())
    slave = next(m for m in group if m is not master)
    wait_until(lambda: slave.cluster()["masterBrokerId"] == master.broker_id, timeout=60,
               what="the slave to follow the master")
    # Caught up, the slave joins the SyncStateSet: from then on it may be elected.
    wait_until(lambda: master.cluster()["syncStateSet"] == [1, 2], timeout=60,
               what="the slave to join the SyncStateSet")
    return master, slave


def _traffic(master: Member, slave: Member, group: str
             ) -> tuple[OfficialProducer, OfficialConsumer]:
    """The official client producing and consuming, entering through either broker (a failed
    call moves it to a fresh client, which queries the route again); 100 sends acknowledged."""
    endpoints = [master.endpoint, slave.endpoint]
    producer = OfficialProducer(endpoints, TOPIC)
    consumer = OfficialConsumer(endpoints, TOPIC, group, invisible_s=3)
    producer.start()
    consumer.start()
    wait_until(lambda: len(producer.acked) >= 100, timeout=60, what="100 acknowledged sends")
    return producer, consumer


def test_a_killed_masters_slave_is_elected_and_keeps_every_acknowledged_message(group):
    master, slave = _start(group)
    epoch = master.cluster()["epoch"]
    producer, consumer = _traffic(master, slave, "cg-failover")
    # One etcd member of three dies (the first, which every broker asks first): nothing
    # changes, the master keeps its lease through the others.
    assert master.etcd is not None
    master.etcd.members[0].stop(signal.SIGKILL)
    count = len(producer.acked)
    wait_until(lambda: len(producer.acked) >= count + 100, timeout=60,
               what="100 more acknowledged sends")
    assert master.cluster()["epoch"] == epoch and master.is_writable_master()
    wait_until(lambda: consumer.received, timeout=60, what="the consumer to receive")
    master.kill()
    wait_until(slave.is_writable_master, timeout=60, what="the slave to be elected")
    assert slave.cluster()["epoch"] > epoch
    count = len(producer.acked)
    wait_until(lambda: len(producer.acked) > count + 50, timeout=60,
               what="sends acknowledged by the new master")
    producer.finish()
    assert_readable_where_acked(slave.endpoint, producer.acked)
    # The consumer, now on the new master, gets every acknowledged message (at least once).
    wait_until(lambda: not set(producer.acked) - consumer.received, timeout=45,
               what="the consumer to receive every acknowledged message")
    consumer.finish()


def test_a_master_stopped_past_its_lease_refuses_writes_on_waking_and_follows(group):
    master, slave = _start(group)
    producer = OfficialProducer([master.endpoint, slave.endpoint], TOPIC)
    producer.start()
    wait_until(lambda: len(producer.acked) >= 100, timeout=60, what="100 acknowledged sends")
    os.kill(master.proc.pid, signal.SIGSTOP)
    stopped_at = len(producer.acked)
    wait_until(slave.is_writable_master, timeout=60, what="the slave to be elected")
    wait_until(lambda: len(producer.acked) > stopped_at, timeout=60,
               what="sends acknowledged by the new master")
    os.kill(master.proc.pid, signal.SIGCONT)
    # On waking the old master refuses before it appends: its fence has lapsed, or (if its
    # loop ran first and found its lease gone) it is a slave already. Never SYNC_MASTER's
    # late SLAVE_NOT_AVAILABLE, which comes after the bytes were appended.
    [(code, why)] = send_replies(master.endpoint, [b"after-wake"])
    assert code != pb.OK
    assert any(reason in why for reason in (
        "etcd lease", "not its group's elected master", "broker role is SLAVE")), why
    wait_until(lambda: master.cluster()["masterBrokerId"] == slave.broker_id, timeout=60,
               what="the old master to follow the new one")
    assert not master.cluster()["writable"]
    producer.finish()
    # Each acknowledged id at its receipt's offset, on the new master and, once it has
    # copied the new master's log again, on the old one: no offset was given twice.
    assert_readable_where_acked(slave.endpoint, producer.acked)
    assert_readable_where_acked(master.endpoint, producer.acked)


def _cli(*args: str) -> list[dict]:
    import json
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "stratamq.cli", "cluster", *args],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for line in r.stdout.splitlines()]


def test_status_lines_and_a_planned_switch_under_load(group, tmp_path):
    master, slave = _start(group)
    etcd = group[0].conf.read_text().split("etcdEndpoints=")[1].split("\n")[0]
    by_etcd = _cli("status", "--etcd", etcd, "--cluster", "c1")
    assert len(by_etcd) == 1
    line = by_etcd[0]
    assert list(line) == ["cluster", "brokerName", "masterBrokerId", "masterEpoch",
                          "syncStateSet", "brokers"]
    assert (line["cluster"], line["brokerName"], line["masterBrokerId"], line["syncStateSet"]) \
        == ("c1", "g", master.broker_id, [1, 2])
    assert [list(b) for b in line["brokers"]] == [
        ["brokerId", "endpoint", "role", "maxOffset", "leaseAgeMs"]] * 2
    assert {b["endpoint"]: b["role"] for b in line["brokers"]} == {
        master.endpoint: "MASTER", slave.endpoint: "SLAVE"}
    by_broker = _cli("status", "--endpoint", slave.endpoint)
    assert [(g["masterBrokerId"], g["masterEpoch"]) for g in by_broker] == [
        (line["masterBrokerId"], line["masterEpoch"])]

    producer, consumer = _traffic(master, slave, "cg-switch")
    wait_until(lambda: consumer.received, timeout=60, what="the consumer to receive")
    switched = _cli("elect", "--broker-name", "g", "--broker-id", str(slave.broker_id),
                    "--etcd", etcd, "--cluster", "c1")
    assert switched[0]["masterBrokerId"] == slave.broker_id
    assert switched[0]["masterEpoch"] > line["masterEpoch"]
    # The old master refuses writes from the switch on: what is acknowledged now, the new
    # master acknowledged.
    assert not master.cluster()["writable"]
    wait_until(lambda: master.cluster()["masterBrokerId"] == slave.broker_id, timeout=60,
               what="the old master to follow the new one")
    followed = time.monotonic()
    count = len(producer.acked)
    wait_until(lambda: len(producer.acked) > count + 100, timeout=60,
               what="sends acknowledged after the switch")
    producer.finish()
    # Each acknowledged id at its receipt's offset on the new master and, once it follows,
    # on the old one: nothing acknowledged was lost, no offset was given by both masters.
    assert_readable_where_acked(slave.endpoint, producer.acked)
    wait_until(lambda: master.cluster()["masterBrokerId"] == slave.broker_id, timeout=60,
               what="the old master to follow the new one")
    assert_readable_where_acked(master.endpoint, producer.acked)
    wait_until(lambda: not set(producer.acked) - consumer.received, timeout=45,
               what="the consumer to receive every acknowledged message")
    consumer.finish()
    # Its route still names the old master for up to 30 s: that broker, now a slave, sends
    # the receives and acknowledgements to the new master (a slave serving them from its own
    # copy of the pop state delivered hundreds again, each many times), and the new master
    # copied the old one's state once more before taking over (else what was acknowledged
    # after its last periodic copy came back once): nothing acknowledged OK comes back.
    assert not consumer.repeats, (
        f"{len(consumer.repeats)} deliveries of {len(set(consumer.repeats))} messages "
        f"already acknowledged OK, {sum(consumer.acked[i] > followed for i in consumer.repeats)}"
        f" of them acknowledged after the switch (of {len(consumer.acked)} acknowledged)")


def test_all_of_etcd_down_stops_writes_not_reads_and_no_election(group):
    master, slave = _start(group)
    epoch = master.cluster()["epoch"]
    acked = {}
    for i in range(20):
        body = b"before-%d" % i
        assert send(master.endpoint, [body]) == [pb.OK]
        acked[body] = master.endpoint
    assert master.etcd is not None
    for member in master.etcd.members:
        member.stop(signal.SIGKILL)
    # Once its renewal is overdue the master refuses writes (it cannot know whether another
    # broker was elected); nobody else is elected meanwhile.
    wait_until(lambda: send_replies(master.endpoint, [b"during"])[0][0] != pb.OK, timeout=60,
               what="the master to refuse writes without etcd")
    [(_, why)] = send_replies(master.endpoint, [b"during"])
    assert "etcd lease" in why, why
    assert not slave.is_writable_master()
    assert_all_readable(master.endpoint, acked)  # reads go on
    assert_all_readable(slave.endpoint, acked)
    initial = ",".join(f"{m.name}={m.peer_url}" for m in master.etcd.members)
    for member in master.etcd.members:
        member.start(initial)
    master.etcd.wait_healthy()
    # etcd back: the same master renews its lease (etcd extends leases across its own
    # restart) and takes writes again, at the same epoch.
    wait_until(lambda: send(master.endpoint, [b"after"]) == [pb.OK], timeout=60,
               what="writes to resume on the master")
    assert master.cluster()["epoch"] == epoch
    assert not slave.is_writable_master()


def test_topic_create_on_every_group_of_the_cluster(tmp_path):
    etcd = EtcdCluster(tmp_path, size=1)
    brokers = [Member(tmp_path, etcd.endpoints, 1, group) for group in ("ga", "gb")]
    try:
        for b in brokers:
            b.start()
        for b in brokers:
            wait_until(b.is_writable_master, timeout=60, what=f"{b.store.name} to be master")
        import json
        import subprocess
        import sys

        r = subprocess.run([sys.executable, "-m", "stratamq.cli", "topic", "create", "--topic",
                            "Everywhere", "--queues", "3", "--cluster", "c1", "--endpoint",
                            brokers[0].endpoint], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        lines = [json.loads(line) for line in r.stdout.splitlines()]
        assert [(line["brokerName"], line["endpoint"]) for line in lines] == [
            ("ga", brokers[0].endpoint), ("gb", brokers[1].endpoint)]
        for b in brokers:  # a send to the topic is taken by each group's master
            assert send_to(b.endpoint, "Everywhere") == pb.OK
    finally:
        for b in brokers:
            if b.proc is not None and b.proc.poll() is None:
                b.terminate()
        etcd.stop()


def send_to(endpoint: str, topic: str) -> int:
    sp = pb.SystemProperties(message_id=uuid.uuid4().hex.upper())
    sp.born_timestamp.GetCurrentTime()
    sp.born_host = "127.0.0.1"
    msg = pb.Message(topic=pb.Resource(name=topic), body=b"x", system_properties=sp)
    with grpc.insecure_channel(endpoint) as channel:
        reply = service_pb2_grpc.MessagingServiceStub(channel).SendMessage(
            svc.SendMessageRequest(messages=[msg]), timeout=10)
    return reply.entries[0].status.code
