"""A controller-mode group whose brokers all require client certificates
(``tls.server.need.client.auth=require``): the slave calls its master as a client presenting
``tls.client.certPath`` (broker/tls.py ``peer_endpoint``), so a consumer connected to the slave
receives and acknowledges through forwarding, and the slave copies the master's state, over
mutual TLS; ``stratamq cluster status|elect --endpoint`` present the client certificate as every
admin command does. Real etcd, real broker processes, certificates made with openssl."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import grpc
from certs import TestCa
from rocketmq.grpc_protocol import definition_pb2 as pb
from test_broker_mtls import mtls_settings
from test_cluster_failover import Member, _start, send, stop_all
from test_cluster_slave_forward import ack, receive, take
from waiting import wait_until

from stratamq.benchmarks.etcd_members import EtcdCluster
from stratamq.broker.replication import SERVICE
from stratamq.client.admin import AdminClient
from stratamq.client.connection import BrokerEndpoint


class MtlsMember(Member):
    """A broker of the group serving mutual TLS; the test calls it as ``client``."""

    def __init__(self, root: Path, etcd: str, broker_id: int, ca: TestCa,
                 server: tuple[Path, Path], client: tuple[Path, Path]) -> None:
        super().__init__(root, etcd, broker_id, extra=mtls_settings(ca, server, client))
        self.client = BrokerEndpoint("", tls=True, ca_pem=ca.cert.read_bytes(),
                                     client_cert=(client[0].read_bytes(),
                                                  client[1].read_bytes()))

    def connect(self, endpoint: str) -> grpc.Channel:
        return self.client.at(endpoint).channel()

    def ha_status(self) -> dict:
        with AdminClient(self.client.at(self.endpoint), timeout=5) as admin:
            return admin.call_service(SERVICE, "HaStatus")

    def cluster(self) -> dict:
        return dict(self.ha_status()["cluster"])


def test_a_consumer_at_the_slave_receives_and_acks_through_forwarding_over_mutual_tls(
        tmp_path):
    ca = TestCa(tmp_path)
    server, client = ca.issue("server"), ca.issue("broker-client")
    etcd = EtcdCluster(tmp_path, size=1)
    group = [MtlsMember(tmp_path, etcd.endpoints, i, ca, server, client) for i in (1, 2)]
    try:
        master, slave = _start(group)
        connect = master.connect
        bodies = [b"m-%02d" % i for i in range(10)]
        assert send(master.endpoint, bodies, connect) == [pb.OK] * len(bodies)

        # Received at the slave: popped from the master's state (forwarded over mutual TLS),
        # so the master has nothing more to hand out while they are invisible (2 s).
        got = take(slave.endpoint, len(bodies), invisible_s=2, connect=connect)
        assert sorted(m.body for m in got) == bodies
        acked, kept = got[:6], got[6:]
        reply = ack(slave.endpoint, acked, connect=connect)
        assert reply.status.code == pb.OK, reply
        assert [e.status.code for e in reply.entries] == [pb.OK] * len(acked)
        # The acknowledgements hold on the master: once the invisible time has passed only
        # what was not acknowledged comes back there.
        again = take(master.endpoint, len(kept), invisible_s=120, connect=connect)
        assert sorted(m.body for m in again) == sorted(m.body for m in kept)
        code, late = receive(master.endpoint, 32, invisible_s=120, poll_s=3, connect=connect)
        assert (pb.Code.Name(code), [m.body for m in late]) == ("MESSAGE_NOT_FOUND", [])

        # The slave copies the master's state (topics, pop state) over mutual TLS too.
        def state_copied() -> bool:
            sync = slave.ha_status()["stateSync"]
            return bool(sync["syncs"] > 0 and not sync["lastError"])

        wait_until(state_copied, timeout=30, what="the slave to copy the master's state")
    finally:
        stop_all(group, etcd)


def _cluster_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stratamq.cli", "cluster", *args],
                          capture_output=True, text=True, timeout=120)


def test_cluster_status_and_elect_reach_a_broker_that_requires_client_certificates(tmp_path):
    ca = TestCa(tmp_path)
    server, client = ca.issue("server"), ca.issue("broker-client")
    etcd = EtcdCluster(tmp_path, size=1)
    member = MtlsMember(tmp_path, etcd.endpoints, 1, ca, server, client)
    try:
        member.start()
        wait_until(member.is_writable_master, timeout=60, what="the lone broker to be master")
        where = ["--endpoint", member.endpoint, "--tls-ca-file", str(ca.cert)]
        identified = [*where, "--tls-cert-file", str(client[0]), "--tls-key-file",
                      str(client[1])]
        status = _cluster_cli("status", *identified)
        assert status.returncode == 0, status.stderr
        [line] = [json.loads(text) for text in status.stdout.splitlines()]
        assert (line["cluster"], line["brokerName"], line["masterBrokerId"]) == ("c1", "g", 1)
        assert [(b["endpoint"], b["role"]) for b in line["brokers"]] == [
            (member.endpoint, "MASTER")]
        # The policy's choice keeps the live master: the group's line comes back unchanged.
        elected = _cluster_cli("elect", "--broker-name", "g", *identified)
        assert elected.returncode == 0, elected.stderr
        assert ([(g["masterBrokerId"], g["masterEpoch"]) for g in map(
            json.loads, elected.stdout.splitlines())] == [(1, line["masterEpoch"])])
        # The broker does require the certificate: without it the command is refused.
        refused = _cluster_cli("status", *where)
        assert refused.returncode != 0 and not refused.stdout, refused.stdout
    finally:
        stop_all([member], etcd)
