"""Tier retention: tier files older than ``tieredStoreFileReservedTime`` (or their topic's own
reserve time) are deleted, independently of local retention; the tier index's files too.
"""

from __future__ import annotations

import logging

from stratamq.store_config import StoreConfig
from stratamq.tiered.flat_message_file import FlatFileStore
from stratamq.tiered.index_service import IndexStoreService
from stratamq.tiered.metadata import MetadataStore

__all__ = ["delete_expired_files"]

log = logging.getLogger(__name__)


def delete_expired_files(config: StoreConfig, files: FlatFileStore,
                         index: IndexStoreService | None, metadata: MetadataStore,
                         now: int) -> int:
    """Delete the tier files older than their reserve time at ``now`` (ms); how many went."""
    gone = 0
    for flat in files.files():
        hours = config.tiered_store_file_reserved_time
        if flat.topic_meta is not None and flat.topic_meta.reserveTime > 0:
            hours = flat.topic_meta.reserveTime
        try:
            gone += flat.destroy_expired(now - hours * 3_600_000)
        except OSError as exc:
            log.warning("tier queue %s: expired files not deleted: %s", flat.file_path, exc)
    if index is not None:
        hours = config.tiered_store_file_reserved_time
        gone += index.destroy_expired(now - hours * 3_600_000)
    if gone:
        log.info("tier retention: %d files older than their reserve time deleted", gone)
        metadata.persist()
    return gone
