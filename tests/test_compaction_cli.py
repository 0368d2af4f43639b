"""``stratamq compaction run|status`` and ``store dump`` on a store directory, as a user runs them
(the installed command, in a process of its own)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from stratamq.config import StoreConfig
from stratamq.message import Message
from stratamq.store.message_store import MessageStore

CLI = [sys.executable, "-m", "stratamq.cli"]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120)


def make_store(root: Path, topics: dict) -> None:
    with MessageStore(StoreConfig(store_path_root_dir=str(root))).open() as store:
        for i in range(100):
            props = {"KEYS": f"k{i % 10}"}
            assert store.put_message(Message("Kv", b"v%d" % i, i % 2, props)).ok
            assert store.put_message(Message("Plain", b"p%d" % i, 0, props)).ok
        assert store.put_message(Message("Kv", b"", 0, {"KEYS": "k0"})).ok  # delete k0
    (root / "config").mkdir(exist_ok=True)
    (root / "config" / "topics.json").write_text(json.dumps({"topicConfigTable": topics}))


KV = {"Kv": {"topicName": "Kv", "attributes": {"cleanup.policy": "COMPACTION"}},
      "Plain": {"topicName": "Plain", "attributes": {}}}


def lines(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines()]


def test_compaction_run_prints_one_line_per_queue_and_dump_reads_the_result(tmp_path):
    root = tmp_path / "store"
    make_store(root, KV)
    done = cli("compaction", "run", "--store", str(root))
    assert done.returncode == 0, done.stderr
    rows = {r["queue_id"]: r for r in lines(done.stdout)}
    assert set(rows) == {0, 1}
    for row in rows.values():
        assert {"topic", "queue_id", "records_read", "kept", "removed", "tombstones_dropped",
                "bytes_before", "bytes_after"} <= set(row)
        assert row["topic"] == "Kv" and row["bytes_after"] < row["bytes_before"]
    assert (rows[0]["records_read"], rows[0]["kept"], rows[0]["removed"]) == (51, 5, 46)
    dumped = lines(cli("store", "dump", "--store", str(root), "--topic", "Kv").stdout)
    assert sorted((m["queue_id"], m["keys"][0]) for m in dumped) == sorted(
        [(0, f"k{i}") for i in (0, 2, 4, 6, 8)] + [(1, f"k{i}") for i in (1, 3, 5, 7, 9)])
    # The other topic is untouched.
    assert len(lines(cli("store", "dump", "--store", str(root), "--topic", "Plain").stdout)) == 100
    status = lines(cli("compaction", "status", "--store", str(root), "--topic", "Kv").stdout)
    assert [(s["queue_id"], s["messages"], s["cleaned_to"]) for s in status] == [
        (0, 5, 51), (1, 5, 50)]
    assert status[0]["last_round"]["kept"] == 5


def test_compaction_commands_refuse_what_they_cannot_do(tmp_path):
    root = tmp_path / "store"
    make_store(root, {"Plain": {"topicName": "Plain", "attributes": {}}})
    done = cli("compaction", "run", "--store", str(root))
    assert done.returncode == 1 and "has no compaction topic" in done.stderr
    both = cli("compaction", "status", "--store", str(root), "--endpoint", "127.0.0.1:1")
    assert both.returncode == 2 and "exactly one of --store" in both.stderr
    make_store(tmp_path / "s2", KV)
    wrong = cli("compaction", "run", "--store", str(tmp_path / "s2"), "--topic", "Plain")
    assert wrong.returncode == 1 and "'Plain' is not a compaction topic" in wrong.stderr
    bad = tmp_path / "s3"
    make_store(bad, {"Kv": {"topicName": "Kv", "attributes": {"cleanup.policy": "compact"}}})
    refused = cli("compaction", "run", "--store", str(bad))
    assert refused.returncode == 1 and "cleanup.policy must be DELETE|COMPACTION" in refused.stderr
