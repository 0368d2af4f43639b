"""Compaction topics on a slave, rebuilt by message-based replication (seed 001) between real
broker processes on loopback: the master writes versions and tombstones and compacts; a fresh
slave whose byte copy starts at the master's last CommitLog segment still reads, from offset
0, exactly the master's compacted queue; killed and restarted after more writes and another
compaction, it resumes pulling from where its own CompactionLog ends."""

from __future__ import annotations

import json
import uuid

import pytest
from broker_proc import free_port
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from test_broker_harness import raw_stub
from test_ha_processes import Node
from waiting import wait_until

from stratamq import record as codec
from stratamq.ha.message_replication import GrpcPullSource

pytestmark = pytest.mark.slow

TOPIC = "Accounts"
QUEUES = 2
KEYS = 60
SETTINGS = {
    "mappedFileSizeCommitLog": str(1024 * 1024),  # several segments: the slave gets the last
    "maxMessageSize": str(64 * 1024),
    "compactionMappedFileSize": str(256 * 1024),
    "haNewSlaveTransferFrom": "LAST_SEGMENT",
}


def send(node: Node, versions: range, deleted: set[int], model: dict[str, bytes | None]) -> None:
    """Every key once per version (800-byte values), then a tombstone for the keys in
    ``deleted``; ``model`` becomes the latest value per key (None: deleted)."""
    channel, stub = raw_stub(node)
    with channel:
        def put(key: str, body: bytes, props: dict[str, str]) -> None:
            sp = pb.SystemProperties(message_id=uuid.uuid4().hex.upper(), keys=[key])
            sp.born_timestamp.GetCurrentTime()
            msg = pb.Message(topic=pb.Resource(name=TOPIC), body=body, system_properties=sp,
                             user_properties=props)
            reply = stub.SendMessage(svc.SendMessageRequest(messages=[msg]), timeout=30)
            assert reply.status.code == pb.OK, reply.status

        for version in versions:
            for k in range(KEYS):
                body = (b"acct-%d v%d " % (k, version)).ljust(800, b".")
                put(f"acct-{k}", body, {})
                model[f"acct-{k}"] = body
        for k in sorted(deleted):
            put(f"acct-{k}", b"-", {"TOMBSTONE": "true"})
            model[f"acct-{k}"] = None


def read_from_start(node: Node) -> list[tuple[int, int, str, bytes]]:
    """(queue, offset, key, body) of every message of the topic, each queue from offset 0."""
    source = GrpcPullSource(node.endpoint, group="test-reader")
    out = []
    try:
        for qid in range(QUEUES):
            offset = 0
            while True:
                records, nxt = source.pull(TOPIC, qid, offset, 256)
                for raw in records:
                    m = codec.decode(raw)
                    out.append((qid, m.queue_offset, m.properties["KEYS"], bytes(m.body)))
                if nxt <= offset:
                    break
                offset = nxt
    finally:
        source.close()
    return out


def latest(rows: list[tuple[int, int, str, bytes]]) -> dict[str, bytes | None]:
    table: dict[str, bytes | None] = {}
    for _q, _o, key, body in rows:
        table[key] = None if body == b"-" else body
    return table


def compact(node: Node) -> list[dict]:
    done = node.cli("compaction", "run", "--topic", TOPIC)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def replication(node: Node) -> dict:
    return node.ha()["compactionReplication"]


def test_a_slave_rebuilds_a_compaction_topic_by_pulling_and_resumes_after_a_kill(tmp_path):
    ha_port, master_port, slave_port = free_port(), free_port(), free_port()
    master = Node(tmp_path / "master", master_port, brokerRole="ASYNC_MASTER",
                  haListenPort=str(ha_port), **SETTINGS)

    def make_slave() -> Node:
        return Node(tmp_path / "slave", slave_port, brokerRole="SLAVE",
                    haMasterAddress=f"127.0.0.1:{ha_port}",
                    haMasterEndpoint=f"127.0.0.1:{master_port}", **SETTINGS)

    slave = make_slave()
    model: dict[str, bytes | None] = {}
    master.start()
    try:
        made = master.cli("topic", "create", "--topic", TOPIC, "--queues", str(QUEUES),
                          "--attribute", "cleanup.policy=COMPACTION")
        assert made.returncode == 0, made.stderr
        send(master, range(40), {3, 17, 42}, model)  # 2,403 records, ~2 MB
        rounds = compact(master)
        assert sum(r["kept"] for r in rounds) == KEYS  # latest values and 3 tombstones
        on_master = read_from_start(master)
        assert latest(on_master) == model and len(on_master) == KEYS

        slave.start()
        wait_until(lambda: (len(replication(slave)["queues"]) == QUEUES and all(
            q["state"] == "DONE" for q in replication(slave)["queues"])),
            what="the slave to pull the compaction topic")
        wait_until(lambda: slave.max_offset() == master.max_offset(), what="the byte copy")
        # The byte copy started at the master's last segment: the older versions were never
        # on the slave's CommitLog, yet its queue from offset 0 is the master's, record for
        # record (no duplicate from its own dispatch of what it copied).
        slave_log = sorted((tmp_path / "slave" / "commitlog").iterdir())
        assert int(slave_log[0].name) > 0
        rows = replication(slave)["queues"]
        assert [r["from"] for r in rows] == [0, 0]
        assert sum(r["pulled"] for r in rows) == KEYS
        assert read_from_start(slave) == on_master

        # Written after the pull: the slave's own dispatch of its copied CommitLog carries on.
        send(master, range(40, 42), set(), model)
        wait_until(lambda: slave.max_offset() == master.max_offset(), what="the byte copy")
        wait_until(lambda: latest(read_from_start(slave)) == model, what="dispatch on the slave")

        slave.kill()
        send(master, range(42, 50), {5, 6}, model)
        compact(master)
        on_master = read_from_start(master)
        assert latest(on_master) == model

        slave = make_slave()
        slave.start()
        wait_until(lambda: (len(replication(slave)["queues"]) == QUEUES and all(
            q["state"] == "DONE" for q in replication(slave)["queues"])),
            what="the restarted slave to pull")
        rows = replication(slave)["queues"]
        # Resumed where its CompactionLog ended (its saved offset), not from 0.
        assert all(r["from"] > 0 for r in rows), rows
        assert sum(r["pulled"] for r in rows) > 0
        # Its forced round compacted what it held with what it pulled: equal to the master.
        wait_until(lambda: read_from_start(slave) == on_master, what="the slave's round")
    finally:
        for node in (slave, master):
            if node.proc is not None and node.proc.poll() is None:
                node.terminate()
