"""``stratamq store ...``: inspect and check a store directory."""

from __future__ import annotations

import sys

import click

from stratamq.cli.app import main
from stratamq.cli.common import emit, iter_queue, message_json, open_store, store_type_option


@main.group()
def store() -> None:
    """Inspect and check a store directory (StrataMQ's or Apache RocketMQ's)."""


@store.command("dump")
@click.option("--store", "store_dir", required=True, help="Store root directory.")
@store_type_option
@click.option("--topic", default=None, help="Only this topic.")
@click.option("--queue-id", type=int, default=None, help="Only this queue id.")
def store_dump(store_dir: str, topic: str | None, queue_id: int | None) -> None:
    """Print every message as one JSON object per line, in queue order. Read-only."""
    s = open_store(store_dir, read_only=True)
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
                    emit(message_json(msg))
    finally:
        s.close()


@store.command("verify")
@click.option("--store", "store_dir", required=True, help="Store root directory.")
@store_type_option
def store_verify(store_dir: str) -> None:
    """Recover if needed, check every record and ConsumeQueue unit; exit 1 on a problem."""
    from stratamq.store.verify import verify_store

    s = open_store(store_dir, read_only=False)
    try:
        summary = verify_store(s)
    finally:
        s.close()
    emit(summary)
    if not summary["ok"]:
        sys.exit(1)


@store.command("stat")
@click.option("--store", "store_dir", required=True, help="Store root directory.")
@store_type_option
def store_stat(store_dir: str) -> None:
    """Print topics, queues, min/max offsets and bytes as JSON. Read-only."""
    s = open_store(store_dir, read_only=True)
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
                    "cq_bytes": cq.disk_bytes(),
                })
            topics[name] = {"queues": queues,
                            "messages": sum(q["messages"] for q in queues)}
        files = s.commitlog.files
        emit({
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
