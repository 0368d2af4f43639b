"""The broker at scale, over real gRPC: idle clients and waiting polls cost no thread, limits
answer TOO_MANY_REQUESTS, concurrent senders get their own offsets. A real broker subprocess
with a small executor (grpcThreadPoolNums=4), and grpc.aio clients."""

from __future__ import annotations

import asyncio
import json
import signal
import time
import uuid

import grpc
import pytest
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc
from test_broker_harness import FAST_CONF, BrokerProcess, create_topic

STREAMS = 3000  # opened at once: more than gRPC Core holds for the loop by default (1,000)
POLLS = 320
CHANNELS = 30
SMALL_POOL = FAST_CONF.replace("grpcThreadPoolNums=64", "grpcThreadPoolNums=4")


def _status(b: BrokerProcess) -> dict:
    r = b.cli("broker", "status", "--output", "json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    return out[0] if isinstance(out, list) else out


def _wait_status(b: BrokerProcess, field: str, value: int, deadline_s: float = 60) -> None:
    end = time.monotonic() + deadline_s
    while _status(b)[field] != value:
        if time.monotonic() > end:
            pytest.fail(f"broker status {field} never reached {value}: {_status(b)}")
        time.sleep(0.2)


def _message(topic: str, body: bytes, group: str | None = None) -> pb.Message:
    sp = pb.SystemProperties(message_id=uuid.uuid4().hex, message_type=pb.NORMAL)
    if group:
        sp.message_group, sp.message_type = group, pb.FIFO
    return pb.Message(topic=pb.Resource(name=topic), body=body, system_properties=sp)


def _receive_request(topic: str, group: str, poll_s: int = 20) -> svc.ReceiveMessageRequest:
    request = svc.ReceiveMessageRequest(
        group=pb.Resource(name=group), batch_size=32,
        message_queue=pb.MessageQueue(topic=pb.Resource(name=topic), id=-1),
        filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"))
    request.invisible_duration.FromSeconds(30)
    request.long_polling_timeout.FromSeconds(poll_s)
    return request


async def _first_status(call) -> int:
    async for r in call:
        if r.HasField("status"):
            return r.status.code
    raise AssertionError("no status")


@pytest.fixture
def broker(tmp_path):
    b = BrokerProcess(tmp_path / "store", SMALL_POOL).start()
    try:
        yield b
    finally:
        if b.proc.poll() is None:
            b.kill()


def test_open_streams_and_waiting_polls_do_not_block_a_send(broker, tmp_path):
    """3,000 Telemetry streams opened at once and 320 pending 20-second receives, over 30
    connections, on a broker with four executor threads: every stream is answered, a send
    from another connection is answered, and every poll is still waiting afterwards. Then
    SIGTERM stops the broker cleanly."""
    create_topic(broker, "Idle", 1)
    create_topic(broker, "Busy", 1)

    async def scenario() -> None:
        channels = [grpc.aio.insecure_channel(broker.endpoint, options=[
            ("grpc.use_local_subchannel_pool", 1)]) for _ in range(CHANNELS)]  # 30 connections
        stubs = [service_pb2_grpc.MessagingServiceStub(c) for c in channels]
        hold = asyncio.Event()

        async def commands():
            yield svc.TelemetryCommand(settings=pb.Settings(
                client_type=pb.PRODUCER, publishing=pb.Publishing(topics=[
                    pb.Resource(name="Idle")])))
            await hold.wait()

        streams = [stubs[i % CHANNELS].Telemetry(commands()) for i in range(STREAMS)]
        for stream in streams:  # each answered its settings, and stays open
            reply = await stream.read()
            assert reply.status.code == pb.Code.OK
        polls = [stubs[i % CHANNELS].ReceiveMessage(_receive_request("Idle", "IdleGroup"),
                                             timeout=60) for i in range(POLLS)]
        waiting = [asyncio.ensure_future(_first_status(p)) for p in polls]
        await asyncio.to_thread(_wait_status, broker, "long_polls", POLLS)
        assert (await asyncio.to_thread(_status, broker))["telemetry_streams"] == STREAMS

        async with grpc.aio.insecure_channel(broker.endpoint) as producer:
            stub = service_pb2_grpc.MessagingServiceStub(producer)
            reply = await stub.SendMessage(svc.SendMessageRequest(
                messages=[_message("Busy", b"through")]), timeout=30)
        assert reply.status.code == pb.Code.OK
        assert not any(w.done() for w in waiting)  # every poll still waits
        assert (await asyncio.to_thread(_status, broker))["long_polls"] == POLLS

        for p in polls:
            p.cancel()
        hold.set()
        for s in streams:
            s.cancel()
        for c in channels:
            await c.close()

    asyncio.run(scenario())
    broker.proc.send_signal(signal.SIGTERM)
    assert broker.proc.wait(timeout=60) == 0
    assert not (tmp_path / "store" / "abort").exists()


def test_long_polls_past_the_limits_are_answered_too_many_requests(tmp_path):
    conf = SMALL_POOL + "popPollingSizePerClient=3\nmaxPopPollingSize=5\n"
    b = BrokerProcess(tmp_path / "store", conf).start()
    try:
        create_topic(b, "Limited", 1)

        async def scenario() -> None:
            async with grpc.aio.insecure_channel(b.endpoint) as channel:
                stub = service_pb2_grpc.MessagingServiceStub(channel)

                def poll(client: str):
                    return stub.ReceiveMessage(_receive_request("Limited", "LimitGroup"),
                                               metadata=(("x-mq-client-id", client),),
                                               timeout=60)

                held = [poll("client-a") for _ in range(3)]
                held_waits = [asyncio.ensure_future(_first_status(p)) for p in held]
                await asyncio.to_thread(_wait_status, b, "long_polls", 3)
                # The client's fourth: refused at once, with the proxy's status.
                assert await _first_status(poll("client-a")) == pb.Code.TOO_MANY_REQUESTS
                held += [poll("client-b"), poll("client-b")]
                held_waits += [asyncio.ensure_future(_first_status(p)) for p in held[3:]]
                await asyncio.to_thread(_wait_status, b, "long_polls", 5)
                # A new client, but the broker holds maxPopPollingSize polls already.
                assert await _first_status(poll("client-c")) == pb.Code.TOO_MANY_REQUESTS
                assert not any(w.done() for w in held_waits)
                # A message wakes a waiting poll: it is answered with it.
                reply = await stub.SendMessage(svc.SendMessageRequest(
                    messages=[_message("Limited", b"wake")]), timeout=30)
                assert reply.status.code == pb.Code.OK
                done, _ = await asyncio.wait(held_waits, return_when=asyncio.FIRST_COMPLETED)
                assert [w.result() for w in done] == [pb.Code.OK]
                for p in held:
                    p.cancel()

        asyncio.run(scenario())
    finally:
        assert b.terminate() == 0


def test_concurrent_senders_get_their_own_offsets_and_fifo_order(broker):
    """40 connections sending batches of 8 at once into one queue: every entry's offset is
    the offset its message is read back at, a request's messages are contiguous, and each
    message group's messages are in the order they were sent."""
    create_topic(broker, "Shared", 1)
    create_topic(broker, "Ordered", 1, "FIFO")

    async def sender(i: int) -> list[tuple[int, bytes]]:
        async with grpc.aio.insecure_channel(broker.endpoint) as channel:
            stub = service_pb2_grpc.MessagingServiceStub(channel)
            bodies = [b"s%02d-%d" % (i, j) for j in range(8)]
            reply = await stub.SendMessage(svc.SendMessageRequest(
                messages=[_message("Shared", body) for body in bodies]), timeout=30)
            assert [e.status.code for e in reply.entries] == [pb.Code.OK] * 8
            for j in range(3):  # one message group per sender, sent in order
                fifo = await stub.SendMessage(svc.SendMessageRequest(messages=[
                    _message("Ordered", b"g%02d-%d" % (i, j), group=f"g{i}")]), timeout=30)
                assert fifo.status.code == pb.Code.OK
            return [(e.offset, body) for e, body in zip(reply.entries, bodies)]

    async def everyone():
        return await asyncio.gather(*(sender(i) for i in range(40)))

    sent = asyncio.run(everyone())
    for entries in sent:
        offsets = [o for o, _ in entries]
        assert offsets == list(range(offsets[0], offsets[0] + 8))
    by_offset = dict(e for entries in sent for e in entries)
    assert sorted(by_offset) == list(range(320))
    assert _pull(broker, "Shared", 320) == [by_offset[o] for o in range(320)]
    ordered = _pull(broker, "Ordered", 120)
    for i in range(40):
        assert [b for b in ordered if b.startswith(b"g%02d-" % i)] == [
            b"g%02d-%d" % (i, j) for j in range(3)]


def _pull(b: BrokerProcess, topic: str, count: int) -> list[bytes]:
    """Bodies of queue 0 of ``topic`` from offset 0, in offset order."""
    bodies: list[bytes] = []
    with grpc.insecure_channel(b.endpoint) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        offset = 0
        end = time.monotonic() + 60
        while len(bodies) < count and time.monotonic() < end:
            request = svc.PullMessageRequest(
                group=pb.Resource(name="reader"), offset=offset, batch_size=100,
                message_queue=pb.MessageQueue(topic=pb.Resource(name=topic), id=0),
                filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"))
            request.long_polling_timeout.FromSeconds(5)
            for r in stub.PullMessage(request, timeout=30):
                if r.HasField("message"):
                    bodies.append(r.message.body)
                elif r.WhichOneof("content") == "next_offset":
                    offset = r.next_offset
    return bodies
