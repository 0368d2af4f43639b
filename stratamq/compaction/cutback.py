"""Cutting a CompactionLog back to a CommitLog offset: a SLAVE whose CommitLog its master cut
back (``store/replica.py`` ``ReplicaLog.truncate`` calls the dispatchers' ``truncate_from``).

Records in a CompactionLog keep their CommitLog physical offset (compaction-log.md), and a
queue's records are in CommitLog order, so "every record at or after CommitLog offset P" is a
suffix of the queue's units. It goes with the compaction swap protocol (``swap.py``): the
segment holding the first such record is rewritten in ``compacting/`` with the units before it
(sealed), the later segments are replaced by nothing, and the queue's state is cut to match
(``next_offset`` just past the last kept unit; ``cleaned_to``, ``expired_below`` and the
tombstone marks no higher). A crash leaves the old set or the cut one, as for a round.

What the cut cannot give back: versions a round removed because a later version replaced
them, when that later version is what was cut. The caller (``CompactionStore.truncate_from``)
dispatches the queue's CommitLog records between the last kept unit and P again, while the
CommitLog still holds them.

Files already released to the tier (``tier_only``) are not cut: a slave never writes the tier.
Thread-safety: the caller holds the queue's ``compacting`` lock and dispatch is paused.
"""

from __future__ import annotations

import bisect
import logging
from dataclasses import dataclass

from stratamq import record as codec
from stratamq.compaction import swap
from stratamq.compaction.log import CompactionLog
from stratamq.compaction.segment import Segment
from stratamq.compaction.state_format import QueueState, SwapManifest
from stratamq.fileutil import fsync_directory

__all__ = ["CutBack", "apply_cut", "plan_cut"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CutBack:
    """A cut of one queue (``plan_cut``): the units cut, the queue offset of the last unit kept
    (-1: none) and the CommitLog end of its record (0: none); ``cut_at`` / ``keep_units``: the
    first segment cut and how many of its units stay."""

    physical_offset: int
    units_cut: int
    last_kept_offset: int
    last_kept_end: int
    cut_at: int
    keep_units: int


def _physical(seg: Segment, index: int) -> tuple[int, int]:
    """(CommitLog offset, size) of the record of unit ``index`` (segment held)."""
    unit = seg.unit(index)
    return codec.record_positions(seg.record_view(unit.position, unit.size), 0)[1], unit.size


def _first_at_or_after(seg: Segment, physical_offset: int) -> int:
    """Index of the first unit whose record is at or after ``physical_offset``."""
    return bisect.bisect_left(range(seg.units), physical_offset,
                              key=lambda i: _physical(seg, i)[0])


def plan_cut(clog: CompactionLog, physical_offset: int) -> CutBack:
    """What cutting ``clog`` back to its records below CommitLog offset ``physical_offset``
    would do (nothing changed)."""
    segments = clog.segments
    cut_at, keep_units = len(segments), 0  # the first segment cut, and its units that stay
    for i in range(len(segments) - 1, -1, -1):
        seg = segments[i]
        if not seg.units:
            continue  # the empty segment being written
        if not seg.hold():
            raise OSError(f"compaction queue {clog.topic}:{clog.queue_id}: file {seg.name} "
                          "went while it was cut back")
        try:
            index = _first_at_or_after(seg, physical_offset)
        finally:
            seg.release()
        if index == seg.units:
            break  # every record of this segment stays, and so does every earlier one
        cut_at, keep_units = i, index
        if index > 0:
            break
    doomed = list(segments[cut_at:])
    units_cut = sum(s.units for s in doomed) - keep_units
    last_kept, last_end = _last_kept(segments[:cut_at], doomed[0] if doomed else None,
                                     keep_units)
    if last_kept < 0 and clog.tier_only():
        last_kept = clog.tier_only()[-1].entry.last_offset  # released to the tier: not cut
    return CutBack(physical_offset, units_cut, last_kept, last_end, cut_at, keep_units)


def apply_cut(clog: CompactionLog, plan: CutBack) -> None:
    """Carry out ``plan`` (made by ``plan_cut`` under the same ``compacting`` lock)."""
    if not plan.units_cut:
        return
    doomed = list(clog.segments[plan.cut_at:])
    keep_units, last_kept = plan.keep_units, plan.last_kept_offset
    paths = clog.paths
    swap.discard_output(paths)
    rewritten: list[str] = []
    if keep_units:
        head = doomed[0]
        for directory in (paths.new_log_dir, paths.new_cq_dir):
            directory.mkdir(parents=True, exist_ok=True)
        if not head.hold():
            raise OSError(f"compaction queue {clog.topic}:{clog.queue_id}: file {head.name} "
                          "went while it was cut back")
        try:
            units = head.units_array()[:keep_units].copy()
            end = int(units["position"][-1]) + int(units["size"][-1]) - head.start
            fresh = Segment.create(paths.new_log_file(head.start), paths.new_cq_file(head.start),
                                   clog.log_size, clog.cq_size)
            try:
                fresh.append_run(bytes(head.log.buffer[:end]), units)
                fresh.seal()
                fresh.flush()
            finally:
                fresh.close()
        finally:
            head.release()
        fsync_directory(paths.new_log_dir)
        fsync_directory(paths.new_cq_dir)
        rewritten.append(head.name)
    state = clog.state
    below = last_kept + 1
    new_state = QueueState(min(state.cleaned_to, below), below,
                           min(state.expired_below, below),
                           [m for m in state.rounds if m.end_offset <= below],
                           state.last_round, min(state.tier_floor, below))
    manifest = SwapManifest([s.name for s in doomed], rewritten, new_state)
    manifest.write(paths.manifest)
    clog.swap_in(doomed, manifest)
    # What load() would compute: the queue expects the offset after its last kept unit.
    clog.next_offset = below
    clog.physical_end = plan.last_kept_end
    log.warning("compaction queue %s:%d cut back to CommitLog offset %d: %d records cut, "
                "next queue offset %d", clog.topic, clog.queue_id, plan.physical_offset,
                plan.units_cut, below)


def _last_kept(before: tuple[Segment, ...], head: Segment | None,
               keep_units: int) -> tuple[int, int]:
    """(queue offset, CommitLog end) of the last unit that stays (-1, 0 if none)."""
    candidates: list[tuple[Segment, int]] = []
    if head is not None and keep_units:
        candidates.append((head, keep_units - 1))
    candidates += [(s, s.units - 1) for s in reversed(before) if s.units]
    for seg, index in candidates[:1]:
        if not seg.hold():
            raise OSError(f"compaction file {seg.name} went while it was cut back")
        try:
            phys, size = _physical(seg, index)
            return seg.unit(index).queue_offset, phys + size
        finally:
            seg.release()
    return -1, 0
