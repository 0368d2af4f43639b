"""Retention and disk watermarks: which CommitLog files a clean-up pass deletes and when, what
happens to ConsumeQueues, readers and puts around it, and that a store reopens correctly after.

Disk usage comes from a real file system where it matters (an 8 MiB tmpfs mounted by the
test: puts refused past 90 %, ENOSPC), and from an injected probe where a test needs one exact
ratio. The hour of ``deleteWhen`` comes from the ``now_ms`` a pass is given.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

from stratamq.config import DiskFullPolicy, StoreConfig
from stratamq.message import Message
from stratamq.store.cleanup import is_time_to_delete, statvfs_used_ratio
from stratamq.store.layout import segment_name
from stratamq.store.message_store import MessageStore
from stratamq.store.results import GetMessageStatus, PutMessageStatus

PROJECT = Path(__file__).resolve().parents[1]
HOUR_MS = 3600 * 1000
SEGMENT = 64 * 1024
CQ_UNITS = 100  # units per ConsumeQueue file in small_config
DELETE_OLDEST = DiskFullPolicy.DELETE_OLDEST  # RocketMQ's forced deletion, tested as such


class Acked(NamedTuple):
    i: int
    queue_id: int
    queue_offset: int
    physical_offset: int
    body: bytes


def body_of(i: int, size: int = 900) -> bytes:
    unit = b"m%08d;" % i
    return (unit * (size // len(unit) + 1))[:size]


def config(small_config: StoreConfig, **kw) -> StoreConfig:
    """Small segments; the background pass effectively off (tests run passes themselves);
    no pauses between deletions."""
    base = dict(clean_resource_interval=3_600_000, delete_commit_log_files_interval=0,
                delete_consume_queue_files_interval=0)
    return dataclasses.replace(small_config, **{**base, **kw})


def fill(store: MessageStore, count: int, *, start: int = 0, queues: int = 2,
         size: int = 900) -> list[Acked]:
    acked = []
    for i in range(start, start + count):
        r = store.put_message(Message("T", body_of(i, size), i % queues))
        assert r.ok, r
        acked.append(Acked(i, i % queues, r.queue_offset, r.physical_offset, body_of(i, size)))
    assert store.wait_dispatched()
    store.flush()  # clean-up never deletes past what is flushed and dispatched
    return acked


def put_until_refused(store: MessageStore, acked: list[Acked], *, start: int = 0):
    """Put 2000-byte messages until one is refused (adding each accepted one to ``acked``);
    return the refusal, or None if 20,000 puts were all accepted."""
    for i in range(start, 20_000):
        body = body_of(i, 2000)
        r = store.put_message(Message("T", body, i % 2))
        if not r.ok:
            return r
        acked.append(Acked(i, i % 2, r.queue_offset, r.physical_offset, body))
    return None


def at_hour(hour: int) -> int:
    """Today at ``hour``:30 local time, in ms."""
    lt = time.localtime()
    return int(time.mktime((lt.tm_year, lt.tm_mon, lt.tm_mday, hour, 30, 0, 0, 0, -1)) * 1000)


def set_age(paths, now_ms: int, hours: float) -> None:
    ns = (now_ms - int(hours * HOUR_MS)) * 1_000_000
    for p in paths:
        os.utime(p, ns=(ns, ns))


def segments(store: MessageStore) -> list[Path]:
    return [mf.path for mf in store.commitlog.files.files]


def fixed_usage(store: MessageStore, ratio: float) -> None:
    store.cleanup.usage_probe = lambda path: ratio


def read_all(store: MessageStore, queue_id: int) -> dict[int, bytes]:
    """queue offset -> body of every message readable in a queue, from its min offset on."""
    out = {}
    offset = store.get_min_offset_in_queue("T", queue_id)
    while True:
        with store.get_messages("g", "T", queue_id, offset, 64) as got:
            if got.status is not GetMessageStatus.FOUND:
                return out
            for m in got.messages():
                out[m.queue_offset] = m.body
            offset = got.next_begin_offset


def assert_retained(store: MessageStore, acked: list[Acked], queues: int = 2) -> None:
    """Every acknowledged message at or above the CommitLog's min is readable, byte for byte;
    every one below it is reported OFFSET_TOO_SMALL with the queue's new min."""
    floor = store.min_physical_offset
    for q in range(queues):
        mine = [a for a in acked if a.queue_id == q]
        kept = {a.queue_offset: a.body for a in mine if a.physical_offset >= floor}
        assert read_all(store, q) == kept
        gone = [a for a in mine if a.physical_offset < floor]
        new_min = min(kept) if kept else store.get_max_offset_in_queue("T", q)
        assert store.get_min_offset_in_queue("T", q) == new_min
        for a in gone[:1] + gone[-1:]:
            with store.get_messages("g", "T", q, a.queue_offset) as got:
                assert got.status is GetMessageStatus.OFFSET_TOO_SMALL
                assert got.next_begin_offset == new_min
                assert not got.records


# -- when CommitLog files go ----------------------------------------------------------------------


def test_delete_when_hours_parse_like_rocketmq():
    assert is_time_to_delete("04", at_hour(4))
    assert not is_time_to_delete("04", at_hour(5))
    assert is_time_to_delete("03;05", at_hour(5))
    assert not is_time_to_delete("03;x;", at_hour(4))


def test_expired_files_go_only_at_a_delete_when_hour(small_config):
    with MessageStore(config(small_config)).open() as store:
        fill(store, 400)
        files = segments(store)
        assert len(files) >= 5
        four = at_hour(4)
        set_age(files[:3], four, 73)  # expired (fileReservedTime 72 h)
        set_age(files[3:], four, 1)
        fixed_usage(store, 0.10)  # far below every watermark

        ten = four + 6 * HOUR_MS  # the first three are still expired then, but it is 10:30
        report = store.cleanup.run_once(now_ms=ten)
        assert report.commitlog_files == [] and report.triggers == []
        assert all(p.exists() for p in files)

        report = store.cleanup.run_once(now_ms=four)
        assert report.triggers == ["time"]
        assert report.commitlog_files == [f"commitlog/{p.name}" for p in files[:3]]
        assert [p.exists() for p in files] == [False] * 3 + [True] * (len(files) - 3)
        assert report.min_offset == store.min_physical_offset == int(files[3].name)
        assert report.bytes_freed >= 3 * SEGMENT  # every deleted segment was fully written


def test_past_max_used_ratio_expired_files_go_at_any_hour(small_config):
    with MessageStore(config(small_config)).open() as store:
        acked = fill(store, 400)
        files = segments(store)
        ten = at_hour(10)
        set_age(files[:2], ten, 100)
        set_age(files[2:3], ten, 10)  # not expired: ends the pass, although older ones follow
        set_age(files[3:], ten, 200)
        fixed_usage(store, 0.80)  # past diskMaxUsedSpaceRatio 75 %, below the forcible 85 %
        report = store.cleanup.run_once(now_ms=ten)
        assert report.triggers == ["space"]
        assert report.commitlog_files == [f"commitlog/{p.name}" for p in files[:2]]
        assert store.min_physical_offset == int(files[2].name)
        assert_retained(store, acked)


def test_past_forcible_ratio_unexpired_oldest_files_go_a_batch_at_a_time(small_config):
    cfg = config(small_config, delete_file_batch_max=2, disk_full_policy=DELETE_OLDEST)
    with MessageStore(cfg).open() as store:
        acked = fill(store, 500)
        files = segments(store)
        assert len(files) >= 7
        ten = at_hour(10)
        set_age(files, ten, 1)  # nothing is expired
        fixed_usage(store, 0.88)

        store.config.clean_file_forcibly_enable = False  # the switch RocketMQ has for it
        assert store.cleanup.run_once(now_ms=ten).commitlog_files == []
        store.config.clean_file_forcibly_enable = True

        first = store.cleanup.run_once(now_ms=ten)
        assert first.triggers == ["space", "forcibly"]
        assert first.commitlog_files == [f"commitlog/{p.name}" for p in files[:2]]
        second = store.cleanup.run_once(now_ms=ten)
        assert second.commitlog_files == [f"commitlog/{p.name}" for p in files[2:4]]
        assert_retained(store, acked)

        store.config.delete_file_batch_max = 100
        store.cleanup.run_once(now_ms=ten)
        # Never the file being written: it is all that is left, and it still takes puts.
        assert segments(store) == files[-1:]
        more = fill(store, 5, start=500)
        assert_retained(store, acked + more)


def test_the_service_thread_cleans_on_its_own_and_lifts_the_disk_full_mark(small_config):
    cfg = config(small_config, clean_resource_interval=20, delete_file_batch_max=1,
                 disk_full_policy=DELETE_OLDEST)
    with MessageStore(cfg).open() as store:
        usage = [0.10]
        store.cleanup.usage_probe = lambda path: usage[0]
        store.cleanup.put_check_interval_ms = 3_600_000  # only the service looks at the disk
        acked = fill(store, 300)
        files = segments(store)
        usage[0] = 0.95  # past the warning mark: the service marks the disk full ...
        deadline = time.monotonic() + 60  # hang guards, not measurements
        while files[0].exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not files[0].exists()  # ... and cleans forcibly, a batch per round
        refused = store.put_message(Message("T", b"x", 0))
        assert refused.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
        assert "disk full" in refused.error
        usage[0] = 0.50
        while store.cleanup.disk_full and time.monotonic() < deadline:
            time.sleep(0.01)
        r = store.put_message(Message("T", b"accepted again", 0))
        assert r.ok, r
        assert store.wait_dispatched()
        assert_retained(store, [*acked, Acked(-1, 0, r.queue_offset, r.physical_offset,
                                              b"accepted again")])


def test_index_files_below_the_new_min_go_with_the_consume_queues(small_config):
    cfg = config(small_config, delete_file_batch_max=4, max_hash_slot_num=16, max_index_num=60)
    with MessageStore(cfg).open() as store:
        for i in range(300):
            assert store.put_message(Message("T", body_of(i), i % 2, {"KEYS": f"k{i}"})).ok
        assert store.wait_dispatched()
        store.flush()
        report = store.cleanup.run_once(force=True)
        assert report.index_files, "small index files below the new min should go"
        assert report.index_deleted == len(report.index_files)
        assert all(not (store.layout.root / p).exists() for p in report.index_files)
        assert all(p.startswith("index/") for p in report.index_files)


# -- readers --------------------------------------------------------------------------------------


def test_a_held_reader_view_survives_deletion_and_the_file_goes_after_release(small_config):
    with MessageStore(config(small_config, delete_file_batch_max=1)).open() as store:
        acked = fill(store, 300)
        first = store.commitlog.files.files[0]
        held = store.get_messages("g", "T", 0, 0, max_count=8)
        assert held.status is GetMessageStatus.FOUND
        expected = [a.body for a in acked if a.queue_id == 0][:8]

        report = store.cleanup.run_once(force=True)
        assert report.commitlog_files == [f"commitlog/{first.path.name}"]
        assert report.held_by_readers == report.commitlog_files
        assert not first.path.exists()  # the name is gone at once ...
        assert not first.closed  # ... the map stays while the reader holds it
        assert [m.body for m in held.messages()] == expected

        with store.get_messages("g", "T", 0, 0) as again:  # a new reader cannot reach it
            assert again.status is GetMessageStatus.OFFSET_TOO_SMALL
        held.release()
        assert first.closed
        assert store.cleanup.run_once().held_by_readers == []


def test_a_reader_that_never_lets_go_is_unmapped_forcibly_without_breaking_its_views(
        small_config):
    cfg = config(small_config, delete_file_batch_max=1, destroy_mapped_file_interval_forcibly=0)
    with MessageStore(cfg).open() as store:
        acked = fill(store, 300)
        first = store.commitlog.files.files[0]
        held = store.get_messages("g", "T", 1, 0, max_count=4)
        report = store.cleanup.run_once(force=True)
        assert report.commitlog_files == [f"commitlog/{first.path.name}"]
        assert first.closed and report.held_by_readers == []  # forced past the bound
        # The views the reader already has keep their pages: same bytes, no crash.
        assert [m.body for m in held.messages()] == [a.body for a in acked if a.queue_id == 1][:4]
        held.release()


# -- ConsumeQueues ---------------------------------------------------------------------------------


def test_consume_queue_files_below_the_new_min_go_and_min_offsets_move(small_config):
    with MessageStore(config(small_config, delete_file_batch_max=4)).open() as store:
        acked = fill(store, 600, size=500)
        report = store.cleanup.run_once(force=True)
        assert len(report.commitlog_files) == 4
        floor = store.min_physical_offset
        expect_gone = []
        for q in range(2):
            mine = sorted((a for a in acked if a.queue_id == q), key=lambda a: a.queue_offset)
            nfiles = -(-len(mine) // CQ_UNITS)
            for f in range(nfiles - 1):  # never a queue's last file
                last_unit = mine[f * CQ_UNITS + CQ_UNITS - 1]
                if last_unit.physical_offset >= floor:
                    break
                expect_gone.append(f"consumequeue/T/{q}/{segment_name(f * CQ_UNITS * 20)}")
        assert expect_gone, "the test should delete at least one ConsumeQueue file"
        assert sorted(report.consumequeue_files) == sorted(expect_gone)
        assert all(not (store.layout.root / p).exists() for p in expect_gone)
        assert_retained(store, acked)


# -- restarts -------------------------------------------------------------------------------------


def test_a_store_reopened_after_clean_up_recovers_its_min_offsets(small_config):
    cfg = config(small_config, delete_file_batch_max=3)
    with MessageStore(cfg).open() as store:
        acked = fill(store, 500)
        store.cleanup.run_once(force=True)
        floor = store.min_physical_offset
        mins = [store.get_min_offset_in_queue("T", q) for q in range(2)]
    with MessageStore(cfg).open() as store:
        assert store.min_physical_offset == floor > 0
        assert [store.get_min_offset_in_queue("T", q) for q in range(2)] == mins
        assert_retained(store, acked)
        more = fill(store, 10, start=500)
        assert_retained(store, acked + more)


CHILD = """
import sys
from stratamq.config import StoreConfig
from stratamq.store.message_store import MessageStore
cfg = StoreConfig(store_path_root_dir=sys.argv[1], clean_resource_interval=3_600_000,
                  delete_commit_log_files_interval=600_000)  # a long pause after each file
store = MessageStore(cfg).open()
print("open", flush=True)
store.cleanup.run_once(force=True)
print("finished", flush=True)
"""


def test_sigkill_in_the_middle_of_a_pass_leaves_a_store_that_reopens(small_config):
    cfg = config(small_config)
    with MessageStore(cfg).open() as store:
        acked = fill(store, 500)
        files = segments(store)
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(cfg.root)], stdout=subprocess.PIPE, text=True,
        cwd=PROJECT, env={**os.environ, "PYTHONPATH": str(PROJECT)},
    )
    try:
        assert proc.stdout.readline().strip() == "open"
        deadline = time.monotonic() + 120  # a hang guard, not a measurement
        while files[0].exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not files[0].exists(), "the child never deleted a file"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert files[1].exists()  # killed in the pause after the first file

    with MessageStore(cfg).open() as store:
        assert store.recovery.abnormal
        assert store.min_physical_offset == int(files[1].name)
        assert_retained(store, acked)
        store.cleanup.run_once()  # finishes the ConsumeQueues the killed pass never reached
        assert_retained(store, acked)
        more = fill(store, 10, start=500)
    with MessageStore(cfg).open() as store:
        assert_retained(store, acked + more)


# -- a real, small, full file system ------------------------------------------------------------


def test_puts_are_refused_past_the_warning_ratio_on_a_full_disk_until_clean_up(
        small_config, tmpfs):
    cfg = config(small_config, store_path_root_dir=str(tmpfs / "store"),
                 disk_full_policy=DELETE_OLDEST)
    acked: list[Acked] = []
    with MessageStore(cfg).open() as store:
        store.cleanup.put_check_interval_ms = 0  # look at the disk on every put
        refused = put_until_refused(store, acked)
        assert refused is not None, "the 8 MiB file system never filled"
        assert refused.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
        assert "disk full" in refused.error and not refused.messages
        assert statvfs_used_ratio(tmpfs) > 0.90  # really past the mark
        end = store.max_physical_offset
        assert not store.put_message(Message("T", b"still full", 0)).ok
        assert store.max_physical_offset == end  # a refused put writes nothing

        assert store.wait_dispatched()
        store.flush()
        report = store.cleanup.run_once()  # a normal pass: past 85 %, so it cleans forcibly
        assert "forcibly" in report.triggers
        assert len(report.commitlog_files) == cfg.delete_file_batch_max
        assert not report.disk_full and report.disk_used_after < 0.90
        assert statvfs_used_ratio(tmpfs) < 0.90
        r = store.put_message(Message("T", b"after clean-up", 0))
        assert r.ok, r
        acked.append(Acked(-1, 0, r.queue_offset, r.physical_offset, b"after clean-up"))
        assert store.wait_dispatched()
        assert_retained(store, acked)
    with MessageStore(cfg).open() as store:
        assert_retained(store, acked)


def test_enospc_during_a_put_reports_it_and_loses_nothing_acknowledged(small_config, tmpfs):
    cfg = config(small_config, store_path_root_dir=str(tmpfs / "store"))
    ballast = tmpfs / "ballast"
    acked: list[Acked] = []
    with MessageStore(cfg).open() as store:
        fixed_usage(store, 0.0)  # the watermark has not looked yet: the disk itself says no
        acked += fill(store, 100, size=2000)
        with ballast.open("wb") as f:  # take every block that is left
            chunk = bytes(64 * 1024)
            try:
                while True:
                    f.write(chunk)
                    f.flush()
            except OSError as exc:
                assert exc.errno == 28  # ENOSPC
        failed = put_until_refused(store, acked, start=100)
        assert failed is not None
        assert failed.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
        assert "No space left on device" in failed.error or "dispatch failed" in failed.error
        assert not failed.messages
    ballast.unlink()
    with MessageStore(cfg).open() as store:
        assert_retained(store, acked)
        assert store.put_message(Message("T", b"space again", 0)).ok


# -- the command line -----------------------------------------------------------------------------


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "stratamq.cli", *args], capture_output=True, text=True,
        timeout=300, cwd=PROJECT, env={**os.environ, "PYTHONPATH": str(PROJECT)},
    )


def test_store_clean_prints_what_it_removed(small_config):
    cfg = config(small_config)
    with MessageStore(cfg).open() as store:
        acked = fill(store, 600, size=500)
        files = segments(store)
    now = int(time.time() * 1000)
    set_age(files[:2], now, 80)
    set_age(files[2:], now, 1)

    proc = cli("store", "clean", "--store", str(cfg.root))
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["commitlog_files"] == [f"commitlog/{p.name}" for p in files[:2]]
    assert out["min_offset"] == int(files[2].name)
    assert out["bytes_freed"] >= 2 * SEGMENT
    assert out["deleted"]["commitlog"] == 2
    assert set(out) >= {"consumequeue_files", "index_files", "triggers", "disk_used_percent"}

    proc = cli("store", "clean", "--store", str(cfg.root), "--force")
    assert proc.returncode == 0, proc.stderr
    forced = json.loads(proc.stdout)
    assert forced["commitlog_files"] == [f"commitlog/{p.name}" for p in files[2:-1]][:10]
    assert "force" in forced["triggers"]
    assert forced["consumequeue_files"]  # enough went for whole ConsumeQueue files to follow
    assert all(not (cfg.root / p).exists() for p in forced["consumequeue_files"])
    with MessageStore(cfg).open() as store:
        assert store.min_physical_offset == forced["min_offset"]
        assert_retained(store, acked)


def test_store_clean_refuses_a_store_open_elsewhere(small_config):
    with MessageStore(config(small_config)).open() as store:
        fill(store, 100)
        proc = cli("store", "clean", "--store", str(small_config.root), "--force")
        assert proc.returncode != 0
        assert "open in another process" in proc.stderr
        assert proc.stdout == ""
        assert len(segments(store)) >= 2 and store.min_physical_offset == 0


def test_clean_up_moves_the_min_offsets_of_a_rocksdb_consume_queue_store(small_config):
    cfg = config(small_config, store_type="defaultRocksDB", delete_file_batch_max=3)
    with MessageStore(cfg).open() as store:
        acked = fill(store, 400)
        report = store.cleanup.run_once(force=True)
        assert len(report.commitlog_files) == 3
        assert report.consumequeue_deleted > 0  # RocksDB counts the units it removed
        assert report.consumequeue_files == []  # it has no per-queue files to name
        assert_retained(store, acked)
    with MessageStore(cfg).open() as store:
        assert_retained(store, acked)
