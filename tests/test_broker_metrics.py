"""Prometheus metrics: scrape the real HTTP endpoint of a broker subprocess after real traffic."""

from __future__ import annotations

import time
import urllib.request

import pytest
from broker_proc import free_port, start_broker
from prometheus_client.parser import text_string_to_metric_families
from rocketmq import (
    ClientConfiguration,
    Credentials,
    FilterExpression,
    Message,
    Producer,
    SimpleConsumer,
)

from stratamq.broker.metrics import BrokerMetrics
from stratamq.config import StoreConfig
from stratamq.message import Message as StoreMessage
from stratamq.store.message_store import MessageStore


def _scrape(port: int) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        assert resp.status == 200
        text = resp.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_metrics_after_sends_and_receives(tmp_path):
    port = free_port()
    broker = start_broker(tmp_path, {"metricsPrometheusPort": str(port)},
                          topics=[("Metered", 1, "NORMAL")])
    try:
        cfg = ClientConfiguration(broker.endpoint, Credentials())
        producer = Producer(cfg, ("Metered",))
        producer.startup()
        bodies = [b"x" * (10 * (i + 1)) for i in range(5)]
        for body in bodies:
            m = Message()
            m.topic, m.body = "Metered", body
            producer.send(m)
        producer.shutdown()
        consumer = SimpleConsumer(cfg, "MeterGroup", {"Metered": FilterExpression("*")})
        consumer.startup()
        got = []
        deadline = time.monotonic() + 30
        while len(got) < 2 and time.monotonic() < deadline:
            got += consumer.receive(2 - len(got), 15) or []
        for m in got:
            consumer.ack(m)
        consumer.shutdown()

        s = _scrape(port)
        node = {"cluster": "DefaultCluster", "node_type": "broker", "node_id": "broker-a"}

        def key(name: str, **labels: str) -> tuple[str, tuple]:
            return name, tuple(sorted({**node, **labels}.items()))

        produced = {"topic": "Metered", "message_type": "NORMAL", "is_system": "false"}
        consumed = {"topic": "Metered", "consumer_group": "MeterGroup", "is_retry": "false",
                    "is_system": "false"}
        # RocketMQ 5's names and labels, as its dashboards query them.
        assert s[key("rocketmq_messages_in_total", **produced)] == 5
        assert s[key("rocketmq_throughput_in_total", **produced)] == sum(map(len, bodies))
        assert s[key("rocketmq_message_size_count", topic="Metered",
                     message_type="NORMAL")] == 5
        assert s[key("rocketmq_messages_out_total", **consumed)] == 2
        assert s[key("rocketmq_throughput_out_total", **consumed)] == sum(
            len(m.body) for m in got)
        assert s[key("stratamq_acks_total", topic="Metered", consumer_group="MeterGroup")] == 2
        assert s[key("rocketmq_consumer_lag_messages", **consumed)] == 3
        assert s[key("rocketmq_consumer_inflight_messages", **consumed)] == 0
        assert s[key("rocketmq_consumer_ready_messages", **consumed)] == 3
        assert s[key("stratamq_put_latency_seconds_count")] == 5
        assert s[key("rocketmq_rpc_latency_count", protocol_type="grpc",
                     request_code="SendMessage", response_code="OK")] == 5
        assert s[key("rocketmq_rpc_latency_count", protocol_type="grpc",
                     request_code="AckMessage", response_code="OK")] == 2
        disk = {"storage_type": "local", "storage_medium": "disk"}
        assert s[key("rocketmq_storage_dispatch_behind_bytes", **disk)] >= 0
        assert s[key("rocketmq_storage_size", **disk)] > sum(map(len, bodies))
        assert s[key("rocketmq_storage_message_reserve_time", **disk)] >= 0
        assert s[key("rocketmq_topic_number")] >= 1
        assert s[key("rocketmq_consumer_group_number")] >= 1
        assert 0 < s[key("stratamq_disk_used_ratio")] <= 1
        # The async flusher runs every 500 ms; each pass is timed.
        deadline = time.monotonic() + 10
        while (_scrape(port)[key("stratamq_flush_latency_seconds_count")] == 0
               and time.monotonic() < deadline):
            time.sleep(0.2)
        assert _scrape(port)[key("stratamq_flush_latency_seconds_count")] > 0
    finally:
        assert broker.stop() == 0


def test_port_in_use_is_reported(tmp_path):
    store = MessageStore(StoreConfig(store_path_root_dir=str(tmp_path / "s"))).open()
    first = BrokerMetrics(store)
    second = BrokerMetrics(store)
    try:
        port = first.serve("127.0.0.1", 0)
        with pytest.raises(OSError):
            second.serve("127.0.0.1", port)
        store.put_message(StoreMessage("T", b"abc"))
        # The flush service's passes are timed (every 500 ms).
        flushes = ("stratamq_flush_latency_seconds_count", (
            ("cluster", "DefaultCluster"), ("node_id", "broker-a"), ("node_type", "broker")))
        deadline = time.monotonic() + 10
        while _scrape(port)[flushes] == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _scrape(port)[flushes] >= 1
    finally:
        second.close()
        first.close()
        store.close()
