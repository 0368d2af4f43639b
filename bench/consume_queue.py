"""ConsumeQueue store benchmark: files (storeType=default) vs RocksDB (defaultRocksDB).

For 1,000, 20,000 and 100,000 queues (``--quick``: 1,000 and 20,000) with a few messages each,
both stores run in the same invocation, each in its own subprocess (``stratamq bench cq``), with
RocketMQ's default 300,000-unit (6 MB) ConsumeQueue files. Prints one JSON line per run, then
one per target with its ratio:

* 20,000 queues: RocksDB ConsumeQueue storage <= 40 MB, restart < 1 s
* 100,000 queues: RocksDB restart < 2 s
* RocksDB reads at least half as fast as file reads (same queue count)

Then many queues of one message each (10,000 queues, ``--many-queues N`` to change): the time
to dispatch them (every queue gets its first ConsumeQueue file, ``put_s``) and to reopen the
store (``restart_s``), files vs RocksDB in the same run (target: files within 3x of RocksDB;
``--many-queues-only`` runs just this part), in wall time and in the process's CPU time
(``put_cpu_s``, ``restart_cpu_s``; wall time on a shared machine mostly measures its disk).
New queues' files are created off the dispatch path (the flush thread; a close creates those
still waiting), so a last line compares dispatch plus close (``close_s``), not a target.

Then a throughput run per store (1,000 queues x 100 messages of 1 KiB) whose put and get rates
are given as ratios of Apache RocketMQ's RocksDB mode on this machine (about 65,000 puts/s and
480,000 gets/s of 1 KiB messages).

Disk use counts allocated blocks (``st_blocks * 512``) and, separately, apparent sizes: a
RocketMQ ConsumeQueue file is 6 MB however few units it holds, but sparse. The file store keeps
one descriptor per queue, so the bench first raises its soft RLIMIT_NOFILE to the hard limit
(the runs are subprocesses and inherit it); where the queue count still exceeds it the file store
cannot run at all, and the line says so (with the apparent bytes it would take).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]
MB = 1_000_000
CQ_FILE_BYTES = 300_000 * 20  # RocketMQ's default mappedFileSizeConsumeQueue
FD_HEADROOM = 256  # descriptors the store needs besides one per queue


THROUGHPUT_QUEUES, THROUGHPUT_PER_QUEUE, THROUGHPUT_BODY = 1_000, 100, 1024
MANY_QUEUES = 10_000  # queues of one message each: the cost of creating ConsumeQueue files
MANY_QUEUES_MAX_RATIO = 3.0  # files within 3x of RocksDB (issue 29)


def raise_nofile_limit() -> dict:
    """Raise the soft RLIMIT_NOFILE to the hard limit (no privilege needed); say what it was."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    new = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if new > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        except (ValueError, OSError):
            new = soft
    return {"rlimit_nofile": {"soft_before": soft, "soft": new, "hard": hard}}


def run_one(queues: int, per_queue: int, store_type: str, timeout: float,
            body_size: int | None = None) -> dict:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if store_type == "default" and queues + FD_HEADROOM > soft:
        return {"bench": "cq", "store_type": store_type, "queues": queues,
                "messages_per_queue": per_queue,
                "skipped": f"one open file per queue: {queues} queues exceed "
                           f"RLIMIT_NOFILE {soft} here",
                "cq_apparent_bytes_projected": queues * CQ_FILE_BYTES}
    cmd = [sys.executable, "-m", "stratamq.cli", "bench", "cq", "--queues", str(queues),
           "--messages-per-queue", str(per_queue), "--store-type", store_type]
    if body_size is not None:
        cmd += ["--body-size", str(body_size)]
    try:
        proc = subprocess.run(cmd, cwd=PROJECT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"bench": "cq", "store_type": store_type, "queues": queues,
                "error": f"timed out after {timeout:.0f} s"}
    if proc.returncode != 0:
        return {"bench": "cq", "store_type": store_type, "queues": queues,
                "error": proc.stderr.strip()[-500:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def target(name: str, value: float | None, limit: float, *, at_most: bool = True,
           unit: str = "") -> dict:
    ok = value is not None and (value <= limit if at_most else value >= limit)
    return {"target": name, "value": value, "limit": limit, "unit": unit,
            "ratio": round(value / limit, 4) if value is not None and limit else None,
            "ok": ok}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="1,000 and 20,000 queues only")
    parser.add_argument("--messages-per-queue", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    parser.add_argument("--many-queues", type=int, default=MANY_QUEUES,
                        help="queues of one message each for the file-creation run")
    parser.add_argument("--many-queues-only", action="store_true",
                        help="run only the many-queues comparison")
    args = parser.parse_args()
    counts = [1_000, 20_000] if args.quick else [1_000, 20_000, 100_000]
    print(json.dumps(raise_nofile_limit()), flush=True)
    many = many_queues(args.many_queues, args.timeout)
    if args.many_queues_only:
        for line in many:
            print(json.dumps(line), flush=True)
        return
    results: dict[tuple[int, str], dict] = {}
    for queues in counts:
        for store_type in ("defaultRocksDB", "default"):
            line = run_one(queues, args.messages_per_queue, store_type, args.timeout)
            results[(queues, store_type)] = line
            print(json.dumps(line), flush=True)

    def get(queues: int, store_type: str, field: str) -> float | None:
        return results.get((queues, store_type), {}).get(field)

    out = [
        target("rocksdb_20k_queues_cq_disk_bytes", get(20_000, "defaultRocksDB",
                                                       "cq_disk_bytes"), 40 * MB, unit="bytes"),
        target("rocksdb_20k_queues_restart_s", get(20_000, "defaultRocksDB", "restart_s"), 1.0,
               unit="s"),
    ]
    if 100_000 in counts:
        out.append(target("rocksdb_100k_queues_restart_s",
                          get(100_000, "defaultRocksDB", "restart_s"), 2.0, unit="s"))
    for queues in counts:
        rocks, files = (get(queues, "defaultRocksDB", "get_msgs_per_s"),
                        get(queues, "default", "get_msgs_per_s"))
        if rocks and files:
            line = target(f"rocksdb_vs_files_get_ratio_{queues}_queues",
                          round(rocks / files, 4), 0.5, at_most=False)
            line.update(rocksdb_get_msgs_per_s=rocks, files_get_msgs_per_s=files)
            out.append(line)
        rd, fd = get(queues, "defaultRocksDB", "cq_disk_bytes"), get(queues, "default",
                                                                     "cq_disk_bytes")
        fa = get(queues, "default", "cq_apparent_bytes") or get(queues, "default",
                                                                "cq_apparent_bytes_projected")
        out.append({"compare": f"disk_{queues}_queues", "rocksdb_cq_disk_bytes": rd,
                    "files_cq_disk_bytes": fd, "files_cq_apparent_bytes": fa,
                    "files_over_rocksdb_allocated": round(fd / rd, 2) if rd and fd else None,
                    "files_over_rocksdb_apparent": round(fa / rd, 2) if rd and fa else None})
        rr, fr = get(queues, "defaultRocksDB", "restart_s"), get(queues, "default", "restart_s")
        out.append({"compare": f"restart_{queues}_queues", "rocksdb_restart_s": rr,
                    "files_restart_s": fr,
                    "rocksdb_cq_load_s": get(queues, "defaultRocksDB", "cq_load_s"),
                    "files_cq_load_s": get(queues, "default", "cq_load_s"),
                    "rocksdb_put_msgs_per_s": get(queues, "defaultRocksDB", "put_msgs_per_s"),
                    "files_put_msgs_per_s": get(queues, "default", "put_msgs_per_s")})
    for store_type in ("defaultRocksDB", "default"):
        line = run_one(THROUGHPUT_QUEUES, THROUGHPUT_PER_QUEUE, store_type, args.timeout,
                       body_size=THROUGHPUT_BODY)
        print(json.dumps(line), flush=True)
        out.append({"compare": f"throughput_1KiB_{store_type}",
                    "put_msgs_per_s": line.get("put_msgs_per_s"),
                    "get_msgs_per_s": line.get("get_msgs_per_s"),
                    "put_vs_rocketmq_rocksdb": line.get("put_vs_rocketmq_rocksdb"),
                    "get_vs_rocketmq_rocksdb": line.get("get_vs_rocketmq_rocksdb")})
    for line in [*many, *out]:
        print(json.dumps(line), flush=True)


def many_queues(queues: int, timeout: float) -> list[dict]:
    """Dispatch and reopen ``queues`` queues of one message each, RocksDB then files; the
    runs' lines are printed as they finish, the comparison lines returned."""
    runs = {}
    for store_type in ("defaultRocksDB", "default"):
        runs[store_type] = run_one(queues, 1, store_type, timeout)
        print(json.dumps(runs[store_type]), flush=True)
    out = []
    for what, field in (("dispatch", "put_s"), ("reopen", "restart_s"),
                        ("dispatch_cpu", "put_cpu_s"), ("reopen_cpu", "restart_cpu_s")):
        rocks, files = runs["defaultRocksDB"].get(field), runs["default"].get(field)
        ratio = round(files / rocks, 2) if files and rocks else None
        line = target(f"files_vs_rocksdb_{what}_{queues}_queues_1_msg", ratio,
                      MANY_QUEUES_MAX_RATIO)
        line.update({f"rocksdb_{field}": rocks, f"files_{field}": files})
        out.append(line)
    # Not a target: the files' creation moved off the dispatch path (the flush thread makes
    # them, a close makes those still waiting), so dispatch plus close shows where it went.
    totals = {store_type: (run["put_s"] + run["close_s"]
                           if "put_s" in run and "close_s" in run else None)
              for store_type, run in runs.items()}
    rocks, files = totals["defaultRocksDB"], totals["default"]
    out.append({"compare": f"dispatch_and_close_{queues}_queues_1_msg",
                "rocksdb_s": round(rocks, 4) if rocks else None,
                "files_s": round(files, 4) if files else None,
                "files_over_rocksdb": round(files / rocks, 2) if files and rocks else None})
    return out


if __name__ == "__main__":
    main()
