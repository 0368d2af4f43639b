"""What the store commands say about a damaged or incomplete store, run as real processes.

Each test damages real files of a store (the RocketMQ reference store, or a small one written
here) and checks what ``store verify`` / ``dump`` / ``stat`` / ``query`` report: data that a
recovery cut throws away is data loss (verify exits 1 and names the cut and the counts), records
the read-only commands cannot show are named on stderr, what verify can rebuild from the
CommitLog (ConsumeQueue units, index files) it rebuilds and lists, and a corrupt record is named
by its CommitLog offset instead of vanishing or ending in a traceback.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import REFERENCE_MESSAGES
from damage import patch, record_starts

from stratamq.config import StoreConfig
from stratamq.record import Message, decode, offset_msg_id
from stratamq.store.consume_queue_format import BLANK_UNIT, UNIT
from stratamq.store.inspect import index_gaps
from stratamq.store.layout import segment_name
from stratamq.store.message_store import MessageStore
from stratamq.store.verify import verify_store

PROJECT = Path(__file__).resolve().parents[1]
SEGMENT = 64 * 1024
NEWEST = "00000000000024117248"  # the reference store's newest CommitLog segment (1 MiB each)


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "stratamq.cli", *args], capture_output=True, text=True,
        timeout=300, env={**os.environ, "PYTHONPATH": str(PROJECT)},
    )


def one_json(proc: subprocess.CompletedProcess) -> dict:
    (line,) = [x for x in proc.stdout.splitlines() if x.strip()]
    return json.loads(line)


def lines(proc: subprocess.CompletedProcess) -> int:
    return len([x for x in proc.stdout.splitlines() if x.strip()])


def warnings(proc: subprocess.CompletedProcess) -> list[str]:
    return [x for x in proc.stderr.splitlines() if x.startswith("warning: ")]


def small_config(root: Path, **extra) -> StoreConfig:
    return StoreConfig(store_path_root_dir=str(root), mapped_file_size_commit_log=SEGMENT,
                       mapped_file_size_consume_queue=100 * 20, **extra)


def topic_of(key: str) -> str:
    return f"T{int(key.removeprefix('k-')) % 2}"


def write_small_store(root: Path, count: int = 240, **extra) -> list[tuple[int, int, str]]:
    """Messages with keys over several 64 KiB segments; (offset, size, key) of each."""
    out = []
    with MessageStore(small_config(root, **extra)) as store:
        for i in range(count):
            result = store.put_message(Message(f"T{i % 2}", b"b%05d" % i * 150, queue_id=i % 3,
                                               properties={"KEYS": f"k-{i}", "TAGS": "t"}))
            assert result.ok, result
            out.append((result.physical_offset, result.messages[0].size, f"k-{i}"))
        assert store.wait_dispatched(30)
    assert out[-1][0] // SEGMENT >= 3, "the store should span several segments"
    return out


# -- data loss behind a recovery cut ---------------------------------------------------------


def test_verify_fails_when_recovery_cuts_valid_records_behind_a_corrupt_one(reference_copy):
    segment = reference_copy / "commitlog" / NEWEST
    starts = record_starts(segment)
    cut = int(NEWEST) + starts[10]
    after = len(starts) - 11  # valid records behind the damaged one
    patch(segment, starts[10] + 4, b"\xde\xad\xbe\xef")  # its magic code

    # Read-only commands still show what is before the cut, and say what is behind it.
    stat = cli("store", "stat", "--store", str(reference_copy))
    assert stat.returncode == 0, stat.stderr
    summary = one_json(stat)
    assert summary["recovery"]["records_after_cut"] == after
    assert summary["recovery"]["read_only"] is True and "note" in summary["recovery"]
    (warning,) = warnings(stat)
    assert f"corrupt record at {cut} with {after} valid records after it" in warning
    assert "store verify" in warning
    dump = cli("store", "dump", "--store", str(reference_copy))
    assert dump.returncode == 0, dump.stderr
    assert lines(dump) == REFERENCE_MESSAGES - after - 1
    assert any(f"corrupt record at {cut}" in w for w in warnings(dump))

    verify = cli("store", "verify", "--store", str(reference_copy))
    assert verify.returncode == 1, verify.stdout + verify.stderr
    summary = one_json(verify)
    assert summary["ok"] is False
    loss = summary["data_loss"]
    assert loss["cut_offset"] == cut and "bad magic code" in loss["reason"]
    assert loss["records_after_cut"] == after
    assert loss["first_record_after_cut"] == int(NEWEST) + starts[11]
    assert loss["dropped_units"] == after + 1  # every one of them had been dispatched
    assert any(f"{after} valid records after the cut" in p for p in summary["problems"])


def test_a_read_write_open_keeps_the_valid_records_behind_a_recovery_cut(tmp_path, caplog):
    """A corrupt record in an older segment: recovery must cut the log there (RocketMQ deletes
    everything after it), but the valid records behind the cut, in the rest of that segment and
    in the newer segments it drops, are kept under <store>/damaged/ and said at ERROR."""
    root = tmp_path / "store"
    written = write_small_store(root)
    last_segment = written[-1][0] // SEGMENT
    middle = [w for w in written if w[0] // SEGMENT == last_segment - 1]
    victim = middle[len(middle) // 3]
    patch(root / "commitlog" / segment_name(victim[0] - victim[0] % SEGMENT),
          victim[0] % SEGMENT + 4, b"\xde\xad\xbe\xef")  # its magic code
    behind = [w for w in written if w[0] > victim[0]]

    with (caplog.at_level(logging.ERROR, logger="stratamq.store.recovery"),
          MessageStore(small_config(root)) as store):
        assert store.max_physical_offset == victim[0]  # the log is cut at the damage
        report = store.recovery
    assert report.records_after_cut == len(behind)
    kept = Path(report.set_aside)
    assert kept.parent == root / "damaged"
    assert any(str(kept) in r.getMessage() and r.levelname == "ERROR" for r in caplog.records)

    pieces = sorted((int(f.name), f.read_bytes()) for f in kept.iterdir())
    assert pieces[0][0] == victim[0]
    for offset, _size, key in behind:  # each record, decoded at its own offset
        base, data = max(p for p in pieces if p[0] <= offset)
        stored = decode(data, offset - base, check_crc=True)
        assert (stored.physical_offset, stored.properties["KEYS"]) == (offset, key)

    with MessageStore(small_config(root)) as store:  # nothing more to cut, nothing re-kept
        assert store.recovery.set_aside is None
        assert store.max_physical_offset == victim[0]
    assert [d.name for d in (root / "damaged").iterdir()] == [kept.name]


def test_verify_fails_on_a_lost_write_in_a_middle_segment(tmp_path):
    """Zeros over records in an older segment: recovery cuts there and deletes the newer
    segments whole; that is data loss, and recovery says what it found."""
    root = tmp_path / "store"
    written = write_small_store(root)
    last_segment = written[-1][0] // SEGMENT
    middle = [w for w in written if w[0] // SEGMENT == last_segment - 1]
    victim = middle[len(middle) // 3]
    zero_end = victim[0] + 3000
    assert zero_end < middle[-1][0], "the zeroed bytes must stay inside the segment"
    patch(root / "commitlog" / segment_name(victim[0] - victim[0] % SEGMENT),
          victim[0] % SEGMENT, bytes(3000))
    lost = [w for w in written if w[0] >= zero_end]

    stat = cli("store", "stat", "--store", str(root))
    assert any(f"corrupt record at {victim[0]} with {len(lost)} valid records after it" in w
               for w in warnings(stat)), stat.stderr

    verify = cli("store", "verify", "--store", str(root))
    assert verify.returncode == 1, verify.stdout + verify.stderr
    summary = one_json(verify)
    assert summary["recovery"]["problem"] is not None
    assert "zero bytes" in summary["recovery"]["problem"]
    loss = summary["data_loss"]
    assert loss["cut_offset"] == victim[0]
    assert loss["records_after_cut"] == len(lost)
    assert loss["first_record_after_cut"] == lost[0][0]
    assert segment_name(last_segment * SEGMENT) in loss["deleted_segments"]
    assert loss["dropped_units"] == len([w for w in written if w[0] >= victim[0]])


def test_a_torn_tail_after_a_crash_is_not_data_loss(tmp_path):
    """Half a record after the last one (a crash mid-append, never dispatched): recovery cuts
    it, says why, and verify still passes."""
    root = tmp_path / "store"
    written = write_small_store(root)
    end = written[-1][0] + written[-1][1]
    segment = root / "commitlog" / segment_name(end - end % SEGMENT)
    record = segment.read_bytes()[written[-1][0] % SEGMENT:][:written[-1][1]]
    patch(segment, end % SEGMENT, record[: len(record) // 2])
    (root / "abort").touch()

    verify = cli("store", "verify", "--store", str(root))
    assert verify.returncode == 0, verify.stdout + verify.stderr
    summary = one_json(verify)
    assert summary["ok"] is True and summary["data_loss"] is None
    assert summary["recovery"]["problem"] is not None
    assert summary["recovery"]["end_offset"] == end
    assert summary["recovery"]["records_after_cut"] == 0
    assert summary["records"] == summary["units"] == len(written)


# -- records no ConsumeQueue holds -----------------------------------------------------------

LAGGING_WRITER = textwrap.dedent("""
    import os, signal, sys
    from stratamq.config import StoreConfig
    from stratamq.message import Message
    from stratamq.store.message_store import MessageStore
    store = MessageStore(StoreConfig(store_path_root_dir=sys.argv[1],
                                     mapped_file_size_commit_log=1 << 20)).open()
    for i in range(500):
        if i == 100:  # the dispatcher stops, as if it were slow, then the process dies
            assert store.wait_dispatched(30)
            store.reput._stop.set(); store.reput._wake.set(); store.reput._thread.join()
        assert store.put_message(Message("Lag", b"x" * 500 + str(i).encode(), i % 4)).ok
    store.flush()
    os.kill(os.getpid(), signal.SIGKILL)
""")


def test_records_not_yet_in_a_consume_queue_are_counted_and_verify_dispatches_them(tmp_path):
    root = tmp_path / "store"
    proc = subprocess.run([sys.executable, "-c", LAGGING_WRITER, str(root)], timeout=120,
                          env={**os.environ, "PYTHONPATH": str(PROJECT)})
    assert proc.returncode == -signal.SIGKILL

    dump = cli("store", "dump", "--store", str(root))
    assert dump.returncode == 0, dump.stderr
    assert lines(dump) == 100
    (warning,) = warnings(dump)
    assert "400 records in the CommitLog are in no ConsumeQueue" in warning
    assert "store verify" in warning
    stat = one_json(cli("store", "stat", "--store", str(root)))
    assert stat["messages"] == 100
    assert stat["undispatched_records"] == 400
    assert stat["undispatched_by_queue"] == {f"Lag/{q}": 100 for q in range(4)}

    verify = cli("store", "verify", "--store", str(root))
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert one_json(verify)["units"] == 500
    dump = cli("store", "dump", "--store", str(root))
    assert lines(dump) == 500 and not warnings(dump)


def test_a_removed_queue_is_named_and_rebuilt_by_verify(reference_copy):
    shutil.rmtree(reference_copy / "consumequeue" / "BenchTopic1" / "2")
    quick = one_json(cli("store", "stat", "--store", str(reference_copy)))
    assert quick["scanned_from"] > 0  # only what an open replays: the lost queue is older
    stat = cli("store", "stat", "--store", str(reference_copy), "--full")
    summary = one_json(stat)
    assert summary["messages"] == REFERENCE_MESSAGES - 1250
    assert summary["undispatched_by_queue"] == {"BenchTopic1/2": 1250}
    assert any("BenchTopic1/2: 1250" in w for w in warnings(stat))

    verify = cli("store", "verify", "--store", str(reference_copy))
    assert verify.returncode == 0, verify.stdout + verify.stderr
    summary = one_json(verify)
    assert any("BenchTopic1/2: 1250" in r for r in summary["repaired"])
    assert summary["units"] == REFERENCE_MESSAGES
    assert lines(cli("store", "dump", "--store", str(reference_copy), "--topic", "BenchTopic1",
                     "--queue-id", "2")) == 1250


def test_verify_names_the_queue_whose_units_and_records_differ(reference_copy):
    # A unit blanked out in the middle of a queue: one record of it has no unit.
    cq_file = reference_copy / "consumequeue" / "BenchTopic3" / "1" / "00000000000000000000"
    patch(cq_file, 7 * UNIT.size, BLANK_UNIT)
    verify = cli("store", "verify", "--store", str(reference_copy))
    assert verify.returncode == 1
    (problem,) = one_json(verify)["problems"]
    assert "BenchTopic3/1 (1250 records, 1249 units)" in problem


def test_a_store_type_without_its_rocksdb_is_an_error_not_an_empty_store(reference_copy):
    (reference_copy / "config").mkdir(exist_ok=True)
    (reference_copy / "config" / "storeType").write_text("defaultRocksDB\n")
    for command in ("stat", "dump"):
        proc = cli("store", command, "--store", str(reference_copy))
        assert proc.returncode == 1 and not proc.stdout
        assert "rocksdb/consumequeue/ is missing" in proc.stderr
        assert "stratamq store migrate-cq" in proc.stderr
    # Reading it as what it still has works.
    stat = one_json(cli("store", "stat", "--store", str(reference_copy),
                        "--store-type", "default"))
    assert stat["messages"] == REFERENCE_MESSAGES
    # verify (a read-write open) rebuilds the RocksDB store and says so.
    verify = cli("store", "verify", "--store", str(reference_copy))
    assert verify.returncode == 0, verify.stdout + verify.stderr
    summary = one_json(verify)
    assert summary["units"] == REFERENCE_MESSAGES
    assert any("rocksdb/consumequeue/ was missing" in r for r in summary["repaired"])
    assert one_json(cli("store", "stat", "--store", str(reference_copy)))["messages"] == (
        REFERENCE_MESSAGES)


# -- the index -------------------------------------------------------------------------------


def test_query_warns_when_no_index_file_covers_the_log_and_verify_rebuilds_it(reference_copy):
    index_dir = reference_copy / "index"
    (original,) = index_dir.iterdir()
    original.rename(index_dir / "garbage")  # no longer an index file name: not read
    query = ("store", "query", "--store", str(reference_copy), "--topic", "BenchTopic1",
             "--key", "key-9")
    proc = cli(*query)
    assert proc.returncode == 0 and not proc.stdout
    (warning,) = warnings(proc)
    assert "no index file covers" in warning and "from offset 0" in warning

    verify = cli("store", "verify", "--store", str(reference_copy))
    assert verify.returncode == 0, verify.stdout + verify.stderr
    summary = one_json(verify)
    assert summary["index"]["rebuilt"]["records"] == REFERENCE_MESSAGES
    assert summary["index"]["unindexed_records"] == 0
    assert any("in no index file" in r for r in summary["repaired"])
    proc = cli(*query)
    assert proc.returncode == 0 and not warnings(proc)
    (row,) = [json.loads(x) for x in proc.stdout.splitlines()]
    assert row["keys"] == ["key-9"]


def test_verify_rebuilds_index_files_missing_in_the_middle(tmp_path):
    """Small index files (in-process: the CLI opens stores with the default index sizes):
    one of the middle ones removed leaves records no file covers; verify replaces the files
    after the gap by a rebuild, and every key is found again."""
    root = tmp_path / "store"
    index_sizes = {"max_hash_slot_num": 64, "max_index_num": 50}
    written = write_small_store(root, count=200, **index_sizes)
    files = sorted((root / "index").iterdir())
    assert len(files) >= 4
    files[1].unlink()
    cfg = small_config(root, **index_sizes)

    with MessageStore(cfg, read_only=True) as store:
        (gap,) = index_gaps(store.parts())
        missing = [w for w in written if gap.first <= w[0] <= gap.last]
        assert gap.records == len(missing) > 0
        assert store.query_messages(topic_of(missing[0][2]), missing[0][2]) == []
    with MessageStore(cfg) as store:
        summary = verify_store(store.parts())
    assert summary["ok"] is True, summary["problems"]
    assert summary["index"]["rebuilt"]["from_offset"] == gap.first
    assert files[2].name in summary["index"]["rebuilt"]["removed_files"]
    assert files[0].name not in summary["index"]["rebuilt"]["removed_files"]
    with MessageStore(cfg, read_only=True) as store:
        assert index_gaps(store.parts()) == []
        for phys, _, key in written:
            (hit,) = store.query_messages(topic_of(key), key)
            assert hit.physical_offset == phys


# -- corrupt records are named by their CommitLog offset --------------------------------------


def test_corrupt_records_are_named_by_their_commitlog_offset(reference_copy):
    segment_start = 5 * (1 << 20)
    segment = reference_copy / "commitlog" / segment_name(segment_start)
    starts = record_starts(segment)
    bad_magic = segment_start + starts[3]
    bad_crc = segment_start + starts[5]
    victim = decode(segment.read_bytes(), starts[3])  # what it held, to look it up later
    patch(segment, starts[3] + 4, b"\xde\xad\xbe\xef")
    data = segment.read_bytes()
    patch(segment, starts[5] + 8, bytes([data[starts[5] + 8] ^ 1]))  # its stored body CRC
    bad_length = segment_start + starts[7]
    patch(segment, starts[7] + 84, struct.pack(">i", 0x7FFFFFF0))  # its body length
    stat = cli("store", "stat", "--store", str(reference_copy), "--full")
    assert stat.returncode == 0, stat.stderr
    assert one_json(stat)["corrupt_records"] == [bad_magic, bad_length]  # no CRCs checked

    dump = cli("store", "dump", "--store", str(reference_copy))
    assert dump.returncode == 1
    assert "Traceback" not in dump.stderr
    assert f"corrupt record at CommitLog offset {bad_magic}" in dump.stderr
    assert f"corrupt record at CommitLog offset {bad_crc}" in dump.stderr
    assert f"corrupt record at CommitLog offset {bad_length}" in dump.stderr
    assert "bad magic code" in dump.stderr and "body CRC mismatch" in dump.stderr
    # Everything readable was dumped, the record with a bad CRC included.
    assert lines(dump) == REFERENCE_MESSAGES - 2

    for how in (("--msg-id", offset_msg_id(victim.store_host, bad_magic)),
                ("--msg-id", victim.properties["UNIQ_KEY"]),
                ("--topic", victim.topic, "--key", victim.keys[0])):
        proc = cli("store", "query", "--store", str(reference_copy), *how)
        assert proc.returncode == 1, how
        assert f"the record at CommitLog offset {bad_magic} is corrupt" in proc.stderr, how
        assert "bad magic code" in proc.stderr

    verify = cli("store", "verify", "--store", str(reference_copy))
    assert verify.returncode == 1
    summary = one_json(verify)
    assert summary["corrupt_records"] == 3
    problems = "\n".join(summary["problems"])
    assert f"corrupt record at {bad_magic}: bad magic code" in problems
    assert f"corrupt record at {bad_crc}: body CRC mismatch" in problems
    assert f"corrupt record at {bad_length}: body length" in problems
    assert f"bad record at commitlog offset {bad_crc}: body CRC mismatch" in problems


def test_dump_refuses_a_queue_that_does_not_exist(reference_store):
    proc = cli("store", "dump", "--store", str(reference_store), "--topic", "BenchTopic0",
               "--queue-id", "7")
    assert proc.returncode == 1 and not proc.stdout
    assert "topic 'BenchTopic0' has no queue 7 (queues: [0, 1, 2, 3])" in proc.stderr
    proc = cli("store", "dump", "--store", str(reference_store), "--queue-id", "99")
    assert proc.returncode == 1 and "has queue 99" in proc.stderr


def test_verify_stops_the_clean_up_service_first(tmp_path):
    # A clean-up pass that fired during verify (at deleteWhen, or under disk pressure) could
    # delete a segment the check is reading: verify stops the service before it starts.
    with MessageStore(small_config(tmp_path / "store")).open() as store:
        assert store.put_messages([Message("T", b"x" * 900, 0) for _ in range(300)]).ok
        assert store.wait_dispatched()
        assert store.cleanup.running
        assert verify_store(store.parts())["ok"]
        assert not store.cleanup.running
