"""Store append benchmark: the fixed cost of an append and of a dispatch round, measured as
CPU per message of 1-message appends against batched appends in the same run.

    python bench/store_appends.py [--quick] [--messages N] [--rounds R] [--batch B]

A broker under 1-message sends appends one record at a time, and the dispatcher (ConsumeQueue
and index) then sees a round per record, so whatever an append or a round costs besides its
records counts once per message. Three workloads, each on a fresh store (ASYNC_FLUSH, the key
index on, 1 KiB bodies with TAGS and a 32-hex-digit UNIQ_KEY as the broker stores them), one
appending thread, the store's own dispatcher running:

* ``batched``: appends of ``--batch`` messages back to back (the baseline: fixed costs shared);
* ``single``: 1-message appends back to back;
* ``paced``: 1-message appends with a 0.5 ms pause after each, as a broker's sends arrive:
  the dispatcher is idle between records, so every record is a round of its own (the pause
  itself is not counted in CPU; its wall time is).

Prints one JSON object per line: ``env``; per workload (medians over ``--rounds`` alternating
rounds) ``cpu_us_per_msg`` (CPU of the whole process, every thread, per message, from append
until every message is dispatched) and ``msgs_per_s`` (appends only; not for ``paced``); then
``ratio``: each 1-message workload's CPU per message over ``batched``'s (1.0 would mean no
fixed cost at all).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stratamq.config import StoreConfig  # noqa: E402
from stratamq.message import Message, Prop  # noqa: E402
from stratamq.store.message_store import MessageStore  # noqa: E402

PAUSE_S = 0.0005  # between paced appends
SEGMENT = 256 * 1024 * 1024


def emit(obj: dict) -> None:
    print(json.dumps(obj), flush=True)


def messages(count: int) -> list[Message]:
    body = os.urandom(1024)
    return [Message("BenchTopic", body, queue_id=i % 8,
                    properties={Prop.TAGS: "TagA", Prop.UNIQ_KEY: f"0A000011{i:024X}",
                                Prop.WAIT_STORE_MSG_OK: "true"})
            for i in range(count)]


def run(workload: str, count: int, batch: int) -> dict:
    root = tempfile.mkdtemp(prefix="stratamq-bench-appends-")
    try:
        store = MessageStore(StoreConfig(store_path_root_dir=root,
                                         mapped_file_size_commit_log=SEGMENT)).open()
        try:
            msgs = messages(count)  # built before the clock starts
            step = batch if workload == "batched" else 1
            put = store.put_messages
            paused = 0.0
            cpu0, t0 = time.process_time(), time.perf_counter()
            for i in range(0, count, step):
                result = put(msgs[i:i + step], wait=False)
                if not result.ok:
                    raise RuntimeError(f"put failed: {result.status} {result.error}")
                if workload == "paced":
                    p0 = time.process_time()
                    time.sleep(PAUSE_S)
                    paused += time.process_time() - p0
            appended = time.perf_counter() - t0
            if not store.wait_dispatched(60):
                raise RuntimeError("dispatch did not catch up")
            cpu = time.process_time() - cpu0 - paused
        finally:
            store.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {"cpu_us_per_msg": cpu / count * 1e6, "msgs_per_s": count / appended}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small counts, 3 rounds")
    parser.add_argument("--messages", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args()
    count = args.messages or (4000 if args.quick else 20000)
    rounds = args.rounds or (3 if args.quick else 5)
    emit({"kind": "env", "python": platform.python_version(), "cpus": os.cpu_count(),
          "load_average": os.getloadavg(), "messages": count, "rounds": rounds,
          "batch": args.batch})
    workloads = ("batched", "single", "paced")
    for w in workloads:  # warm-up, not counted: lazy imports (numpy for key hashing), caches
        run(w, min(count, 2000), args.batch)
    runs: dict[str, list[dict]] = {w: [] for w in workloads}
    for _ in range(rounds):  # alternating, so a noisy neighbour hits every workload
        for w in workloads:
            runs[w].append(run(w, count, args.batch))
    for w in workloads:
        out = {"kind": "appends", "workload": w, "batch": args.batch if w == "batched" else 1,
               "cpu_us_per_msg": round(statistics.median(r["cpu_us_per_msg"] for r in runs[w]),
                                       1)}
        if w != "paced":
            out["msgs_per_s"] = round(statistics.median(r["msgs_per_s"] for r in runs[w]))
        emit(out)
    for w in ("single", "paced"):
        ratios = [r["cpu_us_per_msg"] / b["cpu_us_per_msg"]
                  for r, b in zip(runs[w], runs["batched"])]
        emit({"kind": "ratio", "of": f"{w}/batched", "cpu_per_msg": round(
            statistics.median(ratios), 2), "per_round": [round(x, 2) for x in ratios]})


if __name__ == "__main__":
    main()
