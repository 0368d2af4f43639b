"""The broker's put and get counts over the last minute, hour and day, as RocketMQ's
``BrokerStatsManager`` keeps them for ``VIEW_BROKER_STATS_DATA`` (the Dashboard's charts) and
the ``msgPutTotal*``/``msgGetTotal*`` fields of ``GET_BROKER_RUNTIME_INFO``.

Stat names and keys, as RocketMQ's (``Stats``):

======================  ============================  ==========================================
``TOPIC_PUT_NUMS``      topic                         messages stored (times: one per put call)
``TOPIC_PUT_SIZE``      topic                         their stored bytes (wroteBytes)
``GROUP_GET_NUMS``      ``topic@group``               messages handed to consumers
``GROUP_GET_SIZE``      ``topic@group``               their stored bytes (getBufferTotalSize)
``BROKER_PUT_NUMS``     the cluster name              every message stored (times not counted)
``BROKER_GET_NUMS``     the cluster name              every message handed out
======================  ============================  ==========================================

Like RocketMQ's ``StatsItem``, each item keeps a running ``(value, times)`` pair and samples
it: every 10 s into the minute window (7 samples), every 10 min into the hour window (7),
every hour into the day window (25). An item's first sample is preceded by a zero one an
interval earlier, so a new item's whole count shows at its first sample. A window's ``sum`` is
its last sample's value minus its first, ``tps`` that over the seconds between them and
``avgpt`` that over the calls between them. Until an item's first sample (up to 10 s after its
first count) it shows zeros, as RocketMQ's does.

The runtime fields: ``msgPutTotalTodayNow`` is the count of messages put on topics that are
not system topics since start; ``...TodayMorning`` that count at the last local midnight and
``...YesterdayMorning`` at the one before (``BrokerStats.record``).

A deleted topic takes its items with it, and its groups' (``topic@group``); a deleted group
its own (RocketMQ's ``onTopicDeleted``/``onGroupDeleted`` under ``autoDeleteUnusedStats``,
on by default): a topic created again under the name charts from zero.

Thread-safety: ``add`` may be called from any thread (one dict update under a lock); the
sampler runs on its own daemon thread between ``start`` and ``stop``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import date
from typing import Any

from stratamq.broker.metadata import is_system_topic

__all__ = ["STAT_NAMES", "BrokerStatsWindow", "StatsTee"]

TOPIC_PUT_NUMS, TOPIC_PUT_SIZE = "TOPIC_PUT_NUMS", "TOPIC_PUT_SIZE"
GROUP_GET_NUMS, GROUP_GET_SIZE = "GROUP_GET_NUMS", "GROUP_GET_SIZE"
BROKER_PUT_NUMS, BROKER_GET_NUMS = "BROKER_PUT_NUMS", "BROKER_GET_NUMS"
STAT_NAMES = (TOPIC_PUT_NUMS, TOPIC_PUT_SIZE, GROUP_GET_NUMS, GROUP_GET_SIZE, BROKER_PUT_NUMS,
              BROKER_GET_NUMS)
_BY_TOPIC = (TOPIC_PUT_NUMS, TOPIC_PUT_SIZE)  # keyed by the topic
_BY_TOPIC_GROUP = (GROUP_GET_NUMS, GROUP_GET_SIZE)  # keyed by topic@group
# (window, sampling interval in seconds, samples kept): StatsItem's csList* lists.
_WINDOWS = (("statsMinute", 10, 7), ("statsHour", 600, 7), ("statsDay", 3600, 25))
_TICK = 10.0


class BrokerStatsWindow:
    """Counters by (stat name, key) and their sampled minute, hour and day windows."""

    def __init__(self, cluster_name: str, clock: Callable[[], float] = time.time) -> None:
        self.cluster = cluster_name
        self.clock = clock
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, str], list[int]] = {}  # [value, times]
        # (name, key) -> per window: [(ms, times, value), ...]
        self._samples: dict[tuple[str, str], tuple[list[tuple[int, int, int]], ...]] = {}
        self._puts_no_system = 0  # BROKER_PUT_NUMS_WITHOUT_SYSTEM_TOPIC
        self._gets_no_system = 0
        self.morning: dict[str, int] = {"put_today": 0, "put_yesterday": 0,
                                        "get_today": 0, "get_yesterday": 0}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- counting (hot path) --------------------------------------------------------------------

    def _add(self, name: str, key: str, value: int, times: int) -> None:
        row = self._counts.get((name, key))
        if row is None:
            self._counts[(name, key)] = [value, times]
        else:
            row[0] += value
            row[1] += times

    def on_put(self, topic: str, count: int, nbytes: int) -> None:
        """``count`` messages of ``nbytes`` body bytes stored on ``topic`` by one put call."""
        with self._lock:
            self._add(TOPIC_PUT_NUMS, topic, count, 1)
            self._add(TOPIC_PUT_SIZE, topic, nbytes, 1)
            self._add(BROKER_PUT_NUMS, self.cluster, count, 0)
            if not is_system_topic(topic):
                self._puts_no_system += count

    def on_get(self, group: str, topic: str, count: int, nbytes: int) -> None:
        """``count`` messages (``nbytes`` bytes) handed to ``group`` from ``topic``."""
        key = f"{topic}@{group}"
        with self._lock:
            self._add(GROUP_GET_NUMS, key, count, 1)
            self._add(GROUP_GET_SIZE, key, nbytes, 1)
            self._add(BROKER_GET_NUMS, self.cluster, count, 0)
            if not is_system_topic(topic):
                self._gets_no_system += count

    # -- forgetting (RocketMQ's onTopicDeleted / onGroupDeleted, autoDeleteUnusedStats) --------

    def _drop(self, doomed: Callable[[str, str], bool]) -> None:
        with self._lock:
            for item in [item for item in self._counts if doomed(*item)]:
                del self._counts[item]
                self._samples.pop(item, None)

    def on_topic_deleted(self, topic: str) -> None:
        """Forget the topic's put items and its groups' get items: a topic created again under
        the name starts from zero."""
        prefix = f"{topic}@"
        self._drop(lambda name, key: (key == topic if name in _BY_TOPIC
                                      else name in _BY_TOPIC_GROUP and key.startswith(prefix)))

    def on_group_deleted(self, group: str) -> None:
        """Forget the group's get items (``topic@group``)."""
        suffix = f"@{group}"
        self._drop(lambda name, key: name in _BY_TOPIC_GROUP and key.endswith(suffix))

    def topics_listener(self, names: Callable[[], Iterable[str]]) -> Callable[[], None]:
        """A listener for the topic table (``MetadataStore.add_topics_listener``) that calls
        ``on_topic_deleted`` for each topic gone since the last change, whichever way it went
        (the admin's DeleteTopic, remoting's DELETE_TOPIC_IN_BROKER, a slave's sync)."""
        known = set(names())
        one_at_a_time = threading.Lock()  # listeners run on whichever thread changed the table

        def changed() -> None:
            nonlocal known
            with one_at_a_time:
                now = set(names())
                for topic in known - now:
                    self.on_topic_deleted(topic)
                known = now
        return changed

    # -- sampling -------------------------------------------------------------------------------

    def sample(self, window: int) -> None:
        """Take one sample of every item into window 0 (minute), 1 (hour) or 2 (day)."""
        _name, interval, keep = _WINDOWS[window]
        now = int(self.clock() * 1000)
        with self._lock:
            for item, (value, times) in self._counts.items():
                lists = self._samples.setdefault(item, ([], [], []))
                samples = lists[window]
                if not samples:
                    samples.append((now - interval * 1000, 0, 0))
                samples.append((now, times, value))
                del samples[:-keep]

    def record_morning(self) -> None:
        """At local midnight: today's morning count becomes yesterday's (``BrokerStats``)."""
        with self._lock:
            m = self.morning
            m["put_yesterday"], m["get_yesterday"] = m["put_today"], m["get_today"]
            m["put_today"], m["get_today"] = self._puts_no_system, self._gets_no_system

    def _run(self) -> None:
        ticks, day = 0, date.fromtimestamp(self.clock())
        while True:
            self.sample(0)
            if ticks % 60 == 0:
                self.sample(1)
            if ticks % 360 == 0:
                self.sample(2)
            today = date.fromtimestamp(self.clock())
            if today != day:
                day = today
                self.record_morning()
            ticks += 1
            if self._stop.wait(_TICK):
                return

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="broker-stats", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    # -- reading --------------------------------------------------------------------------------

    def stats_data(self, name: str, key: str) -> dict[str, Any] | None:
        """``BrokerStatsData`` of one item (None when it has never counted)."""
        with self._lock:
            if (name, key) not in self._counts:
                return None
            lists = self._samples.get((name, key), ([], [], []))
            out: dict[str, Any] = {}
            for (window, _interval, _keep), samples in zip(_WINDOWS, lists, strict=True):
                out[window] = _snapshot(samples)
            return out

    def runtime_fields(self) -> dict[str, str]:
        """The ``msgPutTotal*``/``msgGetTotal*`` fields of the broker's runtime info."""
        with self._lock:
            m = self.morning
            return {"msgPutTotalTodayNow": str(self._puts_no_system),
                    "msgGetTotalTodayNow": str(self._gets_no_system),
                    "msgPutTotalTodayMorning": str(m["put_today"]),
                    "msgGetTotalTodayMorning": str(m["get_today"]),
                    "msgPutTotalYesterdayMorning": str(m["put_yesterday"]),
                    "msgGetTotalYesterdayMorning": str(m["get_yesterday"])}


def _snapshot(samples: list[tuple[int, int, int]]) -> dict[str, Any]:
    """``BrokerStatsItem`` over one window's samples (StatsItem.computeStatsData)."""
    if not samples:
        return {"avgpt": 0.0, "sum": 0, "tps": 0.0}
    (first_ms, first_times, first_value), (last_ms, last_times, last_value) = \
        samples[0], samples[-1]
    total = last_value - first_value
    calls = last_times - first_times
    return {"avgpt": total / calls if calls > 0 else 0.0, "sum": total,
            "tps": total * 1000.0 / (last_ms - first_ms) if last_ms > first_ms else 0.0}


class StatsTee:
    """A metrics sink that counts sends and receives in a ``BrokerStatsWindow`` and passes
    every call on to the broker's current metrics sink (``inner()``)."""

    def __init__(self, window: BrokerStatsWindow, inner: Callable[[], Any]) -> None:
        self.window = window
        self.inner = inner

    def on_send(self, topic: str, sizes: Sequence[int], seconds: float,
                message_type: str = "NORMAL", stored_sizes: Sequence[int] = ()) -> None:
        # TOPIC_PUT_SIZE counts the stored records (RocketMQ's wroteBytes); every send path
        # gives their sizes, the bodies' only where none are known.
        self.window.on_put(topic, len(sizes), sum(stored_sizes or sizes))
        self.inner().on_send(topic, sizes, seconds, message_type, stored_sizes)

    def on_receive(self, group: str, topic: str, count: int, nbytes: int,
                   stored_bytes: int | None = None) -> None:
        # GROUP_GET_SIZE counts the stored records (RocketMQ's getBufferTotalSize, for pulls
        # and pops alike); a remoting pull's bytes are those records already.
        self.window.on_get(group, topic, count, nbytes if stored_bytes is None else stored_bytes)
        self.inner().on_receive(group, topic, count, nbytes, stored_bytes)

    def __getattr__(self, name: str) -> Any:  # on_ack, on_dlq, on_rpc, registry, ...
        return getattr(self.inner(), name)
