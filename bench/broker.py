"""Broker benchmark: a raw asynchronous gRPC load generator against the broker and against a
do-nothing gRPC server in the same run, so the ratio is the broker's own cost; then the
connections a broker holds while it keeps serving; then the official Python client's figures.

    python bench/broker.py [--quick] [--seconds S] [--rounds R] [--inflight N]
                           [--idle-clients C] [--idle-channels K] [--pending-polls P]
                           [--skip-official]

Prints one JSON object per line:

* ``env``: interpreter, CPUs, the settings of the run.
* ``load`` per target and workload: ``target`` is ``broker`` (ASYNC_FLUSH), ``broker_sync``
  (SYNC_FLUSH), ``null`` (a do-nothing ``grpc.aio`` server that parses the same requests and
  answers OK, a ready batch of 32, or OK per ack entry) or ``null_threads`` (the same on a
  thread-pool server); ``workload`` is ``send1`` / ``send16`` (SendMessage with 1 or 16
  messages of ``--body-size`` bytes, ``--inflight`` RPCs in flight) or ``receive_ack``
  (ReceiveMessage batch 32, then one AckMessage for what came). msgs/s and p50/p99 latency
  (ms) of the RPC (receive + ack together for receive_ack), medians over ``--rounds``.
* ``ratio``: broker over null per workload (throughput: < 1 is slower), each the median of
  the per-round ratios (rounds alternate the targets, so a noisy neighbour hits both), with
  the issue's target, and ``server_cpu_per_msg``, the server's CPU per message broker over
  null (> 1 costs more; steadier than throughput on a shared machine); and SYNC_FLUSH over
  ASYNC_FLUSH for send16.
* ``connections``: ``--idle-clients`` clients each holding an open Telemetry stream (over
  ``--idle-channels`` TCP connections) and ``--pending-polls`` 20-second long polls on an
  empty topic, while one producer sends 1 message per RPC, one at a time: its p50/p99 with
  and without the idle load, the broker's resident memory before and after, and per idle
  client, and how many polls came back early (should be 0).
* ``official``: the official client (``rocketmq-python-client``): producer processes sending
  synchronously and one SimpleConsumer receiving (32) and acking, against the broker and the
  null server (the client is the bottleneck; kept for comparison).

Everything runs on this machine (the load generator included), so figures are relative.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from stratamq.benchmarks.grpc_load import (  # noqa: E402
    idle_clients,
    percentile,
    receive_ack_load,
    send_load,
)

TOPIC = "BenchTopic"
GROUP = "BenchGroup"
TARGETS = {"send1": 0.7, "send16": 0.5, "receive_ack": 0.5}  # broker/null, from the issue
SYNC_TARGET = 0.7  # SYNC_FLUSH over ASYNC_FLUSH, send16


def emit(obj: dict) -> None:
    print(json.dumps(obj), flush=True)


# -- processes -----------------------------------------------------------------------------------


class Server:
    """A server subprocess that prints ``listening on HOST:PORT`` once serving."""

    def __init__(self, cmd: list[str], env: dict[str, str] | None = None,
                 wait_for: str = "") -> None:
        """``wait_for``: also read on to the first line holding this text (``self.waited``)."""
        env = {**os.environ, **(env or {}), "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env=env)
        assert self.proc.stdout is not None
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"{cmd} exited before serving")
            if "listening on" in line:
                self.endpoint = line.split("listening on", 1)[1].split()[0]
                break
        self.waited = ""
        while wait_for and wait_for not in self.waited:
            self.waited = self.proc.stdout.readline()
            if not self.waited:
                raise RuntimeError(f"{cmd} exited before printing {wait_for!r}")
        # Drain the rest: a full pipe would stall the server on a log line mid-run.
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()

    def cpu_seconds(self) -> float:
        """User + system CPU time the server process used so far."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def start_broker(workdir: Path, name: str, settings: str = "") -> Server:
    from stratamq.broker.metadata import MetadataStore

    store = workdir / name
    meta = MetadataStore(store)
    for topic in (TOPIC, f"{TOPIC}16", "IdleTopic"):
        meta.create_topic(topic, 8, "NORMAL")
    conf = workdir / f"{name}.conf"
    # haListenPort=0: every broker gets an HA server on a free port, as a broker does by
    # default; with the fixed 10912 only the first broker of a run got one (the next failed to
    # bind and served without it), so the brokers compared were not alike.
    conf.write_text("mappedFileSizeCommitLog=268435456\nhaListenPort=0\n" + settings)
    return Server([sys.executable, "-m", "stratamq.cli", "broker", "start", "--config",
                   str(conf), "--store", str(store), "--listen", "127.0.0.1:0"])


def start_null(kind: str) -> Server:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return Server([sys.executable, "-c", "from stratamq.benchmarks.grpc_load import "
                   f"serve_null; serve_null({port}, {kind!r})"])


# -- raw load ------------------------------------------------------------------------------------


def run_load(workload: str, server: Server, args: argparse.Namespace) -> dict:
    endpoint = server.endpoint
    if workload == "receive_ack":
        coro = receive_ack_load(endpoint, f"{TOPIC}16", args.seconds, args.inflight)
    else:
        per_rpc = int(workload.removeprefix("send"))
        topic = TOPIC if per_rpc == 1 else f"{TOPIC}16"
        coro = send_load(endpoint, topic, per_rpc, args.seconds, args.inflight, args.body_size)
    cpu = server.cpu_seconds()
    stats = asyncio.run(coro)
    cpu = server.cpu_seconds() - cpu  # includes the warm-up: a little high for short runs
    stats["server_cpu_us_per_msg"] = round(cpu / max(1, stats["messages"]) * 1e6, 1)
    return stats


def summarize(target: str, workload: str, runs: list[dict]) -> dict:
    return {"kind": "load", "target": target, "workload": workload, "rounds": len(runs),
            "msgs_per_s": statistics.median(r["msgs_per_s"] for r in runs),
            "p50_ms": statistics.median(r["p50_ms"] for r in runs),
            "p99_ms": statistics.median(r["p99_ms"] for r in runs),
            "failed_rpcs": sum(r["failed_rpcs"] for r in runs),
            "server_cpu_us_per_msg": statistics.median(r["server_cpu_us_per_msg"] for r in runs),
            "per_round_msgs_per_s": [r["msgs_per_s"] for r in runs]}


def raw_load(args: argparse.Namespace, workdir: Path) -> None:
    servers = {"broker": start_broker(workdir, "broker"), "null": start_null("aio"),
               "null_threads": start_null("sync"),
               "broker_sync": start_broker(workdir, "broker_sync", "flushDiskType=SYNC_FLUSH\n")}
    try:
        plan = [("send1", ["broker", "null", "null_threads"]),
                ("send16", ["broker", "broker_sync", "null", "null_threads"]),
                # After the sends: the broker's 16-message topic holds what it receives.
                ("receive_ack", ["broker", "null", "null_threads"])]
        for workload, targets in plan:
            runs: dict[str, list[dict]] = {t: [] for t in targets}
            for _ in range(args.rounds):
                for target in targets:
                    runs[target].append(run_load(workload, servers[target], args))
            for target in targets:
                emit(summarize(target, workload, runs[target]))
            for base in ("null", "null_threads"):
                ratios = [b["msgs_per_s"] / n["msgs_per_s"]
                          for b, n in zip(runs["broker"], runs[base]) if n["msgs_per_s"]]
                # Server CPU per message, broker over null: steadier than throughput on a
                # shared machine (a neighbour's burst slows a round, not the CPU it takes).
                cpu = [b["server_cpu_us_per_msg"] / n["server_cpu_us_per_msg"]
                       for b, n in zip(runs["broker"], runs[base])
                       if n["server_cpu_us_per_msg"]]
                emit({"kind": "ratio", "workload": workload, "of": f"broker/{base}",
                      "msgs_per_s": round(statistics.median(ratios), 3),
                      "per_round": [round(r, 3) for r in ratios],
                      "target": TARGETS[workload] if base == "null" else None,
                      "server_cpu_per_msg": round(statistics.median(cpu), 2) if cpu else None})
            if "broker_sync" in runs:
                ratios = [s["msgs_per_s"] / b["msgs_per_s"]
                          for s, b in zip(runs["broker_sync"], runs["broker"])]
                emit({"kind": "ratio", "workload": workload, "of": "broker_sync/broker",
                      "msgs_per_s": round(statistics.median(ratios), 3),
                      "per_round": [round(r, 3) for r in ratios], "target": SYNC_TARGET})
    finally:
        for server in servers.values():
            server.stop()


# -- connections ---------------------------------------------------------------------------------


async def _producer(endpoint: str, seconds: float) -> list[float]:
    """One producer sending 1 message per RPC, one at a time: its latencies (s)."""
    stats = await send_load(endpoint, TOPIC, 1, seconds, inflight=1, channels=1)
    return [stats["p50_ms"], stats["p99_ms"], stats["msgs_per_s"]]


async def _connections(broker: Server, args: argparse.Namespace) -> dict:
    endpoint = broker.endpoint
    alone = await _producer(endpoint, args.seconds)
    rss_before = broker.rss_bytes()
    held, ready = asyncio.Event(), asyncio.Event()
    counts: dict[str, int] = {}
    idle = asyncio.ensure_future(idle_clients(endpoint, args.idle_clients, args.idle_channels,
                                              args.pending_polls, "IdleTopic", held, ready,
                                              counts))
    started = time.monotonic()
    await asyncio.wait({idle, asyncio.ensure_future(ready.wait())},
                       return_when=asyncio.FIRST_COMPLETED)
    if idle.done():
        idle.result()  # raises what went wrong
    opened_s = time.monotonic() - started
    await asyncio.sleep(1.0)  # let the broker register the polls it was sent
    rss_after = broker.rss_bytes()
    loaded = await _producer(endpoint, args.seconds)
    held.set()
    await idle
    per_client = (rss_after - rss_before) / max(1, args.idle_clients)
    return {"kind": "connections", "idle_clients": args.idle_clients,
            "idle_channels": args.idle_channels, "pending_polls": args.pending_polls,
            "streams_answered": counts["streams"], "polls_sent": counts["polls"],
            "polls_back_early": counts["early"], "open_s": round(opened_s, 2),
            "send_alone": {"p50_ms": alone[0], "p99_ms": alone[1], "msgs_per_s": alone[2]},
            "send_with_idle": {"p50_ms": loaded[0], "p99_ms": loaded[1],
                               "msgs_per_s": loaded[2]},
            "p99_target_ms": 50, "rss_before_mib": round(rss_before / 2**20, 1),
            "rss_after_mib": round(rss_after / 2**20, 1),
            "bytes_per_idle_client": round(per_client)}


def connections(args: argparse.Namespace, workdir: Path) -> None:
    broker = start_broker(workdir, "broker_conn", "popPollingSize=100000\n"
                          "popPollingSizePerClient=100000\n")
    try:
        emit(asyncio.run(_connections(broker, args)))
    finally:
        broker.stop()


# -- the official client (each workload in its own process) --------------------------------------


def _quiet_client_logs() -> None:
    import logging

    logging.getLogger("rocketmq").setLevel(logging.ERROR)


def produce(endpoint: str, count: int, body_size: int, out: mp.Queue, ready) -> None:
    _quiet_client_logs()
    from rocketmq import ClientConfiguration, Credentials, Message, Producer

    producer = Producer(ClientConfiguration(endpoint, Credentials()), (TOPIC,))
    producer.startup()
    body = os.urandom(body_size)
    warm = Message()
    warm.topic, warm.body = TOPIC, body
    producer.send(warm)  # first send pays for channel set-up; not measured
    ready.wait()  # every producer starts measuring together
    latencies = []
    start = time.time()
    for _ in range(count):
        m = Message()
        m.topic, m.body = TOPIC, body
        t = time.perf_counter()
        producer.send(m)
        latencies.append(time.perf_counter() - t)
    end = time.time()
    producer.shutdown()
    out.put({"start": start, "end": end, "latencies": latencies})


def consume(endpoint: str, count: int, out: mp.Queue) -> None:
    _quiet_client_logs()
    from rocketmq import ClientConfiguration, Credentials, FilterExpression, SimpleConsumer

    consumer = SimpleConsumer(ClientConfiguration(endpoint, Credentials()), GROUP,
                              {TOPIC: FilterExpression("*")})
    consumer.startup()
    got = 0
    start = time.time()
    deadline = time.monotonic() + 300
    while got < count and time.monotonic() < deadline:
        for m in consumer.receive(32, 15) or []:
            consumer.ack(m)
            got += 1
    end = time.time()
    consumer.shutdown()
    out.put({"start": start, "end": end, "count": got})


def official_target(name: str, endpoint: str, producers: int, messages: int,
                    body_size: int) -> None:
    ctx = mp.get_context("spawn")
    out: mp.Queue = ctx.Queue()
    ready = ctx.Barrier(producers)
    procs = [ctx.Process(target=produce, args=(endpoint, messages, body_size, out, ready))
             for _ in range(producers)]
    for p in procs:
        p.start()
    results = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    total = producers * messages
    lat = [x for r in results for x in r["latencies"]]
    span = max(r["end"] for r in results) - min(r["start"] for r in results)
    emit({"kind": "official", "workload": "send", "target": name, "producers": producers,
          "messages": total, "msgs_per_s": round(total / span, 1),
          "p50_ms": round(percentile(lat, 0.50) * 1000, 3),
          "p99_ms": round(percentile(lat, 0.99) * 1000, 3)})
    consumer = ctx.Process(target=consume, args=(endpoint, total, out))
    consumer.start()
    r = out.get(timeout=900)
    consumer.join()
    span = r["end"] - r["start"]
    emit({"kind": "official", "workload": "receive_ack", "target": name,
          "messages": r["count"], "msgs_per_s": round(r["count"] / span, 1) if span else 0.0})


def official(args: argparse.Namespace, workdir: Path) -> None:
    for name, starter in (("broker", lambda: start_broker(workdir, "broker_official")),
                          ("null", lambda: start_null("aio"))):
        server = starter()
        try:
            official_target(name, server.endpoint, args.producers, args.messages,
                            args.body_size)
        finally:
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short runs (a few minutes)")
    parser.add_argument("--seconds", type=float, default=None, help="per measured run")
    parser.add_argument("--rounds", type=int, default=None, help="alternating rounds")
    parser.add_argument("--inflight", type=int, default=64)
    parser.add_argument("--body-size", type=int, default=1024)
    parser.add_argument("--idle-clients", type=int, default=None)
    parser.add_argument("--idle-channels", type=int, default=None)
    parser.add_argument("--pending-polls", type=int, default=None)
    parser.add_argument("--producers", type=int, default=None, help="official client")
    parser.add_argument("--messages", type=int, default=None, help="official, per producer")
    parser.add_argument("--skip-official", action="store_true")
    parser.add_argument("--only", choices=("load", "connections", "official"), default=None)
    args = parser.parse_args()
    quick = args.quick
    args.seconds = args.seconds or (3.0 if quick else 6.0)
    args.rounds = args.rounds or (3 if quick else 5)
    args.idle_clients = args.idle_clients or (1000 if quick else 5000)
    args.idle_channels = args.idle_channels or (50 if quick else 250)
    args.pending_polls = args.pending_polls if args.pending_polls is not None else (
        200 if quick else 1000)
    args.producers = args.producers or 2
    args.messages = args.messages or (200 if quick else 1000)
    emit({"kind": "env", "python": platform.python_version(), "cpus": os.cpu_count(),
          "load_average": os.getloadavg(), **{k: v for k, v in vars(args).items()}})
    workdir = Path(tempfile.mkdtemp(prefix="stratamq-bench-broker-"))
    try:
        if args.only in (None, "load"):
            raw_load(args, workdir)
        if args.only in (None, "connections"):
            connections(args, workdir)
        if args.only == "official" or (args.only is None and not args.skip_official):
            official(args, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
