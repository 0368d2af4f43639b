"""Cluster benchmark (issue 28), first part: failover time of a controller-mode broker group.

    python bench/cluster.py [--kills N] [--lease-ttl-ms MS]
    python bench/cluster.py [--quick] [--only failover,throughput,scale] [--groups 2,5,10]

3 etcd members (Debian's etcd-server) and one group of two brokers on loopback with default
settings. N times: wait until both brokers are in the SyncStateSet, SIGKILL the master, and
measure until the first send acknowledged by the group's new master for a client that asks
the group's brokers again (a fresh connection to each in turn, as a client re-querying its
route would); then restart the killed broker, which rejoins as a slave.

Prints one JSON line per kill (``failoverMs``) and a ``summary`` line: median and max, with
the issue's targets (median <= 5 s, max <= 10 s with defaults; RocketMQ's controller mode
takes ~10 s). Before the kills, the etcd requests each broker sends per second with no load
(target <= 1).

Before the failover part (``stratamq/benchmarks/cluster_bench.py``): ``throughput``, a
controller-mode group's puts against a standalone SYNC_MASTER pair's under the same gRPC load
(target >= 0.9x); ``scale``, 2, 5 and 10 groups of two brokers: the requests etcd served
per broker per second at steady state, from etcd's own metrics (target <= 1, flat).
``--quick``: small counts and short windows (a smoke run of a few tens of seconds).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc

from stratamq.benchmarks.cluster_bench import run_scale, run_throughput
from stratamq.benchmarks.etcd_members import EtcdCluster
from stratamq.broker.metadata import MetadataStore
from stratamq.client.admin import AdminClient, AdminError
from stratamq.config import BrokerConfig

TOPIC = "BenchFailover"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Broker:
    def __init__(self, root: Path, etcd: str, broker_id: int, ttl_ms: int | None) -> None:
        self.broker_id = broker_id
        self.store = root / f"b{broker_id}"
        self.port, self.ha_port = _free_port(), _free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        meta = MetadataStore(self.store)
        if meta.topic(TOPIC) is None:
            meta.create_topic(TOPIC, 4, "NORMAL")
        self.conf = root / f"b{broker_id}.conf"
        settings = {"enableControllerMode": "true", "etcdEndpoints": etcd,
                    "brokerName": "bench", "brokerId": str(broker_id),
                    "haListenPort": str(self.ha_port),
                    "mappedFileSizeCommitLog": str(16 << 20)}
        if ttl_ms is not None:  # else the default etcdLeaseTtlMs
            settings["etcdLeaseTtlMs"] = str(ttl_ms)
        self.conf.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
        self.log = root / f"b{broker_id}.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "stratamq.cli", "broker", "start", "--store",
                 str(self.store), "--listen", self.endpoint, "--config", str(self.conf)],
                stdout=subprocess.PIPE, stderr=log, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if "listening on" not in line:
            raise RuntimeError(f"broker {self.broker_id} did not start: {line!r}")

    def cluster(self) -> dict | None:
        try:
            with AdminClient(self.endpoint, timeout=5) as client:
                return client.call_service("stratamq.admin.v1.Replication",
                                           "HaStatus").get("cluster")
        except (AdminError, OSError, grpc.RpcError):
            return None

    def kill(self) -> None:
        if self.proc is not None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
            self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(60)
        self.proc = None


def _send(endpoint: str) -> bool:
    sp = pb.SystemProperties(message_id=uuid.uuid4().hex.upper())
    sp.born_timestamp.GetCurrentTime()
    sp.born_host = "127.0.0.1"
    msg = pb.Message(topic=pb.Resource(name=TOPIC), body=b"x", system_properties=sp)
    try:
        with grpc.insecure_channel(endpoint) as channel:
            reply = service_pb2_grpc.MessagingServiceStub(channel).SendMessage(
                svc.SendMessageRequest(messages=[msg]), timeout=2)
    except grpc.RpcError:
        return False
    return reply.entries[0].status.code == pb.OK


def _wait(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _master(brokers: list[Broker]) -> Broker | None:
    for b in brokers:
        status = b.cluster()
        if status and status["writable"] and status["syncStateSet"] == [1, 2]:
            return b
    return None


def _request_rates(brokers: list[Broker], seconds: float) -> dict[str, float]:
    """etcd requests each broker sent per second over ``seconds`` of steady state."""
    def counts() -> dict[str, int]:
        return {f"{b.broker_id}": (b.cluster() or {}).get("etcdRequests") or 0 for b in brokers}

    before, start = counts(), time.monotonic()
    time.sleep(seconds)
    after, elapsed = counts(), time.monotonic() - start
    return {k: round((after[k] - before[k]) / elapsed, 2) for k in after}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--lease-ttl-ms", type=int, default=None,
                        help="etcdLeaseTtlMs (default: the broker's default)")
    parser.add_argument("--steady-seconds", type=float, default=10.0)
    _add_load_args(parser)
    args = parser.parse_args()
    if args.quick:
        args.kills, args.steady_seconds = min(args.kills, 1), min(args.steady_seconds, 3.0)
    with tempfile.TemporaryDirectory(prefix="stratamq-bench-cluster-") as tmp:
        root = Path(tmp)
        etcd = EtcdCluster(root, size=3)
        try:
            _load_parts(root, etcd, args)
        except BaseException:
            etcd.stop()
            raise
        if "failover" not in args.only:
            etcd.stop()
            return
        brokers = [Broker(root, etcd.endpoints, i, args.lease_ttl_ms) for i in (1, 2)]
        times: list[float] = []
        try:
            for b in brokers:
                b.start()
            _wait(lambda: _master(brokers) is not None, 120, "a master and its slave in sync")
            rates = _request_rates(brokers, args.steady_seconds)
            print(json.dumps({"summary": "etcd requests per broker per second (idle)",
                              "perBroker": rates, "target": 1.0}), flush=True)
            for kill in range(args.kills):
                _wait(lambda: _master(brokers) is not None, 120,
                      "a master with both brokers in its SyncStateSet")
                master = _master(brokers)
                assert master is not None
                assert _send(master.endpoint)
                master.kill()
                killed = time.monotonic()
                others = [b for b in brokers if b is not master]
                _wait(lambda others=others: any(_send(b.endpoint) for b in others), 120,
                      "a send acknowledged by the new master")
                ms = (time.monotonic() - killed) * 1000
                times.append(ms)
                print(json.dumps({"kill": kill + 1, "failoverMs": round(ms)}), flush=True)
                master.start()  # rejoins as a slave
        finally:
            for b in brokers:
                b.stop()
            etcd.stop()
        print(json.dumps({"summary": "failover", "kills": len(times),
                          "leaseTtlMs": args.lease_ttl_ms or BrokerConfig().etcd_lease_ttl_ms,
                          "medianMs": round(statistics.median(times)),
                          "maxMs": round(max(times)), "targetMedianMs": 5000,
                          "targetMaxMs": 10000}), flush=True)


def _add_load_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="small counts (a smoke run)")
    parser.add_argument("--only", type=lambda s: set(s.split(",")),
                        default={"failover", "throughput", "scale"},
                        help="comma-separated parts: failover, throughput, scale")
    parser.add_argument("--seconds", type=float, default=3.0, help="length of a load round")
    parser.add_argument("--rounds", type=int, default=15,
                        help="load rounds, the modes alternating (many short rounds: the "
                             "machine's drift cancels in each round's ratio)")
    parser.add_argument("--per-rpc", type=int, default=1, help="messages per SendMessage")
    parser.add_argument("--inflight", type=int, default=64, help="SendMessage RPCs in flight")
    parser.add_argument("--body-size", type=int, default=1024)
    parser.add_argument("--groups", type=lambda s: [int(n) for n in s.split(",")],
                        default=[2, 5, 10], help="group counts of the scale part")
    parser.add_argument("--scale-seconds", type=float, default=30.0,
                        help="the steady-state window at each group count")


def _load_parts(root: Path, etcd: EtcdCluster, args: argparse.Namespace) -> None:
    """The throughput and scale parts (``stratamq/benchmarks/cluster_bench.py``)."""
    def emit(line: dict) -> None:
        print(json.dumps(line), flush=True)

    warm_up, settle = 1.0, 3.0
    if args.quick:
        args.seconds, args.rounds, args.scale_seconds = 1.5, 1, 4.0
        args.groups = [n for n in args.groups if n <= 2] or [min(args.groups)]
        warm_up, settle = 0.0, 1.0
    if "throughput" in args.only:
        run_throughput(root, etcd, emit, seconds=args.seconds, rounds=args.rounds,
                       per_rpc=args.per_rpc, inflight=args.inflight,
                       body_size=args.body_size, ttl_ms=args.lease_ttl_ms, warm_up_s=warm_up)
    if "scale" in args.only:
        run_scale(root, etcd, emit, group_counts=args.groups, seconds=args.scale_seconds,
                  ttl_ms=args.lease_ttl_ms, settle_s=settle)


if __name__ == "__main__":
    main()
