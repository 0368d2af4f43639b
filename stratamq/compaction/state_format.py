"""Compaction's small JSON files: a queue's ``state.json``, a round's ``swap.json`` manifest and
the store's ``dispatch-checkpoint``. Spec: ``docs/formats/compaction-log.md``.

Each is written whole with ``fileutil.atomic_write`` (temp file, fsync, rename, fsync the
directory), so a crash leaves the old content or the new. Reading checks every field and raises
:class:`StateError` naming the file and the field; nothing is guessed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stratamq.fileutil import atomic_write
from stratamq.store.layout import parse_segment_name

__all__ = ["DispatchCheckpoint", "QueueState", "RoundMark", "StateError", "SwapManifest"]

VERSION = 1


class StateError(ValueError):
    """A compaction state file that cannot be trusted (the message names file and field)."""


def _load(path: Path) -> dict[str, Any] | None:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise StateError(f"{path} is not JSON ({exc}); move it away to start that part "
                         "afresh") from None
    if not isinstance(data, dict):
        raise StateError(f"{path} must hold a JSON object")
    if data.get("version") != VERSION:
        raise StateError(f"{path}: version {data.get('version')!r} is not {VERSION}")
    return data


def _int(path: Path, data: dict[str, Any], key: str, low: int = 0) -> int:
    value = data.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise StateError(f"{path}: {key!r} must be an integer >= {low}, not {value!r}")
    return value


def _write(path: Path, data: dict[str, Any]) -> None:
    atomic_write(path, json.dumps({"version": VERSION, **data}, sort_keys=True).encode())


@dataclass
class RoundMark:
    """A round whose tombstones may still be kept: it first saw the queue offsets below
    ``end_offset`` (and at or above the previous mark's), at ``time_ms``."""

    end_offset: int
    time_ms: int
    tombstones: int  # tombstones it kept

    def to_json(self) -> list[int]:
        return [self.end_offset, self.time_ms, self.tombstones]


@dataclass
class QueueState:
    """A compaction queue's progress (``state.json``).

    - ``cleaned_to``: every queue offset below it was in some round's OffsetMap (the next round
      builds its map from here: seed 001's incremental build).
    - ``next_offset``: the next queue offset of the queue, kept because a round may remove the
      newest messages of the compacted files (expired tombstones).
    - ``expired_below``: tombstones below this offset are past ``delete.retention.ms``.
    - ``rounds``: the later rounds, oldest first (see :class:`RoundMark`).
    - ``last_round``: the last round's figures, as ``compaction status`` shows them.
    - ``tier_floor``: the queue's compacted files below this offset were deleted locally once
      the tier held them; reads below it go to the tier (``tiering.py``). 0: all local.
    """

    cleaned_to: int = 0
    next_offset: int = 0
    expired_below: int = 0
    rounds: list[RoundMark] = field(default_factory=list)
    last_round: dict[str, Any] = field(default_factory=dict)
    tier_floor: int = 0

    def to_json(self) -> dict[str, Any]:
        out = {"cleanedTo": self.cleaned_to, "nextOffset": self.next_offset,
               "expiredBelow": self.expired_below,
               "rounds": [m.to_json() for m in self.rounds], "lastRound": self.last_round}
        if self.tier_floor:
            out["tierFloor"] = self.tier_floor  # absent when 0: files older versions read
        return out

    @classmethod
    def from_json(cls, path: Path, data: dict[str, Any]) -> QueueState:
        rounds = data.get("rounds")
        if not isinstance(rounds, list) or not all(
                isinstance(r, list) and len(r) == 3
                and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in r)
                for r in rounds):
            raise StateError(f"{path}: 'rounds' must be a list of [endOffset, timeMs, "
                             f"tombstones], not {rounds!r:.80}")
        last = data.get("lastRound", {})
        if not isinstance(last, dict):
            raise StateError(f"{path}: 'lastRound' must be an object")
        floor = _int(path, data, "tierFloor") if "tierFloor" in data else 0
        return cls(_int(path, data, "cleanedTo"), _int(path, data, "nextOffset"),
                   _int(path, data, "expiredBelow"), [RoundMark(*r) for r in rounds], last,
                   floor)

    @classmethod
    def read(cls, path: Path) -> QueueState:
        data = _load(path)
        return cls() if data is None else cls.from_json(path, data)

    def write(self, path: Path) -> None:
        _write(path, self.to_json())

    def tombstone_expired(self, queue_offset: int) -> bool:
        return queue_offset < self.expired_below


def _names(path: Path, data: dict[str, Any], key: str) -> list[str]:
    names = data.get(key)
    if not isinstance(names, list) or not all(
            isinstance(n, str) and parse_segment_name(n) is not None for n in names):
        raise StateError(f"{path}: {key!r} must be a list of 20-digit file names")
    return names


@dataclass
class SwapManifest:
    """A round's swap (``swap.json``), written once the new files are durable in
    ``compacting/``: its presence is the commit point. ``replace`` are the files the round
    compacted, ``with_`` the new ones (each named like one of ``replace``); ``state`` is the
    queue's state once swapped."""

    replace: list[str]
    with_: list[str]
    state: QueueState

    def write(self, path: Path) -> None:
        _write(path, {"replace": self.replace, "with": self.with_,
                      "state": self.state.to_json()})

    @classmethod
    def read(cls, path: Path) -> SwapManifest | None:
        data = _load(path)
        if data is None:
            return None
        replace, with_ = _names(path, data, "replace"), _names(path, data, "with")
        if not set(with_) <= set(replace):
            raise StateError(f"{path}: every new file must replace one of 'replace'")
        state = data.get("state")
        if not isinstance(state, dict):
            raise StateError(f"{path}: 'state' must be an object")
        return cls(replace, with_, QueueState.from_json(path, state))


@dataclass
class DispatchCheckpoint:
    """``dispatch-checkpoint``: every CommitLog record below ``dispatched_to`` is in the
    CompactionLogs, flushed. An open replays the CommitLog from there."""

    dispatched_to: int = 0

    @classmethod
    def read(cls, path: Path) -> DispatchCheckpoint:
        data = _load(path)
        return cls() if data is None else cls(_int(path, data, "dispatchedTo"))

    def write(self, path: Path) -> None:
        _write(path, {"dispatchedTo": self.dispatched_to})
