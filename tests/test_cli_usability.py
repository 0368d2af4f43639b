"""What a new user meets with tiers, output and online lookups, as the user meets it: real broker
processes, a real S3-compatible server (moto) and the CLI run as a command.

A missing bucket stops the start naming it (or is created on request); the CLI shows the
broker's own error text and says "no broker reachable" only when nothing answered; the tier is
cleaned online; messages are found by key, id and store time on a running broker whether their
local files are gone or not, with ACL applied; a store directory remembers its tier, so the
offline commands show the whole history; tables print whole values off a terminal; clients
that stop heartbeating leave ``group progress``; a slave whose master is down shows the route
its clients are told.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import grpc
from broker_proc import start_broker
from pulling import pull_queue
from rocketmq import Producer
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc
from s3_server import S3Server
from test_broker_harness import config, message
from waiting import wait_until

from stratamq.client.admin import AdminClient

PROJECT = Path(__file__).resolve().parents[1]


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "stratamq.cli", *args], cwd=PROJECT,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def lines(done: subprocess.CompletedProcess) -> list[dict]:
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


# -- tiers a new user can set up ----------------------------------------------------------------

def test_a_missing_bucket_stops_the_start_naming_it_unless_asked_to_create_it(tmp_path):
    s3 = S3Server().start()
    try:
        bucket = f"nosuch-{uuid.uuid4().hex[:8]}"
        conf = tmp_path / "broker.conf"
        settings = ("tieredBackendServiceProvider=s3\n"
                    f"tieredStoreFilePath=s3://{bucket}/tier\n"
                    f"tieredStoreS3Endpoint={s3.endpoint}\n")
        conf.write_text(settings)
        done = cli("broker", "start", "--store", str(tmp_path / "a"), "--listen",
                   "127.0.0.1:0", "--config", str(conf))
        assert done.returncode == 1
        assert done.stderr.startswith("Error: ") and done.stderr.count("\n") == 1, done.stderr
        assert bucket in done.stderr and "tieredStoreS3CreateBucket=true" in done.stderr
        assert "Traceback" not in done.stderr and "listening" not in done.stdout
        assert not s3.filesystem().exists(bucket)

        conf.write_text(settings + "tieredStoreS3CreateBucket=true\n")
        broker = start_broker(tmp_path, {"tieredBackendServiceProvider": "s3",
                                         "tieredStoreFilePath": f"s3://{bucket}/tier",
                                         "tieredStoreS3Endpoint": s3.endpoint,
                                         "tieredStoreS3CreateBucket": "true"},
                              topics=[("Made", 1, "NORMAL")])
        try:
            assert s3.filesystem().exists(bucket)
            _send_keyed(broker.endpoint, "Made", 1, 10)
            flushed = lines(cli("tier", "flush", "--endpoint", broker.endpoint))
            assert [(r["topic"], r["tier_committed_offset"]) for r in flushed] == [("Made", 1)]
        finally:
            assert broker.stop() == 0
    finally:
        s3.stop()


def test_the_cli_shows_the_brokers_own_error_and_unreachable_only_when_nothing_answered(
        tmp_path):
    tier = tmp_path / "tier"
    broker = start_broker(tmp_path, {"tieredBackendServiceProvider": "posix",
                                     "tieredStoreFilePath": str(tier)},
                          topics=[("Errs", 1, "NORMAL")])
    try:
        producer = Producer(config(broker.endpoint), ("Errs",))
        producer.startup()
        try:
            producer.send(message("Errs", b"x"))
        finally:
            producer.shutdown()
        # The tier's directory becomes a file: the broker answers, with its own error.
        shutil.rmtree(tier, ignore_errors=True)
        tier.write_text("not a directory")
        done = cli("tier", "flush", "--endpoint", broker.endpoint, "--timeout", "5")
        assert done.returncode == 1
        assert "no broker reachable" not in done.stderr, done.stderr
        # The broker answered (the tier backs off rather than failing the call): its reply
        # carries the tier's own last error, and the CLI prints it.
        assert done.stderr.startswith("Error: not everything was committed to the tier")
        assert "tier file" in done.stderr and "Not a directory" in done.stderr
        assert str(tier) in done.stderr
    finally:
        broker.stop()
    # Nothing listens there any more.
    for args in (["tier", "status"], ["topic", "list"],
                 ["message", "get", "--msg-id", "AC11000100002A9F0000000000000000"]):
        gone = cli(*args, "--endpoint", broker.endpoint)
        assert gone.returncode == 1
        assert f"no broker reachable at {broker.endpoint}" in gone.stderr, gone.stderr


def _send_keyed(endpoint: str, topic: str, count: int, size: int) -> list[str]:
    producer = Producer(config(endpoint), (topic,))
    producer.startup()
    try:
        return [producer.send(message(topic, (b"%05d-" % i) + b"v" * size,
                                      keys=(f"key-{i}",))).message_id
                for i in range(count)]
    finally:
        producer.shutdown()


def test_online_clean_and_lookups_reach_the_tier_and_the_store_remembers_it(tmp_path):
    tier = tmp_path / "tier"
    broker = start_broker(tmp_path, {"mappedFileSizeCommitLog": str(64 * 1024),
                                     "mappedFileSizeConsumeQueue": "2000",
                                     "tieredBackendServiceProvider": "posix",
                                     "tieredStoreFilePath": str(tier)},
                          topics=[("Hist", 2, "NORMAL")])
    ep = broker.endpoint
    try:
        ids = _send_keyed(ep, "Hist", 120, 1500)
        lines(cli("tier", "flush", "--endpoint", ep, "--timeout", "60"))
        locked = cli("store", "clean", "--store", str(broker.store), "--tiered-only",
                     "--config", str(broker.conf))
        assert locked.returncode == 1 and "open in another process" in locked.stderr
        assert "stratamq tier clean --endpoint" in locked.stderr
        served = {q: [m.body for m in pull_queue(ep, "Hist", q)] for q in (0, 1)}
        cleaned = lines(cli("tier", "clean", "--endpoint", ep))[0]
        assert cleaned["deleted"]["commitlog"] >= 2, cleaned
        assert cleaned["min_offset"] > cleaned["min_offset_before"] == 0
        # A reader from offset 0 still gets every message, the deleted ones from the tier
        # (not the first local record in their place), at once, with no restart.
        assert {q: [m.body for m in pull_queue(ep, "Hist", q)] for q in (0, 1)} == served

        # key-0 is in a deleted CommitLog file: found in the tier, by key and by id.
        by_key = lines(cli("message", "query", "--endpoint", ep, "--topic", "Hist",
                           "--key", "key-0"))
        assert [m["body"][:6] for m in by_key] == ["00000-"]
        assert by_key[0]["message_id"] == ids[0] and by_key[0]["keys"] == ["key-0"]
        got = lines(cli("message", "get", "--endpoint", ep, "--msg-id", ids[0]))
        assert got[0]["body"] == by_key[0]["body"]
        by_offset_id = lines(cli("message", "get", "--endpoint", ep, "--msg-id",
                                 by_key[0]["offset_msg_id"]))
        assert by_offset_id[0]["message_id"] == ids[0]
        in_topic = lines(cli("message", "query", "--endpoint", ep, "--topic", "Hist",
                             "--msg-id", ids[5]))
        assert [m["body"][:6] for m in in_topic] == ["00005-"]
        # By store time: oldest first, at most --max.
        span = lines(cli("message", "query", "--endpoint", ep, "--topic", "Hist",
                         "--begin", "0", "--end", str(int(time.time() * 1000) + 60_000),
                         "--max", "10"))
        assert [m["body"][:5] for m in span] == [f"{i:05d}" for i in range(10)]
        none = cli("message", "get", "--endpoint", ep, "--msg-id", "0" * 32)
        assert none.returncode == 1 and "NOT_FOUND" in none.stderr
        table = cli("message", "query", "--endpoint", ep, "--topic", "Hist", "--key",
                    "key-7", "--output", "table")
        assert table.returncode == 0, table.stderr
        assert "00007-" + "v" * 1500 in table.stdout  # whole, off a terminal
    finally:
        assert broker.stop() == 0

    # Offline, without --config: the store's recorded tier is read, so nothing is left out.
    dump = lines(cli("store", "dump", "--store", str(broker.store), "--topic", "Hist"))
    assert sorted(m["keys"][0] for m in dump) == sorted(f"key-{i}" for i in range(120))
    found = lines(cli("store", "query", "--store", str(broker.store), "--topic", "Hist",
                      "--key", "key-0"))
    assert len(found) == 1
    (stat,) = lines(cli("store", "stat", "--store", str(broker.store)))
    assert stat["topics"]["Hist"]["messages"] == 120 and str(tier) in stat["tier"]
    assert any(q["local_min_offset"] > q["min_offset"] == 0
               for q in stat["topics"]["Hist"]["queues"])
    # A store with tier metadata but no record of where its tier is says what it leaves out.
    (broker.store / "config" / "tieredStoreLocation.json").unlink()
    local = cli("store", "dump", "--store", str(broker.store), "--topic", "Hist")
    assert len(lines(local)) < 120 and "left out" in local.stderr, local.stderr


def test_lookups_apply_acl(tmp_path):
    acl = tmp_path / "acl.json"
    acl.write_text(json.dumps({"accounts": [
        {"accessKey": "reader", "secretKey": "readersecret", "defaultTopicPerm": "SUB",
         "defaultGroupPerm": "SUB"},
        {"accessKey": "writer", "secretKey": "writersecret", "defaultTopicPerm": "PUB"},
    ]}))
    broker = start_broker(tmp_path, {"aclEnable": "true", "aclFile": str(acl),
                                     "aclAccessKey": "root", "aclSecretKey": "rootsecret"},
                          topics=[("Secured", 1, "NORMAL")])
    try:
        root = {"STRATAMQ_ACCESS_KEY": "root", "STRATAMQ_SECRET_KEY": "rootsecret"}
        sent = lines(cli("message", "send", "--endpoint", broker.endpoint, "--topic",
                         "Secured", "--body", "secret", "--key", "k1", env=root))[0]
        query = ("message", "query", "--endpoint", broker.endpoint, "--topic", "Secured",
                 "--key", "k1")
        view = ("message", "get", "--endpoint", broker.endpoint, "--msg-id",
                sent["message_id"])
        writer = {"STRATAMQ_ACCESS_KEY": "writer", "STRATAMQ_SECRET_KEY": "writersecret"}
        reader = {"STRATAMQ_ACCESS_KEY": "reader", "STRATAMQ_SECRET_KEY": "readersecret"}
        wait_until(lambda: bool(cli(*query, env=reader).stdout), what="the index entry")
        for args in (query, view):
            denied = cli(*args, env=writer)
            assert denied.returncode == 1 and "PERMISSION_DENIED" in denied.stderr, denied
            assert "secret\"" not in denied.stdout
            anonymous = cli(*args)
            assert anonymous.returncode == 1 and "UNAUTHENTICATED" in anonymous.stderr
            assert [m["body"] for m in lines(cli(*args, env=reader))] == ["secret"]
    finally:
        broker.stop()


# -- output ---------------------------------------------------------------------------------------

def _heartbeat(endpoint: str, group: str, client_id: str) -> None:
    with grpc.insecure_channel(endpoint) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        reply = stub.Heartbeat(svc.HeartbeatRequest(group=pb.Resource(name=group),
                                                    client_type=pb.SIMPLE_CONSUMER),
                               metadata=[("x-mq-client-id", client_id)], timeout=10)
    assert reply.status.code == pb.OK, reply.status


def test_tables_whole_off_a_terminal_and_clients_expire_without_heartbeats(tmp_path):
    long_topic = "T" + "x" * 120
    broker = start_broker(tmp_path, {"channelExpiredTimeout": "10000"},
                          topics=[(long_topic, 1, "NORMAL")])
    ep = broker.endpoint
    try:
        for args in (["topic", "list"], ["broker", "status"], ["ha", "status"],
                     ["tier", "status"], ["compaction", "status"]):
            table = cli(*args, "--endpoint", ep, "--output", "table")
            if args[0] in ("tier",):  # no tier on this broker: the broker's own refusal
                assert table.returncode == 1 and "tiered storage is off" in table.stderr
                continue
            assert table.returncode == 0, (args, table.stderr)
            assert "…" not in table.stdout, table.stdout
        listed = cli("topic", "list", "--endpoint", ep, "--output", "table").stdout
        assert long_topic in listed and "read_queues" in listed.splitlines()[0]
        status = cli("broker", "status", "--endpoint", ep, "--output", "table").stdout
        assert any(line.split()[:1] == ["disk.free"] for line in status.splitlines())
        assert "ASYNC_MASTER" in cli("ha", "status", "--endpoint", ep, "--output",
                                     "table").stdout

        assert cli("group", "create", "--group", "Watchers", "--endpoint", ep).returncode == 0
        # Each look follows a fresh heartbeat: well inside channelExpiredTimeout (10 s).
        _heartbeat(ep, "Watchers", "client-gone")
        with AdminClient(ep) as admin:
            (seen,) = admin.call("GroupProgress", group="Watchers")["clients"]
        assert seen["client_id"] == "client-gone" and seen["last_seen"] > 0
        assert 0 <= seen["last_seen_ago_ms"] < 10_000
        _heartbeat(ep, "Watchers", "client-gone")
        table = cli("group", "progress", "--group", "Watchers", "--endpoint", ep, "--output",
                    "table").stdout
        assert "clients:" in table and "last_seen_ago_ms" in table and "client-gone" in table
        # No heartbeat for channelExpiredTimeout: gone, as RocketMQ's scanNotActiveChannel does.
        wait_until(lambda: lines(cli("group", "progress", "--group", "Watchers",
                                     "--endpoint", ep))[0]["clients"] == [],
                   timeout=60, what="the silent client to expire")
    finally:
        broker.stop()


def test_a_slaves_route_shows_what_its_clients_are_told_while_the_master_is_down(tmp_path):
    from test_ha_processes import TOPIC, Pair

    pair = Pair(tmp_path).start()
    try:
        def route() -> dict:
            return lines(cli("topic", "route", "--topic", TOPIC, "--endpoint",
                             pair.slave.endpoint))[0]

        told = route()
        assert told["endpoint"] == pair.master.endpoint
        assert {q["perm"] for q in told["queues"]} == {"READ_WRITE"}
        pair.master.kill()
        wait_until(lambda: not pair.slave.ha()["masterReachable"], what="the master missed")
        told = route()
        assert told["endpoint"] == pair.slave.endpoint
        assert {q["perm"] for q in told["queues"]} == {"READ"}
    finally:
        pair.stop()


def test_spark_query_states_name_no_jvm_class():
    from stratamq.spark.export import plain_state

    raw = ("Getting offsets from org.apache.spark.sql.execution.datasources.v2.python."
           "PythonMicroBatchStreamWithTriggerAvailableNow@18204781")
    assert plain_state(raw) == "finding new messages"
    assert "org.apache" not in plain_state(
        "Reading from org.apache.spark.sql.Foo@1a2b and more")
