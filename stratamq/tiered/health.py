"""``TierHealth``: whether the tier backend works, and when to try it again after it failed.

A broken tier (a POSIX directory that cannot be written, an S3 server that refuses or is gone)
makes every upload fail at once. Retrying each queue every round, and each ``tier flush`` in a
tight loop, burned a core and wrote a log line per attempt. Instead the uploader asks
``ready()`` before a round: after the first failure the next attempt waits 1 s, then twice as
long after each further failure, up to ``max_backoff_s`` (30 s); one success resets it. The
log gets one line per change of state (working -> failing at ERROR with the error, failing ->
working at WARNING with how long it lasted), never one per attempt; ``status()`` gives the
last error and since when it fails, for ``tier status``.

Thread-safety: every method from any thread (one lock).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

__all__ = ["TierHealth"]

log = logging.getLogger(__name__)


class TierHealth:
    """The tier's state as the uploader sees it (see the module docstring)."""

    def __init__(self, describe: str, *, first_backoff_s: float = 1.0,
                 max_backoff_s: float = 30.0) -> None:
        self.describe = describe
        self.first_backoff_s = first_backoff_s
        self.max_backoff_s = max_backoff_s
        self._lock = threading.Lock()
        self.failures = 0  # consecutive failed attempts (0: working)
        self.last_error: str | None = None
        self.failing_since_ms: int | None = None  # wall clock, for status
        self._failing_since = 0.0  # monotonic, for the recovery line
        self._retry_at = 0.0  # monotonic: no attempt before it

    def ready(self) -> bool:
        """True when an attempt may be made now (working, or its back-off ran out)."""
        with self._lock:
            return self.failures == 0 or time.monotonic() >= self._retry_at

    def retry_in(self) -> float:
        """Seconds until the next attempt may be made (0: now)."""
        with self._lock:
            return 0.0 if self.failures == 0 else max(0.0, self._retry_at - time.monotonic())

    def failed(self, what: str, error: BaseException | str) -> None:
        """An attempt failed: back off, and log only if the tier was working until now."""
        text = f"{what}: {error}"
        with self._lock:
            now = time.monotonic()
            first = self.failures == 0
            self.failures += 1
            self.last_error = text
            if first:
                self.failing_since_ms = int(time.time() * 1000)
                self._failing_since = now
            delay = min(self.max_backoff_s, self.first_backoff_s * 2 ** (self.failures - 1))
            self._retry_at = now + delay
        if first:
            log.error("tier %s failing: %s; retried with back-off up to %.0f s (one line when "
                      "it works again; `stratamq tier status` shows lastError)", self.describe,
                      text, self.max_backoff_s)
        else:
            log.debug("tier %s still failing (%d attempts): %s", self.describe, self.failures,
                      text)

    def succeeded(self) -> None:
        """An attempt worked: the back-off ends (logged once, when it was failing)."""
        with self._lock:
            if self.failures == 0:
                return
            failures, lasted = self.failures, time.monotonic() - self._failing_since
            self.failures = 0
            self.last_error = None
            self.failing_since_ms = None
            self._retry_at = 0.0
        log.warning("tier %s works again after %.0f s (%d failed attempts)", self.describe,
                    lasted, failures)

    def status(self) -> dict[str, Any]:
        """``lastError`` (null while the tier works) and ``lastErrorSince`` (epoch ms of the
        first failure in a row)."""
        with self._lock:
            return {"lastError": self.last_error, "lastErrorSince": self.failing_since_ms}
