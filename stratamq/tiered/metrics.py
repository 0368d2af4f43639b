"""Prometheus series of the tier, with RocketMQ's tieredstore metric names
(``TieredStoreMetricsConstant``) where it has one; registered by the broker next to its own.

================================================  =============================================
rocketmq_tiered_store_dispatch_behind             messages dispatched, not yet in the tier
rocketmq_tiered_store_messages_dispatch_total     messages uploaded
rocketmq_tiered_store_messages_out_total          messages the tier served to readers
rocketmq_tiered_store_read_ahead_cache_count      messages in the read-ahead cache
rocketmq_tiered_store_read_ahead_cache_bytes      their bytes
rocketmq_tiered_store_read_ahead_cache_access_total / _hit_total   lookups and hits
stratamq_tiered_store_upload_bytes_total          record bytes uploaded
stratamq_tiered_store_retention_hold_bytes        local CommitLog bytes kept because the tier
                                                  does not have them yet (bounded by
                                                  dispatcherRetentionHoldMaxBytes)
stratamq_tiered_store_skipped_messages_total      messages that left the local store before
                                                  they could be uploaded
stratamq_tiered_store_corrupt_records_total       tier records reads found corrupt (each once;
                                                  never served)
stratamq_tiered_store_missing_messages_total      queue offsets reads found lost from the tier
                                                  (a file truncated or gone; each once)
================================================  =============================================
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from stratamq.tiered import TieredStore

__all__ = ["TierCollector"]

_NODE = ["cluster", "node_type", "node_id"]


class TierCollector(Collector):
    """Values read from the tier at scrape time (any thread)."""

    def __init__(self, tier: TieredStore, node: tuple[str, str, str]) -> None:
        self.tier = tier
        self.node = list(node)

    def _one(self, kind: type, name: str, doc: str, value: float) -> Any:
        family = kind(name, doc, labels=_NODE)
        family.add_metric(self.node, value)
        return family

    def collect(self) -> Iterator[Any]:
        tier = self.tier
        up = tier.uploader
        cache = tier.fetcher.cache
        gauge, counter = GaugeMetricFamily, CounterMetricFamily
        if up is not None:
            yield self._one(gauge, "rocketmq_tiered_store_dispatch_behind",
                            "messages dispatched, not yet in the tier", up.waiting_messages())
            yield self._one(counter, "rocketmq_tiered_store_messages_dispatch",
                            "messages uploaded to the tier", up.uploaded_messages)
            yield self._one(counter, "stratamq_tiered_store_upload_bytes",
                            "record bytes uploaded to the tier", up.uploaded_bytes)
            yield self._one(counter, "stratamq_tiered_store_skipped_messages",
                            "messages that left the local store before upload",
                            up.skipped_messages)
            yield self._one(gauge, "stratamq_tiered_store_retention_hold_bytes",
                            "local CommitLog bytes held for the tier", up.retention_hold_bytes())
            yield self._one(gauge, "stratamq_tiered_store_unverified_queues",
                            "tier queues whose committed data the tier's listing or last "
                            "record did not confirm (their local files are kept)",
                            up.coverage.unverified_queues)
            yield self._one(gauge, "stratamq_tiered_store_failing",
                            "1 while the tier's uploads fail (backing off), else 0",
                            1 if up.health.failures else 0)
        if tier.group is not None:
            yield self._one(counter, "stratamq_tiered_store_metadata_fenced",
                            "writes of the group's tier metadata refused: a master of a later "
                            "epoch had written it", tier.group.fenced)
        yield self._one(counter, "rocketmq_tiered_store_messages_out",
                        "messages the tier served", tier.fetcher.served)
        yield self._one(counter, "stratamq_tiered_store_corrupt_records",
                        "tier records found corrupt by reads (never served)",
                        tier.fetcher.damage.corrupt_records)
        yield self._one(counter, "stratamq_tiered_store_missing_messages",
                        "queue offsets found lost from the tier by reads",
                        tier.fetcher.damage.missing_messages)
        yield self._one(gauge, "rocketmq_tiered_store_read_ahead_cache_count",
                        "messages in the read-ahead cache", len(cache))
        yield self._one(gauge, "rocketmq_tiered_store_read_ahead_cache_bytes",
                        "bytes in the read-ahead cache", cache.bytes)
        yield self._one(counter, "rocketmq_tiered_store_read_ahead_cache_access",
                        "read-ahead cache lookups", cache.accesses)
        yield self._one(counter, "rocketmq_tiered_store_read_ahead_cache_hit",
                        "read-ahead cache hits", cache.hits)
