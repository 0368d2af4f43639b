"""``StoreParts``: the parts of an open store, handed to tools that work on them (verify, the
read-only inspections of ``store dump``/``stat``/``query``) instead of the whole store."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from stratamq.config import StoreConfig
from stratamq.store.commitlog import CommitLog
from stratamq.store.consume_queue_store import ConsumeQueueStore
from stratamq.store.index_service import IndexService
from stratamq.store.layout import StoreLayout
from stratamq.store.recovery import RecoveryReport

__all__ = ["StoreParts"]


@dataclass(frozen=True)
class StoreParts:
    config: StoreConfig
    layout: StoreLayout
    read_only: bool
    commitlog: CommitLog
    cq_stores: list[ConsumeQueueStore]  # the primary first; two with double write
    index: IndexService | None
    recovery: RecoveryReport | None
    # Stops the store's dispatcher and clean-up so a repair runs alone and nothing is deleted
    # under a check (the store stays open for reads; closing it still flushes and checkpoints).
    quiesce: Callable[[], None]

    @property
    def consume_queues(self) -> ConsumeQueueStore:
        return self.cq_stores[0]
