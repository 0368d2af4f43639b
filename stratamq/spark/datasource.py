"""The ``stratamq`` PySpark data source: one ``DataSource`` with batch and streaming readers and
writers (PySpark 4 Python Data Source API). Options are in ``docs/SPARK.md``.

Reads plan on the driver (``stratamq.spark.planning``; a batch read's plan is
``stratamq.spark.batch_read``) and run on executors
(``stratamq.spark.reading``), yielding Arrow record batches; writes append from each task
(``stratamq.spark.write``). With ``endpoints`` instead of a path, planning asks a running broker
and tasks pull from / send to it (``stratamq.spark.broker_io``). Options are checked when the
DataFrame is defined (``schema`` runs at ``load()``) so a bad one fails before any task starts,
with a message naming it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from stratamq.spark import planning
from stratamq.spark.batch_read import (  # (plan_batch: still importable from here)
    _broker,
    _broker_queues,
    _check_loss,
    _only_assigned,
    _splits,
    _topic_hints,
    plan_batch,
)
from stratamq.spark.planning import (
    EARLIEST,
    Catalog,
    LogSplit,
    OptionError,
    Queue,
    QueueSplit,
)
from stratamq.spark.reading import read_log_split, read_queue_split
from stratamq.spark.rows import spark_schema, with_headers
from stratamq.transactions.messages import HALF_TOPIC

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

# broker_io (grpc) and tier_io/tier_stream (the tier drivers) are imported where a broker or a
# tier is read (here and in batch_read): every fresh Python worker imports this module, and a
# store-directory read (or a pipeline's task) need not pay their import time (0.1-0.4 s a
# worker).

log = logging.getLogger(__name__)


class StrataMQDataSource(DataSource):
    """``spark.read.format("stratamq")``: topics of a store directory (or broker) as rows."""

    @classmethod
    def name(cls) -> str:
        return "stratamq"

    def schema(self):
        options = planning.read_options(self.options)  # checked at load(), before any task
        root, catalog = None, None
        from stratamq.spark import tier_io

        if "endpoints" in options:
            from stratamq.spark.broker_io import pull_group
            from stratamq.spark.cluster_read import cluster_queue_ids, without_group_offsets

            pull_group(options)
            # Offsets naming broker groups (a cluster's) are checked when the read is planned
            # or the stream starts.
            options = without_group_offsets(options)
            with _broker(options) as broker:
                # A cluster's topics are those of every group (some only in other groups).
                existing = cluster_queue_ids(broker) or _broker_queues(broker)
        elif tier_io.is_tier_read(options):
            existing = tier_io.tier_topics(options)
        else:
            root = planning.store_root(options)
            catalog = Catalog.load(root)
            existing = catalog.topics
        with _topic_hints(options, root, catalog):
            planning.check_read_options(options, existing)
        return spark_schema(headers=planning.bool_option(options, "includeHeaders", False))

    def reader(self, schema) -> DataSourceReader:
        return BatchReader(dict(self.options))

    def streamReader(self, schema) -> DataSourceStreamReader:
        return StreamReader(dict(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceArrowWriter:
        return BatchWriter(dict(self.options), schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamArrowWriter:
        return StreamWriter(dict(self.options), schema, overwrite)


def _read(partition: InputPartition, headers: bool = False) -> Iterator[pa.RecordBatch]:
    if isinstance(partition, LogSplit):
        batches = read_log_split(partition)
    elif isinstance(partition, QueueSplit):
        if partition.start >= partition.end:
            return  # nothing to read (the placeholder partition of an empty read)
        batches = read_queue_split(partition)
    else:
        batches = _read_remote(partition)
    for batch in batches:
        if batch.num_rows:
            yield with_headers(batch) if headers else batch


def _read_remote(partition: InputPartition) -> Iterator[pa.RecordBatch]:
    """A broker's, a tier's or a compacted split. Unpickling the split imported its module
    already; the isinstance checks go by module so no other one is loaded."""
    module = type(partition).__module__
    if module == "stratamq.spark.broker_io":
        from stratamq.spark.broker_io import BrokerSplit, read_broker_split

        if isinstance(partition, BrokerSplit):
            if partition.start >= partition.end:
                return iter(())
            return read_broker_split(partition)
    elif module == "stratamq.spark.cluster_read":
        from stratamq.spark.cluster_read import GroupSplit, read_group_split

        if isinstance(partition, GroupSplit):
            return read_group_split(partition) if partition.start < partition.end else iter(())
    elif module == "stratamq.spark.tier_io":
        from stratamq.spark import tier_io

        if isinstance(partition, tier_io.TierSplit):
            return tier_io.read_tier_split(partition)
    elif module == "stratamq.spark.tier_stream":
        from stratamq.spark import tier_stream

        if isinstance(partition, tier_stream.TierQueueSplit):
            if partition.start >= partition.end:
                return iter(())
            return tier_stream.read_tier_queue_split(partition)
    else:
        # Imported here: tasks of other splits need not load the compaction package.
        from stratamq.spark import latest

        if isinstance(partition, latest.CompactedSplit):
            return latest.read_compacted_split(partition)
    raise TypeError(f"not a stratamq split: {partition!r}")


# -- batch read ---------------------------------------------------------------------------------


class BatchReader(DataSourceReader):
    def __init__(self, options: Mapping[str, str]) -> None:
        self.splits = plan_batch(options)
        self.headers = planning.bool_option(planning.read_options(options), "includeHeaders",
                                            False)

    def partitions(self) -> list[InputPartition]:
        return list(self.splits) or [QueueSplit("", "", 0, 0, 0, True)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(partition, self.headers)


# -- streaming read -----------------------------------------------------------------------------


def _encode(offsets: dict[Queue, int]) -> dict:
    out: dict[str, dict[str, int]] = {}
    for (topic, qid), offset in sorted(offsets.items()):
        out.setdefault(topic, {})[str(qid)] = offset
    return out


def _decode(offsets: dict) -> dict[Queue, int]:
    return {(t, int(q)): int(o) for t, queues in offsets.items() for q, o in queues.items()}


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are ``{"topic": {"queueId": next offset}}``; the checkpoint keeps them, so a
    restarted query continues where the last committed micro-batch ended. Of a cluster's
    broker (``stratamq.spark.cluster_read.ClusterStream``) they are ``{"topic":
    {"<brokerName>/<queueId>": next offset}}``: queue ids repeat across broker groups."""

    def __init__(self, options: Mapping[str, str]) -> None:
        from stratamq.spark import tier_io

        opts = planning.read_options(options)
        self.options = opts
        # A tier: offsets from its ConsumeQueue files (stratamq.spark.tier_stream).
        self.tier = "endpoints" not in opts and tier_io.is_tier_read(opts)
        self.root = None if "endpoints" in opts or self.tier else planning.store_root(opts)
        self.cluster = None
        if "endpoints" in opts:
            from stratamq.spark.cluster_read import ClusterStream

            self.cluster = ClusterStream.of(opts)  # None: a broker outside a cluster
        self.starting = (self.cluster.starting() if self.cluster is not None
                         else planning.parse_offsets(opts, "startingOffsets", "latest"))
        self.max_per_trigger = planning.int_option(opts, "maxOffsetsPerTrigger", None)
        # spark-sql-kafka's admission control: wait for this many new messages, but no longer
        # than maxTriggerDelay (ms, default 15 minutes) since the last micro-batch.
        self.min_per_trigger = planning.int_option(opts, "minOffsetsPerTrigger", None)
        self.max_trigger_delay = planning.duration_ms_option(opts, "maxTriggerDelay", 15 * 60_000)
        self._last_trigger = time.monotonic()
        for name in ("startingOffsetsByTimestamp", "endingOffsetsByTimestamp",
                     "endingTimestamp"):
            if name.lower() in opts:
                raise OptionError(f"option '{name}' is for batch reads; a stream starts at "
                                  "startingOffsets or startingTimestamp")
        self.fail = planning.bool_option(opts, "failOnDataLoss", True)
        self.min_parts = planning.int_option(opts, "minPartitions", 1) or 1
        self.target: dict[Queue, int] | None = None
        self._queues()  # checks ``topics`` now

    def _queues(self) -> dict[Queue, tuple[int, int]]:
        if self.tier:
            from stratamq.spark import tier_stream

            bounds = tier_stream.tier_queue_bounds(self.options)
            topics = planning.select_topics(self.options, sorted({t for t, _q in bounds}),
                                            must_match=False, offsets=[self.starting])
            return _only_assigned(self.options, {q: b for q, b in bounds.items()
                                                 if topics is None or q[0] in topics})
        if self.cluster is not None:
            return self.cluster.queues(self.starting)
        if self.root is None:  # a broker: latest offsets from QueryOffset
            with _broker(self.options) as broker:
                with _topic_hints(self.options, None, None):
                    topics = planning.select_topics(self.options, sorted(broker.queue_counts()),
                                                    must_match=False, offsets=[self.starting])
                return _only_assigned(self.options, broker.queues(topics))
        catalog = Catalog.load(self.root)
        known = sorted(t for t in catalog.topics if t != HALF_TOPIC)  # (as in _plan_queues)
        with _topic_hints(self.options, self.root, catalog):
            topics = planning.select_topics(self.options, known,
                                            must_match=False, offsets=[self.starting])
        return _only_assigned(self.options, {q: b for q, b in catalog.queues.items()
                                             if q[0] != HALF_TOPIC
                                             and (topics is None or q[0] in topics)})

    def queue_bounds(self) -> dict[Queue, tuple[int, int]]:
        """(min, max) offset of every queue this read selects, now."""
        return self._queues()

    def initialOffset(self) -> dict:
        """Only for a new query (a restarted one takes its checkpoint's offsets instead)."""
        queues = self._queues()
        existing: dict[str, list[int]] = {}
        for topic, qid in queues:
            existing.setdefault(topic, []).append(qid)
        # As at load(), against the queues this read selects.
        starting = self.cluster.named(self.starting) if self.cluster else self.starting
        planning.check_offsets(starting, "startingOffsets", existing, existing)
        return _encode({q: planning.resolve(starting, q, b, "startingOffsets", EARLIEST)
                        for q, b in queues.items()})

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.max_per_trigger:
            return ReadMaxRows(self.max_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = {q: b[1] for q, b in self._queues().items()}

    def _decode(self, offsets: dict) -> dict[Queue, int]:
        if self.cluster is not None:  # (its queues are GroupQueue keys)
            return self.cluster.decode(offsets)
        return _decode(offsets)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = self._decode(start)
        queues = self._queues()
        if self.cluster is not None:
            self.cluster.check(begin, queues)
        latest = self.target if self.target is not None else {q: b[1] for q, b in
                                                             queues.items()}
        # A queue that appeared after the query started is read from its beginning.
        begin_of = {q: begin.get(q, queues.get(q, (0, 0))[0]) for q in latest}
        end = {q: max(begin_of[q], latest[q]) for q in latest}
        if isinstance(limit, ReadMaxRows):
            end = planning.share_rows(begin_of, end, limit.max_rows)
        if self.min_per_trigger and self.target is None:
            waited_ms = (time.monotonic() - self._last_trigger) * 1000
            if (sum(end[q] - begin_of[q] for q in end) < self.min_per_trigger
                    and waited_ms < (self.max_trigger_delay or 0)):
                return _encode({**begin, **begin_of})  # not yet: too few new messages
        if any(end[q] > begin_of[q] for q in end):
            self._last_trigger = time.monotonic()
        return _encode({**begin, **end})

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        begin, finish = self._decode(start), self._decode(end)
        bounds = self._queues()
        ranges = {}
        for queue, stop in finish.items():
            low = begin.get(queue, bounds.get(queue, (0, 0))[0])
            if queue in bounds and low < stop:
                low = _check_loss(queue, low, bounds[queue], self.fail)
            ranges[queue] = (low, max(low, stop))
        if self.tier:
            return self._tier_splits(ranges)
        if self.cluster is not None:
            return self.cluster.splits(ranges, self.min_parts)
        return _splits(self.options, self.root, ranges, self.min_parts, self.fail)

    def _tier_splits(self, ranges: dict[Queue, tuple[int, int]]) -> list[InputPartition]:
        from stratamq.spark import tier_io, tier_stream

        endpoint = tier_io._settings(self.options)[0]
        dirs = tier_stream._queue_dirs(self.options)[1]
        return [tier_stream.TierQueueSplit(self.options["path"], endpoint,
                                           dirs[(s.topic, s.queue_id)], s.topic, s.queue_id,
                                           s.start, s.end)
                for s in planning.queue_splits("", ranges, self.min_parts, self.fail)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(partition, planning.bool_option(self.options, "includeHeaders", False))


# -- writes -------------------------------------------------------------------------------------


class WriteCount(WriterCommitMessage):
    def __init__(self, count: int) -> None:
        self.count = count


class BatchWriter(DataSourceArrowWriter):
    """Appends rows to the embedded store at ``path``, or sends them to the broker at
    ``endpoints`` (at-least-once either way; see stratamq.spark.write and .broker_io)."""

    def __init__(self, options: Mapping[str, str], schema: StructType, overwrite: bool) -> None:
        from stratamq.spark.write import check_store_path, check_write_schema

        if overwrite:
            raise OptionError("mode 'overwrite' is not supported: a topic is append-only "
                              "(use mode 'append')")
        self.options = planning.write_options(options)
        path = self.options.get("path")
        self.endpoint = None
        if "endpoints" in self.options:
            with _broker(self.options) as broker:
                self.endpoint, self.connection = broker.endpoint, broker.connection
            path = self.endpoint  # for messages; rows go to the broker
        if not path:
            raise OptionError("option 'path' is missing: use .save(<store directory>)")
        self.root = path
        check_write_schema(schema, self.options)
        if self.endpoint is None:
            check_store_path(path)
        self.written = 0

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteCount:
        from stratamq.spark.write import append_batches

        if self.endpoint is not None:
            from stratamq.spark.broker_io import send_batches

            return WriteCount(send_batches(self.connection, self.options, iterator))
        return WriteCount(append_batches(self.root, self.options, iterator))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        self.written = sum(m.count for m in messages if isinstance(m, WriteCount))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        log.warning("write to %s aborted; messages already appended stay (at-least-once)",
                    self.root)


class StreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: Mapping[str, str], schema: StructType, overwrite: bool) -> None:
        self._batch = BatchWriter(options, schema, False)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteCount:
        return self._batch.write(iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self._batch.abort(messages)
