"""The offload pipeline: a whole store's history (a retired StrataMQ broker's, or one Apache
RocketMQ wrote) moved into a tier, so a broker with that tier and an empty store serves it.

    stratamq spark offload --store DIR --tier PATH_OR_URL [--topics T1,T2] [--master URL]
    spark-submit stratamq/spark/pipelines/offload.py --store DIR --tier s3://bucket/prefix

Stages (``docs/SPARK.md``, "Pipelines on a cluster"):

1. **read**: one task per CommitLog byte range reads record headers only and returns, per
   (topic, queue, block of 4,096 queue offsets), counts, bytes, offsets and times, and its
   count of index keys: all the driver learns.
2. the driver plans (no data read): each queue is cut into chunks of about
   ``PARTITION_BYTES`` whose place in the queue's tier CommitLog follows from the counts, the
   chunks are packed into write tasks, topic ids are assigned, and index items are numbered
   (file ``k`` of the tier index holds items ``k * (tieredStoreIndexFileMaxIndexNum - 1)`` on).
3. **write**: the CommitLog is read again, whole records this time, routed to the task owning
   their chunk; each task writes its chunks' tier CommitLog and ConsumeQueue files
   (``tier_write``) and passes each message's index items on with their tier offsets.
4. **index**: items go to the task owning their index file, which writes it whole, sealed.
5. the driver registers the offload in the tier (``stratamq.tiered.offloaded``): the topics'
   configuration, the tier metadata document, then the manifest, last.

Idempotent: a rerun of a complete offload finds its manifest and writes nothing; a rerun after
a killed driver or failed tasks rewrites only files that are missing (contents and names are
fixed by the source and the plan), and no file is ever visible half written. Records are read
in place and never change: the source store is not locked (a running broker's directory can be
offloaded, as it was when the job planned).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from stratamq.config import BrokerConfig, StoreConfig
from stratamq.spark.pipelines.common import (
    PARTITION_BYTES,
    SPLIT_BYTES,
    PipelineError,
    commitlog_splits,
    min_tasks,
    run_main,
    store_dir,
    user_message,
)
from stratamq.spark.planning import LogSplit
from stratamq.store.layout import StoreLayout

log = logging.getLogger(__name__)

BLOCK_MAX = 4096  # queue offsets per block the read stage counts (chunks are whole blocks)


def block_size(partition_bytes: int) -> int:
    """Queue offsets per block: fine enough that chunks of ``partition_bytes`` can be cut
    from blocks of ordinary messages, coarse enough that the counts the driver gets stay few
    (at most one per 4,096 messages of a queue, per read task)."""
    return max(16, min(BLOCK_MAX, partition_bytes // 16384))
MANIFEST_VERSION = 1


def tier_config(tier: str, config: StoreConfig | None, s3_endpoint: str | None) -> StoreConfig:
    """The tier settings of ``--tier``: a directory (posix) or ``s3://`` URL (s3), the file
    sizes and index geometry of ``config`` (broker.conf) or the defaults."""
    cfg = config or StoreConfig()
    if tier.startswith(("s3://", "s3a://")):
        provider = "s3"
    elif "://" in tier and not tier.startswith("file://"):
        raise PipelineError(f"--tier {tier}: a directory or an s3:// URL")
    else:
        provider = "posix"
        tier = tier.removeprefix("file://")
        tier = str(Path(tier).absolute())
    return replace(cfg, tiered_backend_service_provider=provider, tiered_store_file_path=tier,
                   tiered_store_s3_endpoint=s3_endpoint or cfg.tiered_store_s3_endpoint)


def run_offload(spark: Any, store: str, tier: str, topics: list[str] | None = None, *,
                config: StoreConfig | None = None, cluster: str | None = None,
                broker: str | None = None, s3_endpoint: str | None = None,
                progress: bool = True, split_bytes: int = SPLIT_BYTES,
                partition_bytes: int = PARTITION_BYTES) -> dict[str, Any]:
    """Offload ``store`` (``topics``, or every topic) to ``tier``; returns the summary.
    ``partition_bytes``: records one write task owns, and the size of a queue's chunks."""
    from stratamq.spark.pipelines.progress import PipelineProgress
    from stratamq.spark.reading import log_bounds
    from stratamq.store.deleted_topics import DeletedTopics
    from stratamq.tiered.offloaded import TierDocs

    root = store_dir(store)
    cluster = cluster or BrokerConfig().broker_cluster_name
    broker = broker or BrokerConfig().broker_name
    cfg = tier_config(tier, config, s3_endpoint)
    started = time.monotonic()
    block = block_size(partition_bytes)
    try:
        docs = TierDocs(cfg, cluster, broker)
        manifest = docs.manifest()
        deleted = DeletedTopics(StoreLayout(root).deleted_topics, read_only=True).cutoffs
    except (OSError, ValueError) as exc:
        raise PipelineError(f"--tier {tier}: {exc}") from None
    low, end = log_bounds(str(root))
    source = {"store": str(root.absolute()), "commitlog": [low, end],
              "topics": sorted(topics) if topics else None, "block": block,
              "partition_bytes": partition_bytes}
    summary: dict[str, Any] = {"ok": True, "store": str(root), "tier": tier, "cluster": cluster,
                               "broker": broker}
    if manifest is not None:
        if manifest.get("source") == source:
            return {**summary, "noop": True, "messages": manifest.get("messages"),
                    "files_written": 0, "seconds": round(time.monotonic() - started, 3)}
        raise PipelineError(
            f"--tier {tier} already holds an offload for broker {broker} of cluster {cluster} "
            f"(from {manifest.get('source')}); offload this store under another --broker-name, "
            "or into another tier")
    sc = spark.sparkContext
    bar = PipelineProgress(sc, "offload", quiet=not progress)
    job = _Job(sc, cfg, cluster, broker, root, low, end, deleted,
               set(topics) if topics else None, bar, split_bytes, partition_bytes, block)
    try:
        out = job.run(docs, source)
    except PipelineError:
        raise
    except Exception as exc:
        raise PipelineError(f"offload of {store} failed: {user_message(exc)}; run it again: "
                            "it writes only what is missing") from exc
    return {**summary, "noop": False, **out, "stages": bar.stages,
            "seconds": round(time.monotonic() - started, 3)}


class _Job:
    """One offload's Spark jobs (driver side)."""

    def __init__(self, sc: Any, cfg: StoreConfig, cluster: str, broker: str, root: Path,
                 low: int, end: int, deleted: dict[str, int], topics: set[str] | None,
                 bar: Any, split_bytes: int, partition_bytes: int, block: int) -> None:
        self.sc, self.cfg, self.cluster, self.broker = sc, cfg, cluster, broker
        self.block = block
        self.root, self.low, self.end, self.deleted, self.topics = root, low, end, deleted, topics
        self.bar, self.partition_bytes = bar, partition_bytes
        self.splits = commitlog_splits(root, low, end, split_bytes, min_tasks(sc))

    def run(self, docs: Any, source: dict[str, Any]) -> dict[str, Any]:
        info = self._read()
        queues = _queues(info)
        missing = sorted(self.topics - {t for t, _ in queues}) if self.topics else []
        if missing:
            raise PipelineError(f"--topics: no message of {', '.join(missing)} in {self.root}")
        if not queues:
            raise PipelineError(f"{self.root} holds no message to offload")
        topic_ids = {t: i for i, t in enumerate(sorted({t for t, _ in queues}))}
        plans, tasks = self._plan_chunks(queues)
        per_file = self.cfg.tiered_store_index_file_max_index_num - 1
        item_counts = [i[2] for i in sorted(info, key=lambda i: i[0])]
        items = sum(item_counts)
        index_plan = _plan_index(items, per_file,
                                 self.cfg.tiered_store_index_file_max_hash_slot_num,
                                 self.partition_bytes) if self.cfg.message_index_enable else None
        messages = sum(q["count"] for q in queues.values())
        files, written = self._write(plans, tasks, topic_ids, item_counts, index_plan,
                                     messages, items)
        self._register(docs, source, queues, topic_ids, files, messages)
        return {"topics": len(topic_ids), "queues": len(queues), "messages": messages,
                "bytes": sum(q["bytes"] for q in queues.values()), "index_items": items,
                "tier_files": len(files), "files_written": written, "splits": len(self.splits)}

    # -- stage 1 ---------------------------------------------------------------------------------

    def _read(self) -> list[tuple]:
        deleted, topics, block = self.deleted, self.topics, self.block
        with self.bar.stage("read", total_bytes=self.end - self.low) as counters:
            return (self.sc.parallelize(list(enumerate(self.splits)), max(1, len(self.splits)))
                    .mapPartitions(lambda it: _summarise(it, deleted, topics, block, counters))
                    .collect())

    # -- planning --------------------------------------------------------------------------------

    def _plan_chunks(self, queues: dict[tuple[str, int], dict[str, Any]]) -> tuple[dict, int]:
        """Cut each queue into chunks of whole blocks of about ``partition_bytes`` (never
        more than a tier CommitLog file), and pack the chunks, in key order, into write
        tasks of about ``partition_bytes``."""
        from stratamq.spark.pipelines.tier_write import QueuePlan

        target = min(self.partition_bytes, self.cfg.tiered_store_commit_log_max_size)
        chunks = []  # (queue, start, base, bytes)
        for queue in sorted(queues, key=lambda q: (len(q[0].encode()), q[0].encode(), q[1])):
            blocks = queues[queue]["blocks"]
            base, acc, start = 0, 0, 0
            for block, (_count, size) in sorted(blocks.items()):
                if acc and acc + size > target:
                    chunks.append((queue, start, base, acc))
                    base, acc, start = base + acc, 0, block * self.block
                acc += size
            chunks.append((queue, start, base, acc))
        # Tasks of at most partition_bytes, and at least min_tasks of them when there are
        # that many chunks: which task writes a chunk changes no byte of the tier.
        task_bytes = min(self.partition_bytes,
                         max(1, math.ceil(sum(c[3] for c in chunks) / min_tasks(self.sc))))
        tasks, filled, task = [], 0, 0
        for _queue, _start, _base, size in chunks:
            if filled and filled + size > task_bytes:
                task, filled = task + 1, 0
            tasks.append(task)
            filled += size
        plans: dict[tuple[str, int], QueuePlan] = {}
        for queue in {c[0] for c in chunks}:
            mine = [(c, t) for c, t in zip(chunks, tasks) if c[0] == queue]
            plans[queue] = QueuePlan(np.array([c[1] for c, _ in mine], np.int64),
                                     np.array([c[2] for c, _ in mine], np.int64),
                                     np.array([t for _, t in mine], np.int64))
        return plans, task + 1

    # -- stages 3 and 4 --------------------------------------------------------------------------

    def _write(self, plans: dict, tasks: int, topic_ids: dict[str, int], item_counts: list[int],
               index_plan: dict[str, Any] | None, messages: int,
               items: int) -> tuple[list[tuple], int]:
        from pyspark import StorageLevel

        from stratamq.spark.pipelines import tier_write

        sc, cfg, cluster, broker = self.sc, self.cfg, self.cluster, self.broker
        deleted, topics = self.deleted, self.topics
        shared = sc.broadcast(plans)
        item_bases = [int(x) for x in np.concatenate([[0], np.cumsum(item_counts)[:-1]])] \
            if item_counts else []
        per_file = index_plan["per_file"] if index_plan else 0
        with self.bar.stage("write", total_rows=messages) as counters:
            written = (sc.parallelize(list(enumerate(self.splits)), max(1, len(self.splits)))
                       .mapPartitions(lambda it: _route(it, deleted, topics, item_bases,
                                                        shared))
                       .partitionBy(tasks, lambda task: task)
                       .mapPartitions(lambda it: tier_write.write_chunks(
                           (b for _, b in it), shared.value, cfg, cluster, broker, topic_ids,
                           per_file, counters))
                       .persist(StorageLevel.MEMORY_AND_DISK))
            files = written.filter(lambda e: e[0] == "file").map(lambda e: e[1]).collect()
        try:
            if index_plan is not None and items:
                bases, counts = index_plan["bases"], index_plan["counts"]
                per_task = index_plan["per_task"]
                with self.bar.stage("index", total_rows=items) as counters:
                    files += (written.filter(lambda e: e[0] == "idx")
                              .map(lambda e: (e[1], e))
                              .partitionBy(index_plan["tasks"], lambda f: f // per_task)
                              .mapPartitions(lambda it: tier_write.write_index_files(
                                  (e for _, e in it), cfg, cluster, broker, bases, counts,
                                  counters))
                              .collect())
        finally:
            written.unpersist()
            shared.unpersist()
        return [f[:6] for f in files], sum(f[6] for f in files)

    # -- stage 5 ---------------------------------------------------------------------------------

    def _register(self, docs: Any, source: dict[str, Any],
                  queues: dict[tuple[str, int], dict[str, Any]], topic_ids: dict[str, int],
                  files: list[tuple], messages: int) -> None:
        """The topics, the metadata document, then the manifest (the commit point)."""
        from stratamq.tiered.metadata import STATUS_SEALED, FileSegmentMetadata, MetadataStore
        from stratamq.tiered.offloaded import MANIFEST, METADATA, TOPICS

        stamp = max(q["max_ts"] for q in queues.values())  # fixed by the data: same bytes
        with tempfile.TemporaryDirectory() as tmp:
            meta = MetadataStore(Path(tmp))
            for topic in sorted(topic_ids, key=topic_ids.__getitem__):
                meta.add_topic(topic)
            for (topic, qid), q in sorted(queues.items()):
                entry = meta.add_queue(topic, self.broker, qid)
                entry.minOffset, entry.maxOffset = q["min_q"], q["max_q"] + 1
                entry.indexedOffset = q["max_q"] + 1 if self.cfg.message_index_enable else -1
                meta.update_queue(entry)
            for file_type, path, base, size, first_ts, last_ts in files:
                meta.update_segment(FileSegmentMetadata(
                    path, file_type, base, STATUS_SEALED, size, stamp, first_ts, last_ts, stamp))
            doc = json.loads(meta.encode())
        _stamp(doc, stamp)
        docs.write(TOPICS, json.dumps(self._topic_configs(queues), indent=2,
                                      sort_keys=True).encode())
        docs.write(METADATA, json.dumps(doc, separators=(",", ":")).encode())
        docs.write(MANIFEST, json.dumps({
            "version": MANIFEST_VERSION, "source": source, "cluster": self.cluster,
            "broker": self.broker, "topics": sorted(topic_ids), "queues": len(queues),
            "messages": messages, "files": len(files), "completed": stamp,
        }, indent=2, sort_keys=True).encode())

    def _topic_configs(self, queues: dict[tuple[str, int], dict[str, Any]]) -> dict[str, Any]:
        """topics.json of the offloaded topics: the source's own entries (a StrataMQ or
        RocketMQ broker's ``config/topics.json``), else read/write queues to cover every queue
        seen."""
        from stratamq.broker.metadata import TopicConfig

        try:
            theirs = json.loads((self.root / "config" / "topics.json").read_bytes()).get(
                "topicConfigTable", {})
        except (OSError, ValueError, AttributeError):
            theirs = {}
        table = {}
        for topic in sorted({t for t, _ in queues}):
            count = max(q for t, q in queues if t == topic) + 1
            entry = theirs.get(topic)
            table[topic] = entry if isinstance(entry, dict) else \
                TopicConfig(topic, count, count).to_json()
        return {"dataVersion": {"counter": 1, "stateVersion": 0, "timestamp": 0},
                "topicConfigTable": table}


def _stamp(doc: Any, stamp: int) -> None:
    """Times the metadata store takes from the clock, set to ``stamp`` instead: a rerun after a
    killed driver then writes the same document."""
    if isinstance(doc, dict):
        for key, value in doc.items():
            if key in ("updateTimestamp", "createTimestamp", "sealTimestamp"):
                doc[key] = stamp
            else:
                _stamp(value, stamp)


def _plan_index(items: int, per_file: int, slots: int, partition_bytes: int) -> dict[str, Any]:
    from stratamq.spark.pipelines.tier_write import sealed_size

    files = math.ceil(items / per_file) if items else 0
    counts = [min(per_file, items - k * per_file) for k in range(files)]
    sizes = [sealed_size(slots, c) for c in counts]
    bases = [int(x) for x in np.concatenate([[0], np.cumsum(sizes)[:-1]])] if sizes else []
    per_task = max(1, partition_bytes // max(1, per_file * 28))
    return {"per_file": per_file, "counts": counts, "bases": bases, "per_task": per_task,
            "tasks": max(1, math.ceil(files / per_task))}


def _queues(info: list[tuple]) -> dict[tuple[str, int], dict[str, Any]]:
    """Per queue, from every split's blocks: count, bytes, offsets, times, and per block
    (count, bytes); a queue offset stored twice is refused here, before anything is written."""
    queues: dict[tuple[str, int], dict[str, Any]] = {}
    for _number, _messages, _items, groups in info:
        for (topic, qid, block), (count, size, min_q, max_q, min_ts, max_ts) in groups:
            q = queues.setdefault((topic, qid), {"count": 0, "bytes": 0, "min_q": min_q,
                                                 "max_q": max_q, "min_ts": min_ts,
                                                 "max_ts": max_ts, "blocks": {}})
            q["count"] += count
            q["bytes"] += size
            q["min_q"], q["max_q"] = min(q["min_q"], min_q), max(q["max_q"], max_q)
            q["min_ts"], q["max_ts"] = min(q["min_ts"], min_ts), max(q["max_ts"], max_ts)
            old = q["blocks"].get(block, (0, 0))
            q["blocks"][block] = (old[0] + count, old[1] + size)
    for (topic, qid), q in queues.items():
        if q["count"] > q["max_q"] - q["min_q"] + 1:
            raise PipelineError(f"{topic}/{qid}: {q['count']} messages for queue offsets "
                                f"{q['min_q']}..{q['max_q']}: some offset is stored twice (a "
                                "log not written by one broker in order); it cannot be "
                                "offloaded as one queue")
    return queues


# -- executor side ------------------------------------------------------------------------------


def _summarise(items: Iterator[tuple[int, LogSplit]], deleted: dict[str, int],
               topics: set[str] | None, block: int, counters: Any) -> Iterator[tuple]:
    """Per split: (number, messages, index keys, [((topic, queue, block), (count, bytes,
    min offset, max offset, min time, max time))])."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from stratamq.spark.pipelines.offload_rows import offload_rows
    from stratamq.spark.reading import walk_log_split

    for number, split in items:
        groups: dict[tuple[str, int, int], list[int]] = {}
        messages = keys = 0
        for _segments, base, buf, positions in walk_log_split(split):
            rows = offload_rows(buf, positions, base, deleted, topics, with_records=False)
            counters.rows.add(rows.num_rows)
            if not rows.num_rows:
                continue
            messages += rows.num_rows
            keys += len(pc.list_flatten(rows.column("keys")))
            table = pa.table({
                "topic": rows.column("topic"), "queue_id": rows.column("queue_id"),
                "block": pc.divide(rows.column("queue_offset"), block),
                "queue_offset": rows.column("queue_offset"), "size": rows.column("size"),
                "store_ts": rows.column("store_ts")})
            agg = table.group_by(["topic", "queue_id", "block"]).aggregate([
                ("queue_offset", "count"), ("size", "sum"), ("queue_offset", "min"),
                ("queue_offset", "max"), ("store_ts", "min"), ("store_ts", "max")])
            for row in agg.to_pylist():
                key = (row["topic"], row["queue_id"], row["block"])
                new = [row["queue_offset_count"], row["size_sum"], row["queue_offset_min"],
                       row["queue_offset_max"], row["store_ts_min"], row["store_ts_max"]]
                old = groups.get(key)
                groups[key] = new if old is None else [
                    old[0] + new[0], old[1] + new[1], min(old[2], new[2]), max(old[3], new[3]),
                    min(old[4], new[4]), max(old[5], new[5])]
        counters.bytes.add(split.end - split.start)
        yield number, messages, keys, [(k, tuple(v)) for k, v in groups.items()]


def _route(items: Iterator[tuple[int, LogSplit]], deleted: dict[str, int],
           topics: set[str] | None, item_bases: list[int], shared: Any) -> Iterator[tuple]:
    """Whole records of each split, numbered for the index and cut by write task."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from stratamq.spark.pipelines.offload_rows import offload_rows
    from stratamq.spark.pipelines.partitioning import split_by
    from stratamq.spark.reading import walk_log_split

    plans = shared.value
    for number, split in items:
        first = item_bases[number] if item_bases else 0
        for _segments, base, buf, positions in walk_log_split(split):
            rows = offload_rows(buf, positions, base, deleted, topics, with_records=True)
            if not rows.num_rows:
                continue
            counts = pc.list_value_length(rows.column("keys")).to_numpy(zero_copy_only=False)
            firsts = first + np.concatenate([[0], np.cumsum(counts)[:-1]])
            first += int(counts.sum())
            rows = rows.append_column("first_item", pa.array(firsts.astype(np.int64)))
            tasks = np.empty(rows.num_rows, dtype=np.int64)
            names = rows.column("topic").dictionary_encode()
            qids = rows.column("queue_id").to_numpy()
            offsets = rows.column("queue_offset").to_numpy()
            key = names.indices.to_numpy().astype(np.int64) << 32 | qids.astype(np.int64)
            for k in np.unique(key).tolist():
                at = np.flatnonzero(key == k)
                plan = plans[(names.dictionary[k >> 32].as_py(), k & 0xFFFF_FFFF)]
                chunk = np.searchsorted(plan.starts, offsets[at], side="right") - 1
                tasks[at] = plan.tasks[np.maximum(chunk, 0)]
            yield from split_by(rows, tasks)


# -- command line -------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stratamq.spark.pipelines.offload",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--store", required=True, help="store directory to offload (read-only)")
    parser.add_argument("--tier", required=True, help="tier directory or s3://bucket/prefix")
    parser.add_argument("--topics", help="comma list (default: every topic)")
    parser.add_argument("--config", help="broker.conf: tier file sizes, index geometry, "
                        "tieredStoreS3Endpoint, brokerClusterName and brokerName")
    parser.add_argument("--cluster", help="cluster the tier files are under [the config's, "
                        "else DefaultCluster]")
    parser.add_argument("--broker-name", help="broker whose tier this becomes [the config's, "
                        "else broker-a]")
    parser.add_argument("--s3-endpoint", help="S3-compatible server (tieredStoreS3Endpoint)")
    parser.add_argument("--master", help="Spark master (default: spark-submit's, or local[*])")
    parser.add_argument("--partition-mb", type=float, default=PARTITION_BYTES / 2**20,
                        help="MiB of records one write task owns [64]")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    args = parser.parse_args(argv)
    store_cfg, cluster, broker = None, args.cluster, args.broker_name
    if args.config:
        from stratamq.config_file import read_broker_conf

        conf = read_broker_conf(Path(args.config))
        store_cfg = conf.store
        cluster = cluster or conf.broker.broker_cluster_name
        broker = broker or conf.broker.broker_name
    topics = [t.strip() for t in args.topics.split(",") if t.strip()] if args.topics else None
    return run_main("stratamq-offload", args.master, lambda spark: run_offload(
        spark, args.store, args.tier, topics, config=store_cfg, cluster=cluster, broker=broker,
        s3_endpoint=args.s3_endpoint, progress=not args.quiet,
        partition_bytes=int(args.partition_mb * 2**20)), quick_jit=True)


if __name__ == "__main__":
    sys.exit(main())

