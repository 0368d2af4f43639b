"""A disk that fills up: what forced clean-up may delete (``diskFullPolicy``), how long puts
stay refused, and a store reopened on a full file system (issue 26, items 1 and 2).

Every test fills a real tmpfs (8 MiB, mounted by the ``tmpfs`` fixture). The consumer groups'
progress comes through the store's seam for it (``MessageStore.set_consumed_offsets``), as the
broker registers it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import grpc
import pytest
from broker_proc import create_topics, free_port, start_broker
from conftest import mounted_tmpfs
from pulling import pull_queue
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc
from test_broker_metrics import _scrape
from waiting import wait_until

from stratamq.client.admin import AdminClient
from stratamq.config import DiskFullPolicy, InvalidSetting, StoreConfig
from stratamq.message import Message
from stratamq.store.cleanup import statvfs_used_ratio
from stratamq.store.message_store import MessageStore
from stratamq.store.results import GetMessageStatus, PutMessageStatus

PROJECT = Path(__file__).resolve().parents[1]


class Put(NamedTuple):
    topic: str
    queue_id: int
    queue_offset: int
    physical_offset: int
    body: bytes


def config(small_config: StoreConfig, root: Path, **kw) -> StoreConfig:
    """64 KiB segments on the tmpfs; clean-up passes run by the test only."""
    base = dict(store_path_root_dir=str(root), clean_resource_interval=3_600_000,
                delete_commit_log_files_interval=0, delete_consume_queue_files_interval=0)
    return dataclasses.replace(small_config, **{**base, **kw})


def put(store: MessageStore, topic: str, i: int, size: int = 1000) -> Put | None:
    body = (b"%s-%06d;" % (topic.encode(), i)) * (size // 10)
    r = store.put_message(Message(topic, body, i % 2))
    if not r.ok:
        assert r.status is PutMessageStatus.SERVICE_NOT_AVAILABLE, r
        assert "disk full" in r.error, r
        return None
    return Put(topic, i % 2, r.queue_offset, r.physical_offset, body)


def fill_until(store: MessageStore, topic: str, tmpfs: Path, used: float) -> list[Put]:
    """Put messages of ``topic`` until the file system is ``used`` full or a put is refused."""
    puts: list[Put] = []
    while statvfs_used_ratio(tmpfs) < used:
        p = put(store, topic, len(puts))
        if p is None:
            break
        puts.append(p)
    return puts


def readable(store: MessageStore, p: Put) -> bool:
    with store.get_messages("check", p.topic, p.queue_id, p.queue_offset, 1) as got:
        return (got.status is GetMessageStatus.FOUND
                and next(iter(got.messages())).body == p.body)


def settle(store: MessageStore) -> None:
    assert store.wait_dispatched()
    store.flush()  # clean-up never deletes past what is flushed and dispatched


def test_refuse_puts_keeps_unconsumed_messages_and_refuses_until_space_is_freed(
        small_config, tmpfs):
    consumed: dict = {}
    with MessageStore(config(small_config, tmpfs / "store")).open() as store:
        store.set_consumed_offsets(lambda: consumed)
        store.cleanup.put_check_interval_ms = 0  # every put looks at the disk
        early = fill_until(store, "T", tmpfs, 0.45)
        nobody = [p for i in range(20) if (p := put(store, "U", i)) is not None]
        assert len(nobody) == 20
        late = fill_until(store, "T", tmpfs, 1.0)  # until a put is refused: disk full
        assert statvfs_used_ratio(tmpfs) > 0.90
        settle(store)

        # Nothing consumed yet: forced clean-up deletes nothing, and puts stay refused.
        for _ in range(3):
            report = store.cleanup.run_once()
            assert "forcibly" in report.triggers
            assert report.commitlog_files == []
            assert report.held_for_consumers["file"] == "commitlog/" + "0" * 20
            assert set(report.held_for_consumers["groups"]) == {"(no consumer group) T"}
            assert report.disk_full
            for i in range(5):
                assert put(store, "T", 10_000 + i) is None
        assert store.min_physical_offset == 0
        assert all(readable(store, p) for p in early + nobody + late)

        # Group g consumes all of T; nobody consumes U: files may go up to U's first message
        # (forced clean-up stops once the disk is back below diskSpaceCleanForciblyRatio).
        consumed = {("T", q): {"g": store.get_max_offset_in_queue("T", q)} for q in (0, 1)}
        for _ in range(20):
            if not store.cleanup.run_once().commitlog_files:
                break
        floor = store.min_physical_offset
        assert 0 < floor <= nobody[0].physical_offset
        assert all(readable(store, p) for p in nobody)  # never consumed: all kept
        assert all(readable(store, p) for p in early + late if p.physical_offset >= floor)
        assert statvfs_used_ratio(tmpfs) < 0.90
        assert not store.cleanup.disk_full
        assert put(store, "T", 20_000) is not None  # accepted again
        assert store.cleanup.unconsumed_deleted_files == 0


def test_delete_oldest_logs_and_counts_every_unconsumed_message_it_deletes(
        small_config, tmpfs, caplog):
    cfg = config(small_config, tmpfs / "store", disk_full_policy=DiskFullPolicy.DELETE_OLDEST,
                 delete_file_batch_max=3)
    with MessageStore(cfg).open() as store:
        # g consumed the first 5 messages of each queue of T; nobody consumes U.
        store.set_consumed_offsets(lambda: {("T", 0): {"g": 5}, ("T", 1): {"g": 5}})
        puts = []
        for i in range(400):
            p = put(store, "T" if i % 10 else "U", i)
            assert p is not None
            puts.append(p)
        settle(store)
        store.cleanup.usage_probe = lambda path: 0.88  # past diskSpaceCleanForciblyRatio
        with caplog.at_level(logging.ERROR, logger="stratamq.store.cleanup"):
            report = store.cleanup.run_once()
        assert len(report.commitlog_files) == 3
        floor = store.min_physical_offset
        lost = [p for p in puts if p.physical_offset < floor
                and not (p.topic == "T" and p.queue_offset < 5)]
        by_group: dict[str, int] = {}
        for p in lost:
            key = "g T" if p.topic == "T" else "(no consumer group) U"
            by_group[key] = by_group.get(key, 0) + 1
        assert report.unconsumed_deleted == by_group
        assert store.cleanup.unconsumed_deleted_files == 3
        assert store.cleanup.unconsumed_deleted_messages == len(lost)
        errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert len(errors) == 3  # one per file
        assert all("diskFullPolicy=DELETE_OLDEST" in e and "group g topic T" in e
                   for e in errors)
        assert sum(int(e.split(" takes ")[1].split()[0]) for e in errors) == len(lost)

        # cleanFileForciblyEnable=false still turns forced deletion off.
        store.config.clean_file_forcibly_enable = False
        assert store.cleanup.run_once().commitlog_files == []


def test_ratios_are_taken_as_configured_and_out_of_range_ones_refused(tmp_path):
    cfg = StoreConfig(store_path_root_dir=str(tmp_path / "s"), disk_space_warning_level_ratio=99,
                      disk_space_clean_forcibly_ratio=97, disk_max_used_space_ratio=96)
    with MessageStore(cfg).open() as store:
        assert store.cleanup.warning_ratio == pytest.approx(0.99)  # not clamped to 90 %
        assert store.cleanup.forcibly_ratio == pytest.approx(0.97)
        assert store.cleanup.max_used_ratio == pytest.approx(0.96)
    for key in ("disk_space_warning_level_ratio", "disk_space_clean_forcibly_ratio",
                "disk_max_used_space_ratio"):
        for bad in (0, 100, 150):
            with pytest.raises(InvalidSetting, match=r"out of range: must be 1\.\.99"):
                StoreConfig(**{key: bad})


CHILD = """
import json, sys
from stratamq.config import StoreConfig
from stratamq.message import Message
from stratamq.store.message_store import MessageStore
root, phase = sys.argv[1], sys.argv[2]
cfg = StoreConfig(store_path_root_dir=root, mapped_file_size_commit_log=1024 * 1024)
if phase == "fill":
    store = MessageStore(cfg).open()
    store.cleanup.usage_probe = lambda path: 0.0
    for i in range(1200):  # ten keys: the index reserves the slot pages they land in only
        keys = {"KEYS": f"key{i}"} if i < 10 else {}
        assert store.put_message(Message(f"T{i % 10}", b"x" * 2000, i % 4, properties=keys)).ok
    assert store.wait_dispatched()
    store.close()
    print(json.dumps({"filled": 1200}))
else:
    try:
        store = MessageStore(cfg).open()
    except OSError as exc:
        print(json.dumps({"error": type(exc).__name__, "text": str(exc)}))
        sys.exit(3)
    read = 0
    for topic, queue_ids in store.topics().items():
        for q in queue_ids:
            with store.get_messages("g", topic, q, 0, 1000) as got:
                read += len(got.records)
    # Index lookups read slots: one a key landed in, and one no key reached (a hole).
    found = [len(store.query_messages("T0", k)) for k in ("key0", "a-key-nobody-used")]
    r = store.put_message(Message("T0", b"y", 0))
    store.close()
    print(json.dumps({"read": read, "found": found, "put": r.status.value}))
"""


def child(root: Path, phase: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CHILD, str(root), phase], capture_output=True,
                          text=True, timeout=120, cwd=PROJECT)


def take_all_space(ballast: Path) -> None:
    with ballast.open("wb") as f:
        try:
            while True:
                f.write(bytes(64 * 1024))
                f.flush()
        except OSError as exc:
            assert exc.errno == 28  # ENOSPC


def test_a_store_reopened_on_a_full_tmpfs_serves_reads_or_says_why_never_dies(tmpfs):
    root = tmpfs / "store"
    filled = child(root, "fill")
    assert filled.returncode == 0, filled.stderr
    ballast = tmpfs / "ballast"
    take_all_space(ballast)
    # Nearly full: a little space left, less than the ConsumeQueues' unwritten pages.
    with ballast.open("r+b") as f:
        f.truncate(ballast.stat().st_size - 256 * 1024)
    opened = child(root, "open")
    assert opened.returncode == 0, (opened.returncode, opened.stderr[-2000:])
    got = json.loads(opened.stdout.strip().splitlines()[-1])
    # Reads and lookups served, puts refused.
    assert got == {"read": 1200, "found": [1, 0], "put": "SERVICE_NOT_AVAILABLE"}

    # Full to the last block: a clear error, or reads again; never a signal.
    ballast.unlink()
    take_all_space(ballast)
    opened = child(root, "open")
    assert opened.returncode in (0, 3), (opened.returncode, opened.stderr[-2000:])
    got = json.loads(opened.stdout.strip().splitlines()[-1])
    if opened.returncode == 3:
        assert got["error"] == "StoreDiskFull" and "file system is full" in got["text"]
    else:
        assert got["read"] == 1200


# -- a broker process: the groups' progress is what clean-up keeps files for ---------------------


@pytest.fixture
def tmpfs64(tmp_path):
    """A 64 MiB tmpfs: room for a broker's own state (pop state, metadata) besides the store."""
    with mounted_tmpfs(tmp_path / "fs64", "64m") as mnt:
        yield mnt


def update_offset(endpoint: str, group: str, topic: str, queue_id: int, offset: int) -> None:
    with grpc.insecure_channel(endpoint) as channel:
        reply = service_pb2_grpc.MessagingServiceStub(channel).UpdateOffset(
            svc.UpdateOffsetRequest(
                group=pb.Resource(name=group), offset=offset,
                message_queue=pb.MessageQueue(topic=pb.Resource(name=topic), id=queue_id)),
            timeout=30)
    assert reply.status.code == pb.OK, reply.status


def test_a_broker_keeps_what_its_groups_have_not_consumed_until_they_have(tmpfs64, tmp_path):
    store_dir = tmpfs64 / "store"
    segment = 1024 * 1024
    cfg = StoreConfig(store_path_root_dir=str(store_dir), mapped_file_size_commit_log=segment,
                      mapped_file_size_consume_queue=10_000 * 20)
    create_topics(store_dir, [("T", 2, "NORMAL"), ("U", 1, "NORMAL")])
    with MessageStore(cfg).open() as store:  # history written before the broker starts
        for i in range(5000):  # ~20 MiB of T
            assert store.put_message(Message("T", b"t" * 4000, i % 2)).ok
        for i in range(20):  # U: a topic no group ever consumes
            assert store.put_message(Message("U", b"u%05d" % i * 600, 0)).ok
        for i in range(5000, 6000):
            assert store.put_message(Message("T", b"t" * 4000, i % 2)).ok
        assert store.wait_dispatched()
        t_max = [store.get_max_offset_in_queue("T", q) for q in (0, 1)]
    port = free_port()
    broker = start_broker(tmp_path, {"mappedFileSizeCommitLog": str(segment),
                                     "metricsPrometheusPort": str(port),
                                     "cleanResourceInterval": "100",
                                     "deleteCommitLogFilesInterval": "0"}, store=store_dir)
    try:
        ballast = tmpfs64 / "ballast"
        with ballast.open("wb") as f:  # fill the disk past diskSpaceWarningLevelRatio
            while statvfs_used_ratio(tmpfs64) < 0.93:
                f.write(bytes(256 * 1024))
                f.flush()
        with AdminClient(broker.endpoint) as admin:
            wait_until(lambda: admin.call("BrokerStatus")["disk_full"], what="disk full")
            # Past diskSpaceCleanForciblyRatio, nothing consumed: nothing deleted.
            wait_until(lambda: any("holds messages not yet consumed" in line
                                   for line in list(broker.output)), what="the hold-back log")
            status = admin.call("BrokerStatus")
            assert status["disk_full_policy"] == "REFUSE_PUTS"
            assert status["commitlog"]["min_offset"] == 0 and status["disk_full"]
            node = (("cluster", "DefaultCluster"), ("node_id", "broker-a"),
                    ("node_type", "broker"))
            metrics = _scrape(port)
            assert metrics[("stratamq_disk_full", node)] == 1
            assert metrics[("stratamq_unconsumed_deleted_files_total", node)] == 0

            # A pull consumer group consumes all of T: its files go, U's are kept.
            for q in (0, 1):
                update_offset(broker.endpoint, "g", "T", q, t_max[q])
            wait_until(lambda: not admin.call("BrokerStatus")["disk_full"],
                       what="puts accepted again")
            status = admin.call("BrokerStatus")
        assert status["commitlog"]["min_offset"] > 0
        assert status["unconsumed_deleted"] == {"files": 0, "messages": 0}
        got = pull_queue(broker.endpoint, "U", 0)
        assert [m.body for m in got] == [b"u%05d" % i * 600 for i in range(20)]
        assert statvfs_used_ratio(tmpfs64) < 0.90
    finally:
        assert broker.stop() == 0
