"""The throughput and scale parts of ``bench/cluster.py`` (issue 28).

* ``run_throughput``: puts to a controller-mode group (a master and a slave on etcd, the master
  acknowledging as SYNC_MASTER over its SyncStateSet) against a standalone SYNC_MASTER pair
  (``brokerRole=SYNC_MASTER`` and a SLAVE following ``haMasterAddress``, no etcd), the same
  raw gRPC load on each (``grpc_load.send_load``), in alternating rounds of the same run.
  Both masters wait for their slave: the controller group is measured only once its
  SyncStateSet holds both brokers. Target: controller >= 0.9x standalone.
* ``run_scale``: 2, 5 and 10 groups of two controller-mode brokers (small stores and thread
  pools, so 20 brokers fit on a small machine) on 3 etcd members; once every group has a master
  with both brokers in its SyncStateSet, the requests etcd itself served over a quiet window,
  per broker per second (target <= 1, flat as groups are added). Counted from each member's
  Prometheus metrics (``grpc_server_started_total``: the gRPC gateway the brokers speak to turns
  each HTTP request into one gRPC call, and a watch into one stream), not from the clients;
  the brokers' own counts are reported beside them.

Every broker is a real ``stratamq broker start`` process on loopback, stopped by its PID.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import grpc

from stratamq.benchmarks.etcd_members import EtcdCluster
from stratamq.benchmarks.grpc_load import send_load
from stratamq.broker.metadata import MetadataStore
from stratamq.client.admin import AdminClient, AdminError
from stratamq.config import BrokerConfig

__all__ = ["BenchBroker", "etcd_requests", "run_scale", "run_throughput"]

TOPIC = "BenchClusterLoad"
QUEUES = 8

# Small stores and pools: 20 brokers on a 2-core machine with a few GB of memory.
SMALL = {"mappedFileSizeCommitLog": str(4 << 20),
         "mappedFileSizeConsumeQueue": str(6000 * 20),
         "grpcThreadPoolNums": "2"}
# The load's stores: segments large enough that rolling is not what is measured.
LOADED = {"mappedFileSizeCommitLog": str(64 << 20)}

Emit = Callable[[dict[str, Any]], None]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.1)


class BenchBroker:
    """One broker process with its own store and ``broker.conf`` under ``root/name``."""

    def __init__(self, root: Path, name: str, settings: dict[str, str],
                 ha_port: int | None = None) -> None:
        self.name = name
        self.store = root / name
        self.port = _free_port()
        self.ha_port = ha_port or _free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        meta = MetadataStore(self.store)
        if meta.topic(TOPIC) is None:
            meta.create_topic(TOPIC, QUEUES, "NORMAL")
        self.conf = root / f"{name}.conf"
        conf = {"haListenPort": str(self.ha_port), **settings}
        self.conf.write_text("".join(f"{k}={v}\n" for k, v in conf.items()))
        self.log = root / f"{name}.log"
        self.proc: subprocess.Popen | None = None
        self._terminated = False

    def launch(self) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "stratamq.cli", "broker", "start", "--store",
                 str(self.store), "--listen", self.endpoint, "--config", str(self.conf)],
                stdout=subprocess.PIPE, stderr=log, text=True)

    def ready(self) -> None:
        """Wait for the process's "listening on" line (it prints it once it serves)."""
        assert self.proc is not None and self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if "listening on" not in line:
            tail = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            raise RuntimeError(f"broker {self.name} did not start: {line!r}; its log ends:\n"
                               f"{tail}")

    def ha_status(self) -> dict[str, Any] | None:
        try:
            with AdminClient(self.endpoint, timeout=5) as client:
                return client.call_service("stratamq.admin.v1.Replication", "HaStatus")
        except (AdminError, OSError, grpc.RpcError):
            return None

    def cluster(self) -> dict[str, Any] | None:
        status = self.ha_status()
        return status.get("cluster") if status else None

    def log_tail(self, lines: int = 15) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def cpu_seconds(self) -> float:
        """User + system CPU time the process has used (Linux ``/proc/<pid>/stat``)."""
        assert self.proc is not None
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def terminate(self) -> None:
        """Ask the process to stop (SIGTERM: a graceful stop revokes its etcd lease). Once:
        a second SIGTERM can arrive inside the broker's handler of the first and hang it."""
        if self.proc is not None and self.proc.poll() is None and not self._terminated:
            self.proc.send_signal(signal.SIGTERM)
            self._terminated = True

    def stop(self) -> None:
        self.terminate()
        proc, self.proc = self.proc, None
        self._terminated = False
        if proc is None:
            return
        if proc.poll() is None:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(30)
        if proc.stdout is not None:
            proc.stdout.close()


def _controller_settings(etcd: str, group: str, broker_id: int,
                         ttl_ms: int | None) -> dict[str, str]:
    """None: the broker's default etcdLeaseTtlMs (what users run)."""
    settings = {"enableControllerMode": "true", "etcdEndpoints": etcd, "brokerName": group,
                "brokerId": str(broker_id)}
    if ttl_ms is not None:
        settings["etcdLeaseTtlMs"] = str(ttl_ms)
    return settings


def _group_in_sync(brokers: Iterable[BenchBroker]) -> bool:
    """A master of the group is writable with both brokers in its SyncStateSet."""
    for b in brokers:
        status = b.cluster()
        if status and status["writable"] and status["syncStateSet"] == [1, 2]:
            return True
    return False


def _master_of(brokers: list[BenchBroker]) -> BenchBroker:
    for b in brokers:
        status = b.cluster()
        if status and status["writable"]:
            return b
    raise RuntimeError("the group has no writable master")


def _start_all(brokers: list[BenchBroker]) -> None:
    """Start the processes side by side (their imports overlap), then wait for each."""
    for b in brokers:
        b.launch()
    for b in brokers:
        b.ready()


def _controller_pair(group: list[BenchBroker]) -> tuple[BenchBroker, BenchBroker]:
    """(master, slave) of a group of two."""
    leader = _master_of(group)
    return leader, next(b for b in group if b is not leader)


def _stop_all(brokers: Iterable[BenchBroker]) -> None:
    brokers = list(brokers)
    for b in brokers:  # all asked first: they stop side by side
        b.terminate()
    for b in brokers:
        b.stop()


# -- throughput --------------------------------------------------------------------------------


def run_throughput(root: Path, etcd: EtcdCluster, emit: Emit, *, seconds: float, rounds: int,
                   per_rpc: int, inflight: int, body_size: int, ttl_ms: int | None,
                   warm_up_s: float = 1.0) -> dict[str, Any]:
    """A controller-mode group against a standalone SYNC_MASTER pair; see the module
    docstring. Emits a line per mode and round, returns the summary (also emitted)."""
    root = root / "throughput"
    root.mkdir()
    group = [BenchBroker(root, f"controller-{i}",
                         {**LOADED, **_controller_settings(etcd.endpoints, "load", i, ttl_ms)})
             for i in (1, 2)]
    master = BenchBroker(root, "standalone-master", {**LOADED, "brokerRole": "SYNC_MASTER"})
    slave = BenchBroker(root, "standalone-slave", {
        **LOADED, "brokerRole": "SLAVE", "haMasterAddress": f"127.0.0.1:{master.ha_port}",
        "haMasterEndpoint": master.endpoint})
    everyone = [*group, master, slave]
    members = [m.client_url for m in etcd.members]
    runs: dict[str, list[float]] = {"controller": [], "standalone": []}
    cpu_runs: dict[str, list[float]] = {"controller": [], "standalone": []}
    failed = {"controller": 0, "standalone": 0}  # SendMessage RPCs answered with an error
    under_load: list[float] = []  # etcd requests per controller broker per second
    try:
        _start_all(everyone)
        _wait(lambda: _group_in_sync(group), 120,
              "the controller group's master with both brokers in its SyncStateSet")
        _wait(lambda: bool((master.ha_status() or {}).get("haConnectionInfo")), 60,
              "the standalone slave to connect")
        pairs = {"controller": _controller_pair(group), "standalone": (master, slave)}
        # Warm-up, not reported: first segments, page cache, the brokers' first puts.
        for pair in pairs.values():
            if warm_up_s > 0:
                asyncio.run(send_load(pair[0].endpoint, TOPIC, per_rpc, warm_up_s, inflight,
                                      body_size))
        modes = list(pairs)
        for r in range(rounds):
            for mode in modes[r % 2:] + modes[:r % 2]:  # each mode goes first every other round
                if mode == "controller":  # in sync again (and its master, should it change)
                    _wait(lambda: _group_in_sync(group), 120,
                          "the controller group's master with both brokers in its set")
                    pairs[mode] = _controller_pair(group)
                cpu = [b.cpu_seconds() for b in pairs[mode]]
                served, started = sum(etcd_requests(members).values()), time.monotonic()
                stats = asyncio.run(send_load(pairs[mode][0].endpoint, TOPIC, per_rpc, seconds,
                                              inflight, body_size))
                cpu = [b.cpu_seconds() - c for b, c in zip(pairs[mode], cpu, strict=True)]
                # Only the controller group speaks to etcd here: its requests under load.
                served = sum(etcd_requests(members).values()) - served
                extra: dict[str, Any] = {}
                if mode == "controller":
                    extra["etcdRequestsPerBrokerPerS"] = round(
                        served / (time.monotonic() - started) / len(group), 3)
                    under_load.append(extra["etcdRequestsPerBrokerPerS"])
                    # False: the slave left the set during the round (its master acked alone).
                    extra["syncStateSetHeld"] = _group_in_sync(group)
                if stats["failed_rpcs"]:  # reported, not hidden: the log says why
                    failed[mode] += stats["failed_rpcs"]
                    print(f"{mode}: {stats['failed_rpcs']} sends failed in round {r + 1}; "
                          f"the master's log ends:\n{pairs[mode][0].log_tail()}",
                          file=sys.stderr, flush=True)
                runs[mode].append(stats["msgs_per_s"])
                # CPU per message (the warm-up's 0.5 s included in both): steadier than
                # msgs/s on a shared machine, and where a cost on the put path would show.
                per_msg = [round(c * 1e6 / max(1, stats["messages"])) for c in cpu]
                cpu_runs[mode].append(per_msg[0])
                emit({"part": "throughput", "round": r + 1, "mode": mode, **stats,
                      "masterCpuUsPerMsg": per_msg[0], "slaveCpuUsPerMsg": per_msg[1],
                      **extra})
    finally:
        _stop_all(everyone)
    controller = statistics.median(runs["controller"])
    standalone = statistics.median(runs["standalone"])
    summary = {"summary": "throughput", "perRpc": per_rpc, "inflight": inflight,
               "bodySize": body_size, "rounds": rounds, "secondsPerRound": seconds,
               "controllerMsgsPerS": controller, "standaloneMsgsPerS": standalone,
               "ratio": round(controller / standalone, 3) if standalone else None,
               # Each round's two runs are back to back: their ratio cancels most of the
               # machine's drift (other work on a shared host) that the medians keep.
               "pairedRatioMedian": round(statistics.median(
                   c / s for c, s in zip(runs["controller"], runs["standalone"], strict=True)
               ), 3),
               "target": 0.9,
               "controllerMasterCpuUsPerMsg": statistics.median(cpu_runs["controller"]),
               "standaloneMasterCpuUsPerMsg": statistics.median(cpu_runs["standalone"]),
               "controllerEtcdRequestsPerBrokerPerS": statistics.median(under_load),
               "controllerFailedRpcs": failed["controller"],
               "standaloneFailedRpcs": failed["standalone"]}
    emit(summary)
    return summary


# -- scale -------------------------------------------------------------------------------------

_METRIC = re.compile(r'^grpc_server_started_total\{([^}]*)\}\s+([0-9.eE+]+)$')
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def etcd_requests(member_urls: Iterable[str]) -> dict[str, float]:
    """gRPC calls and streams the members have started, by method, summed over members (from
    each member's ``/metrics``)."""
    out: dict[str, float] = {}
    for url in member_urls:
        with urllib.request.urlopen(f"{url}/metrics", timeout=5) as reply:
            text = reply.read().decode()
        for line in text.splitlines():
            m = _METRIC.match(line)
            if m is None:
                continue
            labels = dict(_LABEL.findall(m.group(1)))
            method = labels.get("grpc_method", "?")
            out[method] = out.get(method, 0.0) + float(m.group(2))
    return out


def _client_counts(brokers: Iterable[BenchBroker]) -> int:
    return sum(int((b.cluster() or {}).get("etcdRequests") or 0) for b in brokers)


def run_scale(root: Path, etcd: EtcdCluster, emit: Emit, *, group_counts: list[int],
              seconds: float, ttl_ms: int | None, settle_s: float = 3.0) -> list[dict[str, Any]]:
    """Groups added up to each count in turn (the earlier ones keep running); at each count,
    etcd's requests per broker per second over ``seconds`` of steady state."""
    root = root / "scale"
    root.mkdir()
    members = [m.client_url for m in etcd.members]
    groups: list[list[BenchBroker]] = []
    results = []
    try:
        for count in sorted(group_counts):
            added: list[BenchBroker] = []
            while len(groups) < count:
                name = f"g{len(groups) + 1:02d}"
                pair = [BenchBroker(root, f"{name}-{i}", {
                    **SMALL, **_controller_settings(etcd.endpoints, name, i, ttl_ms)})
                    for i in (1, 2)]
                groups.append(pair)
                added += pair
            _start_all(added)
            _wait(lambda: all(_group_in_sync(g) for g in groups), 60 + 20 * count,
                  f"{count} groups each with a master and its slave in the SyncStateSet")
            time.sleep(settle_s)  # the last joins' writes are not steady state
            brokers = [b for g in groups for b in g]
            before, client_before = etcd_requests(members), _client_counts(brokers)
            started = time.monotonic()
            time.sleep(seconds)
            after, client_after = etcd_requests(members), _client_counts(brokers)
            elapsed = time.monotonic() - started
            if not all(_group_in_sync(g) for g in groups):
                raise RuntimeError(f"with {count} groups, a group lost its master or slave "
                                   "during the window: not a steady state")
            per_method = {k: round((after.get(k, 0) - before.get(k, 0)) / elapsed
                                   / len(brokers), 3) for k in after}
            per_method = {k: v for k, v in per_method.items() if v}
            total = sum(after.values()) - sum(before.values())
            line: dict[str, Any] = {"part": "scale", "groups": count, "brokers": len(brokers),
                    "etcdMembers": len(members), "seconds": round(elapsed, 2),
                    "leaseTtlMs": ttl_ms or BrokerConfig().etcd_lease_ttl_ms,
                    "etcdRequestsPerBrokerPerS": round(total / elapsed / len(brokers), 3),
                    "byMethod": per_method,
                    "clientCountedPerBrokerPerS": round(
                        (client_after - client_before) / elapsed / len(brokers), 3),
                    "target": 1.0}
            results.append(line)
            emit(line)
    finally:
        _stop_all(b for g in groups for b in g)
    if results:
        rates = [r["etcdRequestsPerBrokerPerS"] for r in results]
        emit({"summary": "scale", "groups": [r["groups"] for r in results],
              "etcdRequestsPerBrokerPerS": rates,
              "mostOverFewest": round(rates[-1] / rates[0], 3) if rates[0] else None,
              "target": 1.0})
    return results
