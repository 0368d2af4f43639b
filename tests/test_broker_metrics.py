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
        topic = (("topic", "Metered"),)
        tg = (("group", "MeterGroup"), ("topic", "Metered"))
        assert s[("stratamq_messages_in_total", topic)] == 5
        assert s[("stratamq_bytes_in_total", topic)] == sum(map(len, bodies))
        assert s[("stratamq_messages_out_total", tg)] == 2
        assert s[("stratamq_bytes_out_total", tg)] == sum(len(m.body) for m in got)
        assert s[("stratamq_acks_total", tg)] == 2
        assert s[("stratamq_put_latency_seconds_count", ())] == 5
        assert s[("stratamq_consumer_lag_messages", tg)] == 3
        assert s[("stratamq_dispatch_behind_bytes", ())] >= 0
        assert s[("stratamq_commitlog_bytes", ())] > sum(map(len, bodies))
        assert s[("stratamq_store_disk_bytes", ())] > 0
        assert 0 < s[("stratamq_disk_used_ratio", ())] <= 1
        # The async flusher runs every 500 ms; each pass is timed.
        deadline = time.monotonic() + 10
        while (_scrape(port)[("stratamq_flush_latency_seconds_count", ())] == 0
               and time.monotonic() < deadline):
            time.sleep(0.2)
        assert _scrape(port)[("stratamq_flush_latency_seconds_count", ())] > 0
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
        store.flush()
        assert _scrape(port)[("stratamq_flush_latency_seconds_count", ())] >= 1
    finally:
        second.close()
        first.close()
        store.close()
