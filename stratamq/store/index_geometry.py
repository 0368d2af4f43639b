"""Which geometry an index file was written with, read from the file alone.

An index file's size is ``40 + 4 * maxHashSlotNum + 20 * maxIndexNum`` (``docs/formats/
index-file.md``), so a store whose broker ran with other settings than the reader's, or one
Apache RocketMQ wrote with its defaults, has files of another size. They are as valid as any:
``IndexService`` serves them with the geometry found here instead of dropping them.
"""

from __future__ import annotations

import mmap
from collections.abc import Sequence
from pathlib import Path

from stratamq.store.index_file import (
    ENTRY,
    ENTRY_SIZE,
    HEADER_SIZE,
    SLOT,
    SLOT_SIZE,
    IndexHeader,
    file_size,
)

__all__ = ["ROCKETMQ_DEFAULT_GEOMETRY", "infer_geometry"]

# RocketMQ's default geometry (maxHashSlotNum, maxIndexNum): what a stock broker writes.
ROCKETMQ_DEFAULT_GEOMETRY = (5_000_000, 20_000_000)


def infer_geometry(path: Path, preferred: Sequence[tuple[int, int]] = ()
                   ) -> tuple[int, int] | None:
    """The (hash_slot_num, index_num) ``path`` was written with, read from the file itself.

    The size pins the geometry to the pairs with ``40 + 4*slots + 20*entries == size``. A file
    with entries pins it further: its newest entry (number ``index_count - 1``) must hold the
    header's ``end_phy_offset``, link back to an older entry, and be the head of the slot its
    hash falls in. Those checks run over every candidate at once (a strided numpy view of the
    entry that candidate puts there), so even a 420 MB file costs one pass. ``preferred``
    geometries (the configured one first) are tried before any other and win a tie; an empty
    file of a size no preferred geometry has, or a file several geometries fit equally, is
    None: nothing can be served from it with certainty.
    """
    try:
        size = path.stat().st_size
        with path.open("rb") as fh:
            if size < HEADER_SIZE + SLOT_SIZE + 2 * ENTRY_SIZE:
                return None
            header = IndexHeader.unpack(fh.read(HEADER_SIZE))
            fitting = [g for g in (*preferred, ROCKETMQ_DEFAULT_GEOMETRY)
                       if file_size(*g) == size]
            count = header.index_count
            if count <= 1:
                return fitting[0] if fitting else None
            if count > (size - HEADER_SIZE - SLOT_SIZE) // ENTRY_SIZE:
                return None
            with mmap.mmap(fh.fileno(), size, access=mmap.ACCESS_READ) as m:
                for geometry in fitting:
                    if _newest_entry_fits(m, header, *geometry):
                        return geometry
                found = _search_geometry(m, size, header)
    except (OSError, ValueError):
        return None
    return found


def _newest_entry_fits(m: mmap.mmap, header: IndexHeader, slots: int, entries: int) -> bool:
    count = header.index_count
    if count > entries or header.hash_slot_count > slots:
        return False
    at = HEADER_SIZE + slots * SLOT_SIZE + (count - 1) * ENTRY_SIZE
    hash_, phys, _diff, prev = ENTRY.unpack_from(m, at)
    if phys != header.end_phy_offset or not 0 <= prev < count - 1 or hash_ < 0:
        return False
    (head,) = SLOT.unpack_from(m, HEADER_SIZE + (hash_ % slots) * SLOT_SIZE)
    return head == count - 1


def _search_geometry(m: mmap.mmap, size: int, header: IndexHeader) -> tuple[int, int] | None:
    import numpy as np

    count = header.index_count
    body = size - HEADER_SIZE  # = 4 * slots + 20 * entries
    # slots must make (body - 4*slots) a multiple of 20: slots = first + 5k. The newest entry
    # of candidate k then starts 20*k bytes after that of k = 0, so one strided view reads the
    # field of every candidate.
    first = next((s for s in range(1, 6) if (body - 4 * s) % ENTRY_SIZE == 0), None)
    if first is None:
        return None
    most_slots = (body - count * ENTRY_SIZE) // SLOT_SIZE  # entries >= count
    if most_slots < first:
        return None
    n = (most_slots - first) // 5 + 1
    base = HEADER_SIZE + first * SLOT_SIZE + (count - 1) * ENTRY_SIZE

    def field(offset: int, dtype: str) -> np.ndarray:
        return np.ndarray((n,), dtype=dtype, buffer=m, offset=base + offset,
                          strides=(ENTRY_SIZE,))

    phys = field(4, ">i8")
    prev = field(16, ">i4")
    hashes = field(0, ">i4")
    candidates = np.nonzero((phys == header.end_phy_offset) & (prev >= 0) & (prev < count - 1)
                            & (hashes >= 0))[0]
    slots = first + 5 * candidates.astype(np.int64)
    ok = slots >= max(header.hash_slot_count, 1)
    candidates, slots = candidates[ok], slots[ok]
    if len(candidates) == 0:
        return None
    slot_at = HEADER_SIZE + (hashes[candidates].astype(np.int64) % slots) * SLOT_SIZE
    table = np.frombuffer(m, dtype=np.uint8)
    heads = (table[slot_at].astype(np.int64) << 24 | table[slot_at + 1].astype(np.int64) << 16
             | table[slot_at + 2].astype(np.int64) << 8 | table[slot_at + 3].astype(np.int64))
    found = slots[heads == count - 1]
    if len(found) != 1:
        return None
    hash_slot_num = int(found[0])
    return hash_slot_num, (body - hash_slot_num * SLOT_SIZE) // ENTRY_SIZE
