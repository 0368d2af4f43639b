"""Replication between two stores in this process over real sockets on loopback: byte-identical
copies, SYNC_MASTER's answers, a slave ahead of (or diverged from) a restarted master, a slave
the master cannot serve any more. (Separate processes, SIGKILL and a link-cutting proxy are in
test_ha_processes.py.)"""

from __future__ import annotations

import socket
import struct
from pathlib import Path

import pytest
from waiting import wait_until

from stratamq.config import StoreConfig
from stratamq.ha import HAService
from stratamq.ha.epochs import EpochFile
from stratamq.message import Message
from stratamq.store.message_store import MessageStore
from stratamq.store.results import PutMessageStatus

SEGMENT = 256 * 1024


def _config(root: Path, **extra) -> StoreConfig:
    return StoreConfig(store_path_root_dir=str(root), mapped_file_size_commit_log=SEGMENT,
                       mapped_file_size_consume_queue=1000 * 20, ha_send_heartbeat_interval=200,
                       **extra)


class Node:
    def __init__(self, root: Path, **settings) -> None:
        self.root = root
        self.settings = settings
        self.store: MessageStore | None = None
        self.ha: HAService | None = None

    def start(self, **more) -> Node:
        self.settings.update(more)
        self.store = MessageStore(_config(self.root, **self.settings)).open()
        self.ha = HAService.for_store(self.store)
        self.ha.start()
        return self

    def stop(self) -> None:
        if self.ha is not None:
            self.ha.shutdown()
        if self.store is not None:
            self.store.close()
        self.ha = self.store = None

    @property
    def end(self) -> int:
        return self.store.commitlog.max_offset

    def segments(self, upto: int, since: int = 0) -> dict[str, bytes]:
        out = {}
        for f in sorted((self.root / "commitlog").iterdir()):
            start = int(f.name)
            if since <= start < upto:
                out[f.name] = f.read_bytes()[: upto - start]
        return out


def same_log(master: Node, slave: Node) -> bool:
    """The slave's CommitLog files equal the master's, byte for byte, up to the master's end
    (from where the slave's copy starts)."""
    since = slave.store.commitlog.min_offset
    return (slave.end == master.end
            and slave.segments(master.end) == master.segments(master.end, since))


@pytest.fixture
def nodes(tmp_path):
    made: list[Node] = []

    def make(name: str, **settings) -> Node:
        node = Node(tmp_path / name, **settings)
        made.append(node)
        return node

    yield make
    for node in reversed(made):
        node.stop()


def _put(store: MessageStore, n: int, tag: str = "a", batch: int = 10) -> list:
    results = []
    for i in range(0, n, batch):
        msgs = [Message("Ha", (b"%s-%06d|" % (tag.encode(), i + j)) * 40, (i + j) % 4,
                        {"KEYS": f"{tag}{i + j}"}) for j in range(min(batch, n - i))]
        results.append(store.put_messages(msgs))
    return results


def _slave_of(make, master: Node, name: str = "slave", **settings) -> Node:
    return make(name, broker_role="SLAVE",
                ha_master_address=f"127.0.0.1:{master.ha.listen_port}", **settings).start()


def _connected(master: Node) -> bool:
    links = master.ha.server.links
    return bool(links) and links[0].proto.plan is not None


def test_async_master_replicates_byte_identical_and_the_slave_serves_reads(nodes):
    master = nodes("master", ha_listen_port=0, ha_new_slave_transfer_from="MIN_OFFSET").start()
    assert all(r.ok for r in _put(master.store, 3000))  # several segments before the slave
    slave = _slave_of(nodes, master)
    assert all(r.ok for r in _put(master.store, 2000, "b"))
    wait_until(lambda: slave.end == master.end, what="the slave to catch up")
    assert master.end > 4 * SEGMENT
    assert slave.segments(master.end) == master.segments(master.end)
    assert slave.store.wait_dispatched()
    for qid in range(4):
        assert slave.store.get_max_offset_in_queue("Ha", qid) == 1250
    with slave.store.get_messages("g", "Ha", 2, 1249) as got:
        assert got.records[0].decode().body.startswith(b"b-001998|")
    assert slave.store.query_messages("Ha", "a1234")[0].queue_offset == 1234 // 4
    info = master.ha.runtime_info()
    assert info["haConnectionInfo"][0]["diff"] == 0 and info["inSyncSlaveNums"] == 1
    assert slave.ha.runtime_info()["haClientRuntimeInfo"]["maxOffset"] == master.end


def test_a_new_slave_starts_at_the_masters_last_segment_by_default(nodes):
    master = nodes("master", ha_listen_port=0).start()
    _put(master.store, 3000)
    last = master.store.commitlog.files.last().file_from_offset
    assert last >= 2 * SEGMENT
    slave = _slave_of(nodes, master)
    wait_until(lambda: slave.end == master.end)
    assert slave.store.commitlog.min_offset == last
    assert slave.segments(master.end) == {k: v for k, v in master.segments(master.end).items()
                                          if int(k) >= last}


def test_sync_master_answers_as_rocketmq(nodes):
    master = nodes("master", ha_listen_port=0, broker_role="SYNC_MASTER",
                   sync_flush_timeout=300).start()
    # No slave: SLAVE_NOT_AVAILABLE at once, the message stored all the same.
    result = master.store.put_message(Message("Ha", b"alone"))
    assert result.status is PutMessageStatus.SLAVE_NOT_AVAILABLE and result.messages
    # A message that does not wait for the store (WAIT=false) is not held.
    assert master.store.put_message(Message("Ha", b"x", properties={"WAIT": "false"})).ok
    slave = _slave_of(nodes, master)
    wait_until(lambda: _connected(master))
    results = _put(master.store, 200)
    assert all(r.ok for r in results)
    # Every acknowledged byte is on the slave when the put returns.
    assert slave.end >= results[-1].messages[-1].physical_offset
    # A slave that stops acknowledging: FLUSH_SLAVE_TIMEOUT after syncFlushTimeout.
    slave.stop()
    silent = socket.create_connection(("127.0.0.1", master.ha.listen_port))
    try:
        silent.sendall(struct.pack(">q", master.end))
        wait_until(lambda: _connected(master))
        result = master.store.put_message(Message("Ha", b"unacked"))
        assert result.status is PutMessageStatus.FLUSH_SLAVE_TIMEOUT
        # It timed out for want of an acknowledgement, not for want of a slave: the silent
        # slave is connected and in sync, and no slave acknowledged nothing up to the put's end.
        stored = result.messages[-1]
        links = master.ha.runtime_info()["haConnectionInfo"]
        assert any(link["inSync"] for link in links)
        assert all(link["slaveAckOffset"] < stored.physical_offset + stored.size
                   for link in links)
    finally:
        silent.close()


def test_a_slave_too_far_behind_is_not_in_sync(nodes):
    master = nodes("master", ha_listen_port=0, broker_role="SYNC_MASTER",
                   ha_max_gap_not_in_sync=SEGMENT).start()
    # A slave that asks for offset 0 and never acknowledges, with the master far ahead.
    _put(master.store, 1)
    silent = socket.create_connection(("127.0.0.1", master.ha.listen_port))
    try:
        silent.sendall(struct.pack(">q", 0))
        wait_until(lambda: _connected(master))
        big = [Message("Ha", b"z" * 60_000) for _ in range(8)]
        result = master.store.put_messages(big)
        assert result.status is PutMessageStatus.SLAVE_NOT_AVAILABLE
    finally:
        silent.close()


def wait_for_truncation(slave: Node) -> dict:
    def cut() -> dict | None:
        return slave.ha.runtime_info()["haClientRuntimeInfo"]["lastTruncation"]

    wait_until(lambda: cut() is not None, what="the slave to cut its log back")
    return cut()


def _cut_log(root: Path, offset: int) -> None:
    """What a master that lost its tail looks like on disk: zeros from ``offset`` on."""
    for f in sorted((root / "commitlog").iterdir()):
        start = int(f.name)
        if start >= offset + SEGMENT - offset % SEGMENT:
            f.unlink()
        elif start <= offset < start + SEGMENT:
            with f.open("r+b") as fh:
                fh.seek(offset - start)
                fh.write(bytes(start + SEGMENT - offset))


def test_a_slave_ahead_of_a_restarted_master_cuts_back_and_says_what_it_cut(nodes):
    master = nodes("master", ha_listen_port=0).start()
    _put(master.store, 1000)
    slave = _slave_of(nodes, master)
    wait_until(lambda: slave.end == master.end)
    port = master.ha.listen_port
    cut = _put(master.store, 1, "cut")[0].messages[0].physical_offset
    _put(master.store, 99, "lost")
    wait_until(lambda: slave.end == master.end)
    ahead = slave.end
    master.stop()
    _cut_log(master.root, cut)  # the master lost its last 100 messages
    master.start(ha_listen_port=port)
    assert master.end == cut
    truncation = wait_for_truncation(slave)
    assert slave.end == cut
    assert truncation["offset"] == cut and truncation["previous_end"] == ahead
    assert truncation["records_cut"] == 100 and truncation["dropped_units"] == 100
    # The slave's own epoch file records the cut.
    assert EpochFile(slave.root / "epochFileCheckpoint").offsets()[-1] == cut
    _put(master.store, 50, "new")
    wait_until(lambda: slave.end == master.end)
    assert same_log(master, slave)
    assert slave.store.wait_dispatched()
    assert slave.store.get_max_offset_in_queue("Ha", 0) == master.store.get_max_offset_in_queue(
        "Ha", 0)


def test_a_slave_whose_bytes_differ_after_the_masters_new_life_is_cut_at_the_epoch(nodes):
    """The master lost a tail and wrote past the slave's end before the slave came back: the
    slave's offset looks fine, but its bytes after the master's epoch start are another story."""
    master = nodes("master", ha_listen_port=0).start()
    _put(master.store, 1000)
    slave = _slave_of(nodes, master)
    cut = _put(master.store, 1, "cut")[0].messages[0].physical_offset
    _put(master.store, 99, "lost")
    wait_until(lambda: slave.end == master.end)
    slave_end = slave.end
    slave.stop()
    port = master.ha.listen_port
    master.stop()
    _cut_log(master.root, cut)
    master.start(ha_listen_port=port)
    assert master.ha.runtime_info()["epochs"][-1]["startOffset"] == cut
    _put(master.store, 300, "other")  # a new life, longer than what the slave holds
    assert master.end > slave_end
    slave.start()
    truncation = wait_for_truncation(slave)
    wait_until(lambda: slave.end == master.end, what="the diverged slave to converge")
    assert same_log(master, slave)
    assert truncation["offset"] == cut and truncation["records_cut"] == 100
    assert slave.store.wait_dispatched()
    with slave.store.get_messages("g", "Ha", 0, 250) as got:
        assert b"other" in got.records[0].decode().body


def test_a_slave_behind_the_masters_retention_says_it_needs_a_new_copy(nodes):
    master = nodes("master", ha_listen_port=0).start()
    _put(master.store, 200)
    slave = _slave_of(nodes, master)
    wait_until(lambda: slave.end == master.end)
    held = slave.end
    slave.stop()
    _put(master.store, 3000)
    assert master.store.wait_dispatched()
    master.store.flush()
    master.store.cleanup.run_once(force=True)
    assert master.store.commitlog.min_offset > held
    slave.start()
    wait_until(lambda: "no longer holds" in slave.ha.runtime_info()[
        "haClientRuntimeInfo"]["lastError"], what="the gap to be reported")
    assert slave.end < master.store.commitlog.min_offset  # nothing was appended after a gap
