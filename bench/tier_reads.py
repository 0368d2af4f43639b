"""The cost of checking tier records before they are served (issue 26, item 6), on cold reads
of a POSIX tier, against the same reads with the checks off, in the same run.

    python bench/tier_reads.py [--quick] [--messages N] [--repeat N] [--dir DIR]

Prints one JSON object per line:

* ``env``: interpreter and counts;
* ``cold_read_checks``: messages/s of a sequential read of every queue from the tier, 32
  messages a read, by a fresh fetcher (an empty read-ahead cache: every record is read from
  the tier's files and checked once), with the checks (``checked_msgs_per_s``: body CRC,
  topic, queue id and queue offset of every record, ``record.copy_check``) and without
  (``unchecked_msgs_per_s``: ``TierFetcher.check_records = False``, the read path as it was
  before the checks), with read-ahead (the default) and without (``no_read_ahead_*``: each read
  goes to the tier and is checked itself), for three uses of what is read: ``decode`` (each
  record decoded into a message, as ``PullMessage`` and pop consumers are served: the cold
  read a consumer sees), ``records`` (each record's bytes copied, as the Spark source's raw
  ``PullMessage`` is served) and ``none`` (the records only located, never touched: the
  fetcher alone, where the checks weigh the most). Rates are messages per CPU second of this
  process (the reads are CPU-bound here, and on a shared machine wall time mostly measures
  the neighbours). ``ratio`` = checked / unchecked, best of ``repeat`` rounds each, the two
  run back to back in every round; ``median_round_ratio`` is the median of the rounds' own
  ratios. Target: ``ratio`` >= 0.9.

A POSIX tier on local disk, whose files stay in the page cache, is the case where the checks
weigh the most: no network time hides them (on S3, ``bench/tiered.py``'s ``cold_read``, each
read-ahead waits for a GET).
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from stratamq import tiered
from stratamq.config import StoreConfig
from stratamq.message import Message
from stratamq.store.filter import TagFilter
from stratamq.store.message_store import MessageStore
from stratamq.store.read_chain import ReadRequest

TOPIC = "Bench"
QUEUES = 4
BODY = bytes(range(256)) * 4  # 1 KiB
FULL = {"messages": 40_000, "repeat": 5}
QUICK = {"messages": 20_000, "repeat": 3}


def emit(row: dict) -> None:
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}),
          flush=True)


def config(root: Path, **extra) -> StoreConfig:
    return StoreConfig(**{
        "store_path_root_dir": str(root / "store"), "mapped_file_size_commit_log": 64 << 20,
        "tiered_backend_service_provider": "posix",
        "tiered_store_file_path": str(root / "tier"), **extra})


def build(root: Path, n: int) -> None:
    store = MessageStore(config(root))
    tier = tiered.wire(store, cluster="DefaultCluster", broker="broker-a", background=False)
    assert tier is not None
    store.open()
    try:
        for i in range(n):
            msg = Message(TOPIC, BODY, i % QUEUES, {"KEYS": f"key-{i}", "TAGS": f"t{i % 3}"})
            assert store.put_message(msg).ok
        assert store.wait_dispatched(120)
        store.flush()
        assert tier.flush(600), "tier flush did not complete"
    finally:
        store.close()
        tier.close()


def cold_read(cfg: StoreConfig, n: int, checked: bool, use: str) -> float:
    """Every queue read sequentially, 32 messages a read, by a fresh fetcher: msgs/s.
    ``use``: what is done with each record served (see the module docstring)."""
    reader = tiered.TieredStore(cfg, "DefaultCluster", "broker-a", read_only=True)
    reader.fetcher.check_records = checked
    got = 0
    t0 = time.process_time()
    for q in range(QUEUES):
        offset = 0
        while True:
            res = reader.fetcher.read(ReadRequest(TOPIC, q, offset, 32, 1 << 30,
                                                  TagFilter(None)))
            if res is None or not res.records:
                break
            got += len(res.records)
            if use == "records":
                for rec in res.records:
                    bytes(rec.buffer)
            elif use == "decode":
                for _msg in res.messages():
                    pass
            offset = res.next_begin_offset
            res.release()
    rate = got / (time.process_time() - t0)
    assert got == n, got
    assert reader.fetcher.damage.corrupt_records == 0
    reader.close()
    return rate


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--messages", type=int)
    ap.add_argument("--repeat", type=int)
    ap.add_argument("--dir")
    args = ap.parse_args()
    sizes = dict(QUICK if args.quick else FULL)
    for key in sizes:
        if getattr(args, key) is not None:
            sizes[key] = getattr(args, key)
    n, repeat = sizes["messages"], sizes["repeat"]
    work = Path(tempfile.mkdtemp(prefix="bench-tier-reads-", dir=args.dir))
    try:
        emit({"bench": "env", "python": platform.python_version(),
              "machine": platform.machine(), "messages": n, "body_bytes": len(BODY),
              "queues": QUEUES, "tier": "posix (local disk, page cache warm)"})
        build(work, n)
        for name, extra in (("cold_read_checks", {}),
                            ("cold_read_checks_no_read_ahead",
                             {"read_ahead_cache_enable": False})):
            cfg = config(work, **extra)
            for use in ("decode", "records", "none"):
                checked, unchecked, rounds = [], [], []
                for r in range(repeat):  # alternating which goes first: the machine is shared
                    order = (True, False) if r % 2 == 0 else (False, True)
                    rates = {c: cold_read(cfg, n, c, use) for c in order}
                    checked.append(rates[True])
                    unchecked.append(rates[False])
                    rounds.append(rates[True] / rates[False])
                emit({"bench": name, "use": use, "messages": n,
                      "checked_msgs_per_s": max(checked),
                      "unchecked_msgs_per_s": max(unchecked),
                      "ratio": max(checked) / max(unchecked),
                      "median_round_ratio": statistics.median(rounds), "target": 0.9,
                      "repeat": repeat})
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
