"""The file ConsumeQueues' positions, saved at a clean shutdown so the next open need not read
every queue's files (docs/formats/consumequeue-snapshot.md).

A reopen of a store of many queues otherwise lists every queue directory and reads every
queue's newest file (ten thousand queues: a second or more of system time, much more on a busy
disk), only to learn what the store knew when it closed. The snapshot holds, per queue, what
the open needs at once: where its units end, where its live units start, and where the newest
unit's record ends in the CommitLog. Queues are then loaded on first use
(``ConsumeQueue._materialize``).

The snapshot is one-shot: written (atomically, synced) by a clean close after every queue is
flushed, and removed by the next writable open before anything can write, whether trusted or
not, so it never outlives the state it describes. It is trusted only when the store was closed
cleanly (no ``abort`` marker), the ``consumequeue`` directory was not changed since (its
mtime), and the CommitLog still spans what it did (its min and end offsets, checked when
recovery knows them). Anything else, and the queues are read from their files as before.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from stratamq.fileutil import atomic_write, fsync_directory

log = logging.getLogger(__name__)

FORMAT_VERSION = 1


class QueuePositions(NamedTuple):
    """One queue as it was at the clean close (byte positions in the queue's byte space). A
    named tuple: ten thousand are made per open, and a frozen dataclass costs 4x as much."""

    file_size: int
    first_file: int  # byte offset of the first file (its name)
    max_bytes: int  # end of the written units
    min_logic: int  # byte position of the first live unit
    max_physic: int  # end (offset + size) of the newest unit's record; -1 if none


@dataclass(frozen=True, slots=True)
class ConsumeQueueSnapshot:
    commitlog_min: int
    commitlog_end: int
    directory_mtime_ns: int  # of <root>/consumequeue: a queue added or removed since changes it
    queues: dict[tuple[str, int], QueuePositions]


def directory_mtime_ns(directory: Path) -> int:
    try:
        return os.stat(directory).st_mtime_ns
    except FileNotFoundError:
        return -1


def write_snapshot(path: Path, snapshot: ConsumeQueueSnapshot) -> None:
    """Write ``snapshot`` durably (atomic: a crash leaves the old file or the new)."""
    doc = {
        "version": FORMAT_VERSION,
        "commitlogMin": snapshot.commitlog_min,
        "commitlogEnd": snapshot.commitlog_end,
        "directoryMtimeNs": snapshot.directory_mtime_ns,
        # One row per queue: [topic, queueId, fileSize, firstFile, maxBytes, minLogic,
        # maxPhysic]: a list per queue keeps 10,000 queues at ~0.6 MB and quick to parse.
        "queues": [[topic, queue_id, q.file_size, q.first_file, q.max_bytes, q.min_logic,
                    q.max_physic] for (topic, queue_id), q in snapshot.queues.items()],
    }
    atomic_write(path, json.dumps(doc, separators=(",", ":")).encode("utf-8"))


def take_snapshot(path: Path) -> ConsumeQueueSnapshot | None:
    """Read the snapshot and remove it (durably): None if there is none or it cannot be used
    (a damaged or unknown snapshot is reported, and the queues are read from their files)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("cannot read ConsumeQueue snapshot %s (%s): reading every queue", path, exc)
        raw = b""
    discard_snapshot(path)
    try:
        doc = json.loads(raw)
        if doc.get("version") != FORMAT_VERSION:
            raise ValueError(f"version {doc.get('version')!r}, expected {FORMAT_VERSION}")
        queues = {}
        for topic, queue_id, *numbers in doc["queues"]:
            if type(topic) is not str or type(queue_id) is not int:
                raise ValueError(f"bad queue row {[topic, queue_id, *numbers]!r}")
            if len(numbers) != 5 or not all(type(n) is int for n in numbers):
                raise ValueError(f"bad queue row {[topic, queue_id, *numbers]!r}")
            queues[(topic, queue_id)] = QueuePositions._make(numbers)
        return ConsumeQueueSnapshot(int(doc["commitlogMin"]), int(doc["commitlogEnd"]),
                                    int(doc["directoryMtimeNs"]), queues)
    except (ValueError, KeyError, TypeError) as exc:
        if raw:
            log.warning("ConsumeQueue snapshot %s is not usable (%s): reading every queue",
                        path, exc)
        return None


def discard_snapshot(path: Path) -> None:
    """Remove the snapshot durably: once the store may write, it describes the past."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
        fsync_directory(path.parent)
