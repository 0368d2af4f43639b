"""Where compaction keeps its files under ``<root>/compaction/`` (RocketMQ's directory names).
Spec: ``docs/formats/compaction-log.md``::

    compaction/dispatch-checkpoint                         how far the CommitLog is split out
    compaction/position-checkpoint                         RocketMQ's (read by nobody here)
    compaction/compactionLog/<topic>/<queueId>/<20-digit>  CompactionLog files (record layout)
    compaction/compactionLog/<topic>/<queueId>/state.json  the queue's compaction progress
    compaction/compactionLog/<topic>/<queueId>/swap.json   a round's swap, while it is applied
    compaction/compactionLog/<topic>/<queueId>/compacting/ a round's new files
    compaction/compactionCq/<topic>/<queueId>/<20-digit>   batch ConsumeQueue files
    compaction/compactionCq/<topic>/<queueId>/compacting/  a round's new batch CQ files

A CompactionLog file and its batch ConsumeQueue file have the same name: the file's start
offset in the queue's CompactionLog address space. A file a swap replaces is first renamed
``<name>.deleted`` (RocketMQ's ``renameToDelete``). Every name is made here.
"""

from __future__ import annotations

import errno
from pathlib import Path

from stratamq.store.layout import StoreLayout, parse_segment_name, segment_name

__all__ = ["CompactionLayout", "QueuePaths", "segment_name", "parse_segment_name"]

COMPACTION_LOG_DIR = "compactionLog"
COMPACTION_CQ_DIR = "compactionCq"
COMPACTING_SUB_FOLDER = "compacting"
DELETED_SUFFIX = ".deleted"


class QueuePaths:
    """The paths of one compaction queue (topic, queue id)."""

    def __init__(self, base: Path, topic: str, queue_id: int) -> None:
        if not topic or "/" in topic or "\0" in topic or topic in (".", ".."):
            raise OSError(errno.EINVAL, f"topic {topic[:80]!r} is not a directory name")
        self.topic = topic
        self.queue_id = queue_id
        self.log_dir = base / COMPACTION_LOG_DIR / topic / str(queue_id)
        self.cq_dir = base / COMPACTION_CQ_DIR / topic / str(queue_id)
        self.state = self.log_dir / "state.json"
        self.manifest = self.log_dir / "swap.json"
        self.new_log_dir = self.log_dir / COMPACTING_SUB_FOLDER
        self.new_cq_dir = self.cq_dir / COMPACTING_SUB_FOLDER

    def log_file(self, start: int) -> Path:
        return self.log_dir / segment_name(start)

    def cq_file(self, start: int) -> Path:
        return self.cq_dir / segment_name(start)

    def new_log_file(self, start: int) -> Path:
        return self.new_log_dir / segment_name(start)

    def new_cq_file(self, start: int) -> Path:
        return self.new_cq_dir / segment_name(start)

    @staticmethod
    def deleted(path: Path) -> Path:
        return path.with_name(path.name + DELETED_SUFFIX)

    def segment_starts(self) -> tuple[list[int], list[int]]:
        """The start offsets of the log files and of the batch CQ files on disk, sorted."""
        return _starts(self.log_dir), _starts(self.cq_dir)


def _starts(directory: Path) -> list[int]:
    try:
        names = [p.name for p in directory.iterdir() if p.is_file()]
    except FileNotFoundError:
        return []
    return sorted(s for n in names if (s := parse_segment_name(n)) is not None)


class CompactionLayout:
    """``<root>/compaction/`` of one store."""

    def __init__(self, store: StoreLayout) -> None:
        self.base = store.compaction_dir
        self.dispatch_checkpoint = self.base / "dispatch-checkpoint"
        self.position_checkpoint = self.base / "position-checkpoint"  # RocketMQ's

    def queue(self, topic: str, queue_id: int) -> QueuePaths:
        return QueuePaths(self.base, topic, queue_id)

    def topic_dirs(self, topic: str) -> list[Path]:
        return [self.base / COMPACTION_LOG_DIR / topic, self.base / COMPACTION_CQ_DIR / topic]

    def queues_on_disk(self) -> list[tuple[str, int]]:
        """(topic, queue id) of every queue directory under compactionLog/."""
        found = []
        root = self.base / COMPACTION_LOG_DIR
        try:
            topics = sorted(p for p in root.iterdir() if p.is_dir())
        except FileNotFoundError:
            return []
        for topic_dir in topics:
            for queue_dir in sorted(topic_dir.iterdir()):
                if queue_dir.is_dir() and queue_dir.name.isdigit():
                    found.append((topic_dir.name, int(queue_dir.name)))
        return found
