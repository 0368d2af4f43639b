"""The broker answers the official clients what Apache RocketMQ 5's proxy answers: digests,
nacks, batches with a bad entry, hostile receipt handles, names, bodies and timestamps.

A real broker subprocess and raw gRPC requests, so each status code is seen exactly as a
client of any language sees it."""

from __future__ import annotations

import gzip
import hashlib
import tracemalloc
import uuid

import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from test_broker_harness import (  # noqa: F401  (module_broker, module_stub: fixtures)
    BrokerProcess,
    create_topic,
    module_broker,
    module_stub,
    raw_stub,
)

from stratamq.broker.convert import inflate_gzip
from stratamq.broker.errors import BrokerError
from stratamq.broker.validate import put_status
from stratamq.store.results import PutMessageStatus

GROUP = "ProtocolGroup"


def _msg(topic: str, body: bytes = b"payload", **system) -> pb.Message:
    system.setdefault("message_id", uuid.uuid4().hex)
    return pb.Message(topic=pb.Resource(name=topic), body=body,
                      system_properties=pb.SystemProperties(**system))


def _receive(stub, topic: str, group: str = GROUP, batch: int = 32,
             invisible_ms: int = 30_000) -> list[pb.Message]:
    request = svc.ReceiveMessageRequest(
        group=pb.Resource(name=group), message_queue=pb.MessageQueue(
            topic=pb.Resource(name=topic), id=-1), batch_size=batch,
        filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"))
    request.invisible_duration.FromMilliseconds(invisible_ms)
    request.long_polling_timeout.FromMilliseconds(2_000)
    out = []
    for r in stub.ReceiveMessage(request, timeout=30):
        if r.HasField("message"):
            out.append(r.message)
    return out


def _receive_all(stub, topic: str, want: int) -> list[pb.Message]:
    """Receive until ``want`` messages came (a receive answers with what one pass found)."""
    got: list[pb.Message] = []
    for _ in range(20):
        got += _receive(stub, topic)
        if len(got) >= want:
            break
    return got


def _max_offsets(stub, topic: str, queues: int) -> list[int]:
    return [stub.QueryOffset(svc.QueryOffsetRequest(
        message_queue=pb.MessageQueue(topic=pb.Resource(name=topic), id=q),
        query_offset_policy=pb.END)).offset for q in range(queues)]


def _ack(stub, topic: str, handle: str, group: str = GROUP) -> int:
    return stub.AckMessage(svc.AckMessageRequest(
        group=pb.Resource(name=group), topic=pb.Resource(name=topic),
        entries=[svc.AckMessageEntry(message_id="m", receipt_handle=handle)])).status.code


def test_body_digest_is_upper_case_md5_as_the_proxy_sends(broker, stub):
    topic = create_topic(broker, "Digest", 1)
    body = bytes(range(256)) * 7
    assert stub.SendMessage(svc.SendMessageRequest(
        messages=[_msg(topic, body)])).status.code == pb.OK
    [got] = _receive(stub, topic)
    assert got.body == body
    assert got.system_properties.body_digest.type == pb.MD5
    assert got.system_properties.body_digest.checksum == hashlib.md5(body).hexdigest().upper()


def test_change_invisible_duration_zero_is_a_nack_and_the_handle_is_checked_first(broker, stub):
    topic = create_topic(broker, "Nack", 1)
    stub.SendMessage(svc.SendMessageRequest(messages=[_msg(topic, b"retry me")]))
    [first] = _receive(stub, topic, invisible_ms=60_000)
    request = svc.ChangeInvisibleDurationRequest(
        group=pb.Resource(name=GROUP), topic=pb.Resource(name=topic),
        receipt_handle=first.system_properties.receipt_handle, message_id="m")
    request.invisible_duration.FromMilliseconds(0)
    reply = stub.ChangeInvisibleDuration(request)
    assert reply.status.code == pb.OK
    # Redelivered at once, though the first delivery asked for 60 s of invisibility.
    [again] = _receive(stub, topic)
    assert again.body == b"retry me"
    assert again.system_properties.delivery_attempt == 2
    assert _ack(stub, topic, again.system_properties.receipt_handle) == pb.OK
    # A made-up handle with a valid duration, and a real one with a bad duration.
    request.receipt_handle = "1_2_3_4"
    assert stub.ChangeInvisibleDuration(request).status.code == pb.INVALID_RECEIPT_HANDLE
    request.invisible_duration.FromMilliseconds(-5)
    assert stub.ChangeInvisibleDuration(request).status.code == pb.INVALID_RECEIPT_HANDLE


def test_one_bad_entry_stores_nothing_of_its_request(broker, stub):
    topic = create_topic(broker, "Batch", 2)
    before = _max_offsets(stub, topic, 2)
    good = [_msg(topic, b"a"), _msg(topic, b"b")]
    bad_born = _msg(topic, b"c")
    bad_born.system_properties.born_timestamp.seconds = 10**17  # no valid time: ignored
    unknown_type = _msg(topic, b"d", message_type=77)
    reply = stub.SendMessage(svc.SendMessageRequest(messages=[*good, unknown_type]))
    assert reply.status.code == pb.BAD_REQUEST
    assert [e.status.code for e in reply.entries] == [pb.BAD_REQUEST] * 3
    assert "not stored" in reply.entries[0].status.message
    reply = stub.SendMessage(svc.SendMessageRequest(messages=[*good, bad_born]))
    assert reply.status.code == pb.OK
    assert len(reply.entries) == 3
    got = {m.body: m for m in _receive_all(stub, topic, 3)}
    assert set(got) == {b"a", b"b", b"c"}
    # Dispatch runs in log order, so everything stored before these three is visible now:
    # nothing of the refused request was stored.
    assert _receive(stub, topic) == []
    assert sum(_max_offsets(stub, topic, 2)) == sum(before) + 3
    # The invalid born time was replaced by a real one, not stored as garbage.
    assert got[b"c"].system_properties.born_timestamp.seconds > 1_700_000_000
    mixed = stub.SendMessage(svc.SendMessageRequest(messages=[_msg(topic), _msg("Other")]))
    assert mixed.status.code == pb.MESSAGE_CORRUPTED
    assert stub.SendMessage(svc.SendMessageRequest()).status.code == pb.MESSAGE_CORRUPTED


@pytest.fixture(scope="module")
def fields_topic(broker):
    return create_topic(broker, "Fields", 1)


@pytest.mark.parametrize("system, code", [
    ({"tag": "a|b"}, pb.ILLEGAL_MESSAGE_TAG),
    ({"tag": "bell\x07"}, pb.ILLEGAL_MESSAGE_TAG),
    ({"keys": ["line\nbreak"]}, pb.ILLEGAL_MESSAGE_KEY),
    ({"keys": ["   "]}, pb.ILLEGAL_MESSAGE_KEY),
    ({"message_group": "g" * 64}, pb.ILLEGAL_MESSAGE_GROUP),
    ({"message_id": " "}, pb.ILLEGAL_MESSAGE_ID),
])
def test_fields_are_checked_as_the_proxy_checks_them(fields_topic, stub, system, code):
    topic = fields_topic
    before = stub.SendMessage(svc.SendMessageRequest(messages=[_msg(topic)])).entries[0].offset
    reply = stub.SendMessage(svc.SendMessageRequest(messages=[_msg(topic, **system)]))
    assert reply.status.code == code
    # Queue offsets are handed out as messages are stored: the next one shows nothing was.
    after = stub.SendMessage(svc.SendMessageRequest(messages=[_msg(topic)])).entries[0].offset
    assert after == before + 1


def test_user_property_limits(broker, stub):
    topic = create_topic(broker, "Props", 1)
    many = _msg(topic)
    for i in range(129):
        many.user_properties[f"k{i}"] = "v"
    assert stub.SendMessage(svc.SendMessageRequest(
        messages=[many])).status.code == pb.MESSAGE_PROPERTIES_TOO_LARGE
    big = _msg(topic)
    big.user_properties["k"] = "v" * (16 * 1024)
    assert stub.SendMessage(svc.SendMessageRequest(
        messages=[big])).status.code == pb.MESSAGE_PROPERTIES_TOO_LARGE
    control = _msg(topic)
    control.user_properties["k"] = "tab\there"
    assert stub.SendMessage(svc.SendMessageRequest(
        messages=[control])).status.code == pb.ILLEGAL_MESSAGE_PROPERTY_KEY


def test_gzip_bomb_is_refused_without_inflating_it(broker, stub):
    topic = create_topic(broker, "Bomb", 1)
    bomb = gzip.compress(bytes(64 * 1024 * 1024), compresslevel=9)  # 64 MiB of zeros, ~64 KB
    reply = stub.SendMessage(svc.SendMessageRequest(messages=[_msg(
        topic, bomb, body_encoding=pb.GZIP)]))
    assert reply.status.code == pb.MESSAGE_BODY_TOO_LARGE
    # A body that fits inflates and is stored as sent.
    ok = stub.SendMessage(svc.SendMessageRequest(messages=[_msg(
        topic, gzip.compress(b"hello" * 100), body_encoding=pb.GZIP)]))
    assert ok.status.code == pb.OK
    [got] = _receive(stub, topic)
    assert got.body == b"hello" * 100
    corrupt = stub.SendMessage(svc.SendMessageRequest(messages=[_msg(
        topic, b"\x1f\x8b not gzip", body_encoding=pb.GZIP)]))
    assert corrupt.status.code == pb.MESSAGE_CORRUPTED


def test_inflating_a_bomb_allocates_about_the_limit_not_the_bomb():
    limit = 4 * 1024 * 1024
    bomb = gzip.compress(bytes(256 * 1024 * 1024), compresslevel=9)
    tracemalloc.start()
    try:
        with pytest.raises(BrokerError) as err:
            inflate_gzip(bomb, limit)
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert err.value.code == pb.MESSAGE_BODY_TOO_LARGE
    assert peak < 4 * limit  # gzip.decompress would have allocated the whole 256 MiB
    two_members = gzip.compress(b"ab") + gzip.compress(b"cd")
    assert inflate_gzip(two_members, 10) == b"abcd"
    with pytest.raises(BrokerError):
        inflate_gzip(two_members, 3)
    with pytest.raises(BrokerError):
        inflate_gzip(gzip.compress(b"abc")[:-3], 10)  # truncated


def test_receipt_handles_the_broker_did_not_issue_are_refused(broker, stub):
    topic = create_topic(broker, "Handles", 2)
    for i in range(4):
        stub.SendMessage(svc.SendMessageRequest(messages=[_msg(topic, b"m%d" % i)]))
    got = _receive_all(stub, topic, 4)
    assert len(got) == 4
    real = got[0].system_properties.receipt_handle
    fields = real.split("_")
    invented = [
        "0_0_1_1", "0_1_2_3", real.rsplit("_", 1)[0],  # the old form, without its MAC
        "_".join(fields[:3] + [str(int(fields[3]) + 1), fields[4]]),  # a field changed
        "０_０_１_１_" + fields[4],  # full-width digits
        " 0_0_1_1_" + fields[4], "0_0_1_1_" + fields[4] + "\n", "+0_0_1_1_" + fields[4],
        "0_0_1_1__" + fields[4], "-1_0_1_1_" + fields[4], "",
    ] + [f"{q}_{o}_{g}_{v}_{uuid.uuid4().hex[:16]}" for q in range(2) for o in range(5)
         for g, v in ((1, 1), (int(fields[2]), int(fields[3])))]
    for handle in invented:
        assert _ack(stub, topic, handle) == pb.INVALID_RECEIPT_HANDLE, handle
    # A real handle of another group or topic is not one of this group's.
    assert _ack(stub, topic, real, group="SomeoneElse") == pb.INVALID_RECEIPT_HANDLE
    # The real ones ack, and acking one again (a client's retry) is still OK.
    for m in got:
        assert _ack(stub, topic, m.system_properties.receipt_handle) == pb.OK
    assert _ack(stub, topic, real) == pb.OK


def test_handles_survive_a_restart(tmp_path):
    b = BrokerProcess(tmp_path / "store").start()
    try:
        topic = create_topic(b, "Restart", 1)
        channel, stub = raw_stub(b)
        stub.SendMessage(svc.SendMessageRequest(messages=[_msg(topic, b"x")]))
        [m] = _receive(stub, topic, invisible_ms=300_000)
        channel.close()
    finally:
        assert b.terminate() == 0
    b.start()
    try:
        channel, stub = raw_stub(b)
        assert _ack(stub, topic, m.system_properties.receipt_handle) == pb.OK
        assert _receive(stub, topic) == []
        channel.close()
    finally:
        b.terminate()


def test_bad_names_clients_and_timestamps_get_request_errors(broker, stub):
    topic = create_topic(broker, "Names", 1)
    for name, code in (("NL\n", pb.ILLEGAL_TOPIC), ("t" * 128, pb.ILLEGAL_TOPIC),
                       ("rmq_sys_wheel_timer", pb.ILLEGAL_TOPIC), ("bad/name", pb.ILLEGAL_TOPIC)):
        reply = stub.QueryRoute(svc.QueryRouteRequest(topic=pb.Resource(name=name)))
        assert reply.status.code == code, name
    for group in ("G\n", "CID_RMQ_SYS_X", "g" * 256):
        request = svc.ReceiveMessageRequest(
            group=pb.Resource(name=group), batch_size=1,
            message_queue=pb.MessageQueue(topic=pb.Resource(name=topic)))
        assert [r.status.code for r in stub.ReceiveMessage(request)] == [
            pb.ILLEGAL_CONSUMER_GROUP], group
    reply = stub.Heartbeat(svc.HeartbeatRequest(client_type=99))
    assert reply.status.code == pb.UNRECOGNIZED_CLIENT_TYPE
    request = svc.QueryOffsetRequest(
        message_queue=pb.MessageQueue(topic=pb.Resource(name=topic), id=0),
        query_offset_policy=pb.TIMESTAMP, timestamp=Timestamp(seconds=2**62))
    assert stub.QueryOffset(request).status.code == pb.BAD_REQUEST
    too_many = svc.ReceiveMessageRequest(
        group=pb.Resource(name=GROUP), batch_size=33,
        message_queue=pb.MessageQueue(topic=pb.Resource(name=topic)))
    assert [r.status.code for r in stub.ReceiveMessage(too_many)] == [pb.BAD_REQUEST]


def test_every_store_status_has_the_proxy_code():
    codes = {status: put_status(status)[0] for status in PutMessageStatus}
    assert codes[PutMessageStatus.PUT_OK] == pb.OK
    assert codes[PutMessageStatus.FLUSH_DISK_TIMEOUT] == pb.MASTER_PERSISTENCE_TIMEOUT
    assert codes[PutMessageStatus.OS_PAGE_CACHE_BUSY] == pb.TOO_MANY_REQUESTS
    assert codes[PutMessageStatus.SLAVE_NOT_AVAILABLE] == pb.HA_NOT_AVAILABLE
    assert "disk is full" in put_status(PutMessageStatus.SERVICE_NOT_AVAILABLE)[1]
