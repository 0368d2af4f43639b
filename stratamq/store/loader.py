"""Opening a store's parts: the steps of recovery that turn a directory into loaded parts.

``MessageStore.open`` runs them in order (docs/ARCHITECTURE.md, "Opening a store"); each is
handed what it reads and returns what it built, so a role (master, slave, read-only tool) is a
choice of which parts to start afterwards, not a different open.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from stratamq.config import StoreConfig
from stratamq.store.checkpoint import StoreCheckpoint
from stratamq.store.consume_queue_store import (
    STORE_TYPE_FILES,
    STORE_TYPE_ROCKSDB,
    ConsumeQueueStore,
    open_consume_queue_store,
    resolve_store_type,
    write_store_type,
)
from stratamq.store.dispatch import ReputService
from stratamq.store.index_service import IndexService
from stratamq.store.layout import StoreLayout
from stratamq.store.mapped_file_queue import MappedFileQueue
from stratamq.store.recovery import RecoveryReport

log = logging.getLogger(__name__)

__all__ = ["dispatch_start", "open_consume_queue_stores", "open_index", "reindex"]


def open_consume_queue_stores(cfg: StoreConfig, layout: StoreLayout, *, has_data: bool,
                              read_only: bool, force: bool, clean_shutdown: bool = False
                              ) -> tuple[str, list[ConsumeQueueStore]]:
    """Build and load the ConsumeQueue store(s) by ``storeType`` (and record the type): the
    primary first, then the other kind under ``rocksdbCQDoubleWriteEnable``.
    ``clean_shutdown``: the store was closed cleanly (no ``abort``), so a file store may take
    its queues' positions from the snapshot that close saved."""
    store_type = resolve_store_type(layout.root, cfg.store_type, has_data=has_data, force=force)
    types = [store_type]
    if cfg.rocksdb_cq_double_write_enable:
        types.append(STORE_TYPE_ROCKSDB if store_type == STORE_TYPE_FILES else STORE_TYPE_FILES)
    stores: list[ConsumeQueueStore] = []
    try:
        for kind in types:
            cq_store = open_consume_queue_store(kind, layout, cfg.cq_file_size,
                                                read_only=read_only)
            stores.append(cq_store)
            if hasattr(cq_store, "clean_shutdown"):
                cq_store.clean_shutdown = clean_shutdown
            cq_store.load()
    except BaseException:
        for cq_store in stores:  # RocksDB holds a lock of its own until closed
            cq_store.close()
        raise
    if not read_only:
        write_store_type(layout.root, store_type)
    return store_type, stores


def open_index(cfg: StoreConfig, layout: StoreLayout, checkpoint: StoreCheckpoint, *,
               abnormal: bool, read_only: bool) -> IndexService | None:
    if not cfg.message_index_enable:
        return None
    index = IndexService(layout.index_dir, cfg.max_hash_slot_num, cfg.max_index_num,
                         read_only=read_only)
    index.load(abnormal, checkpoint.index_msg_timestamp)
    return index


def reindex(index: IndexService | None, files: MappedFileQueue, commitlog_min: int,
            end: int | None = None) -> None:
    """Re-index, from the CommitLog, what the index files dropped on load held (up to ``end``,
    where dispatch stops: a controller-mode store's confirm offset; default the log's end)."""
    if index is None or index.replay_from is None:
        return
    start = max(index.replay_from, commitlog_min)
    count = ReputService(files, [index], start).replay(end)
    log.info("re-indexed %d records from offset %d", count, start)


def dispatch_start(cq_stores: Sequence[ConsumeQueueStore], plugged_progress: int | None,
                   commitlog_min: int, report: RecoveryReport) -> int:
    """Where the ConsumeQueues stop being known-complete: the least any store covers, and no
    later than where a plugged-in dispatcher's durable progress ends.

    A RocksDB store without WAL may have lost its newest batches in a crash; its checkpoint row
    says how far it got, which can be before the checkpoint's safe offset."""
    known = min(max(s.max_physic_offset(), commitlog_min) for s in cq_stores)
    if plugged_progress is not None:
        known = min(known, max(plugged_progress, commitlog_min))
    if report.abnormal:
        # Replay is idempotent: units already present are kept.
        return min(report.start_offset, known)
    return min(known, report.end_offset)
