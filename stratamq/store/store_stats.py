"""The store's put and get totals, sampled each second, as RocketMQ's ``StoreStatsService``
keeps them for the broker's runtime info (``GET_BROKER_RUNTIME_INFO``, ``mqadmin
brokerStatus``/``clusterList``, the Dashboard's cluster page).

What is counted, where RocketMQ counts it:

* a put (``MessageStore.put_messages``): appended, its messages and their stored bytes (the
  encoded records, RocketMQ's ``wroteBytes``); not appended, one failed put. Refusals before
  the append (a slave, a full disk, a bad topic) are not counted, as RocketMQ's hooks and
  ``checkStoreStatus`` return before its count.
* a get (``MessageStore.get_messages``): one found call when it returns records, else one
  missed call; and the records it returns (``getMessageTransferredMsgCount``).
* the longest put and get call, in ms (``putMessageEntireTimeMax``,
  ``getMessageEntireTimeMax``). A put is timed from its checks to the end of its append; the
  flush or replica wait after it is not in it (its outcome is not a failed put either: the
  records are stored, as RocketMQ counts the append's result).

Every second a sample of the totals is kept, 601 of them (ten minutes). A rate over the last
``n`` seconds is the difference of the newest sample and the one ``n`` samples before it, over
the time between them; until that many samples exist the rate is blank, as RocketMQ's
(``putTps`` of a broker up 30 s is ``"<10 s> <60 s> "``: a blank 60 s and 600 s rate).
``getTotalTps`` is the exception, as in RocketMQ: found plus missed, 0.0 while blank.

Thread-safety: the ``on_*`` counts may be called from any thread (a short lock each);
``sample`` runs on the sampler thread between ``start`` and ``stop``; ``runtime_fields`` from
any thread.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

from stratamq.store.results import (
    GetMessageResult,
    GetMessageStatus,
    PutMessageResult,
    PutMessageStatus,
)

__all__ = ["StoreStats", "java_double"]

SAMPLE_INTERVAL_S = 1.0  # FREQUENCY_OF_SAMPLING
SAMPLES_KEPT = 600 + 1  # MAX_RECORDS_OF_SAMPLING + 1
TPS_WINDOWS_S = (10, 60, 600)  # the three numbers of "putTps" and the other rates
_PUT_OK, _FOUND = PutMessageStatus.PUT_OK, GetMessageStatus.FOUND


def java_double(value: float) -> str:
    """``value`` as Java's ``Double.toString`` writes it (what RocketMQ's tools parse):
    ``1.0``, ``0.25``; scientific below 10^-3 and from 10^7 on (``1.0E7``)."""
    if value == 0 or 1e-3 <= abs(value) < 1e7:
        return repr(float(value))  # (Python writes these without an exponent too)
    mantissa, exponent = f"{value:.15e}".split("e")
    return f"{float(mantissa)!r}E{int(exponent)}"


class StoreStats:
    """Put and get totals and their per-second samples (RocketMQ's ``StoreStatsService``)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self.put_messages = 0  # putMessageTimesTotal: messages appended
        self.put_bytes = 0  # putMessageSizeTotal: their stored bytes
        self.put_failed = 0  # putMessageFailedTimes: put calls whose append failed
        self.put_max_ms = 0  # putMessageEntireTimeMax
        self.get_found = 0  # getMessageTimesTotalFound: get calls that returned records
        self.get_miss = 0  # getMessageTimesTotalMiss
        self.get_transferred = 0  # getMessageTransferredMsgCount: records returned
        self.get_max_ms = 0  # getMessageEntireTimeMax
        # (ms, puts, found, missed, transferred), the newest last
        self._samples: deque[tuple[int, int, int, int, int]] = deque(maxlen=SAMPLES_KEPT)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- counting (hot path: one lock per call, not per message) --------------------------------

    def on_put(self, result: PutMessageResult, started: float) -> None:
        """One put call's append result; ``started`` its ``time.monotonic()`` at entry."""
        elapsed_ms = int((time.monotonic() - started) * 1000)
        appended = result.messages if result.status is _PUT_OK else None
        nbytes = 0
        if appended:
            for m in appended:
                nbytes += m.size
        with self._lock:
            if appended is None:
                self.put_failed += 1
            else:
                self.put_messages += len(appended)
                self.put_bytes += nbytes
            if elapsed_ms > self.put_max_ms:
                self.put_max_ms = elapsed_ms

    def on_get(self, result: GetMessageResult, started: float) -> None:
        """One get call's result; ``started`` its ``time.monotonic()`` at entry."""
        elapsed_ms = int((time.monotonic() - started) * 1000)
        records = len(result.records)
        found = records > 0 and result.status is _FOUND
        with self._lock:
            if found:
                self.get_found += 1
            else:
                self.get_miss += 1
            self.get_transferred += records
            if elapsed_ms > self.get_max_ms:
                self.get_max_ms = elapsed_ms

    # -- sampling -------------------------------------------------------------------------------

    def sample(self) -> None:
        """Keep one sample of the totals (the sampler thread calls this each second)."""
        now = int(self.clock() * 1000)
        with self._lock:
            self._samples.append((now, self.put_messages, self.get_found, self.get_miss,
                                  self.get_transferred))

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_INTERVAL_S):
            self.sample()

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="store-stats", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None

    # -- reading --------------------------------------------------------------------------------

    def _rate(self, column: int, seconds: int) -> float | None:
        """Per second over the last ``seconds`` samples; None until there are that many."""
        samples = self._samples
        if len(samples) <= seconds:
            return None
        begin, end = samples[-(seconds + 1)], samples[-1]
        if end[0] <= begin[0]:  # a clock stepped back: no rate rather than a wrong one
            return None
        return (end[column] - begin[column]) * 1000.0 / (end[0] - begin[0])

    def _rates(self, column: int) -> str:
        rates = (self._rate(column, s) for s in TPS_WINDOWS_S)
        return " ".join("" if r is None else java_double(r) for r in rates)

    def runtime_fields(self) -> dict[str, str]:
        """RocketMQ's ``StoreStatsService.getRuntimeInfo`` keys that StrataMQ counts, with
        ``getTransferedTps`` beside ``getTransferredTps``: RocketMQ 4.x and the Dashboard read
        the first spelling, 5.x tools the second."""
        with self._lock:
            # As RocketMQ: an idle store reports 1 put (its guard against dividing by zero).
            times = self.put_messages or 1
            total_rates = []
            for seconds in TPS_WINDOWS_S:
                found, miss = self._rate(2, seconds), self._rate(3, seconds)
                total_rates.append(java_double((found or 0.0) + (miss or 0.0)))
            transferred = self._rates(4)
            return {"putMessageTimesTotal": str(times),
                    "putMessageSizeTotal": str(self.put_bytes),
                    "putMessageAverageSize": java_double(self.put_bytes / times),
                    "putMessageFailedTimes": str(self.put_failed),
                    "putMessageEntireTimeMax": str(self.put_max_ms),
                    "getMessageEntireTimeMax": str(self.get_max_ms),
                    "putTps": self._rates(1), "getFoundTps": self._rates(2),
                    "getMissTps": self._rates(3), "getTotalTps": " ".join(total_rates),
                    "getTransferredTps": transferred, "getTransferedTps": transferred}
