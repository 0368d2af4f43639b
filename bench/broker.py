"""Broker benchmark: the official Python client against the real broker and against a
do-nothing gRPC server, in the same run, so the ratio is the broker's own cost.

    python bench/broker.py [--quick] [--producers N] [--messages M] [--body-size B]

Prints one JSON object per line:

* ``env``: interpreter, counts;
* ``send`` per target (``broker``, ``baseline``): messages/s over all producer processes, p50
  and p99 send latency (ms) of the client's synchronous ``Producer.send``;
* ``receive_ack`` per target: messages/s for one SimpleConsumer receiving (batch 32) and
  acking each message;
* ``ratio``: broker over baseline (throughput: < 1 means slower; latency: > 1 means slower).

The baseline server (``--null-server PORT``, run as its own process like the broker) answers
QueryRoute with one queue, Heartbeat/Telemetry/NotifyClientTermination with OK, SendMessage
with OK without storing anything, ReceiveMessage with a ready batch of 32 messages and
AckMessage with OK. Both servers run on this machine with the clients, so they share the
CPUs (2 here): treat figures as relative.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent import futures
from pathlib import Path

TOPIC = "BenchTopic"
GROUP = "BenchGroup"


# -- the do-nothing server ---------------------------------------------------------------------


def serve_null(port: int) -> None:
    import grpc
    from rocketmq.grpc_protocol import definition_pb2 as pb
    from rocketmq.grpc_protocol import service_pb2 as svc
    from rocketmq.grpc_protocol import service_pb2_grpc

    ok = pb.Status(code=pb.Code.OK, message="OK")
    endpoints = pb.Endpoints(scheme=pb.IPv4, addresses=[pb.Address(host="127.0.0.1",
                                                                   port=port)])
    broker = pb.Broker(name="null", id=0, endpoints=endpoints)
    body = b"x" * 1024

    class Null(service_pb2_grpc.MessagingServiceServicer):
        def QueryRoute(self, request, context):
            queue = pb.MessageQueue(topic=request.topic, id=0, permission=pb.READ_WRITE,
                                    broker=broker, accept_message_types=[pb.NORMAL])
            return svc.QueryRouteResponse(status=ok, message_queues=[queue])

        def QueryAssignment(self, request, context):
            queue = pb.MessageQueue(topic=request.topic, id=-1, permission=pb.READ_WRITE,
                                    broker=broker, accept_message_types=[pb.NORMAL])
            return svc.QueryAssignmentResponse(status=ok, assignments=[
                pb.Assignment(message_queue=queue)])

        def Heartbeat(self, request, context):
            return svc.HeartbeatResponse(status=ok)

        def NotifyClientTermination(self, request, context):
            return svc.NotifyClientTerminationResponse(status=ok)

        def Telemetry(self, request_iterator, context):
            for command in request_iterator:
                if command.HasField("settings"):
                    yield svc.TelemetryCommand(status=ok, settings=command.settings)

        def SendMessage(self, request, context):
            entries = [svc.SendResultEntry(status=ok, message_id=m.system_properties.message_id,
                                           offset=0) for m in request.messages]
            return svc.SendMessageResponse(status=ok, entries=entries)

        def ReceiveMessage(self, request, context):
            yield svc.ReceiveMessageResponse(status=ok)
            for i in range(request.batch_size):
                sp = pb.SystemProperties(message_id=f"null-{time.time_ns()}-{i}",
                                         body_encoding=pb.IDENTITY, message_type=pb.NORMAL,
                                         receipt_handle=f"h{i}", queue_id=0, delivery_attempt=1,
                                         born_host="127.0.0.1")
                sp.born_timestamp.GetCurrentTime()
                sp.store_timestamp.GetCurrentTime()
                yield svc.ReceiveMessageResponse(message=pb.Message(
                    topic=request.message_queue.topic, body=body, system_properties=sp))
            ts = svc.ReceiveMessageResponse()
            ts.delivery_timestamp.GetCurrentTime()
            yield ts

        def AckMessage(self, request, context):
            return svc.AckMessageResponse(status=ok, entries=[
                svc.AckMessageResultEntry(message_id=e.message_id, receipt_handle=e.receipt_handle,
                                          status=ok) for e in request.entries])

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=64))
    service_pb2_grpc.add_MessagingServiceServicer_to_server(Null(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    print(f"null server listening on 127.0.0.1:{port}", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: server.stop(0))
    server.wait_for_termination()


# -- client workloads (each in its own process) ------------------------------------------------


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


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def run_target(name: str, endpoint: str, producers: int, messages: int, body_size: int
               ) -> tuple[dict, dict]:
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
    send = {"kind": "send", "target": name, "producers": producers, "messages": total,
            "body_size": body_size, "msgs_per_s": round(total / span, 1),
            "p50_ms": round(_pct(lat, 0.50) * 1000, 3),
            "p99_ms": round(_pct(lat, 0.99) * 1000, 3),
            "mean_ms": round(statistics.fmean(lat) * 1000, 3)}
    # Everything sent (plus the warm-up sends) is there to receive on the broker.
    consumer = ctx.Process(target=consume, args=(endpoint, total, out))
    consumer.start()
    r = out.get(timeout=900)
    consumer.join()
    span = r["end"] - r["start"]
    recv = {"kind": "receive_ack", "target": name, "messages": r["count"],
            "msgs_per_s": round(r["count"] / span, 1) if span else 0.0}
    return send, recv


def _start(cmd: list[str], marker: str, env: dict | None = None) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env)
    while True:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{cmd[0]} exited before serving")
        if marker in line:
            # Drain the rest: a full pipe would stall the server on a log line mid-run.
            threading.Thread(target=proc.stdout.read, daemon=True).start()
            return proc, line.split(marker, 1)[1].split()[0]


def _stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small counts (under a minute)")
    parser.add_argument("--producers", type=int, default=None)
    parser.add_argument("--messages", type=int, default=None, help="per producer")
    parser.add_argument("--body-size", type=int, default=1024)
    parser.add_argument("--null-server", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.null_server is not None:
        serve_null(args.null_server)
        return
    producers = args.producers or (2 if args.quick else 4)
    messages = args.messages or (200 if args.quick else 2000)
    print(json.dumps({"kind": "env", "python": platform.python_version(),
                      "cpus": os.cpu_count(), "producers": producers,
                      "messages_per_producer": messages, "body_size": args.body_size}),
          flush=True)

    workdir = Path(tempfile.mkdtemp(prefix="stratamq-bench-broker-"))
    figures = {}
    try:
        from stratamq.broker.metadata import MetadataStore

        store = workdir / "store"
        MetadataStore(store).create_topic(TOPIC, 1, "NORMAL")
        conf = workdir / "broker.conf"
        conf.write_text("mappedFileSizeCommitLog=67108864\n")
        root = Path(__file__).resolve().parents[1]
        env = {**os.environ, "PYTHONPATH": str(root)}
        broker, endpoint = _start([sys.executable, "-m", "stratamq.cli", "broker", "start",
                                   "--config", str(conf), "--store", str(store), "--listen",
                                   "127.0.0.1:0"], "listening on", env)
        try:
            figures["broker"] = run_target("broker", endpoint, producers, messages,
                                           args.body_size)
        finally:
            _stop(broker)
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        null, endpoint = _start([sys.executable, __file__, "--null-server", str(port)],
                                "listening on", env)
        try:
            figures["baseline"] = run_target("baseline", endpoint, producers, messages,
                                             args.body_size)
        finally:
            _stop(null)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    for target in ("broker", "baseline"):
        for line in figures[target]:
            print(json.dumps(line), flush=True)
    (bs, br), (ns, nr) = figures["broker"], figures["baseline"]
    print(json.dumps({"kind": "ratio", "of": "broker/baseline",
                      "send_msgs_per_s": round(bs["msgs_per_s"] / ns["msgs_per_s"], 3),
                      "send_p50": round(bs["p50_ms"] / ns["p50_ms"], 3),
                      "send_p99": round(bs["p99_ms"] / ns["p99_ms"], 3),
                      "receive_ack_msgs_per_s": round(br["msgs_per_s"] / nr["msgs_per_s"], 3)
                      if nr["msgs_per_s"] else None}), flush=True)


if __name__ == "__main__":
    main()
