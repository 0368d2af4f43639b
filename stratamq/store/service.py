"""``ServiceThread``: the one lifecycle of the store's background threads (flush, group commit,
ConsumeQueue flush, dispatch, clean-up, segment allocation; the broker's timer too).

RocketMQ's ``ServiceThread`` in small: ``start``, ``wakeup`` (cut the current wait short),
``wait`` (sleep until the interval ends, a wake-up, or shutdown), ``shutdown`` (ask, wake,
join with a bound). ``run`` is the loop; an exception that escapes it is logged with the
thread's name instead of vanishing. Subclasses own their state; only their thread runs ``run``.
"""

from __future__ import annotations

import logging
import threading

log = logging.getLogger(__name__)

__all__ = ["ServiceThread"]


class ServiceThread:
    join_timeout = 30.0  # seconds shutdown waits for the thread

    def __init__(self, name: str) -> None:
        self.name = name
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._guarded_run, name=name, daemon=True)
        self._started = False

    def start(self) -> None:
        if not self._started:
            self._started = True
            self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def wakeup(self) -> None:
        self._wake.set()

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds`` (less if woken); True once shutdown was asked for."""
        self._wake.wait(seconds)
        self._wake.clear()
        return self._stop.is_set()

    def _guarded_run(self) -> None:
        try:
            self.run()
        except Exception:  # a dying service must say so, not vanish
            log.exception("%s stopped by an error", self.name)

    def run(self) -> None:
        raise NotImplementedError

    def on_shutdown(self) -> None:
        """Called after the stop flag is set and before the join (wake a blocking queue)."""

    def shutdown(self) -> None:
        self._stop.set()
        self._wake.set()
        self.on_shutdown()
        if self._started and self._thread.is_alive():
            self._thread.join(timeout=self.join_timeout)
