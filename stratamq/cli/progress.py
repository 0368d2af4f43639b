"""Progress of a long command on stderr (stdout keeps its JSON contract).

On a terminal a live bar (rich); otherwise a whole line at most every few seconds, with the
share done and an estimate of what is left, so a log file or CI output shows the job moving.
``--quiet`` turns it off."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

import click

__all__ = ["JobProgress", "quiet_option"]

# Seconds between plain progress lines (STRATAMQ_PROGRESS_EVERY_S overrides: 0 prints every
# update, as the tests do).
LINE_EVERY_S = float(os.environ.get("STRATAMQ_PROGRESS_EVERY_S", "5"))


def quiet_option(command: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--quiet", "-q", is_flag=True, default=False,
                        help="No progress on stderr.")(command)


class JobProgress:
    """``with JobProgress("verify", total) as p: p.update(done)``; phases via ``phase()``."""

    def __init__(self, description: str, total: int, *, unit: str = "bytes",
                 quiet: bool = False) -> None:
        self.description, self.total, self.unit = description, max(total, 1), unit
        self.quiet = quiet
        self.tty = sys.stderr.isatty()
        self._bar: Any = None  # a rich Progress on a terminal
        self._task: Any = None
        self._started = time.monotonic()
        self._last_line = float("-inf")
        self._done = 0

    def __enter__(self) -> JobProgress:
        if not self.quiet and self.tty:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TaskProgressColumn, TimeRemainingColumn

            self._bar = Progress("[progress.description]{task.description}", BarColumn(),
                                 TaskProgressColumn(), TimeRemainingColumn(),
                                 console=Console(stderr=True), transient=True)
            self._bar.__enter__()
            self._task = self._bar.add_task(self.description, total=self.total)
        return self

    def phase(self, description: str, total: int, unit: str | None = None) -> None:
        """Start the next phase of the job (its own total)."""
        self.description, self.total = description, max(total, 1)
        self.unit = unit or self.unit
        self._started = time.monotonic()
        self._done = 0
        if self._bar is not None:
            self._bar.update(self._task, description=description, total=self.total,
                             completed=0)

    def update(self, done: int) -> None:
        self._done = done
        if self.quiet:
            return
        if self._bar is not None:
            self._bar.update(self._task, completed=done)
            return
        now = time.monotonic()
        if now - self._last_line >= LINE_EVERY_S:
            self._last_line = now
            click.echo(self.line(now), err=True)

    def line(self, now: float) -> str:
        share = min(1.0, self._done / self.total)
        elapsed = now - self._started
        left = f", about {elapsed / share - elapsed:.0f} s left" if share > 0 else ""
        return (f"{self.description}: {share:.0%} ({self._done:,} of {self.total:,} "
                f"{self.unit}), {elapsed:.0f} s{left}")

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._bar is not None:
            self._bar.__exit__(exc_type, exc, tb)
