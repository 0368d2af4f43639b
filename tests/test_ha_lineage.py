"""Replication lineage with real broker processes: a slave whose master comes back with a wiped
store keeps every message and topic it holds, says why (``ha status``: lineageMismatch; an ERROR
in its log) and follows that master only after ``stratamq ha reseed``. (A master that lost an
unreplicated tail keeps its lineage and its slave still cuts back:
test_ha_processes.test_a_slave_ahead_of_a_restarted_master_cuts_back.)"""

from __future__ import annotations

import json
import re
import shutil
import urllib.request

import grpc
import pytest
from broker_proc import create_topics, free_port
from click.testing import CliRunner, Result
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2_grpc
from test_broker_harness import create_topic
from test_ha_processes import QUEUES, TOPIC, Node, Pair, _slave_topics, pull_all, send_batch
from waiting import wait_until

from stratamq.cli import main
from stratamq.client.admin import AdminClient

N = 2500


@pytest.fixture
def pair(tmp_path):
    made = Pair(tmp_path)
    made.metrics_port = free_port()
    made.slave = Node(tmp_path / "slave", made.slave_port, brokerRole="SLAVE",
                      haMasterAddress=f"127.0.0.1:{made.ha_port}",
                      haMasterEndpoint=f"127.0.0.1:{made.master_port}",
                      metricsExporterType="PROM", metricsPromExporterPort=str(made.metrics_port))
    yield made
    made.stop()


def mismatch_gauge(pair: Pair) -> float:
    scrape = urllib.request.urlopen(f"http://127.0.0.1:{pair.metrics_port}/metrics",
                                    timeout=10).read().decode()
    match = re.search(r"^stratamq_replication_lineage_mismatch\{.*\} (\S+)$", scrape, re.M)
    assert match, "the slave exports the lineage gauge"
    return float(match.group(1))


def reseed(store, *extra: str, answer: str | None = None) -> Result:
    """``stratamq ha reseed`` (in this process: the store lock is what keeps a running
    broker's store safe, and it is taken the same way)."""
    return CliRunner().invoke(main, ["ha", "reseed", "--store", str(store), *extra],
                              input=answer)


def produce(pair: Pair, prefix: bytes, count: int) -> None:
    with grpc.insecure_channel(pair.master.endpoint) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        for at in range(0, count, 500):
            entries = send_batch(stub, [prefix + b"-%d" % i
                                        for i in range(at, min(count, at + 500))])
            assert all(e.status.code == pb.OK for e in entries)


def test_a_slave_keeps_everything_when_its_master_comes_back_wiped(pair):
    pair.start()
    produce(pair, b"acked", N)
    wait_until(pair.caught_up, what="the slave to copy the log")
    wait_until(lambda: pair.slave.messages() == N, what="the slave to dispatch")
    held = pair.slave.max_offset()
    lineage = pair.master.ha().get("lineage")
    fresh_slave_lineage = pair.slave.ha().get("lineage")
    connects = pair.slave.ha()["haClientRuntimeInfo"]["connects"]

    pair.master.kill()
    shutil.rmtree(pair.master.store)
    create_topics(pair.master.store, [])
    pair.master.start()

    def heard_master() -> bool:  # (today's code cut the log back to 0 here)
        info = pair.slave.ha()
        return info["haClientRuntimeInfo"]["connects"] > connects and bool(
            info.get("lineageMismatch") or info["haClientRuntimeInfo"]["lastTruncation"])

    wait_until(heard_master, what="the slave to talk to the restarted master")
    assert pair.slave.max_offset() == held
    assert fresh_slave_lineage == lineage  # a fresh slave took its master's lineage
    info = pair.slave.ha()
    assert info["lineageMismatch"] is True
    assert info["lineage"] == lineage
    assert info["masterLineage"] == pair.master.ha()["lineage"] != lineage
    assert info["haClientRuntimeInfo"]["lastTruncation"] is None
    # The state copy refuses that master too: the slave keeps its topic and serves reads.
    wait_until(lambda: "lineage" in pair.slave.ha()["stateSync"]["lastError"],
               what="the state copy to meet the wiped master")
    assert TOPIC in _slave_topics(pair)
    assert pair.slave.messages() == N
    assert sorted(pull_all(pair.slave.endpoint)) == sorted(b"acked-%d" % i for i in range(N))
    assert mismatch_gauge(pair) == 1
    errors = [line for line in pair.slave.log.read_text().splitlines()
              if "ERROR" in line and "lineage" in line]
    assert errors, "the slave logs the refusal at ERROR"
    with AdminClient(pair.slave.endpoint) as client:
        status = client.call("BrokerStatus")
    assert status["store_identity"]["lineage"] == lineage
    assert status["store_identity"]["storeId"] != lineage  # the slave's own directory

    # Reseeding is offline, says what goes, and asks.
    running = reseed(pair.slave.store, "--yes")
    assert running.exit_code != 0 and "stop it first" in running.stderr
    pair.slave.terminate()
    declined = reseed(pair.slave.store, answer="n\n")
    assert declined.exit_code != 0 and f"{N} messages" in declined.stderr
    assert f"topic {TOPIC}: {N} messages" in declined.stderr
    assert any((pair.slave.store / "commitlog").iterdir())  # declined: nothing discarded
    done = reseed(pair.slave.store, "--yes")
    assert done.exit_code == 0, done.output
    discarded = json.loads(done.stdout)["discarded"]
    assert discarded["messages"] == N and discarded["topics"] == {TOPIC: N}
    assert discarded["maxOffset"] == held

    # Now it follows the new master.
    create_topic(pair.master, TOPIC, QUEUES)
    produce(pair, b"new", 100)
    pair.slave.start()
    wait_until(lambda: pair.slave.ha()["lineage"] == pair.master.ha()["lineage"],
               what="the reseeded slave to take its master's lineage")
    wait_until(pair.caught_up, what="the reseeded slave to copy the new master's log")
    wait_until(lambda: pair.slave.messages() == 100, what="the slave to dispatch")
    assert pair.slave.ha()["lineageMismatch"] is False
    assert mismatch_gauge(pair) == 0
    assert sorted(pull_all(pair.slave.endpoint)) == sorted(b"new-%d" % i for i in range(100))
