"""New ConsumeQueue files created off the dispatch path (consume_queue_pending.py, issue 29):
a new queue's units wait in memory, served as file units, until the flush thread creates its
file; a SIGKILL with thousands of queues waiting loses no message; a full disk while their
files are created is a clear error and loses nothing acknowledged."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from conftest import mounted_tmpfs
from killing import reap, sigkill
from test_disk_full import take_all_space
from waiting import wait_until

from stratamq.config import StoreConfig
from stratamq.message import Message
from stratamq.store.layout import segment_name
from stratamq.store.message_store import MessageStore
from stratamq.store.results import GetMessageStatus, PutMessageStatus

PROJECT = Path(__file__).resolve().parents[1]
# The flush thread, which creates the waiting files, runs only when a test wakes it.
IDLE_FLUSH = {"flush_interval_consume_queue": 3_600_000,
              "flush_consume_queue_thorough_interval": 3_600_000}


def body(topic: str, queue_id: int, i: int) -> bytes:
    return b"%s/%d/%06d" % (topic.encode(), queue_id, i)


def read_all(store: MessageStore, topic: str, queue_id: int) -> list[bytes]:
    with store.get_messages("g", topic, queue_id, 0, max_count=1000) as got:
        if got.status is not GetMessageStatus.FOUND:
            return []
        return [m.body for m in got.messages()]


def run_and_kill(script: str, args: list[str],
                 before_kill: Callable[[], None] | None = None) -> Any:
    """Run ``script`` until it prints its one JSON line, SIGKILL it, return what it printed
    (``before_kill``: looks at the store while the process still holds it)."""
    proc = subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=PROJECT)
    try:
        line = proc.stdout.readline()
        assert line, proc.stderr.read().decode()[-2000:]
        if before_kill is not None:
            before_kill()
        sigkill(proc)
    finally:
        reap(proc)
        proc.stdout.close()
        proc.stderr.close()
    return json.loads(line)


def first_file(store: MessageStore, topic: str, queue_id: int) -> Path:
    return store.layout.consume_queue_dir(topic, queue_id) / segment_name(0)


def test_units_of_a_waiting_queue_are_read_before_and_after_its_file_is_created(small_config):
    cfg = dataclasses.replace(small_config, **IDLE_FLUSH)  # 100-unit files: rolls too
    with MessageStore(cfg).open() as store:
        sent = {q: [body("New", q, i) for i in range(150)] for q in range(3)}
        for i in range(150):
            assert store.put_messages([Message("New", sent[q][i], q) for q in range(3)]).ok
        assert store.wait_dispatched()
        assert not first_file(store, "New", 0).exists()  # in memory yet
        for q in range(3):
            assert read_all(store, "New", q) == sent[q]
            cq = store.consume_queues.find("New", q)
            assert (cq.min_offset(), cq.max_offset()) == (0, 150)
            with store.get_messages("g", "New", q, 120, max_count=5) as got:
                assert [m.body for m in got.messages()] == sent[q][120:125]
        store.flush()  # the flush thread's step: creates the files, moves the units in
        for q in range(3):
            directory = store.layout.consume_queue_dir("New", q)
            assert sorted(p.name for p in directory.iterdir()) == [segment_name(0),
                                                                   segment_name(2000)]
            assert read_all(store, "New", q) == sent[q]
        # Writes after the move go to the file, at the next queue offset.
        assert store.put_messages([Message("New", b"late", 0)]).messages[0].queue_offset == 150
        assert store.wait_dispatched()
        assert read_all(store, "New", 0) == [*sent[0], b"late"]
    with MessageStore(cfg).open() as store:
        assert read_all(store, "New", 0) == [*sent[0], b"late"]
        assert read_all(store, "New", 2) == sent[2]


def test_past_the_memory_bound_new_files_are_created_on_the_dispatch_path(small_config):
    cfg = dataclasses.replace(small_config, **IDLE_FLUSH)
    with MessageStore(cfg).open() as store:
        store.consume_queues.pending.max_bytes = 50 * 20  # 50 units in memory, at most
        for i in range(60):  # one queue grows past the bound: its file is made at once
            assert store.put_messages([Message("Big", body("Big", 0, i), 0)]).ok
        assert store.wait_dispatched()
        assert first_file(store, "Big", 0).exists()
        # Room again: new queues wait in memory until the bound, then are made at once.
        assert store.put_messages([Message("Many", body("Many", q, 0), q)
                                   for q in range(80)]).ok
        assert store.wait_dispatched()
        made = [q for q in range(80) if first_file(store, "Many", q).exists()]
        assert 0 < len(made) < 80 and store.consume_queues.in_memory_files() == 80 - len(made)
        assert read_all(store, "Big", 0) == [body("Big", 0, i) for i in range(60)]
        for q in range(80):
            assert read_all(store, "Many", q) == [body("Many", q, 0)]


WRITER = """
import json, sys, time
from stratamq.config import StoreConfig
from stratamq.message import Message
from stratamq.store.message_store import MessageStore
root, queues = sys.argv[1], int(sys.argv[2])
cfg = StoreConfig(store_path_root_dir=root, flush_interval_consume_queue=3_600_000,
                  flush_consume_queue_thorough_interval=3_600_000)
store = MessageStore(cfg).open()
acks = []
for start in range(0, queues, 64):
    batch = [Message("K%04d" % (q // 4), b"m-%05d" % q, q % 4) for q in
             range(start, min(queues, start + 64))]
    result = store.put_messages(batch)
    assert result.ok, result
    acks.extend((m.topic, m.queue_id, a.queue_offset, m.body.decode())
                for m, a in zip(batch, result.messages))
assert store.wait_dispatched(60)
print(json.dumps(acks), flush=True)
time.sleep(600)  # killed here
"""


def test_a_sigkill_with_thousands_of_queues_waiting_for_their_files_loses_nothing(tmp_path):
    root = tmp_path / "store"
    queues = 3000
    made: list[Path] = []

    def look() -> None:  # the state this test is about: units in memory only, no file made
        made.extend(p for p in (root / "consumequeue").rglob("*") if p.is_file())

    acks = run_and_kill(WRITER, [str(root), str(queues)], before_kill=look)
    assert made == [], f"{len(made)} ConsumeQueue files already created"
    assert len(acks) == queues
    with MessageStore(StoreConfig(store_path_root_dir=str(root))).open() as store:
        for topic, queue_id, queue_offset, sent in acks:
            with store.get_messages("g", topic, queue_id, queue_offset, 1) as got:
                assert got.status is GetMessageStatus.FOUND, (topic, queue_id)
                assert [m.body for m in got.messages()] == [sent.encode()]
    # Reopened cleanly after that: the files were created at close and are read back.
    with MessageStore(StoreConfig(store_path_root_dir=str(root))).open() as store:
        assert read_all(store, "K0100", 3) == [b"m-00403"]
        assert first_file(store, "K0100", 3).exists()


def test_a_full_disk_while_waiting_files_are_created_is_an_error_and_loses_nothing(tmp_path):
    with mounted_tmpfs(tmp_path / "fs", "8m") as fs:
        cfg = StoreConfig(store_path_root_dir=str(fs / "store"),
                          mapped_file_size_commit_log=1024 * 1024, **IDLE_FLUSH)
        store = MessageStore(cfg).open()
        sent = {}
        try:
            for start in range(0, 2000, 50):
                batch = [Message(f"F{q // 4:03d}", f"f-{q:05d}".encode(), q % 4)
                         for q in range(start, start + 50)]
                result = store.put_messages(batch)
                assert result.ok, result
                sent.update({(m.topic, m.queue_id): m.body for m in batch})
            assert store.wait_dispatched()
            # The disk fills before the flush thread creates the 2,000 files (a page each).
            take_all_space(fs / "ballast")
            store._cq_flusher.wakeup()
            wait_until(lambda: store.reput.error is not None, 60, "dispatch to stop")
            error = str(store.reput.error)
            assert "No space left on device" in error and "CommitLog offset" in error, error
            refused = store.put_messages([Message("F000", b"after", 0)])
            assert refused.status is PutMessageStatus.SERVICE_NOT_AVAILABLE, refused
            # Every acknowledged message is served: from the files made, or from memory.
            for (topic, queue_id), sent_body in sent.items():
                assert read_all(store, topic, queue_id) == [sent_body], (topic, queue_id)
        finally:
            store.close()
        # Closed without the files it could not create: left for recovery, no snapshot.
        assert (fs / "store" / "abort").exists()
        (fs / "ballast").unlink()
        with MessageStore(cfg).open() as store:
            for (topic, queue_id), sent_body in sent.items():
                assert read_all(store, topic, queue_id) == [sent_body], (topic, queue_id)


CHECKPOINTED = """
import json, sys, time
from stratamq.config import StoreConfig
from stratamq.message import Message
from stratamq.store.checkpoint import StoreCheckpoint
from stratamq.store.message_store import MessageStore
root = sys.argv[1]
cfg = StoreConfig(store_path_root_dir=root, mapped_file_size_commit_log=64 * 1024,
                  flush_interval_consume_queue=3_600_000,
                  flush_consume_queue_thorough_interval=0)
store = MessageStore(cfg).open()
assert store.put_messages([Message("Live", b"live-first", 0)]).ok
assert store.wait_dispatched(60)
store.flush()  # Live's file exists: the open after the kill knows how far it goes
(store.layout.consumequeue_dir / "Blocked").write_bytes(b"its directory cannot be made")
acks = []
for i in range(5):
    r = store.put_messages([Message("Blocked", b"blocked-%d" % i, 0)])
    assert r.ok, r
    acks.append(["Blocked", 0, r.messages[0].queue_offset, "blocked-%d" % i])
assert store.wait_dispatched(60)
# Later records, in later CommitLog segments and more than the checkpoint's safety margin
# (3 s) later: a checkpoint taken now would put recovery's start past the Blocked records.
started = time.monotonic()
i = 0
while time.monotonic() - started < 4.5 or len(store.commitlog.files.files) < 4:
    r = store.put_messages([Message("Live", b"live-%04d-" % i + bytes(1500), 0)])
    assert r.ok, r
    acks.append(["Live", 0, r.messages[0].queue_offset, None])
    i += 1
    time.sleep(0.005)  # a steady producer, not a tight loop
assert store.wait_dispatched(60)
store.commitlog.files.flush_all()
# The flush thread's thorough round, run here to know when it is over: Blocked's file
# cannot be created.
store._cq_flusher.flush_now(True)
checkpoint = StoreCheckpoint.read(store.layout.checkpoint)
print(json.dumps({"acks": acks, "error": str(store.reput.error),
                  "logics": checkpoint.logics_msg_timestamp}), flush=True)
time.sleep(600)  # killed here
"""


def test_the_checkpoint_never_passes_units_whose_files_are_not_created(tmp_path):
    """A thorough ConsumeQueue flush that cannot create a waiting file writes no checkpoint:
    after a SIGKILL, recovery still starts early enough to re-dispatch those units."""
    root = tmp_path / "store"
    state = run_and_kill(CHECKPOINTED, [str(root)])
    assert "Not a directory" in state["error"], state["error"]
    assert state["logics"] == 0  # the thorough round that failed wrote no ConsumeQueue progress
    (root / "consumequeue" / "Blocked").unlink()  # the cause, fixed
    with MessageStore(StoreConfig(store_path_root_dir=str(root),
                                  mapped_file_size_commit_log=64 * 1024)).open() as store:
        blocked = [a for a in state["acks"] if a[0] == "Blocked"]
        assert read_all(store, "Blocked", 0) == [a[3].encode() for a in blocked]
        last = max(a[2] for a in state["acks"] if a[0] == "Live")
        assert store.consume_queues.find("Live", 0).max_offset() == last + 1
        with store.get_messages("g", "Live", 0, last, 1) as got:
            assert [m.body[:10] for m in got.messages()] == [b"live-%04d-" % (last - 1)]
