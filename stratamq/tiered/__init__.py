"""Tiered storage: each queue's history on memory, a POSIX directory or an object store, read
back as if it were local (RocketMQ's tieredstore after RIP-57 / RIP-65; seed 000).

Three layers, as in RocketMQ: drivers (``drivers/``: ``FileSegment`` on memory, POSIX, fsspec
object stores), containers (``flat_file.py``, ``flat_message_file.py``, ``index_service.py``,
``metadata.py``) and access (``uploader.py``: a dispatcher; ``fetcher.py``: a read source).

The store never imports this package: ``wire(store, ...)`` plugs the uploader in with
``MessageStore.add_dispatcher`` and the fetcher with ``add_read_source`` before the store is
opened, and returns the ``TieredStore`` that owns them (close it after the store). Every place
that opens a store for serving calls it (the broker, the offline ``store`` commands).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from stratamq.config import StoreConfig, TieredStorageLevel, tier_provider
from stratamq.tiered.drivers import FileSegmentFactory, TierBucketMissing, TierIOError
from stratamq.tiered.fetcher import TierFetcher
from stratamq.tiered.flat_message_file import FlatFileStore, FlatMessageFile
from stratamq.tiered.index_service import IndexStoreService
from stratamq.tiered.metadata import MetadataCorrupt, MetadataMissing, MetadataStore
from stratamq.tiered.naming import cluster_dir
from stratamq.tiered.read_ahead import memory_limit
from stratamq.tiered.uploader import TierUploader, is_filtered_topic

if TYPE_CHECKING:
    from stratamq.store.message_store import MessageStore
    from stratamq.tiered.group_metadata import GroupTierMetadata

__all__ = ["FlatFileStore", "FlatMessageFile", "MetadataCorrupt", "MetadataMissing",
           "TierBucketMissing", "TierIOError", "TieredStore", "tiering_enabled", "wire"]

log = logging.getLogger(__name__)


def tiering_enabled(config: StoreConfig) -> bool:
    return tier_provider(config) is not None


class StoreView:
    """What the tier reads of the local store, as callables (never the store itself): its
    ConsumeQueues (units and offsets) and its CommitLog's bounds."""

    def __init__(self, consume_queues: Callable[[], Any], commitlog: Callable[[], Any],
                 in_memory_ratio: int) -> None:
        self._queues = consume_queues
        self._commitlog = commitlog
        self._memory_window = memory_limit() * in_memory_ratio // 100

    def offsets(self, topic: str, queue_id: int) -> tuple[int, int] | None:
        cq = self._queues().find(topic, queue_id)
        return None if cq is None else (cq.min_offset(), cq.max_offset())

    def units(self, topic: str, queue_id: int, offset: int,
              count: int) -> list[tuple[int, int, int]]:
        cq = self._queues().find(topic, queue_id)
        return [] if cq is None else list(cq.get_units(offset, count))

    def in_memory(self, topic: str, queue_id: int, offset: int) -> bool:
        """RocketMQ's ``checkInMemByConsumeOffset``: the record is within
        accessMessageInMemoryMaxRatio of memory from the CommitLog's end."""
        units = self.units(topic, queue_id, offset, 1)
        if not units:
            return False
        return self._commitlog().max_offset - units[0][0] < self._memory_window

    def min_physical_offset(self) -> int:
        return self._commitlog().min_offset

    def max_physical_offset(self) -> int:
        return self._commitlog().max_offset


class ConfirmedView:
    """The local queues as a controller-mode master's uploader sees them: only records below
    ``confirmed()``, the CommitLog offset below which the whole SyncStateSet holds every
    record, so the tier never holds what a failover may cut off (``TieredStore.take_over``)."""

    def __init__(self, view: StoreView, confirmed: Callable[[], int]) -> None:
        self.view = view
        self.confirmed = confirmed

    def units(self, topic: str, queue_id: int, offset: int,
              count: int) -> list[tuple[int, int, int]]:
        return self.view.units(topic, queue_id, offset, count)

    def offsets(self, topic: str, queue_id: int) -> tuple[int, int] | None:
        held = self.view.offsets(topic, queue_id)
        if held is None or held[1] <= held[0]:
            return held
        low, high = held
        confirmed = self.confirmed()

        def ends_past(offset: int) -> bool:  # (a blank unit counts as below)
            units = self.view.units(topic, queue_id, offset, 1)
            return bool(units) and units[0][1] > 0 and units[0][0] + units[0][1] > confirmed

        if not ends_past(high - 1):
            return held
        lo, hi = low, high - 1  # a queue's units ascend in CommitLog offset: bisect
        while lo < hi:
            mid = (lo + hi) // 2
            if ends_past(mid):
                hi = mid
            else:
                lo = mid + 1
        return low, lo


class TieredStore:
    """The tier parts of one broker: metadata, flat files, index, uploader and fetcher.

    ``read_only``: for commands that only read (no uploads, nothing written anywhere)."""

    def __init__(self, config: StoreConfig, cluster: str, broker: str, *,
                 view: StoreView | None = None, read_only: bool = False,
                 background: bool = True, fs: Any = None, exclusive_parts: bool = False
                 ) -> None:
        self.config = config
        self.cluster = cluster
        self.broker = broker
        self.read_only = read_only
        self.background = background
        self.factory = FileSegmentFactory(config, cluster, fs=fs)
        self.factory.exclusive_parts = exclusive_parts  # (before any segment is made)
        self.factory.check_bucket(create=not read_only and config.tiered_store_s3_create_bucket)
        if not read_only:
            self.factory.list_broker(broker)  # before this process writes anything there
        self.metadata = MetadataStore(config.root, read_only=read_only)
        if not self.metadata.found:
            self._refuse_without_metadata(broker)
        self.files = FlatFileStore(self.factory, self.metadata, broker, read_only=read_only)
        self.files.load()
        self.index: IndexStoreService | None = None
        if config.message_index_enable:
            self.index = IndexStoreService(
                config.root, self.factory, self.metadata, broker,
                config.tiered_store_index_file_max_hash_slot_num,
                config.tiered_store_index_file_max_index_num, read_only=read_only)
        self.uploader: TierUploader | None = None
        if not read_only:
            assert view is not None
            self.uploader = TierUploader(config, self.files, self.metadata, self.index, view)
        self.fetcher = TierFetcher(config, self.files, self.metadata, self.index, view)
        # Queues another part tiers in its own way (compaction topics: their compacted files,
        # ``compaction.tiering.link``): (topic, queue) -> the tier columns of its status row, or
        # None for a queue this tier's uploader handles.
        self.held_elsewhere: Callable[[str, int], dict[str, Any] | None] | None = None
        self._started = False
        # Controller mode: the group's copy of the metadata in the tier (``group_metadata``),
        # published after each write while this broker is its group's master.
        self.group: GroupTierMetadata | None = None
        self._master_epoch = 0  # of this broker's last mastership in this process
        self.view = view

    def _refuse_without_metadata(self, broker: str) -> None:
        """No metadata file, while the tier holds this broker's files: starting empty would
        serve a part of the history (what the local store still has) and upload over the rest.
        A tier that cannot be listed now is let through (a new broker's first start must not
        depend on the tier being up; its first upload lists the files it writes to)."""
        try:
            held = self.factory.topics_with_queue_files(broker)
        except TierIOError as exc:
            log.warning("tier metadata %s is missing and the tier could not be listed to check "
                        "that it holds nothing of %s: %s", self.metadata.path, broker, exc)
            return
        if held:
            where = self.factory.full_path(f"{cluster_dir(self.cluster)}/{broker}")
            raise MetadataMissing(
                f"tier metadata {self.metadata.path} is missing, but the tier holds files of "
                f"broker {broker} at {where} (topics {', '.join(held)}"
                f"{', ...' if len(held) >= 5 else ''}): without it the broker would serve part "
                "of that history and write over the rest. Restore the file (or copy its .bak "
                "over it), or move that tier directory away to start the tier afresh")

    def start(self) -> None:
        """Start the uploader's scheduler (the store must be open)."""
        if self.uploader is not None and not self._started and self.background:
            self.uploader.start()
            self._started = True

    def share_with_group(self, group: GroupTierMetadata | None) -> None:
        """Controller mode: the tier is the group's. Uploads wait until ``take_over`` (this
        broker elected), and every metadata write of a master is published to ``group``."""
        self.group = group
        if self.uploader is not None:
            self.uploader.paused = True
        self.metadata.on_persist = self._publish

    def _publish(self, raw: bytes, epoch: int) -> None:
        group = self.group
        if group is None or not epoch or epoch != self._master_epoch:
            return  # a slave's document is its own, never the group's
        # An old master's write (work it had begun before it stepped down, or woke from a
        # stop to finish) is tried: the tier's copy refuses it if a newer master wrote there.
        try:
            group.publish(raw, epoch)
        except OSError as exc:  # the next write publishes again; the local file is written
            group.last_error = str(exc)
            log.warning("tier metadata not published to the group's copy %s: %s", group.path,
                        exc)

    def take_over(self, epoch: int, broker_id: int, local_queues: dict[str, list[int]],
                  confirmed: Callable[[], int]) -> None:
        """This broker (``broker_id``) was elected its group's master at ``epoch``: continue
        uploading where the group's last master stopped. Its document replaces this broker's
        own unless this broker wrote that copy itself (same epoch and broker: its own
        document is as new or newer, the copy is published after it); then the document is
        written and published at ``epoch`` (claiming the tier: an older master's publishes
        are refused from now on), and every local queue resumes from the tier's committed
        offset, taking only records below ``confirmed()`` (what the SyncStateSet holds).
        OSError when the tier cannot be read: the caller retries."""
        uploader, group = self.uploader, self.group
        if uploader is None:
            return
        if group is not None:
            from stratamq.tiered.group_metadata import writer

            raw = group.read()
            mine = (self.metadata.writer_epoch, self.metadata.writer_broker_id)
            theirs = writer(raw) if raw is not None else (0, -1)
            if raw is not None and theirs[0] >= mine[0] and theirs != (mine[0], broker_id):
                log.info("tier: taking over the group's tier metadata written at epoch %d by "
                         "broker %d (this broker's: epoch %d, broker %d)", *theirs, *mine)
                self.files.close()
                self.metadata.take_over(raw, epoch, broker_id)
                self.files.load()
                if self.index is not None:
                    self.index.reload()
        self.metadata.writer_epoch = self._master_epoch = epoch
        self.metadata.writer_broker_id = broker_id
        self.metadata.mark_dirty()
        if self.view is not None:
            uploader.local = self.view  # every local record counted as waiting, then capped
        uploader.resume(local_queues)
        if self.view is not None:
            uploader.local = ConfirmedView(self.view, confirmed)
        uploader.paused = False
        self.metadata.persist()  # published: the claim

    def step_down(self) -> None:
        """No longer the group's master: no upload, no publish (what was not uploaded stays
        local; the next master uploads it from its own copy)."""
        if self.uploader is not None:
            self.uploader.paused = True

    def flush(self, timeout: float = 60.0) -> bool:
        """Upload everything dispatched so far, now (``stratamq tier flush``)."""
        if self.uploader is None:
            raise RuntimeError("a read-only tier cannot upload")
        return self.uploader.flush(timeout)

    def status(self, local: Callable[[str, int], tuple[int, int] | None],
               local_topics: Callable[[], dict[str, list[int]]] | None = None
               ) -> list[dict[str, Any]]:
        """One row per topic/queue the tier or the local store holds (topics that are never
        tiered left out): local and tier offsets, tier bytes, upload lag, what reads found
        damaged or missing in the tier (``read_damage.ReadDamage.status``), why the tier does
        not hold what was committed (``tier_unverified``, null when it does or was not
        checked), and the tier's ``lastError`` / ``lastErrorSince`` (``health``)."""
        health = self.health()
        # Queues the last verification found the tier not to hold as committed (their local
        # files are kept): why, else null.
        unverified = self.uploader.coverage.problems if self.uploader is not None else {}
        queues = {(f.topic, f.queue_id) for f in self.files.files()}
        if local_topics is not None:
            queues |= {(t, q) for t, ids in local_topics().items() for q in ids
                       if not is_filtered_topic(t)}
        rows = []
        for topic, queue_id in sorted(queues):
            other = self.held_elsewhere(topic, queue_id) if self.held_elsewhere else None
            if other is not None:
                held = local(topic, queue_id)
                rows.append({"topic": topic, "queue_id": queue_id,
                             "local_min_offset": None if held is None else held[0],
                             "local_max_offset": None if held is None else held[1], **other,
                             "tier_unverified": None, **health})
                continue
            flat = self.files.get(topic, queue_id)
            init = flat is not None and flat.is_init()
            held = local(topic, queue_id)
            lag_messages, lag_bytes = (self.uploader.lag(topic, queue_id)
                                       if self.uploader is not None else (0, 0))
            committed = flat.commit_offset if flat is not None and init else None
            if held is not None:
                lag_messages = max(lag_messages, held[1] - max(committed or 0, held[0]))
            rows.append({
                "topic": topic, "queue_id": queue_id,
                "local_min_offset": None if held is None else held[0],
                "local_max_offset": None if held is None else held[1],
                "tier_min_offset": flat.min_offset() if flat is not None and init else None,
                "tier_max_offset": flat.append_offset if flat is not None and init else None,
                "tier_committed_offset": committed,
                "tier_bytes": flat.committed_bytes() if flat is not None else 0,
                "lag_messages": lag_messages, "lag_bytes": lag_bytes,
                **self.fetcher.damage.status(topic, queue_id),
                "tier_unverified": unverified.get((topic, queue_id)), **health,
            })
        return rows

    def health(self) -> dict[str, Any]:
        """``lastError``: why the tier's last attempt failed, null while it works (and on a
        tier this process does not upload to); ``lastErrorSince``: epoch ms of the first
        failure in a row."""
        if self.uploader is None:
            return {"lastError": None, "lastErrorSince": None}
        return self.uploader.health.status()

    def close(self) -> None:
        """Stop uploading (what is not uploaded stays local and is uploaded after the next
        open) and save the metadata. Call after the store's close."""
        if self.uploader is not None:
            self.uploader.close()
        self.fetcher.close()
        if self.index is not None:
            self.index.close()
        self.files.close()


def wire(store: MessageStore, *, cluster: str, broker: str,
         background: bool = True, upload: bool = True, group: bool = False,
         fs: Any = None) -> TieredStore | None:
    """Plug tiered storage into ``store`` (before it is opened) when its config turns it on;
    None when it does not. Call ``start()`` on the result once the store is open: with
    ``background`` (a broker) that starts the uploads; offline commands pass False and upload
    only when asked (``tier flush``). ``upload=False`` (a SLAVE broker: the tier is its
    master's) plugs in the reads only: no uploader, nothing written to the tier. ``group``
    (controller mode): the tier is the broker group's; the uploader waits paused until the
    broker is elected (``TieredStore.take_over``), and a store without tier metadata starts
    from the group's copy in the tier (``group_metadata.py``). ``fs``: an
    fsspec filesystem to use for an ``s3`` tier (default: one opened from the config)."""
    config = store.config
    if tier_provider(config) is None:
        return None
    if not store.read_only and upload:
        # History an offload registered in the tier for this broker, for a store that has no
        # tier metadata yet (a new broker taking over a retired one's history).
        from stratamq.tiered.offloaded import adopt

        adopt(config, cluster, broker)
    shared = None
    if group and upload and not store.read_only:
        from stratamq.tiered.group_metadata import GroupTierMetadata, adopt_group

        if GroupTierMetadata.supported(config):
            shared = GroupTierMetadata(config, cluster, broker, fs=fs)
            adopt_group(shared, config.root)
    provider = tier_provider(config)
    if not store.read_only and provider != "memory":
        # So that offline commands find the tier without the broker's --config.
        from stratamq.tiered.location import TierLocation, record_location

        record_location(config.root, TierLocation(
            provider or "", config.tiered_store_file_path, config.tiered_store_s3_endpoint,
            cluster, broker))
    view = StoreView(lambda: store.consume_queues, lambda: store.commitlog,
                     config.access_message_in_memory_max_ratio)
    tier = TieredStore(config, cluster, broker, view=view,
                       read_only=store.read_only or not upload, background=background, fs=fs,
                       exclusive_parts=group)
    if tier.uploader is not None:
        store.add_dispatcher(tier.uploader)
        if group:
            tier.share_with_group(shared)
    if TieredStorageLevel(config.tiered_storage_level) is not TieredStorageLevel.DISABLE:
        store.add_read_source(tier.fetcher, first=tier.fetcher.first)
    log.info("tiered storage: %s, reads %s", tier.factory.describe(),
             TieredStorageLevel(config.tiered_storage_level).value)
    return tier
