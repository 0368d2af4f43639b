"""A controller-mode group (3 real etcd members, a master and a slave broker, the official
client producing) under two faults that a process kill does not show:

* the master partitioned from etcd but not from its clients or its slave (a network
  namespace whose only way to etcd is a veth link the test sets down): it refuses writes once
  its lease can lapse, the slave is elected, and when the link comes back the old master
  follows the new one; no message is acknowledged by two masters (ids and offsets);
* all of etcd down with ``etcdFailsafeMode=true`` (Patroni's failsafe mode): the master keeps
  accepting writes while its slave confirms it has lost etcd too, refuses once the slave cannot
  answer, and is back to normal when etcd returns (no election meanwhile).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time

import pytest
from cluster_traffic import OfficialProducer
from rocketmq.grpc_protocol import definition_pb2 as pb
from test_cluster_failover import (
    TOPIC,
    TTL_MS,
    Member,
    assert_readable_where_acked,
    send_replies,
)
from waiting import wait_until

from stratamq.benchmarks.etcd_members import EtcdCluster


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check,
                          timeout=30)


class Namespace:
    """A network namespace for one broker with two veth links to the host: ``etcd_link``,
    its only route to etcd (the test cuts it), and ``client_link``, to its clients and its
    slave. Names and subnets come from this process's id (the machine is shared)."""

    def __init__(self) -> None:
        n = os.getpid() % 250
        self.name = f"smq-{os.getpid()}"
        self.etcd_host, self.etcd_ns = f"10.231.{n}.1", f"10.231.{n}.2"
        self.client_host, self.client_ns = f"10.232.{n}.1", f"10.232.{n}.2"
        self.etcd_link = f"smqe{os.getpid()}"[:15]
        self.client_link = f"smqc{os.getpid()}"[:15]
        _ip("netns", "add", self.name)
        try:
            self._ns("link", "set", "lo", "up")
            for link, host, ns in ((self.etcd_link, self.etcd_host, self.etcd_ns),
                                   (self.client_link, self.client_host, self.client_ns)):
                _ip("link", "add", link, "type", "veth", "peer", "name", "peer0")
                _ip("link", "set", "peer0", "netns", self.name)
                _ip("addr", "add", f"{host}/30", "dev", link)
                _ip("link", "set", link, "up")
                self._ns("link", "set", "peer0", "name", f"{link}n")
                self._ns("addr", "add", f"{ns}/30", "dev", f"{link}n")
                self._ns("link", "set", f"{link}n", "up")
        except BaseException:
            self.delete()
            raise

    def _ns(self, *args: str) -> None:
        _ip("netns", "exec", self.name, "ip", *args)

    @property
    def prefix(self) -> tuple[str, ...]:
        return ("ip", "netns", "exec", self.name)

    def cut_etcd(self, cut: bool) -> None:
        _ip("link", "set", self.etcd_link, "down" if cut else "up")

    def delete(self) -> None:
        _ip("netns", "del", self.name, check=False)  # takes the veth pairs with it
        for link in (self.etcd_link, self.client_link):
            _ip("link", "del", link, check=False)


def _netns_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "`ip` (iproute2) is not installed: `make test` installs it"
    probe = f"smq-probe-{os.getpid()}"
    r = _ip("netns", "add", probe, check=False)
    if r.returncode != 0:
        return f"`ip netns add` fails here: {r.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


def _refusal(endpoint: str) -> str:
    [(code, why)] = send_replies(endpoint, [b"probe"])
    return "" if code == pb.OK else why or str(code)


# With failsafe mode too: its slave still reaches etcd, so it does not confirm, and the master
# is fenced all the same.
@pytest.mark.parametrize("failsafe", ["false", "true"])
def test_a_master_cut_off_from_etcd_but_not_clients_is_fenced_and_rejoins(tmp_path, failsafe):
    why = _netns_unavailable()
    if why:
        pytest.skip(why)
    ns = Namespace()
    etcd = EtcdCluster(tmp_path, size=3, also_listen=(ns.etcd_host,))
    ns_etcd = ",".join(f"http://{ns.etcd_host}:{m.client_port}" for m in etcd.members)
    extra = {"etcdFailsafeMode": failsafe}
    master = Member(tmp_path, ns_etcd, 1, host=ns.client_ns, command_prefix=ns.prefix,
                    extra=extra)
    slave = Member(tmp_path, etcd.endpoints, 2, host=ns.client_host, extra=extra)
    producer: OfficialProducer | None = None
    try:
        master.start()
        wait_until(master.is_writable_master, timeout=60, what="broker 1 to be master")
        slave.start()
        wait_until(lambda: master.cluster()["syncStateSet"] == [1, 2], timeout=60,
                   what="the slave to join the SyncStateSet")
        epoch = master.cluster()["epoch"]
        producer = OfficialProducer([master.endpoint, slave.endpoint], TOPIC)
        producer.start()
        wait_until(lambda: len(producer.acked) >= 100, timeout=60,
                   what="100 acknowledged sends")

        ns.cut_etcd(True)
        # Its clients still reach it, and it refuses them: its lease renewal is overdue.
        wait_until(lambda: "etcd lease" in _refusal(master.endpoint), timeout=30,
                   what="the partitioned master to refuse writes")
        wait_until(slave.is_writable_master, timeout=30, what="the slave to be elected")
        assert slave.cluster()["epoch"] > epoch
        assert not master.is_writable_master()  # reachable, alive, and not a master
        assert not master.cluster()["failsafe"]
        count = len(producer.acked)
        wait_until(lambda: len(producer.acked) >= count + 50, timeout=60,
                   what="sends acknowledged by the new master")

        ns.cut_etcd(False)
        wait_until(lambda: master.cluster()["masterBrokerId"] == slave.broker_id, timeout=60,
                   what="the old master to follow the new one")
        assert not master.is_writable_master()
        producer.finish()
        assert {a.endpoint for a in producer.acked.values()} == {master.endpoint,
                                                                 slave.endpoint}
        # Each acknowledged id at the queue and offset its receipt named: no offset was
        # given by two masters, and the old master's copy agrees.
        assert_readable_where_acked(slave.endpoint, producer.acked)
        assert_readable_where_acked(master.endpoint, producer.acked)
    finally:
        if producer is not None:
            producer.stop.set()
        for m in (master, slave):
            if m.proc is not None and m.proc.poll() is None:
                m.terminate()
        etcd.stop()
        ns.delete()


def test_failsafe_mode_keeps_a_master_writable_while_its_slave_lost_etcd_too(tmp_path):
    etcd = EtcdCluster(tmp_path, size=3)
    extra = {"etcdFailsafeMode": "true"}
    members = [Member(tmp_path, etcd.endpoints, i, extra=extra) for i in (1, 2)]
    producer: OfficialProducer | None = None
    try:
        for m in members:
            m.start()
        producer = OfficialProducer([m.endpoint for m in members], TOPIC)
        wait_until(lambda: any(m.is_writable_master() for m in members), timeout=60,
                   what="a master to be elected")
        master = next(m for m in members if m.is_writable_master())
        slave = next(m for m in members if m is not master)
        wait_until(lambda: master.cluster()["syncStateSet"] == [1, 2], timeout=60,
                   what="the slave to join the SyncStateSet")
        epoch = master.cluster()["epoch"]
        acked_at: list[float] = []  # when each acknowledgement was seen
        producer.start()
        wait_until(lambda: len(producer.acked) >= 50, timeout=60, what="50 acknowledged sends")

        for member in etcd.members:
            member.stop(signal.SIGKILL)
        gone = time.monotonic()
        wait_until(lambda: master.cluster()["failsafe"], timeout=30,
                   what="the master to enter failsafe mode")

        # Writes go on past a whole TTL without etcd (without failsafe mode they stop after
        # two thirds of one), and the slave takes no part in any election.
        def acked_after_a_ttl() -> bool:
            if time.monotonic() > gone + TTL_MS / 1000:
                acked_at.append(len(producer.acked))
            return len(acked_at) > 1 and acked_at[-1] >= acked_at[0] + 50

        wait_until(acked_after_a_ttl, timeout=30,
                   what="50 sends acknowledged a TTL after etcd went")
        assert master.cluster()["epoch"] == epoch
        assert not slave.is_writable_master()

        # The slave cannot answer (stopped): the master stops accepting writes.
        assert slave.proc is not None
        os.kill(slave.proc.pid, signal.SIGSTOP)
        try:
            wait_until(lambda: "etcd lease" in _refusal(master.endpoint), timeout=30,
                       what="the master to refuse writes without its slave's word")
        finally:
            os.kill(slave.proc.pid, signal.SIGCONT)

        initial = ",".join(f"{m.name}={m.peer_url}" for m in etcd.members)
        for member in etcd.members:
            member.start(initial)
        etcd.wait_healthy()
        wait_until(lambda: not master.cluster()["failsafe"] and not _refusal(master.endpoint),
                   timeout=60, what="the master to take writes in normal mode again")
        assert master.cluster()["epoch"] == epoch  # no election happened
        assert not slave.is_writable_master()
        count = len(producer.acked)
        wait_until(lambda: len(producer.acked) >= count + 20, timeout=60,
                   what="more acknowledged sends")
        producer.finish()
        assert_readable_where_acked(master.endpoint, producer.acked)
        assert_readable_where_acked(slave.endpoint, producer.acked)
    finally:
        if producer is not None:
            producer.stop.set()
        for m in members:
            if m.proc is not None and m.proc.poll() is None:
                os.kill(m.proc.pid, signal.SIGCONT)
                m.terminate()
        etcd.stop()
