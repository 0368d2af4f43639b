"""What consumer groups still need of the CommitLog: the store's side of the "consumption
floor" seam the forced clean-up decides with (see ``cleanup.py``).

The store knows nothing of consumer groups; the broker registers a ``ConsumedOffsets``
provider (``MessageStore.set_consumed_offsets``): per (topic, queue id), the queue offset below
which each group subscribed to the topic has consumed everything (pull offsets and pop
progress). This module turns those queue offsets into CommitLog offsets through the store's
ConsumeQueues:

* ``consumption_floor``: the CommitLog offset below which every message of every queue is
  consumed by every group holding progress on its topic. A queue no group has progress on is
  not consumed at all: its oldest message holds the floor down.
* ``unconsumed_below``: how many messages below a CommitLog offset each group (or no group)
  has not consumed: what deleting the files below it takes.

Both walk every queue (a binary search each, by ``get_units``), so they run only when a disk
is past ``diskSpaceCleanForciblyRatio``; they work on either ConsumeQueue store.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["NO_GROUP", "ConsumedOffsets", "consumption_floor", "unconsumed_below"]

ConsumedOffsets = Callable[[], Mapping[tuple[str, int], Mapping[str, int]]]
"""Per (topic, queue id): {consumer group: queue offset below which it consumed everything}.
A queue missing, or with no group, counts as consumed by nobody."""

NO_GROUP = "(no consumer group)"  # how messages of a topic nobody consumes are reported

_BLANK_SIZE = 0x7FFFFFFF  # a filler unit's size (consume_queue_format.BLANK_UNIT)


def _phys(handle: Any, queue_offset: int) -> int | None:
    """CommitLog offset of the unit at ``queue_offset`` (None: no unit, or a filler)."""
    units = handle.get_units(queue_offset, 1)
    if not units:
        return None
    phys, size, _code = units[0]
    return None if size == _BLANK_SIZE and phys == 0 else phys


def _first_at_or_past(handle: Any, phys: int, low: int, high: int) -> int:
    """The first queue offset in [low, high) whose unit points at or past CommitLog offset
    ``phys`` (units ascend along a queue); ``high`` if none. An unreadable unit or a filler
    counts as before it (fillers only lead a queue)."""
    while low < high:
        mid = (low + high) // 2
        at = _phys(handle, mid)
        if at is not None and at >= phys:
            high = mid
        else:
            low = mid + 1
    return low


def _queues(cq_store: Iterable[Any]) -> Iterable[tuple[Any, int, int]]:
    for handle in list(cq_store):
        low, high = handle.min_offset(), handle.max_offset()
        if low < high:
            yield handle, low, high


def consumption_floor(cq_store: Iterable[Any],
                      consumed: Mapping[tuple[str, int], Mapping[str, int]]) -> int | None:
    """The CommitLog offset below which every message is consumed by every group with
    progress on its topic (None: every message is; nothing holds the floor down)."""
    floor: int | None = None
    for handle, low, high in _queues(cq_store):
        groups = consumed.get((handle.topic, handle.queue_id)) or {}
        done = max(min(groups.values()), low) if groups else low
        if done >= high:
            continue
        phys = None
        for q in range(done, min(high, done + 64)):  # skip a filler or two
            phys = _phys(handle, q)
            if phys is not None:
                break
        if phys is None:
            phys = 0  # unreadable: hold everything
        floor = phys if floor is None else min(floor, phys)
    return floor


def unconsumed_below(cq_store: Iterable[Any],
                     consumed: Mapping[tuple[str, int], Mapping[str, int]],
                     end: int) -> dict[tuple[str, str], int]:
    """{(group, topic): messages below CommitLog offset ``end`` the group has not consumed};
    a topic no group consumes is reported under ``NO_GROUP``."""
    out: dict[tuple[str, str], int] = {}
    for handle, low, high in _queues(cq_store):
        below = _first_at_or_past(handle, end, low, high)
        if below <= low:
            continue
        groups = consumed.get((handle.topic, handle.queue_id)) or {NO_GROUP: low}
        for group, done in groups.items():
            n = below - max(done, low)
            if n > 0:
                key = (group, handle.topic)
                out[key] = out.get(key, 0) + n
    return out
