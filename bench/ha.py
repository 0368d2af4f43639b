"""Replication benchmark: put throughput and p99 with no replication, as an ASYNC_MASTER and as
a SYNC_MASTER (a slave process on loopback), the slave's lag under that load, and a cold
slave's catch-up rate against a bare socket copy of the same bytes.

    python bench/ha.py [--quick] [--seconds S] [--writers W] [--batch B] [--catch-up-mb MB]
    python bench/ha.py --baseline-tree DIR [--catch-up-mb MB] [--catch-up-rounds N]

Prints one JSON object per line: ``env``; ``put`` per mode (``none``, ``ASYNC_MASTER``,
``SYNC_MASTER``) with messages/s, MB/s, p50/p99 ms of one batch put, and for ASYNC_MASTER the
``lag`` sampled every 20 ms (bytes and ms); ``catch_up`` (slave MB/s to the bytes being in
its CommitLog, bare copy MB/s, their ratio, target >= 0.5; apart: MB/s to the slave's dispatch
finishing, the CPU seconds both processes spent, and each bare copy's); ``target`` (each mode
over no replication, target sync >= 0.5; the median catch-up ratios).
Everything is measured in the same run; see stratamq/benchmarks/ha_bench.py.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import statistics
import sys
from collections.abc import Iterator
from pathlib import Path

from stratamq.benchmarks.ha_bench import (
    median_run,
    run_catch_up,
    run_puts,
    summary,
    tmp_workdir,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small counts (CI smoke run)")
    parser.add_argument("--seconds", type=float, default=8.0, help="length of each put run")
    parser.add_argument("--writers", type=int, default=8, help="putting threads")
    parser.add_argument("--batch", type=int, default=32, help="messages per put")
    parser.add_argument("--catch-up-mb", type=int, default=256, help="CommitLog to copy, MB")
    parser.add_argument("--transfer-batch", type=int, default=32 * 1024,
                        help="haTransferBatchSize for the catch-up (RocketMQ's default 32 KiB)")
    parser.add_argument("--repeat", type=int, default=3,
                        help="rounds; modes alternate within a round, medians are reported")
    parser.add_argument("--catch-up-rounds", type=int, default=3,
                        help="cold catch-ups (each with its bare copies); the median is reported")
    parser.add_argument("--dir", default=None, help="where to put the stores (default: /tmp)")
    parser.add_argument("--catch-up-only", action="store_true", help="skip the put runs")
    parser.add_argument("--baseline-tree", default=None, metavar="DIR",
                        help="a directory holding another version's stratamq package (e.g. "
                             "`git archive REV stratamq | tar -x -C DIR`): catch-up rounds "
                             "alternate this tree's slave with that one's, in the same run")
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.catch_up_mb, args.repeat = 2.0, 32, 1
    if args.baseline_tree:
        compare_trees(args)
        return
    segment = 64 * 1024 * 1024
    work = tmp_workdir(args.dir)
    try:
        print(json.dumps({"bench": "env", "python": sys.version.split()[0],
                          "platform": platform.platform(), "cpus": os.cpu_count(),
                          "seconds": args.seconds, "writers": args.writers,
                          "batch": args.batch, "catch_up_mb": args.catch_up_mb}), flush=True)
        if args.catch_up_only:
            args.repeat = 0
        modes = ["none", "ASYNC_MASTER", "SYNC_MASTER"]
        # A short warm-up (files, page cache, imports), not reported.
        if args.repeat:
            run_puts("none", seconds=1.0, writers=args.writers, batch=args.batch,
                     segment=segment, workdir=work)
        runs: dict[str, list[dict]] = {m: [] for m in modes}
        for r in range(args.repeat):
            for mode in modes[r % 3:] + modes[: r % 3]:  # each mode first once in three rounds
                run = run_puts(mode, seconds=args.seconds, writers=args.writers,
                               batch=args.batch, segment=segment, workdir=work)
                runs[mode].append(run)
                print(json.dumps({**run, "round": r}), flush=True)
        puts = {m: median_run(rs) for m, rs in runs.items() if rs}
        for mode in puts:
            print(json.dumps({**puts[mode], "bench": "put_median", "rounds": args.repeat}),
                  flush=True)
        # Each round: the slave as it runs, then one whose dispatch runs along the copy (how it
        # copied before it held dispatch back), for a comparison in the same run.
        catch: list[dict] = []
        along: list[dict] = []
        for _ in range(max(1, args.catch_up_rounds)):
            for dispatch_along, kept in ((False, catch), (True, along)):
                c = run_catch_up(total_mb=args.catch_up_mb, segment=segment,
                                 batch_size=args.transfer_batch, workdir=work,
                                 dispatch_along=dispatch_along)
                kept.append(c)
                print(json.dumps(c), flush=True)
        print(json.dumps(summary(puts, catch, along)), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


@contextlib.contextmanager
def _slave_from(tree: str | None) -> Iterator[None]:
    """Start helper processes (the slave) from ``tree``'s stratamq package instead of this
    one: first on their path, and the working directory not put before it."""
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "PYTHONSAFEPATH")}
    if tree:
        os.environ["PYTHONPATH"] = str(Path(tree).resolve())
        os.environ["PYTHONSAFEPATH"] = "1"
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def compare_trees(args: argparse.Namespace) -> None:
    """Cold catch-ups alternating this tree's slave ("new") with ``--baseline-tree``'s
    ("baseline"), each against its own bare copies; medians of speed, ratio and CPU seconds."""
    segment = 64 * 1024 * 1024
    work = tmp_workdir(args.dir)
    runs: dict[str, list[dict]] = {"baseline": [], "new": []}
    try:
        for r in range(max(1, args.catch_up_rounds)):
            order = ["baseline", "new"] if r % 2 == 0 else ["new", "baseline"]
            for which in order:
                with _slave_from(args.baseline_tree if which == "baseline" else None):
                    c = run_catch_up(total_mb=args.catch_up_mb, segment=segment,
                                     batch_size=args.transfer_batch, workdir=work)
                runs[which].append(c)
                print(json.dumps({**c, "slave": which, "round": r}), flush=True)
        med = {which: {key: statistics.median(run[key] for run in rs)
                       for key in ("slave_mb_per_s", "ratio", "slave_cpu_seconds",
                                   "slave_dispatched_mb_per_s", "bare_copy_mb_per_s")}
               for which, rs in runs.items()}
        print(json.dumps({"bench": "catch_up_compare", "rounds": len(runs["new"]),
                          "bytes": runs["new"][0]["bytes"], "median": med,
                          "new_over_baseline_mb_per_s": round(
                              med["new"]["slave_mb_per_s"] / med["baseline"]["slave_mb_per_s"],
                              3),
                          "new_over_baseline_cpu": round(
                              med["new"]["slave_cpu_seconds"]
                              / med["baseline"]["slave_cpu_seconds"], 3)}), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
