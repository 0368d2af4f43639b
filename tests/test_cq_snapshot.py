"""File ConsumeQueues reopened from the snapshot a clean close saves (consume_queue_snapshot.py):
queues load on first use, every answer is the one the files give, and a snapshot that no longer
describes the store (a crash since, a CommitLog that moved on) is never trusted."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from killing import reap, sigkill

from stratamq.config import StoreConfig
from stratamq.message import Message
from stratamq.store.layout import StoreLayout
from stratamq.store.message_store import MessageStore
from stratamq.store.results import GetMessageStatus
from tests.waiting import wait_until

PROJECT = Path(__file__).resolve().parents[1]
TOPICS = [f"Snap{t}" for t in range(6)]
QUEUES = 4
UNITS_PER_FILE = 4  # queues of 6 messages span two files


def config(root: Path) -> StoreConfig:
    return StoreConfig(store_path_root_dir=str(root), mapped_file_size_commit_log=256 * 1024,
                       mapped_file_size_consume_queue=UNITS_PER_FILE * 20,
                       message_index_enable=False)


def body(topic: str, queue_id: int, n: int) -> bytes:
    return f"{topic}/{queue_id}/{n}".encode()


def fill(store: MessageStore, topics: list[str], first: int, count: int) -> None:
    batch = [Message(t, body(t, q, n), queue_id=q, properties={"TAGS": f"t{n % 3}"})
             for n in range(first, first + count) for t in topics for q in range(QUEUES)]
    assert store.put_messages(batch).ok
    assert store.wait_dispatched(60)


def bodies(store: MessageStore, topic: str, queue_id: int) -> list[bytes]:
    out: list[bytes] = []
    offset = store.get_min_offset_in_queue(topic, queue_id)
    while offset < store.get_max_offset_in_queue(topic, queue_id):
        with store.get_messages("g", topic, queue_id, offset, max_count=32) as got:
            assert got.status is GetMessageStatus.FOUND, (topic, queue_id, offset, got.status)
            out.extend(m.body for m in got.messages())
            offset = got.next_begin_offset
    return out


def expect(store: MessageStore, counts: dict[str, int]) -> None:
    for topic, n in counts.items():
        for q in range(QUEUES):
            assert store.get_max_offset_in_queue(topic, q) == n, (topic, q)
            assert bodies(store, topic, q) == [body(topic, q, i) for i in range(n)], (topic, q)


def test_a_clean_reopen_loads_queues_on_first_use_and_answers_as_the_files(tmp_path):
    cfg = config(tmp_path / "store")
    layout = StoreLayout(cfg.root)
    with MessageStore(cfg).open() as store:
        fill(store, TOPICS, 0, 6)
    assert layout.cq_snapshot.exists()

    with MessageStore(cfg).open() as store:
        assert not layout.cq_snapshot.exists(), "a writable open must consume the snapshot"
        cqs = store.consume_queues
        assert not any(cq.loaded for cq in cqs), "queues were read at open"
        for topic in TOPICS:  # offsets answered without reading a file
            for q in range(QUEUES):
                assert store.get_min_offset_in_queue(topic, q) == 0
                assert store.get_max_offset_in_queue(topic, q) == 6
        assert not any(cq.loaded for cq in cqs)
        assert bodies(store, TOPICS[0], 1) == [body(TOPICS[0], 1, i) for i in range(6)]
        assert [cq.loaded for cq in cqs].count(True) == 1
        # New messages continue every queue, loaded or not, and a new topic starts at 0.
        fill(store, TOPICS[:3], 6, 3)
        fill(store, ["SnapNew"], 0, 2)
        expect(store, {**dict.fromkeys(TOPICS[:3], 9), **dict.fromkeys(TOPICS[3:], 6),
                       "SnapNew": 2})

    # Saved again, by a store half of whose queues stayed unloaded: the same answers.
    with MessageStore(cfg).open() as store:
        assert not any(cq.loaded for cq in store.consume_queues)
        expect(store, {**dict.fromkeys(TOPICS[:3], 9), **dict.fromkeys(TOPICS[3:], 6),
                       "SnapNew": 2})


def test_a_snapshot_older_than_the_commitlog_is_not_trusted(tmp_path):
    """A snapshot put back from before later writes (a restored copy, another writer in
    between): the CommitLog's end differs, and the queues are read from their files."""
    cfg = config(tmp_path / "store")
    layout = StoreLayout(cfg.root)
    with MessageStore(cfg).open() as store:
        fill(store, TOPICS, 0, 3)
    old = tmp_path / "old-snapshot"
    shutil.copy(layout.cq_snapshot, old)
    with MessageStore(cfg).open() as store:
        fill(store, TOPICS, 3, 2)  # the same queues: consumequeue/ itself is not changed
    os.replace(old, layout.cq_snapshot)
    with MessageStore(cfg).open() as store:
        expect(store, dict.fromkeys(TOPICS, 5))
        fill(store, TOPICS[:1], 5, 1)
        assert store.get_max_offset_in_queue(TOPICS[0], 0) == 6


WRITER = """
    import json, sys
    from stratamq.config import StoreConfig
    from stratamq.message import Message
    from stratamq.store.message_store import MessageStore

    root, starts, queues = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
    store = MessageStore(StoreConfig(store_path_root_dir=root,
                                     mapped_file_size_commit_log=256 * 1024,
                                     mapped_file_size_consume_queue=4 * 20,
                                     message_index_enable=False)).open()
    lazy = sum(not cq.loaded for cq in store.consume_queues)
    print(json.dumps({"lazy_at_open": lazy}), flush=True)
    n = 6
    while True:
        for t, start in starts.items():
            for q in range(queues):
                r = store.put_message(Message(t, f"{t}/{q}/{n}".encode(), queue_id=q))
                assert r.ok and r.queue_offset == n - start, (t, q, n, r)
        store.wait_dispatched(60)
        print(json.dumps({"acked": n}), flush=True)
        n += 1
"""


def test_sigkill_after_an_open_from_the_snapshot_recovers_exactly(tmp_path):
    """A process opens a cleanly closed store from its snapshot, writes to its queues (loading
    some, adding new ones) and is killed: the next open does not trust the consumed snapshot,
    and every acknowledged message is where it was acknowledged."""
    cfg = config(tmp_path / "store")
    with MessageStore(cfg).open() as store:
        fill(store, TOPICS, 0, 6)
    # Message 6 on: two topics loaded by their first write, one created.
    starts = {TOPICS[0]: 0, TOPICS[1]: 0, "SnapLater": 6}
    topics = list(starts)
    env = {**os.environ, "PYTHONPATH": str(PROJECT)}
    with (tmp_path / "writer.stderr").open("wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(WRITER), str(cfg.root), json.dumps(starts),
             str(QUEUES)], stdout=subprocess.PIPE, stderr=stderr, cwd=PROJECT, env=env)
    lines: list[dict] = []
    try:
        assert proc.stdout is not None
        first = json.loads(proc.stdout.readline() or b"{}")
        assert first.get("lazy_at_open") == len(TOPICS) * QUEUES, first
        wait_until(lambda: lines.append(json.loads(proc.stdout.readline() or b"{}"))
                   or lines[-1].get("acked", 0) >= 9, timeout=120, what="the writer's acks")
        sigkill(proc)
    finally:
        reap(proc)
    acked = lines[-1]["acked"]
    assert StoreLayout(cfg.root).abort.exists()
    assert not StoreLayout(cfg.root).cq_snapshot.exists()
    with MessageStore(cfg).open() as store:
        assert store.recovery.abnormal
        for topic in topics:
            for q in range(QUEUES):
                got = bodies(store, topic, q)
                start = starts[topic]
                assert len(got) >= acked + 1 - start, (topic, q, len(got))
                assert got == [body(topic, q, i) for i in range(start, start + len(got))]
        expect(store, dict.fromkeys(TOPICS[2:], 6))


def test_a_queue_whose_files_went_missing_after_the_close_is_refilled_from_its_commitlog(
        tmp_path, caplog):
    """A queue directory removed after a clean close (the snapshot still says what it held):
    its first read finds no files, says so, and gets its units again from the CommitLog,
    never the records of the topic's deleted generation that lie before them."""
    cfg = config(tmp_path / "store")
    with MessageStore(cfg).open() as store:
        fill(store, ["Gone"], 0, 3)  # the old generation: deleted below
        store.delete_topic("Gone")
        fill(store, ["Gone", "Kept"], 10, 5)  # queue offsets 0-4 again, bodies 10-14
    shutil.rmtree(cfg.root / "consumequeue" / "Gone" / "2")
    with MessageStore(cfg).open() as store:
        assert store.get_max_offset_in_queue("Gone", 2) == 5  # the snapshot's answer
        assert bodies(store, "Gone", 2) == [body("Gone", 2, n) for n in range(10, 15)]
        assert "Gone/2: files end at unit 0" in caplog.text
        assert bodies(store, "Kept", 2) == [body("Kept", 2, n) for n in range(10, 15)]
    with MessageStore(cfg).open() as store:  # written back: the next open reads the same
        assert bodies(store, "Gone", 2) == [body("Gone", 2, n) for n in range(10, 15)]


def test_a_reopen_from_the_snapshot_starts_queues_where_the_commitlog_now_starts(tmp_path):
    """CommitLog files deleted while the store ran (as `tier clean` deletes) leave a queue's
    first units pointing at records that are gone while its ConsumeQueue file stays: a reopen
    from the snapshot must put the queue's min offset past them, as an open that reads the
    files does (reads below it belong to the tier, not to the first local record)."""
    cfg = StoreConfig(store_path_root_dir=str(tmp_path / "store"),
                      mapped_file_size_commit_log=64 * 1024, message_index_enable=False)
    layout = StoreLayout(cfg.root)
    with MessageStore(cfg).open() as store:
        for _ in range(12):
            fill(store, TOPICS[:2], 0, 20)
        segments = sorted(layout.commitlog_dir.iterdir())
        assert len(segments) >= 4, "the CommitLog should span several segments"
        # The two oldest go as `tier clean` deletes what the tier holds: CommitLog files only
        # (the ConsumeQueues are corrected at the next regular clean-up, or at an open).
        gone = store.commitlog.files.delete_below(int(segments[2].name))
        assert len(gone) == 2
        assert store.min_physical_offset > 0
    assert layout.cq_snapshot.exists()

    with MessageStore(cfg).open() as store:
        assert not any(cq.loaded for cq in store.consume_queues), "not opened from the snapshot"
        from_snapshot = {(t, q): (store.get_min_offset_in_queue(t, q), bodies(store, t, q))
                         for t in TOPICS[:2] for q in range(QUEUES)}
    layout.cq_snapshot.unlink()
    with MessageStore(cfg).open() as store:  # the files read, every queue corrected at open
        from_files = {(t, q): (store.get_min_offset_in_queue(t, q), bodies(store, t, q))
                      for t in TOPICS[:2] for q in range(QUEUES)}
    assert all(low > 0 for low, _ in from_files.values())
    assert from_snapshot == from_files
