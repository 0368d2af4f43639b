"""Epochs: where a node's CommitLog may have begun to differ from what another node holds.

Spec: ``docs/formats/epoch-file.md``. The file is RocketMQ's ``epochFileCheckpoint`` (its
``CheckpointFile`` of ``EpochEntry``, used by the controller-mode HA): a line with the number of
entries, a line with the CRC32 of the entry lines, then one ``<epoch>-<startOffset>`` line per
entry, oldest first. A new entry is recorded

* each time a node opens as a master: its log from there on is a new life (a crash may have cut
  a tail some slave still holds), at the offset its recovery ended at;
* each time a slave cuts its own log back: from there on it holds other bytes than before.

A master sends a connecting slave the records at these offsets (below what the slave holds) to
compare; the first that differs is where the slave's log must be cut (``protocol.py``).

``parse``/``render`` are pure; ``EpochFile`` reads and writes the file (atomically, the previous
version kept as ``.bak`` and read when the file is damaged, as RocketMQ does).
Thread-safety: ``EpochFile`` methods take its lock; any thread.
"""

from __future__ import annotations

import logging
import threading
import zlib
from pathlib import Path
from typing import NamedTuple

from stratamq.fileutil import atomic_write

__all__ = ["EpochEntry", "EpochFile", "EpochFileCorrupt", "parse", "render"]

log = logging.getLogger(__name__)

MAX_ENTRIES = 1024  # the oldest go first; a check per entry is sent to each connecting slave


class EpochEntry(NamedTuple):
    epoch: int
    start_offset: int


class EpochFileCorrupt(ValueError):
    """The file is not a whole epoch checkpoint; the message says what is wrong."""


def _crc(text: str) -> int:
    return zlib.crc32(text.encode()) & 0x7FFFFFFF  # RocketMQ's UtilAll.crc32


def render(entries: list[EpochEntry]) -> bytes:
    body = "".join(f"{e.epoch}-{e.start_offset}\n" for e in entries)
    return f"{len(entries)}\n{_crc(body)}\n{body}".encode()


def parse(data: bytes) -> list[EpochEntry]:
    try:
        text = data.decode()
    except UnicodeDecodeError:
        raise EpochFileCorrupt("not text") from None
    lines = text.split("\n")
    if len(lines) < 3 or not lines[0].strip().isdigit():
        raise EpochFileCorrupt("no entry count on the first line")
    count = int(lines[0])
    try:
        crc = int(lines[1])
    except ValueError:
        raise EpochFileCorrupt("no CRC on the second line") from None
    body_lines = [line for line in lines[2:] if line]
    body = "".join(line + "\n" for line in body_lines)
    if len(body_lines) != count:
        raise EpochFileCorrupt(f"{count} entries announced, {len(body_lines)} found")
    if crc != 0 and crc != _crc(body):  # RocketMQ: a CRC of 0 is not checked
        raise EpochFileCorrupt("CRC mismatch")
    entries = []
    for line in body_lines:
        epoch, sep, start = line.partition("-")
        if not sep or not epoch.isdigit() or not start.isdigit():
            raise EpochFileCorrupt(f"entry {line!r} is not <epoch>-<startOffset>")
        entries.append(EpochEntry(int(epoch), int(start)))
    return entries


class EpochFile:
    """The epochs of one store, loaded at construction (a missing file: none yet)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self.entries: list[EpochEntry] = self._load()

    def _load(self) -> list[EpochEntry]:
        backup = self.path.with_name(self.path.name + ".bak")
        for candidate in (self.path, backup):
            if not candidate.exists():
                continue
            try:
                return parse(candidate.read_bytes())
            except EpochFileCorrupt as exc:
                log.error("epoch file %s is damaged (%s); trying its backup", candidate, exc)
        return []

    def offsets(self) -> list[int]:
        with self._lock:
            return [e.start_offset for e in self.entries]

    def begin(self, start_offset: int, min_offset: int = 0, epoch: int | None = None
              ) -> EpochEntry:
        """Record a new epoch starting at ``start_offset``; entries at or past it are replaced
        (that part of the log is gone), and entries below ``min_offset`` (bytes no node can
        compare any more) dropped. ``epoch``: its number (a cluster's, from etcd; at least the
        last one's + 1), else the last one's + 1."""
        with self._lock:
            kept = [e for e in self.entries if min_offset <= e.start_offset < start_offset]
            last = self.entries[-1].epoch if self.entries else 0
            epoch = max(epoch or 0, last + 1)
            entry = EpochEntry(epoch, start_offset)
            self.entries = [*kept, entry][-MAX_ENTRIES:]
            atomic_write(self.path, render(self.entries), backup=True)
            return entry
