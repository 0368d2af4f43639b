"""``stratamq tier status|flush`` and ``store clean --tiered-only`` on a store directory with
a POSIX tier (the broker's ``--config``): the JSON-lines contracts and the refusals."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from stratamq.config import StoreConfig
from stratamq.message import Message
from stratamq.store.message_store import MessageStore

PROJECT = Path(__file__).resolve().parents[1]
ROW = {"topic", "queue_id", "local_min_offset", "local_max_offset", "tier_min_offset",
       "tier_max_offset", "tier_committed_offset", "tier_bytes", "lag_messages", "lag_bytes",
       "corrupt_records", "corrupt_offsets", "missing_messages", "missing_ranges",
       "tier_unverified", "lastError", "lastErrorSince"}


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "stratamq.cli", *args], cwd=PROJECT,
                          capture_output=True, text=True, timeout=120)


def lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def write_store(store_dir: Path) -> None:
    """300 messages of ~500 bytes on two queues, in 64 KiB CommitLog files, no tier yet."""
    with MessageStore(StoreConfig(store_path_root_dir=str(store_dir),
                                  mapped_file_size_commit_log=65536,
                                  mapped_file_size_consume_queue=2000)) as s:
        for i in range(300):
            assert s.put_message(Message("Orders", b"m" * 500 + b"%d" % i, i % 2)).ok
        assert s.wait_dispatched()


def test_tier_commands_offline(tmp_path):
    store_dir = tmp_path / "store"
    conf = tmp_path / "broker.conf"
    conf.write_text("mappedFileSizeCommitLog=65536\nmappedFileSizeConsumeQueue=2000\n"
                    "messageStorePlugIn=org.apache.rocketmq.tieredstore.TieredMessageStore\n"
                    f"tieredStoreFilePath={tmp_path / 'tier'}\n"
                    "tieredStoreIndexFileMaxHashSlotNum=101\n"
                    "tieredStoreIndexFileMaxIndexNum=400\n")
    write_store(store_dir)
    where = ("--store", str(store_dir), "--config", str(conf))

    status = cli("tier", "status", *where)
    assert status.returncode == 0, status.stderr
    rows = lines(status.stdout)
    assert [set(r) for r in rows] == [ROW, ROW]
    assert [(r["topic"], r["queue_id"], r["tier_committed_offset"], r["lag_messages"])
            for r in rows] == [("Orders", 0, None, 150), ("Orders", 1, None, 150)]

    flushed = cli("tier", "flush", *where)
    assert flushed.returncode == 0, flushed.stderr
    assert [(r["tier_min_offset"], r["tier_committed_offset"], r["lag_messages"])
            for r in lines(flushed.stdout)] == [(0, 150, 0), (0, 150, 0)]

    cleaned = cli("store", "clean", *where, "--tiered-only")
    assert cleaned.returncode == 0, cleaned.stderr
    report = json.loads(cleaned.stdout)
    assert set(report) == {"store", "tiered_offset", "commitlog_files", "deleted", "bytes_freed",
                           "min_offset", "min_offset_before", "tier_unverified"}
    assert report["tier_unverified"] == []
    assert report["deleted"]["commitlog"] == len(report["commitlog_files"]) >= 2
    # Every message still dumps, the early ones from the tier.
    dumped = lines(cli("store", "dump", *where, "--topic", "Orders").stdout)
    assert len(dumped) == 300 and {d["queue_offset"] for d in dumped} == set(range(150))

    # Without the tier's config: a read-only command reads the tier the store directory
    # records; one that would change the store says it sees the local part only and refuses.
    recorded = cli("tier", "status", "--store", str(store_dir))
    assert recorded.returncode == 0, recorded.stderr
    assert lines(recorded.stdout) == lines(cli("tier", "status", *where).stdout)
    off = cli("store", "clean", "--store", str(store_dir), "--tiered-only")
    assert off.returncode == 1 and "tiered storage is off" in off.stderr
    assert "tieredStoreLocation.json" in off.stderr
    both = cli("tier", "flush", "--store", str(store_dir), "--endpoint", "127.0.0.1:1")
    assert both.returncode == 2 and "--store DIR" in both.stderr


def test_a_damaged_tier_metadata_file_stops_with_its_name(tmp_path):
    conf = tmp_path / "broker.conf"
    conf.write_text(f"tieredBackendServiceProvider=posix\ntieredStoreFilePath={tmp_path}/t\n")
    with MessageStore(StoreConfig(store_path_root_dir=str(tmp_path / "s"))) as s:
        s.put_message(Message("T", b"x"))
    meta = tmp_path / "s" / "config" / "tieredStoreMetadata.json"
    meta.write_text('{"version": 1, "topicSerialNumber": ')
    done = cli("tier", "status", "--store", str(tmp_path / "s"), "--config", str(conf))
    assert done.returncode == 1
    assert "tieredStoreMetadata.json is damaged" in done.stderr and ".bak" in done.stderr
