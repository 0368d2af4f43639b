"""``stratamq store ...``: inspect and check a store directory.

``dump`` and ``stat`` are read-only and keep their stdout shapes; what they cannot show
(records behind a recovery cut, records no ConsumeQueue holds yet, damaged records) they say on
stderr as ``warning:`` lines, and ``stat`` adds it to its JSON. ``verify`` opens read-write.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from stratamq.cli.app import main
from stratamq.cli.common import (
    CorruptRecord,
    close_store,
    emit,
    iter_queue,
    message_json,
    open_store,
    open_store_tiered,
    output_option,
    read_only_warnings,
    store_options,
    warn,
)
from stratamq.cli.progress import JobProgress, quiet_option
from stratamq.store.consume_queue_store import ROCKSDB_CQ_DIR, STORE_TYPE_ROCKSDB, STORE_TYPES
from stratamq.store.inspect import queue_name, scan_undispatched
from stratamq.store.layout import CONSUMEQUEUE_DIR
from stratamq.store.mapped_file_queue import MappedFileQueue

MAX_LISTED_ERRORS = 20


@main.group()
def store() -> None:
    """Inspect and check a store directory (StrataMQ's or Apache RocketMQ's)."""


@store.command("dump")
@click.option("--store", "store_dir", required=True, help="Store root directory.")
@store_options
@click.option("--topic", default=None, help="Only this topic.")
@click.option("--queue-id", type=int, default=None, help="Only this queue id.")
@output_option
def store_dump(store_dir: str, topic: str | None, queue_id: int | None) -> None:
    """Print every message as one JSON object per line, in queue order. Read-only.

    A record that does not decode is skipped with an error on stderr naming its CommitLog
    offset, and the command exits 1 once everything else is printed."""
    s = open_store(store_dir, read_only=True)
    corrupt: list[CorruptRecord] = []
    try:
        topics = s.topics()
        if topic is not None and topic not in topics:
            raise click.ClickException(f"topic {topic!r} not found in {store_dir}")
        if queue_id is not None:
            if topic is not None and queue_id not in topics[topic]:
                raise click.ClickException(
                    f"topic {topic!r} has no queue {queue_id} (queues: {topics[topic]})")
            if topic is None and not any(queue_id in ids for ids in topics.values()):
                raise click.ClickException(f"no topic in {store_dir} has queue {queue_id}")
        scan = scan_undispatched(s.parts())
        # Only the queues asked for: other topics' stragglers are not missing from this dump.
        for key in list(scan.by_queue):
            if (topic is not None and key[0] != topic) or (queue_id is not None
                                                           and key[1] != queue_id):
                del scan.by_queue[key]
        for text in read_only_warnings(s, store_dir, scan):
            warn(text)
        for name, queue_ids in topics.items():
            if topic is not None and name != topic:
                continue
            for qid in queue_ids:
                if queue_id is not None and qid != queue_id:
                    continue
                for msg in iter_queue(s, name, qid, on_corrupt=corrupt.append):
                    emit(message_json(msg))
    finally:
        close_store(s)
    if corrupt:
        if len(corrupt) == 1:
            raise click.ClickException(str(corrupt[0]))
        for bad in corrupt[:MAX_LISTED_ERRORS]:
            click.echo(f"error: {bad}", err=True)
        raise click.ClickException(
            f"{len(corrupt)} corrupt records in the queues dumped (the first "
            f"{min(len(corrupt), MAX_LISTED_ERRORS)} listed above); everything else was dumped")


def _has_queues(root: Path, store_type: str) -> bool:
    if store_type == STORE_TYPE_ROCKSDB:
        return (root / ROCKSDB_CQ_DIR / "CURRENT").exists()
    cq_dir = root / CONSUMEQUEUE_DIR
    return cq_dir.is_dir() and any(cq_dir.iterdir())


@store.command("verify")
@click.option("--store", "store_dir", required=True, help="Store root directory.")
@store_options
@quiet_option
def store_verify(store_dir: str, quiet: bool) -> None:
    """Recover if needed, repair what the CommitLog can rebuild (ConsumeQueue units, index
    entries), check every record and ConsumeQueue unit; exit 1 on a problem or lost data."""
    from stratamq.store.verify import verify_store

    root = Path(store_dir)
    # A ConsumeQueue store missing as a whole is rebuilt by the open itself (it replays the
    # CommitLog into the empty store): note it here, where it is still visible.
    had = {t: _has_queues(root, t) for t in STORE_TYPES}
    has_log = MappedFileQueue.size_on_disk(root / "commitlog") is not None
    s = open_store(store_dir, read_only=False)
    try:
        with JobProgress("verify", 1, quiet=quiet) as bar:

            def progress(phase: str, done: int, total: int) -> None:
                if phase != bar.description:
                    bar.phase(phase, total, "bytes" if "CommitLog" in phase else "queues")
                bar.update(done)

            summary = verify_store(s.parts(), progress)
        rebuilt = [c.store_type for c in s.cq_stores if has_log and not had[c.store_type]]
    finally:
        close_store(s)
    for store_type in rebuilt:
        where = f"{ROCKSDB_CQ_DIR}/" if store_type == STORE_TYPE_ROCKSDB else "consumequeue/"
        summary["repaired"].insert(0, f"{where} was missing or empty: the open rebuilt the "
                                      f"{store_type} ConsumeQueue store from the CommitLog")
    emit(summary)
    if not summary["ok"]:
        sys.exit(1)


@store.command("stat")
@click.option("--store", "store_dir", required=True, help="Store root directory.")
@click.option("--full", is_flag=True, default=False,
              help="Check the whole CommitLog, not just what an open would replay.")
@store_options
@output_option(report=True)
def store_stat(store_dir: str, full: bool) -> None:
    """Print topics, queues, min/max offsets and bytes as JSON. Read-only.

    With a tier (in --config, or recorded in the store directory) the offsets and counts are
    the whole history, the tier's part included (``local_min_offset``: where the local
    ConsumeQueue starts; ``tier``: which tier was read).

    Also counts the CommitLog's records that no ConsumeQueue holds (``undispatched_records``)
    and the corrupt records met (``corrupt_records``), from where an open would start its replay
    (``scanned_from``; quick on a large store), or over the whole CommitLog with ``--full`` (one
    pass: finds the records of a lost queue and damage in old segments too)."""
    s, tier = open_store_tiered(store_dir, read_only=True)
    try:
        topics = {}
        for name, queue_ids in s.topics().items():
            queues = []
            for qid in queue_ids:
                cq = s.consume_queues.find(name, qid)
                if tier is not None:  # the whole history: the tier's part and the local one
                    low, high = s.get_min_offset_in_queue(name, qid), \
                        s.get_max_offset_in_queue(name, qid)
                elif cq is None:  # deleted since topics() was read
                    continue
                else:
                    low, high = cq.min_offset(), cq.max_offset()
                row: dict[str, int | None] = {
                    "queue_id": qid, "min_offset": low, "max_offset": high,
                    "messages": high - low, "cq_bytes": cq.disk_bytes() if cq else 0}
                if tier is not None:
                    row["local_min_offset"] = cq.min_offset() if cq is not None else None
                queues.append(row)
            topics[name] = {"queues": queues,
                            "messages": sum(int(q["messages"] or 0) for q in queues)}
        scanned_from = (s.min_physical_offset if full or s.recovery is None
                        else s.recovery.start_offset)
        scan = scan_undispatched(s.parts(), start=scanned_from)
        warnings = read_only_warnings(s, store_dir, scan)
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
            "scanned_from": scanned_from,
            "undispatched_records": scan.records,
            "undispatched_by_queue": {queue_name(k): n for k, n in sorted(scan.by_queue.items())},
            "corrupt_records": [c.position for c in scan.corrupt[:MAX_LISTED_ERRORS]],
            "warnings": warnings,
            **({"tier": tier.factory.describe()} if tier is not None else {}),
        })
        for text in warnings:
            warn(text)
    finally:
        close_store(s)
        if tier is not None:
            tier.close()
