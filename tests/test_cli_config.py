"""Offline ``store`` commands read the broker's ``broker.conf`` (``--config``), and a repair
never writes more than the disk has free."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys

from stratamq.config import StoreConfig
from stratamq.message import Message
from stratamq.store.index_file import file_size, is_index_file_name
from stratamq.store.message_store import MessageStore

SMALL_INDEX = {"maxHashSlotNum": "1000", "maxIndexNum": "4000"}


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "stratamq.cli", *args], capture_output=True,
                          text=True, timeout=120)


def _write_store(root, settings: dict[str, str], n: int = 200) -> None:
    cfg = StoreConfig(store_path_root_dir=str(root), mapped_file_size_commit_log=256 * 1024,
                      mapped_file_size_consume_queue=2000,
                      max_hash_slot_num=int(settings["maxHashSlotNum"]),
                      max_index_num=int(settings["maxIndexNum"]))
    with MessageStore(cfg) as s:
        for i in range(n):
            assert s.put_message(Message("Conf", b"body-%d" % i,
                                         properties={"KEYS": f"k-{i}"})).ok
        s.wait_dispatched()


def _conf(path, settings: dict[str, str]):
    path.write_text("".join(f"{k}={v}\n" for k, v in {
        "mappedFileSizeCommitLog": str(256 * 1024), "mappedFileSizeConsumeQueue": "2000",
        **settings}.items()))
    return path


def _index_sizes(root) -> list[int]:
    return [p.stat().st_size for p in sorted((root / "index").iterdir())
            if is_index_file_name(p.name)]


def test_every_store_command_takes_the_broker_conf(tmp_path):
    root = tmp_path / "store"
    _write_store(root, SMALL_INDEX)
    conf = _conf(tmp_path / "broker.conf", SMALL_INDEX)
    sizes = _index_sizes(root)
    assert sizes == [file_size(1000, 4000)]
    for args in (["store", "verify"], ["store", "stat"], ["store", "dump", "--topic", "Conf"],
                 ["store", "query", "--topic", "Conf", "--key", "k-7"],
                 ["store", "offset-by-time", "--topic", "Conf", "--queue-id", "0",
                  "--timestamp", "0"]):
        done = _cli(*args, "--store", str(root), "--config", str(conf))
        assert done.returncode == 0, (args, done.stderr)
    verified = json.loads(_cli("store", "verify", "--store", str(root), "--config",
                               str(conf)).stdout)
    assert verified["ok"] and verified["repaired"] == []
    assert _index_sizes(root) == sizes  # nothing rebuilt at another size
    bad = _conf(tmp_path / "bad.conf", {"maxIndexNumber": "5"})
    done = _cli("store", "stat", "--store", str(root), "--config", str(bad))
    assert done.returncode == 1 and "maxIndexNumber" in done.stderr


def test_an_index_repair_is_refused_when_the_disk_cannot_hold_it(tmp_path, tmpfs):
    root = tmpfs / "store"
    _write_store(root, SMALL_INDEX, n=300)
    shutil.rmtree(root / "index")  # lost: verify rebuilds it from the CommitLog
    free_before = shutil.disk_usage(tmpfs).free
    # With the defaults a new index file is 420 MB: far more than the 8 MiB disk holds.
    done = _cli("store", "verify", "--store", str(root))
    assert done.returncode == 1, done.stdout + done.stderr
    summary = json.loads(done.stdout)
    assert not summary["ok"]
    assert any("not enough free space" in p and "--config" in p for p in summary["problems"])
    assert shutil.disk_usage(tmpfs).free >= free_before - 1024 * 1024  # nothing filled it
    # With the broker's own settings the same repair fits, and is made.
    conf = _conf(tmp_path / "broker.conf", SMALL_INDEX)
    done = _cli("store", "verify", "--store", str(root), "--config", str(conf))
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["repaired"]
    found = _cli("store", "query", "--store", str(root), "--config", str(conf), "--topic",
                 "Conf", "--key", "k-123")
    bodies = [base64.b64decode(json.loads(line)["body_b64"]) for line in found.stdout.split()]
    assert bodies == [b"body-123"]


def test_long_jobs_show_progress_on_stderr_and_keep_stdout_json(tmp_path):
    root = tmp_path / "store"
    _write_store(root, SMALL_INDEX, n=500)
    env = {**os.environ, "STRATAMQ_PROGRESS_EVERY_S": "0"}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "stratamq.cli", *args, "--store",
                               str(root)], capture_output=True, text=True, timeout=120, env=env)

    verified = run("store", "verify", "--config", str(_conf(tmp_path / "b.conf", SMALL_INDEX)))
    assert verified.returncode == 0, verified.stderr
    assert json.loads(verified.stdout)["ok"]  # stdout: the JSON summary alone
    assert "checking CommitLog records: " in verified.stderr
    assert "checking ConsumeQueue units: " in verified.stderr and "queues)" in verified.stderr
    migrated = run("store", "migrate-cq", "--to", "rocksdb")
    assert migrated.returncode == 0, migrated.stderr
    assert json.loads(migrated.stdout)["ok"]
    assert "building defaultRocksDB: " in migrated.stderr
    assert "checking defaultRocksDB against default: " in migrated.stderr
    quiet = run("store", "verify", "--quiet")
    assert quiet.returncode == 0 and "checking" not in quiet.stderr
