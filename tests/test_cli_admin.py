"""Admin commands RocketMQ and Kafka users look for, against a real broker: route, status,
console producer and consumer, a message by offset, reset by time, broker status."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import UTC, datetime

import click
import pytest
from test_broker_harness import BrokerProcess, create_topic

from stratamq.cli import main
from stratamq.cli.common import TIME


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = BrokerProcess(tmp_path_factory.mktemp("admin") / "store").start()
    yield b
    b.terminate()


def _lines(done: subprocess.CompletedProcess) -> list[dict]:
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_console_producer_consumer_get_and_reset_by_time(broker):
    create_topic(broker, "Console", 2)
    sent = _lines(broker.cli("message", "send", "--topic", "Console", "--body", "first",
                             "--tag", "A", "--key", "k1", "--property", "p=1"))
    assert sent[0]["message_id"]
    piped = subprocess.run([sys.executable, "-m", "stratamq.cli", "message", "send", "--topic",
                            "Console", "--endpoint", broker.endpoint],
                           input="second\nthird\n", capture_output=True, text=True, timeout=60)
    assert len(_lines(piped)) == 2
    consumed = _lines(broker.cli("message", "consume", "--topic", "Console", "--group", "Con",
                                 "--max", "3", "--idle", "15"))
    assert sorted(m["body"] for m in consumed) == ["first", "second", "third"]
    first = next(m for m in consumed if m["body"] == "first")
    assert (first["tag"], first["keys"], first["properties"]) == ("A", ["k1"], {"p": "1"})
    # Acked: nothing more for the group.
    assert _lines(broker.cli("message", "consume", "--topic", "Console", "--group", "Con",
                             "--idle", "1")) == []
    got = _lines(broker.cli("message", "get", "--topic", "Console", "--queue",
                            str(first["queue_id"]), "--offset", str(first["queue_offset"])))
    assert got[0]["body"] == "first" and got[0]["message_id"] == first["message_id"]
    missing = broker.cli("message", "get", "--topic", "Console", "--queue", "0", "--offset", "99")
    assert missing.returncode == 1 and "no message" in missing.stderr
    # Back to the beginning by time (ISO 8601): every message is delivered again.
    reset = _lines(broker.cli("group", "reset-offset", "--group", "Con", "--topic", "Console",
                              "--timestamp", "1970-01-01T00:00:00Z"))
    assert [q["offset"] for q in reset[0]["queues"]] == [0, 0]
    again = _lines(broker.cli("message", "consume", "--topic", "Console", "--group", "Con",
                              "--max", "3", "--idle", "15"))
    assert sorted(m["body"] for m in again) == ["first", "second", "third"]
    later = datetime.now(UTC).isoformat()
    reset = _lines(broker.cli("group", "reset-offset", "--group", "Con", "--topic", "Console",
                              "--timestamp", later))
    assert sum(q["offset"] for q in reset[0]["queues"]) == 3  # past everything stored


def test_route_status_and_broker_status(broker):
    create_topic(broker, "Routed", 3)
    _lines(broker.cli("message", "send", "--topic", "Routed", "--body", "x"))
    route = _lines(broker.cli("topic", "route", "--topic", "Routed"))[0]
    assert [q["perm"] for q in route["queues"]] == ["READ_WRITE"] * 3
    assert route["endpoint"] == broker.endpoint
    deadline = time.monotonic() + 30  # dispatch is asynchronous: wait for the message
    while True:
        status = _lines(broker.cli("topic", "status", "--topic", "Routed"))[0]
        if status["messages"] == 1 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert status["messages"] == 1
    assert sum(q["last_store_time"] is not None for q in status["queues"]) == 1
    table = broker.cli("topic", "status", "--topic", "Routed", "--output", "table")
    assert table.returncode == 0 and "max_offset" in table.stdout
    info = _lines(broker.cli("broker", "status"))[0]
    assert info["version"] and info["role"] == "ASYNC_MASTER" and info["uptime_s"] >= 0
    assert info["disk"]["total"] > info["disk"]["free"] > 0
    assert info["dispatch_behind_bytes"] >= 0 and info["topics"] >= 1
    nothing = broker.cli("topic", "status", "--topic", "NoSuch")
    assert nothing.returncode == 1 and "does not exist" in nothing.stderr


def test_group_update_and_delete(broker):
    assert broker.cli("group", "create", "--group", "Temp").returncode == 0
    updated = _lines(broker.cli("group", "update", "--group", "Temp", "--retry-max-times", "3"))
    assert updated[0]["retry_max_times"] == 3
    assert _lines(broker.cli("group", "delete", "--group", "Temp"))[0] == {"deleted": "Temp"}
    assert "Temp" not in broker.cli("group", "list").stdout


def test_version_verbose_anywhere_and_help_everywhere():
    version = subprocess.run([sys.executable, "-m", "stratamq.cli", "--version"],
                             capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and "stratamq, version" in version.stdout
    missing = []

    def walk(cmd: click.Command, path: list[str]) -> None:
        if isinstance(cmd, click.Group):
            for name, sub in cmd.commands.items():
                walk(sub, [*path, name])
        elif not any("-v" in getattr(p, "opts", ()) for p in cmd.params):
            missing.append((" ".join(path), "-v"))
        if path and not cmd.help:
            missing.append((" ".join(path), "help"))
        missing.extend((" ".join(path), p.opts[0]) for p in cmd.params
                       if isinstance(p, click.Option) and not p.help)

    walk(main, [])
    assert missing == []


@pytest.mark.parametrize("text, ms", [
    ("1700000000000", 1_700_000_000_000),
    ("2023-11-14T22:13:20Z", 1_700_000_000_000),
    ("2023-11-14T23:13:20+01:00", 1_700_000_000_000),
])
def test_times_accept_epoch_ms_and_iso_8601(text, ms):
    assert TIME.convert(text, None, None) == ms
    with pytest.raises(click.BadParameter):
        TIME.convert("yesterday", None, None)
