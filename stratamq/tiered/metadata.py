"""The tier's metadata store: topics, queues, file segments and the uploader's progress.

RocketMQ's ``DefaultMetadataStore``: one JSON document at
``<storePathRootDir>/config/tieredStoreMetadata.json`` with its table names, plus what StrataMQ
adds (the uploader's durable CommitLog offset, each queue's indexed offset). Spec:
``docs/formats/tier-metadata.md``.

Durability: ``persist()`` replaces the file atomically (``fileutil.atomic_write``: fsync, rename,
fsync the directory), keeping the previous version as ``.bak``; a crash leaves the old document
or the new one. It may lag what the tier holds (sizes are then corrected from the tier on the
next start), never run ahead of it: a segment is recorded before anything is written to it,
and sizes only after their upload returned.

The ``.bak`` is the last good version: a document that lacks queues the ``.bak`` has (other
than those deleted on purpose, ``queuesDeletedSinceBackup``) never replaces it (the file alone
is written). A missing file next to a ``.bak`` is refused (``MetadataMissing``): starting
empty would serve a fraction of the history and, two saves later, overwrite the ``.bak``;
``TieredStore`` refuses a missing file too when the tier holds the broker's files.

Thread-safety: every method takes the store's lock; entities handed out are copies' owners'
to change only through ``update_*`` (callers keep their own objects and write them back).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stratamq.fileutil import atomic_write
from stratamq.tiered.naming import METADATA_FILE, FileSegmentType

__all__ = ["FileSegmentMetadata", "MetadataCorrupt", "MetadataMissing", "MetadataStore",
           "QueueMetadata", "TopicMetadata"]

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
# FileSegmentMetadata.status (RocketMQ's constants)
STATUS_NEW = 0
STATUS_SEALED = 1
STATUS_DELETED = 2
_TABLES = {FileSegmentType.COMMIT_LOG: "commitLogFileSegmentTable",
           FileSegmentType.CONSUME_QUEUE: "consumeQueueFileSegmentTable",
           FileSegmentType.INDEX: "indexFileSegmentTable"}


class MetadataCorrupt(ValueError):
    """The metadata file exists but is not a document this version can read."""


class MetadataMissing(MetadataCorrupt):
    """The metadata file is gone while what it described is still there (its ``.bak``, or
    the tier's files): starting without it would lose that history quietly."""


def _now() -> int:
    return int(time.time() * 1000)


@dataclass
class TopicMetadata:
    topicId: int
    topic: str
    status: int = 0
    reserveTime: int = -1  # hours; -1: tieredStoreFileReservedTime
    updateTimestamp: int = field(default_factory=_now)


@dataclass
class QueueMetadata:
    topic: str
    brokerName: str
    queueId: int
    minOffset: int = -1
    maxOffset: int = -1  # the queue offset after the last unit the tier committed
    updateTimestamp: int = field(default_factory=_now)
    # StrataMQ: queue offset below which every committed message is in the tier index.
    indexedOffset: int = -1

    def to_json(self) -> dict[str, Any]:
        return {"queue": {"topic": self.topic, "brokerName": self.brokerName,
                          "queueId": self.queueId},
                "minOffset": self.minOffset, "maxOffset": self.maxOffset,
                "updateTimestamp": self.updateTimestamp, "indexedOffset": self.indexedOffset}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> QueueMetadata:
        queue = obj["queue"]
        return cls(str(queue["topic"]), str(queue["brokerName"]), int(queue["queueId"]),
                   int(obj["minOffset"]), int(obj["maxOffset"]), int(obj["updateTimestamp"]),
                   int(obj.get("indexedOffset", -1)))


@dataclass
class FileSegmentMetadata:
    path: str  # the queue's key: broker/topic/queueId
    type: int  # FileSegmentType code
    baseOffset: int
    status: int = STATUS_NEW
    size: int = 0  # bytes committed (known to be in the tier)
    createTimestamp: int = field(default_factory=_now)
    beginTimestamp: int = 2**63 - 1  # store time of its oldest message (Long.MAX_VALUE: none)
    endTimestamp: int = 2**63 - 1
    sealTimestamp: int = 0
    # StrataMQ's: on an object store, where each upload (part object) of the committed bytes
    # starts, so a reader needs no listing; null when unknown or too many (then it lists).
    parts: list[int] | None = None


def _segment(obj: dict[str, Any]) -> FileSegmentMetadata:
    """One segment's entry, its fields checked here (a damaged document must stop the load
    with its name, not fail later in a read as a bare TypeError)."""
    meta = FileSegmentMetadata(**obj)
    for name in ("type", "baseOffset", "status", "size", "createTimestamp", "beginTimestamp",
                 "endTimestamp", "sealTimestamp"):
        if type(getattr(meta, name)) is not int:
            raise ValueError(f"segment {meta.path!r} at {meta.baseOffset!r}: {name} is not an "
                             "integer")
    parts = meta.parts
    if parts is not None and not (
            isinstance(parts, list) and all(type(p) is int and p >= 0 for p in parts)
            and parts == sorted(set(parts))):
        raise ValueError(f"segment {meta.path!r} at {meta.baseOffset}: parts must be ascending "
                         f"byte positions, not {parts!r}")
    return meta


def _queues_in(path: Path) -> set[tuple[str, int]]:
    """(topic, queue id) of every queue a metadata document records (empty when it is missing
    or unreadable: then there is nothing to keep it for)."""
    try:
        table = json.loads(path.read_bytes())["queueMetadataTable"]
        return {(t, int(q)) for t, queues in table.items() for q in queues}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return set()


class MetadataStore:
    """The tables, in memory, persisted on demand. ``root`` is the store directory."""

    def __init__(self, root: Path, *, read_only: bool = False) -> None:
        self.path = Path(root) / METADATA_FILE
        self.read_only = read_only
        self._lock = threading.RLock()
        self._persist_lock = threading.Lock()  # one writer of the file (and its .tmp) at a time
        self._tickets = 0  # persist calls made
        self._written_from = 0  # the last write covers every call with a lower ticket
        self._topic_serial = -1
        self._topics: dict[str, TopicMetadata] = {}
        self._queues: dict[str, dict[int, QueueMetadata]] = {}
        self._segments: dict[FileSegmentType, dict[str, dict[int, FileSegmentMetadata]]] = {
            t: {} for t in FileSegmentType}
        self.durable_offset = 0  # the uploader's: CommitLog offset everything below is tiered
        # Controller mode: the cluster epoch of the master that writes the document (0: a
        # standalone broker), and where each write is published for the group
        # (``group_metadata.py``): called with the document after it is on disk.
        self.writer_epoch = 0
        self.writer_broker_id = -1  # (with writer_epoch) the brokerId of that master
        self.on_persist: Callable[[bytes, int], None] | None = None
        self._dirty = False  # changed: the next ``persist(only_if_dirty=True)`` writes it
        # Changed, but only in what a start reads back from the tier anyway (an uploaded
        # file's size): written by the next write, or ``persist(deferred_too=True)``.
        self._deferred = False
        self.found = False  # the file existed when loaded
        # Queues of the document on disk and of its .bak (the .bak rule, see the docstring),
        # and the queues this process deleted since the .bak was written.
        self._file_queues: set[tuple[str, int]] = set()
        self._bak_queues: set[tuple[str, int]] = set()
        self._deleted_queues: set[tuple[str, int]] = set()
        # Queues deleted between the .bak's write and the file's (its "queuesDeletedSince-
        # Backup"): the file lacks them on purpose.
        self._deleted_before_file: set[tuple[str, int]] = set()
        self._kept_bak_logged = False
        self._load()

    # -- load / persist --------------------------------------------------------------------------

    @property
    def backup_path(self) -> Path:
        return self.path.with_name(self.path.name + ".bak")

    def _load(self) -> None:
        backup = self.backup_path
        raw: bytes | None
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            raw = self._finish_interrupted_write()
        if raw is None:
            if backup.exists():
                raise MetadataMissing(
                    f"tier metadata {self.path} is missing but its previous version {backup} "
                    "is there: the tier's history would be served in part and the backup "
                    "overwritten. Copy the backup over the file (the start takes the last "
                    "files' sizes from the tier), or move both away deliberately")
            return
        self.found = True
        try:
            doc = json.loads(raw)
            self._decode(doc)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise MetadataCorrupt(
                f"tier metadata {self.path} is damaged ({exc}); its previous version is "
                f"{backup} (copy it over the file to go back to it)") from None
        self._file_queues = self._queue_keys()
        self._bak_queues = _queues_in(backup)

    def _finish_interrupted_write(self) -> bytes | None:
        """A crash between ``atomic_write``'s two renames leaves the old document as the .bak
        and the new one, whole (synced before the renames), as the .tmp: finish the rename."""
        tmp = self.path.with_name(self.path.name + ".tmp")
        if self.read_only or not self.backup_path.exists():
            return None
        try:
            raw = tmp.read_bytes()
            json.loads(raw)
        except (OSError, ValueError):
            return None
        os.replace(tmp, self.path)
        log.warning("tier metadata %s: finished a write a stop interrupted (from %s)", self.path,
                    tmp)
        return raw

    def _queue_keys(self) -> set[tuple[str, int]]:
        with self._lock:
            return {(t, q) for t, table in self._queues.items() for q in table}

    def _decode(self, doc: dict[str, Any]) -> None:
        version = doc.get("version", FORMAT_VERSION)
        if version != FORMAT_VERSION:
            raise ValueError(f"format version {version}, this StrataMQ reads {FORMAT_VERSION}")
        self._topic_serial = int(doc["topicSerialNumber"])
        self._topics = {name: TopicMetadata(**obj)
                        for name, obj in doc["topicMetadataTable"].items()}
        self._queues = {topic: {int(q): QueueMetadata.from_json(obj) for q, obj in table.items()}
                        for topic, table in doc["queueMetadataTable"].items()}
        for file_type, table_name in _TABLES.items():
            self._segments[file_type] = {
                path: {int(base): _segment(obj) for base, obj in table.items()}
                for path, table in doc.get(table_name, {}).items()}
        self.durable_offset = int(doc.get("dispatcher", {}).get("durableOffset", 0))
        self.writer_epoch = int(doc.get("writerEpoch", 0))
        self.writer_broker_id = int(doc.get("writerBrokerId", -1))
        self._deleted_before_file = {(str(t), int(q))
                                     for t, q in doc.get("queuesDeletedSinceBackup", [])}

    def encode(self, *, deleted_since_backup: set[tuple[str, int]] | None = None) -> bytes:
        """The document; ``deleted_since_backup``: queues deleted on purpose since the .bak
        this file will sit next to was written (``persist`` passes them)."""
        # Shallow copies of the entities' fields (``vars``: the same keys, in field order, as
        # ``dataclasses.asdict``, which deep-copies field by field at several times the cost;
        # a document holds every segment of every queue and is written after each upload).
        # Their values are numbers and strings, and ``parts`` lists are replaced, never
        # changed in place, so the copies stay consistent after the lock is released.
        with self._lock:
            doc: dict[str, Any] = {
                "version": FORMAT_VERSION,
                "topicSerialNumber": self._topic_serial,
                "topicMetadataTable": {n: dict(vars(t)) for n, t in sorted(self._topics.items())},
                "queueMetadataTable": {
                    topic: {str(q): m.to_json() for q, m in sorted(table.items())}
                    for topic, table in sorted(self._queues.items())},
            }
            for file_type, table_name in _TABLES.items():
                doc[table_name] = {
                    path: {str(base): dict(vars(m)) for base, m in sorted(table.items())}
                    for path, table in sorted(self._segments[file_type].items())}
            doc["dispatcher"] = {"durableOffset": self.durable_offset}
            if self.writer_epoch:
                doc["writerEpoch"] = self.writer_epoch
                doc["writerBrokerId"] = self.writer_broker_id
            if deleted_since_backup:
                doc["queuesDeletedSinceBackup"] = sorted([t, q] for t, q in deleted_since_backup)
            self._dirty = self._deferred = False
        return json.dumps(doc, separators=(",", ":")).encode("utf-8")

    def persist(self, *, only_if_dirty: bool = False, deferred_too: bool = False) -> None:
        """Write the document (``only_if_dirty``: only when something changed that is not
        deferred, or with ``deferred_too`` anything). Calls that wait while another thread
        writes are served by the next write that starts after they were made (one write for
        many: each costs fsyncs), and return once it is on disk."""
        if self.read_only or (only_if_dirty and not self.changed(deferred_too=deferred_too)):
            return
        with self._lock:
            ticket = self._tickets
            self._tickets += 1
        with self._persist_lock:
            if self._written_from > ticket:
                return  # a write that began after this call was made wrote what it had
            # The file on disk becomes the .bak only if it lost no queue the .bak has, but
            # those deleted on purpose between the two writes: the .bak stays the last good
            # version. Each document carries the deletions made since the .bak it will sit
            # next to was written, so the rule holds across a restart too.
            exists = self.path.exists()
            with self._lock:
                starts_at = self._tickets  # every call with a lower ticket is covered
                since = set(self._deleted_queues)  # deleted since the last write
                lost = self._bak_queues - self._file_queues - self._deleted_before_file
                rotate = exists and not lost
                carried = since if rotate else self._deleted_before_file | since
                data = self.encode(deleted_since_backup=carried)
                written = self._queue_keys()
            if lost and exists and not self._kept_bak_logged:
                log.error("tier metadata %s lacks %d queues its backup %s has (e.g. %s/%d): the "
                          "backup is kept, not replaced", self.path, len(lost), self.backup_path,
                          *sorted(lost)[0])
                self._kept_bak_logged = True
            atomic_write(self.path, data, backup=rotate)
            with self._lock:
                self._deleted_queues -= since
            if rotate:
                self._bak_queues = self._file_queues
            self._deleted_before_file = carried
            self._file_queues = written
            self._written_from = starts_at
            publish = self.on_persist
            if publish is not None:
                publish(data, self.writer_epoch)

    def take_over(self, raw: bytes, epoch: int, broker_id: int) -> None:
        """Replace the tables with the document ``raw`` (the group's, written by an earlier
        master: ``group_metadata.py``) and write it here at ``epoch``: this broker's uploader
        continues from it. MetadataCorrupt when it does not parse."""
        try:
            doc = json.loads(raw)
            with self._lock:
                self._segments = {t: {} for t in FileSegmentType}
                self._decode(doc)
                self._deleted_before_file = set()
                self._deleted_queues = set()
                self._bak_queues = set()  # this broker's own document becomes the .bak
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise MetadataCorrupt(f"the group's tier metadata is damaged ({exc})") from None
        self.writer_epoch, self.writer_broker_id = epoch, broker_id
        self.found = True
        self._dirty = True
        self.persist()

    def changed(self, *, deferred_too: bool = False) -> bool:
        """Whether ``persist(only_if_dirty=True, deferred_too=...)`` would write."""
        return self._dirty or (deferred_too and self._deferred)

    def mark_dirty(self) -> None:
        self._dirty = True

    # -- topics ----------------------------------------------------------------------------------

    def get_topic(self, topic: str) -> TopicMetadata | None:
        with self._lock:
            return self._topics.get(topic)

    def add_topic(self, topic: str, reserve_time: int = -1) -> TopicMetadata:
        with self._lock:
            old = self._topics.get(topic)
            if old is not None:
                return old
            self._topic_serial += 1
            meta = TopicMetadata(self._topic_serial, topic, reserveTime=reserve_time)
            self._topics[topic] = meta
            self._dirty = True
            return meta

    def topic_by_id(self, topic_id: int) -> TopicMetadata | None:
        with self._lock:
            return next((t for t in self._topics.values() if t.topicId == topic_id), None)

    def topics(self) -> list[TopicMetadata]:
        with self._lock:
            return list(self._topics.values())

    def delete_topic(self, topic: str) -> None:
        with self._lock:
            self._topics.pop(topic, None)
            for queue_id in self._queues.pop(topic, {}):
                self._deleted_queues.add((topic, queue_id))
            self._dirty = True

    # -- queues ----------------------------------------------------------------------------------

    def get_queue(self, topic: str, queue_id: int) -> QueueMetadata | None:
        with self._lock:
            return self._queues.get(topic, {}).get(queue_id)

    def add_queue(self, topic: str, broker: str, queue_id: int) -> QueueMetadata:
        with self._lock:
            old = self.get_queue(topic, queue_id)
            if old is not None:
                return old
            meta = QueueMetadata(topic, broker, queue_id)
            self._queues.setdefault(topic, {})[queue_id] = meta
            self._dirty = True
            return meta

    def update_queue(self, meta: QueueMetadata) -> None:
        with self._lock:
            meta.updateTimestamp = _now()
            self._queues.setdefault(meta.topic, {})[meta.queueId] = meta
            self._dirty = True

    def queues(self, topic: str | None = None) -> Iterator[QueueMetadata]:
        with self._lock:
            tables = [self._queues.get(topic, {})] if topic is not None else \
                list(self._queues.values())
            found = [m for table in tables for m in table.values()]
        yield from found

    def delete_queue(self, topic: str, queue_id: int) -> None:
        with self._lock:
            if self._queues.get(topic, {}).pop(queue_id, None) is not None:
                self._deleted_queues.add((topic, queue_id))
            self._dirty = True

    # -- file segments ---------------------------------------------------------------------------

    def get_segment(self, path: str, file_type: FileSegmentType,
                    base_offset: int) -> FileSegmentMetadata | None:
        with self._lock:
            return self._segments[file_type].get(path, {}).get(base_offset)

    def update_segment(self, meta: FileSegmentMetadata, *, defer: bool = False) -> None:
        """Record a segment's entry. ``defer``: the change is only a size a start takes from
        the tier anyway (the last segment of its file, after an upload), so it needs no write
        of its own: it goes with the next one (the document may lag the tier, never lead)."""
        with self._lock:
            self._segments[FileSegmentType(meta.type)].setdefault(meta.path, {})[
                meta.baseOffset] = meta
            if defer:
                self._deferred = True
            else:
                self._dirty = True

    def segments(self, path: str, file_type: FileSegmentType) -> list[FileSegmentMetadata]:
        with self._lock:
            return sorted(self._segments[file_type].get(path, {}).values(),
                          key=lambda m: m.baseOffset)

    def delete_segment(self, path: str, file_type: FileSegmentType, base_offset: int) -> None:
        with self._lock:
            table = self._segments[file_type].get(path)
            if table is not None:
                table.pop(base_offset, None)
                if not table:
                    del self._segments[file_type][path]
            self._dirty = True
