"""The broker end to end: a real ``stratamq broker start`` subprocess and the official Apache
RocketMQ 5 Python client (Producer, SimpleConsumer, PushConsumer), unmodified, over gRPC."""

from __future__ import annotations

import json
import threading
import time

import grpc
import pytest
from rocketmq import ConsumeResult, MessageListener, Producer, PushConsumer, SimpleConsumer
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from test_broker_harness import (
    BrokerProcess,
    FilterExpression,
    config,
    create_topic,
    message,
    raw_stub,
    receive_until,
    send,
)

from stratamq.config import load_broker_conf


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = BrokerProcess(tmp_path_factory.mktemp("broker") / "store").start()
    yield b
    b.terminate()


def _producer(b: BrokerProcess, *topics: str) -> Producer:
    p = Producer(config(b.endpoint), topics)
    p.startup()
    return p


def _simple(b: BrokerProcess, group: str, topic: str, expr: str = "*",
            await_s: int = 2) -> SimpleConsumer:
    c = SimpleConsumer(config(b.endpoint), group, {topic: FilterExpression(expr)},
                       await_duration=await_s)
    c.startup()
    return c


def test_send_receive_byte_identical_with_tags_keys_properties(broker):
    topic = create_topic(broker, "RoundTrip", 4)
    bodies = [bytes(range(256)), b"\x00" * 3, "héllo wörld".encode(), b"x" * 70_000]
    producer = _producer(broker, topic)
    sent = {}
    try:
        for i, body in enumerate(bodies):
            m = message(topic, body, tag="TagA" if i % 2 == 0 else "TagB",
                        keys=(f"order-{i}", f"cust-{i}"), props={"color": f"c{i}", "n": str(i)})
            sent[producer.send(m).message_id] = (body, i)
        producer.send(message(topic, b"filtered out", tag="TagC"))
    finally:
        producer.shutdown()
    consumer = _simple(broker, "RoundTripGroup", topic, "TagA || TagB")
    try:
        got = receive_until(consumer, len(bodies))
        assert not consumer.receive(32, 15)  # TagC is not delivered; nothing is redelivered
    finally:
        consumer.shutdown()
    assert {m.message_id for m in got} == set(sent)
    for m in got:
        body, i = sent[m.message_id]
        assert m.body == body
        assert m.tag == ("TagA" if i % 2 == 0 else "TagB")
        assert m.keys == {f"order-{i}", f"cust-{i}"}
        assert m.properties == {"color": f"c{i}", "n": str(i)}
        assert m.delivery_attempt == 1
        assert m.topic == topic


def test_redelivery_after_invisible_time_increments_attempt(broker):
    topic = create_topic(broker, "Redeliver", 2)
    [msg_id] = send(broker, topic, [b"retry me"])
    consumer = _simple(broker, "RedeliverGroup", topic, await_s=5)
    try:
        first = receive_until(consumer, 1, invisible=1, ack=False)
        assert [(m.message_id, m.delivery_attempt) for m in first] == [(msg_id, 1)]
        again = receive_until(consumer, 1, invisible=20, ack=False)  # after ~1 s
        assert [(m.message_id, m.delivery_attempt) for m in again] == [(msg_id, 2)]
        assert again[0].body == b"retry me"
        consumer.ack(again[0])
        assert not consumer.receive(32, 1)
    finally:
        consumer.shutdown()


def test_change_invisible_duration(broker):
    topic = create_topic(broker, "Invisible", 1)
    [msg_id] = send(broker, topic, [b"slow work"])
    consumer = _simple(broker, "InvisibleGroup", topic, await_s=4)
    try:
        [m] = receive_until(consumer, 1, invisible=60, ack=False)
        consumer.change_invisible_duration(m, 1)  # shorten: it comes back in about a second
        [again] = receive_until(consumer, 1, invisible=60, ack=False)
        assert (again.message_id, again.delivery_attempt) == (msg_id, 2)
        consumer.change_invisible_duration(again, 60)  # lengthen: stays hidden past 1 s
        assert not consumer.receive(32, 1)
        consumer.ack(again)  # the handle the change returned is the current one
    finally:
        consumer.shutdown()


def test_fifo_order_per_group_under_concurrent_producers(broker):
    topic = create_topic(broker, "Orders", 3, "FIFO")
    groups = [f"g{i}" for i in range(6)]
    per_group = 6

    def produce(mine: list[str]) -> None:
        p = _producer(broker, topic)
        try:
            for seq in range(per_group):
                for g in mine:
                    p.send(message(topic, f"{g}:{seq}".encode(), group=g))
        finally:
            p.shutdown()

    threads = [threading.Thread(target=produce, args=(groups[i::2],)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    consumer = _simple(broker, "OrdersGroup", topic, await_s=2)
    try:
        # Held, not acked: the next message of its group must not be handed out meanwhile.
        [held] = consumer.receive(1, 30)
        held_group = held.message_group
        others = consumer.receive(32, 30)
        assert held_group not in {m.message_group for m in others}
        for m in others:
            consumer.ack(m)
        consumer.ack(held)
        seen: dict[str, list[int]] = {}
        for m in [held, *others]:
            g, seq = m.body.decode().split(":")
            seen.setdefault(g, []).append(int(seq))
        deadline = time.monotonic() + 60
        while sum(map(len, seen.values())) < len(groups) * per_group:
            assert time.monotonic() < deadline, seen
            for m in consumer.receive(8, 30):
                g, seq = m.body.decode().split(":")
                assert m.message_group == g
                seen.setdefault(g, []).append(int(seq))
                consumer.ack(m)
    finally:
        consumer.shutdown()
    for g in groups:
        assert sorted(seen[g]) == seen[g] == list(range(per_group)), (g, seen[g])


def test_dlq_after_max_attempts(broker):
    topic = create_topic(broker, "Poison", 1)
    r = broker.cli("group", "create", "--group", "PoisonGroup", "--retry-max-times", "1")
    assert r.returncode == 0, r.stderr
    producer = _producer(broker, topic)
    msg_id = producer.send(message(topic, b"\x01poison\x02", tag="bad", keys=("p-1",))).message_id
    producer.shutdown()
    consumer = _simple(broker, "PoisonGroup", topic, await_s=3)
    try:
        attempts = [m.delivery_attempt for m in receive_until(consumer, 1, invisible=1, ack=False)]
        attempts += [m.delivery_attempt for m in receive_until(consumer, 1, invisible=1,
                                                               ack=False)]
        assert attempts == [1, 2]
        # 2 attempts = 1 + retryMaxTimes: moved to the DLQ. The 3 s long poll outlasts the 1 s
        # invisible time, so a third delivery would arrive within this receive.
        assert not consumer.receive(32, 1)
    finally:
        consumer.shutdown()
    dlq = _simple(broker, "DlqReader", "%DLQ%PoisonGroup")
    try:
        [dead] = receive_until(dlq, 1)
    finally:
        dlq.shutdown()
    assert dead.body == b"\x01poison\x02"
    assert dead.message_id == msg_id
    assert dead.tag == "bad" and dead.keys == {"p-1"}
    progress = json.loads(broker.cli("group", "progress", "--group", "PoisonGroup").stdout)
    assert progress["inflight"] == 0 and progress["lag"] == 0


def test_push_consumer_consumes_and_retries_failures(broker):
    topic = create_topic(broker, "Pushed", 2)
    producer = _producer(broker, topic)
    bodies = {f"push-{i}".encode() for i in range(5)}
    for body in sorted(bodies):
        producer.send(message(topic, body))
    producer.shutdown()
    lock = threading.Lock()
    attempts: dict[bytes, list[int]] = {}
    done = threading.Event()

    class Listener(MessageListener):
        def consume(self, m):
            with lock:
                attempts.setdefault(m.body, []).append(m.delivery_attempt)
                first_try = len(attempts[m.body]) == 1
                if set(attempts) == bodies and len(attempts[b"push-0"]) >= 2:
                    done.set()
            if m.body == b"push-0" and first_try:
                return ConsumeResult.FAILURE  # redelivered after the group's 1 s backoff
            return ConsumeResult.SUCCESS

    consumer = PushConsumer(config(broker.endpoint), "PushGroup", Listener(),
                            {topic: FilterExpression()}, consumption_thread_count=2)
    consumer.startup()
    try:
        assert done.wait(60), attempts
        # Every ack stuck: nothing of the group is in flight or owed any more.
        deadline = time.monotonic() + 60
        while True:
            progress = json.loads(broker.cli("group", "progress", "--group", "PushGroup").stdout)
            if progress["inflight"] == 0 and progress["lag"] == 0:
                break
            assert time.monotonic() < deadline, progress
            time.sleep(0.2)
    finally:
        consumer.shutdown()
    assert attempts.pop(b"push-0") == [1, 2]
    assert all(a == [1] for a in attempts.values()), attempts


def test_sigkill_restart_loses_nothing_and_redelivers_no_acked(tmp_path):
    b = BrokerProcess(tmp_path / "store").start()
    create_topic(b, "Durable", 2)
    producer = _producer(b, "Durable")
    sent = {producer.send(message("Durable", f"d-{i}".encode())).message_id: f"d-{i}".encode()
            for i in range(10)}
    producer.shutdown()
    consumer = _simple(b, "DurableGroup", "Durable", await_s=2)
    got: list = []
    deadline = time.monotonic() + 60
    while len(got) < 7:
        assert time.monotonic() < deadline, got
        # Invisible long enough that nothing comes back while we collect, however slow the
        # machine: a redelivery here would make got[] hold one message twice.
        got += consumer.receive(7 - len(got), 120)
    for m in got[:4]:
        consumer.ack(m)  # acked: must never come back
    for m in got[4:]:
        # In flight, unacked; due again in a second, after the restart.
        consumer.change_invisible_duration(m, 1)
    consumer.shutdown()
    acked_ids = {m.message_id for m in got[:4]}
    b.kill()  # SIGKILL: no flush, no checkpoint, abort stays
    assert (tmp_path / "store" / "abort").exists()
    b2 = BrokerProcess(tmp_path / "store").start()
    try:
        # The 4 s long poll of the last receive outlasts any 1 s invisible time still running.
        consumer = _simple(b2, "DurableGroup", "Durable", await_s=4)
        try:
            rest = receive_until(consumer, len(sent) - len(acked_ids), deadline_s=40)
            assert not consumer.receive(32, 1)  # nothing wrongly in flight comes back
        finally:
            consumer.shutdown()
    finally:
        assert b2.terminate() == 0
    assert not {m.message_id for m in rest} & acked_ids
    assert {m.message_id for m in rest} | acked_ids == set(sent)
    assert all(m.body == sent[m.message_id] for m in rest)
    assert not (tmp_path / "store" / "abort").exists()


def test_malformed_requests_get_error_status_and_broker_keeps_serving(broker):
    topic = create_topic(broker, "Robust", 1)
    channel, stub = raw_stub(broker)
    try:
        r = stub.SendMessage(svc.SendMessageRequest(messages=[pb.Message(body=b"x")]))
        assert r.status.code == pb.ILLEGAL_TOPIC
        r = stub.SendMessage(svc.SendMessageRequest(messages=[pb.Message(
            topic=pb.Resource(name="NoSuchTopic"), body=b"x",
            system_properties=pb.SystemProperties(message_id="1"))]))
        assert r.status.code == pb.TOPIC_NOT_FOUND
        r = stub.SendMessage(svc.SendMessageRequest(messages=[pb.Message(
            topic=pb.Resource(name=topic), body=b"x",
            system_properties=pb.SystemProperties(message_id="1", message_type=pb.FIFO,
                                                  message_group="g"))]))
        assert r.status.code == pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE
        responses = list(stub.ReceiveMessage(svc.ReceiveMessageRequest(
            group=pb.Resource(name="RobustGroup"),
            message_queue=pb.MessageQueue(topic=pb.Resource(name=topic)), batch_size=0)))
        assert [x.status.code for x in responses] == [pb.BAD_REQUEST]
        r = stub.AckMessage(svc.AckMessageRequest(
            group=pb.Resource(name="RobustGroup"), topic=pb.Resource(name=topic),
            entries=[svc.AckMessageEntry(message_id="m", receipt_handle="garbage")]))
        assert r.status.code == pb.INVALID_RECEIPT_HANDLE
        r = stub.ChangeInvisibleDuration(svc.ChangeInvisibleDurationRequest(
            group=pb.Resource(name="RobustGroup"), topic=pb.Resource(name=topic),
            receipt_handle="0_0_1_1"))
        assert r.status.code == pb.INVALID_RECEIPT_HANDLE  # the handle is checked first
        # Bytes that are not a protobuf at all: the call fails, the broker does not.
        raw = channel.unary_unary("/apache.rocketmq.v2.MessagingService/SendMessage")
        with pytest.raises(grpc.RpcError):
            raw(b"\xff\xff\xff\xff\x0f\x01", timeout=10)
        admin = channel.unary_unary("/stratamq.admin.v1.Admin/CreateTopic")
        with pytest.raises(grpc.RpcError) as err:
            admin(b"{not json", timeout=10)
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        route = stub.QueryRoute(svc.QueryRouteRequest(topic=pb.Resource(name=topic)))
        assert route.status.code == pb.OK and len(route.message_queues) == 1
    finally:
        channel.close()
    producer = _producer(broker, topic)  # and the real client still works
    try:
        assert producer.send(message(topic, b"still serving")).message_id
    finally:
        producer.shutdown()


def test_pull_and_query_offset_replay_a_queue(broker):
    topic = create_topic(broker, "Replay", 1)
    producer = _producer(broker, topic)
    bodies = [f"r-{i}".encode() for i in range(5)]
    for body in bodies:
        producer.send(message(topic, body, tag="T"))
    producer.shutdown()
    channel, stub = raw_stub(broker)
    mq = pb.MessageQueue(topic=pb.Resource(name=topic), id=0)
    try:
        begin = stub.QueryOffset(svc.QueryOffsetRequest(message_queue=mq,
                                                        query_offset_policy=pb.BEGINNING))
        end = stub.QueryOffset(svc.QueryOffsetRequest(message_queue=mq,
                                                      query_offset_policy=pb.END))
        assert (begin.offset, end.offset) == (0, 5)

        def pull(offset: int, batch: int = 2):
            out = list(stub.PullMessage(svc.PullMessageRequest(
                group=pb.Resource(name="SparkReader"), message_queue=mq, offset=offset,
                batch_size=batch, filter_expression=pb.FilterExpression(type=pb.TAG,
                                                                        expression="*"))))
            status = out[0].status.code
            msgs = [x.message for x in out if x.HasField("message")]
            assert out[-1].HasField("next_offset")
            return status, msgs, out[-1].next_offset

        replayed, offset = [], 1
        while offset < end.offset:
            status, msgs, offset = pull(offset)
            assert status == pb.OK
            replayed += [(m.system_properties.queue_offset, m.body) for m in msgs]
        assert replayed == list(enumerate(bodies))[1:]
        status, msgs, nxt = pull(5)  # the end: nothing new within the (zero) long poll
        assert (status, msgs, nxt) == (pb.MESSAGE_NOT_FOUND, [], 5)
        status, _msgs, nxt = pull(99)
        assert (status, nxt) == (pb.ILLEGAL_OFFSET, 5)

        # TIMESTAMP: the first offset stored at or after the time; the end if none was.
        status, everything, _nxt = pull(0, 5)
        assert status == pb.OK and len(everything) == 5
        stamps = [m.system_properties.store_timestamp.ToMilliseconds() for m in everything]
        for when in (stamps[0] - 1, stamps[2], stamps[-1] + 1):
            req = svc.QueryOffsetRequest(message_queue=mq, query_offset_policy=pb.TIMESTAMP)
            req.timestamp.FromMilliseconds(when)
            want = next((i for i, t in enumerate(stamps) if t >= when), 5)
            assert stub.QueryOffset(req).offset == want, (when, stamps)
    finally:
        channel.close()


def test_topic_and_group_cli(broker):
    assert broker.cli("topic", "create", "--topic", "Cli", "--queues", "3").returncode == 0
    dup = broker.cli("topic", "create", "--topic", "Cli", "--queues", "3")
    assert dup.returncode != 0 and "already exists" in dup.stderr
    bad = broker.cli("topic", "create", "--topic", "bad topic!", "--queues", "1")
    assert bad.returncode != 0 and "must match" in bad.stderr
    upd = broker.cli("topic", "update", "--topic", "Cli", "--queues", "5")
    assert json.loads(upd.stdout)["queues"] == 5
    listed = {json.loads(line)["topic"]: json.loads(line)
              for line in broker.cli("topic", "list").stdout.splitlines()}
    assert listed["Cli"]["queues"] == 5 and listed["Cli"]["type"] == "NORMAL"

    producer = _producer(broker, "Cli")
    for i in range(5):
        producer.send(message("Cli", f"c-{i}".encode()))
    producer.shutdown()
    consumer = _simple(broker, "CliGroup", "Cli")
    try:
        got = receive_until(consumer, 2, ack=False)
        consumer.ack(got[0])
    finally:
        consumer.shutdown()
    # A send is acknowledged once in the CommitLog; the ConsumeQueue (max_offset) catches up
    # asynchronously, so wait for it rather than assume it already did.
    deadline = time.monotonic() + 60
    while True:
        progress = json.loads(broker.cli("group", "progress", "--group", "CliGroup").stdout)
        if sum(q["max_offset"] for q in progress["queues"]) >= 5:
            break
        assert time.monotonic() < deadline, progress
        time.sleep(0.1)
    assert sum(q["max_offset"] for q in progress["queues"]) == 5
    assert progress["lag"] == 5 - 1  # everything but the one ack is still owed
    assert progress["inflight"] == len(got) - 1
    groups = [json.loads(line)["group"] for line in broker.cli("group", "list").stdout.split()]
    assert "CliGroup" in groups

    assert broker.cli("topic", "delete", "--topic", "Cli").returncode == 0
    names = [json.loads(line)["topic"] for line in broker.cli("topic", "list").stdout.split()]
    assert "Cli" not in names
    channel, stub = raw_stub(broker)
    try:
        route = stub.QueryRoute(svc.QueryRouteRequest(topic=pb.Resource(name="Cli")))
        assert route.status.code == pb.TOPIC_NOT_FOUND and "does not exist" in route.status.message
    finally:
        channel.close()


def test_topics_survive_restart_and_sigterm_is_clean(tmp_path):
    b = BrokerProcess(tmp_path / "store").start()
    create_topic(b, "Kept", 2, "FIFO")
    assert b.terminate() == 0
    assert not (tmp_path / "store" / "abort").exists()
    assert (tmp_path / "store" / "config" / "topics.json").exists()
    b = BrokerProcess(tmp_path / "store").start()
    try:
        listed = [json.loads(line) for line in b.cli("topic", "list").stdout.splitlines()]
        assert [(t["topic"], t["queues"], t["type"]) for t in listed] == [("Kept", 2, "FIFO")]
    finally:
        b.terminate()


def test_unknown_broker_conf_keys_are_reported(tmp_path):
    store_cfg, broker_cfg, unknown = load_broker_conf(text=(
        "# comment\nbrokerName=b1\nlistenPort=9999\nflushDiskType=SYNC_FLUSH\n"
        "autoCreateTopicEnable=true\nnoSuchKey=1\nbrokerNmae=typo\n"))
    assert broker_cfg.broker_name == "b1" and broker_cfg.auto_create_topic_enable
    assert store_cfg.listen_port == 9999 and store_cfg.flush_disk_type.value == "SYNC_FLUSH"
    assert unknown == ["noSuchKey", "brokerNmae"]
    b = BrokerProcess(tmp_path / "store", conf_text="brokerNmae=typo\n")
    with pytest.raises(AssertionError, match="brokerNmae"):
        b.start()
    assert b.proc.wait(30) != 0
    assert "brokerNmae" in b.log.read_text()
