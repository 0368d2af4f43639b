"""Ending a test's child process for real: SIGKILL checked by its exit status, and a reaper
for ``finally`` blocks so no process outlives its test."""

from __future__ import annotations

import os
import signal
import subprocess


def sigkill(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc`` and check that the signal is what ended it."""
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL


def reap(proc: subprocess.Popen) -> None:
    """Kill ``proc`` if it still runs (a test that failed before its own kill) and wait."""
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=60)
