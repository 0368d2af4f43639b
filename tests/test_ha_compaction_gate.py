"""A slave's compaction gate and pull loop do not get stuck: after a cut-back (the slave was
ahead of a restarted master) a closed queue opens once the pull reaches the master's end, and a
queue whose held-back records the master does not serve yet waits for the next pass instead of
keeping every other queue closed. The slave is a real store with its compaction store behind
the gate the broker plugs in (``plug_compaction``); the master is a real store read through a
stand-in for its PullMessage (as the HA tests pull from a local source)."""

from __future__ import annotations

import dataclasses
import threading

from compaction_util import HOUR, TOPIC, as_table, put, read_from, small_config
from waiting import wait_until

from stratamq.broker.replication import plug_compaction
from stratamq.compaction.policy import StaticPolicies, TopicPolicy
from stratamq.config import BrokerRole
from stratamq.ha.message_replication import CompactionReplicator
from stratamq.message import Message
from stratamq.store.message_store import MessageStore

POLICIES = StaticPolicies({TOPIC: TopicPolicy(HOUR)})


class StorePull:
    """The master's PullMessage for raw records, answered by a real store."""

    def __init__(self, store: MessageStore) -> None:
        self.store = store

    def pull(self, topic: str, queue_id: int, offset: int, max_count: int
             ) -> tuple[list[bytes], int]:
        with self.store.get_messages("ha", topic, queue_id, offset, max_count) as result:
            return [bytes(r.buffer) for r in result.records], result.next_begin_offset


class Slave:
    def __init__(self, root) -> None:
        config = small_config(root)
        self.store = MessageStore(config)
        slave_config = dataclasses.replace(config, broker_role=BrokerRole.SLAVE,
                                           enable_compaction=True)
        self.comp, self.gate = plug_compaction(self.store, slave_config, POLICIES)
        assert self.comp is not None and self.gate is not None
        self.store.open()

    def close(self) -> None:
        self.store.close()
        self.comp.close()


def pass_in_thread(rep: CompactionReplicator, source: StorePull) -> None:
    """One replicator pass; fails (and stops it) if it does not end."""
    thread = threading.Thread(target=rep.pass_once, args=(source,), daemon=True)
    thread.start()
    try:
        wait_until(lambda: not thread.is_alive(), timeout=60, what="the pass to end")
    finally:
        if thread.is_alive():
            rep._stop.set()
        thread.join(30)


def offsets_and_bodies(store: MessageStore, queue_id: int) -> list[tuple[int, bytes]]:
    return [(m.queue_offset, m.body) for m in read_from(store, queue_id=queue_id)]


def test_a_closed_queue_opens_after_a_cut_back_below_what_it_held(tmp_path):
    master = MessageStore(small_config(tmp_path / "master"))
    master.open()
    slave = Slave(tmp_path / "slave")
    try:
        for node, q0 in ((master, 6), (slave.store, 11)):
            for i in range(3):
                put(node, f"b{i}", b"q1-%d" % i, queue_id=1)
            for i in range(q0):
                put(node, f"a{i % 4}", b"q0-%d" % i, queue_id=0)
        assert slave.store.wait_dispatched() and master.wait_dispatched()
        # The slave held back queue 0's offsets 0..10; the master (restarted, its tail lost)
        # ends at 6: the slave cuts its log back to the master's end.
        with slave.store.get_messages("x", TOPIC, 0, 6, 1) as at6:
            cut = at6.records[0].physical_offset
        assert slave.store.replica.truncate(cut, "test").records_cut == 5
        rep = CompactionReplicator(slave.gate, slave.comp, lambda: StorePull(master),
                                   lambda: [(TOPIC, 0), (TOPIC, 1)])
        pass_in_thread(rep, StorePull(master))
        assert slave.gate.is_open(TOPIC, 0) and slave.gate.is_open(TOPIC, 1)
        assert rep.progress[(TOPIC, 0)]["state"] == "DONE"
        assert offsets_and_bodies(slave.store, 1) == offsets_and_bodies(master, 1)
        # Dispatch takes over: the next record of queue 0 reaches the CompactionLog.
        put(slave.store, "a9", b"q0-new", queue_id=0)
        assert slave.store.wait_dispatched()
        [clog] = [c for c in slave.comp.queues() if c.queue_id == 0]
        assert clog.next_offset == 7
        got = offsets_and_bodies(slave.store, 0)
        assert got[-1] == (6, b"q0-new")
        assert {b for _o, b in got} >= {b"q0-2", b"q0-3", b"q0-4", b"q0-5"}
    finally:
        slave.close()
        master.close()


def test_a_queue_the_master_does_not_serve_yet_lets_the_others_open(tmp_path):
    master = MessageStore(small_config(tmp_path / "master"))
    master.open()
    slave = Slave(tmp_path / "slave")
    try:
        for i in range(11):
            put(slave.store, f"a{i % 4}", b"q0-%d" % i, queue_id=0)
        for node in (master, slave.store):
            for i in range(3):
                put(node, f"b{i}", b"q1-%d" % i, queue_id=1)
        for i in range(6):  # the master serves queue 0 up to offset 6 only, so far
            put(master, f"a{i % 4}", b"q0-%d" % i, queue_id=0)
        assert slave.store.wait_dispatched() and master.wait_dispatched()
        rep = CompactionReplicator(slave.gate, slave.comp, lambda: StorePull(master),
                                   lambda: [(TOPIC, 0), (TOPIC, 1)])
        pass_in_thread(rep, StorePull(master))
        assert not slave.gate.is_open(TOPIC, 0) and slave.gate.is_open(TOPIC, 1)
        assert rep.progress[(TOPIC, 0)]["state"] == "WAITING"
        assert offsets_and_bodies(slave.store, 1) == offsets_and_bodies(master, 1)
        # Once the master serves them, the next pass opens queue 0 with every record.
        for i in range(6, 11):
            put(master, f"a{i % 4}", b"q0-%d" % i, queue_id=0)
        assert master.wait_dispatched()
        pass_in_thread(rep, StorePull(master))
        assert slave.gate.is_open(TOPIC, 0)
        [clog] = [c for c in slave.comp.queues() if c.queue_id == 0]
        assert clog.next_offset == 11
    finally:
        slave.close()
        master.close()


class CuttingPull(StorePull):
    """The master's pull, serving at most ``per_pull`` records; on pull ``cut_on`` the slave's
    log is cut back first (the HA link found the slave ahead of a restarted master while this
    queue was being pulled)."""

    def __init__(self, store: MessageStore, per_pull: int, cut_on: int, cut) -> None:
        super().__init__(store)
        self.per_pull, self.cut_on, self.cut = per_pull, cut_on, cut
        self.calls = 0

    def pull(self, topic: str, queue_id: int, offset: int, max_count: int
             ) -> tuple[list[bytes], int]:
        self.calls += 1
        if self.calls == self.cut_on:
            self.cut()
        return super().pull(topic, queue_id, offset, min(max_count, self.per_pull))


def test_a_cut_back_during_a_pull_leaves_no_gap_of_queue_offsets(tmp_path):
    master = MessageStore(small_config(tmp_path / "master"))
    master.open()
    slave = Slave(tmp_path / "slave")
    try:
        phys = {}
        for name, node in (("master", master), ("slave", slave.store)):
            phys[name] = [node.put_message(Message(TOPIC, b"value-%d" % i, 0, {"KEYS": f"k{i}"}))
                          .physical_offset for i in range(10)]
        assert phys["master"] == phys["slave"]  # the slave's log is a copy of the master's
        assert slave.store.wait_dispatched() and master.wait_dispatched()
        cuts = []
        # Pull 1 appends offsets 0..3; before pull 2 the slave's log is cut back to offset 2's
        # record, so its CompactionLog ends at 2 again while the pull was going to go on at 4.
        source = CuttingPull(master, 4, 2,
                             lambda: cuts.append(slave.store.replica.truncate(phys["slave"][2],
                                                                              "test")))
        rep = CompactionReplicator(slave.gate, slave.comp, lambda: source, lambda: [(TOPIC, 0)])
        pass_in_thread(rep, source)
        assert cuts and cuts[0].records_cut == 8
        assert slave.gate.is_open(TOPIC, 0)
        assert offsets_and_bodies(slave.store, 0) == offsets_and_bodies(master, 0)
        assert [o for o, _b in offsets_and_bodies(slave.store, 0)] == list(range(10))
    finally:
        slave.close()
        master.close()


def test_a_restarted_slave_keeps_the_records_it_pulled_past_its_own_log(tmp_path, caplog):
    master = MessageStore(small_config(tmp_path / "master"))
    master.open()
    slave = Slave(tmp_path / "slave")
    try:
        for i in range(200):  # the master's log runs far ahead of the slave's
            put(master, f"k{i % 7}", b"q0-%d-" % i + bytes(300), queue_id=0)
        put(slave.store, "own", b"a record of the slave's own log", queue_id=1)
        assert slave.store.wait_dispatched() and master.wait_dispatched()
        rep = CompactionReplicator(slave.gate, slave.comp, lambda: StorePull(master),
                                   lambda: [(TOPIC, 0)])
        pass_in_thread(rep, StorePull(master))
        [clog] = [c for c in slave.comp.queues() if c.queue_id == 0]
        pulled_end = clog.next_offset
        assert pulled_end == 200 and clog.physical_end > slave.store.commitlog.max_offset
        rows = offsets_and_bodies(slave.store, 0)
    finally:
        slave.close()
    try:
        slave = Slave(tmp_path / "slave")
        [clog] = [c for c in slave.comp.queues() if c.queue_id == 0]
        assert clog.next_offset == pulled_end
        assert offsets_and_bodies(slave.store, 0) == rows
        assert "cutting them back" not in caplog.text
    finally:
        slave.close()
        master.close()


def test_a_fresh_slave_on_its_masters_tier_pulls_what_the_tier_does_not_hold(tmp_path):
    """The tier holds a compaction queue's sealed files, not the one the master is writing: a
    new slave that serves the tier's files must pull from where they end, or the newest
    versions (in the master's file being written) are missing on the slave."""
    from stratamq import tiered
    from stratamq.compaction.service import CompactionStore
    from stratamq.compaction.tiering import link

    tier = {"tiered_backend_service_provider": "posix",
            "tiered_store_file_path": str(tmp_path / "tier")}
    master_cfg = small_config(tmp_path / "master", file_reserved_time=0, **tier)
    master = MessageStore(master_cfg)
    master_tier = tiered.wire(master, cluster="c", broker="b", background=False)
    master_comp = CompactionStore(master_cfg, POLICIES).plug_into(master)
    link(master_comp, master_tier)
    master.open()
    slave = None
    try:
        for i in range(600):
            put(master, f"k{i % 40}", b"v%d-" % i + bytes(200))
        assert master.wait_dispatched()
        master_comp.run_now(seal=False)  # compacts and uploads the sealed files only
        assert master_comp.queues()[0].segments[-1].units  # newest versions: not in the tier
        want = as_table(read_from(master))

        slave_cfg = dataclasses.replace(small_config(tmp_path / "slave", **tier),
                                        broker_role=BrokerRole.SLAVE, enable_compaction=True)
        slave = MessageStore(slave_cfg)
        slave_tier = tiered.wire(slave, cluster="c", broker="b", background=False,
                                 upload=False)
        comp, gate = plug_compaction(slave, slave_cfg, POLICIES)
        assert comp is not None and gate is not None
        link(comp, slave_tier)
        slave.open()
        assert comp.queues()[0].tier_only()  # serves the master's tier files
        rep = CompactionReplicator(gate, comp, lambda: StorePull(master), lambda: [(TOPIC, 0)])
        pass_in_thread(rep, StorePull(master))
        assert gate.is_open(TOPIC, 0)
        assert as_table(read_from(slave)) == want  # the latest value of every key
    finally:
        if slave is not None:
            slave.close()
            comp.close()
        master.close()
        master_comp.close()
