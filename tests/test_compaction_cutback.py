"""A slave's CommitLog cut back (``store/replica.py`` ``ReplicaLog.truncate``, as the HA slave
does when it is ahead of its master) cuts the CompactionLogs back too: reading a compaction
topic from the start gives the latest value per key of what the CommitLog still holds (values
that were cut are gone; older versions a round removed in favour of a cut one are back), and
the master's replacement records at the same queue offsets are split out, also after a
restart and a later round."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import uuid

import grpc
import pytest
from compaction_util import (
    TOPIC,
    as_table,
    close,
    compact,
    open_store,
    put,
    read_from,
    small_config,
)
from pulling import pull_queue
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc
from test_broker_harness import PROJECT
from test_ha_processes import Node, Pair
from waiting import wait_until

from stratamq.message import Message
from stratamq.store.message_store import MessageStore


def _put(store: MessageStore, key: str, value: bytes, log: list) -> None:
    result = store.put_message(Message(TOPIC, value, 0, {"KEYS": key}))
    assert result.ok
    log.append((result.physical_offset, key, value))


def _table(log: list, below: int | None = None) -> dict[str, bytes]:
    table: dict[str, bytes] = {}
    for phys, key, value in log:
        if below is not None and phys >= below:
            continue
        if value:
            table[key] = value
        else:
            table.pop(key, None)
    return table


def test_a_cut_back_cuts_the_compaction_log_and_takes_the_replacements(tmp_path):
    config = small_config(tmp_path / "store")
    store, comp = open_store(config)
    log: list = []
    for i in range(400):
        key = f"k{i % 25}"
        _put(store, key, b"" if i % 17 == 0 else b"v%d-" % i + bytes(150), log)
    # A round removes old versions, also ones whose replacement is about to be cut.
    [report] = compact(store, comp)
    assert report.removed > 0
    for i in range(400, 460):  # and some written after the round
        _put(store, f"k{i % 25}", b"w%d" % i, log)
    assert store.wait_dispatched()
    [clog] = comp.queues()
    assert len(clog.segments) > 2

    cut = log[250][0]  # in the compacted files: k0..k24's newest versions there go
    before = store.get_max_offset_in_queue(TOPIC, 0)
    truncation = store.replica.truncate(cut, "test")
    assert truncation.records_cut == 210
    assert store.get_max_offset_in_queue(TOPIC, 0) == before - 210 == 250
    assert clog.next_offset == 250
    assert as_table(read_from(store)) == _table(log, cut)
    assert [m.queue_offset for m in read_from(store)][-1] <= 249

    # The master's records after the cut point: the same queue offsets, new values.
    log = [entry for entry in log if entry[0] < cut]
    for i in range(60):
        _put(store, f"k{(i * 7) % 30}", b"n%d" % i, log)
    assert store.wait_dispatched()
    got = read_from(store)
    assert as_table(got) == _table(log)
    assert [m.queue_offset for m in got if m.queue_offset >= 250] == list(range(250, 310))

    # After a restart (the checkpoint was moved back) and a round, the same table.
    close(store, comp)
    store, comp = open_store(config)
    try:
        assert as_table(read_from(store)) == _table(log)
        compact(store, comp)
        assert as_table(read_from(store)) == _table(log)
        put(store, "k1", b"last")
        assert as_table(read_from(store)) == {**_table(log), "k1": b"last"}
    finally:
        close(store, comp)


def test_a_cut_back_past_every_compacted_record_changes_nothing(tmp_path):
    store, comp = open_store(small_config(tmp_path / "store"))
    try:
        log: list = []
        for i in range(120):
            _put(store, f"k{i % 10}", b"v%d" % i, log)
        compact(store, comp)
        table = as_table(read_from(store))
        end = store.commitlog.max_offset
        _put(store, "other", b"x", log)  # cut below: a record the CompactionLog has too
        assert store.wait_dispatched()
        store.replica.truncate(end, "test")
        assert as_table(read_from(store)) == table
        [clog] = comp.queues()
        assert clog.next_offset == 120
    finally:
        close(store, comp)


def test_a_commitlog_that_lost_its_tail_cuts_the_compaction_log_back_on_open(tmp_path):
    """A power cut loses the CommitLog's tail after the CompactionLog was flushed: the open cuts
    the CompactionLog back to the recovered end, and the records written next at the same queue
    offsets are split out."""
    config = small_config(tmp_path / "store")
    store, comp = open_store(config)
    log: list = []
    for i in range(300):
        _put(store, f"k{i % 20}", b"v%d" % i, log)
    compact(store, comp)
    for i in range(300, 340):
        _put(store, f"k{i % 20}", b"late%d" % i, log)
    close(store, comp)  # the CompactionLog and its checkpoint hold all 340
    cut = log[280][0]
    commitlog = sorted((tmp_path / "store" / "commitlog").iterdir())
    assert len(commitlog) == 1
    with commitlog[0].open("r+b") as f:  # zeros from record 280 on: what the disk kept
        f.seek(cut)
        f.write(bytes(config.mapped_file_size_commit_log - cut))
    store, comp = open_store(config)
    try:
        assert store.get_max_offset_in_queue(TOPIC, 0) == 280
        assert as_table(read_from(store)) == _table(log, cut)
        log = log[:280]
        for i in range(10):
            _put(store, f"new{i}", b"n%d" % i, log)
        assert as_table(read_from(store)) == _table(log)
    finally:
        close(store, comp)


@pytest.fixture
def pair(tmp_path):
    made = Pair(tmp_path)
    yield made
    made.stop()


@pytest.mark.slow
def test_a_slave_ahead_of_a_restarted_master_cuts_its_compaction_topic_back(pair, tmp_path):
    """Real broker processes: a SLAVE (with a POSIX tier it only reads) holds a compaction
    topic, compacted, and 100 records more than its restarted master; after the cut-back and the
    master's new records at the same offsets, the slave serves the master's table."""
    tier = tmp_path / "tier"
    pair.slave = Node(pair.root / "slave", pair.slave_port, brokerRole="SLAVE",
                      haMasterAddress=f"127.0.0.1:{pair.ha_port}",
                      haMasterEndpoint=f"127.0.0.1:{pair.master_port}",
                      tieredBackendServiceProvider="posix", tieredStoreFilePath=str(tier))
    pair.start()
    made = pair.master.cli("topic", "create", "--topic", KV, "--queues", "2",
                           "--attribute", "cleanup.policy=COMPACTION")
    assert made.returncode == 0, made.stderr
    wait_until(lambda: KV in pair.slave.cli("topic", "list").stdout,
               what="the slave to copy the compaction topic")
    channel = grpc.insecure_channel(pair.master.endpoint)
    stub = service_pb2_grpc.MessagingServiceStub(channel)
    kept = [(f"k{i % 40}", b"kept-%d" % i) for i in range(1000)]
    lost = [(f"k{i % 40}", b"lost-%d" % i) for i in range(100)]
    for at in range(0, 1000, 100):
        send_keyed(stub, kept[at : at + 100])
    send_keyed(stub, lost)
    channel.close()
    wait_until(pair.caught_up)

    def slave_queues() -> list[dict]:
        status = pair.slave.cli("compaction", "status")
        return [json.loads(line) for line in status.stdout.splitlines()]

    # Every offset is in the slave's CompactionLogs (its gate may hold a queue back a while).
    wait_until(lambda: sum(q["max_offset"] for q in slave_queues()) == 1100,
               what="the slave's compaction logs")
    # The slave compacts too (this round, or the one its replicator forced): versions it
    # removed in favour of the lost ones must come back.
    done = pair.slave.cli("compaction", "run")
    assert done.returncode == 0, done.stderr
    assert sum(q["messages"] for q in slave_queues()) < 1100
    flush = pair.slave.cli("tier", "flush")
    assert flush.returncode != 0 and "does not upload to the tier" in flush.stderr
    pair.master_loses_tail(100)
    assert pair.slave.ha()["haClientRuntimeInfo"]["lastTruncation"]["records_cut"] == 100
    # Fewer than were cut, on new keys: each must be split out at its queue offset (which the
    # slave's CompactionLog held for a lost record), and the lost values must be gone.
    after = [(f"n{i}", b"after-%d" % i) for i in range(60)]
    channel = grpc.insecure_channel(pair.master.endpoint)
    send_keyed(service_pb2_grpc.MessagingServiceStub(channel), after)
    channel.close()
    wait_until(pair.caught_up)
    want = dict(kept + after)
    wait_until(lambda: table_of(pair.slave.endpoint) == want, what="the slave's table")
    assert table_of(pair.master.endpoint) == want
    # Nothing of the slave's went to the tier (neither raw nor compacted): it is the master's.
    assert [p for p in tier.rglob("*") if p.is_file()] == []
    pair.stop()
    # Stopped, the slave's store reads the same table offline.
    done = subprocess.run([sys.executable, "-m", "stratamq.cli", "store", "dump", "--store",
                           str(pair.slave.store), "--config", str(pair.slave.conf), "--topic",
                           KV], cwd=PROJECT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    dumped = [json.loads(line) for line in done.stdout.splitlines()]
    table: dict[str, bytes] = {}
    for row in dumped:
        table[row["properties"]["KEYS"]] = base64.b64decode(row["body_b64"])
    assert table == want


KV = "Accounts"


def send_keyed(stub, items: list[tuple[str, bytes]]) -> None:
    msgs = []
    for key, body in items:
        sp = pb.SystemProperties(message_id=uuid.uuid4().hex.upper(), keys=[key])
        sp.born_timestamp.GetCurrentTime()
        sp.born_host = "127.0.0.1"
        msgs.append(pb.Message(topic=pb.Resource(name=KV), body=body, system_properties=sp))
    reply = stub.SendMessage(svc.SendMessageRequest(messages=msgs), timeout=30)
    assert [e.status.code for e in reply.entries] == [pb.OK] * len(items), reply


def table_of(endpoint: str) -> dict[str, bytes]:
    """PullMessage from offset 0 of both queues: the latest body per key."""
    return {m.system_properties.keys[0]: m.body for qid in range(2)
            for m in pull_queue(endpoint, KV, qid, group="table-reader", batch_size=256)}
