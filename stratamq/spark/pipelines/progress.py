"""A pipeline's progress on stderr: one line per stage, with rows, bytes and what is left; on a
terminal a ``rich`` line redrawn in place while the stage runs (Spark's own progress bars are
off: ``common.spark_session``), elsewhere whole lines.

Spark's own progress counts tasks; these lines count what a user knows the job by. Each stage
gets two accumulators (rows, bytes) that its tasks add to; Spark merges a task's additions into
the driver's value when the task ends, so the numbers move a task at a time (read tasks are
sized to move them often: ``common.SPLIT_BYTES``). The total is known before the stage starts
(the CommitLog's bytes for a read, the rows the read found for a write), which gives the share
done and an estimate of the time left. A line is printed when the stage starts, every
``LINE_EVERY_S`` seconds while it runs (``STRATAMQ_PROGRESS_EVERY_S``), and when it ends:

    rebuild read: 42% (812,345 rows, 402.1 MB of 957.4 MB), 6 s, about 8 s left
    rebuild read: done, 1,933,012 rows, 957.4 MB in 14.2 s (136,128 rows/s, 67.4 MB/s)

No JVM class name reaches these lines (Spark's own log is turned down to errors).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any, TextIO

from stratamq.cli.progress import LINE_EVERY_S

MB = 1_000_000


def _mb(n: float) -> str:
    return f"{n / MB:,.1f} MB"


class Counters:
    """A stage's accumulators, as tasks see them: ``rows.add(n)``, ``bytes.add(n)``."""

    def __init__(self, rows: Any, nbytes: Any) -> None:
        self.rows = rows
        self.bytes = nbytes

    def __getitem__(self, i: int) -> Any:  # (rows, bytes) for writers that take a pair
        return (self.rows, self.bytes)[i]


class PipelineProgress:
    """Driver side. ``with progress.stage("read", total_bytes=n) as counters: <action>``.

    Stages may run at once, each from its own driver thread (rebuild's ConsumeQueue and index
    jobs): a stage owns its counters and printing thread, and only adds its own key to
    ``stages`` when it ends."""

    def __init__(self, sc: Any, job: str, *, quiet: bool = False,
                 stream: TextIO | None = None) -> None:
        self.sc, self.job, self.quiet = sc, job, quiet
        self.stream = stream or sys.stderr
        self.stages: dict[str, dict[str, float]] = {}

    @contextlib.contextmanager
    def stage(self, name: str, *, total_bytes: int | None = None,
              total_rows: int | None = None) -> Iterator[Counters]:
        counters = Counters(self.sc.accumulator(0), self.sc.accumulator(0))
        started = time.monotonic()
        stop = threading.Event()

        def line(final: bool) -> str:
            rows, done = counters.rows.value, counters.bytes.value
            elapsed = time.monotonic() - started
            if final:
                rate = (f" ({rows / elapsed:,.0f} rows/s, {_mb(done / elapsed)}/s)"
                        if elapsed > 0 else "")
                return (f"{self.job} {name}: done, {rows:,} rows, {_mb(done)} in "
                        f"{elapsed:.1f} s{rate}")
            if total_bytes:
                share = min(1.0, done / total_bytes)
                what = f"{rows:,} rows, {_mb(done)} of {_mb(total_bytes)}"
            elif total_rows:
                share = min(1.0, rows / total_rows)
                what = f"{rows:,} of {total_rows:,} rows, {_mb(done)}"
            else:
                share = 0.0
                what = f"{rows:,} rows, {_mb(done)}"
            left = (f", about {elapsed / share - elapsed:.0f} s left" if 0 < share < 1
                    else "")
            return f"{self.job} {name}: {share:.0%} ({what}), {elapsed:.0f} s{left}"

        live = self._live()

        def run() -> None:
            last = time.monotonic()
            seen = None
            while not stop.wait(0.25):
                if live is not None:  # a terminal: one line redrawn in place
                    live.update(line(False))
                    continue
                now = time.monotonic()
                current = (counters.rows.value, counters.bytes.value)
                if now - last >= LINE_EVERY_S and current != seen:
                    seen, last = current, now
                    self._print(line(False))

        if live is not None:
            live.start()
            live.update(line(False))
        else:
            self._print(line(False))
        thread = threading.Thread(target=run, name=f"progress-{name}", daemon=True)
        if not self.quiet:
            thread.start()
        try:
            yield counters
        finally:
            stop.set()
            if thread.is_alive():
                thread.join()
            if live is not None:
                live.stop()
        self._print(line(True))
        elapsed = time.monotonic() - started
        self.stages[name] = {"rows": counters.rows.value, "bytes": counters.bytes.value,
                             "seconds": round(elapsed, 3)}

    def _live(self) -> Any:
        """On a terminal, a ``rich`` live line for a stage (transient: the final line stays);
        None elsewhere, where whole lines are printed."""
        if self.quiet or not self.stream.isatty():
            return None
        from rich.console import Console
        from rich.live import Live

        return Live(console=Console(file=self.stream), refresh_per_second=4, transient=True)

    def _print(self, text: str) -> None:
        if not self.quiet:
            print(text, file=self.stream, flush=True)
