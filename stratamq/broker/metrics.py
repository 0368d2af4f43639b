"""Prometheus metrics for the broker, served over HTTP (``metricsPrometheusPort``).

Counters and histograms are updated by the RPC handlers through ``on_send`` / ``on_receive`` /
``on_ack``; gauges that describe the store (dispatch lag, disk usage, consumer lag, pending
timer messages) are computed when Prometheus scrapes, so they cost nothing in between.

Metric names (all prefixed ``stratamq_``):

===================================  ========================================================
messages_in_total{topic}             messages stored by SendMessage
bytes_in_total{topic}                their body bytes
messages_out_total{topic,group}      messages handed out by ReceiveMessage / pull
bytes_out_total{topic,group}         their body bytes
acks_total{topic,group}              messages acknowledged
put_latency_seconds                  histogram: SendMessage's store put (incl. SYNC_FLUSH wait)
flush_latency_seconds                histogram: one CommitLog flush pass (msync/fdatasync)
dispatch_behind_bytes                CommitLog bytes not yet in ConsumeQueues
commitlog_bytes                      CommitLog data held (max - min physical offset)
store_disk_bytes                     bytes the store directory occupies on disk
disk_used_ratio                      used fraction of the store's file system
consumer_lag_messages{group,topic}   messages not yet consumed, summed over queues
timer_pending_messages               DELAY messages waiting (RocksDB estimate)
===================================  ========================================================

Thread-safety: every ``on_*`` method may be called from any thread (prometheus-client locks).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from stratamq.store.message_store import MessageStore

__all__ = ["BrokerMetrics"]

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)

LagProvider = Callable[[], Iterable[tuple[str, str, int]]]  # -> (group, topic, lag) rows


class BrokerMetrics:
    """Metrics of one broker over one store; ``serve(host, port)`` starts the HTTP exporter."""

    def __init__(self, store: MessageStore, *, lag_provider: LagProvider | None = None,
                 timer: Any = None, registry: CollectorRegistry | None = None) -> None:
        self.store = store
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.messages_in = Counter("stratamq_messages_in", "messages stored by SendMessage",
                                   ["topic"], registry=r)
        self.bytes_in = Counter("stratamq_bytes_in", "body bytes stored by SendMessage",
                                ["topic"], registry=r)
        self.messages_out = Counter("stratamq_messages_out", "messages handed to consumers",
                                    ["topic", "group"], registry=r)
        self.bytes_out = Counter("stratamq_bytes_out", "body bytes handed to consumers",
                                 ["topic", "group"], registry=r)
        self.acks = Counter("stratamq_acks", "messages acknowledged", ["topic", "group"],
                            registry=r)
        self.put_latency = Histogram("stratamq_put_latency_seconds",
                                     "store put of one SendMessage", buckets=_LATENCY_BUCKETS,
                                     registry=r)
        self.flush_latency = Histogram("stratamq_flush_latency_seconds",
                                       "one CommitLog flush pass", buckets=_LATENCY_BUCKETS,
                                       registry=r)
        r.register(_StoreCollector(store, lag_provider, timer))
        self._unwrap_flush = self._time_flushes()
        self._http: Any = None

    def _time_flushes(self) -> Callable[[], None]:
        """Time each CommitLog flush pass by wrapping this store's MappedFileQueue.flush.

        The flush services call ``files.flush``; wrapping the instance attribute measures
        them without the store knowing about metrics (undone by ``close``).
        """
        files = self.store.commitlog.files
        inner = files.flush
        wrapped_before = "flush" in files.__dict__
        observe = self.flush_latency.observe

        def timed_flush(least_pages: int = 0) -> bool:
            start = time.perf_counter()
            try:
                return inner(least_pages)
            finally:
                observe(time.perf_counter() - start)

        files.flush = timed_flush

        def unwrap() -> None:
            if files.__dict__.get("flush") is timed_flush:
                if wrapped_before:
                    files.flush = inner
                else:
                    del files.flush
        return unwrap

    # -- hooks the RPC handlers call ------------------------------------------------------------

    def on_send(self, topic: str, count: int, nbytes: int, seconds: float) -> None:
        self.messages_in.labels(topic).inc(count)
        self.bytes_in.labels(topic).inc(nbytes)
        self.put_latency.observe(seconds)

    def on_receive(self, group: str, topic: str, count: int, nbytes: int) -> None:
        self.messages_out.labels(topic, group).inc(count)
        self.bytes_out.labels(topic, group).inc(nbytes)

    def on_ack(self, group: str, topic: str, count: int = 1) -> None:
        self.acks.labels(topic, group).inc(count)

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
        self._unwrap_flush()


class _StoreCollector(Collector):
    """Gauges computed at scrape time from the store, the consumer groups and the timer."""

    def __init__(self, store: MessageStore, lag_provider: LagProvider | None, timer: Any):
        self.store = store
        self.lag_provider = lag_provider
        self.timer = timer

    def collect(self) -> Iterator[GaugeMetricFamily]:
        store = self.store
        if not store._opened:
            return
        yield GaugeMetricFamily("stratamq_dispatch_behind_bytes",
                                "CommitLog bytes not yet dispatched to ConsumeQueues",
                                value=store.dispatch_behind_bytes())
        yield GaugeMetricFamily("stratamq_commitlog_bytes", "CommitLog data held",
                                value=store.max_physical_offset - store.min_physical_offset)
        root = store.layout.root
        yield GaugeMetricFamily("stratamq_store_disk_bytes",
                                "bytes the store directory occupies on disk",
                                value=_disk_bytes(root))
        usage = shutil.disk_usage(root)
        yield GaugeMetricFamily("stratamq_disk_used_ratio",
                                "used fraction of the store's file system",
                                value=(usage.total - usage.free) / usage.total)
        lag = GaugeMetricFamily("stratamq_consumer_lag_messages",
                                "messages a group has not consumed yet, over all queues",
                                labels=["group", "topic"])
        if self.lag_provider is not None:
            totals: dict[tuple[str, str], int] = {}
            for group, topic, n in self.lag_provider():
                totals[(group, topic)] = totals.get((group, topic), 0) + n
            for (group, topic), n in sorted(totals.items()):
                lag.add_metric([group, topic], n)
        yield lag
        if self.timer is not None and getattr(self.timer, "db", None) is not None:
            yield GaugeMetricFamily("stratamq_timer_pending_messages",
                                    "DELAY messages waiting for their time (estimate)",
                                    value=self.timer.pending_estimate())


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
