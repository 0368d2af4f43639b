"""What a client reads when its request or the stored data is bad: undecodable requests,
damaged records, digests that do not match, offsets past a queue's end.

A real broker subprocess and raw gRPC calls (bytes on the wire), so each answer is seen as a
client of any language sees it, and the broker's log is read as an operator reads it."""

from __future__ import annotations

import hashlib
import re
import zlib

import grpc
from damage import patch, records
from google.protobuf.descriptor import FieldDescriptor
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from test_broker_harness import create_topic, module_broker, module_stub  # noqa: F401
from test_broker_protocol import _msg
from waiting import wait_until

SERVICE = svc.DESCRIPTOR.services_by_name["MessagingService"]
# What a Python exception looks like in a message: a class name with its colon.
PYTHON_TEXT = re.compile(r"\b[A-Z][A-Za-z]*(Error|Exception|Corrupt)\b|Traceback|<class ")


def _mq(topic: str, qid: int = 0) -> pb.MessageQueue:
    return pb.MessageQueue(topic=pb.Resource(name=topic), id=qid)


def _pull(stub, topic: str, offset: int) -> tuple[pb.Status, list[int], int | None]:
    request = svc.PullMessageRequest(
        group=pb.Resource(name="WireGroup"), message_queue=_mq(topic), offset=offset,
        batch_size=32, filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"))
    status, offsets, next_offset = None, [], None
    for r in stub.PullMessage(request, timeout=30):
        if r.HasField("status"):
            status = r.status
        elif r.HasField("message"):
            offsets.append(r.message.system_properties.queue_offset)
        else:
            next_offset = r.next_offset
    return status, offsets, next_offset


def _receive(stub, topic: str, group: str) -> tuple[pb.Status, list[int]]:
    request = svc.ReceiveMessageRequest(
        group=pb.Resource(name=group), message_queue=_mq(topic, -1), batch_size=32,
        filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"))
    request.invisible_duration.FromSeconds(60)
    request.long_polling_timeout.FromMilliseconds(1000)
    status, offsets = None, []
    for r in stub.ReceiveMessage(request, timeout=30):
        if r.HasField("status"):
            status = r.status
        elif r.HasField("message"):
            offsets.append(r.message.system_properties.queue_offset)
    return status, offsets


def _max_offset(stub, topic: str) -> int:
    return stub.QueryOffset(svc.QueryOffsetRequest(message_queue=_mq(topic),
                                                   query_offset_policy=pb.END)).offset


# -- undecodable requests -------------------------------------------------------------------------

def _field(number: int, payload: bytes) -> bytes:
    """One length-delimited protobuf field (tag, varint length, payload): lengths here < 128."""
    return bytes([number << 3 | 2, len(payload)]) + payload


def _bad_utf8(descriptor, depth: int = 0) -> bytes | None:
    """A request of type ``descriptor`` whose first string field (nested in messages, e.g. a
    topic's ``Resource.name``) holds bytes that are not UTF-8."""
    for f in descriptor.fields:
        if f.type == FieldDescriptor.TYPE_STRING:
            return _field(f.number, b"ab\xff\xfe")
    for f in descriptor.fields:
        if f.type == FieldDescriptor.TYPE_MESSAGE and depth < 3:
            inner = _bad_utf8(f.message_type, depth + 1)
            if inner is not None:
                return _field(f.number, inner)
    return None


def _raw_call(channel: grpc.Channel, method, payload: bytes) -> grpc.RpcError:
    path = f"/{SERVICE.full_name}/{method.name}"
    kwargs = {"request_serializer": lambda x: x, "response_deserializer": lambda x: x}
    try:
        if method.client_streaming:
            list(channel.stream_stream(path, **kwargs)(iter([payload]), timeout=10))
        elif method.server_streaming:
            list(channel.unary_stream(path, **kwargs)(payload, timeout=10))
        else:
            channel.unary_unary(path, **kwargs)(payload, timeout=10)
    except grpc.RpcError as exc:
        return exc
    raise AssertionError(f"{method.name} accepted an undecodable request")


def test_every_method_answers_undecodable_requests_with_invalid_argument(broker):
    channel = grpc.insecure_channel(broker.endpoint)
    log_before = broker.log.read_text()
    calls = 0
    for method in SERVICE.methods:
        bad_utf8 = _bad_utf8(method.input_type)
        payloads = [b"\xff\xff\xff\xff not a protobuf"] + ([bad_utf8] if bad_utf8 else [])
        for payload in payloads:
            exc = _raw_call(channel, method, payload)
            calls += 1
            assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, (method.name, exc.details())
            assert method.name in exc.details()
            assert "not a valid protobuf" in exc.details()
    channel.close()
    # One WARNING line per request, no traceback.
    wait_until(lambda: broker.log.read_text().count("undecodable request")
               - log_before.count("undecodable request") >= calls, 10, "the log lines")
    new = broker.log.read_text()[len(log_before):]
    assert new.count("undecodable request") == calls
    assert "Traceback" not in new and "Unexpected" not in new


# -- damaged records ------------------------------------------------------------------------------

def test_a_damaged_record_is_named_with_its_queue_and_commitlog_offsets(broker, stub):
    topic = create_topic(broker, "WireDamaged", 1)
    for i in range(3):
        r = stub.SendMessage(svc.SendMessageRequest(messages=[_msg(topic, b"body-%d" % i)]))
        assert r.status.code == pb.OK
    wait_until(lambda: _max_offset(stub, topic) == 3, 30, "the messages dispatched")
    data = {seg: seg.read_bytes() for seg in (broker.store / "commitlog").iterdir()}
    [(segment, pos)] = [(seg, pos) for seg, pos, size in records(broker.store)
                        if b"WireDamaged" in data[seg][pos:pos + size]
                        and b"body-1" in data[seg][pos:pos + size]]
    base = int(segment.name)
    patch(segment, pos + 4, b"\0\0\0\0")  # the magic code of queue offset 1, while it runs

    # A pull from 0 gets what is intact before the damage, and where to go on from.
    status, offsets, next_offset = _pull(stub, topic, 0)
    assert (status.code, offsets, next_offset) == (pb.OK, [0], 1)
    # The pull that starts at the damage is refused, saying what and where.
    status, offsets, _ = _pull(stub, topic, 1)
    assert status.code == pb.INTERNAL_SERVER_ERROR and offsets == []
    assert f"{topic}/0" in status.message
    assert "queue offset 1" in status.message
    assert f"CommitLog offset {base + pos}" in status.message
    assert "damaged" in status.message
    assert not PYTHON_TEXT.search(status.message), status.message
    # The message after it is still served.
    status, offsets, _ = _pull(stub, topic, 2)
    assert (status.code, offsets) == (pb.OK, [2])

    # A receive delivers the intact message, then says what stops the queue.
    status, offsets = _receive(stub, topic, "WireDamagedGroup")
    assert (status.code, offsets) == (pb.OK, [0])
    status, offsets = _receive(stub, topic, "WireDamagedGroup")
    assert status.code == pb.INTERNAL_SERVER_ERROR and offsets == []
    assert "queue offset 1" in status.message and f"CommitLog offset {base + pos}" in status.message
    assert not PYTHON_TEXT.search(status.message), status.message
    log = broker.log.read_text()
    assert f"CommitLog offset {base + pos}" in log


# -- digests --------------------------------------------------------------------------------------

def test_a_body_that_does_not_match_its_digest_is_refused_and_not_stored(broker, stub):
    topic = create_topic(broker, "WireDigest", 1)
    body = b"the bytes the producer meant"
    damaged = b"the bytes the producer mean\x00"
    crc = zlib.crc32(body)
    good = [(pb.MD5, hashlib.md5(body).hexdigest()),
            (pb.MD5, hashlib.md5(body).hexdigest().upper()),
            (pb.SHA1, hashlib.sha1(body).hexdigest()), (pb.CRC32, f"{crc:08X}"),
            (pb.CRC32, str(crc))]
    for kind, checksum in good:
        r = stub.SendMessage(svc.SendMessageRequest(messages=[_msg(
            topic, body, body_digest=pb.Digest(type=kind, checksum=checksum))]))
        assert r.status.code == pb.OK, (kind, checksum, r.status)
    wait_until(lambda: _max_offset(stub, topic) >= len(good), 30, "the stored messages")
    stored = _max_offset(stub, topic)
    assert stored == len(good)
    for kind, checksum in good:
        r = stub.SendMessage(svc.SendMessageRequest(messages=[
            _msg(topic, body),
            _msg(topic, damaged, body_digest=pb.Digest(type=kind, checksum=checksum))]))
        assert r.status.code == pb.MESSAGE_CORRUPTED, (kind, r.status)
        assert "digest" in r.status.message and "nothing stored" in r.status.message
        assert r.entries[1].status.code == pb.MESSAGE_CORRUPTED
    # Nothing of those requests was stored: a marker sent after them is the next offset
    # (dispatch runs in order: once the marker is visible, anything before it is too).
    marker = stub.SendMessage(svc.SendMessageRequest(messages=[_msg(topic, body)]))
    assert marker.entries[0].offset == stored
    wait_until(lambda: _max_offset(stub, topic) > stored, 30, "the marker")
    assert _max_offset(stub, topic) == stored + 1


# -- offsets --------------------------------------------------------------------------------------

def test_update_offset_past_the_end_is_kept_and_the_pull_from_it_is_moved_back(broker, stub):
    """RocketMQ's broker commits any offset (ConsumerManageProcessor.updateConsumerOffset has
    no bound); a pull from past the end is answered OFFSET_OVERFLOW_BADLY with the max offset
    to go on from (here: ILLEGAL_OFFSET and ``next_offset``)."""
    topic = create_topic(broker, "WireOffsets", 1)
    for i in range(2):
        stub.SendMessage(svc.SendMessageRequest(messages=[_msg(topic, b"m%d" % i)]))
    wait_until(lambda: _max_offset(stub, topic) == 2, 30, "the messages dispatched")
    huge = 10**12 + 28
    r = stub.UpdateOffset(svc.UpdateOffsetRequest(group=pb.Resource(name="WireGroup"),
                                                  message_queue=_mq(topic), offset=huge))
    assert r.status.code == pb.OK
    got = stub.GetOffset(svc.GetOffsetRequest(group=pb.Resource(name="WireGroup"),
                                              message_queue=_mq(topic)))
    assert (got.status.code, got.offset) == (pb.OK, huge)
    status, offsets, next_offset = _pull(stub, topic, got.offset)
    assert (status.code, offsets, next_offset) == (pb.ILLEGAL_OFFSET, [], 2)
    assert str(huge) in status.message and not PYTHON_TEXT.search(status.message)
    status, offsets, _ = _pull(stub, topic, next_offset - 2)
    assert (status.code, offsets) == (pb.OK, [0, 1])


def test_an_internal_error_is_answered_without_python_text():
    """What any exception the broker did not expect becomes (the proxy's ResponseBuilder:
    INTERNAL_SERVER_ERROR), e.g. the IndexError a damaged tier unit raised in a pull."""
    from stratamq.broker.rpc import failure_status

    request = svc.PullMessageRequest(group=pb.Resource(name="G"), message_queue=_mq("T", 3),
                                     offset=10**12 + 28)
    status = failure_status("PullMessage", request,
                            IndexError("index 1000000000028 is out of bounds for axis 0"))
    assert status.code == pb.INTERNAL_SERVER_ERROR
    assert "PullMessage of topic 'T' queue 3 at offset 1000000000028" in status.message
    assert not PYTHON_TEXT.search(status.message) and "out of bounds" not in status.message
