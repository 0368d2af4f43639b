"""Compaction benchmark: a round's speed against a bare copy of the same files, the OffsetMap's
bytes per key, and reading a compacted queue from its start against a plain queue.

    python bench/compaction.py [--quick] [--messages N] [--keys K] [--repeat R] [--dir DIR]

Prints one JSON object per line:

* ``env``: interpreter and counts;
* ``copy_baseline``: a bare sequential read-and-copy of the files the round compacts (the data
  of each CompactionLog file and its batch CQ file read in one go and written to a new file,
  fsynced; the files are sparse past their data), MB/s (best of ``--repeat``);
* ``compaction``: the round on those files (OffsetMap build from the units, keep/drop, copy of
  the kept records, swap), MB/s of input and keys (records) per second, and ``ratio`` = its
  MB/s over the baseline's (target >= 0.3); the round is run on a fresh copy each time, best of
  ``--repeat``;
* ``offset_map``: an OffsetMap filled to its load factor with ``--map-keys`` keys: bytes per
  key (target <= 27) and keys put per second;
* ``read_from_start``: messages/s reading the compacted queue from offset 0 to its end, and a
  plain queue holding the same number of messages of the same size, ``ratio`` = compacted /
  plain (best of ``--repeat``).

``--quick`` uses small counts (seconds).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from stratamq.compaction.layout import CompactionLayout
from stratamq.compaction.offset_map import ENTRY_BYTES, LOAD_FACTOR, OffsetMap
from stratamq.compaction.policy import StaticPolicies, TopicPolicy
from stratamq.compaction.service import CompactionStore
from stratamq.config import StoreConfig
from stratamq.message import Message
from stratamq.store.layout import StoreLayout
from stratamq.store.message_store import MessageStore

TOPIC, PLAIN = "Kv", "Plain"
FULL = {"messages": 300_000, "keys": 30_000, "map_keys": 2_000_000, "repeat": 3}
QUICK = {"messages": 30_000, "keys": 3_000, "map_keys": 200_000, "repeat": 1}
BODY = 200


def emit(row: dict) -> None:
    out = {k: (round(v, 4) if isinstance(v, float) and abs(v) < 100 else
               round(v, 1) if isinstance(v, float) else v) for k, v in row.items()}
    print(json.dumps(out), flush=True)


def config(root: Path) -> StoreConfig:
    return StoreConfig(store_path_root_dir=str(root), mapped_file_size_commit_log=128 << 20,
                       compaction_mapped_file_size=16 << 20,
                       compaction_cq_mapped_file_size=4 << 20, message_index_enable=False)


def open_store(root: Path) -> tuple[MessageStore, CompactionStore]:
    cfg = config(root)
    store = MessageStore(cfg)
    comp = CompactionStore(cfg, StaticPolicies({TOPIC: TopicPolicy()})).plug_into(store)
    store.open()
    return store, comp


def build(root: Path, messages: int, keys: int) -> int:
    """A store whose compaction queue holds ``messages`` updates of ``keys`` keys (sealed, not
    compacted yet); return how many keys it has."""
    rng = random.Random(16)
    store, comp = open_store(root)
    try:
        batch = []
        for i in range(messages):
            key = f"key-{rng.randrange(keys):08d}"
            body = (b"%d|" % i).ljust(BODY, b"v")
            batch.append(Message(TOPIC, body, 0, {"KEYS": key}))
            if len(batch) == 64:
                assert store.put_messages(batch).ok
                batch = []
        if batch:
            assert store.put_messages(batch).ok
        assert store.wait_dispatched(600)
        for clog in comp.queues():
            clog.seal_active()
    finally:
        store.close()
        comp.close()
    return keys


def files_to_compact(root: Path) -> list[Path]:
    queue = CompactionLayout(StoreLayout(root)).queue(TOPIC, 0)
    logs, _ = queue.segment_starts()
    return [p for s in logs[:-1] for p in (queue.log_file(s), queue.cq_file(s))]


def used_bytes(root: Path) -> list[tuple[Path, int]]:
    """Each file a round reads, with how much of it holds data: a log file's records (and
    blank record), a batch CQ file's units (and end unit). The rest of them is sparse."""
    from stratamq.compaction.segment import Segment

    cfg = config(root)
    out = []
    for path in files_to_compact(root):
        if path.parent.parent.parent.name != "compactionLog":
            continue
        cq = path.parent.parent.parent.parent / "compactionCq" / TOPIC / "0" / path.name
        seg = Segment.open(path, cq, os.path.getsize(path), os.path.getsize(cq), read_only=True)
        try:
            seg.recover(read_only=True)
            out += [(path, seg.log_bytes + 8), (cq, (seg.units + 1) * 64)]
        finally:
            seg.close()
    assert cfg
    return out


def copy_baseline(src_root: Path, work: Path) -> tuple[float, int]:
    """(seconds, bytes) to read the data of every file a round reads, sequentially, and write
    it to a new file, fsynced."""
    out = work / "copy"
    out.mkdir()
    total = 0
    files = used_bytes(src_root)
    start = time.perf_counter()
    for path, used in files:
        with path.open("rb") as f:
            data = f.read(used)
        total += len(data)
        fd = os.open(out / path.name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fdatasync(fd)
        finally:
            os.close(fd)
    elapsed = time.perf_counter() - start
    shutil.rmtree(out)
    return elapsed, total


def written_bytes(root: Path) -> int:
    return sum(used for _path, used in used_bytes(root))


def one_round(src_root: Path, work: Path) -> tuple[float, dict]:
    root = work / "round"
    shutil.copytree(src_root, root)
    store, comp = open_store(root)
    try:
        [clog] = comp.queues()
        start = time.perf_counter()
        report = comp.run_round(clog)
        elapsed = time.perf_counter() - start
        assert report.skipped is None, report
        return elapsed, report.to_json()
    finally:
        store.close()
        comp.close()
        shutil.rmtree(root)


def read_all(store: MessageStore, topic: str) -> tuple[float, int]:
    end = store.get_max_offset_in_queue(topic, 0)
    offset, count = 0, 0
    start = time.perf_counter()
    while offset < end:
        with store.get_messages("bench", topic, 0, offset, 32) as got:
            for record in got.records:
                record.decode()
            count += len(got.records)
            offset = got.next_begin_offset
    return time.perf_counter() - start, count


def offset_map_fill(keys: int) -> tuple[float, float]:
    """(bytes per key, keys put per second) of a map sized for ``keys`` at its load factor."""
    offset_map = OffsetMap(int(np.ceil(keys / LOAD_FACTOR)) * ENTRY_BYTES)
    rng = np.random.default_rng(1)
    digests = rng.integers(0, 2**63, size=(keys, 2), dtype=np.int64).astype(">u8")
    start = time.perf_counter()
    taken = offset_map.put_many(digests, np.arange(keys))
    elapsed = time.perf_counter() - start
    assert taken == keys
    return offset_map.nbytes / offset_map.size, keys / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--messages", type=int)
    parser.add_argument("--keys", type=int)
    parser.add_argument("--map-keys", type=int)
    parser.add_argument("--repeat", type=int)
    parser.add_argument("--dir")
    args = parser.parse_args()
    sizes = dict(QUICK if args.quick else FULL)
    for name in sizes:
        if getattr(args, name) is not None:
            sizes[name] = getattr(args, name)
    work = Path(tempfile.mkdtemp(prefix="stratamq-bench-compaction-", dir=args.dir))
    try:
        emit({"bench": "env", "python": sys.version.split()[0], "platform": platform.platform(),
              "cpus": os.cpu_count(), **sizes, "body_bytes": BODY})
        src = work / "source"
        build(src, sizes["messages"], sizes["keys"])
        in_bytes = written_bytes(src)

        copies = [copy_baseline(src, work) for _ in range(sizes["repeat"])]
        copy_s, copy_bytes = min(copies)
        copy_mb_s = copy_bytes / copy_s / 1e6
        emit({"bench": "copy_baseline", "files": len(files_to_compact(src)),
              "bytes": copy_bytes, "seconds": copy_s, "mb_per_s": copy_mb_s})

        rounds = [one_round(src, work) for _ in range(sizes["repeat"])]
        round_s, report = min(rounds, key=lambda r: r[0])
        # MB/s over the same bytes the baseline copies: the files the round rewrites.
        mb_s = copy_bytes / round_s / 1e6
        emit({"bench": "compaction", "seconds": round_s, "log_bytes": in_bytes,
              "bytes_before": report["bytes_before"], "bytes_after": report["bytes_after"],
              "records_read": report["records_read"], "kept": report["kept"],
              "mb_per_s": mb_s, "keys_per_s": report["records_read"] / round_s,
              "ratio": mb_s / copy_mb_s, "target_ratio": 0.3})

        bytes_per_key, put_rate = offset_map_fill(sizes["map_keys"])
        emit({"bench": "offset_map", "keys": sizes["map_keys"], "bytes_per_key": bytes_per_key,
              "target_bytes_per_key": 27, "keys_put_per_s": put_rate})

        # Read from the start: the compacted queue, and a plain queue of as many messages.
        compacted = work / "compacted"
        shutil.copytree(src, compacted)
        store, comp = open_store(compacted)
        try:
            comp.run_now()
            kept = store.get_max_offset_in_queue(TOPIC, 0)
            batch = [Message(PLAIN, b"x" * BODY, 0, {"KEYS": f"key-{i:08d}"})
                     for i in range(64)]
            for _ in range(report["kept"] // 64 + 1):
                assert store.put_messages(batch).ok
            assert store.wait_dispatched(600)
            comp_runs = [read_all(store, TOPIC) for _ in range(sizes["repeat"])]
            plain_runs = [read_all(store, PLAIN) for _ in range(sizes["repeat"])]
        finally:
            store.close()
            comp.close()
        (cs, cn), (ps, pn) = min(comp_runs), min(plain_runs)
        emit({"bench": "read_from_start", "compacted_messages": cn, "queue_end": kept,
              "compacted_msgs_per_s": cn / cs, "plain_messages": pn,
              "plain_msgs_per_s": pn / ps, "ratio": (cn / cs) / (pn / ps)})
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
