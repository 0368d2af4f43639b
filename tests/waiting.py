"""Waiting for a condition in tests: poll it until it holds, with a deadline that is a hang
guard, never a measurement (the machine running the suite may be slow and shared)."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(condition: Callable[[], object], timeout: float = 60.0,
               what: str = "condition", interval: float = 0.05) -> None:
    """Return once ``condition()`` is true; AssertionError naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)
