"""Planning reads of a store directory: options, the store's catalog, and the splits.

Runs on the Spark driver. Two kinds of split:

* ``LogSplit``: a byte range of one CommitLog segment (a whole-store read). A record belongs to
  the split where it *starts*; a split that starts mid-segment resyncs on the magic code and
  confirms the record by its stored physical offset (``message.resync``); the segment's blank
  record ends the last split of a segment.
* ``QueueSplit``: a range of queue offsets of one topic/queue, read through its ConsumeQueue
  (used whenever topics or offsets are given, and by every streaming read).

Every bad option raises ``OptionError`` naming the option, before any task runs.
"""

from __future__ import annotations

import difflib
import json
import logging
import math
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql.datasource import InputPartition

from stratamq.config import StoreConfig
from stratamq.store.consume_queue_store import (
    STORE_TYPE_FILES,
    open_consume_queue_store,
    read_store_type,
)
from stratamq.store.layout import StoreLayout, parse_segment_name
from stratamq.store.mapped_file_queue import MappedFileQueue

log = logging.getLogger(__name__)

EARLIEST = -2
LATEST = -1
# RocketMQ's topic charset; a ``topics`` value with anything else in it is a regex.
_TOPIC_LIST = re.compile(r"^[%|a-zA-Z0-9_\-]+(\s*,\s*[%|a-zA-Z0-9_\-]+)*$")


class OptionError(ValueError):
    """A ``stratamq`` data source option is missing or malformed; the message names it."""


class UnknownTopics(OptionError):
    """An option names topics the store (or broker) does not have; ``option`` is its name,
    ``names`` the topics it named that are not there (empty for a regex matching none)."""

    def __init__(self, option: str, names: list[str], message: str) -> None:
        super().__init__(message)
        self.option, self.names = option, names


Queue = tuple[str, int]


class LogSplit(InputPartition):
    """Records starting in CommitLog offsets [start, end) of the segment at ``segment_start``;
    ``limit`` is where the segment's valid data ends."""

    def __init__(self, root: str, segment_start: int, start: int, end: int, limit: int,
                 fail_on_data_loss: bool = True, exclude: frozenset[str] = frozenset()) -> None:
        self.root, self.segment_start = root, segment_start
        self.start, self.end, self.limit = start, end, limit
        self.fail_on_data_loss = fail_on_data_loss
        self.exclude = exclude  # topics read otherwise (compaction topics' latest values)


class QueueSplit(InputPartition):
    """Queue offsets [start, end) of one topic/queue, read through its ConsumeQueue."""

    def __init__(self, root: str, topic: str, queue_id: int, start: int, end: int,
                 fail_on_data_loss: bool) -> None:
        self.root, self.topic, self.queue_id = root, topic, queue_id
        self.start, self.end, self.fail_on_data_loss = start, end, fail_on_data_loss


# -- options ------------------------------------------------------------------------------------


def store_root(options: Mapping[str, str]) -> str:
    path = options.get("path")
    if not path:
        raise OptionError("option 'path' is missing: use .load(<store directory>) or "
                          "option('endpoints', 'host:port') to read a running broker")
    if not (Path(path) / "commitlog").is_dir():
        raise OptionError(f"option 'path': {path} is not a store directory (no commitlog/)")
    return path


def int_option(options: Mapping[str, str], name: str, default: int | None,
               minimum: int = 1) -> int | None:
    raw = options.get(name.lower())
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise OptionError(f"option '{name}': {raw!r} is not an integer") from None
    if value < minimum:
        raise OptionError(f"option '{name}': must be at least {minimum}, got {value}")
    return value


def latest_values(options: Mapping[str, str]) -> tuple[bool, bool]:
    """Options ``latestValues`` (compaction topics of a store directory as tables of their
    latest values, default true) and ``includeTombstones`` (keys whose latest record deletes
    them stay in the table, as that record; default false)."""
    latest = bool_option(options, "latestValues", True)
    tombstones = bool_option(options, "includeTombstones", False)
    if tombstones and not latest:
        raise OptionError("option 'includeTombstones' applies to latest-value tables: it cannot "
                          "be true with latestValues=false (which reads every version)")
    return latest, tombstones


def bool_option(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = options.get(name.lower())
    if raw is None:
        return default
    if raw.lower() not in ("true", "false"):
        raise OptionError(f"option '{name}': {raw!r} is not true or false")
    return raw.lower() == "true"


def parse_offsets(options: Mapping[str, str], name: str,
                  default: str) -> str | dict[str, dict[int, int]]:
    """"earliest", "latest", or {topic: {queue_id: offset}} from JSON (-2 earliest, -1 latest)."""
    raw = options.get(name.lower(), default).strip()
    if raw in ("earliest", "latest"):
        return raw
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise OptionError(f"option '{name}': not JSON ({exc.msg} at char {exc.pos}): {raw!r}; "
                          f"want \"earliest\", \"latest\" or "
                          f"{{\"topic\": {{\"0\": 23, \"1\": -2}}}}") from None
    if not isinstance(parsed, dict) or not all(isinstance(v, dict) for v in parsed.values()):
        raise OptionError(f"option '{name}': want {{\"topic\": {{\"queueId\": offset}}}}, "
                          f"got {raw!r}")
    out: dict[str, dict[int, int]] = {}
    for topic, queues in parsed.items():
        for qid, offset in queues.items():
            if not str(qid).isdigit() or type(offset) is not int or offset < EARLIEST:
                raise OptionError(f"option '{name}': {topic}/{qid}: want a queue id and an "
                                  f"offset (-2 earliest, -1 latest, or >= 0), got {offset!r}")
            out.setdefault(topic, {})[int(qid)] = offset
    return out


_DURATION = re.compile(r"(\d+)\s*(ms|s|m|h|d)?", re.IGNORECASE)
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def duration_ms_option(options: Mapping[str, str], name: str, default: int) -> int:
    """A duration as spark-sql-kafka writes them (``15m``, ``30s``, ``500ms``), or ms."""
    raw = options.get(name.lower())
    if raw is None:
        return default
    match = _DURATION.fullmatch(raw.strip())
    if match is None:
        raise OptionError(f"option '{name}': {raw!r} is not a duration (500ms, 30s, 15m, 1h, "
                          "or a number of ms)")
    return int(match.group(1)) * _UNIT_MS[(match.group(2) or "ms").lower()]


def parse_timestamps(options: Mapping[str, str], name: str) -> dict[Queue, int]:
    """spark-sql-kafka's ``{"topic": {"0": ms}}`` (``*OffsetsByTimestamp``): per queue a time;
    {} when the option is not given."""
    raw = options.get(name.lower())
    if raw is None:
        return {}
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise OptionError(f"option '{name}': not JSON ({exc.msg}): {raw!r}; want "
                          "{\"topic\": {\"0\": 1700000000000}}") from None
    if not isinstance(parsed, dict) or not all(isinstance(v, dict) for v in parsed.values()):
        raise OptionError(f"option '{name}': want {{\"topic\": {{\"queueId\": ms}}}}, got "
                          f"{raw!r}")
    out: dict[Queue, int] = {}
    for topic, queues in parsed.items():
        for qid, ms in queues.items():
            if not str(qid).isdigit() or type(ms) is not int or ms < 0:
                raise OptionError(f"option '{name}': {topic}/{qid}: want a queue id and a time "
                                  f"in ms since the epoch, got {ms!r}")
            out[(topic, int(qid))] = ms
    return out


# -- the store's catalog ------------------------------------------------------------------------


@dataclass
class Catalog:
    """What planning needs to know about a store directory, read without writing a byte."""

    root: str
    queues: dict[Queue, tuple[int, int]]  # (topic, queue id) -> (min offset, max offset)
    segment_size: int
    segments: list[int]  # start offsets of the CommitLog segments

    @property
    def topics(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for topic, qid in sorted(self.queues):
            out.setdefault(topic, []).append(qid)
        return out

    @classmethod
    def load(cls, root: str) -> Catalog:
        """ConsumeQueue bounds straight from the store's ConsumeQueue store, opened read-only
        (cheap enough for every micro-batch): the files, or the RocksDB one when the store
        records ``storeType=defaultRocksDB``."""
        layout = StoreLayout(root)
        segments = sorted(s for p in layout.commitlog_dir.iterdir()
                          if (s := parse_segment_name(p.name)) is not None)
        segment_size = MappedFileQueue.size_on_disk(layout.commitlog_dir) or 0
        store = open_consume_queue_store(store_type_of(root), layout, StoreConfig().cq_file_size,
                                         read_only=True)
        store.load()
        try:
            store.recover()
            store.correct_min_offsets(segments[0] if segments else 0)
            queues = {(cq.topic, cq.queue_id): (cq.min_offset(), cq.max_offset())
                      for cq in store}
        finally:
            store.close()
        return cls(root, queues, segment_size, segments)


def store_type_of(root: str) -> str:
    """The ConsumeQueue store type a store directory records (files when none is recorded, as
    in a store Apache RocketMQ wrote)."""
    try:
        return read_store_type(Path(root)) or STORE_TYPE_FILES
    except ValueError as exc:
        raise OptionError(f"option 'path': {exc}") from None


def commitlog_bounds(root: str) -> tuple[int, int]:
    """(min, end) of the CommitLog's valid data. Not a store open: its recovery CRC-checks
    every record of the last segments, seconds per GiB on every query (``reading.log_bounds``)."""
    from stratamq.spark.reading import log_bounds

    return log_bounds(root)


# -- topics and offsets -------------------------------------------------------------------------


def is_topic_list(raw: str) -> bool:
    """Is this ``topics`` value a comma list of names (else it is a regex)?"""
    return bool(_TOPIC_LIST.fullmatch(raw.strip()))


def select_topics(options: Mapping[str, str], known: list[str], *, must_match: bool,
                  offsets: Sequence[object]) -> list[str] | None:
    """Topics the ``topics`` option names; None = all. A value made only of topic-name
    characters and commas is a list (every topic must exist); anything else is a regex
    (``must_match``: it must match a topic now). ``options`` keys are lower case."""
    raw = options.get("topics")
    if raw is None:
        named = sorted({t for o in offsets if isinstance(o, dict) for t in o})
        return named or None
    raw = raw.strip()
    if not raw:
        raise OptionError("option 'topics' is empty")
    if is_topic_list(raw):
        listed = [t.strip() for t in raw.split(",")]
        unknown = [t for t in listed if t not in known]
        if unknown:
            raise UnknownTopics("topics", unknown, f"option 'topics': unknown topic(s) "
                                f"{', '.join(unknown)}; the store has "
                                f"{', '.join(known) or 'no topics'}")
        return listed
    try:
        pattern = re.compile(raw)
    except re.error as exc:
        raise OptionError(f"option 'topics': {raw!r} is neither a topic list nor a regex "
                          f"({exc})") from None
    matched = [t for t in known if pattern.fullmatch(t)]
    if must_match and not matched:
        raise UnknownTopics("topics", [], f"option 'topics': pattern {raw!r} matches no "
                            f"topic; the store has {', '.join(known) or 'no topics'}")
    return matched


# Option names (lower case: Spark's options are case-insensitive) each side understands.
READ_OPTIONS = frozenset({
    "path", "topics", "subscribe", "subscribepattern", "startingoffsets", "endingoffsets",
    "startingtimestamp", "minpartitions", "failondataloss", "maxoffsetspertrigger",
    "endpoints", "tls", "tlscafile", "tlscertfile", "tlskeyfile", "accesskey", "secretkey",
    "group", "includeheaders",
    "startingoffsetsbytimestamp", "endingoffsetsbytimestamp", "endingtimestamp",
    "minoffsetspertrigger", "maxtriggerdelay", "assign", "config", "tieredstores3endpoint",
    "latestvalues", "includetombstones",
})  # fmt: skip
WRITE_OPTIONS = frozenset({
    "path", "topic", "endpoints", "tls", "tlscafile", "tlscertfile", "tlskeyfile", "accesskey",
    "secretkey", "queuenums",
    "locktimeoutms", "sendretries", "mappedfilesizecommitlog", "mappedfilesizeconsumequeue",
    "checkpointlocation",
})  # fmt: skip
# spark-sql-kafka options StrataMQ does not have (yet): named, so a Kafka user is not left
# wondering why one did nothing.
KAFKA_ONLY = frozenset({
    "kafka.bootstrap.servers", "startingoffsetsbytimestampstrategy",
    "groupidprefix", "kafka.group.id",
    "fetchoffset.numretries", "fetchoffset.retryintervalms",
})  # fmt: skip
_CANONICAL = {name.lower(): name for name in (
    "topics", "startingOffsets", "endingOffsets", "startingTimestamp", "minPartitions",
    "failOnDataLoss", "maxOffsetsPerTrigger", "endpoints", "tls", "tlsCaFile", "accessKey",
    "secretKey", "group", "path", "topic", "queueNums", "lockTimeoutMs", "sendRetries",
    "mappedFileSizeCommitLog", "mappedFileSizeConsumeQueue", "checkpointLocation", "subscribe",
    "subscribePattern", "includeHeaders", "startingOffsetsByTimestamp",
    "endingOffsetsByTimestamp", "endingTimestamp", "minOffsetsPerTrigger", "maxTriggerDelay",
    "assign", "config", "tieredStoreS3Endpoint", "latestValues", "includeTombstones")}


def _check_names(options: Mapping[str, str], allowed: frozenset[str], side: str) -> None:
    for key in options:
        if key in allowed:
            continue
        if key in KAFKA_ONLY or key.startswith("kafka."):
            raise OptionError(f"option {key!r} is spark-sql-kafka's; StrataMQ {side}s do not "
                              "support it (docs/SPARK.md lists the options)")
        close = difflib.get_close_matches(key, sorted(allowed), n=1, cutoff=0.75)
        hint = f": did you mean {_CANONICAL.get(close[0], close[0])!r}?" if close else ""
        raise OptionError(f"unknown {side} option {key!r}{hint} (docs/SPARK.md lists the "
                          "options)")


def read_options(options: Mapping[str, str]) -> dict[str, str]:
    """A read's options with lower-case keys, every name checked, and spark-sql-kafka's
    ``subscribe`` (a comma list) and ``subscribePattern`` (a regex) turned into ``topics``."""
    opts = {k.lower(): v for k, v in options.items()}
    _check_names(opts, READ_OPTIONS, "read")
    given = [k for k in ("topics", "subscribe", "subscribepattern", "assign") if opts.get(k)]
    if len(given) > 1:
        raise OptionError(f"options {' and '.join(_CANONICAL[k] for k in given)} both name "
                          "topics: give one")
    if opts.get("assign"):
        # Kept as given (queues are filtered with ``assigned``); ``topics`` lists its topics.
        opts["topics"] = ",".join(sorted({t for t, _q in assigned(opts) or ()}))
    elif opts.get("subscribe"):
        topics = opts.pop("subscribe")
        if not _TOPIC_LIST.fullmatch(topics.strip()):
            raise OptionError(f"option 'subscribe': {topics!r} is not a comma list of topic "
                              "names (use subscribePattern for a regex)")
        opts["topics"] = topics
    elif opts.get("subscribepattern"):
        pattern = opts.pop("subscribepattern")
        try:
            re.compile(pattern)
        except re.error as exc:
            raise OptionError(f"option 'subscribePattern': {pattern!r} is not a regex "
                              f"({exc})") from None
        # A pattern made only of name characters would read as a list: "(?:...)" keeps it a
        # regex matching exactly that name.
        opts["topics"] = pattern if not _TOPIC_LIST.fullmatch(pattern) else f"(?:{pattern})"
    return opts


def assigned(options: Mapping[str, str]) -> set[Queue] | None:
    """spark-sql-kafka's ``assign`` (``{"topic": [0, 1]}``) as a set of queues; None when the
    option is not given."""
    raw = options.get("assign")
    if not raw:
        return None
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise OptionError(f"option 'assign': not JSON ({exc.msg}): {raw!r}; want "
                          "{\"topic\": [0, 1]}") from None
    if (not isinstance(parsed, dict) or not parsed or not all(
            isinstance(v, list) and v and all(type(q) is int and q >= 0 for q in v)
            for v in parsed.values())):
        raise OptionError(f"option 'assign': want {{\"topic\": [queue ids]}}, got {raw!r}")
    return {(t, q) for t, queues in parsed.items() for q in queues}


def write_options(options: Mapping[str, str]) -> dict[str, str]:
    """A write's options with lower-case keys, every name checked."""
    opts = {k.lower(): v for k, v in options.items()}
    _check_names(opts, WRITE_OPTIONS, "write")
    return opts


def check_read_options(options: Mapping[str, str],
                       existing: Mapping[str, Collection[int]]) -> None:
    """Every read option, checked when the DataFrame is defined (lower-case keys). ``existing``:
    topic -> queue ids of the store (or broker)."""
    for name in ("minPartitions", "maxOffsetsPerTrigger"):
        int_option(options, name, None)
    for name in ("startingTimestamp", "endingTimestamp", "minOffsetsPerTrigger"):
        int_option(options, name, None, minimum=0)
    duration_ms_option(options, "maxTriggerDelay", 0)
    for name in ("startingOffsetsByTimestamp", "endingOffsetsByTimestamp"):
        parse_timestamps(options, name)
    bool_option(options, "failOnDataLoss", True)
    bool_option(options, "includeHeaders", False)
    latest_values(options)
    missing = sorted(f"{t}/{q}" for t, q in assigned(options) or ()
                     if q not in existing.get(t, ()))
    if missing:
        raise OptionError(f"option 'assign': no such queue: {', '.join(missing[:5])}")
    offsets = [parse_offsets(options, "startingOffsets", "earliest"),
               parse_offsets(options, "endingOffsets", "latest")]
    known = sorted(existing)
    topics = select_topics(options, known, must_match=False, offsets=offsets)
    for spec, name in zip(offsets, ("startingOffsets", "endingOffsets")):
        check_offsets(spec, name, topics if topics is not None else known, existing)


def resolve(spec: str | dict[str, dict[int, int]], queue: Queue, bounds: tuple[int, int],
            name: str, default: int) -> int:
    """One queue's offset from an offsets option: earliest/latest resolved to its bounds."""
    if isinstance(spec, str):
        value = EARLIEST if spec == "earliest" else LATEST
    else:
        value = spec.get(queue[0], {}).get(queue[1], default)
    if value == EARLIEST:
        return bounds[0]
    if value == LATEST:
        return bounds[1]
    return value


def check_offsets(spec: object, name: str, topics: Collection[str],
                  existing: Mapping[str, Collection[int]]) -> None:
    """OptionError naming what an offsets option gives that the read would skip without a word:
    a topic the store (or broker) does not have (``UnknownTopics``: with no ``topics`` option
    the offsets alone name the topics, and nothing else checked them), one ``topics`` leaves
    out, or a queue id the topic does not have."""
    if not isinstance(spec, dict):
        return
    unknown = [t for t in spec if t not in existing]
    if unknown:
        raise UnknownTopics(name, unknown, f"option '{name}': unknown topic(s) "
                            f"{', '.join(unknown)}; the topics are "
                            f"{', '.join(sorted(existing)) or 'none'}")
    unselected = [t for t in spec if t not in topics]
    if unselected:
        raise OptionError(f"option '{name}': topic(s) {', '.join(unselected)} not read: "
                          "option 'topics' leaves them out")
    for topic, offsets in spec.items():
        missing = sorted(set(offsets) - set(existing[topic]))
        if missing:
            raise OptionError(f"option '{name}': topic {topic} has no queue "
                              f"{', '.join(map(str, missing))}; its queues are "
                              f"{_queue_ids(existing[topic])}")


def _queue_ids(ids: Collection[int]) -> str:
    ordered = sorted(ids)
    if ordered and ordered == list(range(len(ordered))) and len(ordered) > 2:
        return f"0 to {len(ordered) - 1}"
    return ", ".join(map(str, ordered)) or "none"


# -- splits -------------------------------------------------------------------------------------


def log_splits(root: str, catalog: Catalog, min_offset: int, end: int,
               min_partitions: int, *, fail_on_data_loss: bool = True,
               exclude: frozenset[str] = frozenset()) -> list[LogSplit]:
    """Byte ranges of CommitLog segments, at least ``min_partitions`` of them when there are
    that many bytes, never crossing a segment. A segment missing between two others is data
    loss (DataLoss, or a warning with ``fail_on_data_loss`` false)."""
    size = catalog.segment_size
    total = max(0, end - min_offset)
    if total == 0 or size == 0:
        return []
    _check_continuous(catalog.segments, size, end, fail_on_data_loss)
    piece = max(1, math.ceil(total / max(1, min_partitions)))
    splits = []
    for seg in catalog.segments:
        lo, hi = max(seg, min_offset), min(seg + size, end)
        if lo >= hi:
            continue
        count = math.ceil((hi - lo) / piece)
        step = math.ceil((hi - lo) / count)
        limit = min(seg + size, end)
        for k in range(count):
            a, b = lo + k * step, min(hi, lo + (k + 1) * step)
            if a < b:
                splits.append(LogSplit(root, seg, a, b, limit, fail_on_data_loss, exclude))
    return splits


def _check_continuous(segments: list[int], size: int, end: int, fail: bool) -> None:
    from stratamq.spark.reading import DataLoss

    for before, after in zip(segments, segments[1:]):
        if after != before + size and after <= end:
            text = (f"CommitLog segments from {before + size:020d} to {after:020d} are missing: "
                    f"the records at CommitLog offsets [{before + size}, {after}) cannot be read")
            if fail:
                raise DataLoss(text + ". Set failOnDataLoss=false to skip them with a warning.")
            log.warning("%s (skipped: failOnDataLoss=false)", text)


def queue_splits(root: str, ranges: dict[Queue, tuple[int, int]], min_partitions: int,
                 fail_on_data_loss: bool) -> list[QueueSplit]:
    """One split per non-empty queue range, the ranges cut so that there are at least
    ``min_partitions`` (largest first) when there are that many messages."""
    live = {q: r for q, r in ranges.items() if r[1] > r[0]}
    total = sum(e - s for s, e in live.values())
    if not total:
        return []
    piece = max(1, math.ceil(total / max(min_partitions, len(live))))
    splits = []
    for (topic, qid), (start, end) in sorted(live.items()):
        count = max(1, math.ceil((end - start) / piece))
        step = math.ceil((end - start) / count)
        for a in range(start, end, step):
            splits.append(QueueSplit(root, topic, qid, a, min(end, a + step), fail_on_data_loss))
    return splits


def share_rows(begin: dict[Queue, int], end: dict[Queue, int], max_rows: int
               ) -> dict[Queue, int]:
    """Ends that share ``max_rows`` (a stream's maxOffsetsPerTrigger) among queues in proportion
    to what each has (as spark-sql-kafka)."""
    available = {q: end[q] - begin[q] for q in end}
    total = sum(available.values())
    if total <= max_rows:
        return end
    out = {}
    given = 0
    for q, n in sorted(available.items()):
        take = n * max_rows // total
        out[q] = begin[q] + take
        given += take
    for q, _n in sorted(available.items(), key=lambda kv: -kv[1]):  # hand out the remainder
        if given >= max_rows:
            break
        if out[q] < end[q]:
            out[q] += 1
            given += 1
    return out
