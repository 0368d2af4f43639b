"""A raw asynchronous gRPC load generator for the broker, and the do-nothing servers it is
measured against (run through ``bench/broker.py``).

The generator (``grpc.aio`` stubs over the official client's protocol modules) keeps a fixed
number of RPCs in flight and records each one's latency. Requests are serialized once and only
their message ids (a fixed-width counter) are rewritten per call, so the generator spends its
time on gRPC, not on building protobufs: the figures are the server's, as far as one Python
process can push.

* ``send_load``: ``SendMessage`` with ``per_rpc`` messages of ``body_size`` bytes each.
* ``receive_ack_load``: ``ReceiveMessage`` (batch 32), then one ``AckMessage`` for everything
  received; stops early when the topic runs dry (an empty receive).
* ``idle_clients``: many open ``Telemetry`` streams and pending long polls, held until told.

``serve_null(port, kind)``: a server that parses the same requests and answers OK
(``SendMessage``), a ready batch of 32 messages (``ReceiveMessage``) or OK per entry
(``AckMessage``); ``kind`` ``aio`` (``grpc.aio``, what the broker runs on) or ``sync`` (a
thread pool, what the broker ran on before).
"""

from __future__ import annotations

import asyncio
import itertools
import signal
import time
from collections.abc import Callable
from concurrent import futures
from typing import Any

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc

__all__ = ["idle_clients", "percentile", "receive_ack_load", "send_load", "serve_null"]

_SERVICE = "/apache.rocketmq.v2.MessagingService/"
_ID_WIDTH = 32  # hex digits of a message id, as the official clients make them
_PLACEHOLDER = "f" * _ID_WIDTH
_GROUP = "BenchGroup"


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _channel(endpoint: str) -> grpc.aio.Channel:
    # A subchannel pool of its own: each channel is its own TCP connection, as each client's is.
    return grpc.aio.insecure_channel(endpoint, options=[("grpc.use_local_subchannel_pool", 1)])


def _raw(channel: grpc.aio.Channel, method: str, response: Any) -> Any:
    return channel.unary_unary(_SERVICE + method, request_serializer=None,
                               response_deserializer=response.FromString)


class _SendTemplate:
    """A serialized SendMessageRequest whose message ids are rewritten per call."""

    def __init__(self, topic: str, per_rpc: int, body: bytes) -> None:
        request = svc.SendMessageRequest()
        for _ in range(per_rpc):
            m = request.messages.add()
            m.topic.name = topic
            m.body = body
            sp = m.system_properties
            sp.message_id = _PLACEHOLDER
            sp.message_type = pb.NORMAL
            sp.body_encoding = pb.IDENTITY
            sp.born_host = "127.0.0.1"
            sp.born_timestamp.GetCurrentTime()
        self.data = bytearray(request.SerializeToString())
        marker = _PLACEHOLDER.encode()
        self.positions = []
        at = self.data.find(marker)
        while at >= 0:
            self.positions.append(at)
            at = self.data.find(marker, at + 1)
        assert len(self.positions) == per_rpc
        self.ids = itertools.count(int(time.time() * 1e6) << 16)

    def next(self) -> bytes:
        for at in self.positions:
            self.data[at:at + _ID_WIDTH] = b"%032X" % next(self.ids)
        return bytes(self.data)


async def _workers(count: int, seconds: float, one: Callable[[], Any]) -> float:
    loop = asyncio.get_running_loop()
    stop_at = loop.time() + seconds
    started = loop.time()

    async def worker() -> None:
        while loop.time() < stop_at:
            if await one() is False:
                return

    await asyncio.gather(*(worker() for _ in range(count)))
    return loop.time() - started


async def send_load(endpoint: str, topic: str, per_rpc: int, seconds: float, inflight: int = 64,
                    body_size: int = 1024, channels: int = 4) -> dict[str, Any]:
    """``inflight`` SendMessage RPCs at all times for ``seconds``: msgs/s and latencies (ms)."""
    chans = [_channel(endpoint) for _ in range(channels)]
    calls = [_raw(c, "SendMessage", svc.SendMessageResponse) for c in chans]
    template = _SendTemplate(topic, per_rpc, b"x" * body_size)
    latencies: list[float] = []
    sent = failed = 0
    turn = itertools.count()

    async def one() -> None:
        nonlocal sent, failed
        request = template.next()
        started = time.perf_counter()
        reply = await calls[next(turn) % len(calls)](request, timeout=60)
        latencies.append(time.perf_counter() - started)
        if reply.status.code == pb.Code.OK:
            sent += per_rpc
        else:
            failed += 1

    try:
        await _workers(inflight, 0.5, one)  # warm-up: connections, first segment, caches
        latencies.clear()
        sent = failed = 0
        span = await _workers(inflight, seconds, one)
    finally:
        for c in chans:
            await c.close()
    return {"messages": sent, "failed_rpcs": failed, "seconds": round(span, 3),
            "msgs_per_s": round(sent / span, 1),
            "p50_ms": round(percentile(latencies, 0.50) * 1000, 3),
            "p99_ms": round(percentile(latencies, 0.99) * 1000, 3)}


def _receive_request(topic: str) -> bytes:
    request = svc.ReceiveMessageRequest(
        group=pb.Resource(name=_GROUP),
        message_queue=pb.MessageQueue(topic=pb.Resource(name=topic), id=-1),
        filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"), batch_size=32,
        auto_renew=False)
    request.invisible_duration.FromSeconds(60)
    request.long_polling_timeout.FromMilliseconds(0)
    return request.SerializeToString()


async def receive_ack_load(endpoint: str, topic: str, seconds: float, inflight: int = 64,
                           channels: int = 4) -> dict[str, Any]:
    """``inflight`` workers each receiving 32 and acking them in one AckMessage, for
    ``seconds`` or until the topic runs dry: msgs/s and latency (ms) of receive + ack."""
    chans = [_channel(endpoint) for _ in range(channels)]
    receives = [c.unary_stream(_SERVICE + "ReceiveMessage", request_serializer=None,
                               response_deserializer=svc.ReceiveMessageResponse.FromString)
                for c in chans]
    acks = [_raw(c, "AckMessage", svc.AckMessageResponse) for c in chans]
    request = _receive_request(topic)
    latencies: list[float] = []
    got = failed = 0
    turn = itertools.count()

    async def one() -> bool:
        nonlocal got, failed
        i = next(turn) % len(chans)
        started = time.perf_counter()
        entries = []
        async for r in receives[i](request, timeout=60):
            if r.HasField("message"):
                sp = r.message.system_properties
                entries.append(svc.AckMessageEntry(message_id=sp.message_id,
                                                   receipt_handle=sp.receipt_handle))
        if not entries:
            return False  # dry
        ack = svc.AckMessageRequest(group=pb.Resource(name=_GROUP),
                                    topic=pb.Resource(name=topic), entries=entries)
        reply = await acks[i](ack.SerializeToString(), timeout=60)
        latencies.append(time.perf_counter() - started)
        if reply.status.code == pb.Code.OK:
            got += len(entries)
        else:
            failed += 1
        return True

    try:
        span = await _workers(inflight, seconds, one)
    finally:
        for c in chans:
            await c.close()
    return {"messages": got, "failed_rpcs": failed, "seconds": round(span, 3),
            "msgs_per_s": round(got / span, 1) if span else 0.0,
            "p50_ms": round(percentile(latencies, 0.50) * 1000, 3),
            "p99_ms": round(percentile(latencies, 0.99) * 1000, 3)}


async def idle_clients(endpoint: str, clients: int, channels: int, polls: int, topic: str,
                       held: asyncio.Event, ready: asyncio.Event,
                       counts: dict[str, int]) -> None:
    """Open ``clients`` Telemetry streams (each sends a settings command and waits for the
    answer) and ``polls`` long polls (20 s, re-issued as they end) over ``channels``
    connections; set ``ready`` once every stream has its answer and every poll is sent, hold
    all of it until ``held`` is set. ``counts``: streams answered, polls sent, polls that
    came back early (with anything but MESSAGE_NOT_FOUND after their full wait)."""
    chans = [_channel(endpoint) for _ in range(channels)]
    stubs = [service_pb2_grpc.MessagingServiceStub(c) for c in chans]
    counts.update(streams=0, polls=0, early=0)
    answered = asyncio.Event()

    async def telemetry(stub: Any) -> None:
        async def commands() -> Any:
            settings = pb.Settings(client_type=pb.PRODUCER,
                                   publishing=pb.Publishing(topics=[pb.Resource(name=topic)]))
            yield svc.TelemetryCommand(settings=settings)
            await held.wait()

        call = stub.Telemetry(commands())
        async for _reply in call:
            counts["streams"] += 1
            if counts["streams"] == clients:
                answered.set()
            await held.wait()
            call.cancel()
            return

    async def poll(stub: Any) -> None:
        request = svc.ReceiveMessageRequest(
            group=pb.Resource(name="IdleGroup"),
            message_queue=pb.MessageQueue(topic=pb.Resource(name=topic), id=-1),
            filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"), batch_size=32)
        request.invisible_duration.FromSeconds(60)
        request.long_polling_timeout.FromSeconds(20)
        while not held.is_set():
            counts["polls"] += 1
            started = time.monotonic()
            call = stub.ReceiveMessage(request, timeout=30)
            waiter = asyncio.ensure_future(held.wait())
            reading = asyncio.ensure_future(_statuses(call))
            done, _ = await asyncio.wait({waiter, reading}, return_when=asyncio.FIRST_COMPLETED)
            if reading in done:
                codes = reading.result()
                if codes != [pb.Code.MESSAGE_NOT_FOUND] or time.monotonic() - started < 19:
                    counts["early"] += 1
            else:
                call.cancel()
                reading.cancel()
            waiter.cancel()

    tasks = [asyncio.ensure_future(telemetry(stubs[i % channels])) for i in range(clients)]
    await answered.wait()
    tasks += [asyncio.ensure_future(poll(stubs[i % channels])) for i in range(polls)]
    ready.set()
    await held.wait()
    await asyncio.gather(*tasks, return_exceptions=True)
    for c in chans:
        await c.close()


async def _statuses(call: Any) -> list[int]:
    return [r.status.code async for r in call if r.HasField("status")]


# -- the do-nothing servers ----------------------------------------------------------------------


class _Null(service_pb2_grpc.MessagingServiceServicer):
    """Answers without storing anything (the same answers for aio and thread-pool servers)."""

    def __init__(self, port: int) -> None:
        self.ok = pb.Status(code=pb.Code.OK, message="OK")
        endpoints = pb.Endpoints(scheme=pb.IPv4, addresses=[pb.Address(host="127.0.0.1",
                                                                       port=port)])
        self.broker = pb.Broker(name="null", id=0, endpoints=endpoints)
        self.body = b"x" * 1024

    def send(self, request: svc.SendMessageRequest) -> svc.SendMessageResponse:
        return svc.SendMessageResponse(status=self.ok, entries=[
            svc.SendResultEntry(status=self.ok, message_id=m.system_properties.message_id,
                                offset=0) for m in request.messages])

    def receive(self, request: svc.ReceiveMessageRequest) -> list[svc.ReceiveMessageResponse]:
        out = [svc.ReceiveMessageResponse(status=self.ok)]
        for i in range(request.batch_size):
            sp = pb.SystemProperties(message_id=f"null-{time.time_ns()}-{i}",
                                     body_encoding=pb.IDENTITY, message_type=pb.NORMAL,
                                     receipt_handle=f"h{i}", queue_id=0, delivery_attempt=1,
                                     born_host="127.0.0.1")
            sp.born_timestamp.GetCurrentTime()
            sp.store_timestamp.GetCurrentTime()
            out.append(svc.ReceiveMessageResponse(message=pb.Message(
                topic=request.message_queue.topic, body=self.body, system_properties=sp)))
        ts = svc.ReceiveMessageResponse()
        ts.delivery_timestamp.GetCurrentTime()
        out.append(ts)
        return out

    def ack(self, request: svc.AckMessageRequest) -> svc.AckMessageResponse:
        return svc.AckMessageResponse(status=self.ok, entries=[
            svc.AckMessageResultEntry(message_id=e.message_id, receipt_handle=e.receipt_handle,
                                      status=self.ok) for e in request.entries])

    def route(self, request: svc.QueryRouteRequest) -> svc.QueryRouteResponse:
        queue = pb.MessageQueue(topic=request.topic, id=0, permission=pb.READ_WRITE,
                                broker=self.broker, accept_message_types=[pb.NORMAL])
        return svc.QueryRouteResponse(status=self.ok, message_queues=[queue])

    def assignment(self, request: svc.QueryAssignmentRequest) -> svc.QueryAssignmentResponse:
        queue = pb.MessageQueue(topic=request.topic, id=-1, permission=pb.READ_WRITE,
                                broker=self.broker, accept_message_types=[pb.NORMAL])
        return svc.QueryAssignmentResponse(status=self.ok,
                                           assignments=[pb.Assignment(message_queue=queue)])


class _SyncNull(_Null):
    def QueryRoute(self, request, context):
        return self.route(request)

    def QueryAssignment(self, request, context):
        return self.assignment(request)

    def Heartbeat(self, request, context):
        return svc.HeartbeatResponse(status=self.ok)

    def NotifyClientTermination(self, request, context):
        return svc.NotifyClientTerminationResponse(status=self.ok)

    def Telemetry(self, request_iterator, context):
        for command in request_iterator:
            if command.HasField("settings"):
                yield svc.TelemetryCommand(status=self.ok, settings=command.settings)

    def SendMessage(self, request, context):
        return self.send(request)

    def ReceiveMessage(self, request, context):
        yield from self.receive(request)

    def AckMessage(self, request, context):
        return self.ack(request)


class _AioNull(_Null):
    async def QueryRoute(self, request, context):
        return self.route(request)

    async def QueryAssignment(self, request, context):
        return self.assignment(request)

    async def Heartbeat(self, request, context):
        return svc.HeartbeatResponse(status=self.ok)

    async def NotifyClientTermination(self, request, context):
        return svc.NotifyClientTerminationResponse(status=self.ok)

    async def Telemetry(self, request_iterator, context):
        async for command in request_iterator:
            if command.HasField("settings"):
                yield svc.TelemetryCommand(status=self.ok, settings=command.settings)

    async def SendMessage(self, request, context):
        return self.send(request)

    async def ReceiveMessage(self, request, context):
        for response in self.receive(request):
            yield response

    async def AckMessage(self, request, context):
        return self.ack(request)


def serve_null(port: int, kind: str = "aio") -> None:
    """Serve the do-nothing server on 127.0.0.1:``port`` until SIGTERM; prints a
    ``listening on`` line once serving."""
    if kind == "sync":
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=64))
        service_pb2_grpc.add_MessagingServiceServicer_to_server(_SyncNull(port), server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        server.start()
        print(f"null server listening on 127.0.0.1:{port}", flush=True)
        signal.signal(signal.SIGTERM, lambda *_: server.stop(0))
        server.wait_for_termination()
        return

    async def main() -> None:
        server = grpc.aio.server()
        service_pb2_grpc.add_MessagingServiceServicer_to_server(_AioNull(port), server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        print(f"null server listening on 127.0.0.1:{port}", flush=True)
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
        await server.stop(0)

    asyncio.run(main())
