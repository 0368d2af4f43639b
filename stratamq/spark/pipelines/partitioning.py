"""Range partitioning of ConsumeQueue units by (topic, queue, chunk), bounded in bytes.

A write task owns a contiguous range of the key order ``(topic length, topic bytes, queue id,
chunk)``, which is the RocksDB ConsumeQueue's key order (``docs/formats/rocksdb-consumequeue.md``:
length first, big-endian numbers). A chunk is ``queue offset // chunk_units``: for files, one
ConsumeQueue file, so a file is never split between tasks. The bounds come from samples each
read task returns (at most ``SAMPLES`` keys with weights, as Spark's own RangePartitioner
samples), cut so that each range holds about the same number of units; the driver never sees
the units themselves.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

Key = tuple[int, bytes, int, int]  # topic byte length, topic bytes, queue id (u32), chunk
SAMPLES = 512  # keys one read task returns at most


def _column(units: pa.RecordBatch | pa.Table, name: str) -> pa.Array:
    column = units.column(name)
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


def _queue_groups(units: pa.RecordBatch | pa.Table) -> tuple[list[tuple[int, bytes, int]],
                                                            np.ndarray]:
    """The distinct (topic length, topic bytes, queue id as u32) of the rows, and each row's
    index into them."""
    topics = pc.dictionary_encode(_column(units, "topic"))
    names = [t.encode("utf-8") for t in topics.dictionary.to_pylist()]
    qids = _column(units, "queue_id").to_numpy().astype(np.int64) & 0xFFFF_FFFF
    combined = topics.indices.to_numpy().astype(np.int64) << 32 | qids
    distinct, inverse = np.unique(combined, return_inverse=True)
    groups = [(len(names[c >> 32]), names[c >> 32], c & 0xFFFF_FFFF) for c in distinct.tolist()]
    return groups, inverse.reshape(-1)


def samples(units: pa.RecordBatch | pa.Table, chunk_units: int,
            limit: int = SAMPLES) -> list[tuple[Key, int]]:
    """Keys of the rows' chunks with their row counts; at most ``limit`` of them (quantiles of
    the sorted keys, each carrying the rows up to the next) when there are more."""
    if not units.num_rows:
        return []
    groups, inverse = _queue_groups(units)
    chunks = _column(units, "queue_offset").to_numpy() // chunk_units
    combined = inverse.astype(np.int64) << 40 | chunks  # group index, then chunk
    distinct, counts = np.unique(combined, return_counts=True)
    keyed = sorted(((*groups[int(c >> 40)], int(c & (1 << 40) - 1)), int(n))
                   for c, n in zip(distinct.tolist(), counts.tolist()))
    if len(keyed) <= limit:
        return keyed
    total = sum(n for _, n in keyed)
    step = total / limit
    out: list[tuple[Key, int]] = []
    carried, next_cut = 0, 0.0
    for key, n in keyed:
        if carried >= next_cut or not out:
            out.append((key, 0))
            next_cut = carried + step
        out[-1] = (out[-1][0], out[-1][1] + n)
        carried += n
    return out


def range_bounds(sampled: Iterable[tuple[Key, int]], partitions: int) -> list[Key]:
    """Start keys of partitions 1 .. n-1 (n <= ``partitions``), each range holding about the
    same weight. Partition ``i`` holds keys in ``[bounds[i-1], bounds[i])``."""
    weights: dict[Key, int] = {}
    for key, n in sampled:
        weights[key] = weights.get(key, 0) + n
    keys = sorted(weights)
    total = sum(weights.values())
    if partitions <= 1 or not keys:
        return []
    target = total / partitions
    bounds: list[Key] = []
    filled = 0
    for key in keys:
        if filled >= target * (len(bounds) + 1) and len(bounds) < partitions - 1:
            bounds.append(key)
        filled += weights[key]
    return bounds


def route(units: pa.RecordBatch, bounds: list[Key], chunk_units: int) -> np.ndarray:
    """Each row's partition: the number of bounds at or below its key."""
    n = units.num_rows
    if not bounds or not n:
        return np.zeros(n, dtype=np.int64)
    groups, inverse = _queue_groups(units)
    chunks = _column(units, "queue_offset").to_numpy() // chunk_units
    out = np.empty(n, dtype=np.int64)
    order = np.argsort(inverse, kind="stable")
    edges = np.flatnonzero(np.diff(inverse[order])) + 1
    for group, rows in zip(groups, np.split(order, edges)):
        lo = bisect.bisect_left(bounds, (*group, -1))
        hi = bisect.bisect_left(bounds, (group[0], group[1], group[2] + 1, -1))
        inside = np.array([b[3] for b in bounds[lo:hi]], dtype=np.int64)
        out[rows] = lo + np.searchsorted(inside, chunks[rows], side="right")
    return out


def split_by(batch: pa.RecordBatch, pids: np.ndarray) -> Iterable[tuple[int, pa.RecordBatch]]:
    """(partition, its rows) for each partition the rows go to; each piece is compact (a
    ``take``), so pickling it ships its rows only."""
    order = np.argsort(pids, kind="stable")
    sorted_pids = pids[order]
    edges = np.flatnonzero(np.diff(sorted_pids)) + 1
    for rows in np.split(order, edges):
        if len(rows):
            yield int(pids[rows[0]]), batch.take(pa.array(rows))
