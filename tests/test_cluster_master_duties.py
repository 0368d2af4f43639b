"""A broker group in controller mode with a tier on S3 (moto_server), between real processes
and a real etcd: what only a master does goes on on the broker elected after a SIGKILL (the tier
uploads from where the old master stopped, a DELAY message is delivered, an open transaction
commits, a compaction topic serves the latest value per key), and an old master woken from
SIGSTOP after the election cannot overwrite the tier metadata the new master wrote."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import grpc
import pytest
from broker_proc import create_topics
from google.protobuf.timestamp_pb2 import Timestamp
from pulling import pull_queue
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc
from s3_server import S3Server
from test_cluster_failover import TTL_MS, Member, _start, stop_all
from waiting import wait_until

from stratamq import record as codec
from stratamq.benchmarks.etcd_members import EtcdCluster
from stratamq.tiered.drivers.object_store import list_parts
from stratamq.tiered.group_metadata import GROUP_METADATA
from stratamq.tiered.naming import broker_config_path, cluster_dir

TOPIC, DELAYED, TRANSACTIONS, ACCOUNTS = "Orders", "Later", "Pay", "Accounts"
QUEUES = 2
GROUP = "g"


def member(root: Path, etcd: str, broker_id: int, s3: S3Server, bucket: str) -> Member:
    """A broker of group ``g`` (``test_cluster_failover.Member``) with a tier on ``s3``, the
    timer and transactions on, and this test's topics."""
    m = Member(root, etcd, broker_id, GROUP, extra={
        "mappedFileSizeCommitLog": str(1 << 20), "timerFlushIntervalMs": "200",
        "transactionCheckInterval": "500", "transactionTimeOut": "600000",
        "tieredBackendServiceProvider": "s3", "tieredStoreFilePath": f"s3://{bucket}/tier",
        "tieredStoreS3Endpoint": s3.endpoint,
        "tieredStoreGroupCommitTimeout": "3600000",  # uploads only on `tier flush`
        "tieredStoreGroupCommitCount": "100000",
        "tieredStoreIndexFileMaxHashSlotNum": "211", "tieredStoreIndexFileMaxIndexNum": "500"})
    create_topics(m.store, [(TOPIC, QUEUES, "NORMAL"), (DELAYED, 1, "DELAY"),
                            (TRANSACTIONS, 1, "TRANSACTION")])
    return m


def tier(m: Member, command: str) -> dict[int, dict]:
    """``tier flush|status`` through ``m``: the rows of this test's topic, by queue."""
    done = cli("tier", command, "--endpoint", m.endpoint)
    return {r["queue_id"]: r for r in map(json.loads, done.stdout.splitlines())
            if r["topic"] == TOPIC}


def cli(*args: str) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "stratamq.cli", *args], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done


@pytest.fixture
def group(tmp_path):
    s3 = S3Server().start()
    fs = s3.filesystem()
    bucket = s3.new_bucket(fs)
    etcd = EtcdCluster(tmp_path, size=1)
    members = [member(tmp_path, etcd.endpoints, i, s3, bucket) for i in (1, 2)]
    yield members, fs, bucket, s3
    stop_all(members, etcd)
    s3.stop()


def message(topic: str, body: bytes, kind: int = pb.NORMAL, keys: tuple[str, ...] = (),
            deliver_ms: int | None = None, props: dict[str, str] | None = None) -> pb.Message:
    sp = pb.SystemProperties(message_id=uuid.uuid4().hex.upper(), born_host="127.0.0.1",
                             message_type=kind, keys=list(keys))
    sp.born_timestamp.GetCurrentTime()
    if deliver_ms is not None:
        sp.delivery_timestamp.CopyFrom(Timestamp(seconds=deliver_ms // 1000,
                                                 nanos=deliver_ms % 1000 * 1_000_000))
    return pb.Message(topic=pb.Resource(name=topic), body=body, system_properties=sp,
                      user_properties=props or {})


def send(endpoint: str, *msgs: pb.Message) -> list[svc.SendResultEntry]:
    with grpc.insecure_channel(endpoint) as channel:
        reply = service_pb2_grpc.MessagingServiceStub(channel).SendMessage(
            svc.SendMessageRequest(messages=list(msgs)), timeout=20)
    assert all(e.status.code == pb.OK for e in reply.entries), reply
    return list(reply.entries)


def order(tag: bytes, j: int) -> bytes:
    return b"%s-%04d " % (tag, j) + b"." * 2500  # 450 of them fill more than one CommitLog file


def bodies(endpoint: str, topic: str, queues: int = QUEUES) -> dict[int, list[bytes]]:
    return {q: [m.body for m in pull_queue(endpoint, topic, q, batch_size=512)]
            for q in range(queues)}


def tier_bodies(fs, bucket: str, queue_id: int) -> list[bytes]:
    """The bodies of a queue's records as the S3 server holds them, in order (every part of
    every tier CommitLog file of the queue)."""
    base = f"{bucket}/tier/{cluster_dir('c1')}/{GROUP}/{TOPIC}/{queue_id}/COMMIT_LOG"
    data = b""
    for name in sorted(fs.ls(base, refresh=True), key=lambda n: int(n.rsplit("/", 1)[1][8:])):
        for position, _size in list_parts(fs, name):
            data += fs.cat_file(f"{name}/{position:020d}")
    out, at = [], 0
    while at < len(data):
        size = int.from_bytes(data[at:at + 4], "big")
        out.append(bytes(codec.decode(data[at:at + size]).body))
        at += size
    return out


def compacted(endpoint: str) -> int:
    """Records kept by a compaction round of the compaction topic run now."""
    rounds = cli("compaction", "run", "--topic", ACCOUNTS, "--endpoint", endpoint).stdout
    return sum(json.loads(line)["kept"] for line in rounds.splitlines())


def group_document(fs, bucket: str) -> dict:
    path = f"{bucket}/tier/{broker_config_path('c1', GROUP, GROUP_METADATA)}"
    fs.invalidate_cache(path)
    return json.loads(fs.cat_file(path))


def test_the_new_master_takes_every_master_duty_over(group):
    members, fs, bucket, _s3 = group
    master, slave = _start(members)
    made = cli("topic", "create", "--topic", ACCOUNTS, "--queues", "1", "--attribute",
               "cleanup.policy=COMPACTION", "--endpoint", master.endpoint)
    for i in range(0, 300, 50):
        send(master.endpoint, *[message(TOPIC, order(b"a", j)) for j in range(i, i + 50)])
    uploaded = tier(master, "flush")
    assert sum(r["tier_committed_offset"] for r in uploaded.values()) == 300
    # Written after the old master's last upload: the new master must upload them.
    send(master.endpoint, *[message(TOPIC, order(b"b", j)) for j in range(100)])
    # An open transaction, versions of keys.
    [half] = send(master.endpoint, message(TRANSACTIONS, b"half", pb.TRANSACTION))
    for version in (1, 2):
        send(master.endpoint, *[message(ACCOUNTS, b"acct-%d v%d" % (k, version),
                                         keys=(f"acct-{k}",)) for k in range(5)])
    assert made.returncode == 0
    # The group's first master never pulled its compaction queue from anyone: it brings it up
    # from its own log and compacts it (the latest value of each of the 5 keys kept).
    wait_until(lambda: compacted(master.endpoint) == 5, timeout=30,
               what="the first master to compact its compaction topic")
    wait_until(lambda: slave.cluster()["masterBrokerId"] == master.broker_id
               and master.cluster()["syncStateSet"] == [1, 2], timeout=30,
               what="the slave to hold everything")
    old_epoch = master.cluster()["epoch"]
    # A DELAY message due after the kill (at least a TTL passes before an election): only
    # the new master can deliver it.
    due = int(time.time() * 1000) + 2 * TTL_MS
    send(master.endpoint, message(DELAYED, b"delayed", pb.DELAY, deliver_ms=due))
    master.kill()
    wait_until(slave.is_writable_master, timeout=60, what="the slave to be elected")
    new = slave

    # The tier: the new master uploads the rest, from where the old one stopped.
    send(new.endpoint, *[message(TOPIC, order(b"c", j)) for j in range(50)])
    flushed = tier(new, "flush")
    local = bodies(new.endpoint, TOPIC)
    for q in range(QUEUES):
        assert flushed[q]["tier_committed_offset"] == len(local[q])
        assert flushed[q]["tier_committed_offset"] > uploaded[q]["tier_committed_offset"]
        # Each message once, in the local order: nothing uploaded twice or out of place.
        assert tier_bodies(fs, bucket, q) == local[q]
    assert sorted(b for q in local.values() for b in q) == sorted(
        [order(b"a", j) for j in range(300)] + [order(b"b", j) for j in range(100)]
        + [order(b"c", j) for j in range(50)])
    assert group_document(fs, bucket)["writerEpoch"] == new.cluster()["epoch"] > old_epoch

    # The DELAY message sent to the old master is delivered by the new one, once.
    wait_until(lambda: bodies(new.endpoint, DELAYED, 1)[0] == [b"delayed"], timeout=60,
               what="the delayed message to be delivered")
    # The open transaction is known to the new master: committed there, it is readable.
    with grpc.insecure_channel(new.endpoint) as channel:
        end = service_pb2_grpc.MessagingServiceStub(channel).EndTransaction(
            svc.EndTransactionRequest(topic=pb.Resource(name=TRANSACTIONS),
                                      message_id=half.message_id,
                                      transaction_id=half.transaction_id,
                                      resolution=pb.COMMIT, source=pb.SOURCE_CLIENT))
    assert end.status.code == pb.OK, end.status
    wait_until(lambda: bodies(new.endpoint, TRANSACTIONS, 1)[0] == [b"half"], timeout=30,
               what="the committed transaction to be readable")
    # The compaction topic: the latest value per key, and a new version lands.
    send(new.endpoint, message(ACCOUNTS, b"acct-0 v3", keys=("acct-0",)))
    latest: dict[str, bytes] = {}
    for m in pull_queue(new.endpoint, ACCOUNTS, 0, batch_size=512):
        latest[m.system_properties.keys[0]] = m.body
    assert latest == {f"acct-{k}": b"acct-%d v%d" % (k, 3 if k == 0 else 2) for k in range(5)}

    # Local clean-up of what the tier holds: every message is still read, from the tier.
    tier(new, "flush")
    cleaned = json.loads(cli("tier", "clean", "--endpoint", new.endpoint).stdout)
    assert cleaned["deleted"]["commitlog"] >= 1, cleaned
    # (Restarted, as after `store clean --tiered-only`: the open moves the local queues' start
    # past the deleted files; the group elects it again, the only member of its SyncStateSet.)
    assert new.terminate() == 0
    new.start()
    wait_until(new.is_writable_master, timeout=60, what="the new master to be elected again")
    assert bodies(new.endpoint, TOPIC) == local


def test_an_old_master_woken_after_the_election_cannot_overwrite_the_tier_metadata(group):
    members, fs, bucket, s3 = group
    master, slave = _start(members)
    send(master.endpoint, *[message(TOPIC, b"a-%04d" % j) for j in range(200)])
    tier(master, "flush")
    first = group_document(fs, bucket)
    assert first["writerEpoch"] == master.cluster()["epoch"]
    # Waiting on the old master when it stops: a flush of them is under way (the tier is
    # down), and it goes on when the process wakes.
    send(master.endpoint, *[message(TOPIC, b"b-%04d" % j) for j in range(100)])
    s3.stop()
    flushing = subprocess.Popen([sys.executable, "-m", "stratamq.cli", "tier", "flush",
                                 "--endpoint", master.endpoint], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    wait_until(lambda: "upload of Orders" in master.log.read_text(), timeout=30,
               what="the old master's upload to fail")
    os.kill(master.proc.pid, signal.SIGSTOP)
    s3.start()
    wait_until(slave.is_writable_master, timeout=60, what="the slave to be elected")
    new_epoch = slave.cluster()["epoch"]
    # The new master uploads what waited (the same records, to the same places, as the old
    # master's stalled flush will) and claims the tier at its epoch.
    flushed = tier(slave, "flush")
    written = group_document(fs, bucket)
    assert written["writerEpoch"] == new_epoch > first["writerEpoch"]
    os.kill(master.proc.pid, signal.SIGCONT)
    # Its flush finishes the upload (identical parts are there already) and writes its
    # metadata, then publishes it at its old epoch: refused, counted, logged.
    wait_until(lambda: "NOT written" in master.log.read_text(), timeout=60,
               what="the old master's publish to be refused")
    flushing.wait(60)
    assert group_document(fs, bucket) == written
    wait_until(lambda: master.cluster()["masterBrokerId"] == slave.broker_id, timeout=60,
               what="the old master to follow the new one")
    send(slave.endpoint, *[message(TOPIC, b"c-%04d" % j) for j in range(50)])
    flushed = tier(slave, "flush")
    after = group_document(fs, bucket)["queueMetadataTable"][TOPIC]
    assert {int(q): m["maxOffset"] for q, m in after.items()} == {
        q: r["tier_committed_offset"] for q, r in flushed.items()}
    local = bodies(slave.endpoint, TOPIC)
    for q in range(QUEUES):
        assert flushed[q]["tier_committed_offset"] == len(local[q])
        assert tier_bodies(fs, bucket, q)[:len(local[q])] == local[q]
