"""Prometheus metrics for the broker, with the names and labels Apache RocketMQ 5 exports, so
its dashboards (Grafana's RocketMQ 5 dashboard, alert rules) work unchanged.

Served over HTTP when ``metricsExporterType=PROM`` (``metricsPromExporterHost`` /
``metricsPromExporterPort``). RocketMQ exports through OpenTelemetry's Prometheus exporter;
the names below are what a scrape of a RocketMQ 5 broker shows (counters end in ``_total``).
Every series carries RocketMQ's ``cluster``, ``node_type`` (``broker``) and ``node_id`` (the
broker name) labels.

==========================================  ===================================================
rocketmq_messages_in_total                  messages stored {topic, message_type, is_system}
rocketmq_throughput_in_total                their body bytes (same labels)
rocketmq_message_size                       histogram of body sizes, bytes {topic, message_type}
rocketmq_messages_out_total                 messages handed to consumers {topic,
                                            consumer_group, is_retry, is_system}
rocketmq_throughput_out_total               their body bytes (same labels)
rocketmq_consumer_lag_messages              not yet acked, over queues {topic, consumer_group,
                                            is_retry, is_system}
rocketmq_consumer_inflight_messages         delivered, not yet acked (same labels)
rocketmq_consumer_ready_messages            not yet delivered (same labels)
rocketmq_send_to_dlq_messages_total         moved to %DLQ% {topic, consumer_group}
rocketmq_producer_connections               live producer clients
rocketmq_consumer_connections               live consumer clients {consumer_group}
rocketmq_topic_number, ..._group_number     topics and consumer groups
rocketmq_rpc_latency                        histogram, ms {protocol_type=grpc, request_code,
                                            response_code}
rocketmq_storage_dispatch_behind_bytes      CommitLog bytes not yet dispatched
rocketmq_storage_flush_behind_bytes         CommitLog bytes not yet flushed
rocketmq_storage_size                       bytes the store occupies on disk
rocketmq_storage_message_reserve_time       ms since the oldest retained message was stored
rocketmq_timing_messages                    DELAY messages waiting (estimate)
stratamq_acks_total                         messages acked {topic, consumer_group}
stratamq_put_latency_seconds                histogram: the store put of one SendMessage
stratamq_flush_latency_seconds              histogram: one CommitLog flush pass
stratamq_disk_used_ratio                    used fraction of the store's file system
stratamq_disk_full                          1 while puts are refused for a full disk
stratamq_unconsumed_deleted_files_total     CommitLog files forced clean-up deleted while
                                            they held unconsumed messages (DELETE_OLDEST)
stratamq_unconsumed_deleted_messages_total  the unconsumed messages they held (per group)
stratamq_recovery_records_set_aside         valid records this open's recovery cut out of the
                                            CommitLog and kept under <store>/damaged/
==========================================  ===================================================

Thread-safety: every ``on_*`` method may be called from any thread (prometheus-client locks).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from stratamq.store.message_store import MessageStore

__all__ = ["BrokerMetrics", "BrokerView", "NullMetrics"]

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
# RocketMQ's buckets: RemotingMetricsManager (ms) and BrokerMetricsManager (bytes).
_RPC_BUCKETS_MS = (1, 3, 5, 7, 10, 100, 1000, 2000, 3000)
_SIZE_BUCKETS = (1024, 4 * 1024, 512 * 1024, 1024 * 1024, 2 * 1024 * 1024, 4 * 1024 * 1024)
_NODE = ("cluster", "node_type", "node_id")


class NullMetrics:
    """The metrics hook when no metrics service is configured: every call does nothing."""

    def on_send(self, topic: str, sizes: Sequence[int], seconds: float,
                message_type: str = "NORMAL", stored_sizes: Sequence[int] = ()) -> None:
        """``sizes``: the bodies stored; ``stored_sizes``: their records' sizes."""

    def on_receive(self, group: str, topic: str, count: int, nbytes: int,
                   stored_bytes: int | None = None) -> None:
        """``nbytes``: the bodies handed out; ``stored_bytes``: their records' sizes."""

    def on_ack(self, group: str, topic: str, count: int) -> None:
        pass

    def on_dlq(self, group: str, topic: str) -> None:
        pass

    def on_rpc(self, method: str, code: str, seconds: float) -> None:
        pass


@dataclass
class BrokerView:
    """What the scrape-time gauges read from the broker, as callables (no broker import)."""

    progress: Callable[[], Iterable[tuple[str, str, int, int]]]  # (group, topic, lag, inflight)
    clients: Callable[[], Iterable[tuple[str, str]]]  # (client type, group)
    counts: Callable[[], tuple[int, int]]  # (topics, groups)


def _is_system(topic: str) -> str:
    return "true" if topic.startswith(("rmq_sys_", "%DLQ%", "%RETRY%")) else "false"


class BrokerMetrics(NullMetrics):
    """Metrics of one broker over one store; ``serve(host, port)`` starts the HTTP exporter."""

    def __init__(self, store: MessageStore, *, cluster: str = "DefaultCluster",
                 node_id: str = "broker-a", view: BrokerView | None = None, timer: Any = None,
                 registry: CollectorRegistry | None = None) -> None:
        self.store = store
        self.node = (cluster, "broker", node_id)
        self.registry = r = registry or CollectorRegistry()
        tm = [*_NODE, "topic", "message_type", "is_system"]
        tg = [*_NODE, "topic", "consumer_group", "is_retry", "is_system"]
        self.messages_in = Counter("rocketmq_messages_in", "messages stored", tm, registry=r)
        self.throughput_in = Counter("rocketmq_throughput_in", "body bytes stored", tm,
                                     registry=r)
        self.message_size = Histogram("rocketmq_message_size", "message body size, bytes",
                                      [*_NODE, "topic", "message_type"],
                                      buckets=_SIZE_BUCKETS, registry=r)
        self.messages_out = Counter("rocketmq_messages_out", "messages handed to consumers",
                                    tg, registry=r)
        self.throughput_out = Counter("rocketmq_throughput_out",
                                      "body bytes handed to consumers", tg, registry=r)
        self.dlq = Counter("rocketmq_send_to_dlq_messages", "messages moved to %DLQ%",
                           [*_NODE, "topic", "consumer_group"], registry=r)
        self.rpc_latency = Histogram("rocketmq_rpc_latency", "RPC latency, ms",
                                     [*_NODE, "protocol_type", "request_code", "response_code"],
                                     buckets=_RPC_BUCKETS_MS, registry=r)
        self.acks = Counter("stratamq_acks", "messages acknowledged",
                            [*_NODE, "topic", "consumer_group"], registry=r)
        self.put_latency = Histogram("stratamq_put_latency_seconds",
                                     "store put of one SendMessage", _NODE,
                                     buckets=_LATENCY_BUCKETS, registry=r)
        self.flush_latency = Histogram("stratamq_flush_latency_seconds",
                                       "one CommitLog flush pass", _NODE,
                                       buckets=_LATENCY_BUCKETS, registry=r)
        self._observe_flush = self.flush_latency.labels(*self.node).observe
        store.flush_observers.append(self._observe_flush)
        r.register(_StoreCollector(store, self.node, view, timer))
        self._http: Any = None

    # -- hooks the RPC handlers call ------------------------------------------------------------

    def on_send(self, topic: str, sizes: Sequence[int], seconds: float,
                message_type: str = "NORMAL", stored_sizes: Sequence[int] = ()) -> None:
        labels = (*self.node, topic, message_type, _is_system(topic))
        self.messages_in.labels(*labels).inc(len(sizes))
        self.throughput_in.labels(*labels).inc(sum(sizes))
        observe = self.message_size.labels(*self.node, topic, message_type).observe
        for size in sizes:
            observe(size)
        self.put_latency.labels(*self.node).observe(seconds)

    def on_receive(self, group: str, topic: str, count: int, nbytes: int,
                   stored_bytes: int | None = None) -> None:
        labels = (*self.node, topic, group, "false", _is_system(topic))
        self.messages_out.labels(*labels).inc(count)
        self.throughput_out.labels(*labels).inc(nbytes)

    def on_ack(self, group: str, topic: str, count: int = 1) -> None:
        self.acks.labels(*self.node, topic, group).inc(count)

    def on_dlq(self, group: str, topic: str) -> None:
        self.dlq.labels(*self.node, topic, group).inc()

    def on_rpc(self, method: str, code: str, seconds: float) -> None:
        self.rpc_latency.labels(*self.node, "grpc", method, code).observe(seconds * 1000)

    # -- exporter -------------------------------------------------------------------------------

    def serve(self, host: str, port: int) -> int:
        """Start the HTTP exporter (``/metrics``); return the bound port (0 picks one)."""
        server, _thread = start_http_server(port, host, registry=self.registry)
        self._http = server
        return server.server_address[1]

    def close(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None
        if self._observe_flush in self.store.flush_observers:
            self.store.flush_observers.remove(self._observe_flush)


class _StoreCollector(Collector):
    """Gauges computed at scrape time from the store, the consumer groups and the timer."""

    def __init__(self, store: MessageStore, node: tuple[str, str, str], view: BrokerView | None,
                 timer: Any) -> None:
        self.store, self.node, self.view, self.timer = store, node, view, timer

    def _gauge(self, name: str, doc: str, value: float,
               extra: dict[str, str] | None = None) -> GaugeMetricFamily:
        extra = extra or {}
        g = GaugeMetricFamily(name, doc, labels=[*_NODE, *extra])
        g.add_metric([*self.node, *extra.values()], value)
        return g

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        store = self.store
        if not store.is_open:
            return
        disk = {"storage_type": "local", "storage_medium": "disk"}
        yield self._gauge("rocketmq_storage_dispatch_behind_bytes",
                          "CommitLog bytes not yet dispatched", store.dispatch_behind_bytes(),
                          disk)
        yield self._gauge("rocketmq_storage_flush_behind_bytes",
                          "CommitLog bytes not yet flushed",
                          max(0, store.max_physical_offset - store.flushed_offset), disk)
        root = store.layout.root
        yield self._gauge("rocketmq_storage_size", "bytes the store occupies on disk",
                          _disk_bytes(root), disk)
        oldest = store.oldest_store_timestamp()
        yield self._gauge("rocketmq_storage_message_reserve_time",
                          "ms since the oldest retained message was stored",
                          max(0, int(time.time() * 1000) - oldest) if oldest else 0, disk)
        usage = shutil.disk_usage(root)
        yield self._gauge("stratamq_disk_used_ratio", "used fraction of the store's file system",
                          (usage.total - usage.free) / usage.total)
        recovery = getattr(store, "recovery", None)
        yield self._gauge("stratamq_recovery_records_set_aside",
                          "valid records the last recovery cut out of the CommitLog and kept "
                          "under <store>/damaged/",
                          recovery.records_after_cut if recovery and recovery.set_aside else 0)
        cleanup = store.cleanup
        if cleanup is not None:
            yield self._gauge("stratamq_disk_full", "1 while puts are refused for a full disk",
                              int(cleanup.disk_full))
            for name, doc, value in (
                ("stratamq_unconsumed_deleted_files", "CommitLog files deleted by forced "
                 "clean-up while they held unconsumed messages",
                 cleanup.unconsumed_deleted_files),
                ("stratamq_unconsumed_deleted_messages", "unconsumed messages deleted by "
                 "forced clean-up", cleanup.unconsumed_deleted_messages)):
                counter = CounterMetricFamily(name, doc, labels=list(_NODE))
                counter.add_metric(list(self.node), value)
                yield counter
        if self.view is not None:
            yield from self._consumers(self.view)
        if self.timer is not None and getattr(self.timer, "db", None) is not None:
            yield self._gauge("rocketmq_timing_messages", "DELAY messages waiting (estimate)",
                              self.timer.pending_estimate())

    def _consumers(self, view: BrokerView) -> Iterator[GaugeMetricFamily]:
        labels = [*_NODE, "topic", "consumer_group", "is_retry", "is_system"]
        lag = GaugeMetricFamily("rocketmq_consumer_lag_messages",
                                "messages a group has not acked, over all queues", labels=labels)
        inflight = GaugeMetricFamily("rocketmq_consumer_inflight_messages",
                                     "messages delivered and not yet acked", labels=labels)
        ready = GaugeMetricFamily("rocketmq_consumer_ready_messages",
                                  "messages not yet delivered", labels=labels)
        totals: dict[tuple[str, str], list[int]] = {}
        for group, topic, n, flying in view.progress():
            row = totals.setdefault((group, topic), [0, 0])
            row[0] += n
            row[1] += flying
        for (group, topic), (n, flying) in sorted(totals.items()):
            values = [*self.node, topic, group, "false", _is_system(topic)]
            lag.add_metric(values, n)
            inflight.add_metric(values, flying)
            ready.add_metric(values, max(0, n - flying))
        yield lag
        yield inflight
        yield ready
        producers = 0
        consumers: dict[str, int] = {}
        for kind, group in view.clients():
            if kind == "PRODUCER":
                producers += 1
            else:
                consumers[group] = consumers.get(group, 0) + 1
        yield self._gauge("rocketmq_producer_connections", "live producer clients", producers)
        conn = GaugeMetricFamily("rocketmq_consumer_connections", "live consumer clients",
                                 labels=[*_NODE, "consumer_group"])
        for group, n in sorted(consumers.items()):
            conn.add_metric([*self.node, group], n)
        yield conn
        topics, groups = view.counts()
        yield self._gauge("rocketmq_topic_number", "topics", topics)
        yield self._gauge("rocketmq_consumer_group_number", "consumer groups", groups)


def _disk_bytes(root: Path) -> int:
    """Allocated bytes under ``root`` (st_blocks: sparse, pre-allocated files count as used)."""
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
            except OSError:
                continue  # deleted by clean-up while we walked
    return total
