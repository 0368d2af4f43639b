"""The tier index's feed: keys of each uploaded batch into the tier index, what a crash left
unindexed, and sealed index files up to the tier (RocketMQ's ``IndexStoreService`` as the
tier dispatcher drives it). Used by ``TierUploader`` on its upload threads.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from stratamq.store_config import StoreConfig
from stratamq.tiered.batch import Batch, index_keys, store_times
from stratamq.tiered.flat_message_file import FlatMessageFile
from stratamq.tiered.health import TierHealth
from stratamq.tiered.index_service import IndexStoreService
from stratamq.tiered.metadata import MetadataStore

__all__ = ["TierIndexFeed"]


class TierIndexFeed:
    """See the module docstring. ``index`` None: the tier has no index (nothing to feed)."""

    def __init__(self, config: StoreConfig, index: IndexStoreService | None,
                 metadata: MetadataStore, health: TierHealth) -> None:
        self.config = config
        self.index = index
        self.metadata = metadata
        self.health = health

    def add(self, flat: FlatMessageFile, batch: Batch, flat_offsets: np.ndarray) -> None:
        """Keys of an uploaded batch into the tier index (after the upload: an index item
        always points at data in the tier)."""
        if self.index is None or not self.config.message_index_enable:
            return
        keys, rows = index_keys(batch)
        self.index.put_keys(flat.topic, flat.topic_id, flat.queue_id, keys, rows, flat_offsets,
                            batch.sizes, store_times(batch))
        meta = flat.queue_meta
        if meta is not None:
            meta.indexedOffset = batch.first + len(batch)
            self.metadata.update_queue(meta)

    def catch_up(self, flat: FlatMessageFile) -> None:
        """Index what the tier committed after the last durable index write (a crash between
        an upload and the next metadata write)."""
        meta = flat.queue_meta
        if self.index is None or meta is None or not self.config.message_index_enable:
            return
        start = max(meta.indexedOffset, flat.min_offset())
        end = flat.commit_offset
        while 0 <= start < end:
            records = flat.records(start, min(end - start, 1024), 16 * 1024 * 1024)
            if not records:
                break
            self.add(flat, Batch.of(records[0].queue_offset, [bytes(r.data) for r in records],
                                    [r.tags_code for r in records]),
                     np.array([r.flat_offset for r in records], dtype=np.int64))
            start = records[-1].queue_offset + 1
        if meta.indexedOffset < end:
            meta.indexedOffset = end
            self.metadata.update_queue(meta)

    def upload_sealed(self, persist: Callable[..., None]) -> bool:
        """Upload the sealed index files (not while the tier backs off); False when one
        failed (it stays local, retried later)."""
        assert self.index is not None
        while len(self.index.unsealed) > 1:
            if not self.health.ready():
                return False
            try:
                if not self.index.upload_sealed(persist):
                    return True  # none left (another caller took the last)
            except OSError as exc:
                self.health.failed("index upload", exc)
                return False
            self.health.succeeded()
        return True
