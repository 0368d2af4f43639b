"""Transactional messages end to end: a real broker subprocess, the official RocketMQ 5
Python client's transactional producer (``TransactionChecker``) and consumers, real SIGKILLs.

Fast settings (transactionCheckInterval 300 ms, transactionTimeOut 800 ms) keep the checks
quick; every wait polls for its condition with a deadline (tests/waiting.py).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import grpc
from broker_proc import BrokerProc, free_port, start_broker
from prometheus_client.parser import text_string_to_metric_families
from rocketmq import ClientConfiguration, Credentials, FilterExpression, Producer, SimpleConsumer
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc
from rocketmq.v5.model import Message
from rocketmq.v5.producer import TransactionChecker
from waiting import wait_until

from stratamq.config import StoreConfig
from stratamq.message import Host, Prop
from stratamq.message import Message as StoreMessage
from stratamq.store.message_store import MessageStore
from stratamq.transactions.messages import (
    CHECK_MAX_TOPIC,
    HALF_TOPIC,
    OP_TOPIC,
    committed_message,
    half_message,
    op_message,
)

TOPIC = "TxTopic"
FAST = {"transactionCheckInterval": "300", "transactionTimeOut": "800"}
COMMIT, ROLLBACK, UNKNOWN = pb.COMMIT, pb.ROLLBACK, pb.TRANSACTION_RESOLUTION_UNSPECIFIED


class Checker(TransactionChecker):
    """Answers checks from ``answers`` (by message body); counts the checks per body."""

    def __init__(self, answers: dict[bytes, int]) -> None:
        self.answers = answers
        self.checks: dict[bytes, int] = {}
        self.lock = threading.Lock()

    def check(self, message: Message) -> int:
        with self.lock:
            self.checks[message.body] = self.checks.get(message.body, 0) + 1
        return self.answers.get(message.body, UNKNOWN)


def _config(endpoint: str) -> ClientConfiguration:
    return ClientConfiguration(endpoint, Credentials(), request_timeout=10)


def _producer(endpoint: str, checker: Checker) -> Producer:
    p = Producer(_config(endpoint), (TOPIC,), checker)
    p.startup()
    return p


def _message(body: bytes) -> Message:
    m = Message()
    m.topic = TOPIC
    m.body = body
    return m


def _half(producer: Producer, body: bytes):
    """Send ``body`` as a half message; the transaction (not ended)."""
    txn = producer.begin_transaction()
    producer.send(_message(body), txn)
    return txn


def _consumer(endpoint: str, group: str) -> SimpleConsumer:
    c = SimpleConsumer(_config(endpoint), group, {TOPIC: FilterExpression("*")},
                       await_duration=1)
    c.startup()
    return c


def _drain(consumer: SimpleConsumer, seen: list[bytes]) -> list[bytes]:
    """Receive (and ack) what is there now; appended to ``seen``."""
    for m in consumer.receive(32, 15) or []:
        seen.append(m.body)
        consumer.ack(m)
    return seen


def _open(broker: BrokerProc) -> list[dict]:
    r = subprocess.run([sys.executable, "-m", "stratamq.cli", "transaction", "list",
                        "--endpoint", broker.endpoint], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for line in r.stdout.splitlines() if line.strip()]


def _metric(port: int, name: str) -> float:
    """The value of ``name`` for TOPIC on the broker's Prometheus endpoint."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels.get("topic") == TOPIC:
                return sample.value
    return 0.0


def _records(store: Path, topic: str, queue_id: int = 0) -> list:
    """Every record of ``topic`` queue ``queue_id``, from the store opened read-only."""
    cfg = StoreConfig(store_path_root_dir=str(store))
    with (MessageStore(cfg, read_only=True).open() as s,
          s.get_messages("t", topic, queue_id, 0, max_count=10_000) as got):
        return [(m.properties, bytes(m.body), m.sys_flag) for m in got.messages()]


def test_commit_rollback_exactly_once_and_no_half_visible(tmp_path):
    port = free_port()
    broker = start_broker(tmp_path, {"transactionTimeOut": "600000",
                                     "metricsExporterType": "PROM",
                                     "metricsPromExporterPort": str(port)},
                          topics=[(TOPIC, 2, "TRANSACTION")])
    producer = _producer(broker.endpoint, Checker({}))
    consumer = _consumer(broker.endpoint, "g1")
    try:
        to_commit, to_roll_back = _half(producer, b"commit-me"), _half(producer, b"roll-me")
        _half(producer, b"open")
        seen = _drain(consumer, [])
        assert seen == []  # no half message reaches a consumer while its transaction is open
        listed = _open(broker)
        assert sorted(t["topic"] for t in listed) == [TOPIC] * 3
        assert all(t["checks"] == 0 and t["age_ms"] >= 0 for t in listed)
        assert _metric(port, "rocketmq_half_messages") == 3
        to_commit.commit()
        to_roll_back.rollback()
        to_commit.commit()  # a retried EndTransaction is answered as the first, stores nothing
        wait_until(lambda: b"commit-me" in _drain(consumer, seen), 30, "the committed message")
        assert [t["checks"] for t in _open(broker)] == [0]  # "open" stays open
        _drain(consumer, seen)
        assert seen == [b"commit-me"]
        assert _metric(port, "rocketmq_half_messages") == 1
        assert _metric(port, "rocketmq_commit_messages_total") == 1
        assert _metric(port, "rocketmq_rollback_messages_total") == 1
        assert _metric(port, "rocketmq_finish_message_latency_count") == 2
    finally:
        consumer.shutdown()
        producer.shutdown()
        assert broker.stop() == 0
    committed = _records(broker.store, TOPIC, 0) + _records(broker.store, TOPIC, 1)
    assert [body for _, body, _ in committed] == [b"commit-me"]
    props, _, sys_flag = committed[0]
    assert Prop.REAL_TOPIC not in props and Prop.TRANSACTION_PREPARED not in props
    assert props["PGROUP"] == TOPIC and props["__transactionId__"] == props[Prop.UNIQ_KEY]
    assert sys_flag & 0b1100 == 0b1000  # MessageSysFlag.TRANSACTION_COMMIT_TYPE
    halves = _records(broker.store, HALF_TOPIC)
    assert {p[Prop.REAL_TOPIC] for p, _, _ in halves} == {TOPIC}
    assert all(p[Prop.TRANSACTION_PREPARED] == "true" for p, _, _ in halves)
    ops = _records(broker.store, OP_TOPIC)
    assert len(ops) == 2 and all(p[Prop.TAGS] == "d" for p, _, _ in ops)


def test_check_back_commits_rolls_back_and_gives_up_after_check_max(tmp_path):
    broker = start_broker(tmp_path, {**FAST, "transactionCheckMax": "2"},
                          topics=[(TOPIC, 1, "TRANSACTION")])
    checker = Checker({b"yes": COMMIT, b"no": ROLLBACK})
    producer = _producer(broker.endpoint, checker)
    consumer = _consumer(broker.endpoint, "g2")
    try:
        for body in (b"yes", b"no", b"unsure"):
            _half(producer, body)  # the producer never ends them itself
        seen: list[bytes] = []
        wait_until(lambda: not _open(broker), 60, "every transaction ended")
        wait_until(lambda: b"yes" in _drain(consumer, seen), 30, "the checked-back commit")
        _drain(consumer, seen)
        assert seen == [b"yes"]
        assert checker.checks[b"yes"] == 1 and checker.checks[b"no"] == 1
        assert checker.checks[b"unsure"] == 2  # transactionCheckMax checks, then given up
    finally:
        consumer.shutdown()
        producer.shutdown()
        assert broker.stop() == 0
    given_up = _records(broker.store, CHECK_MAX_TOPIC)
    assert [body for _, body, _ in given_up] == [b"unsure"]
    assert given_up[0][0]["TRANSACTION_CHECK_TIMES"] == "2"


def test_no_live_producer_keeps_it_open_unchecked(tmp_path):
    broker = start_broker(tmp_path, {**FAST, "transactionCheckMax": "1"},
                          topics=[(TOPIC, 1, "TRANSACTION")])
    producer = _producer(broker.endpoint, Checker({}))
    try:
        _half(producer, b"orphan")
    finally:
        producer.shutdown()
    try:
        # Several check rounds pass with nobody to ask: never counted, never given up.
        wait_until(lambda: _open(broker) and _open(broker)[0]["age_ms"] > 3_000, 30,
                   "the orphan to age past several check rounds")
        listed = _open(broker)
        assert [(t["checks"], t["topic"]) for t in listed] == [(0, TOPIC)]
        checker = Checker({b"orphan": COMMIT})
        producer = _producer(broker.endpoint, checker)  # a producer comes back: asked, commits
        consumer = _consumer(broker.endpoint, "g3")
        seen: list[bytes] = []
        wait_until(lambda: b"orphan" in _drain(consumer, seen), 30, "the orphan committed")
        consumer.shutdown()
        producer.shutdown()
    finally:
        assert broker.stop() == 0
    assert _records(broker.store, CHECK_MAX_TOPIC) == []


def test_sigkill_after_half_ack_and_between_commit_writes(tmp_path):
    env = {"STRATAMQ_TRANSACTION_KILL_AT": "commit-stored"}
    broker = start_broker(tmp_path, {"transactionCheckInterval": "300",
                                     "transactionTimeOut": "60000"},
                          topics=[(TOPIC, 1, "TRANSACTION")], env=env)
    checker = Checker({b"first": COMMIT, b"second": ROLLBACK, b"third": COMMIT})
    producer = _producer(broker.endpoint, checker)
    first = _half(producer, b"first")
    second, third = _half(producer, b"second"), _half(producer, b"third")
    with contextlib.suppress(Exception):  # no answer: the broker is gone
        first.commit()  # the broker kills itself after the committed message, before the op
    broker.proc.wait(timeout=60)
    assert broker.proc.returncode == -9
    producer.shutdown()
    # Restarted on the same store: "first" is committed (its op was never written), the two
    # acknowledged halves are open.
    broker = start_broker(tmp_path, FAST, store=broker.store)
    try:
        listed = _open(broker)
        assert sorted(t["topic"] for t in listed) == [TOPIC, TOPIC]
        producer = _producer(broker.endpoint, checker)
        consumer = _consumer(broker.endpoint, "g4")
        seen: list[bytes] = []
        wait_until(lambda: not _open(broker), 60, "the open transactions checked back")
        wait_until(lambda: len(_drain(consumer, seen)) >= 2, 30, "both commits consumed")
        _drain(consumer, seen)
        assert sorted(seen) == [b"first", b"third"]
        assert b"first" not in checker.checks  # committed before the crash: never asked
        del second, third
        consumer.shutdown()
        producer.shutdown()
    finally:
        assert broker.stop() == 0
    assert sorted(b for _, b, _ in _records(broker.store, TOPIC)) == [b"first", b"third"]
    # The op the crash cut off was written after the restart: every half has its op.
    op_offsets = [int(o) for _, body, _ in _records(broker.store, OP_TOPIC)
                  for o in body.decode().split(",") if o]
    half_offsets = list(range(len(_records(broker.store, HALF_TOPIC))))
    assert sorted(set(op_offsets)) == half_offsets


def test_store_in_rocketmq_layout_opens_with_its_state(tmp_path):
    """Half and op records written as RocketMQ's broker writes them (the project's record
    encoder, RocketMQ's fields): one committed, one rolled back, one open."""
    store = tmp_path / "store"
    cfg = StoreConfig(store_path_root_dir=str(store), mapped_file_size_commit_log=4 << 20,
                      mapped_file_size_consume_queue=10_000 * 20)
    host = Host("127.0.0.1", 0)
    with MessageStore(cfg).open() as s:
        halves = []
        for i, body in enumerate((b"was-committed", b"was-rolled-back", b"still-open")):
            sent = StoreMessage(TOPIC, body, 0, {Prop.UNIQ_KEY: f"ID{i:030d}"},
                                born_timestamp=1_700_000_000_000, born_host=host)
            halves.append(s.put_message(half_message(sent, TOPIC)))
        s.wait_dispatched()
        first = s.look_message_by_offset(halves[0].physical_offset)
        s.put_message(committed_message(first))
        s.put_message(op_message([0], host))  # RocketMQ 5 batches: "0,"
        s.put_message(op_message([1], host))
    broker = start_broker(tmp_path, FAST, store=store, topics=[(TOPIC, 1, "TRANSACTION")])
    checker = Checker({b"still-open": COMMIT})
    try:
        listed = _open(broker)
        assert [t["transaction_id"] for t in listed] == [f"ID{2:030d}"]
        producer = _producer(broker.endpoint, checker)
        consumer = _consumer(broker.endpoint, "g5")
        seen: list[bytes] = []
        wait_until(lambda: len(_drain(consumer, seen)) >= 2, 30, "both commits consumed")
        _drain(consumer, seen)
        assert sorted(seen) == [b"still-open", b"was-committed"]
        assert checker.checks == {b"still-open": 1}
        consumer.shutdown()
        producer.shutdown()
    finally:
        assert broker.stop() == 0


def test_wrong_types_and_unknown_transactions_answered_as_the_proxy_does(tmp_path):
    broker = start_broker(tmp_path, topics=[(TOPIC, 1, "TRANSACTION"), ("Plain", 1, "NORMAL")])
    channel = grpc.insecure_channel(broker.endpoint)
    stub = service_pb2_grpc.MessagingServiceStub(channel)

    def send(topic: str, kind: int) -> int:
        return stub.SendMessage(svc.SendMessageRequest(messages=[pb.Message(
            topic=pb.Resource(name=topic), body=b"x", system_properties=pb.SystemProperties(
                message_id="ID-1", message_type=kind))])).status.code

    def end(topic: str, transaction_id: str) -> int:
        return stub.EndTransaction(svc.EndTransactionRequest(
            topic=pb.Resource(name=topic), message_id="ID-1", transaction_id=transaction_id,
            resolution=pb.COMMIT, source=pb.SOURCE_CLIENT)).status.code

    try:
        assert send("Plain", pb.TRANSACTION) == pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE
        assert send(TOPIC, pb.NORMAL) == pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE
        assert end(TOPIC, "") == pb.INVALID_TRANSACTION_ID
        assert end(TOPIC, "no-such-transaction") == pb.INVALID_TRANSACTION_ID
        sent = stub.SendMessage(svc.SendMessageRequest(messages=[pb.Message(
            topic=pb.Resource(name=TOPIC), body=b"x", system_properties=pb.SystemProperties(
                message_id="ID-2", message_type=pb.TRANSACTION))]))
        assert sent.status.code == pb.OK and sent.entries[0].transaction_id == "ID-2"
        assert end("Plain", "ID-2") == pb.INVALID_TRANSACTION_ID  # another producer group
        assert end(TOPIC, "ID-2") == pb.OK
    finally:
        channel.close()
        assert broker.stop() == 0
    assert [body for _, body, _ in _records(broker.store, TOPIC)] == [b"x"]
    assert _records(broker.store, "Plain") == []


def test_recovery_duration_set_by_the_producer_decides_the_first_check(tmp_path):
    """transactionTimeOut is 10 minutes; a half whose producer set a 1 s orphaned-transaction
    recovery duration is checked (and committed by the checker) long before."""
    broker = start_broker(tmp_path, {"transactionCheckInterval": "300",
                                     "transactionTimeOut": "600000"},
                          topics=[(TOPIC, 1, "TRANSACTION")])
    channel = grpc.insecure_channel(broker.endpoint)
    stub = service_pb2_grpc.MessagingServiceStub(channel)

    def send(message_id: str, body: bytes, seconds: int) -> int:
        sp = pb.SystemProperties(message_id=message_id, message_type=pb.TRANSACTION)
        sp.orphaned_transaction_recovery_duration.FromSeconds(seconds)
        return stub.SendMessage(svc.SendMessageRequest(messages=[pb.Message(
            topic=pb.Resource(name=TOPIC), body=body, system_properties=sp)])).status.code

    checker = Checker({b"soon": COMMIT, b"later": COMMIT})
    producer = _producer(broker.endpoint, checker)
    consumer = _consumer(broker.endpoint, "g6")
    try:
        assert send("ID-3", b"too-long", 3601) == pb.BAD_REQUEST  # the proxy's 1 hour limit
        assert send("ID-4", b"soon", 1) == pb.OK
        assert send("ID-5", b"later", 3600) == pb.OK
        seen: list[bytes] = []
        wait_until(lambda: b"soon" in _drain(consumer, seen), 30, "the checked-back commit")
        assert checker.checks == {b"soon": 1}
        assert [t["transaction_id"] for t in _open(broker)] == ["ID-5"]
    finally:
        consumer.shutdown()
        producer.shutdown()
        channel.close()
        assert broker.stop() == 0
    halves = _records(broker.store, HALF_TOPIC)
    assert {p[Prop.UNIQ_KEY]: p.get("CHECK_IMMUNITY_TIME_IN_SECONDS") for p, _, _ in halves
            if "TRANSACTION_CHECK_TIMES" not in p} == {"ID-4": "1", "ID-5": "3600"}
