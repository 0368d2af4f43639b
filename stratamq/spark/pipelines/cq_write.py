"""The rebuild's ConsumeQueue writers: one write task's range of (topic, queue, chunk), as
ConsumeQueue files or as a RocksDB SST file, with the bytes the store's own dispatcher writes.

Files (``docs/formats/consumequeue-unit.md``, ``store/consume_queue.py`` ``put_unit``): a queue's
files start at the file holding its first unit; positions before a queue's first unit, and in
any gap, hold blank units (offset 0, size 2^31-1, code 0); after its last unit, zeros. A file
is created at its full size (sparse) as ``MappedFile`` does. Like the dispatcher, a record
whose queue offset was already taken is skipped (the first in CommitLog order wins).

RocksDB (``docs/formats/rocksdb-consumequeue.md``, ``RocksDBConsumeQueueStore.dispatch``): one
row per unit in key order, a later record of the same queue offset replacing an earlier one as
the dispatcher's put does; each task also returns, per queue, its first and last record in
CommitLog order, from which the offset table's ``min`` / ``max`` rows are made.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stratamq.spark.pipelines.common import PipelineError, is_name_error, write_file
from stratamq.spark.pipelines.dispatch_rows import UNIT_SCHEMA
from stratamq.store.consume_queue_format import UNIT_SIZE
from stratamq.store.layout import StoreLayout, segment_name
from stratamq.store.rocksdb_cq_format import (
    CHECKPOINT_KEY,
    CTRL_1,
    I64,
    OFFSET_VALUE,
    offset_key,
    queue_prefix,
    rocksdb_options,
)

log = logging.getLogger(__name__)

UNIT_DTYPE = np.dtype([("phys", ">i8"), ("size", ">i4"), ("code", ">i8")])
BLANK = np.array([(0, 0x7FFF_FFFF, 0)], dtype=UNIT_DTYPE)[0]
CQ_ROW_DTYPE = np.dtype([("phys", ">i8"), ("size", ">i4"), ("code", ">i8"), ("ts", ">i8")])
KEY_TAIL_DTYPE = np.dtype([("ctrl", "u1"), ("offset", ">i8")])
# Per queue: first record (phys, queue offset), last record (phys, queue offset, end).
Summary = tuple[int, int, int, int, int]
CHECKPOINT = (b"", -1)  # the summary key of each task's newest record: the checkpoint row


def _table(batches: Iterable[pa.RecordBatch]) -> pa.Table:
    return pa.Table.from_batches(list(batches), schema=UNIT_SCHEMA)


def _queues(table: pa.Table) -> Iterator[tuple[str, int, slice]]:
    """(topic, queue id, row slice) of each queue of a table sorted by topic and queue."""
    if not table.num_rows:
        return
    topics = pc.dictionary_encode(table.column("topic")).combine_chunks()
    names = topics.dictionary.to_pylist()
    idx = topics.indices.to_numpy()
    qids = table.column("queue_id").to_numpy()
    edges = np.flatnonzero((np.diff(idx) != 0) | (np.diff(qids) != 0)) + 1
    starts = np.concatenate([[0], edges])
    ends = np.concatenate([edges, [table.num_rows]])
    for a, b in zip(starts.tolist(), ends.tolist()):
        yield names[idx[a]], int(qids[a]), slice(a, b)


def write_files(batches: Iterable[pa.RecordBatch], out: str, file_size: int,
                counters: tuple | None = None) -> Iterator[tuple[int, int, int]]:
    """Write the ConsumeQueue files of the rows' queues under ``out`` (a store root's layout);
    yields one (files, units, skipped records) count for the task."""
    table = _table(batches).sort_by([("topic", "ascending"), ("queue_id", "ascending"),
                                     ("queue_offset", "ascending"), ("phys", "ascending")])
    layout = StoreLayout(out)
    per_file = file_size // UNIT_SIZE
    offsets = table.column("queue_offset").to_numpy()
    phys = table.column("phys").to_numpy()
    sizes = table.column("size").to_numpy()
    codes = table.column("tags_code").to_numpy()
    files = units = skipped = 0
    for topic, qid, rows in _queues(table):
        q = offsets[rows]
        keep = np.ones(len(q), dtype=bool)
        keep[1:] = q[1:] != q[:-1]  # an offset taken twice: the earlier record has it
        q, p = q[keep], phys[rows][keep]
        bad = np.flatnonzero(np.diff(p) <= 0)
        if len(bad):
            at = int(bad[0])
            raise PipelineError(
                f"{topic}/{qid}: queue offset {q[at + 1]} is at CommitLog offset "
                f"{p[at + 1]}, before offset {q[at]} (at {p[at]}): the CommitLog's queue "
                "offsets do not follow its order, which the store's dispatcher resolves one "
                "record at a time; rebuild this store with `stratamq store migrate-cq` or by "
                "opening it")
        try:
            directory = layout.consume_queue_dir(topic, qid)
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            if not is_name_error(exc):
                raise
            log.error("skipped %d records of topic %r: it cannot be a directory name (%s)",
                      len(q), topic[:80], exc)
            skipped += len(q)
            continue
        unit = np.empty(len(q), dtype=UNIT_DTYPE)
        unit["phys"], unit["size"], unit["code"] = p, sizes[rows][keep], codes[rows][keep]
        first_file, last = int(q[0]) // per_file, int(q[-1])
        for f in range(first_file, last // per_file + 1):
            start = f * per_file
            used = min(per_file, last + 1 - start)
            content = np.full(used, BLANK, dtype=UNIT_DTYPE)
            lo, hi = np.searchsorted(q, [start, start + used])
            content[q[lo:hi] - start] = unit[lo:hi]
            write_file(directory / segment_name(start * UNIT_SIZE), content.tobytes(),
                       file_size)
            files += 1
        units += len(q)
        if counters is not None:
            counters[0].add(len(q))
            counters[1].add(len(q) * UNIT_SIZE)
    yield files, units, skipped


def write_sst(batches: Iterable[pa.RecordBatch], out: Path, name: str,
              counters: tuple | None = None) -> Iterator[tuple[tuple[bytes, int], Summary]]:
    """Write the rows' ConsumeQueue table rows to the SST file ``out/name`` (none if there are
    no rows) and yield per queue ((topic bytes, queue id), summary)."""
    from rocksdict import SstFileWriter

    table = _table(batches)
    if not table.num_rows:
        return
    topic_bin = table.column("topic").cast(pa.binary())
    keyed = pa.table({
        "tlen": pc.binary_length(topic_bin), "topic": topic_bin,
        "qid": pc.cast(table.column("queue_id"), pa.uint32(), safe=False),
        "queue_offset": table.column("queue_offset"), "phys": table.column("phys"),
        "row": pa.array(np.arange(table.num_rows)),
    })  # fmt: skip
    order = keyed.sort_by([(c, "ascending") for c in
                           ("tlen", "topic", "qid", "queue_offset", "phys")]).column("row")
    table = table.take(order)
    offsets = table.column("queue_offset").to_numpy()
    phys = table.column("phys").to_numpy()
    sizes = table.column("size").to_numpy()
    rows = np.empty(table.num_rows, dtype=CQ_ROW_DTYPE)
    rows["phys"], rows["size"] = phys, sizes
    rows["code"] = table.column("tags_code").to_numpy()
    rows["ts"] = table.column("store_ts").to_numpy()
    values = rows.tobytes()
    tails = np.empty(table.num_rows, dtype=KEY_TAIL_DTYPE)
    tails["ctrl"], tails["offset"] = CTRL_1[0], offsets
    tail_bytes = tails.tobytes()
    width, tail_width = CQ_ROW_DTYPE.itemsize, KEY_TAIL_DTYPE.itemsize
    out.mkdir(parents=True, exist_ok=True)
    path = out / name
    tmp = out / (name + ".tmp")
    writer = SstFileWriter(options=rocksdb_options())
    writer.open(str(tmp))
    written = 0
    newest: Summary | None = None
    for topic, qid, span in _queues_in_key_order(table):
        prefix = queue_prefix(topic.encode("utf-8"), qid)
        q, p = offsets[span], phys[span]
        # The dispatcher puts every record in CommitLog order: the last one of an offset stays.
        last = np.ones(len(q), dtype=bool)
        last[:-1] = q[1:] != q[:-1]
        for i in (np.flatnonzero(last) + span.start).tolist():
            writer[prefix + tail_bytes[i * tail_width:(i + 1) * tail_width]] = \
                values[i * width:(i + 1) * width]
        written += int(last.sum())
        first_at, last_at = int(np.argmin(p)), int(np.argmax(p))
        end = int(p[last_at]) + int(sizes[span][last_at])
        summary = (int(p[first_at]), int(q[first_at]), int(p[last_at]), int(q[last_at]), end)
        newest = summary if newest is None else merge_summaries(newest, summary)
        yield (topic.encode("utf-8"), qid), summary
    if newest is not None:  # the task's newest record, for the checkpoint row
        yield CHECKPOINT, newest
    writer.finish()
    with open(tmp, "rb") as fh:
        os.fdatasync(fh.fileno())
    os.replace(tmp, path)
    if counters is not None:
        counters[0].add(written)
        counters[1].add(written * (width + tail_width))


def _queues_in_key_order(table: pa.Table) -> Iterator[tuple[str, int, slice]]:
    """Queues of a table already sorted in key order (runs of equal topic and queue id)."""
    topic = table.column("topic").combine_chunks()
    qids = table.column("queue_id").to_numpy()
    same = pc.equal(topic.slice(1), topic.slice(0, len(topic) - 1)).to_numpy(
        zero_copy_only=False) if len(topic) > 1 else np.empty(0, bool)
    edges = np.flatnonzero(~same | (np.diff(qids) != 0)) + 1
    starts = np.concatenate([[0], edges])
    ends = np.concatenate([edges, [table.num_rows]])
    for a, b in zip(starts.tolist(), ends.tolist()):
        yield topic[a].as_py(), int(qids[a]), slice(a, b)


def merge_summaries(a: Summary, b: Summary) -> Summary:
    """One queue's summaries from two tasks: the first record is the lower physical offset,
    the last the higher."""
    first = a[:2] if a[0] <= b[0] else b[:2]
    last = a[2:] if a[2] >= b[2] else b[2:]
    return (*first, *last)


def offset_rows(queue: tuple[bytes, int], summary: Summary) -> list[tuple[bytes, bytes]]:
    """The offset table's ``max`` and ``min`` rows of a queue (value: phys, queue offset); for
    ``CHECKPOINT``, the checkpoint row (the end of the newest record a unit was written for,
    as the dispatcher's batches record it)."""
    if queue == CHECKPOINT:
        return [(CHECKPOINT_KEY, I64.pack(summary[4]))]
    topic, qid = queue
    return [(offset_key(topic, qid, True), OFFSET_VALUE.pack(summary[2], summary[3])),
            (offset_key(topic, qid, False), OFFSET_VALUE.pack(summary[0], summary[1]))]


def write_rows_sst(rows: Iterable[tuple[bytes, bytes]], out: Path, name: str
                   ) -> Iterator[int]:
    """Rows already in key order to the SST file ``out/name``; yields how many."""
    from rocksdict import SstFileWriter

    writer = None
    count = 0
    tmp = out / (name + ".tmp")
    for key, value in rows:
        if writer is None:
            out.mkdir(parents=True, exist_ok=True)
            writer = SstFileWriter(options=rocksdb_options())
            writer.open(str(tmp))
        writer[key] = value
        count += 1
    if writer is not None:
        writer.finish()
        with open(tmp, "rb") as fh:
            os.fdatasync(fh.fileno())
        os.replace(tmp, out / name)
    yield count
