"""A tiered compaction topic on a running broker (a real subprocess, a POSIX tier): versions
and tombstones sent by the official producer, a round through ``stratamq compaction run
--endpoint``, the local compacted files released by local retention (``fileReservedTime=0``)
so the tier serves them; then PullMessage from offset 0 and ``stratamq store dump`` (broker
stopped) give exactly the latest record of each key, with its original offsets, ids and
bytes."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pulling import pull_queue
from rocketmq.grpc_protocol import definition_pb2 as pb
from test_broker_harness import FAST_CONF, BrokerProcess, Producer, config, message

from stratamq.compaction.tier_format import MANIFEST_NAME
from stratamq.tiered.naming import broker_config_path

pytestmark = pytest.mark.slow
PROJECT = Path(__file__).resolve().parents[1]
TOPIC = "Profiles"
QUEUES = 2


def pull(endpoint: str, queue_id: int, *, records: bool) -> list[pb.Message]:
    """PullMessage from offset 0 to the end (``records``: bodies are whole CommitLog records)."""
    return pull_queue(endpoint, TOPIC, queue_id, group="TableReader", batch_size=32,
                      records=records)


def local_files(store: Path, queue_id: int) -> list[str]:
    d = store / "compaction" / "compactionLog" / TOPIC / str(queue_id)
    return sorted(p.name for p in d.iterdir() if p.name.isdigit()) if d.is_dir() else []


def check_tier_status(done: subprocess.CompletedProcess) -> None:
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    mine = [r for r in rows if r["topic"] == TOPIC]
    assert [r["queue_id"] for r in mine] == list(range(QUEUES))
    for r in mine:
        assert r["tier_committed_offset"] == r["local_max_offset"] > 0
        assert r["tier_min_offset"] is not None and r["tier_bytes"] > 0
        assert (r["lag_messages"], r["lag_bytes"]) == (0, 0)


def test_a_tiered_compaction_topic_reads_the_latest_values_after_local_files_go(tmp_path):
    tier = tmp_path / "tier"
    settings = {"maxMessageSize": 1024, "compactionMappedFileSize": 40 * 1024,
                "compactionCqMappedFileSize": 32 * 64, "fileReservedTime": 0,
                "tieredBackendServiceProvider": "posix", "tieredStoreFilePath": str(tier)}
    conf = FAST_CONF + "".join(f"{k}={v}\n" for k, v in settings.items())
    store = tmp_path / "store"
    # First run: the scheduler's default 15 minutes, so every version stays until the round.
    broker = BrokerProcess(store, conf).start()
    try:
        made = broker.cli("topic", "create", "--topic", TOPIC, "--queues", str(QUEUES),
                          "--attribute", "cleanup.policy=COMPACTION")
        assert made.returncode == 0, made.stderr
        producer = Producer(config(broker.endpoint), (TOPIC,))
        producer.startup()
        latest: dict[str, str] = {}  # key -> message id of its latest version
        try:
            for i in range(600):
                key = f"user-{i % 40}"
                if i % 11 == 0:  # a delete, kept as a tombstone for delete.retention.ms (24 h)
                    sent = producer.send(message(TOPIC, b"-", keys=(key,),
                                                 props={"TOMBSTONE": "true"}))
                else:
                    sent = producer.send(message(TOPIC, b"profile %d " % i + bytes(180),
                                                 keys=(key,)))
                latest[key] = sent.message_id
        finally:
            producer.shutdown()

        # Every version, before the round: the expected table is each key's last record.
        raw = {q: pull(broker.endpoint, q, records=True) for q in range(QUEUES)}
        full = {q: pull(broker.endpoint, q, records=False) for q in range(QUEUES)}
        assert sum(len(v) for v in full.values()) == 600
        expected: dict[int, list[tuple[int, bytes]]] = {}
        ids: dict[int, list[str]] = {}
        for q in range(QUEUES):
            last: dict[str, int] = {}
            for m in full[q]:
                last[m.system_properties.keys[0]] = m.system_properties.queue_offset
            keep = sorted(last.values())
            by_offset = {r.system_properties.queue_offset: r.body for r in raw[q]}
            expected[q] = [(o, by_offset[o]) for o in keep]
            ids[q] = [m.system_properties.message_id for m in full[q]
                      if m.system_properties.queue_offset in set(keep)]
        assert sorted(i for v in ids.values() for i in v) == sorted(latest.values())

        done = broker.cli("compaction", "run")
        assert done.returncode == 0, done.stderr
        rows = [json.loads(line) for line in done.stdout.splitlines()]
        assert sum(r["records_read"] for r in rows) == 600
        assert sum(r["kept"] for r in rows) == 40
        manifest = tier.joinpath(*broker_config_path("DefaultCluster", "broker-a",
                                                     MANIFEST_NAME).split("/"))
        assert manifest.is_file()  # the round uploaded the compacted files
        assert all(len(local_files(store, q)) > 1 for q in range(QUEUES))
        # tier status: the topic is held by its compacted files, with no upload lag (the tier
        # uploader skips its raw stream, which is never uploaded).
        check_tier_status(broker.cli("tier", "status"))
        assert broker.terminate() == 0
        # Restarted with a scheduler pass every 500 ms: local retention lets the files go.
        broker.conf.write_text(conf + "compactionScheduleInternal=500\n")
        broker.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the scheduler's pass releases the local copies
            if all(len(local_files(store, q)) == 1 for q in range(QUEUES)):
                break
            time.sleep(0.2)
        assert all(len(local_files(store, q)) == 1 for q in range(QUEUES)), \
            (local_files(store, 0), local_files(store, 1), broker.log.read_text()[-3000:])
        tiered = json.loads(manifest.read_text())
        assert sorted(e["queueId"] for e in tiered["queues"] if e["topic"] == TOPIC) == [0, 1]

        for q in range(QUEUES):
            got = pull(broker.endpoint, q, records=True)
            assert [(r.system_properties.queue_offset, r.body) for r in got] == expected[q]
            msgs = pull(broker.endpoint, q, records=False)
            assert [m.system_properties.message_id for m in msgs] == ids[q]
    finally:
        assert broker.terminate() == 0

    check_tier_status(subprocess.run(
        [sys.executable, "-m", "stratamq.cli", "tier", "status", "--store", str(store),
         "--config", str(broker.conf)], cwd=PROJECT, capture_output=True, text=True,
        timeout=120))
    # Offline, through the tier: the same table.
    dumped = subprocess.run([sys.executable, "-m", "stratamq.cli", "store", "dump", "--store",
                             str(store), "--config", str(broker.conf), "--topic", TOPIC],
                            cwd=PROJECT, capture_output=True, text=True, timeout=120)
    assert dumped.returncode == 0, dumped.stderr
    rows = [json.loads(line) for line in dumped.stdout.splitlines()]
    for q in range(QUEUES):
        mine = [r for r in rows if r["queue_id"] == q]
        assert [r["queue_offset"] for r in mine] == [o for o, _ in expected[q]]
        assert [r["properties"]["UNIQ_KEY"] for r in mine] == ids[q]
        by_offset = {m.system_properties.queue_offset: m for m in full[q]}
        records = dict(expected[q])
        for r in mine:
            m = by_offset[r["queue_offset"]]
            assert r["properties"]["KEYS"] == m.system_properties.keys[0]
            assert base64.b64decode(r["body_b64"]) == m.body
            # The record's own CommitLog offset (bytes 28..36 of its header) is unchanged.
            record = records[r["queue_offset"]]
            assert r["commitlog_offset"] == int.from_bytes(record[28:36], "big")
            assert r["size"] == len(record)
