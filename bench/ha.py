"""Replication benchmark: put throughput and p99 with no replication, as an ASYNC_MASTER and as
a SYNC_MASTER (a slave process on loopback), the slave's lag under that load, and a cold
slave's catch-up rate against a bare socket copy of the same bytes.

    python bench/ha.py [--quick] [--seconds S] [--writers W] [--batch B] [--catch-up-mb MB]

Prints one JSON object per line: ``env``; ``put`` per mode (``none``, ``ASYNC_MASTER``,
``SYNC_MASTER``) with messages/s, MB/s, p50/p99 ms of one batch put, and for ASYNC_MASTER the
``lag`` sampled every 20 ms (bytes and ms); ``catch_up`` (slave MB/s to the bytes being in
its CommitLog, bare copy MB/s, their ratio, target >= 0.5; apart: MB/s to the slave's dispatch
finishing, and the CPU seconds both processes spent); ``target`` (each mode over no
replication, target sync >= 0.5; the median catch-up ratios).
Everything is measured in the same run; see stratamq/benchmarks/ha_bench.py.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys

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
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.catch_up_mb, args.repeat = 2.0, 32, 1
    segment = 64 * 1024 * 1024
    work = tmp_workdir(args.dir)
    try:
        print(json.dumps({"bench": "env", "python": sys.version.split()[0],
                          "platform": platform.platform(), "cpus": os.cpu_count(),
                          "seconds": args.seconds, "writers": args.writers,
                          "batch": args.batch, "catch_up_mb": args.catch_up_mb}), flush=True)
        modes = ["none", "ASYNC_MASTER", "SYNC_MASTER"]
        # A short warm-up (files, page cache, imports), not reported.
        run_puts("none", seconds=1.0, writers=args.writers, batch=args.batch, segment=segment,
                 workdir=work)
        runs: dict[str, list[dict]] = {m: [] for m in modes}
        for r in range(args.repeat):
            for mode in modes[r % 3:] + modes[: r % 3]:  # each mode first once in three rounds
                run = run_puts(mode, seconds=args.seconds, writers=args.writers,
                               batch=args.batch, segment=segment, workdir=work)
                runs[mode].append(run)
                print(json.dumps({**run, "round": r}), flush=True)
        puts = {m: median_run(rs) for m, rs in runs.items()}
        for mode in modes:
            print(json.dumps({**puts[mode], "bench": "put_median", "rounds": args.repeat}),
                  flush=True)
        # Each round: the slave as it runs, then one whose dispatch runs along the copy (how it
        # copied before it held dispatch back), for a comparison in the same run.
        catch, along = [], []
        for _ in range(max(1, args.catch_up_rounds)):
            for dispatch_along, runs in ((False, catch), (True, along)):
                c = run_catch_up(total_mb=args.catch_up_mb, segment=segment,
                                 batch_size=args.transfer_batch, workdir=work,
                                 dispatch_along=dispatch_along)
                runs.append(c)
                print(json.dumps(c), flush=True)
        print(json.dumps(summary(puts, catch, along)), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
