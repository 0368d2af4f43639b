"""The offload's writers (executor side): a task's chunks of queues as tier CommitLog and
ConsumeQueue files, and whole sealed tier index files, in the tier's own layout and formats
(``docs/formats/tier-layout.md``, ``tier-index.md``) through its drivers.

A chunk is a run of one queue's messages (by queue offset) whose place in the queue's tier
CommitLog the driver fixed before any task ran: its records go, in queue order, byte for byte,
into CommitLog files starting at the chunk's base offset (a new file every
``tieredStoreCommitLogMaxSize``), and its units (tier CommitLog offset, size, tags code) into a
ConsumeQueue file named by the chunk's first queue offset. Contents are fixed by the source
and the plan, so a retried task or a rerun writes the same bytes at the same names.

A file is written whole or not at all: on POSIX to a temporary name renamed over the final one,
on an object store as one part (one put). A file already there at its full size is left alone:
a rerun after a killed run writes only what is missing, and a file is never visible half
written.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from stratamq.config import StoreConfig, tier_provider
from stratamq.fileutil import atomic_write
from stratamq.spark.pipelines.common import PipelineError
from stratamq.tiered.naming import FileSegmentType, queue_file_path, segment_path

UNIT_DTYPE = np.dtype([("offset", ">i8"), ("size", ">i4"), ("code", ">i8")])
# A file of the tier, for the metadata: (type, queue path, base offset, size, first and last
# store time, 1 if this run wrote it / 0 if it was there already).
FileRow = tuple[int, str, int, int, int, int, int]


@dataclass
class QueuePlan:
    """Where each chunk of one queue goes: chunk ``i`` holds queue offsets
    ``[starts[i], starts[i+1])``, starts at byte ``bases[i]`` of the queue's tier CommitLog
    and is written by task ``tasks[i]``."""

    starts: np.ndarray
    bases: np.ndarray
    tasks: np.ndarray


class TierWriter:
    """Writes whole files of one broker's tier (executor side; one per task)."""

    def __init__(self, config: StoreConfig, cluster: str) -> None:
        from stratamq.tiered.drivers import FileSegmentFactory

        self.config, self.cluster = config, cluster
        self.provider = tier_provider(config)
        self.factory = FileSegmentFactory(config, cluster)

    def write(self, file_type: FileSegmentType, file_path: str, base: int, data: bytes,
              first_ts: int, last_ts: int) -> FileRow:
        if self.provider == "posix":
            path = Path(self.factory.full_path(segment_path(self.cluster, file_path, file_type,
                                                            base)))
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                size = -1
            if size == len(data):
                return int(file_type), file_path, base, len(data), first_ts, last_ts, 0
            atomic_write(path, data)  # a tier file is final: its name is synced too
        else:
            segment = self.factory.create_segment(file_type, file_path, base)
            size = segment.get_size()
            if size == len(data):
                return int(file_type), file_path, base, len(data), first_ts, last_ts, 0
            if size:
                raise PipelineError(f"tier file {segment.path} holds {size} bytes, not the "
                                    f"{len(data)} this offload writes there: another writer "
                                    "uses this tier location")
            from stratamq.tiered.drivers import AppendResult

            if segment.append(data, first_ts, last_ts) is not AppendResult.SUCCESS \
                    or not segment.commit():
                raise PipelineError(f"cannot upload tier file {segment.path}")
        return int(file_type), file_path, base, len(data), first_ts, last_ts, 1


def write_chunks(batches: Iterable[pa.RecordBatch], plans: dict[tuple[str, int], QueuePlan],
                 config: StoreConfig, cluster: str, broker: str, topic_ids: dict[str, int],
                 items_per_file: int, counters: Any) -> Iterator[tuple]:
    """Write the chunks of a task's rows; yields ("file", FileRow) per file and
    ("idx", index file number, (numbers, hash, topic id, queue id, offset, size, time))
    per index file the rows' keys go to."""
    from stratamq.spark.pipelines.offload_rows import key_hash_list

    parts = [b for b in batches if b.num_rows]
    if not parts:
        return
    table = pa.Table.from_batches(parts).combine_chunks()
    table = table.sort_by([("topic", "ascending"), ("queue_id", "ascending"),
                           ("queue_offset", "ascending"), ("phys", "ascending")])
    writer = TierWriter(config, cluster)
    cl_max = config.tiered_store_commit_log_max_size
    cq_max = writer.factory.limits.consume_queue_max_size // UNIT_DTYPE.itemsize
    offsets = table.column("queue_offset").to_numpy()
    sizes = table.column("size").to_numpy().astype(np.int64)
    times = table.column("store_ts").to_numpy()
    codes = table.column("tags_code").to_numpy()
    records = table.column("record").chunk(0)
    record_ends = np.frombuffer(records.buffers()[1], dtype=np.int32, count=len(records) + 1,
                                offset=records.offset * 4).astype(np.int64)
    record_data = records.buffers()[2]
    flat = np.zeros(table.num_rows, dtype=np.int64)
    topics = table.column("topic").chunk(0)
    qids = table.column("queue_id").to_numpy()
    names = topics.dictionary_encode()
    topic_idx = names.indices.to_numpy()
    edges = np.flatnonzero((np.diff(topic_idx) != 0) | (np.diff(qids) != 0)) + 1
    for a, b in zip(np.concatenate([[0], edges]).tolist(),
                    np.concatenate([edges, [table.num_rows]]).tolist()):
        topic, qid = names.dictionary[topic_idx[a]].as_py(), int(qids[a])
        plan = plans[(topic, qid)]
        path = queue_file_path(broker, topic, qid)
        q = offsets[a:b]
        twice = np.flatnonzero(q[1:] == q[:-1])
        if len(twice):
            raise PipelineError(f"{topic}/{qid}: queue offset {q[twice[0]]} is stored twice "
                                "in the CommitLog (a log not written by one broker in order): "
                                "it cannot be offloaded as one queue")
        chunk_of = np.searchsorted(plan.starts, q, side="right") - 1
        for c in np.unique(chunk_of).tolist():
            rows = np.flatnonzero(chunk_of == c) + a
            flat[rows] = plan.bases[c] + np.concatenate([[0], np.cumsum(sizes[rows])[:-1]])
            yield from (("file", row) for row in _chunk_files(
                writer, path, rows, flat, offsets, sizes, times, codes, record_ends,
                record_data, cl_max, cq_max))
            counters.rows.add(len(rows))
            counters.bytes.add(int(sizes[rows].sum()))
    # Index items: keys of every kept row, numbered as the driver planned.
    if items_per_file > 0:
        rows, hashes = key_hash_list(topics.cast(pa.string()), table.column("keys").chunk(0))
        first_item = table.column("first_item").to_numpy()
        within = np.arange(len(rows)) - np.searchsorted(rows, rows, side="left")
        numbers = first_item[rows] + within
        ids = np.array([topic_ids[t] for t in names.dictionary.to_pylist()], dtype=np.int64)
        files = numbers // items_per_file
        order = np.argsort(files, kind="stable")
        cut = np.flatnonzero(np.diff(files[order])) + 1
        for part in np.split(order, cut):
            if not len(part):
                continue
            r = rows[part]
            yield ("idx", int(files[part[0]]), (
                numbers[part], hashes[part], ids[topic_idx[r]], qids[r].astype(np.int64),
                flat[r], sizes[r], times[r]))


def _chunk_files(writer: TierWriter, path: str, rows: np.ndarray, flat: np.ndarray,
                 offsets: np.ndarray, sizes: np.ndarray, times: np.ndarray, codes: np.ndarray,
                 record_ends: np.ndarray, record_data: pa.Buffer, cl_max: int,
                 cq_max: int) -> Iterator[FileRow]:
    """One chunk's CommitLog file(s) (a new one where the next record would pass
    ``cl_max``) and ConsumeQueue file(s) (a new one at a gap in queue offsets, or every
    ``cq_max`` units)."""
    base = int(flat[rows[0]])
    ends = flat[rows] + sizes[rows] - base
    start = 0
    while start < len(rows):
        # The records that fit a file of cl_max bytes from this one on (at least one).
        limit = (ends[start] - sizes[rows[start]]) + cl_max
        stop = max(start + 1, int(np.searchsorted(ends, limit, side="right")))
        piece = rows[start:stop]
        data = b"".join(_record_bytes(record_data, record_ends, piece))
        yield writer.write(FileSegmentType.COMMIT_LOG, path, int(flat[piece[0]]), data,
                           int(times[piece].min()), int(times[piece].max()))
        start = stop
    q = offsets[rows]
    runs = np.flatnonzero(np.diff(q) != 1) + 1
    for run in np.split(np.arange(len(rows)), runs):
        for at in range(0, len(run), cq_max):
            piece = rows[run[at:at + cq_max]]
            units = np.empty(len(piece), dtype=UNIT_DTYPE)
            units["offset"], units["size"], units["code"] = flat[piece], sizes[piece], \
                codes[piece]
            yield writer.write(FileSegmentType.CONSUME_QUEUE, path,
                               int(offsets[piece[0]]) * UNIT_DTYPE.itemsize, units.tobytes(),
                               int(times[piece].min()), int(times[piece].max()))


def _record_bytes(data: pa.Buffer, ends: np.ndarray, rows: np.ndarray) -> Iterator[memoryview]:
    """The rows' record bytes (rows of a sorted table: runs of consecutive rows are one
    slice)."""
    view = memoryview(data)
    breaks = np.flatnonzero(np.diff(rows) != 1) + 1
    for run in np.split(rows, breaks):
        yield view[int(ends[run[0]]):int(ends[run[-1] + 1])]


def write_index_files(items: Iterable[tuple[str, int, tuple]], config: StoreConfig,
                      cluster: str, broker: str, bases: list[int], counts: list[int],
                      counters: Any) -> Iterator[FileRow]:
    """Whole sealed tier index files from their items (numbered globally: an item's place in
    its file is its number's order); yields each file's FileRow."""
    from stratamq.tiered.naming import index_file_path

    by_file: dict[int, list[tuple]] = {}
    for _kind, number, arrays in items:
        by_file.setdefault(number, []).append(arrays)
    writer = TierWriter(config, cluster)
    slots = config.tiered_store_index_file_max_hash_slot_num
    for number, parts in sorted(by_file.items()):
        columns = [np.concatenate([p[i] for p in parts]) for i in range(7)]
        order = np.argsort(columns[0], kind="stable")
        columns = [c[order] for c in columns]
        if len(order) != counts[number]:
            raise PipelineError(f"tier index file {number}: {len(order)} items arrived, "
                                f"{counts[number]} expected")
        data, begin, end = sealed_index(*columns[1:], slots=slots)
        counters.rows.add(len(order))
        counters.bytes.add(len(data))
        row = writer.write(FileSegmentType.INDEX, index_file_path(broker), bases[number], data,
                           int(columns[6].min()), int(columns[6].max()))
        yield row


def sealed_index(hashes: np.ndarray, topic_ids: np.ndarray, queue_ids: np.ndarray,
                 offsets: np.ndarray, sizes: np.ndarray, times: np.ndarray, *,
                 slots: int) -> tuple[bytes, int, int]:
    """A SEALED tier index file of items in insertion order (``index_file.compact``'s layout:
    each slot's items contiguous, newest first); returns (bytes, begin time, end time)."""
    from stratamq.tiered.index_file import (
        COMPACT_ITEM_SIZE,
        END_MAGIC_CODE,
        HEADER,
        HEADER_SIZE,
        SLOT_SIZE,
    )

    n = len(hashes)
    begin = int(times[0])
    end = max(begin, int(times.max()))
    numbers = np.arange(1, n + 1)
    slot_of = hashes.astype(np.int64) % slots
    order = np.lexsort((-numbers, slot_of))
    items = np.empty(n, dtype=np.dtype([("hash", ">i4"), ("topic_id", ">i4"),
                                        ("queue_id", ">i4"), ("offset", ">i8"),
                                        ("size", ">i4"), ("time_diff", ">i4")]))
    items["hash"], items["topic_id"], items["queue_id"] = (hashes[order], topic_ids[order],
                                                           queue_ids[order])
    items["offset"], items["size"] = offsets[order], sizes[order]
    items["time_diff"] = np.clip((times[order] - begin) // 1000, -(2**31), 2**31 - 1)
    assert items.itemsize == COMPACT_ITEM_SIZE
    lengths = np.bincount(slot_of, minlength=slots).astype(np.int64) * COMPACT_ITEM_SIZE
    table = np.empty(slots, dtype=np.dtype([("position", ">i4"), ("length", ">i4")]))
    table["position"] = HEADER_SIZE + slots * SLOT_SIZE + np.concatenate(
        ([0], np.cumsum(lengths)[:-1]))
    table["length"] = lengths
    header = HEADER.pack(END_MAGIC_CODE, begin, end, int(np.count_nonzero(lengths)), n)
    return header + table.tobytes() + items.tobytes(), begin, end


def sealed_size(slots: int, items: int) -> int:
    from stratamq.tiered.index_file import COMPACT_ITEM_SIZE, HEADER_SIZE, SLOT_SIZE

    return HEADER_SIZE + slots * SLOT_SIZE + items * COMPACT_ITEM_SIZE


def stat_tier(path: str) -> int:
    """Size of a POSIX tier file (-1 when absent), for tests and checks."""
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return -1
