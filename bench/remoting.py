"""Remoting benchmark: RocketMQ 4.x remoting sends against gRPC sends on the same broker in the
same run, gRPC through the shared port against gRPC direct, and NameServer route lookups per
second.

    python bench/remoting.py [--seconds S] [--rounds R] [--inflight N] [--body-size B]

Prints one JSON object per line:

* ``load`` per protocol and workload: ``send1`` (remoting ``SEND_MESSAGE_V2`` / gRPC
  ``SendMessage`` with one message) and ``send16`` (``SEND_BATCH_MESSAGE`` / ``SendMessage``
  with 16); ``--inflight`` requests in flight over 4 connections; msgs/s, p50/p99 (ms) and the
  broker's CPU per message; medians over ``--rounds`` (rounds alternate the protocols).
* ``ratio``: remoting over gRPC per workload (throughput > 1: remoting faster; CPU per message
  < 1: remoting cheaper), the issue's target being >= 1.0; and gRPC through the shared port
  (``grpc_shared``: the broker's listen port, relayed to gRPC's loopback port) over gRPC
  called at that loopback port directly: what one port for both protocols costs gRPC
  (target >= 0.9).
* ``namesrv``: ``GET_ROUTEINFO_BY_TOPIC`` lookups per second against ``stratamq namesrv``.

Everything runs on this machine (the load generator included), so figures are relative.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from broker import Server, emit, summarize  # noqa: E402

from stratamq.benchmarks.grpc_load import percentile, send_load  # noqa: E402
from stratamq.remoting.codec import RemotingCommand  # noqa: E402
from stratamq.remoting.codes import RequestCode, ResponseCode  # noqa: E402
from stratamq.remoting.transport import RemotingClient  # noqa: E402

TOPIC = "BenchRemoting"


def _batch_body(count: int, body: bytes) -> bytes:
    out = b""
    for i in range(count):
        props = f"UNIQ_KEY\x01{i:032X}\x02".encode()
        size = 20 + len(body) + 2 + len(props)
        out += struct.pack(">iiiii", size, 0, 0, 0, len(body)) + body
        out += struct.pack(">h", len(props)) + props
    return out


async def remoting_send_load(address: str, per_rpc: int, seconds: float, inflight: int,
                             body_size: int, connections: int = 4) -> dict:
    clients = [RemotingClient(address) for _ in range(connections)]
    conns = [await c.connect() for c in clients]
    body = b"x" * body_size
    batch = _batch_body(per_rpc, body) if per_rpc > 1 else body
    code = RequestCode.SEND_BATCH_MESSAGE if per_rpc > 1 else RequestCode.SEND_MESSAGE_V2
    ids = itertools.count(int(time.time() * 1e6) << 16)
    turn = itertools.count()
    latencies: list[float] = []
    sent = failed = 0

    async def one() -> None:
        nonlocal sent, failed
        fields = {"a": "bench", "b": TOPIC, "e": "-1", "f": "0", "h": "0",
                  "g": str(int(time.time() * 1000)),
                  "i": f"UNIQ_KEY\x01{next(ids):032X}\x02" if per_rpc == 1 else ""}
        started = time.perf_counter()
        reply = await conns[next(turn) % len(conns)].invoke(
            RemotingCommand(code, ext_fields=fields, body=batch), 60)
        latencies.append(time.perf_counter() - started)
        if reply.code == ResponseCode.SUCCESS:
            sent += per_rpc
        else:
            failed += 1

    async def workers(span: float) -> float:
        loop = asyncio.get_running_loop()
        stop_at, began = loop.time() + span, loop.time()

        async def worker() -> None:
            while loop.time() < stop_at:
                await one()

        await asyncio.gather(*(worker() for _ in range(inflight)))
        return loop.time() - began

    try:
        await workers(0.5)
        latencies.clear()
        sent = failed = 0
        span = await workers(seconds)
    finally:
        for c in clients:
            await c.close()
    return {"messages": sent, "failed_rpcs": failed, "msgs_per_s": round(sent / span, 1),
            "p50_ms": round(percentile(latencies, 0.5) * 1000, 3),
            "p99_ms": round(percentile(latencies, 0.99) * 1000, 3)}


async def route_lookups(address: str, seconds: float, inflight: int) -> float:
    client = RemotingClient(address)
    conn = await client.connect()
    done = 0
    loop = asyncio.get_running_loop()
    stop_at = loop.time() + seconds

    async def worker() -> None:
        nonlocal done
        while loop.time() < stop_at:
            reply = await conn.invoke(RemotingCommand(RequestCode.GET_ROUTEINFO_BY_TOPIC,
                                                      ext_fields={"topic": TOPIC}), 30)
            assert reply.code == ResponseCode.SUCCESS, reply.remark
            done += 1

    began = loop.time()
    await asyncio.gather(*(worker() for _ in range(inflight)))
    elapsed = loop.time() - began
    await client.close()
    return done / elapsed


def _median_row(protocol: str, workload: str, rs: list[dict]) -> dict:
    row = summarize(protocol, workload, rs)  # (bench/broker.py's medians, "target" named)
    return {"kind": "load", "protocol": row.pop("target"),
            **{k: v for k, v in row.items() if k != "kind"}}


def _ratio(workload: str, of: str, top: list[dict], bottom: list[dict], target: float) -> dict:
    ratios = [t["msgs_per_s"] / b["msgs_per_s"] for t, b in zip(top, bottom, strict=True)]
    cpu = [t["server_cpu_us_per_msg"] / b["server_cpu_us_per_msg"]
           for t, b in zip(top, bottom, strict=True)]
    return {"kind": "ratio", "workload": workload, "of": of,
            "msgs_per_s": round(statistics.median(ratios), 3),
            "server_cpu_per_msg": round(statistics.median(cpu), 3), "target": target}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--inflight", type=int, default=64)
    parser.add_argument("--body-size", type=int, default=1024)
    args = parser.parse_args()
    import socket

    from stratamq.broker.metadata import MetadataStore

    with tempfile.TemporaryDirectory(prefix="stratamq-bench-remoting-") as tmp:
        workdir = Path(tmp)
        namesrv = Server([sys.executable, "-m", "stratamq.cli", "namesrv", "start",
                          "--listen", "127.0.0.1:0"])
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        MetadataStore(workdir / "store").create_topic(TOPIC, 8)
        conf = workdir / "broker.conf"
        # One port for both protocols: remoting and gRPC (relayed to gRPC's loopback port,
        # which the bench also calls directly, to measure the relay).
        conf.write_text("mappedFileSizeCommitLog=268435456\nhaListenPort=0\n"
                        f"remotingListenPort={port}\nnamesrvAddr={namesrv.endpoint}\n")
        broker = Server([sys.executable, "-m", "stratamq.cli", "broker", "start", "--config",
                         str(conf), "--store", str(workdir / "store"), "--listen",
                         f"127.0.0.1:{port}"], wait_for="remoting (RocketMQ 4.x clients)")
        relayed = broker.waited.split("relayed to ", 1)[1].split(")")[0]
        shared = f"127.0.0.1:{port}"
        emit({"kind": "env", "python": sys.version.split()[0], "seconds": args.seconds,
              "rounds": args.rounds, "inflight": args.inflight, "body_size": args.body_size,
              "shared_port": shared, "grpc_direct": relayed})
        try:
            for workload, per_rpc in (("send1", 1), ("send16", 16)):
                runs: dict[str, list[dict]] = {"remoting": [], "grpc": [], "grpc_shared": []}
                for _ in range(args.rounds):
                    for protocol in runs:
                        cpu = broker.cpu_seconds()
                        coro = (remoting_send_load(shared, per_rpc, args.seconds,
                                                   args.inflight, args.body_size)
                                if protocol == "remoting" else
                                send_load(relayed if protocol == "grpc" else shared, TOPIC,
                                          per_rpc, args.seconds, args.inflight,
                                          args.body_size))
                        stats = asyncio.run(coro)
                        stats["server_cpu_us_per_msg"] = round(
                            (broker.cpu_seconds() - cpu) / max(1, stats["messages"]) * 1e6, 1)
                        runs[protocol].append(stats)
                for protocol, rs in runs.items():
                    emit(_median_row(protocol, workload, rs))
                emit(_ratio(workload, "remoting/grpc", runs["remoting"], runs["grpc"], 1.0))
                emit(_ratio(workload, "grpc_shared/grpc", runs["grpc_shared"], runs["grpc"],
                            0.9))
            per_s = asyncio.run(route_lookups(namesrv.endpoint, args.seconds, 16))
            emit({"kind": "namesrv", "route_lookups_per_s": round(per_s, 1)})
        finally:
            broker.stop()
            namesrv.stop()
    print(json.dumps({"kind": "done"}), flush=True)


if __name__ == "__main__":
    main()
