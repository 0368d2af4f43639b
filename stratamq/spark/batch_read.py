"""Planning a batch read of the ``stratamq`` source (``plan_batch``): at a store directory, a
tier, a broker (``endpoints``) or, through one of its brokers, a whole cluster
(``stratamq.spark.cluster_read``). The topics are selected, every offsets option resolved per
queue (offsets, times, earliest/latest, ``assign``) and checked against the queues' bounds, and
the ranges cut into splits that ``stratamq.spark.reading`` / ``.broker_io`` read on executors.

The helpers the streaming reader shares live here too (``stratamq.spark.datasource``): the
broker ``endpoints`` names, hints for unknown topics, ``assign``, splits and the data-loss check.
Moved out of ``datasource`` unchanged; it still exports ``plan_batch``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from pyspark.sql.datasource import InputPartition

from stratamq.spark import planning
from stratamq.spark.planning import EARLIEST, LATEST, Catalog, OptionError, Queue
from stratamq.spark.reading import DataLoss
from stratamq.transactions.messages import HALF_TOPIC

if TYPE_CHECKING:
    from stratamq.spark.broker_io import BrokerCatalog

log = logging.getLogger(__name__)


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
