"""The ``KVTable`` of ``GET_BROKER_RUNTIME_INFO`` (``mqadmin brokerStatus``, ``clusterList``,
the Dashboard's cluster page), key by key as RocketMQ's ``AdminBrokerProcessor.
prepareRuntimeInfo`` and ``DefaultMessageStore.getRuntimeInfo`` build it, from StrataMQ's own
figures: the store's put/get totals and rates (``store/store_stats.py``: ``putTps``,
``getTransferredTps``, ...), the broker's daily counts (``broker/stats_window.py``:
``msgPutTotal*``) and the gRPC admin's ``BrokerStatus`` (offsets, disk, dispatch).

Keys StrataMQ has no figure for are written as a broker without that part writes them, and
say so here: ``sendThreadPoolQueueSize`` and ``pullThreadPoolQueueSize`` are ``0`` (sends and
pulls run on the event loop, not queued for a thread pool), ``pageCacheLockTimeMills`` is
``0`` (how long the current append has held the CommitLog lock is not measured). Keys with no
figure and no meaning here (the timer's ``timer*``, ``putMessageDistributeTime``,
``putLatency99``, ``remainHowManyDataToFlush``, ``scheduleMessageOffset_*``) are left out.

A pure function of its inputs: the handler gathers them on the store's thread.
"""

from __future__ import annotations

import math
import os
from typing import Any

__all__ = ["disk_used_ratio", "format_runtime", "human_bytes", "runtime_table"]


def format_runtime(millis: int) -> str:
    """``[ 1 days, 2 hours, 3 minutes, 4 seconds ]`` (StoreStatsService.getFormatRuntime)."""
    days, rest = divmod(max(millis, 0) // 1000, 86_400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"[ {days:,} days, {hours} hours, {minutes} minutes, {seconds} seconds ]"


def human_bytes(n: int) -> str:
    """``1.5 GiB``: MixAll.humanReadableByteCount with binary units."""
    if n < 1024:
        return f"{n} B"
    exp = min(int(math.log(n) / math.log(1024)), 6)
    return f"{n / 1024 ** exp:.1f} {'KMGTPE'[exp - 1]}iB"


def disk_used_ratio(path: str) -> float:
    """The used share of ``path``'s file system as UtilAll.getDiskPartitionSpaceUsedPercent
    gives it: used over used plus available to users, rounded up to a hundredth; -1.0 when
    the path is missing."""
    try:
        st = os.statvfs(path)
    except OSError:
        return -1.0
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    entire = used + st.f_bavail * st.f_frsize
    if entire <= 0:
        return -1.0
    return -(-used * 100 // entire) / 100.0


def runtime_table(*, version_desc: str, version: int, stratamq_version: str, started_ms: int,
                  now_ms: int, daily: dict[str, str] | None, store: dict[str, str] | None,
                  status: dict[str, Any] | None, earliest_ms: int | None) -> dict[str, str]:
    """The runtime table. ``daily``: ``BrokerStatsWindow.runtime_fields``; ``store``:
    ``StoreStats.runtime_fields``; ``status``: the gRPC admin's ``BrokerStatus``;
    ``earliest_ms``: the store time of the CommitLog's first record (-1: none). Each None
    when the broker has not that part (its keys then read as an idle broker's)."""
    table = {"brokerVersionDesc": version_desc, "brokerVersion": str(version),
             "brokerVersionStratamq": stratamq_version, "bootTimestamp": str(started_ms),
             "runtime": format_runtime(now_ms - started_ms),
             "msgPutTotalTodayNow": "0", "msgGetTotalTodayNow": "0",
             "msgPutTotalYesterdayMorning": "0", "msgGetTotalYesterdayMorning": "0",
             "msgPutTotalTodayMorning": "0", "msgGetTotalTodayMorning": "0",
             "sendThreadPoolQueueSize": "0", "pullThreadPoolQueueSize": "0",
             "pageCacheLockTimeMills": "0", "earliestMessageTimeStamp": "-1",
             "commitLogDiskRatio": "-1.0", "dispatchBehindBytes": "0"}
    if daily is not None:  # BrokerStats: counts now and at the last two midnights
        table.update(daily)
    if store is not None:  # StoreStatsService: totals and 10 s / 60 s / 600 s rates
        table.update(store)
    if earliest_ms is not None:
        table["earliestMessageTimeStamp"] = str(earliest_ms)
    if status is not None:  # the store's figures, as DefaultMessageStore's runtime info
        root = str(status["store"])
        ratio = str(disk_used_ratio(root))
        disk = status["disk"]
        table.update({
            "brokerActive": "true",
            "commitLogMinOffset": str(status["commitlog"]["min_offset"]),
            "commitLogMaxOffset": str(status["commitlog"]["max_offset"]),
            # (the CommitLog and the ConsumeQueues both live under the store root)
            "commitLogDiskRatio": ratio, f"commitLogDiskRatio_{root}": ratio,
            "consumeQueueDiskRatio": ratio,
            "commitLogDirCapacity": f"Total : {human_bytes(disk['total'])}, "
                                    f"Free : {human_bytes(disk['free'])}.",
            "dispatchBehindBytes": str(status["dispatch_behind_bytes"])})
    return table
