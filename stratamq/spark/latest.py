"""Compaction topics of a store directory read as tables of their latest values.

A compaction topic (``cleanup.policy=COMPACTION``) keeps every version of a key until a round
removes the older ones, so its ConsumeQueue shows all of them. A batch read of a store directory
gives such a topic as the table a consumer builds from it (option ``latestValues``, on by
default): per queue (a key always lands in one queue), the latest record of each key, and
without it the keys whose latest record is a tombstone (unless ``includeTombstones``). That is
what ``PullMessage`` from offset 0 returns once a round has compacted everything.

One task per queue (a key's versions must meet in one place):

* offsets below the queue's CompactionLog next offset come from its CompactionLog, opened
  read-only with ``stratamq.compaction`` (files, recovery, batch ConsumeQueue units); the
  units carry the md5 of each record's key and its tombstone flag, so the reduction reads no
  record it does not keep;
* offsets from there on (records the CommitLog holds but compaction has not split out yet, or
  every offset of a store whose compaction never ran) come through the ConsumeQueue, as a topic
  read does; their key digests and flags are computed as the compaction dispatcher computes them.

The reduction keeps, per key digest, the record with the highest queue offset; keyless records
are dropped (a round removes them too). Rows come out in queue offset order.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterator, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import InputPartition

from stratamq import record as codec
from stratamq.compaction import bcq_format as bcq
from stratamq.compaction.layout import CompactionLayout
from stratamq.compaction.log import CompactionLog, CompactionLogError
from stratamq.compaction.policy import TOMBSTONE_PROPERTY, PolicyError, policies_from_topics_json
from stratamq.config import StoreConfig
from stratamq.spark import planning
from stratamq.spark.planning import OptionError, Queue, QueueSplit
from stratamq.store.layout import StoreLayout

BATCH_RECORDS = 8192  # kept CompactionLog records per Arrow batch
_NO_KEY = bytes(16)


class CompactedSplit(InputPartition):
    """The latest value per key of queue offsets [start, end) of one compaction queue."""

    def __init__(self, root: str, topic: str, queue_id: int, start: int, end: int,
                 include_tombstones: bool, fail_on_data_loss: bool) -> None:
        self.root, self.topic, self.queue_id = root, topic, queue_id
        self.start, self.end = start, end
        self.include_tombstones, self.fail_on_data_loss = include_tombstones, fail_on_data_loss

    def __repr__(self) -> str:
        return (f"CompactedSplit({self.topic}/{self.queue_id} [{self.start}, {self.end}), "
                f"includeTombstones={self.include_tombstones})")


def compaction_topics(root: str) -> set[str]:
    """The store's compaction topics (``config/topics.json``)."""
    try:
        return set(policies_from_topics_json(StoreLayout(root).topics_file).topics())
    except PolicyError as exc:
        raise OptionError(f"option 'path': {exc}") from None


def latest_topics(options: Mapping[str, str], root: str | None,
                  topics: Collection[str]) -> set[str]:
    """The compaction topics among ``topics`` that a read of store directory ``root`` gives as
    latest-value tables (none with ``latestValues=false`` or when reading a broker)."""
    if root is None or not planning.latest_values(options)[0]:
        return set()
    return compaction_topics(root) & set(topics)


def whole_queue_splits(options: Mapping[str, str], root: str,
                       queues: Mapping[Queue, tuple[int, int]], known: Collection[str],
                       fail: bool) -> list[InputPartition]:
    """A whole-store read's compaction queues, each whole, as latest-value splits."""
    topics = latest_topics(options, root, known)
    _, tombstones = planning.latest_values(options)
    wanted = {q: b for q, b in queues.items() if q[0] in topics}
    return [CompactedSplit(root, t, q, s, e, tombstones, fail)
            for (t, q), (s, e) in sorted(queue_bounds(root, wanted).items()) if e > s]


def _open_log(root: str, queue: Queue) -> CompactionLog | None:
    """The queue's CompactionLog, read-only (None when it has no files). An unfinished swap or
    files that do not fit together fail naming them."""
    paths = CompactionLayout(StoreLayout(root)).queue(*queue)
    logs, cqs = paths.segment_starts()
    if not logs and not cqs and not paths.state.exists():
        return None
    config = StoreConfig()  # sizes only matter for a queue without files: it has some
    clog = CompactionLog(paths, config.compaction_mapped_file_size,
                         bcq.cq_file_size(config.compaction_cq_mapped_file_size), read_only=True)
    try:
        clog.load()
    except CompactionLogError as exc:
        clog.close()
        raise CompactionLogError(f"compaction topic {queue[0]}/{queue[1]}: {exc}") from None
    if clog.state.tier_floor:
        # Older compacted files live only in the tier: a table without them would silently
        # lack the keys they hold.
        clog.close()
        raise CompactionLogError(
            f"compaction topic {queue[0]}/{queue[1]}: its compacted files below offset "
            f"{clog.state.tier_floor} are in the tier only ({paths.state}: tierFloor); read the "
            "topic through the broker (option endpoints), or with latestValues=false for "
            "the versions the store still holds")
    return clog


def queue_bounds(root: str, queues: Mapping[Queue, tuple[int, int]]
                 ) -> dict[Queue, tuple[int, int]]:
    """(min, end) of compaction queues: the ConsumeQueue's bounds widened by the CompactionLog's
    (it keeps offsets whose CommitLog and ConsumeQueue files clean-up already deleted; offsets
    a round removed below its first record are holes, not data loss)."""
    out = {}
    for queue, (low, high) in queues.items():
        clog = _open_log(root, queue)
        if clog is not None:
            try:
                low, high = min(low, clog.min_offset()), max(high, clog.next_offset)
            finally:
                clog.close()
        out[queue] = (low, high)
    return out


def _key_columns(batch: pa.RecordBatch) -> tuple[np.ndarray, np.ndarray]:
    """(md5 of KEYS as 16-byte rows, flags) of decoded messages, as the compaction dispatcher
    computes them for its batch ConsumeQueue units."""
    keys = batch.column("keys").to_pylist()
    digests = np.frombuffer(b"".join(
        hashlib.md5(k.encode("utf-8")).digest() if k else _NO_KEY for k in keys),
        dtype=np.uint8).reshape(len(keys), 16)
    flags = np.where([bool(k) for k in keys], bcq.FLAG_HAS_KEY, 0).astype(np.uint8)
    marked = pc.equal(pc.utf8_lower(pc.map_lookup(batch.column("properties"),
                                                  TOMBSTONE_PROPERTY, "last")), "true")
    empty = pc.equal(pc.binary_length(batch.column("body")), 0)
    tomb = pc.fill_null(pc.or_(empty, pc.fill_null(marked, False)), False).to_numpy(
        zero_copy_only=False)
    flags[tomb] |= bcq.FLAG_TOMBSTONE
    return digests, flags


def _latest(offsets: np.ndarray, digests: np.ndarray, flags: np.ndarray,
            include_tombstones: bool) -> np.ndarray:
    """Indices (ascending) of the records to keep: per key digest the one with the highest
    queue offset (``offsets`` ascend), keyless records dropped, tombstones too unless asked."""
    keyed = np.flatnonzero(flags & bcq.FLAG_HAS_KEY)
    if not len(keyed):
        return keyed
    newest_first = keyed[np.argsort(-offsets[keyed], kind="stable")]
    rows = np.ascontiguousarray(digests[newest_first]).view("V16").ravel()
    _, first = np.unique(rows, return_index=True)
    keep = newest_first[first]
    if not include_tombstones:
        keep = keep[(flags[keep] & bcq.FLAG_TOMBSTONE) == 0]
    return np.sort(keep)


def read_compacted_split(split: CompactedSplit) -> Iterator[pa.RecordBatch]:
    from stratamq.spark.broker_io import raw_records_batch
    from stratamq.spark.reading import read_queue_split

    queue = (split.topic, split.queue_id)
    clog = _open_log(split.root, queue)
    try:
        tail_start = max(split.start, clog.next_offset if clog is not None else 0)
        # The CompactionLog's units: which segment, where, queue offset, key digest, flags.
        seg_of, where, offsets, digests, flags = [], [], [], [], []
        for k, seg in enumerate(clog.segments if clog is not None else ()):
            units = seg.units_array()
            units = units[(units["queue_offset"] >= split.start)
                          & (units["queue_offset"] < min(split.end, tail_start))]
            seg_of.append(np.full(len(units), k, dtype=np.int64))
            where.append(np.stack([units["position"].astype(np.int64),
                                   units["size"].astype(np.int64)], axis=1))
            offsets.append(units["queue_offset"].astype(np.int64))
            digests.append(np.frombuffer(units["key_digest"].tobytes(), dtype=np.uint8)
                           .reshape(len(units), 16))
            flags.append(units["flags"].astype(np.uint8))
        logged = sum(len(o) for o in offsets)
        # Then the ConsumeQueue's records past it (read twice: keys first, kept rows after,
        # so memory holds digests, not messages).
        tail = (QueueSplit(split.root, split.topic, split.queue_id, tail_start, split.end,
                           split.fail_on_data_loss) if tail_start < split.end else None)
        if tail is not None:
            for batch in read_queue_split(tail):
                d, f = _key_columns(batch)
                offsets.append(batch.column("queue_offset").to_numpy())
                digests.append(d)
                flags.append(f)
        if not offsets:
            return
        all_offsets = np.concatenate(offsets)
        keep = _latest(all_offsets, np.concatenate(digests), np.concatenate(flags),
                       split.include_tombstones)
        from_log = keep[keep < logged]
        if len(from_log):
            segs = np.concatenate(seg_of)[from_log]
            spans = np.concatenate(where)[from_log]
            for lo in range(0, len(from_log), BATCH_RECORDS):
                records = [bytes(clog.segments[int(s)].record_view(int(p), int(n)))  # type: ignore[union-attr]
                           for s, (p, n) in zip(segs[lo:lo + BATCH_RECORDS].tolist(),
                                                spans[lo:lo + BATCH_RECORDS].tolist(), strict=True)]
                batch = raw_records_batch(records)
                _check(batch, split, all_offsets[from_log[lo:lo + BATCH_RECORDS]])
                yield batch
        wanted = all_offsets[keep[keep >= logged]]
        if tail is not None and len(wanted):
            for batch in read_queue_split(tail):
                mask = np.isin(batch.column("queue_offset").to_numpy(), wanted)
                if mask.any():
                    yield batch.filter(pa.array(mask))
    finally:
        if clog is not None:
            clog.close()


def _check(batch: pa.RecordBatch, split: CompactedSplit, expected: np.ndarray) -> None:
    """The records the units point at are the ones they describe (else the files are damaged)."""
    offsets = batch.column("queue_offset").to_numpy()
    topics_ok = pc.all(pc.equal(batch.column("topic"), split.topic)).as_py()
    qids_ok = bool((batch.column("queue_id").to_numpy() == split.queue_id).all())
    if len(offsets) != len(expected) or not (topics_ok and qids_ok
                                             and np.array_equal(offsets, expected)):
        raise codec.RecordCorrupt(0, f"CompactionLog of {split.topic}/{split.queue_id}: a batch "
                                  "ConsumeQueue unit points at a record of another topic, queue "
                                  "or offset")


__all__ = ["CompactedSplit", "compaction_topics", "latest_topics", "queue_bounds",
           "read_compacted_split", "whole_queue_splits"]
