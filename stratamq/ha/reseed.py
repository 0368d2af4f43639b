"""``stratamq ha reseed``: clear a stopped slave's CommitLog so it follows a master of another
lineage (``protocol.judge_lineage``) on its next start.

A slave never discards its log by itself for such a master (a wiped or replaced master store
would take every acknowledged message with it). This is the operator's explicit choice:
``plan`` says what goes (CommitLog bytes and offsets, messages per topic, from the store
opened read-only), ``apply`` removes the CommitLog and every file built from it (ConsumeQueues,
index, checkpoint, epochs, deleted-topic cutoffs, DELAY timer index, compaction logs) and marks
the log's lineage unknown, so the empty store takes its master's at the next connect. The topic
and group configuration and the consumer progress stay until the master's copy replaces them.
Both run with the store's lock held (``lock_store``): a running broker makes them refuse.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stratamq.config import StoreConfig
from stratamq.store.identity import StoreIdentity
from stratamq.store.layout import StoreLayout
from stratamq.store.message_store import MessageStore

__all__ = ["ReseedPlan", "apply", "plan"]


@dataclass
class ReseedPlan:
    """What a reseed of one store discards."""

    root: Path
    store_id: str | None
    lineage: str | None
    min_offset: int
    max_offset: int
    messages: int
    topics: dict[str, int] = field(default_factory=dict)  # topic -> messages held
    paths: list[Path] = field(default_factory=list)  # what is removed

    @property
    def commitlog_bytes(self) -> int:
        return self.max_offset - self.min_offset

    def as_dict(self) -> dict[str, Any]:
        return {"store": str(self.root), "storeId": self.store_id, "lineage": self.lineage,
                "commitlogBytes": self.commitlog_bytes, "minOffset": self.min_offset,
                "maxOffset": self.max_offset, "messages": self.messages,
                "topics": dict(sorted(self.topics.items())),
                "removes": [str(p.relative_to(self.root)) for p in self.paths]}

    def describe(self) -> str:
        lines = [f"store {self.root} (id {self.store_id}, lineage {self.lineage}): a reseed "
                 f"discards its CommitLog, {self.commitlog_bytes} bytes (offsets "
                 f"{self.min_offset}..{self.max_offset}) holding {self.messages} messages:"]
        lines += [f"  topic {topic}: {count} messages"
                  for topic, count in sorted(self.topics.items())]
        lines.append("and removes " + ", ".join(str(p.relative_to(self.root))
                                                for p in self.paths) + ".")
        lines.append("The topic and group configuration and consumer offsets stay until the "
                     "master's copy replaces them; on its next start the slave copies its "
                     "master's log from scratch.")
        return "\n".join(lines)


def _derived_paths(layout: StoreLayout) -> list[Path]:
    """The CommitLog and every file built from it, as far as they exist."""
    candidates = [layout.commitlog_dir, layout.consumequeue_dir, layout.rocksdb_cq_dir,
                  layout.index_dir, layout.checkpoint, layout.abort, layout.epoch_file,
                  layout.epoch_file.with_name(layout.epoch_file.name + ".bak"),
                  layout.deleted_topics, layout.timer_db, layout.timer_check,
                  layout.compaction_dir]
    return [p for p in candidates if p.exists()]


def plan(config: StoreConfig) -> ReseedPlan:
    """What a reseed of the (stopped, locked by the caller) store at ``config.root`` discards."""
    layout = StoreLayout(config.root)
    store = MessageStore(config, read_only=True).open()
    try:
        topics: dict[str, int] = {}
        cq = store.cq_stores[0]
        for topic, queue_ids in cq.topics().items():
            for queue_id in queue_ids:
                queue = cq.find(topic, queue_id)
                if queue is not None:
                    topics[topic] = topics.get(topic, 0) + max(
                        0, queue.max_offset() - queue.min_offset())
        identity = store.identity
        return ReseedPlan(layout.root, identity.store_id if identity else None,
                          identity.lineage if identity else None,
                          store.min_physical_offset, store.max_physical_offset,
                          sum(topics.values()), {t: n for t, n in topics.items() if n},
                          _derived_paths(layout))
    finally:
        store.close()


def apply(config: StoreConfig, what: ReseedPlan) -> None:
    """Remove what ``what`` lists and mark the lineage unknown (caller holds the lock)."""
    layout = StoreLayout(config.root)
    for path in what.paths:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    # An empty store takes its master's lineage at the next connect. Were this cut short
    # above, the old lineage stays: the slave still refuses that master (run it again).
    identity = StoreIdentity.open(layout.identity, has_data=False)
    assert identity is not None
    identity.set_lineage(None)
