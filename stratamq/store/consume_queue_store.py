"""The ConsumeQueue store interface: what the message store, the index, the read path and the
CLI need from "where the units live", whether one file per queue or one RocksDB.

Two implementations: ``FileConsumeQueueStore`` (``storeType=default``, RocketMQ's files) and
``RocksDBConsumeQueueStore`` (``storeType=defaultRocksDB``, docs/formats/rocksdb-consumequeue.md).
``open_consume_queue_store`` builds one by name; the chosen type is recorded in the store
directory (``config/storeType``) so a store reopens with the type it was written with.

Contracts: one dispatcher thread writes (``dispatch``, ``commit_dispatch``, ``truncate_dirty``,
``delete_expired``, ``destroy_*``); readers on any thread use ``find(topic, queue_id)`` and the
per-queue handle it returns (``get_units``, ``min_offset``, ``max_offset``, ``offset_by_time``).
``load``/``recover``/``correct_min_offsets`` run on the opening thread before any other.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol, runtime_checkable

from stratamq.fileutil import atomic_write
from stratamq.message import DispatchInfo
from stratamq.store.layout import CONSUMEQUEUE_DIR, ROCKSDB_CQ_DIR, STORE_TYPE_FILE

STORE_TYPE_FILES = "default"  # RocketMQ's storeType names
STORE_TYPE_ROCKSDB = "defaultRocksDB"
STORE_TYPES = (STORE_TYPE_FILES, STORE_TYPE_ROCKSDB)

Unit = tuple[int, int, int]  # (commitlog offset, size, tags code)


@runtime_checkable
class ConsumeQueueHandle(Protocol):
    """One topic/queue. Cheap to create; holds no file or RocksDB resource of its own."""

    topic: str
    queue_id: int

    def get_units(self, queue_offset: int, max_units: int) -> list[Unit]:
        """Up to ``max_units`` consecutive units from ``queue_offset`` on."""
        ...

    def min_offset(self) -> int: ...

    def max_offset(self) -> int:
        """The queue offset the next message gets."""
        ...

    def offset_by_time(self, timestamp: int, store_time_at: Callable[[int], int | None]) -> int:
        """First queue offset whose message was stored at or after ``timestamp`` (ms); the max
        offset if none. ``store_time_at(commitlog_offset)`` reads a store time from the
        CommitLog for stores that do not keep it themselves."""
        ...

    def disk_bytes(self) -> int: ...


@runtime_checkable
class ConsumeQueueStore(Protocol):
    """Every ConsumeQueue of a store; a dispatcher (``dispatch(info)``)."""

    store_type: str

    # -- lifecycle
    def load(self) -> None: ...
    def recover(self) -> None: ...
    def flush(self, least_pages: int) -> None: ...
    def close(self) -> None: ...

    # -- writing (dispatcher thread)
    def dispatch(self, info: DispatchInfo) -> None: ...
    def commit_dispatch(self) -> None:
        """Make everything dispatched so far visible to readers (group commit)."""
        ...

    # -- queues
    def find(self, topic: str, queue_id: int) -> ConsumeQueueHandle | None: ...
    def __iter__(self) -> Iterator[ConsumeQueueHandle]: ...
    def topics(self) -> dict[str, list[int]]: ...
    def queue_offset_table(self) -> dict[tuple[str, int], int]:
        """(topic, queue id) -> next queue offset, for offset assignment."""
        ...

    # -- recovery and retention
    def max_physic_offset(self) -> int:
        """End of the newest CommitLog record this store durably covers (-1: none)."""
        ...
    def truncate_dirty(self, commitlog_end: int) -> int: ...
    def correct_min_offsets(self, commitlog_min_offset: int) -> None: ...
    def delete_expired(self, min_commitlog_offset: int) -> int: ...
    def destroy_queue(self, topic: str, queue_id: int) -> None: ...
    def destroy_topic(self, topic: str) -> None: ...
    def disk_bytes(self) -> int:
        """Bytes this store occupies on disk (allocated blocks)."""
        ...


def read_store_type(root: Path) -> str | None:
    """The type recorded in a store directory, or None if none is recorded."""
    path = root / STORE_TYPE_FILE
    try:
        recorded = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    if recorded not in STORE_TYPES:
        raise ValueError(f"{path}: unknown store type {recorded!r} "
                         f"(expected {' or '.join(STORE_TYPES)})")
    return recorded


def write_store_type(root: Path, store_type: str) -> None:
    """Record ``store_type`` durably: after a crash the file holds the old type or the new,
    never nothing (it decides how every later open reads the store)."""
    if store_type not in STORE_TYPES:
        raise ValueError(f"unknown store type {store_type!r}")
    with contextlib.suppress(OSError, ValueError):
        if read_store_type(root) == store_type:
            return  # nothing to change: a store on a full disk still opens
    atomic_write(root / STORE_TYPE_FILE, (store_type + "\n").encode("utf-8"))


def allocated_bytes(path: Path) -> int:
    """Disk blocks actually allocated under ``path`` (sparse files count what they use)."""
    if path.is_file():
        return path.stat().st_blocks * 512
    total = 0
    for p in path.rglob("*"):
        try:
            st = p.lstat()
        except FileNotFoundError:
            continue
        if p.is_file():
            total += st.st_blocks * 512
    return total


def apparent_bytes(path: Path) -> int:
    """Sum of file sizes under ``path`` (what ``ls -l`` shows)."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def open_consume_queue_store(store_type: str, layout, cq_file_size: int, *,
                             read_only: bool = False) -> ConsumeQueueStore:
    """Build (not yet load) the ConsumeQueue store named by ``store_type``."""
    if store_type == STORE_TYPE_FILES:
        from stratamq.store.consume_queue_file_store import FileConsumeQueueStore

        return FileConsumeQueueStore(layout, cq_file_size, read_only=read_only)
    if store_type == STORE_TYPE_ROCKSDB:
        from stratamq.store.rocksdb_consume_queue import RocksDBConsumeQueueStore

        return RocksDBConsumeQueueStore(layout.root / ROCKSDB_CQ_DIR, read_only=read_only)
    raise ValueError(f"unknown store type {store_type!r} (expected {' or '.join(STORE_TYPES)})")


class StoreTypeMismatch(ValueError):
    """The store directory records one ConsumeQueue store type and another was asked for."""


def _store_exists(root: Path, store_type: str) -> bool:
    if store_type == STORE_TYPE_ROCKSDB:
        return (root / ROCKSDB_CQ_DIR / "CURRENT").exists()
    cq = root / CONSUMEQUEUE_DIR
    return cq.is_dir() and any(cq.iterdir())


def resolve_store_type(root: Path, requested: str, *, has_data: bool, force: bool) -> str:
    """The ConsumeQueue store type a store opens with.

    The type recorded in the directory wins over the default (``default``), so a RocksDB store
    reopens as one without naming its type. Another type is used only when asked for explicitly
    (``force``, or ``defaultRocksDB`` in the config) and its store already exists (kept in step
    by ``rocksdbCQDoubleWriteEnable``); otherwise ``StoreTypeMismatch`` says to migrate. A store
    with data but no record was written with files (by RocketMQ or before store types)."""
    if requested not in STORE_TYPES:
        raise ValueError(f"unknown store type {requested!r} (expected {' or '.join(STORE_TYPES)})")
    recorded = read_store_type(root)
    if recorded is None:
        if not has_data:
            return requested  # a new store takes the type it is given
        recorded = STORE_TYPE_FILES
    if requested == recorded:
        return recorded
    if requested == STORE_TYPE_FILES and not force:
        return recorded  # the default type: "whatever the store is"
    if _store_exists(root, requested):
        return requested
    target = "rocksdb" if requested == STORE_TYPE_ROCKSDB else "files"
    raise StoreTypeMismatch(
        f"store {root} uses ConsumeQueue store type {recorded}, not {requested}; build the "
        f"other one first: stratamq store migrate-cq --store {root} --to {target}")


# -- migration: build one store from the CommitLog, then prove both answer the same ----------

MIGRATE_STEP = 16 * 1024 * 1024  # bytes of CommitLog per replay step (> any record)


def rebuild_from_commitlog(target: ConsumeQueueStore, commitlog_files, start: int, end: int,
                           progress: Callable[[int], None] | None = None) -> int:
    """Dispatch every record in [start, end) of the CommitLog to ``target``; return how many.
    ``progress(bytes_done)`` is called after each step."""
    from stratamq.store.dispatch import ReputService

    reput = ReputService(commitlog_files, [target], start)
    count = 0
    while reput.reput_from < end:
        before = reput.reput_from
        count += reput.replay(min(end, before + MIGRATE_STEP))
        if reput.reput_from == before:
            break  # the rest is not a whole record: nothing more to dispatch
        if progress is not None:
            progress(reput.reput_from - start)
    target.commit_dispatch()
    return count


def compare_stores(a: ConsumeQueueStore, b: ConsumeQueueStore, max_listed: int = 20,
                   progress: Callable[[int, int], None] | None = None) -> dict[str, object]:
    """Check that two stores answer the same: the same queues, every queue's min and max
    offset, and every unit between them. Returns counts and the first differences."""
    problems: list[str] = []
    ta, tb = a.topics(), b.topics()
    if ta != tb:
        only_a = sorted(set(ta) - set(tb))[:5]
        only_b = sorted(set(tb) - set(ta))[:5]
        problems.append(f"queues differ (only in {a.store_type}: {only_a}, "
                        f"only in {b.store_type}: {only_b})")
    queues = units = 0
    total = sum(len(q) for q in ta.values())
    for topic, queue_ids in ta.items():
        for queue_id in queue_ids:
            if progress is not None:
                progress(queues, total)
            qa, qb = a.find(topic, queue_id), b.find(topic, queue_id)
            if qa is None or qb is None:
                continue
            queues += 1
            lo, hi = qa.min_offset(), qa.max_offset()
            if (lo, hi) != (qb.min_offset(), qb.max_offset()):
                problems.append(f"{topic}/{queue_id}: offsets {lo}..{hi} vs "
                                f"{qb.min_offset()}..{qb.max_offset()}")
                continue
            offset = lo
            while offset < hi:
                ua, ub = qa.get_units(offset, 4096), qb.get_units(offset, 4096)
                if ua != ub or not ua:
                    problems.append(f"{topic}/{queue_id}: units differ from offset {offset}")
                    break
                units += len(ua)
                offset += len(ua)
            if len(problems) >= max_listed:
                break
    return {"same": not problems, "queues": queues, "units": units,
            "problems": problems[:max_listed]}
