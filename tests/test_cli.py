"""The command-line contracts: output shapes other tools rely on, run as real processes."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import REFERENCE_MESSAGES, reference_body

from stratamq.store.consume_queue_format import UNIT

DUMP_FIELDS = {
    "topic", "queue_id", "queue_offset", "commitlog_offset", "size", "sys_flag",
    "born_timestamp", "born_host", "store_timestamp", "store_host", "reconsume_times", "tags",
    "keys", "properties", "body_crc", "body_b64",
}  # fmt: skip


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "stratamq.cli", *args], capture_output=True, text=True,
        timeout=300, cwd=cwd, env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])},
    )


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_dump_prints_every_reference_message_in_queue_order(reference_store):
    proc = cli("store", "dump", "--store", str(reference_store))
    assert proc.returncode == 0, proc.stderr
    rows = json_lines(proc.stdout)
    assert len(rows) == REFERENCE_MESSAGES
    assert set(rows[0]) == DUMP_FIELDS
    by_queue: dict[tuple[str, int], list[int]] = {}
    for row in rows:
        by_queue.setdefault((row["topic"], row["queue_id"]), []).append(row["queue_offset"])
        i = int(row["keys"][0].removeprefix("key-"))
        assert base64.b64decode(row["body_b64"]) == reference_body(i)
        assert row["topic"] == f"BenchTopic{i % 4}" and row["queue_id"] == (i // 4) % 4
        assert row["store_host"] == "127.0.0.1:10911" and row["born_host"] == "127.0.0.1:50000"
        assert row["tags"] == "TagA" and row["size"] == 1246 + len(str(i)) - 1
    assert all(offsets == list(range(1250)) for offsets in by_queue.values())

    one = json_lines(cli("store", "dump", "--store", str(reference_store), "--topic",
                         "BenchTopic2", "--queue-id", "3").stdout)
    assert [r["queue_offset"] for r in one] == list(range(1250))
    assert {(r["topic"], r["queue_id"]) for r in one} == {("BenchTopic2", 3)}


def test_dump_and_stat_refuse_what_is_not_a_store(tmp_path, reference_store):
    proc = cli("store", "dump", "--store", str(tmp_path))
    assert proc.returncode != 0 and "no store" in proc.stderr
    proc = cli("store", "dump", "--store", str(reference_store), "--topic", "Missing")
    assert proc.returncode != 0 and "Missing" in proc.stderr


def test_stat_counts_the_reference_store(reference_store):
    proc = cli("store", "stat", "--store", str(reference_store))
    assert proc.returncode == 0, proc.stderr
    (stat,) = json_lines(proc.stdout)
    assert stat["messages"] == REFERENCE_MESSAGES
    assert sorted(stat["topics"]) == [f"BenchTopic{i}" for i in range(4)]
    queue = stat["topics"]["BenchTopic0"]["queues"][0]
    assert (queue["min_offset"], queue["max_offset"]) == (0, 1250)
    assert stat["commitlog"]["segments"] == 24 and stat["commitlog"]["segment_size"] == 1 << 20


def test_verify_passes_a_sound_store_and_fails_a_damaged_one(reference_copy):
    proc = cli("store", "verify", "--store", str(reference_copy))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (summary,) = json_lines(proc.stdout)
    assert summary["ok"] is True
    assert summary["records"] == summary["units"] == REFERENCE_MESSAGES

    # Point one ConsumeQueue unit at the wrong record: verify must notice and exit non-zero.
    cq_file = reference_copy / "consumequeue" / "BenchTopic1" / "2" / "00000000000000000000"
    data = bytearray(cq_file.read_bytes())
    offset, size, code = UNIT.unpack_from(data, 5 * 20)
    UNIT.pack_into(data, 5 * 20, offset + size, size, code)  # the next record's offset
    cq_file.write_bytes(bytes(data))
    proc = cli("store", "verify", "--store", str(reference_copy))
    assert proc.returncode == 1
    (summary,) = json_lines(proc.stdout)
    assert summary["ok"] is False
    assert any("BenchTopic1/2@5" in p for p in summary["problems"])


def test_bench_store_prints_one_json_line(tmp_path):
    proc = cli("bench", "store", "--messages", "2000", "--body-size", "100", "--batch", "16",
               "--store", str(tmp_path / "bench"))
    assert proc.returncode == 0, proc.stderr
    (line,) = json_lines(proc.stdout)
    for field in ("put_msgs_per_s", "put_mb_per_s", "get_msgs_per_s"):
        assert line[field] > 0
    assert line["messages"] == 2000


def test_demo_continues_where_the_last_run_stopped(tmp_path):
    first = cli("demo", "--messages", "40", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "read back 40 messages" in first.stdout
    second = cli("demo", "--messages", "40", cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert "queues now hold 80 in total" in second.stdout
    assert (tmp_path / "demo-data" / "commitlog" / ("0" * 20)).exists()
    assert not (tmp_path / "data").exists()  # the broker's default store is left alone
