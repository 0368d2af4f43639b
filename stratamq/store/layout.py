"""Where every file of a store directory lives and how segment files are named.

The directory is RocketMQ's, so either system can open the other's store::

    <root>/commitlog/<20-digit start offset>          CommitLog segments
    <root>/consumequeue/<topic>/<queueId>/<20-digit>  ConsumeQueue files (name = byte offset)
    <root>/index/<yyyyMMddHHmmssSSS>                  index files (issue 3)
    <root>/checkpoint                                 flush timestamps (docs/formats/checkpoint.md)
    <root>/abort                                      present while a store is open: a crash marker
    <root>/lock                                       held with flock by the process that owns it
"""

from __future__ import annotations

import errno
from pathlib import Path

SEGMENT_NAME_DIGITS = 20


def segment_name(start_offset: int) -> str:
    return f"{start_offset:0{SEGMENT_NAME_DIGITS}d}"


def parse_segment_name(name: str) -> int | None:
    """The start offset a segment file name encodes, or None if it is not a segment name."""
    if len(name) != SEGMENT_NAME_DIGITS or not name.isdigit():
        return None
    return int(name)


class StoreLayout:
    """Paths of one store directory."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    @property
    def commitlog_dir(self) -> Path:
        return self.root / "commitlog"

    @property
    def consumequeue_dir(self) -> Path:
        return self.root / "consumequeue"

    def consume_queue_dir(self, topic: str, queue_id: int) -> Path:
        # A topic is one directory name: never a path out of consumequeue/ (records written
        # before puts checked topic names may still carry one).
        if not topic or "/" in topic or "\0" in topic or topic in (".", ".."):
            raise OSError(errno.EINVAL, f"topic {topic[:80]!r} is not a directory name")
        return self.consumequeue_dir / topic / str(queue_id)

    @property
    def index_dir(self) -> Path:
        return self.root / "index"

    @property
    def checkpoint(self) -> Path:
        return self.root / "checkpoint"

    @property
    def abort(self) -> Path:
        return self.root / "abort"

    @property
    def lock(self) -> Path:
        return self.root / "lock"

    @property
    def deleted_topics(self) -> Path:
        return self.root / "config" / "deletedTopics.json"
