"""What every pipeline shares: the session, the store lock, CommitLog splits, errors a user can
read, and files written so that a retried task or a killed run never leaves half of one.

Pipelines run as RDD jobs: one task per CommitLog byte range reads records in place (the data
source's split reader), and the data moves between stages as Arrow batches or numpy arrays,
one Python object per batch and destination, never one per record. Executors write what they
own; the driver plans from file listings and segment headers, and gets back counts only.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import math
import os
import re
import shutil
import sys
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from stratamq.fileutil import atomic_write, fsync_directory
from stratamq.spark.planning import Catalog, LogSplit, log_splits
from stratamq.store.layout import StoreLayout, parse_segment_name
from stratamq.store.mapped_file_queue import MappedFileQueue

# CommitLog bytes per read task: small enough that progress moves and a retried task redoes
# little, large enough that a task's start-up (a Python worker, a map) is noise.
SPLIT_BYTES = 64 * 1024 * 1024
# Bytes of output (ConsumeQueue units, RocksDB rows, index entries) one write task owns, and
# so about what it holds in memory: a task's whole partition is sorted before it is written.
PARTITION_BYTES = 64 * 1024 * 1024
# Tasks per core at least, in every stage: with one task per core the slowest task (a split
# of dense small records, a range holding the busiest queues) sets the stage's time while the
# other cores idle; two let the scheduler even the cores out. The cost is a task's start-up.
TASKS_PER_CORE = 2


def min_tasks(sc: Any) -> int:
    """The fewest tasks a stage is cut into on ``sc``'s executors."""
    return TASKS_PER_CORE * max(1, int(sc.defaultParallelism))


class PipelineError(RuntimeError):
    """A pipeline cannot run or failed; the message says why and what to do."""


LOG4J = Path(__file__).resolve().parents[2] / "data" / "spark-log4j2.properties"


# JVM options of the pipelines' own JVM (not under spark-submit, where the user's apply): C1
# compilation only. The rebuild and offload move bytes through the JVM (shuffle, Python worker
# streams) and keep every per-record step in Python, yet C2 compiled Spark's code for 1.6-1.9 s
# of CPU on every run of a 128 MiB rebuild (3.4-3.8 s of JVM CPU in all) without making the
# executor threads cheaper: with C1 alone the JVM used 1.6-1.7 s and the executor threads the
# same 0.9 s (local[2], same machine and load). On two cores that C2 time was taken from the
# tasks of the two-core run, while a one-core run got it on the idle core.
QUICK_JIT = "-XX:TieredStopAtLevel=1"


def spark_session(app_name: str, master: str | None = None, conf: dict[str, str] | None = None,
                  *, quick_jit: bool = False):
    """A session using this interpreter on the workers; ``local[*]`` unless spark-submit (or
    ``master``) says otherwise. ``quick_jit``: the JVM this process starts compiles with C1
    only (``QUICK_JIT``; for jobs whose per-record work is all in Python workers).

    What a user reads carries no JVM class names: a JVM this process starts logs errors only,
    without logger names (``data/spark-log4j2.properties``), and Spark's own progress bars
    are off (``[Stage 0:> ...]`` with carriage returns, on stderr even off a terminal, would
    interleave with StrataMQ's progress, which is the one display: ``rich`` on a terminal,
    whole lines elsewhere). Under spark-submit the JVM is already running: its log level is
    set to errors once the application starts."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from stratamq.spark import register

    builder = (SparkSession.builder.appName(app_name)
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.ui.showConsoleProgress", "false"))
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    if master or "PYSPARK_GATEWAY_PORT" not in os.environ:  # not launched by spark-submit
        builder = builder.master(master or "local[*]")
        options = [QUICK_JIT] if quick_jit else []
        if not os.environ.get("SPARK_CONF_DIR") and LOG4J.exists():
            options.append(f"-Dlog4j2.configurationFile=file:{LOG4J}")
        if options:
            builder = builder.config("spark.driver.extraJavaOptions", " ".join(options))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def run_main(app_name: str, master: str | None, job: Callable[[Any], dict[str, Any]], *,
             quick_jit: bool = False) -> int:
    """A pipeline's command-line tail: ``job(spark)`` on a session made for it, its summary
    printed as one JSON line (exit 0), or a ``PipelineError`` as one ``error:`` line (exit 1);
    the session stopped either way."""
    spark = spark_session(app_name, master, quick_jit=quick_jit)
    try:
        summary = job(spark)
    except PipelineError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        spark.stop()
    print(json.dumps(summary), flush=True)
    return 0


def store_dir(path: str) -> Path:
    """``path`` as a store directory (it has ``commitlog/``), or PipelineError."""
    root = Path(path)
    if not (root / "commitlog").is_dir():
        raise PipelineError(f"--store {path}: not a store directory (no commitlog/)")
    return root


@contextlib.contextmanager
def store_lock(root: Path) -> Iterator[None]:
    """Hold the store's lock, as ``MessageStore`` does (``flock`` and RocketMQ's POSIX lock on
    byte 0 of ``<root>/lock``), for as long as a pipeline rewrites the store's derived files:
    a broker must not open the store meanwhile, nor be running."""
    fd = os.open(StoreLayout(root).lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
        except OSError:
            raise PipelineError(f"store {root} is open in another process (a running "
                                "broker?): stop it first") from None
        yield
    finally:
        os.close(fd)


def commitlog_splits(root: Path, low: int, end: int, split_bytes: int,
                     min_splits: int) -> list[LogSplit]:
    """Byte ranges of [low, end) of the CommitLog, none crossing a segment, each at most
    ``split_bytes`` (and at least ``min_splits`` of them when there are that many bytes).
    Planned from the file listing and the segment size alone."""
    directory = StoreLayout(root).commitlog_dir
    segments = sorted(s for p in directory.iterdir() if (s := parse_segment_name(p.name))
                      is not None)
    size = MappedFileQueue.size_on_disk(directory) or 0
    catalog = Catalog(str(root), {}, size, segments)
    parts = max(min_splits, math.ceil(max(0, end - low) / max(1, split_bytes)))
    return log_splits(str(root), catalog, low, end, parts)


def stable_hash(data: bytes) -> int:
    """The same number in every process (Python's ``hash`` of bytes is salted per process)."""
    return zlib.crc32(data)


def write_file(path: Path, data: bytes | memoryview, size: int | None = None) -> None:
    """Write ``path`` whole or not at all (``fileutil.atomic_write``, extended to ``size`` if
    given). A retried task rewrites the same bytes; a killed one leaves only a ``.tmp`` that
    nothing reads. The directory is synced when the driver swaps it in."""
    atomic_write(path, data, size=size, sync_directory=False)


def swap_in(new: Path, target: Path, aside: Path) -> None:
    """Replace directory ``target`` by ``new``: the old one is renamed to ``aside`` first and
    removed after, so at every moment ``target`` is whole (old or new) or absent."""
    if target.exists():
        if aside.exists():
            shutil.rmtree(aside)
        os.replace(target, aside)
    target.parent.mkdir(parents=True, exist_ok=True)
    os.replace(new, target)
    fsync_directory(target.parent)
    shutil.rmtree(aside, ignore_errors=True)


_TRACEBACK = re.compile(r"Traceback \(most recent call last\):\n(.*?)(?:\n\tat |\Z)", re.S)


def user_message(exc: BaseException) -> str:
    """What a failed Spark job says to a user: the Python error a task raised (type name and
    message), not the JVM's stack and class names around it."""
    text = str(exc)
    found = _TRACEBACK.findall(text)
    if found:
        lines = [line for line in found[-1].splitlines() if line and not line.startswith(" ")]
        if lines:
            kind, sep, message = lines[-1].partition(": ")
            return f"{kind.rsplit('.', 1)[-1]}: {message}" if sep else lines[-1]
    if "org.apache." in text or "java." in text:
        first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
        first = re.sub(r"\b(?:org\.apache|java|scala|py4j)(?:\.\w+)+(?:\$\w+)*:?\s*", "", first)
        return first.strip() or "the Spark job failed"
    return f"{type(exc).__name__}: {text}"


def is_name_error(exc: OSError) -> bool:
    """An OSError from a topic that cannot be a directory name (the dispatcher skips those
    records: ``dispatch.RECORD_ERRNOS``), not from the disk."""
    return exc.errno in (errno.ENAMETOOLONG, errno.EINVAL)
