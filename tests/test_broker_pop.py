"""Pop consumption under contention, and system topics kept out of every client-facing view.

A real broker subprocess and the official client (plus raw stubs where the client hides the
protocol's status codes).
"""

from __future__ import annotations

import json
import threading
import time

import pytest
from rocketmq import Producer, SimpleConsumer
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from test_broker_harness import (
    FAST_CONF,
    BrokerProcess,
    FilterExpression,
    config,
    create_topic,
    message,
    raw_stub,
    send,
)

from stratamq.broker.metadata import TopicConfig


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    store = tmp_path_factory.mktemp("pop") / "store"
    # A store as RocketMQ leaves it: its topics.json lists system topics next to user ones.
    (store / "config").mkdir(parents=True)
    table = {n: TopicConfig(n, 1, 1).to_json()
             for n in ("rmq_sys_wheel_timer", "SCHEDULE_TOPIC_XXXX", "Listed")}
    (store / "config" / "topics.json").write_text(json.dumps({"topicConfigTable": table}))
    b = BrokerProcess(store, conf_text=FAST_CONF + "autoCreateTopicEnable=true\n").start()
    yield b
    assert b.terminate() == 0


def _receive(stub, group: str, topic: str, batch: int, invisible_s: int, poll_s: float = 0):
    req = svc.ReceiveMessageRequest(
        group=pb.Resource(name=group), message_queue=pb.MessageQueue(
            topic=pb.Resource(name=topic), id=-1), batch_size=batch,
        filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"))
    req.invisible_duration.FromSeconds(invisible_s)
    req.long_polling_timeout.FromMilliseconds(int(poll_s * 1000))
    return [r.message for r in stub.ReceiveMessage(req, timeout=poll_s + 30)
            if r.HasField("message")]


def _ack(stub, group: str, topic: str, m: pb.Message) -> int:
    r = stub.AckMessage(svc.AckMessageRequest(
        group=pb.Resource(name=group), topic=pb.Resource(name=topic),
        entries=[svc.AckMessageEntry(message_id=m.system_properties.message_id,
                                     receipt_handle=m.system_properties.receipt_handle)]),
        timeout=30)
    return r.status.code


def test_concurrent_consumers_of_a_group_never_share_an_invisible_message(broker):
    topic = create_topic(broker, "Contended", 3)
    sent = set(send(broker, topic, [f"c-{i}".encode() for i in range(30)]))
    lock = threading.Lock()
    deliveries: list[str] = []
    errors: list[BaseException] = []

    def consume() -> None:
        c = SimpleConsumer(config(broker.endpoint), "ContendedGroup",
                           {topic: FilterExpression("*")}, await_duration=1)
        c.startup()
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                with lock:
                    if len(set(deliveries)) >= len(sent):
                        return
                # Never acked, invisible far longer than the test: a second delivery of any
                # message could only come from two pops handing out the same one.
                for m in c.receive(4, 300):
                    with lock:
                        deliveries.append(m.message_id)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)
        finally:
            c.shutdown()

    threads = [threading.Thread(target=consume) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert sorted(deliveries) == sorted(sent)  # each exactly once


def test_stale_receipt_after_redelivery_does_not_ack_the_new_delivery(broker):
    topic = create_topic(broker, "Stale", 1)
    [msg_id] = send(broker, topic, [b"stale"])
    channel, stub = raw_stub(broker)
    try:
        [first] = _receive(stub, "StaleGroup", topic, 1, 1, poll_s=10)
        again: list = []
        deadline = time.monotonic() + 60
        while not again:  # comes back once its 1 s invisible time is over
            assert time.monotonic() < deadline
            again = _receive(stub, "StaleGroup", topic, 1, 300, poll_s=5)
        assert again[0].system_properties.message_id == msg_id
        assert again[0].system_properties.delivery_attempt == 2
        assert _ack(stub, "StaleGroup", topic, first) == pb.INVALID_RECEIPT_HANDLE
        progress = json.loads(broker.cli("group", "progress", "--group", "StaleGroup").stdout)
        assert progress["inflight"] == 1  # the new delivery is still owed
        assert _ack(stub, "StaleGroup", topic, again[0]) == pb.OK
        progress = json.loads(broker.cli("group", "progress", "--group", "StaleGroup").stdout)
        assert (progress["inflight"], progress["lag"]) == (0, 0)
        assert _ack(stub, "StaleGroup", topic, again[0]) == pb.OK  # a repeated ack is harmless
    finally:
        channel.close()


def test_long_poll_wakes_when_a_message_arrives(broker):
    topic = create_topic(broker, "Wake", 2)
    channel, stub = raw_stub(broker)
    result: list = []
    polling = threading.Thread(
        target=lambda: result.extend(_receive(stub, "WakeGroup", topic, 8, 60, poll_s=120)))
    try:
        # Establish the group's cursor first, so the poll below waits at the end of the queue.
        assert _receive(stub, "WakeGroup", topic, 8, 60) == []
        polling.start()
        [msg_id] = send(broker, topic, [b"wake up"])
        # Answered with the message, not after the 120 s poll: the join would time out first.
        polling.join(100)
        assert not polling.is_alive()
        assert [m.system_properties.message_id for m in result] == [msg_id]
    finally:
        channel.close()


def test_fifo_blocked_expired_message_is_not_delivered_out_of_order(broker):
    topic = create_topic(broker, "FifoHeld", 1, "FIFO")
    p = Producer(config(broker.endpoint), (topic,))
    p.startup()
    try:
        for i in range(3):
            p.send(message(topic, f"f-{i}".encode(), group="g"))
    finally:
        p.shutdown()
    channel, stub = raw_stub(broker)
    try:
        got = []
        deadline = time.monotonic() + 60
        while len(got) < 2:
            assert time.monotonic() < deadline
            got += _receive(stub, "FifoHeldGroup", topic, 2 - len(got), 300, poll_s=2)
        assert [m.body for m in got] == [b"f-0", b"f-1"]
        # f-1 turns visible again while f-0 stays held: f-1 must wait behind f-0.
        r = stub.ChangeInvisibleDuration(svc.ChangeInvisibleDurationRequest(
            group=pb.Resource(name="FifoHeldGroup"), topic=pb.Resource(name=topic),
            receipt_handle=got[1].system_properties.receipt_handle,
            invisible_duration={"seconds": 1}, message_id=got[1].system_properties.message_id),
            timeout=30)
        assert r.status.code == pb.OK
        assert _receive(stub, "FifoHeldGroup", topic, 8, 300, poll_s=3) == []
        assert _ack(stub, "FifoHeldGroup", topic, got[0]) == pb.OK
        again = _receive(stub, "FifoHeldGroup", topic, 8, 300, poll_s=10)
        assert [m.body for m in again][:1] == [b"f-1"]
        assert again[0].system_properties.delivery_attempt == 2
    finally:
        channel.close()


def test_system_topics_are_hidden(broker):
    names = [json.loads(line)["topic"] for line in broker.cli("topic", "list").stdout.split()]
    assert "Listed" in names
    assert not [n for n in names if n.startswith("rmq_sys_") or n == "SCHEDULE_TOPIC_XXXX"]
    bad = broker.cli("topic", "create", "--topic", "rmq_sys_mine", "--queues", "1")
    assert bad.returncode != 0 and "reserved" in bad.stderr
    channel, stub = raw_stub(broker)
    try:
        # Present in the metadata, and auto-create is on: still not routed to clients, which
        # get the proxy's answer for a system topic (GrpcValidator.validateTopic).
        for name in ("rmq_sys_wheel_timer", "rmq_sys_other", "SCHEDULE_TOPIC_XXXX"):
            route = stub.QueryRoute(svc.QueryRouteRequest(topic=pb.Resource(name=name)),
                                    timeout=30)
            assert route.status.code == pb.ILLEGAL_TOPIC, name
            assert route.status.message == "cannot access system topic"
            req = svc.ReceiveMessageRequest(
                group=pb.Resource(name="Snooper"), batch_size=1,
                message_queue=pb.MessageQueue(topic=pb.Resource(name=name)))
            codes = [r.status.code for r in stub.ReceiveMessage(req, timeout=30)]
            assert codes == [pb.ILLEGAL_TOPIC], name
    finally:
        channel.close()
    names = [json.loads(line)["topic"] for line in broker.cli("topic", "list").stdout.split()]
    assert "rmq_sys_other" not in names  # the route lookup did not auto-create it
    progress = json.loads(broker.cli("group", "progress", "--group", "Snooper").stdout)
    assert progress["queues"] == []
