"""A deleted topic's messages go with it: a topic created again under the name starts empty,
at queue offset 0, even after a crash replays the CommitLog, and its old keys find nothing."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time

from test_broker_harness import BrokerProcess, create_topic, send

from stratamq.config import StoreConfig
from stratamq.message import Message
from stratamq.store.message_store import MessageStore


def _cfg(root) -> StoreConfig:
    return StoreConfig(store_path_root_dir=str(root), mapped_file_size_commit_log=64 * 1024,
                       mapped_file_size_consume_queue=100 * 20)


def _bodies(store: MessageStore, topic: str, queue_id: int = 0) -> list[bytes]:
    got = store.get_messages("G", topic, queue_id, 0, max_count=1000)
    with got:
        return [m.body for m in got.messages()]


def test_delete_then_recreate_serves_only_the_new_messages(tmp_path):
    cfg = _cfg(tmp_path / "store")
    with MessageStore(cfg) as s:
        for i in range(300):
            assert s.put_message(Message("T", b"old-%d" % i, properties={"KEYS": f"k{i}"})).ok
        assert s.put_message(Message("Other", b"stays")).ok
        s.wait_dispatched()
        s.delete_topic("T")
        assert _bodies(s, "T") == [] and s.get_max_offset_in_queue("T", 0) == 0
        result = s.put_message(Message("T", b"new-0", properties={"KEYS": "k5"}))
        assert result.ok and result.queue_offset == 0
        s.wait_dispatched()
        assert _bodies(s, "T") == [b"new-0"]
        assert [m.body for m in s.query_messages("T", "k5")] == [b"new-0"]
        assert s.query_messages("T", "k7") == []
        assert _bodies(s, "Other") == [b"stays"]
    with MessageStore(cfg) as s:  # after a clean restart
        assert _bodies(s, "T") == [b"new-0"]
    assert json.loads((cfg.root / "config" / "deletedTopics.json").read_text())["topics"]["T"] > 0


CRASH = """
    import os, signal, sys
    from stratamq.config import StoreConfig
    from stratamq.message import Message
    from stratamq.store.message_store import MessageStore
    cfg = StoreConfig(store_path_root_dir=sys.argv[1], mapped_file_size_commit_log=64 * 1024,
                      mapped_file_size_consume_queue=100 * 20)
    s = MessageStore(cfg).open()
    for i in range(200):
        assert s.put_message(Message("T", b"old-%d" % i)).ok
    s.wait_dispatched()
    s.delete_topic("T")
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_crash_after_the_deletion_does_not_bring_old_messages_back(tmp_path):
    root = tmp_path / "store"
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(CRASH), str(root)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert (root / "abort").exists()
    # Make the replay start at the beginning of the log, as after the worst crash: every old
    # record of T is read again by the dispatcher.
    (root / "checkpoint").unlink()
    with MessageStore(_cfg(root)) as s:
        assert s.recovery.abnormal
        assert _bodies(s, "T") == [] and s.get_max_offset_in_queue("T", 0) == 0
        result = s.put_message(Message("T", b"new-0"))
        assert result.ok and result.queue_offset == 0
        s.wait_dispatched()
        assert _bodies(s, "T") == [b"new-0"]


def _messages_when(b: BrokerProcess, topic: str, want: int) -> int:
    """The topic's message count once it is ``want`` (dispatch is asynchronous), or what it
    is after a bounded wait."""
    deadline = time.monotonic() + 30
    while True:
        listed = {json.loads(line)["topic"]: json.loads(line)
                  for line in b.cli("topic", "list").stdout.split()}
        count = listed[topic]["messages"]
        if count == want or time.monotonic() > deadline:
            return count
        time.sleep(0.05)


def test_admin_topic_delete_then_create_starts_empty(tmp_path):
    b = BrokerProcess(tmp_path / "store").start()
    try:
        create_topic(b, "Reborn", 1)
        send(b, "Reborn", [b"old-1", b"old-2"])
        assert b.cli("topic", "delete", "--topic", "Reborn").returncode == 0
        create_topic(b, "Reborn", 1)
        listed = {json.loads(line)["topic"]: json.loads(line)
                  for line in b.cli("topic", "list").stdout.split()}
        assert listed["Reborn"]["messages"] == 0
        send(b, "Reborn", [b"new-1"])
        assert _messages_when(b, "Reborn", 1) == 1
    finally:
        assert b.terminate() == 0
    with MessageStore(StoreConfig(store_path_root_dir=str(tmp_path / "store")),
                      read_only=True) as s:
        assert _bodies(s, "Reborn") == [b"new-1"]


def test_shrinking_read_queues_that_hold_unconsumed_messages_is_refused(tmp_path):
    b = BrokerProcess(tmp_path / "store").start()
    try:
        create_topic(b, "Wide", 8)
        send(b, "Wide", [b"m%d" % i for i in range(16)])  # round robin: every queue holds some
        assert _messages_when(b, "Wide", 16) == 16
        refused = b.cli("topic", "update", "--topic", "Wide", "--queues", "2")
        assert refused.returncode == 1 and "unconsumed" in refused.stderr, refused.stderr
        # The RocketMQ way: stop writing to queues 2..7 first; consumers still read all 8.
        narrowed = b.cli("topic", "update", "--topic", "Wide", "-w", "2")
        assert narrowed.returncode == 0, narrowed.stderr
        topic = json.loads(narrowed.stdout)
        assert (topic["read_queues"], topic["write_queues"], topic["messages"]) == (8, 2, 16)
        forced = b.cli("topic", "update", "--topic", "Wide", "-r", "2", "--force")
        assert forced.returncode == 0, forced.stderr
        assert json.loads(forced.stdout)["read_queues"] == 2
    finally:
        assert b.terminate() == 0
