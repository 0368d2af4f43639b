"""Real SIGKILLs: at each step of a round's swap the queue comes back as the old set of files
or the new one, never a mix; a writer killed mid-stream loses nothing it was acknowledged for."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from compaction_util import close, open_store, put, read_from, small_config

from stratamq.compaction.layout import CompactionLayout
from stratamq.compaction.swap import KILL_ENV, STEPS
from stratamq.store.layout import StoreLayout

pytestmark = pytest.mark.slow
PROC = Path(__file__).resolve().parent / "compaction_proc.py"
NOW = 1_700_000_000_000


def rows(store) -> list[list]:
    return [[m.queue_offset, m.properties.get("KEYS"), m.body.decode()] for m in read_from(store)]


def run(command: str, root: Path, *args: str, kill_at: str | None = None,
        timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**__import__("os").environ}
    env.pop(KILL_ENV, None)
    if kill_at is not None:
        env[KILL_ENV] = kill_at
    return subprocess.run([sys.executable, str(PROC), command, str(root), *args], env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def before_and_after(tmp_path_factory):
    """A store whose queue has been compacted once and then filled again (so the next round
    rewrites compacted files and new ones, with tombstones), its reading before that round, and
    its reading after it (the round run to the end in a process of its own)."""
    base = tmp_path_factory.mktemp("crash")
    root = base / "store"
    cfg = small_config(root)
    store, comp = open_store(cfg)
    for i in range(600):
        put(store, f"k{i % 45}", b"" if i % 17 == 0 else b"v%d" % i)
    assert store.wait_dispatched()
    comp.run_now(now_ms=NOW - 3600 * 1000 * 2)  # its tombstones expire in the next round
    for i in range(600, 900):
        put(store, f"k{i % 60}", b"v%d" % i)
    before = rows(store)
    close(store, comp)
    done = run("round", shutil.copytree(root, base / "whole"), str(NOW))
    assert done.returncode == 0, done.stderr
    after = json.loads(done.stdout)
    assert len(after) < len(before)
    return root, before, after


@pytest.mark.parametrize("step", STEPS)
def test_a_kill_at_each_step_of_the_swap_leaves_the_old_set_or_the_new(before_and_after, step,
                                                                        tmp_path):
    root, before, after = before_and_after
    copy = shutil.copytree(root, tmp_path / "store")
    died = run("round", copy, str(NOW), kill_at=step)
    assert died.returncode == -signal.SIGKILL, (died.returncode, died.stderr[-2000:])
    store, comp = open_store(small_config(copy))
    try:
        got = rows(store)
        # Before the manifest, the round never happened; from it on, it happened whole.
        assert got == (before if step == "output-written" else after)
        assert as_table_rows(got) == as_table_rows(before)
        queue = CompactionLayout(StoreLayout(copy)).queue("Kv", 0)
        leftovers = [p for d in (queue.log_dir, queue.cq_dir) for p in d.iterdir()
                     if p.name.endswith(".deleted") or p.name in ("compacting", "swap.json")]
        assert leftovers == []
        logs, cqs = queue.segment_starts()
        assert logs == cqs
        # And the queue compacts on from there.
        assert store.wait_dispatched()
        [report] = comp.run_now(now_ms=NOW)
        # Only a round that never happened has anything left to do.
        assert (report.skipped is None) == (step == "output-written"), report.skipped
        assert rows(store) == after
    finally:
        close(store, comp)


def local_rows(store, end: int) -> list[list]:
    from stratamq.store.filter import TagFilter
    from stratamq.store.read_chain import ReadRequest

    out: list[list] = []
    while len(out) < end:
        got = store.local_source.read(ReadRequest("Kv", 0, len(out), 64, 1 << 20, TagFilter()))
        assert got is not None and got.records
        with got:
            out += [[m.queue_offset, m.properties.get("KEYS"), m.body.decode()]
                    for m in got.messages()]
    return out


def as_table_rows(rows_: list[list]) -> dict:
    table: dict = {}
    for _offset, key, body in rows_:
        if body:
            table[key] = body
        else:
            table.pop(key, None)
    return table


def test_a_writer_killed_mid_stream_keeps_every_acknowledged_message(tmp_path):
    root = tmp_path / "store"
    proc = subprocess.Popen([sys.executable, str(PROC), "put", str(root), "7"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    acked: list[list] = []
    try:
        deadline = time.monotonic() + 120
        assert proc.stdout is not None
        # Kill once it rolled several CompactionLog files and the flush thread wrote a
        # checkpoint (so the reopen replays only part of the CommitLog).
        checkpoint = CompactionLayout(StoreLayout(root)).dispatch_checkpoint
        while len(acked) < 1500 or not checkpoint.exists():
            line = proc.stdout.readline()
            assert line, proc.stderr.read() if proc.stderr else ""
            acked.append(json.loads(line))
            assert time.monotonic() < deadline
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    store, comp = open_store(small_config(root))
    try:
        got = rows(store)
        # Everything acknowledged is there, in order, at its offset; what follows (written but
        # not yet acknowledged when the kill came) is whole too.
        assert got[: len(acked)] == acked
        # ... and the same messages as the CommitLog's own ConsumeQueue serves.
        assert got == local_rows(store, len(got))
    finally:
        close(store, comp)
