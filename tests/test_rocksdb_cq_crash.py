"""Crash recovery of the RocksDB ConsumeQueue store: its WAL is off, so a SIGKILL loses every
batch not yet flushed to an SST file; reopening must re-dispatch them from the CommitLog.

The writer of tests/test_crash_recovery.py runs in a subprocess with storeType=defaultRocksDB
(optionally with double write), acknowledges each put, and is killed while writing. The store
reopened here must serve every acknowledged message at its acknowledged queue offset.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stratamq.config import FlushDiskType, StoreConfig
from stratamq.message import Message
from stratamq.store.consume_queue_format import UNIT_SIZE
from stratamq.store.consume_queue_store import ROCKSDB_CQ_DIR, STORE_TYPE_ROCKSDB, compare_stores
from stratamq.store.message_store import MessageStore
from stratamq.store.rocksdb_consume_queue import RocksDBConsumeQueueStore
from tests.test_crash_recovery import (
    ACK_TIMEOUT,
    CQ_UNITS_PER_FILE,
    PROJECT,
    QUEUES,
    SEGMENT_SIZE,
    TOPICS,
    WRITER,
    check_store,
)

ACKS = 300


def run_and_kill(settings: dict, tmp_path: Path) -> list[dict]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(PROJECT) + os.pathsep + env.get("PYTHONPATH", "")
    stderr_path = tmp_path / "writer.stderr"
    with stderr_path.open("wb") as stderr:
        proc = subprocess.Popen([sys.executable, "-c", WRITER, json.dumps(settings)],
                                stdout=subprocess.PIPE, stderr=stderr, cwd=PROJECT, env=env)
    acks: list[dict] = []
    try:
        deadline = time.monotonic() + ACK_TIMEOUT
        while len(acks) < ACKS:
            line = proc.stdout.readline()
            if not line:
                proc.wait(timeout=30)
                pytest.fail(f"writer exited ({proc.returncode}) after {len(acks)} acks: "
                            f"{stderr_path.read_text()[-2000:]}")
            acks.append(json.loads(line))
            assert time.monotonic() < deadline, "writer too slow"
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=60) == -signal.SIGKILL
        for line in proc.stdout:  # acks still in the pipe were acknowledged too
            if line.endswith(b"\n"):
                acks.append(json.loads(line))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
        proc.stdout.close()
    return acks


@pytest.mark.parametrize("thorough_ms,double_write", [
    (60_000, False),  # nothing reached an SST file: the whole RocksDB is rebuilt on reopen
    (50, False),      # part of it did: re-dispatch starts at RocksDB's own checkpoint row
    (50, True),       # with double write both stores come back and agree
])
def test_sigkill_loses_no_acknowledged_message(tmp_path, thorough_ms, double_write):
    root = tmp_path / "store"
    settings = {
        "store_path_root_dir": str(root),
        "mapped_file_size_commit_log": SEGMENT_SIZE,
        "mapped_file_size_consume_queue": CQ_UNITS_PER_FILE * UNIT_SIZE,
        "flush_disk_type": FlushDiskType.ASYNC_FLUSH.value,
        "flush_interval_consume_queue": 20,
        "flush_consume_queue_thorough_interval": thorough_ms,
        "store_type": STORE_TYPE_ROCKSDB,
        "rocksdb_cq_double_write_enable": double_write,
        "message_index_enable": False,
        "topics": list(TOPICS),
        "queues": QUEUES,
        "pace_ms": 2,
    }
    acks = run_and_kill(settings, tmp_path)
    assert len(acks) >= ACKS
    assert (root / "abort").exists()  # it really died with the store open
    # Without a WAL the kill really lost RocksDB's newest batches: it covers less than was acked.
    rocks = RocksDBConsumeQueueStore(root / ROCKSDB_CQ_DIR, read_only=True)
    rocks.load()
    covered = rocks.max_physic_offset()
    rocks.close()
    last = acks[-1]["physical_offset"] + acks[-1]["size"]
    assert covered < last
    if thorough_ms == 60_000:
        assert covered == -1  # never flushed: empty after the crash
    else:  # thorough flushes wrote the offset table (and its checkpoint row) too
        assert covered > 0
    cfg = StoreConfig(store_path_root_dir=str(root), mapped_file_size_commit_log=SEGMENT_SIZE,
                      mapped_file_size_consume_queue=CQ_UNITS_PER_FILE * UNIT_SIZE,
                      message_index_enable=False,
                      rocksdb_cq_double_write_enable=double_write)
    with MessageStore(cfg).open() as store:
        assert store.store_type == STORE_TYPE_ROCKSDB
        assert store.recovery.abnormal
        n = check_store(store, acks)
        assert n >= len(acks)
        if double_write:
            check = compare_stores(*store.cq_stores)
            assert check["same"], check["problems"]
        ends = {(t, q): store.get_max_offset_in_queue(t, q) for t in TOPICS for q in range(QUEUES)}
    # And once more after a clean close: the rebuilt units were made durable.
    with MessageStore(cfg).open() as store:
        assert not store.recovery.abnormal
        rocks = store.consume_queues
        assert rocks._max == {}  # a clean restart parsed no queue's offset rows
        assert check_store(store, acks) == n
        # Offsets assigned from the lazily filled table continue each queue exactly.
        for (topic, queue_id), end in ends.items():
            result = store.put_message(Message(topic, b"after", queue_id))
            assert result.ok and result.queue_offset == end, (topic, queue_id, end)
