"""The cluster's coordination on real etcd members (Debian's etcd-server, started per test on
loopback), the election policy, and one group's election and fencing between members."""

from __future__ import annotations

import signal
import threading

import pytest

from stratamq.benchmarks.etcd_members import EtcdCluster
from stratamq.cluster.coordination import CoordinationUnavailable, LeaseLost, WatchEvent
from stratamq.cluster.election import Candidate, elect
from stratamq.cluster.etcd import EtcdCoordination, parse_endpoints
from stratamq.cluster.member import BrokerIdentity, ClusterMember, MasterInfo
from tests.waiting import wait_until


@pytest.fixture
def etcd(tmp_path):
    cluster = EtcdCluster(tmp_path, size=1)
    yield cluster
    cluster.stop()


def test_endpoints_are_checked():
    assert parse_endpoints("http://a:2379, 10.0.0.2:2379") == [("http", "a", 2379),
                                                              ("http", "10.0.0.2", 2379)]
    with pytest.raises(ValueError, match="not http"):
        parse_endpoints("ftp://a:1")
    with pytest.raises(ValueError, match="empty"):
        parse_endpoints(" , ")


def test_lease_keys_vanish_when_the_lease_is_revoked(etcd):
    c = EtcdCoordination(etcd.endpoints)
    lease = c.grant(2000)
    c.put("/t/brokers/a/1", b"x", lease)
    assert c.keep_alive(lease) == 2000
    assert [kv.key for kv in c.get_prefix("/t/brokers/")] == ["/t/brokers/a/1"]
    age = c.lease_age_ms(lease)
    assert age is not None and age <= 2000
    c.revoke(lease)
    assert c.get_prefix("/t/brokers/") == []
    with pytest.raises(LeaseLost):
        c.keep_alive(lease)
    assert c.lease_age_ms(lease) is None


def test_a_lapsed_lease_takes_its_keys_with_it(etcd):
    c = EtcdCoordination(etcd.endpoints)
    lease = c.grant(1000)
    c.put("/t/m", b"x", lease)
    wait_until(lambda: c.get("/t/m") is None, timeout=30, what="the lease to lapse")
    with pytest.raises(LeaseLost):
        c.keep_alive(lease)


def test_create_is_exclusive_and_swap_needs_the_revision(etcd):
    a, b = EtcdCoordination(etcd.endpoints), EtcdCoordination(etcd.endpoints)
    assert a.create("/t/master", b"a", also=(("/t/epoch", b"1"),), unchanged=(("/t/epoch", 0),))
    assert not b.create("/t/master", b"b")
    kv = a.get("/t/master")
    assert kv is not None and kv.value == b"a"
    assert a.get("/t/epoch").value == b"1"  # written in the same transaction
    assert b.swap("/t/master", kv.mod_revision, b"b")
    assert not a.swap("/t/master", kv.mod_revision, b"a")  # stale revision: refused
    assert a.get("/t/master").value == b"b"
    assert not a.delete_if("/t/master", kv.mod_revision)
    assert a.delete_if("/t/master", a.get("/t/master").mod_revision)
    # The epoch moved on: a create that read it before is refused though the key is absent.
    stale = a.get("/t/epoch").mod_revision
    a.put("/t/epoch", b"2")
    assert not b.create("/t/master", b"b", unchanged=(("/t/epoch", stale),))


def test_increments_from_concurrent_clients_never_repeat(etcd):
    seen: list[int] = []
    lock = threading.Lock()

    def bump() -> None:
        c = EtcdCoordination(etcd.endpoints)
        for _ in range(10):
            value = c.increment("/t/epoch")
            with lock:
                seen.append(value)

    threads = [threading.Thread(target=bump) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(seen) == list(range(1, 31))


def test_watch_sees_puts_and_deletes(etcd):
    c = EtcdCoordination(etcd.endpoints)
    events: list[WatchEvent] = []
    stop = c.watch_prefix("/t/g/", events.append)
    try:
        def put_until_seen() -> bool:  # the watch starts on its own thread
            c.put("/t/g/x", b"1")
            return any(e.value == b"1" for e in events)

        wait_until(put_until_seen, timeout=30, what="the watch to see a put", interval=0.2)
        lease = c.grant(2000)
        c.put("/t/g/master", b"m", lease)
        c.revoke(lease)
        wait_until(lambda: WatchEvent("/t/g/master", None) in events, timeout=30,
                   what="the watch to see the lease's key go")
    finally:
        stop()


def test_one_dead_member_of_three_changes_nothing_and_a_lost_quorum_is_unavailable(tmp_path):
    cluster = EtcdCluster(tmp_path, size=3)
    try:
        c = EtcdCoordination(cluster.endpoints, timeout_s=1.0)
        c.put("/t/k", b"1")
        cluster.members[0].stop(signal.SIGKILL)  # the member c talks to first
        assert c.increment("/t/n") == 1
        assert c.get("/t/k").value == b"1"
        cluster.members[1].stop(signal.SIGKILL)
        with pytest.raises(CoordinationUnavailable):
            c.put("/t/k", b"2")
    finally:
        cluster.stop()


# -- DefaultElectPolicy ------------------------------------------------------------------------

def _c(i: int, epoch: int = 1, offset: int = 0, priority: int = 0) -> Candidate:
    return Candidate(i, epoch, offset, priority)


def test_policy_ranks_epoch_then_offset_then_priority():
    live = {1: _c(1, 2, 100, 5), 2: _c(2, 3, 10, 5), 3: _c(3, 3, 10, 1)}
    assert elect(live, [1, 2, 3]).broker_id == 3  # epoch 3 beats 2; then priority 1 over 5
    live[2] = _c(2, 3, 11, 5)
    assert elect(live, [1, 2, 3]).broker_id == 2  # higher offset before priority


def test_policy_prefers_the_sync_state_set_and_the_old_master():
    live = {1: _c(1, 1, 50), 2: _c(2, 1, 99)}
    assert elect(live, [1]).broker_id == 1  # 2 is ahead but not in the set
    assert elect(live, [1, 2], old_master=1).broker_id == 1
    assert elect(live, [1, 2], old_master=1, preferred=2).broker_id == 2
    assert elect(live, [1], preferred=2).broker_id is None  # preferred not in the set
    assert elect(live, []).broker_id == 2  # no set yet: every live broker


def test_policy_elects_outside_the_set_only_when_unclean_is_allowed():
    live = {2: _c(2, 1, 10)}
    assert elect(live, [1]).broker_id is None
    choice = elect(live, [1], allow_unclean=True)
    assert (choice.broker_id, choice.unclean) == (2, True)


# -- one group's election and fencing ----------------------------------------------------------

class _Node:
    """A ClusterMember with the few things a broker gives it (offset, epochs, role)."""

    def __init__(self, endpoints: str, broker_id: int, ttl_ms: int, offset: int = 0) -> None:
        self.offset = offset
        self.epochs: list[int] = []
        self.following: list[MasterInfo | None] = []
        me = BrokerIdentity("c1", "g", broker_id, 0, f"127.0.0.1:{10000 + broker_id}",
                            f"127.0.0.1:{20000 + broker_id}")
        self.member = ClusterMember(
            EtcdCoordination(endpoints), me, "/stratamq/c1", ttl_ms,
            max_offset=lambda: self.offset,
            last_epoch=lambda: self.epochs[-1] if self.epochs else 0,
            on_master=self.epochs.append, on_slave=self.following.append,
            # One slave link, caught up: as a master with a slave that has every byte.
            progress=lambda: (self.offset, self.offset, 1))


def _master_and_slave(etcd: EtcdCluster, slave_catches_up: bool = True
                      ) -> tuple[_Node, _Node]:
    """Two members of group g, both registered before either elects (so the policy sees
    both): a (further ahead) is elected and b follows it."""
    a = _Node(etcd.endpoints, 1, 2000, offset=100)
    b = _Node(etcd.endpoints, 2, 2000, offset=50)
    if not slave_catches_up:
        a.member.progress = lambda: (100, None, 0)
    for n in (a, b):
        n.member._renew()
        n.member._register()
    b.member.start()
    a.member.start()
    wait_until(lambda: a.member.fence.writable(), timeout=30, what="a to be master")
    wait_until(lambda: b.following and b.following[-1] is not None, timeout=30,
               what="b to follow a")
    return a, b


def test_the_most_advanced_broker_is_elected_and_a_dead_masters_group_elects_again(etcd):
    a, b = _master_and_slave(etcd)
    try:
        assert a.epochs == [1]
        assert not b.member.fence.writable()
        assert b.following[-1].broker_id == 1
        wait_until(lambda: a.member.sync is not None and a.member.sync.written == {1, 2},
                   timeout=30, what="b to join the SyncStateSet")
        # a stops renewing (its process is gone): its fence lapses before its lease does.
        a_writable_when_b_elected: list[bool] = []
        b.member.on_master = lambda epoch: (
            a_writable_when_b_elected.append(a.member.fence.writable()), b.epochs.append(epoch))
        a.member._stop.set()
        a.member._thread.join(10)
        wait_until(lambda: b.member.fence.writable(), timeout=30, what="b to be master")
        assert a_writable_when_b_elected == [False]  # never two masters accepting writes
        assert b.epochs == [2]  # strictly greater than a's
    finally:
        b.member.stop()
        a.member.stop()


def test_a_planned_switch_is_refused_to_a_dead_broker_or_one_outside_the_set(etcd):
    from stratamq.cluster.status import ElectError, group_status, request_election

    a, b = _master_and_slave(etcd, slave_catches_up=False)  # b stays out of the set
    try:
        c = EtcdCoordination(etcd.endpoints)
        [line] = group_status(c, "/stratamq/c1", "c1")
        assert (line["brokerName"], line["masterBrokerId"], line["syncStateSet"]) == ("g", 1, [1])
        assert [m["brokerId"] for m in line["brokers"]] == [1, 2]
        with pytest.raises(ElectError, match="not alive"):
            request_election(c, "/stratamq/c1", "c1", "g", 3)
        with pytest.raises(ElectError, match="not in g's SyncStateSet"):
            request_election(c, "/stratamq/c1", "c1", "g", 2)
        with pytest.raises(ElectError, match="no broker group"):
            request_election(c, "/stratamq/c1", "c1", "nope", 1)
        assert request_election(c, "/stratamq/c1", "c1", "g", None)["masterBrokerId"] == 1
        assert a.member.fence.writable()  # nothing changed
    finally:
        b.member.stop()
        a.member.stop()


def test_an_idle_pass_is_one_keep_alive_and_a_watched_change_is_read_at_the_next(etcd):
    a, b = _master_and_slave(etcd)
    try:
        wait_until(lambda: a.member.sync is not None and a.member.sync.written == {1, 2},
                   timeout=30, what="b to join the SyncStateSet")
        # b's loop stops (its watches go on); its passes are made here, one at a time.
        b.member._stop.set()
        b.member._wake.set()
        b.member._thread.join(10)
        b.member.step()
        coord = b.member.coord
        assert isinstance(coord, EtcdCoordination)
        before = coord.requests
        for _ in range(4):
            b.member.step()
        assert coord.requests - before == 4  # the keep-alives: nothing changed, nothing read
        assert b.member.master is not None and b.member.master.broker_id == 1
        # A change under the group's keys (here a planned-switch request naming nobody) is
        # reported by the watch and read at the next pass, together with the registrations.
        coord.put("/stratamq/c1/groups/g/elect", b"{}")
        wait_until(lambda: b.member._stale, timeout=30, what="the watch to report the change")
        before = coord.requests
        b.member.step()
        assert coord.requests - before == 2
        assert "/stratamq/c1/groups/g/elect" in b.member._snapshot
    finally:
        b.member.stop()
        a.member.stop()
