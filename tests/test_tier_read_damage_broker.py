"""Damaged and lost tier data under a running broker (a real subprocess, POSIX tier): after
the local head of the queue was cleaned up, a tier record has a flipped body byte and one of
the tier's CommitLog files is gone. ``PullMessage`` from offset 0 crosses the lost run in one
answer and never serves the damaged record; a new SimpleConsumer group receives every message
that still exists (tier and local disk); ``tier status`` shows both."""

from __future__ import annotations

import grpc
from broker_proc import start_broker
from damage import patch
from rocketmq import FilterExpression, SimpleConsumer
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc
from test_broker_harness import config, receive_until
from test_tier_broker import cli, json_lines, produce
from test_tier_read_damage import flat_position, tier_files, tier_unit

TOPIC = "Orders"


def pull_following(endpoint: str, queue_id: int = 0) -> tuple[dict[int, bytes], list]:
    """PullMessage from 0, following ``next_offset`` to the queue's end: {offset: body}, and
    the answers that brought no message: (offset, status code, message, next offset)."""
    out: dict[int, bytes] = {}
    empty = []
    offset = 0
    with grpc.insecure_channel(endpoint) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        end = stub.QueryOffset(svc.QueryOffsetRequest(
            message_queue=pb.MessageQueue(topic=pb.Resource(name=TOPIC), id=queue_id),
            query_offset_policy=pb.END), timeout=30).offset
        while offset < end:
            request = svc.PullMessageRequest(
                group=pb.Resource(name="Replay"), offset=offset, batch_size=32,
                message_queue=pb.MessageQueue(topic=pb.Resource(name=TOPIC), id=queue_id),
                filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"))
            request.long_polling_timeout.FromMilliseconds(0)
            status, got, next_offset = None, [], offset
            for reply in stub.PullMessage(request, timeout=30):
                kind = reply.WhichOneof("content")
                if kind == "status":
                    status = reply.status
                elif kind == "message":
                    got.append(reply.message)
                else:
                    next_offset = reply.next_offset
            for m in got:
                out[m.system_properties.queue_offset] = m.body
            if not got:
                empty.append((offset, status.code, status.message, next_offset))
            assert next_offset > offset, (offset, status)
            offset = next_offset
    return out, empty


def test_broker_readers_skip_damaged_and_lost_tier_data(tmp_path):
    settings = {"mappedFileSizeCommitLog": str(64 * 1024), "mappedFileSizeConsumeQueue": "2000",
                "tieredBackendServiceProvider": "posix",
                "tieredStoreFilePath": str(tmp_path / "tier"),
                "tieredStoreGroupCommitTimeout": "3600000",
                # Tier CommitLog files of ~90 messages (the smallest a 4 KiB message allows).
                "tieredStoreCommitLogMaxSize": "40960", "compactionMappedFileSize": "40960",
                "maxMessageSize": "4096",
                "tieredStoreIndexFileMaxHashSlotNum": "211",
                "tieredStoreIndexFileMaxIndexNum": "500"}
    broker = start_broker(tmp_path, settings, topics=[(TOPIC, 1, "NORMAL")])
    try:
        produce(broker.endpoint, 600)
        cli("tier", "flush", "--endpoint", broker.endpoint)
        before, empty = pull_following(broker.endpoint)
        assert len(before) == 600 and not empty
    finally:
        assert broker.stop() == 0
    cli("store", "clean", "--store", str(broker.store), "--config", str(broker.conf),
        "--tiered-only")
    # The damage: a body byte of offset 5 flipped; the tier's second CommitLog file gone.
    _p, _a, (flat, _size, _code) = tier_unit(tmp_path, 5)
    path, at = flat_position(tmp_path, flat)
    patch(path, at + 120, bytes([path.read_bytes()[at + 120] ^ 0x40]))
    tier_files(tmp_path, "COMMIT_LOG")[1].unlink()
    (tmp_path / "broker.conf").unlink()
    broker = start_broker(tmp_path, settings, store=broker.store)
    try:
        got, empty = pull_following(broker.endpoint)
        lost = sorted(set(before) - set(got) - {5})
        assert 5 not in got and lost and lost == list(range(lost[0], lost[-1] + 1))
        assert got == {o: b for o, b in before.items() if o != 5 and o not in lost}
        # The lost run crossed in one answer: "not found" there, with the offset past it.
        assert [(o, code, nxt) for o, code, _m, nxt in empty] == [
            (lost[0], pb.MESSAGE_NOT_FOUND, lost[-1] + 1)]
        assert f"{lost[0]}..{lost[-1]}" in empty[0][2]
        # A new group starts at the queue's min offset (0, the tier's) and gets everything
        # that still exists, in the tier and on local disk.
        consumer = SimpleConsumer(config(broker.endpoint), "NewGroup",
                                  {TOPIC: FilterExpression("*")}, await_duration=2)
        consumer.startup()
        try:
            received = receive_until(consumer, len(got), deadline_s=120)
        finally:
            consumer.shutdown()
        assert sorted(m.body for m in received) == sorted(got.values())
        status = json_lines(cli("tier", "status", "--endpoint", broker.endpoint).stdout)
        row = next(r for r in status if r["topic"] == TOPIC and r["queue_id"] == 0)
        assert row["corrupt_records"] == 1 and row["corrupt_offsets"] == [5]
        assert row["missing_ranges"] == [[lost[0], lost[-1] + 1]]
    finally:
        assert broker.stop() == 0
    log = "".join(broker.output)
    assert log.count("queue offset 5 is corrupt") == 1
