"""The ``stratamq`` PySpark data source: one ``DataSource`` with batch and streaming readers and
writers (PySpark 4 Python Data Source API). Options are in ``docs/SPARK.md``.

Reads plan on the driver (``stratamq.spark.planning``) and run on executors
(``stratamq.spark.reading``), yielding Arrow record batches; writes append from each task
(``stratamq.spark.write``). With ``endpoints`` instead of a path, planning asks a running broker
and tasks pull from / send to it (``stratamq.spark.broker_io``). Options are checked when the
DataFrame is defined (``schema`` runs at ``load()``) so a bad one fails before any task starts,
with a message naming it.
"""

from __future__ import annotations

import contextlib
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
from stratamq.spark.planning import (
    EARLIEST,
    LATEST,
    Catalog,
    LogSplit,
    OptionError,
    Queue,
    QueueSplit,
)
from stratamq.spark.reading import DataLoss, read_log_split, read_queue_split
from stratamq.spark.rows import spark_schema, with_headers
from stratamq.transactions.messages import HALF_TOPIC

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

    from stratamq.spark.broker_io import BrokerCatalog

# broker_io (grpc) and tier_io/tier_stream (the tier drivers) are imported where a broker or a
# tier is read: every fresh Python worker imports this module, and a store-directory read (or
# a pipeline's task) need not pay their import time (0.1-0.4 s a worker).

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


def _broker(options: Mapping[str, str]) -> BrokerCatalog:
    """The broker ``endpoints`` names (lower-case keys); a path alongside it is refused."""
    if options.get("path"):
        raise OptionError("option 'endpoints': give either a store path or endpoints, not both")
    from stratamq.spark.broker_io import BrokerCatalog, connection_of

    return BrokerCatalog(connection_of(options), options)


def _broker_queues(broker: BrokerCatalog) -> dict[str, list[int]]:
    """topic -> queue ids of a broker (a topic's queues are numbered from 0)."""
    return {t: list(range(n)) for t, n in broker.queue_counts().items()}


# -- hints for unknown topics -------------------------------------------------------------------


@contextlib.contextmanager
def _topic_hints(options: Mapping[str, str], root: str | None,
                 catalog: Catalog | None) -> Iterator[None]:
    """Adds to an unknown-topic OptionError what most likely caused it: ``|`` read as part of a
    topic name, or a store whose ConsumeQueues are missing (whole-store reads still work)."""
    try:
        yield
    except planning.UnknownTopics as exc:
        text = str(exc)
        hints = []
        piped = [t for t in exc.names if "|" in t] if exc.option == "topics" else []
        if piped:
            hints.append(f"{', '.join(piped)} is read as a topic name because '|' may be "
                         "part of one; for a regex add another regex character, e.g. "
                         f"'({piped[0]})' or '{piped[0]}$'")
        if catalog is not None and root is not None and not catalog.queues and _has_records(root):
            hints.append("the store has CommitLog records but no ConsumeQueues (consumequeue/ "
                         "missing or empty), so no topic is known: run `stratamq store verify "
                         f"--store {root}` to rebuild them (a read with no topics or offsets "
                         "reads the CommitLog directly)")
        if not hints:
            raise
        raise OptionError("; ".join([text, *hints])) from None


def _has_records(root: str) -> bool:
    try:
        low, end = planning.commitlog_bounds(root)
    except Exception:  # noqa: BLE001 - only a hint: a damaged CommitLog is reported elsewhere
        return False
    return end > low


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


def plan_batch(options: Mapping[str, str]) -> list[InputPartition]:
    from stratamq.spark import tier_io

    options = planning.read_options(options)
    if "endpoints" in options:
        from stratamq.spark.cluster_read import names_groups, plan_cluster

        with _broker(options) as broker:
            groups = broker.cluster_groups()
            # A broker alone, or the sole group of a cluster read with queue-id offsets: as
            # ever, at the broker given.
            if groups is None or (len(groups) < 2 and not names_groups(options)):
                return _plan_queues(options, broker, None)
        return plan_cluster(options, broker.connection, groups, broker.cluster_endpoints,
                            _broker, _plan_queues)
    if tier_io.is_tier_read(options):  # a tier, read without a broker or a store
        known = sorted(tier_io.tier_topics(options))
        with _topic_hints(options, None, None):
            topics = planning.select_topics(options, known, must_match=True, offsets=[])
        return list(tier_io.plan_tier(options, topics))
    root = planning.store_root(options)
    return _plan_queues(options, None, root)


def _plan_queues(options: dict[str, str], broker: BrokerCatalog | None,
                 root: str | None) -> list[InputPartition]:
    """Splits of a batch read, from a store directory (``root``) or a ``broker``."""
    catalog = Catalog.load(root) if root is not None else None
    min_parts = planning.int_option(options, "minPartitions", 1) or 1
    fail = planning.bool_option(options, "failOnDataLoss", True)
    starting = planning.parse_offsets(options, "startingOffsets", "earliest")
    ending = planning.parse_offsets(options, "endingOffsets", "latest")
    timestamp = planning.int_option(options, "startingTimestamp", None, minimum=0)
    ending_time = planning.int_option(options, "endingTimestamp", None, minimum=0)
    start_times = planning.parse_timestamps(options, "startingOffsetsByTimestamp")
    end_times = planning.parse_timestamps(options, "endingOffsetsByTimestamp")
    by_times = bool(start_times or end_times) or ending_time is not None
    if catalog is not None:
        existing = catalog.topics
    else:
        assert broker is not None  # a read has a store directory or a broker
        existing = _broker_queues(broker)
    # Half messages are not messages until committed (their commit is a record of the real
    # topic): their topic is neither listed nor read.
    known = sorted(t for t in existing if t != HALF_TOPIC)
    with _topic_hints(options, root, catalog):
        topics = planning.select_topics(options, known, must_match=True,
                                        offsets=[starting, ending])
        if (root is not None and catalog is not None and topics is None
                and starting == "earliest"
                and ending == "latest" and timestamp is None and not by_times):
            low, end = planning.commitlog_bounds(root)
            from stratamq.spark import latest  # (tasks of other splits need not load it)

            tables = latest.whole_queue_splits(options, root, catalog.queues, known, fail)
            exclude = frozenset(latest.latest_topics(options, root, known)) | {HALF_TOPIC}
            return [*planning.log_splits(root, catalog, low, end, min_parts,
                                         fail_on_data_loss=fail, exclude=exclude), *tables]
        topics = topics if topics is not None else known
        planning.check_offsets(starting, "startingOffsets", topics, existing)
        planning.check_offsets(ending, "endingOffsets", topics, existing)
    if ending == "earliest" or (isinstance(ending, dict) and any(
            v == EARLIEST for q in ending.values() for v in q.values())):
        raise OptionError("option 'endingOffsets': earliest (-2) is not allowed as an end")
    if catalog is not None:
        queues = {q: b for q, b in catalog.queues.items() if q[0] in topics}
    else:
        assert broker is not None
        queues = broker.queues(topics)
    queues = _only_assigned(options, queues)
    from stratamq.spark import latest

    latest_topics = latest.latest_topics(options, root, topics)
    if latest_topics:
        queues.update(latest.queue_bounds(
            root or "", {q: b for q, b in queues.items() if q[0] in latest_topics}))
    for name, times in (("startingOffsetsByTimestamp", start_times),
                        ("endingOffsetsByTimestamp", end_times)):
        missing = sorted(f"{t}/{q}" for t, q in times if (t, q) not in queues)
        if missing:
            raise OptionError(f"option '{name}': no such queue among those read: "
                              f"{', '.join(missing[:5])}")
    # spark-sql-kafka's precedence: a single time over per-queue times over offsets.
    start_at = ({q: timestamp for q in queues} if timestamp is not None else start_times)
    end_at = ({q: ending_time for q in queues} if ending_time is not None else end_times)
    by_time = _times_to_offsets(root, broker, start_at)
    end_by_time = _times_to_offsets(root, broker, end_at)
    ranges = {}
    for queue, bounds in queues.items():
        if queue in by_time:
            start = by_time[queue]
            given = (f"option 'startingTimestamp' ({timestamp})" if timestamp is not None else
                     f"option 'startingOffsetsByTimestamp' ({start_at[queue]})")
        else:
            start = planning.resolve(starting, queue, bounds, "startingOffsets", EARLIEST)
            given = _how_given(starting, queue, "startingOffsets", "earliest")
            if _explicit(starting, queue) and start > bounds[1]:
                raise OptionError(
                    f"option 'startingOffsets': {queue[0]}/{queue[1]}: offset {start} is after "
                    f"the end of the queue ({bounds[1]}, the next offset to be written); -1 "
                    "starts at the end")
        # An end past the queue's end reads to its end (as spark-sql-kafka's "latest").
        end = min(end_by_time[queue] if queue in end_by_time else
                  planning.resolve(ending, queue, bounds, "endingOffsets", LATEST), bounds[1])
        if start > end:
            raise OptionError(
                f"option 'endingOffsets': {queue[0]}/{queue[1]}: the starting offset {start} "
                f"({given}) is after the ending offset {end} "
                f"({_how_given(ending, queue, 'endingOffsets', 'latest')})")
        ranges[queue] = (_check_loss(queue, start, bounds, fail), end)
    _, tombstones = planning.latest_values(options)
    compacted: list[InputPartition] = [
        latest.CompactedSplit(root or "", t, q, s, e, tombstones, fail)
        for (t, q), (s, e) in sorted(ranges.items()) if t in latest_topics and e > s]
    rest = {q: r for q, r in ranges.items() if q[0] not in latest_topics}
    return [*_splits(options, root, rest, min_parts, fail), *compacted]


def _only_assigned(options: Mapping[str, str], queues: dict[Queue, tuple[int, int]]
                   ) -> dict[Queue, tuple[int, int]]:
    """The queues option ``assign`` names (all of ``queues`` without it); a named queue that
    does not exist is refused."""
    wanted = planning.assigned(options)
    if wanted is None:
        return queues
    missing = sorted(f"{t}/{q}" for t, q in wanted - set(queues))
    if missing:
        raise OptionError(f"option 'assign': no such queue: {', '.join(missing[:5])}")
    return {q: b for q, b in queues.items() if q in wanted}


def _explicit(spec: object, queue: Queue) -> bool:
    """Whether an offsets option gives ``queue`` an offset of its own (not -1 / -2)."""
    return isinstance(spec, dict) and spec.get(queue[0], {}).get(queue[1], LATEST) >= 0


def _how_given(spec: object, queue: Queue, name: str, default: str) -> str:
    """Where a queue's resolved offset came from, for messages."""
    if _explicit(spec, queue):
        return f"option '{name}'"
    if not isinstance(spec, dict):
        return f"{spec}, option '{name}'"
    value = spec.get(queue[0], {}).get(queue[1])
    if value is None:
        return f"{default}: the queue is not in option '{name}'"
    return f"{'earliest' if value == EARLIEST else 'latest'}, option '{name}'"


def _splits(options: Mapping[str, str], root: str | None, ranges: dict[Queue, tuple[int, int]],
            min_parts: int, fail: bool) -> list[InputPartition]:
    splits = planning.queue_splits(root or "", ranges, min_parts, fail)
    if root is not None:
        return list(splits)
    from stratamq.spark.broker_io import BrokerSplit, connection_of, pull_group

    connection = connection_of(options)  # TLS roots and credentials travel with each split
    group = pull_group(options)
    return [BrokerSplit.of(connection, s, group) for s in splits]


def _check_loss(queue: Queue, start: int, bounds: tuple[int, int], fail: bool) -> int:
    if start >= bounds[0]:
        return start
    text = (f"{queue[0]}/{queue[1]}: offsets [{start}, {bounds[0]}) were deleted by retention "
            "before they were read")
    if fail:
        raise DataLoss(text + "; set failOnDataLoss=false to skip them with a warning")
    log.warning("%s; skipping to %d (failOnDataLoss=false)", text, bounds[0])
    return bounds[0]


def _times_to_offsets(root: str | None, broker: BrokerCatalog | None,
                      times: dict[Queue, int]) -> dict[Queue, int]:
    """Per queue, the first offset stored at or after its time (one lookup per distinct time
    and queue set)."""
    by_ms: dict[int, list[Queue]] = {}
    for queue, ms in times.items():
        by_ms.setdefault(ms, []).append(queue)
    out: dict[Queue, int] = {}
    for ms, queues in by_ms.items():
        if root is not None:
            out.update(_offsets_by_time(root, queues, ms))
        else:
            assert broker is not None
            out.update(broker.offsets_by_time(queues, ms))
    return out


def _offsets_by_time(root: str, queues: list[Queue], timestamp: int) -> dict[Queue, int]:
    """Per queue, the first offset stored at or after ``timestamp``, through the store's index."""
    from stratamq.config import StoreConfig
    from stratamq.store.message_store import MessageStore

    if not hasattr(MessageStore, "get_offset_in_queue_by_time"):
        raise OptionError("option 'startingTimestamp' needs the store index "
                          "(MessageStore.get_offset_in_queue_by_time), not in this build")
    with MessageStore(StoreConfig(store_path_root_dir=root), read_only=True).open() as store:
        return {(t, q): store.get_offset_in_queue_by_time(t, q, timestamp) for t, q in queues}


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
