"""Tiered storage on a running broker (a real subprocess) with its tier on a real S3-compatible
server on loopback: history whose local files were deleted is served to the official client,
to PullMessage, to ``store dump`` and to key lookups exactly as before; an S3 outage in the
middle of uploads loses and doubles nothing; a broker SIGKILLed while uploading resumes where
the committed position says."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from broker_proc import start_broker
from pulling import pull_queue
from rocketmq import FilterExpression, Producer, SimpleConsumer
from s3_server import S3Server
from test_broker_harness import config, message, receive_until

from stratamq.config import StoreConfig
from stratamq.store.message_store import MessageStore
from stratamq.tiered.drivers.object_store import list_parts
from stratamq.tiered.naming import cluster_dir

PROJECT = Path(__file__).resolve().parents[1]
TOPIC = "Orders"


@pytest.fixture(scope="module")
def s3():
    server = S3Server().start()
    yield server
    server.stop()


def tier_settings(s3: S3Server, bucket: str, **extra: str) -> dict[str, str]:
    return {"mappedFileSizeCommitLog": str(64 * 1024), "mappedFileSizeConsumeQueue": "2000",
            "messageStorePlugIn": "org.apache.rocketmq.tieredstore.TieredMessageStore",
            "tieredBackendServiceProvider": "s3",
            "tieredStoreFilePath": f"s3://{bucket}/tier",
            "tieredStoreS3Endpoint": s3.endpoint,
            "tieredStoreGroupCommitTimeout": "3600000",
            "tieredStoreIndexFileMaxHashSlotNum": "211",
            "tieredStoreIndexFileMaxIndexNum": "500",
            **extra}


def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "stratamq.cli", *args], cwd=PROJECT,
                          capture_output=True, text=True, timeout=300)
    if check:
        assert done.returncode == 0, done.stderr
    return done


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def produce(endpoint: str, count: int, start: int = 0) -> list[str]:
    producer = Producer(config(endpoint), (TOPIC,))
    producer.startup()
    try:
        return [producer.send(message(TOPIC, b"order %06d " % i + bytes(range(200)),
                                      tag=f"t{i % 3}", keys=(f"order-{i}",))).message_id
                for i in range(start, start + count)]
    finally:
        producer.shutdown()


def pull_records(endpoint: str, queue_id: int, start: int = 0) -> list[tuple[int, bytes]]:
    """PullMessage from ``start`` to the end, raw CommitLog records (the Spark source's way)."""
    return [(m.system_properties.queue_offset, m.body)
            for m in pull_queue(endpoint, TOPIC, queue_id, start=start, group="TierReader",
                                records=True)]


def dump(store: Path, conf: Path) -> list[dict]:
    return json_lines(cli("store", "dump", "--store", str(store), "--config", str(conf),
                          "--topic", TOPIC).stdout)


def local_records(store: Path, conf_settings: dict[str, str]) -> dict[int, list[bytes]]:
    """Every record of each queue, read from the local files (read-only, no tier)."""
    cfg = StoreConfig(store_path_root_dir=str(store),
                      mapped_file_size_commit_log=int(conf_settings["mappedFileSizeCommitLog"]))
    s = MessageStore(cfg, read_only=True).open()
    try:
        out: dict[int, list[bytes]] = {}
        for q in s.topics().get(TOPIC, []):
            offset, recs = 0, []
            while True:
                with s.get_messages("g", TOPIC, q, offset, 64) as got:
                    if not got.records:
                        break
                    recs += [bytes(r.buffer) for r in got.records]
                    offset = got.next_begin_offset
            out[q] = recs
        return out
    finally:
        s.close()


def tier_commitlog(fs, bucket: str, queue_id: int) -> bytes:
    """A queue's tier CommitLog as the S3 server holds it: its files' parts, in order."""
    base = f"{bucket}/tier/{cluster_dir('DefaultCluster')}/broker-a/{TOPIC}/{queue_id}/COMMIT_LOG"
    data = b""
    for name in sorted(fs.ls(base, refresh=True), key=lambda n: int(n.rsplit("/", 1)[1][8:])):
        for position, _size in list_parts(fs, name):
            data += fs.cat_file(f"{name}/{position:020d}")
    return data


@pytest.mark.parametrize("policy", ["NOT_IN_DISK", "FORCE"])
def test_history_served_by_the_broker_after_local_files_go(policy, tmp_path, s3):
    fs = s3.filesystem()
    bucket = s3.new_bucket(fs)
    settings = tier_settings(s3, bucket)
    broker = start_broker(tmp_path, settings, topics=[(TOPIC, 2, "NORMAL")])
    try:
        ids = produce(broker.endpoint, 600)
        before = {q: pull_records(broker.endpoint, q) for q in (0, 1)}
        assert sum(len(r) for r in before.values()) == 600
        flushed = json_lines(cli("tier", "flush", "--endpoint", broker.endpoint).stdout)
        assert {(r["queue_id"], r["tier_committed_offset"]) for r in flushed} == {
            (q, len(before[q])) for q in (0, 1)}
        status = json_lines(cli("tier", "status", "--endpoint", broker.endpoint).stdout)
        assert all(r["lag_messages"] == 0 and r["tier_bytes"] > 0 for r in status)
    finally:
        assert broker.stop() == 0
    dumped = dump(broker.store, broker.conf)
    cleaned = json.loads(cli("store", "clean", "--store", str(broker.store), "--config",
                             str(broker.conf), "--tiered-only").stdout)
    assert cleaned["deleted"]["commitlog"] >= 2 and cleaned["min_offset"] > 0
    assert not (broker.store / "commitlog" / f"{0:020d}").exists()
    assert dump(broker.store, broker.conf) == dumped  # store dump reads the tier
    hits = json_lines(cli("store", "query", "--store", str(broker.store), "--config",
                          str(broker.conf), "--topic", TOPIC, "--key", "order-3").stdout)
    assert [h["body_b64"] for h in hits] == [d["body_b64"] for d in dumped
                                             if d["keys"] == ["order-3"]]
    (tmp_path / "broker.conf").unlink()
    settings["tieredStorageLevel"] = policy
    broker = start_broker(tmp_path, settings, store=broker.store)
    try:
        # PullMessage: the same records, byte for byte, at the same offsets.
        assert {q: pull_records(broker.endpoint, q) for q in (0, 1)} == before
        # The official client, a new group: starts at the queues' min offset (the tier's, 0)
        # and receives every message with its id and body.
        consumer = SimpleConsumer(config(broker.endpoint), "TierNewGroup",
                                  {TOPIC: FilterExpression("*")}, await_duration=2)
        consumer.startup()
        try:
            got = receive_until(consumer, 600, deadline_s=120)
        finally:
            consumer.shutdown()
        assert sorted(m.message_id for m in got) == sorted(ids)
        assert {m.body for m in got} == {b"order %06d " % i + bytes(range(200))
                                         for i in range(600)}
    finally:
        assert broker.stop() == 0


def test_s3_outage_mid_upload_loses_and_doubles_nothing(tmp_path):
    server = S3Server().start()
    fs = server.filesystem()
    bucket = server.new_bucket(fs)
    settings = tier_settings(server, bucket, tieredStoreGroupCommitCount="40")
    broker = start_broker(tmp_path, settings, topics=[(TOPIC, 2, "NORMAL")])
    try:
        produce(broker.endpoint, 200)
        cli("tier", "flush", "--endpoint", broker.endpoint)
        server.stop()  # the S3 server goes away; uploads of the next batches fail
        produce(broker.endpoint, 300, start=200)
        failed = cli("tier", "flush", "--endpoint", broker.endpoint, "--timeout", "5",
                     check=False)
        assert failed.returncode == 1 and "not everything was committed" in failed.stderr
        server.start()
        produce(broker.endpoint, 100, start=500)
        cli("tier", "flush", "--endpoint", broker.endpoint)
        local = local_records(broker.store, settings)
        assert sum(len(v) for v in local.values()) == 600
        for q, records in local.items():
            assert tier_commitlog(fs, bucket, q) == b"".join(records)  # once, in order
    finally:
        broker.stop()
        server.stop()


def test_broker_killed_mid_upload_resumes_from_the_committed_position(tmp_path, s3):
    fs = s3.filesystem()
    bucket = s3.new_bucket(fs)
    settings = tier_settings(s3, bucket, tieredStoreGroupCommitCount="25")
    broker = start_broker(tmp_path, settings, topics=[(TOPIC, 1, "NORMAL")])
    base = f"{bucket}/tier/{cluster_dir('DefaultCluster')}/broker-a/{TOPIC}/0/COMMIT_LOG"
    done = threading.Event()

    def keep_producing() -> None:
        with contextlib.suppress(Exception):  # the broker is killed under it
            produce(broker.endpoint, 2000)
        done.set()

    writer = threading.Thread(target=keep_producing, daemon=True)
    writer.start()
    deadline = time.monotonic() + 120
    while True:  # kill once uploads are under way
        files = fs.ls(base, refresh=True) if fs.exists(base) else []
        if files and len(list_parts(fs, files[0])) >= 3:
            break
        assert time.monotonic() < deadline, "no upload happened"
        time.sleep(0.05)
    broker.kill()
    writer.join(60)
    committed = {f: list_parts(fs, f) for f in fs.ls(base, refresh=True)}
    before = {f: [fs.cat_file(f"{f}/{p:020d}") for p, _ in parts]
              for f, parts in committed.items()}
    (tmp_path / "broker.conf").unlink()
    broker = start_broker(tmp_path, settings, store=broker.store)
    try:
        cli("tier", "flush", "--endpoint", broker.endpoint)
        # What was committed before the kill is there unchanged; the rest follows it.
        for f, parts in committed.items():
            assert [fs.cat_file(f"{f}/{p:020d}") for p, _ in parts] == before[f]
    finally:
        assert broker.stop() == 0
    local = local_records(broker.store, settings)[0]
    assert tier_commitlog(fs, bucket, 0) == b"".join(local)  # every record exactly once
