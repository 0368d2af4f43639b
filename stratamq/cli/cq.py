"""``stratamq store migrate-cq`` and ``stratamq bench cq``: the ConsumeQueue store commands.

``migrate-cq`` builds the other ConsumeQueue store of an existing store from its CommitLog (a
progress bar on stderr), checks that both answer the same for every queue and unit, and only
then records the new type. It prints one JSON summary; exit 1 if the stores differ (the type
is then left as it was). The old store's files are kept: remove them once satisfied.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import click

from stratamq.cli.app import main
from stratamq.cli.bench import bench
from stratamq.cli.common import close_store, config_option, emit, open_store
from stratamq.cli.progress import JobProgress, quiet_option
from stratamq.cli.store import store
from stratamq.store.consume_queue_store import (
    ROCKSDB_CQ_DIR,
    STORE_TYPE_FILES,
    STORE_TYPE_ROCKSDB,
    STORE_TYPES,
    compare_stores,
    open_consume_queue_store,
    rebuild_from_commitlog,
    write_store_type,
)
from stratamq.store.layout import CONSUMEQUEUE_DIR

TARGETS = {"rocksdb": STORE_TYPE_ROCKSDB, "files": STORE_TYPE_FILES}


@store.command("migrate-cq")
@click.option("--store", "store_dir", required=True, help="Store root directory.")
@click.option("--to", "to", type=click.Choice(sorted(TARGETS)), required=True,
              help="The ConsumeQueue store to build: rocksdb (defaultRocksDB) or files.")
@click.option("--store-type", type=click.Choice(list(STORE_TYPES)), default=None,
              help="The store type to migrate from (default: the recorded one).")
@config_option
@quiet_option
def migrate_cq(store_dir: str, to: str, store_type: str | None, quiet: bool) -> None:
    """Build the other ConsumeQueue store from the CommitLog, verify, record the new type."""
    target_type = TARGETS[to]
    s = open_store(store_dir, read_only=False, store_type=store_type)
    try:
        if s.store_type == target_type:
            raise click.ClickException(f"store {store_dir} already uses {target_type}")
        root = Path(store_dir)
        stale = root / (ROCKSDB_CQ_DIR if target_type == STORE_TYPE_ROCKSDB else CONSUMEQUEUE_DIR)
        if stale.exists():  # left from an earlier store of that type: built afresh
            shutil.rmtree(stale)
        target = open_consume_queue_store(target_type, s.layout, s.config.cq_file_size)
        target.load()
        try:
            files = s.commitlog.files
            start, end = s.commitlog.min_offset, s.commitlog.max_offset
            started = time.perf_counter()
            with JobProgress(f"building {target_type}", end - start, quiet=quiet) as bar:
                records = rebuild_from_commitlog(target, files, start, end, bar.update)
            target.correct_min_offsets(s.commitlog.min_offset)
            target.flush(0)
            build_s = time.perf_counter() - started
            with JobProgress(f"checking {target_type} against {s.store_type}", 1,
                             unit="queues", quiet=quiet) as bar:

                def checked(done: int, total: int) -> None:
                    if bar.total != total:
                        bar.phase(bar.description, total)
                    bar.update(done)

                check = compare_stores(s.consume_queues, target, progress=checked)
        finally:
            target.close()
        if check["same"]:
            write_store_type(root, target_type)
        summary = {"ok": bool(check["same"]), "store": store_dir, "from": s.store_type,
                   "to": target_type, "records": records, "build_s": round(build_s, 3),
                   "recorded_type": target_type if check["same"] else s.store_type, **check}
    finally:
        close_store(s)
    emit(summary)
    if not summary["ok"]:
        sys.exit(1)


@bench.command("cq")
@click.option("--queues", type=click.IntRange(min=1), required=True,
              help="How many queues to write.")
@click.option("--messages-per-queue", type=click.IntRange(min=1), required=True,
              help="Messages put into each queue.")
@click.option("--store-type", type=click.Choice(list(STORE_TYPES)), required=True,
              help="ConsumeQueue store to measure.")
@click.option("--store", "store_dir", default=None,
              help="Directory for the bench store (must be empty; default: a temp dir).")
@click.option("--body-size", type=click.IntRange(min=0), default=128, show_default=True,
              help="Bytes of each message body.")
def bench_cq(queues: int, messages_per_queue: int, store_type: str, store_dir: str | None,
             body_size: int) -> None:
    """Create N queues with M messages each, reopen the store, read every queue; one JSON line
    with cq_disk_bytes, restart_s, put_msgs_per_s and get_msgs_per_s."""
    from stratamq.benchmarks.cq_bench import run_cq_bench

    try:
        result = run_cq_bench(queues=queues, messages_per_queue=messages_per_queue,
                              store_type=store_type, store_dir=store_dir, body_size=body_size)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    emit(result)  # kept on a failed run too: what it measured before failing, and why
    if "error" in result:
        raise click.ClickException(f"bench failed: {result['error']}")


__all__ = ["main"]
