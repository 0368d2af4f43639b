"""``ReadDamage``: what the tier's reads found wrong, per queue, so that it is said once and
shown until the process ends.

* Corrupt records: a record that fails the checks of ``record.copy_check`` (another queue's or
  offset's record, a cut record, a body that does not match its CRC). Never served: the read
  skips it (or leaves it to the local copy when the local store still holds the offset).
* Missing ranges: queue offsets whose data the tier lost (a tier file truncated, or its file or
  objects gone) while the metadata still counts them. A read there answers as RocketMQ's store
  answers for a hole: ``OFFSET_FOUND_NULL`` with the next offset past it.

Each corrupt record and each missing range is logged at ERROR once (the first read that finds
it), counted (``stratamq_tiered_store_corrupt_records`` / ``..._missing_messages``) and shown by
``tier status`` (``corrupt_records``, ``missing_messages``, ``missing_ranges``). Nothing is
forgotten until a restart: a file put back in the tier is read again after one.

Thread-safety: every method takes the registry's lock.
"""

from __future__ import annotations

import bisect
import logging
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from stratamq.store.consume_queue_format import UNIT_SIZE

if TYPE_CHECKING:
    from stratamq.record.copy_check import CopyChecks
    from stratamq.tiered.flat_file import FlatCommitLogFile, FlatConsumeQueueFile
    from stratamq.tiered.flat_message_file import FlatMessageFile

__all__ = ["CHECK_WINDOW", "BlockChecks", "ReadDamage", "find_missing"]

CHECK_WINDOW = 1024  # records of a read-ahead block checked together, as they are served

log = logging.getLogger(__name__)

# Offsets of corrupt records kept per queue for ``tier status`` (the count goes on past it).
_LISTED = 100


class BlockChecks:
    """The checks of one block read from the tier: which windows of ``CHECK_WINDOW`` records
    were checked, and the records (by index in the block) that failed. Readers sharing a
    cached block may check a window twice at the same moment: the same answer, said once."""

    __slots__ = ("bad", "copies", "done")

    def __init__(self, length: int) -> None:
        self.done = bytearray(-(-length // CHECK_WINDOW))
        self.bad: set[int] = set()
        self.copies: CopyChecks | None = None  # made at the first window checked


class ReadDamage:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._corrupt: dict[tuple[str, int], set[int]] = {}
        self._missing: dict[tuple[str, int], list[tuple[int, int]]] = {}  # sorted, disjoint
        self.corrupt_records = 0
        self.missing_messages = 0

    def corrupt(self, topic: str, queue_id: int, offset: int, why: str, where: str) -> bool:
        """Note a record that failed its checks; True (and logged) the first time."""
        with self._lock:
            seen = self._corrupt.setdefault((topic, queue_id), set())
            if offset in seen:
                return False
            seen.add(offset)
            self.corrupt_records += 1
        log.error("tier record of %s/%d at queue offset %d is corrupt (%s; in %s): never served "
                  "from the tier", topic, queue_id, offset, why, where)
        return True

    def missing(self, topic: str, queue_id: int, first: int, end: int, why: str) -> None:
        """Note that queue offsets ``[first, end)`` are lost from the tier (logged once per
        range: offsets already known are not said again)."""
        if end <= first:
            return
        with self._lock:
            ranges = self._missing.setdefault((topic, queue_id), [])
            new = _uncovered(ranges, first, end)
            if not new:
                return
            ranges[:] = _merged(ranges, first, end)
            self.missing_messages += sum(b - a for a, b in new)
        for a, b in new:
            log.error("tier data of %s/%d at queue offsets %d..%d is missing (%s): reads skip "
                      "to offset %d", topic, queue_id, a, b - 1, why, b)

    def missing_at(self, topic: str, queue_id: int, offset: int) -> tuple[int, int] | None:
        """The known missing range holding ``offset``."""
        with self._lock:
            ranges = self._missing.get((topic, queue_id))
            if not ranges:
                return None
            i = bisect.bisect_right(ranges, (offset, 1 << 62)) - 1
            return ranges[i] if i >= 0 and ranges[i][0] <= offset < ranges[i][1] else None

    def next_missing(self, topic: str, queue_id: int, offset: int) -> int | None:
        """Where the first known missing range after ``offset`` starts."""
        with self._lock:
            ranges = self._missing.get((topic, queue_id))
            if not ranges:
                return None
            i = bisect.bisect_right(ranges, (offset, 1 << 62))
            return ranges[i][0] if i < len(ranges) else None

    def status(self, topic: str, queue_id: int) -> dict[str, Any]:
        """The ``tier status`` columns of a queue."""
        with self._lock:
            corrupt = self._corrupt.get((topic, queue_id), set())
            ranges = list(self._missing.get((topic, queue_id), []))
            return {"corrupt_records": len(corrupt),
                    "corrupt_offsets": sorted(corrupt)[:_LISTED],
                    "missing_messages": sum(b - a for a, b in ranges),
                    "missing_ranges": [[a, b] for a, b in ranges]}


def _uncovered(ranges: list[tuple[int, int]], first: int, end: int) -> list[tuple[int, int]]:
    """The parts of ``[first, end)`` no range covers."""
    out, at = [], first
    for a, b in ranges:
        if b <= at or a >= end:
            continue
        if a > at:
            out.append((at, a))
        at = max(at, b)
    if at < end:
        out.append((at, end))
    return out


def _merged(ranges: list[tuple[int, int]], first: int, end: int) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted([*ranges, (first, end)]):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def find_missing(flat: FlatMessageFile, offset: int, count: int, damage: ReadDamage) -> bool:
    """After a failed read of ``flat`` at ``offset``: whether the tier lost data there (a file
    shorter than the metadata says, or gone), in the ConsumeQueue file holding ``offset`` or in
    the CommitLog files its next ``count`` units point into. Each loss found is noted in
    ``damage`` as queue offsets. False when the tier holds all of it (or cannot say: it did
    not answer), so the failure is not a gap and must not be skipped."""
    cq, cl = flat.consume_queue, flat.commit_log
    segment = cq.segment_at(offset * UNIT_SIZE)
    if segment is None or not _tier_present(flat):
        return False
    try:
        real = segment.get_size()
    except OSError:
        return False  # the tier did not answer
    first = segment.base_offset // UNIT_SIZE
    end = segment.commit_offset // UNIT_SIZE
    readable = min(end, first + real // UNIT_SIZE)
    found = False
    if readable < end:
        damage.missing(flat.topic, flat.queue_id, readable, end,
                       f"tier file {segment.path} holds {real} of its "
                       f"{segment.commit_position} bytes")
        if offset >= readable:
            return True
        found = True
    try:
        units = cq.read_unit_table(offset, min(count, readable - offset))
    except OSError:
        return found
    if not len(units):
        return found
    low = int(units["offset"].min())
    high = int((units["offset"] + units["size"]).max())
    for gone_from, gone_to, why in _lost_commit_log(cl, low, high):
        # Units point into the CommitLog in order: the lost records are a run of queue offsets.
        q_from = _first(cq, offset, readable, _ends_past(gone_from))
        if q_from >= readable:
            continue  # past this ConsumeQueue file: a later read finds it
        q_to = _loss_end(cq, q_from, gone_to)
        if q_to > q_from:
            damage.missing(flat.topic, flat.queue_id, q_from, q_to, why)
            found = True
    return found


def _tier_present(flat: FlatMessageFile) -> bool:
    """Whether the tier itself is there: a POSIX tier whose root directory is gone is an
    unmounted file system (every file would look lost), not lost data."""
    factory = flat.factory
    return factory.provider != "posix" or os.path.isdir(factory.root)


def _lost_commit_log(cl: FlatCommitLogFile, low: int,
                     high: int) -> list[tuple[int, int, str]]:
    """The CommitLog bytes the tier lost from ``[low, high)`` on, as (from, to, why): a file
    shorter than the metadata says loses its tail; the lost files that follow it (gone or
    empty) extend the same loss, so a run of lost files is one loss."""
    losses: list[tuple[int, int, str]] = []
    gone = 0
    for part in cl.segments:
        if part.commit_offset <= low:
            continue
        follows = bool(losses) and losses[-1][1] == part.base_offset
        if part.base_offset >= high and not follows:
            break
        try:
            size = part.get_size()
        except OSError:
            break  # the tier did not answer: say nothing of what it may hold
        if size >= part.commit_position:
            if part.base_offset >= high:
                break
            continue
        if follows and size == 0:
            gone += 1
            first, _to, why = losses[-1]
            losses[-1] = (first, part.commit_offset, why.split(" (and ")[0] +
                          f" (and the {gone} file(s) after it are gone)")
            continue
        gone = 0
        losses.append((part.base_offset + size, part.commit_offset,
                       f"tier file {part.path} holds {size} of its {part.commit_position} "
                       "bytes"))
    return losses


def _loss_end(cq: FlatConsumeQueueFile, first: int, gone_to: int) -> int:
    """The first queue offset from ``first`` whose record lies at or past ``gone_to`` in the
    CommitLog, across the ConsumeQueue files that follow on (a loss is said once, whole, not
    once per ConsumeQueue file); where the units stop (a gap, an unreadable file) at most."""
    at = first
    for segment in cq.segments:
        seg_first, seg_end = segment.base_offset // UNIT_SIZE, segment.commit_offset // UNIT_SIZE
        if seg_end <= at:
            continue
        if seg_first > at:
            break  # no units between: the run of lost records ends here
        try:
            found = _first(cq, at, seg_end, lambda f, n: f >= gone_to)
        except OSError:
            break
        if found < seg_end:
            return found
        at = seg_end
    return at


def _ends_past(position: int) -> Callable[[int, int], bool]:
    return lambda flat_offset, size: flat_offset + size > position


def _first(cq: FlatConsumeQueueFile, lo: int, hi: int,
           past: Callable[[int, int], bool]) -> int:
    """The first queue offset in ``[lo, hi)`` whose unit (flat offset, size) is ``past``
    (false before it, true from it on), or ``hi``: a binary search, one unit read a step."""
    while lo < hi:
        mid = (lo + hi) // 2
        flat_offset, size, _code = cq.read_units(mid, 1)[0]
        if past(flat_offset, size):
            hi = mid
        else:
            lo = mid + 1
    return lo
