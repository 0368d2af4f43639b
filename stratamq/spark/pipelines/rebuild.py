"""The rebuild pipeline: a store's ConsumeQueues (files or RocksDB) and index rebuilt from its
CommitLog in parallel, equal to what the store's own dispatcher builds.

    stratamq spark rebuild --store DIR --what cq|index|all [--store-type default|defaultRocksDB]
    python -m stratamq.spark.pipelines.rebuild --store DIR --what all
    spark-submit --master spark://... stratamq/spark/pipelines/rebuild.py --store DIR --what all

Stages (``docs/SPARK.md``, "Pipelines on a cluster"):

1. **read**: one task per CommitLog byte range (``common.commitlog_splits``) walks its records
   in place and keeps what the dispatchers take from them (``dispatch_rows``): units and
   index entries, cached by Spark (memory, then the executors' local disk). Each task returns
   counts and a sample of its (topic, queue, chunk) keys: all the driver learns.
2. **write consumequeue**: units go to range partitions of (topic, queue, ConsumeQueue file)
   bounded in bytes (``partitioning``); each task sorts its range and writes its queues' files,
   or one RocksDB SST file (``cq_write``). For RocksDB a small second shuffle merges each
   queue's first and last record into the offset table's rows, written as SST files too, and
   the driver ingests the SST files into a new RocksDB.
3. **write index**: entries are numbered from the read counts; file ``k`` holds entries
   ``k * (maxIndexNum - 1)`` on, and each task writes whole files (``index_write``). With
   ``--what all`` this job runs at the same time as stage 2's (both read the cached stage 1),
   so the cores its few tasks leave idle write ConsumeQueues.

Everything is written under ``<store>/spark-rebuild/`` and moved into place by the driver once
every task succeeded, so a failed or killed run leaves the store as it was. The driver holds
the store's lock throughout: no broker may open the store meanwhile.
"""

from __future__ import annotations

import argparse
import bisect
import logging
import math
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stratamq.config import StoreConfig
from stratamq.spark.pipelines.common import (
    PARTITION_BYTES,
    SPLIT_BYTES,
    PipelineError,
    commitlog_splits,
    min_tasks,
    run_main,
    store_dir,
    store_lock,
    swap_in,
    user_message,
)
from stratamq.spark.planning import LogSplit
from stratamq.store.consume_queue_format import UNIT_SIZE
from stratamq.store.consume_queue_store import (
    ROCKSDB_CQ_DIR,
    STORE_TYPE_FILES,
    STORE_TYPES,
    read_store_type,
    write_store_type,
)
from stratamq.store.index_file import ENTRY_SIZE
from stratamq.store.layout import StoreLayout
from stratamq.store.mapped_file_queue import MappedFileQueue

log = logging.getLogger(__name__)

WHATS = ("cq", "index", "all")
STAGING = "spark-rebuild"  # under the store root; never read by a store
ROCKSDB_CHUNK_UNITS = 65_536  # queue offsets per range-partitioning chunk (RocksDB rows)
ROCKSDB_ROW_BYTES = 48  # a ConsumeQueue row: ~20-byte key (short topic) + 28-byte value


@dataclass
class Plan:
    """What the driver decided from file listings and segment headers."""

    root: Path
    what: str
    store_type: str
    cq_file_size: int
    hash_slot_num: int
    index_num: int
    low: int
    end: int
    splits: list[LogSplit]
    deleted: dict[str, int]
    staging: Path
    base_ms: int = field(default_factory=lambda: int(time.time() * 1000))

    @property
    def cq(self) -> bool:
        return self.what in ("cq", "all")

    @property
    def index(self) -> bool:
        return self.what in ("index", "all")

    @property
    def chunk_units(self) -> int:
        if self.store_type == STORE_TYPE_FILES:
            return self.cq_file_size // UNIT_SIZE  # a file is never split between tasks
        return ROCKSDB_CHUNK_UNITS


def plan(root: Path, what: str, store_type: str | None, config: StoreConfig | None,
         split_bytes: int, min_splits: int) -> Plan:
    from stratamq.spark.reading import log_bounds
    from stratamq.store.deleted_topics import DeletedTopics

    if what not in WHATS:
        raise PipelineError(f"--what {what!r}: want one of {', '.join(WHATS)}")
    cfg = config or StoreConfig()
    layout = StoreLayout(root)
    try:
        recorded = read_store_type(root) or STORE_TYPE_FILES
        deleted = DeletedTopics(layout.deleted_topics, read_only=True).cutoffs
    except ValueError as exc:
        raise PipelineError(str(exc)) from None
    target = store_type or recorded
    if target not in STORE_TYPES:
        raise PipelineError(f"--store-type {target!r}: want one of {', '.join(STORE_TYPES)}")
    low, end = log_bounds(str(root))
    return Plan(root, what, target, _cq_file_size(layout, cfg), cfg.max_hash_slot_num,
                cfg.max_index_num, low, end, commitlog_splits(root, low, end, split_bytes,
                                                               min_splits),
                deleted, root / STAGING)


def _cq_file_size(layout: StoreLayout, cfg: StoreConfig) -> int:
    """The size the store's ConsumeQueue files have (one of its queues', if any is left),
    else the configured one: a rebuild must not change the files' geometry."""
    root = layout.consumequeue_dir
    if root.is_dir():
        for topic in root.iterdir():
            for queue in (topic.iterdir() if topic.is_dir() else ()):
                size = MappedFileQueue.size_on_disk(queue) if queue.is_dir() else None
                if size and size % UNIT_SIZE == 0:
                    return size
    return cfg.cq_file_size


def run_rebuild(spark: Any, store: str, what: str, store_type: str | None = None, *,
                config: StoreConfig | None = None, progress: bool = True,
                split_bytes: int = SPLIT_BYTES,
                partition_bytes: int = PARTITION_BYTES) -> dict[str, Any]:
    """Rebuild and swap in; returns the summary (counts, seconds per stage)."""
    from stratamq.spark.pipelines.progress import PipelineProgress

    root = store_dir(store)
    sc = spark.sparkContext
    started = time.monotonic()
    with store_lock(root):
        p = plan(root, what, store_type, config, split_bytes, min_tasks(sc))
        shutil.rmtree(p.staging, ignore_errors=True)  # a killed run's leftovers
        p.staging.mkdir()
        bar = PipelineProgress(sc, "rebuild", quiet=not progress)
        try:
            summary = _Job(sc, p, bar, partition_bytes).run()
        except Exception as exc:
            shutil.rmtree(p.staging, ignore_errors=True)
            if isinstance(exc, PipelineError):
                raise
            raise PipelineError(f"rebuild of {store} failed, the store is unchanged: "
                                f"{user_message(exc)}") from exc
        shutil.rmtree(p.staging, ignore_errors=True)
    return {"ok": True, "store": str(root), "what": what, "store_type": p.store_type,
            "commitlog_bytes": p.end - p.low, "splits": len(p.splits), **summary,
            "stages": bar.stages, "seconds": round(time.monotonic() - started, 3)}


class _Job:
    """One rebuild's Spark jobs (driver side)."""

    def __init__(self, sc: Any, plan: Plan, bar: Any, partition_bytes: int) -> None:
        self.sc, self.p, self.bar, self.partition_bytes = sc, plan, bar, partition_bytes
        self._index_end_ts: int | None = None  # store time of the newest index entry written

    def run(self) -> dict[str, Any]:
        from pyspark import StorageLevel

        p = self.p
        out: dict[str, Any] = {}
        with self.bar.stage("read", total_bytes=p.end - p.low) as counters:
            decoded = self._decoded(counters).persist(StorageLevel.MEMORY_AND_DISK)
            chunk_units = p.chunk_units
            info = decoded.mapPartitions(lambda it: _summarise(it, chunk_units)).collect()
        try:
            units = sum(i[1] for i in info)
            entries = [i[2] for i in sorted(info)]
            out["records"] = units
            if p.cq and p.index:
                # Two Spark jobs at once (a driver thread each): the index is written by one
                # task per 20M-entry file, so alone it would leave the other cores idle; the
                # scheduler gives them the ConsumeQueue tasks meanwhile. The index job goes
                # first, as its single writing task is the longest.
                from concurrent.futures import ThreadPoolExecutor

                with ThreadPoolExecutor(1, thread_name_prefix="rebuild-index") as pool:
                    index = pool.submit(self._write_index, decoded, entries)
                    try:
                        out.update(self._write_cq(decoded, info, units))
                    finally:
                        out.update(index.result())
            elif p.cq:
                out.update(self._write_cq(decoded, info, units))
            elif p.index:
                out.update(self._write_index(decoded, entries))
        finally:
            decoded.unpersist()
        self._swap(out)
        return out

    def _decoded(self, counters: Any) -> Any:
        p = self.p
        units, entries, deleted = p.cq, p.index, p.deleted
        return (self.sc.parallelize(list(enumerate(p.splits)), max(1, len(p.splits)))
                .mapPartitions(lambda it: _read_splits(it, units, entries, deleted, counters)))

    # -- ConsumeQueues --------------------------------------------------------------------------

    def _partitions(self, units: int, row_bytes: int) -> int:
        return max(min_tasks(self.sc),
                   math.ceil(units * row_bytes / self.partition_bytes), 1)

    def _write_cq(self, decoded: Any, info: list, units: int) -> dict[str, Any]:
        from stratamq.spark.pipelines import cq_write
        from stratamq.spark.pipelines.partitioning import range_bounds, route, split_by

        p = self.p
        files = p.store_type == STORE_TYPE_FILES
        bounds = range_bounds((s for i in info for s in i[3]),
                              self._partitions(units, UNIT_SIZE if files else ROCKSDB_ROW_BYTES))
        chunk = p.chunk_units
        parts = len(bounds) + 1
        shuffled = (decoded.filter(lambda e: e[1] is not None and e[1].num_rows)
                    .flatMap(lambda e: split_by(e[1], route(e[1], bounds, chunk)))
                    .partitionBy(parts, lambda pid: pid))
        staging = p.staging
        if files:
            out = str(staging / "files")
            size = p.cq_file_size
            with self.bar.stage("write consumequeue", total_rows=units) as counters:
                done = shuffled.mapPartitions(lambda it: cq_write.write_files(
                    (b for _, b in it), out, size, counters)).collect()
            return {"cq_files": sum(d[0] for d in done), "units": sum(d[1] for d in done),
                    "skipped_records": sum(d[2] for d in done)}
        sst = staging / "sst"
        # The offset table's rows in key order (topic length, topic, max|min, queue): all rows
        # of a topic go to one task, the tasks in topic order, so their SST files do not
        # overlap. One job: the units' SST files are written in its first stage.
        topics = sorted({b[:2] for b in bounds})

        def topic_partition(key: bytes) -> int:
            return bisect.bisect_right(topics, (int.from_bytes(key[:4], "big"),
                                                key[5:5 + int.from_bytes(key[:4], "big")]))

        with self.bar.stage("write consumequeue", total_rows=units) as counters:
            written = (shuffled.mapPartitionsWithIndex(lambda i, it: cq_write.write_sst(
                (b for _, b in it), sst, f"cq-{i:05d}.sst", counters))
                .reduceByKey(cq_write.merge_summaries, parts)
                .flatMap(lambda kv: cq_write.offset_rows(*kv))
                .repartitionAndSortWithinPartitions(len(topics) + 1, topic_partition)
                .mapPartitionsWithIndex(lambda i, it: cq_write.write_rows_sst(
                    it, sst, f"offset-{i:05d}.sst"))
                .sum())
        self._ingest(sst)
        return {"queues": (written - 1) // 2, "offset_rows": written}

    def _ingest(self, sst: Path) -> None:
        """A new RocksDB from the SST files the tasks wrote (moved in, not copied), then the
        store's own finishing step (the expiry watermark for a CommitLog that starts past 0)."""
        from rocksdict import IngestExternalFileOptions, Rdict

        from stratamq.store.rocksdb_consume_queue import RocksDBConsumeQueueStore
        from stratamq.store.rocksdb_cq_format import OFFSET_CF, rocksdb_options

        path = self.p.staging / "rocksdb"
        opts = rocksdb_options()
        opts.create_if_missing(True)
        opts.create_missing_column_families(True)
        opts.set_atomic_flush(True)
        db = Rdict(str(path), options=opts, column_families={OFFSET_CF: rocksdb_options()})
        try:
            ingest = IngestExternalFileOptions()
            ingest.set_move_files(True)
            cq_files = sorted(str(f) for f in sst.glob("cq-*.sst"))
            offset_files = sorted(str(f) for f in sst.glob("offset-*.sst"))
            if cq_files:
                db.ingest_external_file(cq_files, ingest)
            if offset_files:
                db.get_column_family(OFFSET_CF).ingest_external_file(offset_files, ingest)
        finally:
            db.close()
        store = RocksDBConsumeQueueStore(path)
        store.load()
        try:
            store.correct_min_offsets(self.p.low)
        finally:
            store.close()

    # -- index ----------------------------------------------------------------------------------

    def _write_index(self, decoded: Any, entries: list[int]) -> dict[str, Any]:
        from stratamq.spark.pipelines.index_write import file_name, write_index_file

        p = self.p
        total = sum(entries)
        per_file = p.index_num - 1
        files = math.ceil(total / per_file)
        file_bytes = per_file * ENTRY_SIZE
        per_task = max(1, self.partition_bytes // file_bytes)
        parts = max(1, math.ceil(files / per_task))
        starts = [sum(entries[:i]) for i in range(len(entries))]
        out = p.staging / "index"
        out.mkdir()
        slots, index_num, base_ms = p.hash_slot_num, p.index_num, p.base_ms

        def write(items: Iterator[tuple[int, tuple]], counters: Any) -> Iterator[tuple]:
            from stratamq.spark.pipelines.dispatch_rows import Entries

            by_file: dict[int, list[tuple[int, Entries]]] = {}
            for _pid, (number, at, chunk) in items:
                by_file.setdefault(number, []).append((at, chunk))
            for number, chunks in sorted(by_file.items()):
                chunks.sort(key=lambda c: c[0])
                whole = Entries.concat([c for _, c in chunks])
                expected = min(per_file, total - number * per_file)
                if len(whole) != expected or chunks[0][0] != 0:
                    raise PipelineError(f"index file {number}: {len(whole)} entries arrived, "
                                        f"{expected} expected")
                end = write_index_file(out / file_name(base_ms, number), whole, slots,
                                       index_num)
                counters.rows.add(len(whole))
                counters.bytes.add(len(whole) * ENTRY_SIZE)
                yield number, end

        if not files:
            return {"index_entries": 0, "index_files": 0}
        with self.bar.stage("write index", total_rows=total) as counters:
            written = (decoded.mapPartitions(lambda it: _number_entries(it, starts, per_file,
                                                                        per_task))
                       .partitionBy(parts, lambda pid: pid)
                       .mapPartitions(lambda it: write(it, counters)).collect())
        self._index_end_ts = max(end[0] for _, end in written)
        return {"index_entries": total, "index_files": len(written)}

    # -- moving the result in -------------------------------------------------------------------

    def _swap(self, out: dict[str, Any]) -> None:
        p = self.p
        root, staging = p.root, p.staging
        if p.cq:
            if p.store_type == STORE_TYPE_FILES:
                new = staging / "files" / "consumequeue"
                new.mkdir(parents=True, exist_ok=True)
                swap_in(new, root / "consumequeue", staging / "old-consumequeue")
            else:
                swap_in(staging / "rocksdb", root / ROCKSDB_CQ_DIR, staging / "old-rocksdb")
            write_store_type(root, p.store_type)
        if p.index:
            swap_in(staging / "index", root / "index", staging / "old-index")
            end_ts = self._index_end_ts
            if end_ts is not None:
                from stratamq.store.checkpoint import StoreCheckpoint

                path = StoreLayout(root).checkpoint
                checkpoint = StoreCheckpoint.read(path)
                # The rebuilt files are durable up to their newest entry.
                checkpoint.index_msg_timestamp = end_ts
                checkpoint.write(path)


# -- executor side ------------------------------------------------------------------------------


def _read_splits(items: Iterator[tuple[int, LogSplit]], units: bool, entries: bool,
                 deleted: dict[str, int], counters: Any) -> Iterator[tuple]:
    """(split number, units batch, index entries) per batch of records of each split."""
    from stratamq import record as codec
    from stratamq.spark.pipelines.dispatch_rows import dispatch_rows
    from stratamq.spark.reading import walk_log_split
    from stratamq.store.layout import segment_name

    for number, split in items:
        for segments, base, buf, positions in walk_log_split(split):
            try:
                u, e = dispatch_rows(buf, positions, base, deleted, units=units,
                                     entries=entries)
            except codec.RecordCorrupt as exc:
                raise codec.RecordCorrupt(base + exc.position, f"in {segments.dir}/"
                                          f"{segment_name(base)}: {exc.reason}") from None
            counters.rows.add(len(positions))
            yield number, u, e
        counters.bytes.add(split.end - split.start)


def _summarise(items: Iterator[tuple], chunk_units: int) -> Iterator[tuple]:
    """One (split number, units, entries, key samples) per split (a partition is a split)."""
    import pyarrow as pa

    from stratamq.spark.pipelines.partitioning import samples

    number, batches, entries = -1, [], 0
    for item in items:
        number, u, e = item
        if u is not None and u.num_rows:
            batches.append(u.select(["topic", "queue_id", "queue_offset"]))
        entries += len(e) if e is not None else 0
    if number < 0:
        return
    table = pa.Table.from_batches(batches) if batches else None
    yield (number, table.num_rows if table is not None else 0, entries,
           samples(table, chunk_units) if table is not None else [])


def _number_entries(items: Iterator[tuple], starts: list[int], per_file: int,
                    per_task: int) -> Iterator[tuple[int, tuple]]:
    """Cut a split's entries at index-file boundaries: (task, (file number, position in the
    file, entries)). A partition is one split, its batches in CommitLog order."""
    at = None
    for number, _u, e in items:
        if at is None:
            at = starts[number]
        if e is None or not len(e):
            continue
        done = 0
        while done < len(e):
            file_no, pos = divmod(at, per_file)
            take = min(len(e) - done, per_file - pos)
            yield file_no // per_task, (file_no, pos, e.slice(done, done + take))
            done += take
            at += take


def _counted(counts: Iterator[int], counters: Any) -> Iterator[int]:
    for n in counts:
        counters.rows.add(n)
        yield n


# -- command line -------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stratamq.spark.pipelines.rebuild",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--store", required=True, help="store directory")
    parser.add_argument("--what", required=True, choices=WHATS)
    parser.add_argument("--store-type", choices=STORE_TYPES, default=None,
                        help="ConsumeQueue store to build (default: the recorded one)")
    parser.add_argument("--config", help="broker.conf the broker runs with")
    parser.add_argument("--master", help="Spark master (default: spark-submit's, or local[*])")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    args = parser.parse_args(argv)
    config = _config(args.config, args.store) if args.config else None
    return run_main("stratamq-rebuild", args.master, lambda spark: run_rebuild(
        spark, args.store, args.what, args.store_type, config=config, progress=not args.quiet),
        quick_jit=True)


def _config(path: str, store: str) -> StoreConfig:
    from dataclasses import replace

    from stratamq.config_file import read_broker_conf

    conf = read_broker_conf(Path(path))
    if conf.unknown:
        raise SystemExit(f"error: unknown settings in {path}: {conf.unknown_text()}")
    return replace(conf.store, store_path_root_dir=store)


if __name__ == "__main__":
    sys.exit(main())
