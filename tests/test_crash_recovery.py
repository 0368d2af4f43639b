"""Crash recovery with real processes: a writer is killed with SIGKILL in the middle of writing.

The writer runs in a subprocess, puts messages (single puts and batches, several topics and
queues, tags and keys) and prints one acknowledgement line per message after its put returned
PUT_OK. The test kills it while it is still writing, then opens the store in this process and
checks that every acknowledged message is there, byte for byte, at its acknowledged position.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from killing import reap, sigkill

from stratamq.config import FlushDiskType, StoreConfig
from stratamq.message import Message
from stratamq.store.checkpoint import StoreCheckpoint
from stratamq.store.consume_queue_format import UNIT, UNIT_SIZE
from stratamq.store.layout import StoreLayout, parse_segment_name
from stratamq.store.message_store import MessageStore, StoreLocked
from stratamq.store.results import GetMessageStatus

PROJECT = Path(__file__).resolve().parents[1]

SEGMENT_SIZE = 64 * 1024  # CommitLog segments: the writer rolls over several of them
CQ_UNITS_PER_FILE = 16  # ConsumeQueue files of 16 units: queues roll over files too
ACKS_BEFORE_KILL = 400
ACK_TIMEOUT = 180.0  # seconds to wait for the writer's acks on a slow, busy machine
TOPICS = ("CrashTopicA", "CrashTopicB", "CrashTopicC")
QUEUES = 4

# A writer that keeps its checkpoint fresh (it is written on every thorough ConsumeQueue
# flush) and writes steadily for a while, so that the checkpoint's safe time (3 s before it)
# lies well past the first segments.
CHECKPOINTING = {"flush_interval_consume_queue": 20, "flush_consume_queue_thorough_interval": 100}
PACED = {"pace_ms": 30, "min_span_ms": 5000}

# The writer: the store settings come in as JSON on argv; it writes until it is killed.
# Its message layout is mirrored by ``placement`` and ``body_for`` below.
WRITER = r"""
import json, sys, time
from stratamq.config import FlushDiskType, StoreConfig
from stratamq.message import Message
from stratamq.store.message_store import MessageStore

settings = json.loads(sys.argv[1])
settings["flush_disk_type"] = FlushDiskType(settings["flush_disk_type"])
topics = settings.pop("topics")
queues = settings.pop("queues")
pace = settings.pop("pace_ms") / 1000
store = MessageStore(StoreConfig(**settings)).open()

def body_for(seq):
    unit = b"seq-%08d|" % seq
    length = 200 + (seq * 37) % 1000
    return (unit * (length // len(unit) + 1))[:length]

def make(seq):
    return Message(
        topic=topics[seq % len(topics)],
        queue_id=(seq // len(topics)) % queues,
        body=body_for(seq),
        properties={"TAGS": "Tag%d" % (seq % 3), "KEYS": "key-%d k%d" % (seq, seq % 7)},
    )

seq = 0
round_no = 0
out = sys.stdout
while True:
    size = 5 if round_no % 3 == 2 else 1  # every third put is a batch of five
    seqs = list(range(seq, seq + size))
    msgs = [make(s) for s in seqs]
    result = store.put_message(msgs[0]) if size == 1 else store.put_messages(msgs)
    if not result.ok:
        sys.stderr.write("put failed: %s %s\n" % (result.status, result.error))
        sys.exit(3)
    for s, m, appended in zip(seqs, msgs, result.messages):
        out.write(json.dumps({
            "seq": s, "topic": m.topic, "queue_id": m.queue_id,
            "queue_offset": appended.queue_offset,
            "physical_offset": appended.physical_offset, "size": appended.size,
            "store_timestamp": appended.store_timestamp,
        }) + "\n")
    out.flush()
    seq += size
    round_no += 1
    if pace:
        time.sleep(pace)  # a steady producer rather than a tight loop
"""


def placement(seq: int) -> tuple[str, int]:
    return TOPICS[seq % len(TOPICS)], (seq // len(TOPICS)) % QUEUES


def body_for(seq: int) -> bytes:
    unit = b"seq-%08d|" % seq
    length = 200 + (seq * 37) % 1000
    return (unit * (length // len(unit) + 1))[:length]


def seq_of(body: bytes) -> int:
    assert body.startswith(b"seq-"), body[:20]
    return int(body[4:12])


def config_for(root: Path, flush: FlushDiskType, **overrides) -> StoreConfig:
    return StoreConfig(
        store_path_root_dir=str(root),
        mapped_file_size_commit_log=SEGMENT_SIZE,
        mapped_file_size_consume_queue=CQ_UNITS_PER_FILE * UNIT_SIZE,
        flush_disk_type=flush,
        **overrides,
    )


def run_writer_and_kill(cfg: StoreConfig, tmp_path: Path, *, pace_ms: int = 0,
                        min_span_ms: int = 0, min_cq_files: int = 0) -> list[dict]:
    """Start the writer, collect ``ACKS_BEFORE_KILL`` acks (and, if asked, acks whose store
    times span ``min_span_ms``), SIGKILL it while it writes, and return every ack it printed
    before dying (including the ones still in the pipe)."""
    settings = {
        "store_path_root_dir": cfg.store_path_root_dir,
        "mapped_file_size_commit_log": cfg.mapped_file_size_commit_log,
        "mapped_file_size_consume_queue": cfg.mapped_file_size_consume_queue,
        "flush_disk_type": cfg.flush_disk_type.value,
        "flush_interval_consume_queue": cfg.flush_interval_consume_queue,
        "flush_consume_queue_thorough_interval": cfg.flush_consume_queue_thorough_interval,
        "topics": list(TOPICS),
        "queues": QUEUES,
        "pace_ms": pace_ms,
    }
    env = dict(os.environ)
    env["PYTHONPATH"] = str(PROJECT) + os.pathsep + env.get("PYTHONPATH", "")
    stderr_path = tmp_path / "writer.stderr"
    with stderr_path.open("wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, json.dumps(settings)],
            stdout=subprocess.PIPE, stderr=stderr, cwd=PROJECT, env=env,
        )
    lines: queue.Queue[bytes | None] = queue.Queue()

    def pump() -> None:
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    acks: list[dict] = []

    def take(line: bytes) -> None:
        if line.endswith(b"\n"):  # a line cut short by the kill was never acknowledged
            acks.append(json.loads(line))

    try:
        deadline = time.monotonic() + ACK_TIMEOUT
        while len(acks) < ACKS_BEFORE_KILL or (
            acks[-1]["store_timestamp"] - acks[0]["store_timestamp"] < min_span_ms
        ) or (min_cq_files and (len(acks) % 50 or _most_cq_files(cfg) < min_cq_files)):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                pytest.fail(f"writer gave {len(acks)} acks in {ACK_TIMEOUT}s; stderr: "
                            f"{stderr_path.read_text()[-2000:]}")
            try:
                line = lines.get(timeout=remaining)
            except queue.Empty:
                continue
            if line is None:
                proc.wait(timeout=30)
                pytest.fail(f"writer exited ({proc.returncode}) after {len(acks)} acks; "
                            f"stderr: {stderr_path.read_text()[-2000:]}")
            take(line)
            if len(acks) == 1:
                # While the writer owns the store, nobody else may open it.
                with pytest.raises(StoreLocked):
                    MessageStore(cfg).open()
        assert proc.poll() is None, "the writer must still be running when it is killed"
        sigkill(proc)
    finally:
        reap(proc)
    reader.join(timeout=60)
    assert not reader.is_alive()
    while (line := lines.get_nowait()) is not None:
        take(line)
    proc.stdout.close()
    assert [a["seq"] for a in acks] == list(range(len(acks)))
    return acks


def read_queue(store: MessageStore, topic: str, queue_id: int) -> list:
    """Every message of a queue from offset 0, checking the queue offsets are dense."""
    max_offset = store.get_max_offset_in_queue(topic, queue_id)
    assert store.get_min_offset_in_queue(topic, queue_id) == 0
    out = []
    while len(out) < max_offset:
        offset = len(out)
        with store.get_messages("g", topic, queue_id, offset, max_count=256,
                                max_bytes=1 << 30) as result:
            assert result.status is GetMessageStatus.FOUND, (topic, queue_id, offset, result)
            assert [r.queue_offset for r in result.records] == list(
                range(offset, offset + len(result.records))
            ), f"{topic}/{queue_id}: gap in queue offsets after {offset}"
            assert result.next_begin_offset == offset + len(result.records)
            out.extend(result.messages())
    for index, msg in enumerate(out):
        assert msg.queue_offset == index, f"{topic}/{queue_id}: offset {index} holds {msg}"
        assert (msg.topic, msg.queue_id) == (topic, queue_id)
    return out


def check_store(store: MessageStore, acks: list[dict], extra: dict[int, dict] | None = None
                ) -> int:
    """Every acked message is intact where it was acknowledged; what the store holds is exactly
    writer messages 0..n-1 (a prefix: no holes), each queue dense. Returns n."""
    found: dict[int, object] = {}
    extra = extra or {}
    for topic in TOPICS:
        for queue_id in range(QUEUES):
            for msg in read_queue(store, topic, queue_id):
                seq = seq_of(msg.body)
                assert seq not in found, f"message {seq} stored twice"
                found[seq] = msg
    for ack in acks:
        msg = found.get(ack["seq"])
        assert msg is not None, f"acknowledged message lost: {ack}"
        assert (msg.topic, msg.queue_id) == (ack["topic"], ack["queue_id"])
        assert msg.queue_offset == ack["queue_offset"], ack
        assert msg.physical_offset == ack["physical_offset"], ack
        assert msg.total_size == ack["size"], ack
        assert msg.body == body_for(ack["seq"])
        assert msg.tags == f"Tag{ack['seq'] % 3}"
        assert msg.keys == [f"key-{ack['seq']}", f"k{ack['seq'] % 7}"]
    for seq, want in extra.items():
        msg = found.get(seq)
        assert msg is not None, f"message {seq} put after recovery is lost"
        assert msg.queue_offset == want["queue_offset"]
        assert msg.body == body_for(seq)
    writer_seqs = sorted(s for s in found if s not in extra)
    n = len(writer_seqs)
    assert writer_seqs == list(range(n)), "recovered messages are not a prefix of what was put"
    for seq in writer_seqs:  # acknowledged or not: whatever was recovered is intact
        assert found[seq].body == body_for(seq), f"message {seq} damaged"
        assert (found[seq].topic, found[seq].queue_id) == placement(seq)
    assert n >= len(acks)
    return n


def put_after_recovery(store: MessageStore, first_seq: int) -> dict[int, dict]:
    """Put one message into every queue; each must get the next queue offset."""
    expected = {
        (t, q): store.get_max_offset_in_queue(t, q) for t in TOPICS for q in range(QUEUES)
    }
    physical_end = store.max_physical_offset
    put: dict[int, dict] = {}
    seq = first_seq
    for (topic, queue_id), next_offset in expected.items():
        result = store.put_message(Message(topic=topic, queue_id=queue_id, body=body_for(seq)))
        assert result.ok, result
        assert result.queue_offset == next_offset, (topic, queue_id)
        if not put:  # right at the end, or at the next segment if it did not fit there
            next_segment = -(-physical_end // SEGMENT_SIZE) * SEGMENT_SIZE
            assert result.physical_offset in (physical_end, next_segment)
        put[seq] = {"topic": topic, "queue_id": queue_id, "queue_offset": next_offset}
        seq += 1
    assert store.wait_dispatched(30)
    for seq, where in put.items():
        with store.get_messages("g", where["topic"], where["queue_id"], where["queue_offset"],
                                max_count=1) as got:
            assert got.status is GetMessageStatus.FOUND
            assert next(got.messages()).body == body_for(seq)
    return put


@pytest.mark.parametrize(
    ("flush", "checkpointing"),
    [
        (FlushDiskType.SYNC_FLUSH, False),
        (FlushDiskType.ASYNC_FLUSH, False),
        (FlushDiskType.ASYNC_FLUSH, True),
    ],
    ids=["sync", "async", "async-checkpointed"],
)
def test_sigkill_loses_no_acknowledged_message(tmp_path, flush, checkpointing):
    """SYNC_FLUSH: acked means on disk. ASYNC_FLUSH: a killed process leaves its writes in the
    page cache, so every acked message must survive a SIGKILL as well. Checkpointed: the
    writer keeps its checkpoint fresh, so recovery starts from a later segment, not the first."""
    cfg = config_for(tmp_path / "store", flush, **(CHECKPOINTING if checkpointing else {}))
    acks = run_writer_and_kill(cfg, tmp_path, **(PACED if checkpointing else {}))
    assert len({a["physical_offset"] // SEGMENT_SIZE for a in acks}) >= 3, "no roll-over tested"
    assert StoreLayout(cfg.root).abort.exists(), "the killed writer left no abort marker"

    store = MessageStore(cfg).open()
    try:
        assert store.recovery.abnormal is True
        if checkpointing:
            assert store.recovery.start_offset > 0, "recovery ignored the checkpoint"
        assert store.recovery.dropped_units == 0
        n = check_store(store, acks)
        # A new put continues the log where recovery says it ends, at the next queue offsets.
        assert store.max_physical_offset == store.recovery.end_offset
        extra = put_after_recovery(store, first_seq=10_000_000)
    finally:
        store.close()
    assert not StoreLayout(cfg.root).abort.exists()

    with MessageStore(cfg) as store:
        assert store.recovery.abnormal is False
        assert store.recovery.problem is None
        assert check_store(store, acks, extra) == n


def _most_cq_files(cfg: StoreConfig) -> int:
    """ConsumeQueue files of the queue that has the most (the dispatcher may lag the acks)."""
    root = cfg.root / "consumequeue"
    if not root.is_dir():
        return 0
    return max((len(list(q.iterdir())) for t in root.iterdir() for q in t.iterdir()),
               default=0)


def units_on_disk(queue_dir: Path) -> list[tuple[int, int, int]]:
    """The written units of a ConsumeQueue read straight from its files."""
    units = []
    for path in sorted(queue_dir.iterdir()):
        data = path.read_bytes()
        for unit in UNIT.iter_unpack(data):
            if unit[1] <= 0:
                return units
            units.append(unit)
    return units


def zero_units_from(queue_dir: Path, first_unit: int, file_size: int) -> None:
    """Zero every unit from ``first_unit`` on, as if they never reached the disk."""
    for path in sorted(queue_dir.iterdir()):
        start = parse_segment_name(path.name)
        end = start + file_size
        cut = first_unit * UNIT_SIZE
        if end <= cut:
            continue
        rel = max(0, cut - start)
        with path.open("r+b") as f:
            f.seek(rel)
            f.write(bytes(file_size - rel))


@pytest.mark.parametrize("damage", ["zero_tail", "delete_newest_file", "after_checkpoint"])
def test_sigkill_with_consume_queue_behind_commitlog(tmp_path, damage):
    """ConsumeQueue units that never reached the disk are rebuilt from the CommitLog.

    ``after_checkpoint``: the writer keeps a fresh checkpoint; every unit of a record stored
    after the checkpoint's safe time (the units it does not vouch for) is lost, and recovery,
    starting from a later segment, must still rebuild them all."""
    checkpointing = damage == "after_checkpoint"
    cfg = config_for(tmp_path / "store", FlushDiskType.SYNC_FLUSH,
                     **(CHECKPOINTING if checkpointing else {}))
    # Until the dispatcher (not just the acks) has filled several files of some queue.
    acks = run_writer_and_kill(cfg, tmp_path, min_cq_files=4,
                               **(PACED if checkpointing else {}))
    layout = StoreLayout(cfg.root)
    # The queue with the most acknowledged messages loses its newest units.
    counts: dict[tuple[str, int], int] = {}
    for a in acks:
        key = (a["topic"], a["queue_id"])
        counts[key] = max(counts.get(key, 0), a["queue_offset"] + 1)
    (topic, queue_id), acked_units = max(counts.items(), key=lambda kv: kv[1])
    queue_dir = layout.consume_queue_dir(topic, queue_id)
    # The dispatcher may itself have lagged behind at the kill: ``before`` may miss some units.
    before = units_on_disk(queue_dir)
    assert len(before) > 10
    files = sorted(queue_dir.iterdir())
    assert len(files) >= 3, "the queue should span several ConsumeQueue files"
    file_size = cfg.cq_file_size
    if damage == "zero_tail":
        lost_from = min(acked_units, len(before)) - 7  # seven acked units and any later ones
        zero_units_from(queue_dir, lost_from, file_size)
    elif damage == "delete_newest_file":
        newest = files[-1]
        newest.unlink()
        lost_from = parse_segment_name(newest.name) // UNIT_SIZE - 3
        zero_units_from(queue_dir, lost_from, file_size)
    else:
        safe = StoreCheckpoint.read(layout.checkpoint).min_timestamp()
        assert safe > acks[0]["store_timestamp"], "the writer wrote no useful checkpoint"
        lost_from = min(
            a["queue_offset"] for a in acks
            if (a["topic"], a["queue_id"]) == (topic, queue_id) and a["store_timestamp"] >= safe
        )
        zero_units_from(queue_dir, lost_from, file_size)
    assert 0 < len(units_on_disk(queue_dir)) == lost_from < acked_units

    store = MessageStore(cfg).open()
    try:
        assert store.recovery.abnormal is True
        if checkpointing:
            assert store.recovery.start_offset > 0, "recovery ignored the checkpoint"
        assert store.get_max_offset_in_queue(topic, queue_id) >= max(acked_units, len(before))
        rebuilt = read_queue(store, topic, queue_id)
        # Units that were on disk before the damage point where they pointed before.
        assert [(m.physical_offset, m.total_size) for m in rebuilt[: len(before)]] == [
            u[:2] for u in before
        ]
        n = check_store(store, acks)
        extra = put_after_recovery(store, first_seq=10_000_000)
    finally:
        store.close()
    with MessageStore(cfg) as store:
        assert store.recovery.abnormal is False
        assert check_store(store, acks, extra) == n
    # The rebuilt units are on disk, in RocketMQ's format, matching what the writer had.
    assert units_on_disk(queue_dir)[: len(before)] == before


def test_store_type_is_written_durably_and_a_leftover_tmp_is_never_read(tmp_path):
    """``config/storeType`` decides how every open reads the store: it is fsynced before the
    rename and the directory after it, and a ``.tmp`` a crash left (even an empty one) is
    neither read nor in the way of the next write."""
    import subprocess as sp

    from stratamq.store.consume_queue_store import read_store_type, write_store_type

    root = tmp_path / "store"
    write_store_type(root, "default")
    (root / "config" / "storeType.tmp").write_bytes(b"")  # what a crash once left behind
    assert read_store_type(root) == "default"
    # strace shows the syscalls: the data and the directory are both synced.
    code = ("import sys; from pathlib import Path; "
            "from stratamq.store.consume_queue_store import write_store_type; "
            "write_store_type(Path(sys.argv[1]), 'defaultRocksDB')")
    traced = sp.run(["strace", "-f", "-e", "trace=fsync,fdatasync,rename,renameat,renameat2",
                     sys.executable, "-c", code, str(root)], capture_output=True, text=True)
    if traced.returncode != 0 and "strace" in traced.stderr and "not found" in traced.stderr:
        pytest.skip("strace is not installed")
    calls = [line for line in traced.stderr.splitlines()
             if line.split("(")[0].split()[-1] in ("fsync", "fdatasync", "rename", "renameat",
                                                   "renameat2")]
    kinds = [line.split("(")[0].split()[-1] for line in calls]
    rename = next(i for i, k in enumerate(kinds) if k.startswith("rename"))
    assert "fsync" in kinds[:rename] and "fsync" in kinds[rename + 1:], calls
    assert read_store_type(root) == "defaultRocksDB"
