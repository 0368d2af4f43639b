"""ConsumeQueue store benchmark: many queues with a few messages each, files vs RocksDB.

One run (``run_cq_bench``) creates ``queues`` queues (4 per topic) with ``messages_per_queue``
messages each through a real ``MessageStore`` (``put_s``: until every message is dispatched),
closes it (``close_s``), reopens it (timed: ``restart_s`` is
``open()`` until the store serves), reads every queue back, and measures the ConsumeQueue
storage alone: ``cq_disk_bytes`` counts allocated blocks (``st_blocks * 512``: RocketMQ's 6 MB
ConsumeQueue files are sparse), ``cq_apparent_bytes`` their sizes. Used by ``stratamq bench cq``
and ``bench/consume_queue.py``.
"""

from __future__ import annotations

import gc
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from stratamq.config import StoreConfig
from stratamq.message import Message
from stratamq.store.consume_queue_store import (
    ROCKSDB_CQ_DIR,
    STORE_TYPE_ROCKSDB,
    allocated_bytes,
    apparent_bytes,
)
from stratamq.store.layout import CONSUMEQUEUE_DIR
from stratamq.store.message_store import MessageStore
from stratamq.store.results import GetMessageStatus

QUEUES_PER_TOPIC = 4
# CommitLog recovery reads the unused tail of the last segment on every open (the same cost for
# both ConsumeQueue stores); a smaller segment keeps it from drowning what is measured here.
COMMITLOG_SEGMENT = 128 * 1024 * 1024
PUT_BATCH = 64  # messages per put_messages call
# Apache RocketMQ's RocksDB ConsumeQueue mode on this machine (issue 4), 1 KiB messages: the
# output gives StrataMQ's figures as ratios of these (compare runs with --body-size 1024).
ROCKETMQ_ROCKSDB_PUT_MSGS_PER_S = 65_000
ROCKETMQ_ROCKSDB_GET_MSGS_PER_S = 480_000


def queue_name(q: int) -> tuple[str, int]:
    return f"BenchCQ{q // QUEUES_PER_TOPIC:06d}", q % QUEUES_PER_TOPIC


def cq_path(root: Path, store_type: str) -> Path:
    return root / (ROCKSDB_CQ_DIR if store_type == STORE_TYPE_ROCKSDB else CONSUMEQUEUE_DIR)


def run_cq_bench(*, queues: int, messages_per_queue: int, store_type: str,
                 store_dir: str | None = None, body_size: int = 128) -> dict[str, Any]:
    """One run, as one JSON-ready dict. Bad arguments (a ``store_dir`` that is a file, not
    empty or cannot be created; a body over maxMessageSize) raise ValueError before anything is
    written; a run that fails part way (EMFILE: one file per queue runs out of descriptors; a
    put refused) returns what it measured so far with ``error`` set."""
    limit = StoreConfig().max_message_size  # the bench store runs with the default
    if body_size > limit:
        raise ValueError(f"body size {body_size} is more than maxMessageSize ({limit})")
    owned = store_dir is None
    root = Path(store_dir or tempfile.mkdtemp(prefix="stratamq-cq-bench-"))
    if not owned:
        _check_fresh_dir(root)
    config = StoreConfig(store_path_root_dir=str(root), store_type=store_type,
                         mapped_file_size_commit_log=COMMITLOG_SEGMENT,
                         message_index_enable=False)  # measure the ConsumeQueues, not the index
    total = queues * messages_per_queue
    body = b"x" * body_size
    out: dict[str, Any] = {"bench": "cq", "store_type": store_type, "queues": queues,
                           "messages_per_queue": messages_per_queue, "messages": total,
                           "body_size": body_size}
    try:
        store = MessageStore(config).open()
        try:
            started = time.perf_counter()
            cpu = time.process_time()
            batch: list[Message] = []
            for m in range(messages_per_queue):
                for q in range(queues):
                    topic, queue_id = queue_name(q)
                    batch.append(Message(topic, body, queue_id, properties={"TAGS": f"t{m}"}))
                    if len(batch) == PUT_BATCH:
                        _put(store, batch)
                        batch = []
            if batch:
                _put(store, batch)
            if not store.wait_dispatched(timeout=600):
                raise RuntimeError("dispatch did not catch up within 600 s")
            put_s = time.perf_counter() - started
            put_cpu_s = time.process_time() - cpu
        finally:
            # Timed too: file ConsumeQueues create new queues' files off the dispatch path
            # (consume_queue_pending.py), and a close creates those still waiting.
            started = time.perf_counter()
            cpu = time.process_time()
            store.close()
            close_s = time.perf_counter() - started
            close_cpu_s = time.process_time() - cpu
        out["put_s"] = round(put_s, 4)
        out["close_s"] = round(close_s, 4)
        out["close_cpu_s"] = round(close_cpu_s, 4)
        out["put_msgs_per_s"] = round(total / put_s, 1)
        # CPU of the whole process (every thread, user + system): on a shared machine the
        # wall time of many file creations mostly measures the neighbours' disk traffic.
        out["put_cpu_s"] = round(put_cpu_s, 4)
        path = cq_path(root, store_type)
        out["cq_disk_bytes"] = allocated_bytes(path) if path.exists() else 0
        out["cq_apparent_bytes"] = apparent_bytes(path) if path.exists() else 0

        # The restart is timed as a new process's would be: without the closed store's
        # objects still on the heap, where each collection the open's allocations trigger
        # walked them (about half the files' restart CPU at 10,000 queues).
        del store
        gc.collect()
        started = time.perf_counter()
        cpu = time.process_time()
        store = MessageStore(StoreConfig(store_path_root_dir=str(root),
                                         message_index_enable=False)).open()
        out["restart_s"] = round(time.perf_counter() - started, 4)
        out["restart_cpu_s"] = round(time.process_time() - cpu, 4)
        try:
            read = 0
            started = time.perf_counter()
            for q in range(queues):
                topic, queue_id = queue_name(q)
                result = store.get_messages("bench", topic, queue_id, 0,
                                            max_count=messages_per_queue)
                with result:
                    if result.status is not GetMessageStatus.FOUND:
                        raise RuntimeError(f"{topic}/{queue_id}: {result.status.value}")
                    read += len(result.records)
            get_s = time.perf_counter() - started
            if read != total:
                raise RuntimeError(f"read {read} of {total} messages back")
        finally:
            store.close()
        out["get_s"] = round(get_s, 4)
        out["get_msgs_per_s"] = round(total / get_s, 1)
        out["put_vs_rocketmq_rocksdb"] = round(total / put_s / ROCKETMQ_ROCKSDB_PUT_MSGS_PER_S, 4)
        out["get_vs_rocketmq_rocksdb"] = round(total / get_s / ROCKETMQ_ROCKSDB_GET_MSGS_PER_S, 4)
        out["cq_load_s"] = round(_time_cq_load(root, store_type), 4)
    except (OSError, RuntimeError) as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        if owned:
            shutil.rmtree(root, ignore_errors=True)
    return out


def _check_fresh_dir(root: Path) -> None:
    """Create ``root`` for the bench store, or raise ValueError saying why it cannot be one."""
    if root.exists() and not root.is_dir():
        raise ValueError(f"store directory {root} is a file")
    if root.is_dir() and any(root.iterdir()):
        raise ValueError(f"{root} is not empty: the bench needs a fresh store directory")
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"cannot create store directory {root}: "
                         f"{exc.strerror or exc}") from None


def _time_cq_load(root: Path, store_type: str) -> float:
    """The ConsumeQueue part of a restart alone: load the store and its offset table. A file
    store loads here without its snapshot (consume_queue_snapshot.py; the restart consumed
    it): every queue's files are read, as on a reopen after a crash."""
    from stratamq.store.consume_queue_store import open_consume_queue_store
    from stratamq.store.layout import StoreLayout

    started = time.perf_counter()
    cq = open_consume_queue_store(store_type, StoreLayout(root), StoreConfig().cq_file_size)
    cq.load()
    cq.recover()
    cq.queue_offset_table()
    took = time.perf_counter() - started
    cq.close()
    return took


def _put(store: MessageStore, batch: list[Message]) -> None:
    result = store.put_messages(batch)
    if not result.ok:
        raise RuntimeError(f"put failed: {result.status.value} {result.error}")
