"""The rebuild's index writer: whole index files from numbered entries, with the bytes
``IndexService`` writes (``docs/formats/index-file.md``).

The dispatcher appends entries in CommitLog order and starts a new file when one holds
``maxIndexNum - 1`` entries, so entry ``n`` of the whole index (0-based) is entry
``n % (maxIndexNum - 1) + 1`` of file ``n // (maxIndexNum - 1)``. Given a file's entries in
order, its bytes follow without replaying the inserts: each entry's ``prev_entry`` is the
previous entry of the same slot, a slot holds the newest entry that hashes to it, and the
header has the first and last entry's record (offset, store time), the slots in use and the
count. File names are creation times, as RocketMQ's: the run's start plus the file number in
milliseconds, so they sort in file order.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import numpy as np

from stratamq.config import INT_MAX
from stratamq.spark.pipelines.dispatch_rows import Entries
from stratamq.store.index_file import HEADER, HEADER_SIZE, SLOT_SIZE, file_name_for, file_size

ENTRY_DTYPE = np.dtype([("hash", ">i4"), ("phys", ">i8"), ("diff", ">i4"), ("prev", ">i4")])


def file_name(base_ms: int, number: int) -> str:
    return file_name_for(base_ms + number)


def write_index_file(path: Path, entries: Entries, hash_slot_num: int,
                     index_num: int) -> tuple[int, int]:
    """Write one whole index file of ``entries`` (at most ``index_num - 1``); returns its
    (end time, end offset)."""
    n = len(entries)
    if not 0 < n < index_num:
        raise ValueError(f"an index file holds 1 to {index_num - 1} entries, not {n}")
    hashes = entries.hash.astype(np.int64)
    numbers = np.arange(1, n + 1, dtype=np.int64)
    slots = hashes % hash_slot_num
    order = np.argsort(slots, kind="stable")
    in_order = slots[order]
    same = in_order[1:] == in_order[:-1]
    prev_sorted = np.zeros(n, dtype=np.int64)
    prev_sorted[1:][same] = numbers[order][:-1][same]
    prev = np.empty(n, dtype=np.int64)
    prev[order] = prev_sorted
    newest = np.ones(n, dtype=bool)  # the last entry of each slot's run heads its list
    newest[:-1] = ~same
    begin_ts, begin_phys = int(entries.ts[0]), int(entries.phys[0])
    if begin_ts > 0:
        diff = np.clip((entries.ts - begin_ts) // 1000, 0, INT_MAX)
    else:
        diff = np.zeros(n, dtype=np.int64)
    table = np.empty(n, dtype=ENTRY_DTYPE)
    table["hash"], table["phys"], table["diff"], table["prev"] = hashes, entries.phys, diff, prev
    header = HEADER.pack(begin_ts, int(entries.ts[-1]), begin_phys, int(entries.phys[-1]),
                         int(newest.sum()), n + 1)
    size = file_size(hash_slot_num, index_num)
    entries_at = HEADER_SIZE + hash_slot_num * SLOT_SIZE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.ftruncate(fd, size)  # sparse, as IndexFile creates it
        with mmap.mmap(fd, size) as m:
            m[:HEADER_SIZE] = header
            slot_view = np.ndarray((hash_slot_num,), dtype=">i4", buffer=m, offset=HEADER_SIZE)
            slot_view[in_order[newest]] = numbers[order][newest]
            del slot_view
            start = entries_at + ENTRY_DTYPE.itemsize  # entry 0 is never used
            m[start:start + n * ENTRY_DTYPE.itemsize] = table.tobytes()
            m.flush()
        os.fdatasync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return int(entries.ts[-1]), int(entries.phys[-1])
