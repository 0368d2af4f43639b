"""Appending a DataFrame's rows to an embedded store from Spark tasks.

The store lock is per process (``flock`` + RocketMQ's POSIX lock), and every Python worker is a
process, so tasks cannot share one open store. Each task instead buffers its rows as messages
and, per buffer, opens the store read-write (waiting for the lock while another task or process
holds it), appends, and closes it. Tasks on one machine therefore take turns; on a cluster the
directory must be on a filesystem every executor mounts with working locks. A store a broker
is serving is locked for as long as the broker runs: write to the broker (``endpoints``).

Delivery is at-least-once: a task that fails after an append and is retried appends its rows
again, and a streaming micro-batch that is re-run after a failure is written again.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path

import pyarrow as pa
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    ByteType,
    CharType,
    DataType,
    IntegerType,
    LongType,
    MapType,
    NullType,
    ShortType,
    StringType,
    StructType,
    VarcharType,
)

from stratamq.config import StoreConfig
from stratamq.message import Message, Prop
from stratamq.spark.planning import OptionError, int_option
from stratamq.store.message_store import MessageStore, StoreLocked, topic_name_problem

BUFFER_BYTES = 32 * 1024 * 1024
PUT_BATCH = 256


def _is_string(t: DataType) -> bool:
    return isinstance(t, (StringType, CharType, VarcharType))


# Every column the writer reads, with the Spark types it takes and how to say them. Checked when
# the writer is made: a value of another type would otherwise become something else silently
# (an INT body as that many zero bytes) or fail deep inside a task.
COLUMN_TYPES: dict[str, tuple[Callable[[DataType], bool], str]] = {
    "body": (lambda t: isinstance(t, BinaryType) or _is_string(t), "BINARY or STRING"),
    "topic": (_is_string, "STRING"),
    "tags": (_is_string, "STRING"),
    "keys": (lambda t: _is_string(t) or (isinstance(t, ArrayType) and _is_string(t.elementType)),
             "STRING or ARRAY<STRING>"),
    "properties": (lambda t: (isinstance(t, MapType) and _is_string(t.keyType)
                              and _is_string(t.valueType)), "MAP<STRING,STRING>"),
    "queue_id": (lambda t: isinstance(t, (ByteType, ShortType, IntegerType, LongType)),
                 "TINYINT, SMALLINT, INT or BIGINT"),
    # A spark-sql-kafka sink frame: value is the body, key a message key, headers properties.
    "value": (lambda t: isinstance(t, BinaryType) or _is_string(t), "BINARY or STRING"),
    "key": (lambda t: isinstance(t, BinaryType) or _is_string(t), "BINARY or STRING"),
    "headers": (lambda t: (isinstance(t, ArrayType) and isinstance(t.elementType, StructType)
                           and [f.name for f in t.elementType.fields] == ["key", "value"]
                           and _is_string(t.elementType.fields[0].dataType)
                           and (isinstance(t.elementType.fields[1].dataType, BinaryType)
                                or _is_string(t.elementType.fields[1].dataType))),
                "ARRAY<STRUCT<key: STRING, value: BINARY or STRING>>"),
}
WRITABLE_COLUMNS = tuple(COLUMN_TYPES)


def check_write_schema(schema: StructType, options: Mapping[str, str]) -> None:
    """Fail at planning when the rows cannot become messages: no ``body``, no topic, or a column
    the writer reads with a type it does not take (``options``: lower-case keys). Other
    columns are ignored, so a DataFrame read from the source can be written back as it is."""
    types = {f.name: f.dataType for f in schema.fields}
    problems = []
    for name in types:
        # Spark resolves column names case-insensitively, the writer does not: say so rather
        # than ignore a 'Tags' column.
        if name not in COLUMN_TYPES and name.lower() in COLUMN_TYPES and (
                name.lower() not in types):
            problems.append(f"column '{name}' is not read: the writer reads '{name.lower()}' "
                            "(names are case-sensitive here); rename it")
    if "body" not in types and "value" not in types:
        problems.insert(0, "the DataFrame has no 'body' column (or spark-sql-kafka's 'value'), "
                           "BINARY or STRING, to write")
    if "body" in types and "value" in types:
        problems.insert(0, "the DataFrame has both 'body' and 'value': which is the message? "
                           "drop one")
    for name, (accepts, wanted) in COLUMN_TYPES.items():
        t = types.get(name)
        # A NULL-typed column (``lit(None)``) is a column of nulls: no tags, no keys, ...; a
        # null body or topic is refused below or row by row.
        if t is None or accepts(t) or (isinstance(t, NullType)
                                       and name not in ("body", "value", "topic")):
            continue
        problems.append(f"column '{name}' is {t.simpleString().upper()}; the writer takes "
                        f"{name} as {wanted}")
    if problems:
        raise OptionError("; ".join(problems))
    if options.get("topic") and (problem := topic_name_problem(options["topic"])):
        raise OptionError(f"option 'topic': {problem}")
    if "topic" not in types and not options.get("topic"):
        raise OptionError("option 'topic' is missing and the DataFrame has no 'topic' column")
    if isinstance(types.get("topic"), NullType) and not options.get("topic"):
        raise OptionError("option 'topic' is missing and column 'topic' is NULL in every row")


def _check_unlocked(root: Path) -> None:
    """Fail now if another process holds the store's lock: a running broker keeps it for its
    lifetime, and each task would otherwise wait ``lockTimeoutMs`` (5 minutes) before
    failing. Tested with the broker's own locks (flock, and the POSIX lock RocketMQ takes),
    then let go at once."""
    lock = root / "lock"
    if not lock.exists():
        return
    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
    except OSError:
        raise OptionError(
            f"option 'path': store {root} is locked by another process ({lock} is held: a "
            "running broker?); stop it, or write through the broker with option 'endpoints'"
        ) from None
    finally:
        os.close(fd)  # drops both locks


def check_store_path(path: str) -> None:
    """Fail at planning when ``path`` cannot be a store directory to append to: a file (or
    under one), or an existing directory that holds other things and no store.

    A non-empty directory without ``commitlog/`` is refused rather than turned into a store: a
    mistyped path (an output or a home directory) would otherwise get ``commitlog/``,
    ``config/``, ``lock`` ... among its own files, and reads would then take it for a store.
    Paths the driver cannot see pass (on a cluster only executors may mount the directory)."""
    p = Path(path)
    try:
        if p.is_dir():
            if (p / "commitlog").is_dir():
                _check_unlocked(p)
                return
            entries = sorted(os.listdir(p))
            if entries:
                shown = ", ".join(entries[:5]) + (", ..." if len(entries) > 5 else "")
                raise OptionError(f"option 'path': {path} is not a store directory (no "
                                  f"commitlog/) and not empty ({shown}); give a store "
                                  "directory, or a new or empty directory for a new store")
            return
        if p.exists():
            raise OptionError(f"option 'path': {path} is a file, not a store directory")
        for parent in p.absolute().parents:
            if parent.exists():
                if not parent.is_dir():
                    raise OptionError(f"option 'path': {parent} is a file, so store directory "
                                      f"{path} cannot be made")
                return
    except OSError as exc:
        raise OptionError(f"option 'path': cannot look at {path}: "
                          f"{exc.strerror or exc}") from None


def _text(value: str | bytes, column: str) -> str:
    if isinstance(value, str):
        return value
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"column '{column}': {value[:40]!r} is not UTF-8 text, and message "
                         "keys and properties are text") from None


def rows_to_messages(batch: pa.RecordBatch, default_topic: str | None) -> Iterator[Message]:
    """Messages from rows whose column types ``check_write_schema`` accepted."""
    names = set(batch.schema.names)
    cols = {n: batch.column(n).to_pylist() for n in WRITABLE_COLUMNS if n in names}
    nothing = [None] * batch.num_rows
    now = int(time.time() * 1000)
    bodies = cols["body"] if "body" in cols else cols["value"]
    for i in range(batch.num_rows):
        body = bodies[i]
        if body is None:
            raise ValueError(f"column '{'body' if 'body' in cols else 'value'}': a row has a "
                             "null body")
        if isinstance(body, str):
            body = body.encode()
        topic = cols["topic"][i] if "topic" in cols and cols["topic"][i] else default_topic
        if not topic:
            raise ValueError("a row has no topic (column 'topic' is null or empty) and option "
                             "'topic' is not set")
        props: dict[str, str] = {}
        raw_props = cols.get("properties", nothing)[i]
        if raw_props:
            items = raw_props.items() if isinstance(raw_props, dict) else raw_props
            # A null value has no text form: the property is left out (str() would store the
            # text "None").
            props.update((k, v) for k, v in items if v is not None)
        tags = cols.get("tags", nothing)[i]
        if tags:
            props[Prop.TAGS] = tags
        for header in cols.get("headers", nothing)[i] or ():
            if header and header["key"] and header["value"] is not None:
                props[header["key"]] = _text(header["value"], "headers")
        keys = cols.get("keys", nothing)[i]
        if keys and not isinstance(keys, str):
            keys = " ".join(k for k in keys if k)  # null and empty keys of an array dropped
        kafka_key = cols.get("key", nothing)[i]
        if kafka_key is not None:
            kafka_key = _text(kafka_key, "key")
            if " " in kafka_key or not kafka_key:
                raise ValueError(f"column 'key': {kafka_key[:80]!r} cannot be a message key "
                                 "(RocketMQ keys are space-separated words)")
            keys = f"{keys} {kafka_key}" if keys else kafka_key
        if keys:
            props[Prop.KEYS] = keys
        queue_id = cols.get("queue_id", nothing)[i]
        if queue_id is not None and queue_id < 0:
            raise ValueError(f"column 'queue_id': {queue_id} is not a queue id (0 or more; a "
                             "null queue_id lets the writer choose the queue)")
        yield Message(topic, bytes(body), -1 if queue_id is None else int(queue_id), props,
                      born_timestamp=now)


class StoreAppender:
    """Buffers messages and appends them under the store lock, a buffer at a time."""

    def __init__(self, root: str, options: Mapping[str, str], first_queue: int) -> None:
        self.config = StoreConfig(store_path_root_dir=root)
        for option, field in (("mappedFileSizeCommitLog", "mapped_file_size_commit_log"),
                              ("mappedFileSizeConsumeQueue", "mapped_file_size_consume_queue")):
            value = int_option(options, option, None)
            if value is not None:
                setattr(self.config, field, value)
        self.queue_nums: int = int_option(options, "queueNums", 4) or 4
        self.lock_timeout = (int_option(options, "lockTimeoutMs", 300_000) or 0) / 1000
        self.next_queue = first_queue
        self.buffer: list[Message] = []
        self.buffered = 0
        self.written = 0

    def add(self, messages: Iterable[Message]) -> None:
        for msg in messages:
            self.buffer.append(msg)
            self.buffered += len(msg.body)
            if self.buffered >= BUFFER_BYTES:
                self.flush()

    def _open(self) -> MessageStore:
        deadline = time.monotonic() + self.lock_timeout
        delay = 0.02
        while True:
            try:
                return MessageStore(self.config).open()
            except StoreLocked:
                if time.monotonic() > deadline:
                    raise StoreLocked(
                        f"store {self.config.root} stayed locked for {self.lock_timeout:.0f} s "
                        "(a broker serving it? write through option 'endpoints' instead)"
                    ) from None
                time.sleep(delay)
                delay = min(0.5, delay * 2)

    def flush(self) -> None:
        if not self.buffer:
            return
        with self._open() as store:
            topics = store.topics()
            for msg in self.buffer:
                if msg.queue_id < 0:
                    count = len(topics.get(msg.topic, ())) or self.queue_nums
                    msg.queue_id = self.next_queue % count
                    self.next_queue += 1
            for i in range(0, len(self.buffer), PUT_BATCH):
                result = store.put_messages(self.buffer[i : i + PUT_BATCH])
                if not result.ok:
                    raise RuntimeError(f"append to {self.config.root} failed: {result.status}: "
                                       f"{result.error} ({self.written} messages written)")
                self.written += len(result.messages)
        self.buffer, self.buffered = [], 0


def append_batches(root: str, options: Mapping[str, str],
                   batches: Iterator[pa.RecordBatch]) -> int:
    """Append every row of ``batches`` to the store at ``root``; returns the count."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    appender = StoreAppender(root, options, ctx.partitionId() if ctx else 0)
    default_topic = options.get("topic")
    for batch in batches:
        appender.add(rows_to_messages(batch, default_topic))
    appender.flush()
    return appender.written
