"""Index benchmark: build rate during puts, lookups by key and by unique id, and what the index
costs a put, each against a baseline measured in the same run.

    python bench/index.py [--quick] [--messages N] [--lookups N] [--dir DIR]

Prints one JSON object per line:

* ``env``: interpreter and counts;
* ``put``: put throughput (1 KiB bodies, batches of 16, async flush) with the index on and off,
  each timed until every record is dispatched, and ``ratio`` = with / without;
* ``index_build``: keys indexed per second while those puts ran (KEYS + UNIQ_KEY per message);
* ``lookup_key``: full lookups by topic + key (index walk, CommitLog read, key check), per s;
  ``lookup_key_offsets``: the index walk alone; ``lookup_uniq``: by unique id with its topic;
  ``lookup_uniq_any_topic``: by unique id alone (every topic is tried);
* ``target``: key lookups/s over the issue's figure for Apache RocketMQ on this machine
  (35,000-80,000 key lookups/s; ratio >= 1 against the low end meets it).

Index files use RocketMQ's default sizes (5,000,000 slots; sparse files). ``--quick`` uses
small counts (seconds).
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

from stratamq.config import StoreConfig
from stratamq.message import Message
from stratamq.store.message_store import MessageStore

ROCKETMQ_KEY_LOOKUPS = (35_000, 80_000)  # key lookups/s, from the issue
TOPICS = 4
BATCH = 16
BODY = b"x" * 1024
FULL = {"messages": 100_000, "lookups": 20_000}
QUICK = {"messages": 10_000, "lookups": 3_000}


def emit(row: dict) -> None:
    out = {k: (round(v, 4) if isinstance(v, float) and abs(v) < 100 else
               round(v, 1) if isinstance(v, float) else v) for k, v in row.items()}
    print(json.dumps(out), flush=True)


def uniq(i: int) -> str:
    # A client id's shape: ip, pid, class-loader hash, seconds since a base, counter.
    return f"7F0000011A2B3C4D5E6F{i // 65536:08X}{i % 65536:04X}"


def messages(n: int) -> list[list[Message]]:
    msgs = [Message(f"BenchTopic{i % TOPICS}", BODY, queue_id=(i // TOPICS) % 4,
                    properties={"KEYS": f"key-{i}", "UNIQ_KEY": uniq(i), "TAGS": "TagA"})
            for i in range(n)]
    return [msgs[i : i + BATCH] for i in range(0, n, BATCH)]


def timed_puts(root: Path, batches: list[list[Message]], index: bool) -> tuple[float, int]:
    cfg = StoreConfig(store_path_root_dir=str(root), message_index_enable=index,
                      mapped_file_size_commit_log=256 * 1024 * 1024)
    store = MessageStore(cfg).open()
    try:
        start = time.perf_counter()
        for batch in batches:
            if not store.put_messages(batch).ok:
                raise SystemExit("put failed")
        store.wait_dispatched(600)
        elapsed = time.perf_counter() - start
        keys = sum(f.entries for f in store.index.files()) if store.index else 0
        return elapsed, keys
    finally:
        store.close()


def rate(count: int, fn) -> float:
    start = time.perf_counter()
    fn()
    return count / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--messages", type=int)
    ap.add_argument("--lookups", type=int)
    ap.add_argument("--dir", help="scratch directory (default: a temporary one)")
    args = ap.parse_args()
    counts = dict(QUICK if args.quick else FULL)
    if args.messages:
        counts["messages"] = args.messages
    if args.lookups:
        counts["lookups"] = args.lookups
    n, lookups = counts["messages"], counts["lookups"]
    emit({"bench": "env", "python": platform.python_version(), "machine": platform.machine(),
          "messages": n, "lookups": lookups, "body_size": len(BODY), "batch": BATCH,
          "quick": args.quick})
    scratch = Path(tempfile.mkdtemp(prefix="stratamq-index-bench-", dir=args.dir))
    try:
        batches = messages(n)
        # Same messages, same settings; only messageIndexEnable differs.
        without_s, _ = timed_puts(scratch / "plain", batches, index=False)
        with_s, keys = timed_puts(scratch / "indexed", batches, index=True)
        emit({"bench": "put", "index": True, "msgs_per_s": n / with_s,
              "baseline_no_index_msgs_per_s": n / without_s, "ratio": without_s / with_s})
        emit({"bench": "index_build", "keys": keys, "keys_per_s": keys / with_s,
              "note": "keys indexed per second of put+dispatch time"})

        rng = random.Random(7)
        picks = [rng.randrange(n) for _ in range(lookups)]
        cfg = StoreConfig(store_path_root_dir=str(scratch / "indexed"))
        with MessageStore(cfg, read_only=True) as s:
            def by_key() -> None:
                for i in picks:
                    if len(s.query_messages(f"BenchTopic{i % TOPICS}", f"key-{i}", 1)) != 1:
                        raise SystemExit(f"key-{i} not found")

            def by_key_offsets() -> None:
                for i in picks:
                    next(s.index.query_offsets(f"BenchTopic{i % TOPICS}", f"key-{i}"))

            def by_uniq() -> None:
                for i in picks:
                    if s.look_message_by_msg_id(uniq(i), f"BenchTopic{i % TOPICS}") is None:
                        raise SystemExit(f"unique id {uniq(i)} not found")

            def by_uniq_any() -> None:
                for i in picks[: max(1, lookups // 4)]:
                    if s.look_message_by_msg_id(uniq(i)) is None:
                        raise SystemExit(f"unique id {uniq(i)} not found")

            key_rate = rate(lookups, by_key)
            emit({"bench": "lookup_key", "lookups_per_s": key_rate})
            emit({"bench": "lookup_key_offsets", "lookups_per_s": rate(lookups, by_key_offsets),
                  "note": "index walk only, no CommitLog read"})
            emit({"bench": "lookup_uniq", "lookups_per_s": rate(lookups, by_uniq)})
            emit({"bench": "lookup_uniq_any_topic",
                  "lookups_per_s": rate(max(1, lookups // 4), by_uniq_any)})
        low, high = ROCKETMQ_KEY_LOOKUPS
        emit({"bench": "target", "name": "key lookups/s vs Apache RocketMQ",
              "value": key_rate, "reference_low": low, "reference_high": high,
              "ratio": key_rate / low, "ratio_high": key_rate / high, "met": key_rate >= low})
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
