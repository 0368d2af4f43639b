"""The compact pipeline: a compaction topic compacted as a distributed reduce, for topics whose
keys do not fit one machine's OffsetMap (``maxOffsetMapSize``).

    stratamq spark compact --store DIR --topic T
    spark-submit stratamq/spark/pipelines/compact.py --store DIR --topic T

The single-machine round (``stratamq/compaction/round.py``) builds an OffsetMap, md5(key) ->
latest queue offset, from the dirty part of each queue; when the map fills, the rest waits for
later rounds. Here the map is never built:

1. **split** (driver, the store's own code): the store is opened with its compaction store
   plugged in, so records not yet split out of the CommitLog reach their CompactionLogs, and
   each queue's file being written is sealed, as ``stratamq compaction run`` does. The store's
   lock is then held until the end.
2. **reduce**: one task per sealed CompactionLog file reads its batch ConsumeQueue units (64
   bytes each: queue offset, md5 of the key, flags; ``docs/formats/compaction-batch-cq.md``)
   and sends its keyed units to the task owning their digest's hash range. That task sorts them
   by (queue, digest, queue offset): a unit is superseded when a later value of its key exists
   at or after the queue's ``cleanedTo``. Out come, per queue, the superseded queue offsets.
3. **rewrite**: one task per queue runs the store's own round (``run_round``) with those
   offsets instead of an OffsetMap: the same new files, batch ConsumeQueue, swap protocol and
   ``state.json`` as a single-machine round whose OffsetMap held every key, tombstones
   dropped per the topic's ``delete.retention.ms`` the same way.

The driver learns counts only. A queue is rewritten by one task (its records are copied in
order into files named after the ones they replace), so the parallelism of step 3 is the
number of queues; step 2, where a topic's keys are, spreads over every core.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from stratamq.config import StoreConfig
from stratamq.spark.pipelines.common import (
    PARTITION_BYTES,
    PipelineError,
    run_main,
    store_dir,
    store_lock,
    user_message,
)
from stratamq.store.layout import StoreLayout

log = logging.getLogger(__name__)

KEY_BYTES = 40  # what one keyed unit costs in the reduce: queue, digest, queue offset, flag


def run_compact(spark: Any, store: str, topic: str, *, config: StoreConfig | None = None,
                now_ms: int | None = None, progress: bool = True,
                partition_bytes: int = PARTITION_BYTES) -> dict[str, Any]:
    """Compact every queue of ``topic``; returns the summary with one report per queue."""
    from stratamq.spark.pipelines.progress import PipelineProgress

    root = store_dir(store)
    cfg = replace(config or StoreConfig(), store_path_root_dir=str(root))
    now = int(time.time() * 1000) if now_ms is None else now_ms
    started = time.monotonic()
    policy = _split_out(cfg, topic)
    sc = spark.sparkContext
    bar = PipelineProgress(sc, "compact", quiet=not progress)
    with store_lock(root):
        plan = _plan(cfg, topic)
        if not plan:
            return {"ok": True, "store": str(root), "topic": topic, "queues": [],
                    "seconds": round(time.monotonic() - started, 3)}
        try:
            reports = _Job(sc, cfg, topic, policy, now, plan, bar, partition_bytes).run()
        except PipelineError:
            raise
        except Exception as exc:
            raise PipelineError(f"compaction of {topic} in {store} failed: "
                                f"{user_message(exc)}; a queue whose round did not finish "
                                "is as it was (the swap protocol)") from exc
    return {"ok": True, "store": str(root), "topic": topic, "time_ms": now,
            "records_read": sum(r["records_read"] for r in reports),
            "kept": sum(r["kept"] for r in reports),
            "removed": sum(r["removed"] for r in reports),
            "tombstones_dropped": sum(r["tombstones_dropped"] for r in reports),
            "queues": reports, "stages": bar.stages,
            "seconds": round(time.monotonic() - started, 3)}


def _split_out(cfg: StoreConfig, topic: str) -> Any:
    """Open the store with compaction plugged in (its open splits what the CommitLog holds
    past the compaction checkpoint into the CompactionLogs), seal each of the topic's files
    being written, flush, close. Returns the topic's policy."""
    from stratamq.compaction.policy import PolicyError, policies_from_topics_json
    from stratamq.compaction.service import CompactionStore
    from stratamq.store.message_store import MessageStore, StoreLocked

    layout = StoreLayout(cfg.root)
    try:
        policies = policies_from_topics_json(layout.topics_file)
    except PolicyError as exc:
        raise PipelineError(str(exc)) from None
    policy = policies.policy(topic)
    if policy is None:
        raise PipelineError(f"--topic {topic}: not a compaction topic of {cfg.root} "
                            "(cleanup.policy=COMPACTION in config/topics.json)")
    message_store = MessageStore(cfg)
    compaction = CompactionStore(cfg, policies).plug_into(message_store)
    try:
        message_store.open()
    except StoreLocked as exc:
        compaction.close()
        raise PipelineError(f"{exc} (a running broker?): stop it first") from None
    try:
        for clog in compaction.queues(topic):
            clog.seal_active()
    finally:
        message_store.close()
        compaction.close()
    return policy


def _plan(cfg: StoreConfig, topic: str) -> list[dict[str, Any]]:
    """Per queue of ``topic``: its sealed files (batch CQ path, unit count) and the offsets
    the round needs, from the files' headers (no record read)."""
    from stratamq.compaction import bcq_format as bcq
    from stratamq.compaction.layout import CompactionLayout
    from stratamq.compaction.log import CompactionLog
    from stratamq.compaction.round import tier_only_reason

    layout = CompactionLayout(StoreLayout(cfg.root))
    queues = []
    for name, queue_id in layout.queues_on_disk():
        if name != topic:
            continue
        clog = CompactionLog(layout.queue(topic, queue_id), cfg.compaction_mapped_file_size,
                             bcq.cq_file_size(cfg.compaction_cq_mapped_file_size),
                             read_only=True)
        clog.load()
        try:
            reason = tier_only_reason(clog)
            if reason is not None:
                # Refused, not restored: this pipeline works on the store directory alone
                # (executors read its files), while a restore is the broker's step with the
                # tier linked: its manifest, credentials, and next upload. The store's own
                # round with the tier linked (``stratamq compaction run``) restores, then
                # compacts.
                raise PipelineError(
                    f"--topic {topic}: queue {queue_id} cannot be compacted by this pipeline: "
                    f"{reason} with the tier linked, as `stratamq compaction run --store DIR "
                    "--config broker.conf` (or --endpoint of the running broker) does; "
                    "no queue was compacted")
            sealed = [s for s in clog.sealed_segments() if s.units]
            queues.append({
                "queue_id": queue_id, "cleaned_to": clog.state.cleaned_to,
                "files": [(str(clog.paths.cq_file(s.start)), s.units) for s in sealed],
                "units": sum(s.units for s in sealed),
                "map_end": max((s.last_offset for s in sealed), default=-1) + 1})
        finally:
            clog.close()
    return queues


class _Job:
    """One compaction's Spark jobs (driver side)."""

    def __init__(self, sc: Any, cfg: StoreConfig, topic: str, policy: Any, now: int,
                 plan: list[dict[str, Any]], bar: Any, partition_bytes: int) -> None:
        self.sc, self.cfg, self.topic, self.policy, self.now = sc, cfg, topic, policy, now
        self.plan, self.bar, self.partition_bytes = plan, bar, partition_bytes

    def run(self) -> list[dict[str, Any]]:
        files = [(q["queue_id"], q["cleaned_to"], path, units) for q in self.plan
                 for path, units in q["files"]]
        total = sum(q["units"] for q in self.plan)
        parts = max(self.sc.defaultParallelism,
                    math.ceil(total * KEY_BYTES / self.partition_bytes), 1)
        superseded: dict[int, np.ndarray] = {}
        if files:
            with self.bar.stage("reduce", total_rows=total) as counters:
                found = (self.sc.parallelize(files, len(files))
                         .flatMap(lambda f: _keyed_units(f, parts, counters))
                         .partitionBy(parts, lambda pid: pid)
                         .mapPartitions(_superseded_in)
                         .reduceByKey(lambda a, b: np.concatenate([a, b]))
                         .collectAsMap())
            superseded = {q: np.sort(v) for q, v in found.items()}
        cfg, topic, policy, now = self.cfg, self.topic, self.policy, self.now
        queues = [(q["queue_id"], superseded.get(q["queue_id"], np.empty(0, np.int64)))
                  for q in self.plan]
        with self.bar.stage("rewrite", total_rows=total) as counters:
            reports = (self.sc.parallelize(queues, len(queues))
                       .map(lambda q: _rewrite(cfg, topic, q[0], q[1], policy, now, counters))
                       .collect())
        return sorted(reports, key=lambda r: r["queue_id"])


# -- executor side ------------------------------------------------------------------------------


def _keyed_units(item: tuple[int, int, str, int], parts: int,
                 counters: Any) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
    """The keyed units of one sealed batch CQ file, cut by the digest's partition."""
    from stratamq.compaction import bcq_format as bcq

    queue_id, cleaned_to, path, count = item
    with open(path, "rb") as fh:
        data = fh.read(count * bcq.UNIT_SIZE)
    units = bcq.units_array(data, count)
    keyed = units[(units["flags"] & bcq.FLAG_HAS_KEY) != 0]
    counters.rows.add(count)
    counters.bytes.add(len(data))
    if not len(keyed):
        return
    digest = np.frombuffer(keyed["key_digest"].tobytes(), dtype=">u8").reshape(-1, 2)
    offsets = keyed["queue_offset"].astype(np.int64)
    pids = (digest[:, 0] % np.uint64(parts)).astype(np.int64)
    order = np.argsort(pids, kind="stable")
    cut = np.flatnonzero(np.diff(pids[order])) + 1
    for rows in np.split(order, cut):
        yield int(pids[rows[0]]), {
            "queue": np.full(len(rows), queue_id, np.int64), "hi": digest[rows, 0],
            "lo": digest[rows, 1], "offset": offsets[rows],
            "dirty": offsets[rows] >= cleaned_to}


def _superseded_in(items: Iterator[tuple[int, dict[str, np.ndarray]]]
                   ) -> Iterator[tuple[int, np.ndarray]]:
    """Per queue, the offsets of this digest range whose key has a later dirty value."""
    parts = [arrays for _pid, arrays in items]
    if not parts:
        return
    cols = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    order = np.lexsort((cols["offset"], cols["lo"], cols["hi"], cols["queue"]))
    queue, hi, lo = cols["queue"][order], cols["hi"][order], cols["lo"][order]
    offset, dirty = cols["offset"][order], cols["dirty"][order]
    new_group = np.ones(len(order), dtype=bool)
    new_group[1:] = (queue[1:] != queue[:-1]) | (hi[1:] != hi[:-1]) | (lo[1:] != lo[:-1])
    group = np.cumsum(new_group) - 1
    latest = np.full(group[-1] + 1, -1, dtype=np.int64)
    np.maximum.at(latest, group[dirty], offset[dirty])
    gone = offset < latest[group]
    for q in np.unique(queue[gone]).tolist():
        yield int(q), offset[gone & (queue == q)]


def _rewrite(cfg: StoreConfig, topic: str, queue_id: int, superseded: np.ndarray, policy: Any,
             now: int, counters: Any) -> dict[str, Any]:
    """The store's own round for one queue, with the superseded offsets given."""
    from stratamq.compaction import bcq_format as bcq
    from stratamq.compaction.layout import CompactionLayout
    from stratamq.compaction.log import CompactionLog
    from stratamq.compaction.round import run_round

    layout = CompactionLayout(StoreLayout(cfg.root))
    clog = CompactionLog(layout.queue(topic, queue_id), cfg.compaction_mapped_file_size,
                         bcq.cq_file_size(cfg.compaction_cq_mapped_file_size),
                         destroy_interval_ms=0)
    clog.load()
    try:
        report = run_round(clog, policy, 0, now, superseded=superseded)
    finally:
        clog.close()
    counters.rows.add(report.records_read)
    counters.bytes.add(report.bytes_before)
    return report.to_json()


# -- command line -------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stratamq.spark.pipelines.compact",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--store", required=True, help="store directory")
    parser.add_argument("--topic", required=True, help="compaction topic")
    parser.add_argument("--config", help="broker.conf the broker runs with")
    parser.add_argument("--master", help="Spark master (default: spark-submit's, or local[*])")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    args = parser.parse_args(argv)
    config = None
    if args.config:
        from stratamq.config_file import read_broker_conf

        config = read_broker_conf(Path(args.config)).store
    return run_main("stratamq-compact", args.master, lambda spark: run_compact(
        spark, args.store, args.topic, config=config, progress=not args.quiet))


if __name__ == "__main__":
    sys.exit(main())
