"""DELAY (timer) messages: the timer store against a real store and real RocksDB.

Store-level tests drive ``TimerMessageStore`` directly; the end-to-end tests at the bottom drive
a broker subprocess with the official client.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from waiting import wait_until

from stratamq.broker.timer import TIMER_TOPIC, IllegalDeliveryTime, TimerMessageStore
from stratamq.config import StoreConfig
from stratamq.message import Message, Prop
from stratamq.store.message_store import MessageStore

TOPIC = "Delayed"


def _config(root: Path) -> StoreConfig:
    return StoreConfig(store_path_root_dir=str(root), mapped_file_size_commit_log=4 * 1024 * 1024,
                       mapped_file_size_consume_queue=10_000 * 20)


def _timer(store: MessageStore) -> TimerMessageStore:
    return TimerMessageStore(store, max_delay_ms=3 * 24 * 3600 * 1000, flush_interval_ms=200)


def _read_all(store: MessageStore, topic: str, queue_id: int = 0) -> list:
    store.wait_dispatched()
    out = []
    offset = 0
    while True:
        with store.get_messages("t", topic, queue_id, offset, max_count=512) as got:
            msgs = list(got.messages())
            offset = got.next_begin_offset
        if not msgs:
            return out
        out.extend(msgs)


def test_delivered_no_earlier_than_asked_with_properties_kept(tmp_path):
    with MessageStore(_config(tmp_path / "s")).open() as store, _timer(store) as timer:
        base = int(time.time() * 1000)
        asked = {}
        for i, delay in enumerate((1500, 600, 1000)):
            props = {Prop.UNIQ_KEY: f"uniq-{i}", Prop.KEYS: f"k{i}", Prop.TAGS: "TagA",
                     "user-prop": f"v{i}"}
            deliver = base + delay
            res = timer.submit(Message(TOPIC, b"body-%d" % i, queue_id=i % 2,
                                       properties=props), deliver)
            assert res.ok
            asked[f"uniq-{i}"] = (deliver, i % 2, b"body-%d" % i)
        # Nothing is in the real topic before its time: the earliest is 600 ms away.
        assert _read_all(store, TOPIC, 0) == [] and _read_all(store, TOPIC, 1) == []
        wait_until(lambda: timer.delivered == 3)
        got = _read_all(store, TOPIC, 0) + _read_all(store, TOPIC, 1)
        assert len(got) == 3
        for msg in got:
            uniq = msg.properties[Prop.UNIQ_KEY]
            deliver, queue_id, body = asked[uniq]
            # The lower bound is strict: the copy is stored only once the time has come.
            assert msg.store_timestamp >= deliver
            # Upper bound loose: this machine is shared and slow.
            assert msg.store_timestamp < deliver + 10_000
            assert msg.queue_id == queue_id and msg.body == body
            assert msg.tags == "TagA" and msg.properties["user-prop"].startswith("v")
            assert Prop.REAL_TOPIC not in msg.properties
            assert msg.properties[Prop.TIMER_DELIVER_MS] == str(deliver)


def test_past_delivery_time_goes_straight_to_the_topic(tmp_path):
    with MessageStore(_config(tmp_path / "s")).open() as store, _timer(store) as timer:
        res = timer.submit(Message(TOPIC, b"late"), int(time.time() * 1000) - 5000)
        assert res.ok
        got = _read_all(store, TOPIC)
        assert [m.body for m in got] == [b"late"]
        assert _read_all(store, TIMER_TOPIC) == []


def test_delay_beyond_the_maximum_is_refused(tmp_path):
    with MessageStore(_config(tmp_path / "s")).open() as store:
        timer = TimerMessageStore(store, max_delay_ms=60_000, flush_interval_ms=200).open()
        try:
            with pytest.raises(IllegalDeliveryTime, match="timerMaxDelaySec"):
                timer.submit(Message(TOPIC, b"x"), int(time.time() * 1000) + 120_000)
            assert store.max_physical_offset == 0  # nothing was written
        finally:
            timer.close()


def test_hundred_thousand_pending_are_indexed_and_kept_in_order(tmp_path):
    n = 100_000
    with MessageStore(_config(tmp_path / "s")).open() as store:
        timer = _timer(store)
        timer.open()
        far = int(time.time() * 1000) + 3_600_000
        for start in range(0, n, 2000):
            items = [(Message(TOPIC, b"m%d" % i, queue_id=i % 4,
                              properties={Prop.UNIQ_KEY: str(i)}), far + (i * 7919) % 100_000)
                     for i in range(start, start + 2000)]
            assert timer.submit_batch(items).ok
        store.wait_dispatched(60)
        timer.start()
        try:
            wait_until(lambda: timer.enqueue_lag() == 0, 120)
            assert timer.pending() == n
            # None of them is due: nothing was delivered, the next wake-up is the earliest.
            wait_until(lambda: timer.next_due_ms() != 0, 10)
            assert timer.next_due_ms() == far
            assert timer.delivered == 0 and _read_all(store, TOPIC, 0) == []
            # One due message among the 100,000 still goes out promptly.
            timer.submit(Message(TOPIC, b"soon"), int(time.time() * 1000) + 300)
            wait_until(lambda: timer.delivered == 1, 30)
            assert [m.body for m in _read_all(store, TOPIC, 0)] == [b"soon"]
        finally:
            timer.close()


_CHILD = textwrap.dedent("""
    import sys, time
    from stratamq.broker.timer import TimerMessageStore
    from stratamq.config import StoreConfig
    from stratamq.message import Message, Prop
    from stratamq.store.message_store import MessageStore
    root, deliver, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    store = MessageStore(StoreConfig(store_path_root_dir=root,
                                     mapped_file_size_commit_log=4 * 1024 * 1024)).open()
    timer = TimerMessageStore(store, max_delay_ms=10**9, flush_interval_ms=200)
    timer.start()
    for i in range(n):
        assert timer.submit(Message("Delayed", b"m%d" % i,
                                    properties={Prop.UNIQ_KEY: str(i)}), deliver).ok
    print("sent", flush=True)
    time.sleep(60)
""")


def _child(root: Path, deliver_ms: int, n: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(root), str(deliver_ms), str(n)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "sent"
    return proc


@pytest.mark.parametrize("kill_after", ["before_due", "after_due"])
def test_sigkill_loses_no_due_message(tmp_path, kill_after):
    root = tmp_path / "s"
    n = 50
    deliver = int(time.time() * 1000) + 1500
    proc = _child(root, deliver, n)
    if kill_after == "after_due":
        time.sleep(max(0.0, (deliver - time.time() * 1000) / 1000) + 0.3)  # delivery under way
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    with MessageStore(_config(root)).open() as store, _timer(store):
        wait_until(lambda: len({m.properties[Prop.UNIQ_KEY]
                                for m in _read_all(store, TOPIC)}) == n, 30)
        got = _read_all(store, TOPIC)
        # At-least-once: every message is there, each no earlier than asked.
        assert {m.properties[Prop.UNIQ_KEY] for m in got} == {str(i) for i in range(n)}
        assert all(m.store_timestamp >= deliver for m in got)


def test_index_rebuilt_from_the_commitlog_without_redelivering(tmp_path):
    root = tmp_path / "s"
    now = int(time.time() * 1000)
    with MessageStore(_config(root)).open() as store, _timer(store) as timer:
        timer.submit(Message(TOPIC, b"early"), now + 300)
        for i in range(5):
            timer.submit(Message(TOPIC, b"later-%d" % i), now + 3_600_000)
        wait_until(lambda: timer.delivered == 1)
        # Let the delivered key be retired and timercheck written.
        store.flush()
        wait_until(lambda: timer.pending() == 5)
    shutil.rmtree(root / "timerdb")  # the index is gone; timercheck and the CommitLog remain
    with MessageStore(_config(root)).open() as store, _timer(store) as timer:
        wait_until(lambda: timer.enqueue_lag() == 0 and timer.pending() == 5)
        # A delivery pass now finds nothing due: "early" was not put back into the index.
        assert timer.deliver_due() == 0 and timer.delivered == 0
        assert [m.body for m in _read_all(store, TOPIC)] == [b"early"]  # not delivered twice


def test_damaged_index_is_rebuilt_not_fatal(tmp_path):
    root = tmp_path / "s"
    with MessageStore(_config(root)).open() as store, _timer(store) as timer:
        timer.submit(Message(TOPIC, b"x"), int(time.time() * 1000) + 3_600_000)
        wait_until(lambda: timer.pending() == 1)
    for f in (root / "timerdb").iterdir():
        if f.name.startswith(("CURRENT", "MANIFEST")):
            f.write_bytes(b"garbage")
    with MessageStore(_config(root)).open() as store, _timer(store) as timer:
        wait_until(lambda: timer.enqueue_lag() == 0 and timer.pending() == 1)


def test_timercheck_damage_is_reported_and_ignored(tmp_path, caplog):
    root = tmp_path / "s"
    with MessageStore(_config(root)).open() as store, _timer(store) as timer:
        timer.submit(Message(TOPIC, b"x"), int(time.time() * 1000) + 3_600_000)
        wait_until(lambda: (root / "timercheck").exists())
    data = bytearray((root / "timercheck").read_bytes())
    data[10] ^= 0xFF
    (root / "timercheck").write_bytes(bytes(data))
    shutil.rmtree(root / "timerdb")
    with MessageStore(_config(root)).open() as store, _timer(store) as timer:
        wait_until(lambda: timer.enqueue_lag() == 0 and timer.pending() == 1)
    assert "damaged" in caplog.text


# -- end to end: a broker subprocess and the official client -------------------------------------

E2E_TOPICS = [("DelayTopic", 2, "DELAY"), ("NormalTopic", 2, "NORMAL")]


def _client(endpoint: str):
    from rocketmq import ClientConfiguration, Credentials

    return ClientConfiguration(endpoint, Credentials())


def _delay_message(topic: str, body: bytes, deliver_s: int, key: str):
    from rocketmq import Message as ClientMessage

    m = ClientMessage()
    m.topic, m.body, m.tag, m.keys = topic, body, "TagD", key
    m.add_property("p", key)
    m.delivery_timestamp = deliver_s  # this client takes seconds
    return m


def _receive_all(endpoint: str, group: str, n: int, timeout: float = 60) -> list:
    from rocketmq import FilterExpression, SimpleConsumer

    consumer = SimpleConsumer(_client(endpoint), group, {"DelayTopic": FilterExpression("*")})
    consumer.startup()
    got = []
    deadline = time.monotonic() + timeout
    try:
        while len(got) < n and time.monotonic() < deadline:
            for m in consumer.receive(16, 15) or []:
                got.append((time.time(), m))
                consumer.ack(m)
    finally:
        consumer.shutdown()
    return got


def test_client_delay_message_delivered_at_its_time(tmp_path):
    from broker_proc import start_broker
    from rocketmq import Producer

    broker = start_broker(tmp_path, topics=E2E_TOPICS)
    try:
        producer = Producer(_client(broker.endpoint), ("DelayTopic",))
        producer.startup()
        deliver_s = int(time.time()) + 3
        ids = {}
        for i in range(3):
            receipt = producer.send(_delay_message("DelayTopic", b"delay-%d" % i, deliver_s,
                                                   f"key-{i}"))
            ids[receipt.message_id] = b"delay-%d" % i
        producer.shutdown()
        got = _receive_all(broker.endpoint, "DelayGroup", 3)
        assert {m.message_id: m.body for _, m in got} == ids
        for received_at, m in got:
            assert received_at >= deliver_s  # never early
            assert received_at < deliver_s + 15  # loose: shared, slow machine
            assert m.delivery_timestamp == deliver_s * 1000 and m.tag == "TagD"
            assert m.properties["p"] in {"key-0", "key-1", "key-2"}
    finally:
        assert broker.stop() == 0


def test_sigkilled_broker_still_delivers_after_restart(tmp_path):
    from broker_proc import start_broker
    from rocketmq import Producer

    broker = start_broker(tmp_path, topics=E2E_TOPICS)
    producer = Producer(_client(broker.endpoint), ("DelayTopic",))
    producer.startup()
    deliver_s = int(time.time()) + 4
    ids = set()
    for i in range(5):
        ids.add(producer.send(_delay_message("DelayTopic", b"k%d" % i, deliver_s,
                                             f"k{i}")).message_id)
    producer.shutdown()
    broker.kill()  # before the delivery time
    assert time.time() < deliver_s
    broker = start_broker(tmp_path, store=broker.store)
    try:
        got = _receive_all(broker.endpoint, "DelayGroup", 5)
        assert {m.message_id for _, m in got} == ids
        assert all(received_at >= deliver_s for received_at, _ in got)
    finally:
        assert broker.stop() == 0


def _raw_send(endpoint: str, topic: str, deliver_ms: int | None):
    import uuid

    import grpc
    from google.protobuf.timestamp_pb2 import Timestamp
    from rocketmq.grpc_protocol import definition_pb2 as pb
    from rocketmq.grpc_protocol import service_pb2 as svc
    from rocketmq.grpc_protocol import service_pb2_grpc

    sp = pb.SystemProperties(message_id=uuid.uuid4().hex, body_encoding=pb.IDENTITY,
                             born_host="127.0.0.1")
    sp.born_timestamp.GetCurrentTime()
    if deliver_ms is not None:
        sp.delivery_timestamp.CopyFrom(Timestamp(seconds=deliver_ms // 1000,
                                                 nanos=deliver_ms % 1000 * 1_000_000))
        sp.message_type = pb.DELAY
    else:
        sp.message_type = pb.NORMAL
    with grpc.insecure_channel(endpoint) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        return stub.SendMessage(svc.SendMessageRequest(messages=[pb.Message(
            topic=pb.Resource(name=topic), body=b"x", system_properties=sp)]), timeout=10)


def test_message_type_must_match_the_topic(tmp_path):
    from broker_proc import start_broker
    from rocketmq.grpc_protocol import definition_pb2 as pb

    broker = start_broker(tmp_path, topics=E2E_TOPICS)
    try:
        later = int(time.time() * 1000) + 60_000
        refused = _raw_send(broker.endpoint, "NormalTopic", later)
        assert refused.status.code == pb.Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE
        assert "NORMAL" in refused.status.message
        refused = _raw_send(broker.endpoint, "DelayTopic", None)
        assert refused.status.code == pb.Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE
        too_far = _raw_send(broker.endpoint, "DelayTopic", later + 10 * 24 * 3600 * 1000)
        assert too_far.status.code == pb.Code.ILLEGAL_DELIVERY_TIME
        assert "timerMaxDelaySec" in too_far.status.message
        ok = _raw_send(broker.endpoint, "DelayTopic", later)
        assert ok.status.code == pb.Code.OK
    finally:
        assert broker.stop() == 0
