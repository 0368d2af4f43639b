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

import time
from collections.abc import Iterable, Iterator, Mapping

import pyarrow as pa

from stratamq.config import StoreConfig
from stratamq.message import Message, Prop
from stratamq.spark.planning import OptionError, int_option
from stratamq.store.message_store import MessageStore, StoreLocked

WRITABLE_COLUMNS = ("body", "topic", "tags", "keys", "properties", "queue_id")
BUFFER_BYTES = 32 * 1024 * 1024
PUT_BATCH = 256


def check_write_schema(names: list[str], options: Mapping[str, str]) -> None:
    """Fail at planning when the rows cannot become messages."""
    if "body" not in names:
        raise OptionError("the DataFrame has no 'body' column (binary or string) to write")
    if "topic" not in names and not options.get("topic"):  # options: lower-case keys
        raise OptionError("option 'topic' is missing and the DataFrame has no 'topic' column")


def rows_to_messages(batch: pa.RecordBatch, default_topic: str | None) -> Iterator[Message]:
    names = set(batch.schema.names)
    cols = {n: batch.column(n).to_pylist() for n in WRITABLE_COLUMNS if n in names}
    now = int(time.time() * 1000)
    for i in range(batch.num_rows):
        body = cols["body"][i]
        if body is None:
            raise ValueError("a row has a null body")
        if isinstance(body, str):
            body = body.encode()
        topic = cols["topic"][i] if "topic" in cols and cols["topic"][i] else default_topic
        if not topic:
            raise ValueError("a row has no topic and option 'topic' is not set")
        props: dict[str, str] = {}
        raw_props = cols.get("properties", [None] * batch.num_rows)[i]
        if raw_props:
            props.update(raw_props.items() if isinstance(raw_props, dict) else raw_props)
        for column, prop in (("tags", Prop.TAGS), ("keys", Prop.KEYS)):
            value = cols.get(column, [None] * batch.num_rows)[i]
            if value:
                props[prop] = value if isinstance(value, str) else " ".join(value)
        queue_id = cols.get("queue_id", [None] * batch.num_rows)[i]
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
        self.queue_nums = int_option(options, "queueNums", 4)
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
