"""The compaction tier manifest: which compacted files the tier holds for each compaction queue
of one broker. Spec: ``docs/formats/compaction-tier.md``.

One JSON document per broker, ``<cluster dir>/<broker>/config/compactionTier.json`` in the
tier, replaced whole (POSIX: temporary file renamed over it; object stores: one put, which
lands whole or not at all). Its presence with a queue's file list is the tier's commit point:
files are uploaded first, under a directory no manifest names yet, and only then named here.

Reading checks every field and raises :class:`TierManifestError` naming the field; nothing is
guessed. Pure: no I/O.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

from stratamq.compaction.state_format import QueueState, StateError
from stratamq.store.layout import parse_segment_name

__all__ = ["MANIFEST_NAME", "QueueEntry", "TierFile", "TierManifest", "TierManifestError"]

MANIFEST_NAME = "compactionTier.json"
VERSION = 1


class TierManifestError(ValueError):
    """A compaction tier manifest that cannot be trusted (the message names the field)."""


def _int(where: str, data: dict[str, Any], key: str, low: int = 0) -> int:
    value = data.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise TierManifestError(f"{where}: {key!r} must be an integer >= {low}, not {value!r}")
    return value


@dataclass(frozen=True)
class TierFile:
    """One compacted file in the tier: a CompactionLog file's records (``log_bytes``, no blank
    filler) and its batch ConsumeQueue's units (``units`` x 64 bytes, no end unit), uploaded
    under generation directory ``generation``. ``name`` is the local file name (its start in
    the queue's CompactionLog address space); ``crc`` the zlib CRC-32 of the log bytes then the
    unit bytes, which tells a local file the tier holds from one it does not."""

    name: str
    generation: int
    units: int
    first_offset: int
    last_offset: int
    log_bytes: int
    crc: int
    first_timestamp: int = 0
    last_timestamp: int = 0

    @property
    def start(self) -> int:
        return int(self.name)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "generation": self.generation, "units": self.units,
                "firstOffset": self.first_offset, "lastOffset": self.last_offset,
                "logBytes": self.log_bytes, "crc": self.crc,
                "firstTimestamp": self.first_timestamp, "lastTimestamp": self.last_timestamp}

    @classmethod
    def from_json(cls, where: str, data: Any) -> TierFile:
        if not isinstance(data, dict):
            raise TierManifestError(f"{where}: a file must be an object")
        name = data.get("name")
        if not isinstance(name, str) or parse_segment_name(name) is None:
            raise TierManifestError(f"{where}: 'name' must be a 20-digit file name")
        units = _int(where, data, "units", 1)
        first, last = _int(where, data, "firstOffset"), _int(where, data, "lastOffset")
        if last < first:
            raise TierManifestError(f"{where}: lastOffset {last} < firstOffset {first}")
        return cls(name, _int(where, data, "generation", 1), units, first, last,
                   _int(where, data, "logBytes", 1), _int(where, data, "crc"),
                   _int(where, data, "firstTimestamp"), _int(where, data, "lastTimestamp"))


@dataclass(frozen=True)
class QueueEntry:
    """What the tier holds of one compaction queue: its compacted files in start order, the
    queue's next offset and its compaction state when they were uploaded (a broker that has no
    local copy resumes from them)."""

    topic: str
    queue_id: int
    next_offset: int
    files: tuple[TierFile, ...]
    state: QueueState = field(default_factory=QueueState)

    def to_json(self) -> dict[str, Any]:
        return {"topic": self.topic, "queueId": self.queue_id, "nextOffset": self.next_offset,
                "files": [f.to_json() for f in self.files], "state": self.state.to_json()}

    @classmethod
    def from_json(cls, where: str, data: Any) -> QueueEntry:
        if not isinstance(data, dict):
            raise TierManifestError(f"{where}: a queue must be an object")
        topic = data.get("topic")
        if not isinstance(topic, str) or not topic:
            raise TierManifestError(f"{where}: 'topic' must be a topic name")
        files_raw = data.get("files")
        if not isinstance(files_raw, list):
            raise TierManifestError(f"{where}: 'files' must be a list")
        files = tuple(TierFile.from_json(f"{where} file {i}", f) for i, f in enumerate(files_raw))
        for a, b in zip(files, files[1:]):
            if b.start <= a.start or b.first_offset <= a.last_offset:
                raise TierManifestError(f"{where}: files {a.name} and {b.name} are out of order")
        state_raw = data.get("state", {})
        if not isinstance(state_raw, dict):
            raise TierManifestError(f"{where}: 'state' must be an object")
        try:
            state = QueueState.from_json(where, state_raw)  # type: ignore[arg-type]
        except StateError as exc:
            raise TierManifestError(str(exc)) from None
        next_offset = _int(where, data, "nextOffset")
        if files and next_offset <= files[-1].last_offset:
            raise TierManifestError(f"{where}: nextOffset {next_offset} is not past the last "
                                    "file's last offset")
        return cls(topic, _int(where, data, "queueId"), next_offset, files, state)


@dataclass(frozen=True)
class TierManifest:
    """The whole document: ``generation`` grows by one with every write (new files go under a
    directory named by the generation that first names them)."""

    generation: int = 0
    queues: dict[tuple[str, int], QueueEntry] = field(default_factory=dict)

    def with_queue(self, entry: QueueEntry) -> TierManifest:
        return replace(self, generation=self.generation + 1,
                       queues={**self.queues, (entry.topic, entry.queue_id): entry})

    def without_topic(self, topic: str) -> TierManifest:
        return replace(self, generation=self.generation + 1,
                       queues={k: v for k, v in self.queues.items() if k[0] != topic})

    def to_bytes(self) -> bytes:
        return json.dumps({"version": VERSION, "generation": self.generation,
                           "queues": [q.to_json() for _, q in sorted(self.queues.items())]},
                          sort_keys=True).encode()

    @classmethod
    def parse(cls, where: str, raw: bytes) -> TierManifest:
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise TierManifestError(f"{where} is not JSON ({exc})") from None
        if not isinstance(data, dict) or data.get("version") != VERSION:
            raise TierManifestError(f"{where}: not a version {VERSION} compaction tier manifest")
        queues_raw = data.get("queues")
        if not isinstance(queues_raw, list):
            raise TierManifestError(f"{where}: 'queues' must be a list")
        queues = {}
        for i, raw_queue in enumerate(queues_raw):
            entry = QueueEntry.from_json(f"{where} queue {i}", raw_queue)
            queues[(entry.topic, entry.queue_id)] = entry
        return cls(_int(where, data, "generation"), queues)
