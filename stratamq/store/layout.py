"""Where every file of a store directory lives and how segment files are named.

The directory is RocketMQ's, so either system can open the other's store::

    <root>/commitlog/<20-digit start offset>          CommitLog segments
    <root>/consumequeue/<topic>/<queueId>/<20-digit>  ConsumeQueue files (name = byte offset)
    <root>/index/<yyyyMMddHHmmssSSS>                  index files (issue 3)
    <root>/checkpoint                                 flush timestamps (docs/formats/checkpoint.md)
    <root>/abort                                      present while a store is open: a crash marker
    <root>/lock                                       held with flock by the process that owns it
    <root>/config/storeType                           which ConsumeQueue store the directory uses
    <root>/rocksdb/consumequeue/                      RocksDB ConsumeQueues
    <root>/config/topics.json, subscriptionGroup.json broker topics and groups
    <root>/config/deletedTopics.json                  where deleted topics' records end
    <root>/config/popState/                           broker in-flight and progress state
    <root>/timerdb/  <root>/timercheck                DELAY messages by delivery time
    <root>/epochFileCheckpoint                        replication epochs (storePathEpochFile)
    <root>/storeIdentity.json                         the store's id and its log's lineage
    <root>/damaged/<time>-<offset>/                   what a recovery cut set aside (salvage.py)
    <root>/compaction/                                compaction topics' logs (stratamq.compaction;
                                                      its layout.py names what is inside)

Every path under a store root is named here and nowhere else.
"""

from __future__ import annotations

import errno
from pathlib import Path

SEGMENT_NAME_DIGITS = 20
# Relative to the store root (also how messages name them).
CONSUMEQUEUE_DIR = Path("consumequeue")
STORE_TYPE_FILE = Path("config") / "storeType"
ROCKSDB_CQ_DIR = Path("rocksdb") / "consumequeue"


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
    def damaged_dir(self) -> Path:
        """CommitLog bytes a recovery cut set aside instead of deleting (``salvage.py``)."""
        return self.root / "damaged"

    @property
    def consumequeue_dir(self) -> Path:
        return self.root / CONSUMEQUEUE_DIR

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
    def epoch_file(self) -> Path:
        """Replication epochs (docs/formats/epoch-file.md); RocketMQ's default path."""
        return self.root / "epochFileCheckpoint"

    @property
    def identity(self) -> Path:
        """The store's id and its CommitLog's lineage (docs/formats/store-identity.md)."""
        return self.root / "storeIdentity.json"

    @property
    def deleted_topics(self) -> Path:
        return self.config_dir / "deletedTopics.json"

    @property
    def config_dir(self) -> Path:
        return self.root / "config"

    @property
    def store_type_file(self) -> Path:
        return self.root / STORE_TYPE_FILE

    @property
    def rocksdb_cq_dir(self) -> Path:
        return self.root / ROCKSDB_CQ_DIR

    @property
    def topics_file(self) -> Path:
        return self.config_dir / "topics.json"

    @property
    def groups_file(self) -> Path:
        return self.config_dir / "subscriptionGroup.json"

    @property
    def pop_state_dir(self) -> Path:
        return self.config_dir / "popState"

    @property
    def timer_db(self) -> Path:
        return self.root / "timerdb"

    @property
    def compaction_dir(self) -> Path:
        return self.root / "compaction"

    @property
    def timer_check(self) -> Path:
        return self.root / "timercheck"
