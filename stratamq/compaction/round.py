"""One compaction round of one queue: choose the files, build the OffsetMap, rewrite, swap.

Seed 001's four steps, with Kafka's incremental build:

1. **Choose** the sealed segments (never the one being written), once the queue has at least
   two files.
2. **Build** the OffsetMap (md5(key) -> last queue offset) from the queue's ``cleaned_to``
   onwards, straight from the batch CQ units (they carry the key digest), until the map is full
   or the sealed segments end: the map covers ``[cleaned_to, map_end)``. A key the map does not
   hold keeps its previous value (seed 001's second-round build).
3. **Rewrite** every sealed segment that starts below ``map_end`` into ``compacting/``, keeping
   a record unless: the map holds its key at a larger offset (superseded); it has no key and
   the map covered it; or it is a tombstone whose ``delete.retention.ms`` has run out since the
   round that first covered it. Records at or past ``map_end`` are kept untouched. Kept records
   are copied as whole runs, units rebased in bulk; queue offsets never change.
4. **Swap** the new files in with the manifest protocol (``swap.py``).

The next round builds its map from ``map_end``. Not thread-safe per queue: a round holds the
queue's ``compacting`` lock; rounds of different queues may run at once.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from stratamq import record as codec
from stratamq.compaction import bcq_format as bcq
from stratamq.compaction import swap
from stratamq.compaction.log import CompactionLog, CompactionLogError
from stratamq.compaction.offset_map import ENTRY_BYTES, LOAD_FACTOR, OffsetMap
from stratamq.compaction.policy import TopicPolicy
from stratamq.compaction.segment import Segment
from stratamq.compaction.state_format import QueueState, RoundMark, SwapManifest
from stratamq.fileutil import fsync_directory

__all__ = ["RoundReport", "round_due", "run_round", "run_round_held", "tier_only_reason"]

log = logging.getLogger(__name__)


@dataclass
class RoundReport:
    """What a round did to one queue (one JSON line of ``compaction run``)."""

    topic: str
    queue_id: int
    records_read: int = 0
    kept: int = 0
    removed: int = 0  # superseded by a later value of their key, or without a key
    tombstones_dropped: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    files_before: int = 0
    files_after: int = 0
    keys_mapped: int = 0
    map_bytes: int = 0
    cleaned_to: int = 0
    skipped: str | None = None  # why nothing was done
    elapsed_ms: float = 0.0
    time_ms: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def run_round(clog: CompactionLog, policy: TopicPolicy, map_memory: int,
              now_ms: int | None = None, *,
              superseded: np.ndarray | None = None) -> RoundReport:
    """Compact ``clog`` once (see the module docstring) and return what was done.

    ``superseded``: the queue offsets of the sealed segments whose key has a later value at or
    after ``cleaned_to``, worked out elsewhere over every key at once (the Spark ``compact``
    pipeline's distributed reduce); no OffsetMap is built and the round covers every sealed
    segment, as one whose OffsetMap held every key would."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    if not clog.compacting.acquire(blocking=False):
        return RoundReport(clog.topic, clog.queue_id, time_ms=now,
                           skipped="a round of this queue is already running")
    try:
        return run_round_held(clog, policy, map_memory, now, superseded=superseded)
    finally:
        clog.compacting.release()


def run_round_held(clog: CompactionLog, policy: TopicPolicy, map_memory: int, now_ms: int, *,
                   superseded: np.ndarray | None = None) -> RoundReport:
    """``run_round`` for a caller that holds ``clog.compacting`` already (so what it did
    before, a restore from the tier, and the round are one step no tier pass comes between)."""
    started = time.monotonic()
    report = RoundReport(clog.topic, clog.queue_id, time_ms=now_ms)
    try:
        _round(clog, policy, map_memory, now_ms, report, started, superseded)
    finally:
        report.elapsed_ms = round((time.monotonic() - started) * 1000, 3)
    return report


def tier_only_reason(clog: CompactionLog) -> str | None:
    """Why a round of ``clog`` may not run now: files the tier alone holds (released locally,
    below ``tierFloor``). A round must see every key: one without those files would drop
    tombstones whose older values they still hold, and its state would forget them."""
    floor = clog.state.tier_floor
    if not floor and not clog.tier_only():
        return None
    return (f"its compacted files below offset {floor} are in the tier only "
            f"({clog.paths.state}: tierFloor): restore them first")


def _round(clog: CompactionLog, policy: TopicPolicy, map_memory: int, now: int,
           report: RoundReport, started: float, superseded: np.ndarray | None) -> None:
    sealed = clog.sealed_segments()
    report.cleaned_to = clog.state.cleaned_to
    reason = tier_only_reason(clog)
    if reason is not None:
        report.skipped = reason
        return
    if not sealed:
        report.skipped = "fewer than two files: the file being written is never compacted"
        return
    held: list[Segment] = []
    try:
        for seg in sealed:
            if not seg.hold():
                report.skipped = "the queue's files changed (topic deleted?)"
                return
            held.append(seg)
        _compact(clog, sealed, policy, map_memory, now, report, started, superseded)
    finally:
        for seg in held:
            seg.release()


def round_due(clog: CompactionLog, policy: TopicPolicy, now_ms: int | None = None) -> bool:
    """Whether a round of ``clog`` would do anything (new sealed data, or tombstones whose
    retention ran out): the tier restores released files only for a round that is due."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    sealed = clog.sealed_segments()
    if not sealed:
        return False
    last_sealed = max((s.last_offset for s in sealed if s.units), default=-1)
    return (clog.state.cleaned_to <= last_sealed
            or _expire(clog.state, policy.delete_retention_ms, now)[2] > 0)


def _expire(state: QueueState, retention_ms: int, now: int) -> tuple[int, list[RoundMark], int]:
    """(expired_below, marks still retained, tombstones whose retention ran out)."""
    expired_below, marks, due = state.expired_below, list(state.rounds), 0
    while marks and marks[0].time_ms + retention_ms <= now:
        mark = marks.pop(0)
        expired_below, due = max(expired_below, mark.end_offset), due + mark.tombstones
    return expired_below, marks, due


def _build_map(sealed: Sequence[Segment], cleaned_to: int,
               offset_map: OffsetMap) -> int:
    """Put the keyed units at or after ``cleaned_to`` into the map; return ``map_end``, the
    first queue offset the map does not cover."""
    map_end = cleaned_to
    for seg in sealed:
        if not seg.units or seg.last_offset < cleaned_to:
            continue
        units = seg.units_array()
        qo = units["queue_offset"]
        dirty = qo >= cleaned_to
        keyed = dirty & ((units["flags"] & bcq.FLAG_HAS_KEY) != 0)
        offsets = qo[keyed].astype(np.int64)
        took = offset_map.put_many(units["key_digest"][keyed], offsets)
        if took < len(offsets):
            return int(offsets[took])  # full: the rest waits for the next round
        map_end = int(qo[-1]) + 1
    return map_end


def _compact(clog: CompactionLog, sealed: list[Segment], policy: TopicPolicy,
             map_memory: int, now: int, report: RoundReport, started: float,
             superseded: np.ndarray | None = None) -> None:
    state = clog.state
    expired_below, marks, due = _expire(state, policy.delete_retention_ms, now)
    last_sealed = max((s.last_offset for s in sealed if s.units), default=-1)
    if state.cleaned_to > last_sealed and not due:
        report.skipped = "nothing new since the last round"
        return
    offset_map: OffsetMap | _Superseded
    if superseded is not None:
        offset_map = _Superseded(superseded)
        map_end = max(state.cleaned_to, last_sealed + 1)
    else:
        # No bigger than the dirty keys need: a small queue does not allocate
        # maxOffsetMapSize.
        dirty = sum(int(np.count_nonzero(s.units_array()["queue_offset"] >= state.cleaned_to))
                    for s in sealed if s.units and s.last_offset >= state.cleaned_to)
        offset_map = OffsetMap(min(map_memory, int(dirty / LOAD_FACTOR + 16) * ENTRY_BYTES))
        map_end = _build_map(sealed, state.cleaned_to, offset_map)
        report.keys_mapped = offset_map.size
        report.map_bytes = offset_map.nbytes
    rewrite = [s for s in sealed if not s.units or s.first_offset < map_end]
    if not rewrite:
        report.skipped = "nothing to rewrite"
        return
    out = _Output(clog, [s.name for s in rewrite])
    new_tombstones = 0
    try:
        for seg in rewrite:
            keep, counts = _decide(seg, offset_map, map_end, expired_below)
            report.records_read += seg.units
            report.removed += counts[0]
            report.tombstones_dropped += counts[1]
            kept_units = seg.units_array()[keep]
            report.kept += len(kept_units)
            new_tombstones += int(np.count_nonzero(
                (kept_units["flags"] & bcq.FLAG_TOMBSTONE != 0)
                & (kept_units["queue_offset"] >= state.cleaned_to)
                & (kept_units["queue_offset"] < map_end)))
            out.copy(seg, kept_units)
            report.bytes_before += seg.log_bytes
        out.finish()
    except BaseException:
        out.discard()
        raise
    swap.step("output-written")
    report.files_before, report.files_after = len(rewrite), len(out.segments)
    report.bytes_after = sum(s.log_bytes for s in out.segments)
    cleaned_to = max(state.cleaned_to, map_end)
    if map_end > state.cleaned_to:
        marks.append(RoundMark(map_end, now, new_tombstones))
    report.cleaned_to = cleaned_to
    report.elapsed_ms = round((time.monotonic() - started) * 1000, 3)
    new_state = QueueState(cleaned_to, max(state.next_offset, clog.next_offset), expired_below,
                           marks, {k: v for k, v in report.to_json().items()
                                   if k not in ("topic", "queue_id")},
                           state.tier_floor)  # carried: a lost floor would orphan the tier's files
    manifest = SwapManifest([s.name for s in rewrite], [s.name for s in out.segments],
                            new_state)
    out.close()
    manifest.write(clog.paths.manifest)
    swap.step("manifest-written")
    clog.swap_in(rewrite, manifest)


class _Superseded:
    """What ``_decide`` asks of an OffsetMap, answered from the superseded queue offsets a
    caller worked out (``run_round(superseded=...)``)."""

    def __init__(self, offsets: np.ndarray) -> None:
        self.offsets = np.unique(np.asarray(offsets, dtype=np.int64))

    def later(self, units: np.ndarray, ask: np.ndarray, qo: np.ndarray) -> np.ndarray:
        return np.isin(qo[ask], self.offsets)


def _decide(seg: Segment, offset_map: OffsetMap | _Superseded, map_end: int,
            expired_below: int) -> tuple[np.ndarray, tuple[int, int]]:
    """Which units of ``seg`` to keep; (removed, tombstones dropped)."""
    units = seg.units_array()
    qo = units["queue_offset"].astype(np.int64)
    flags = units["flags"]
    keyed = (flags & bcq.FLAG_HAS_KEY) != 0
    covered = qo < map_end
    keep = np.ones(len(units), dtype=bool)
    keep[covered & ~keyed] = False  # no key: nothing to keep it for
    ask = np.flatnonzero(covered & keyed)
    if ask.size:
        if isinstance(offset_map, _Superseded):
            later = offset_map.later(units, ask, qo)
        else:
            later = offset_map.get_many(units["key_digest"][ask]) > qo[ask]
        keep[ask[later]] = False  # a later value of the key exists
    removed = int(len(units) - np.count_nonzero(keep))
    expired = keep & ((flags & bcq.FLAG_TOMBSTONE) != 0) & (qo < expired_below)
    keep &= ~expired
    return keep, (removed, int(np.count_nonzero(expired)))


class _Output:
    """The round's new segments in ``compacting/``, named after the files they replace."""

    def __init__(self, clog: CompactionLog, names: list[str]) -> None:
        self.clog = clog
        self.paths = clog.paths
        self.names = list(names)
        self.segments: list[Segment] = []
        for directory in (self.paths.new_log_dir, self.paths.new_cq_dir):
            if directory.exists():
                swap.discard_output(self.paths)  # a crashed round's leftovers
            directory.mkdir(parents=True, exist_ok=True)

    def _next(self) -> Segment:
        if self.segments:
            self.segments[-1].seal()
        if len(self.segments) >= len(self.names):
            raise CompactionLogError(f"the compacted records of {self.clog.topic}:"
                                     f"{self.clog.queue_id} need more files than they came from")
        start = int(self.names[len(self.segments)])
        seg = Segment.create(self.paths.new_log_file(start), self.paths.new_cq_file(start),
                             self.clog.log_size, self.clog.cq_size)
        self.segments.append(seg)
        return seg

    def copy(self, src: Segment, units: np.ndarray) -> None:
        """Append the records of ``units`` (kept units of ``src``, in order): as many as fit
        the current new segment in one write, gathered from runs of adjacent records."""
        if not len(units):
            return
        pos = units["position"].astype(np.int64)
        size = units["size"].astype(np.int64)
        ends = np.cumsum(size)  # where each record ends in the gathered bytes
        buf = src.log.buffer
        a, n = 0, len(units)
        while a < n:
            seg = self.segments[-1] if self.segments else self._next()
            room_bytes = seg.log.file_size - codec.END_FILE_MIN_BLANK_LENGTH \
                - seg.log.wrote_position
            room_units = seg.capacity - 1 - seg.units  # one for the end unit (Segment.fits)
            base = int(ends[a - 1]) if a else 0
            fit = int(np.searchsorted(ends[a:], base + room_bytes, side="right"))
            fit = min(fit, room_units, n - a)
            if fit <= 0:
                if not seg.units:
                    raise CompactionLogError("a record does not fit an empty file")
                self._next()
                continue
            b = a + fit
            # Runs of records adjacent in the source: one slice each.
            p, z = pos[a:b], size[a:b]
            cut = np.flatnonzero(p[1:] != p[:-1] + z[:-1]) + 1
            firsts = np.concatenate(([0], cut))
            lasts = np.concatenate((cut, [fit])) - 1
            starts = (p[firsts] - src.start).tolist()
            stops = (p[lasts] + z[lasts] - src.start).tolist()
            data = b"".join([buf[x:y] for x, y in zip(starts, stops)])
            run = units[a:b].copy()
            run["position"] = ends[a:b] - z - base + seg.start + seg.log.wrote_position
            seg.append_run(data, run)
            a = b

    def finish(self) -> None:
        """Seal the last new segment and make everything durable."""
        if self.segments:
            self.segments[-1].seal()
        for seg in self.segments:
            seg.flush()
        fsync_directory(self.paths.new_log_dir)
        fsync_directory(self.paths.new_cq_dir)

    def close(self) -> None:
        for seg in self.segments:
            seg.close()

    def discard(self) -> None:
        for seg in self.segments:
            with contextlib.suppress(Exception):
                seg.close()
        swap.discard_output(self.paths)
