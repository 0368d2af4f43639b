"""The ``stratamq`` command line.

Output shapes here are contracts (issue 2): ``store dump`` prints one JSON object per message,
``store verify`` one JSON summary (exit 1 on any inconsistency), ``bench store`` one JSON line.
"""

from __future__ import annotations

import base64
import json
import logging
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from stratamq.config import StoreConfig
from stratamq.message import Message, Prop, StoredMessage
from stratamq.store.message_store import MessageStore, StoreLocked
from stratamq.store.results import GetMessageStatus


def _emit(obj: Any) -> None:
    click.echo(json.dumps(obj, separators=(",", ":"), ensure_ascii=False))


def _open_store(store_dir: str, *, read_only: bool) -> MessageStore:
    root = Path(store_dir)
    if not (root / "commitlog").is_dir():
        raise click.ClickException(f"no store at {root}: it has no commitlog/ directory")
    try:
        return MessageStore(StoreConfig(store_path_root_dir=str(root)), read_only=read_only).open()
    except StoreLocked as exc:
        raise click.ClickException(str(exc)) from None
    except (OSError, ValueError) as exc:
        raise click.ClickException(f"cannot open store {root}: {exc}") from None


def message_json(msg: StoredMessage) -> dict[str, Any]:
    """The dump shape: one message as JSON-ready values."""
    return {
        "topic": msg.topic,
        "queue_id": msg.queue_id,
        "queue_offset": msg.queue_offset,
        "commitlog_offset": msg.physical_offset,
        "size": msg.total_size,
        "sys_flag": msg.sys_flag,
        "born_timestamp": msg.born_timestamp,
        "born_host": str(msg.born_host),
        "store_timestamp": msg.store_timestamp,
        "store_host": str(msg.store_host),
        "reconsume_times": msg.reconsume_times,
        "tags": msg.tags,
        "keys": msg.keys,
        "properties": msg.properties,
        "body_crc": msg.body_crc,
        "body_b64": base64.b64encode(msg.decompressed_body()).decode("ascii"),
    }


def iter_queue(store: MessageStore, topic: str, queue_id: int) -> Iterator[StoredMessage]:
    """Every message of one queue in queue order."""
    offset = store.get_min_offset_in_queue(topic, queue_id)
    while True:
        result = store.get_messages("stratamq-cli", topic, queue_id, offset, max_count=256,
                                    max_bytes=64 * 1024 * 1024)
        with result:
            if result.status not in (GetMessageStatus.FOUND, GetMessageStatus.NO_MATCHED_MESSAGE,
                                     GetMessageStatus.MESSAGE_WAS_REMOVING):
                return
            yield from result.messages()
            if result.next_begin_offset <= offset:
                return
            offset = result.next_begin_offset


@click.group()
@click.option("-v", "--verbose", is_flag=True, help="Log what the store does to stderr.")
def main(verbose: bool) -> None:
    """StrataMQ: a RocketMQ-compatible message store and broker."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)


# -- store ---------------------------------------------------------------------------------------


@main.group()
def store() -> None:
    """Inspect and check a store directory (StrataMQ's or Apache RocketMQ's)."""


@store.command("dump")
@click.option("--store", "store_dir", required=True, help="Store root directory.")
@click.option("--topic", default=None, help="Only this topic.")
@click.option("--queue-id", type=int, default=None, help="Only this queue id.")
def store_dump(store_dir: str, topic: str | None, queue_id: int | None) -> None:
    """Print every message as one JSON object per line, in queue order. Read-only."""
    s = _open_store(store_dir, read_only=True)
    try:
        topics = s.topics()
        if topic is not None and topic not in topics:
            raise click.ClickException(f"topic {topic!r} not found in {store_dir}")
        for name, queue_ids in topics.items():
            if topic is not None and name != topic:
                continue
            for qid in queue_ids:
                if queue_id is not None and qid != queue_id:
                    continue
                for msg in iter_queue(s, name, qid):
                    _emit(message_json(msg))
    finally:
        s.close()


@store.command("verify")
@click.option("--store", "store_dir", required=True, help="Store root directory.")
def store_verify(store_dir: str) -> None:
    """Recover if needed, check every record and ConsumeQueue unit; exit 1 on a problem."""
    from stratamq.store.verify import verify_store

    s = _open_store(store_dir, read_only=False)
    try:
        summary = verify_store(s)
    finally:
        s.close()
    _emit(summary)
    if not summary["ok"]:
        sys.exit(1)


@store.command("stat")
@click.option("--store", "store_dir", required=True, help="Store root directory.")
def store_stat(store_dir: str) -> None:
    """Print topics, queues, min/max offsets and bytes as JSON. Read-only."""
    s = _open_store(store_dir, read_only=True)
    try:
        topics = {}
        for name, queue_ids in s.topics().items():
            queues = []
            for qid in queue_ids:
                cq = s.consume_queues.find(name, qid)
                queues.append({
                    "queue_id": qid,
                    "min_offset": cq.min_offset(),
                    "max_offset": cq.max_offset(),
                    "messages": cq.max_offset() - cq.min_offset(),
                    "cq_bytes": sum(mf.file_size for mf in cq.files.files),
                })
            topics[name] = {"queues": queues,
                            "messages": sum(q["messages"] for q in queues)}
        files = s.commitlog.files
        _emit({
            "store": store_dir,
            "commitlog": {
                "min_offset": s.min_physical_offset,
                "max_offset": s.max_physical_offset,
                "segments": len(files.files),
                "segment_size": files.mapped_file_size,
                "bytes": s.max_physical_offset - s.min_physical_offset,
            },
            "topics": topics,
            "messages": sum(t["messages"] for t in topics.values()),
            "recovery": s.recovery.as_dict() if s.recovery else None,
        })
    finally:
        s.close()


# -- bench ---------------------------------------------------------------------------------------


@main.group()
def bench() -> None:
    """Benchmarks that print one JSON line."""


@bench.command("store")
@click.option("--messages", type=click.IntRange(min=1), required=True)
@click.option("--body-size", type=click.IntRange(min=0), required=True)
@click.option("--batch", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--flush", type=click.Choice(["async", "sync"]), default="async", show_default=True)
@click.option("--store", "store_dir", default=None, help="Directory for the bench store.")
def bench_store(messages: int, body_size: int, batch: int, flush: str,
                store_dir: str | None) -> None:
    """Put N messages (K per call), read them all back, print throughput."""
    from stratamq.benchmarks.store_bench import run_store_bench

    _emit(run_store_bench(messages=messages, body_size=body_size, batch=batch, flush=flush,
                          store_dir=store_dir))


# -- demo ----------------------------------------------------------------------------------------


@main.command()
@click.option("--store", "store_dir", default="./data", show_default=True)
@click.option("--messages", type=click.IntRange(min=1), default=1000, show_default=True)
def demo(store_dir: str, messages: int) -> None:
    """Write messages through an embedded store, read them back and say what happened."""
    config = StoreConfig(store_path_root_dir=store_dir)
    try:
        s = MessageStore(config).open()
    except StoreLocked as exc:
        raise click.ClickException(str(exc)) from None
    with s:
        report = s.recovery
        click.echo(f"store {Path(store_dir).resolve()} opened "
                   f"({'after a crash' if report.abnormal else 'clean'}; "
                   f"CommitLog {s.min_physical_offset}..{s.max_physical_offset})")
        topics = ["DemoOrders", "DemoPayments"]
        started = time.perf_counter()
        first_offsets = {}
        for i in range(messages):
            topic = topics[i % 2]
            queue_id = (i // 2) % 4
            msg = Message(topic, f"demo message {i} at {time.time():.3f}".encode(), queue_id,
                          properties={Prop.TAGS: "even" if i % 2 == 0 else "odd",
                                      Prop.KEYS: f"demo-{i}"},
                          born_timestamp=int(time.time() * 1000))
            result = s.put_message(msg)
            if not result.ok:
                raise click.ClickException(f"put failed: {result.status.value} {result.error}")
            first_offsets.setdefault((topic, queue_id), result.queue_offset)
        put_s = time.perf_counter() - started
        s.wait_dispatched()
        click.echo(f"put {messages} messages in {put_s * 1000:.1f} ms "
                   f"({messages / put_s:,.0f} msg/s)")
        read = 0
        for (topic, queue_id), first in sorted(first_offsets.items()):
            result = s.get_messages("demo", topic, queue_id, first, max_count=messages)
            with result:
                msgs = list(result.messages())
            read += len(msgs)
            click.echo(f"  {topic}/{queue_id}: read {len(msgs)} from offset {first}; "
                       f"last: {msgs[-1].body.decode()!r} (msg id {msgs[-1].msg_id})")
        click.echo(f"read back {read} messages; queues now hold "
                   f"{sum(s.get_max_offset_in_queue(t, q) for t, q in first_offsets)} in total")
    click.echo("store closed cleanly (checkpoint written, abort marker removed)")


if __name__ == "__main__":
    main()
