"""Throughput of the embedded store, and the raw ``mmap`` copy it is measured against.

* ``run_store_bench``: one writer thread puts N messages (singly or in batches), waits for the
  ConsumeQueues to catch up, flushes, then reads every message back with ``get_messages``.
* ``run_recovery_bench``: writes a store, fakes a crash (``abort`` present, checkpoint zeroed so
  recovery scans from the first segment) and times ``MessageStore.open()``.
* ``raw_mmap_baseline``: the same record bytes copied into an ``mmap`` of a pre-allocated file
  by a bare Python loop: the most a pure-Python appender could do on this machine.

Messages carry what a RocketMQ producer sends (``TAGS``, ``KEYS``, a 32-hex-digit ``UNIQ_KEY``,
``WAIT``), and every record of a run has the same size. Figures are in messages per second and
MB (10**6 bytes) per second of record bytes (header + body + topic + properties). Message
objects are built before the clock starts: the figures are the store's, not the producer's.
"""

from __future__ import annotations

import gc
import math
import mmap
import os
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from stratamq import record as codec
from stratamq.config import OS_PAGE_SIZE, FlushDiskType, StoreConfig
from stratamq.message import Host, Message, Prop
from stratamq.store.message_store import MessageStore
from stratamq.store.results import GetMessageStatus

__all__ = ["raw_mmap_baseline", "run_recovery_bench", "run_store_bench", "warm_memory"]

BENCH_SEGMENT_SIZE = 256 * 1024 * 1024  # CommitLog segment size for benches (default is 1 GiB)
GET_MAX_COUNT = 32
TOPIC = "BenchTopic"
GROUP = "bench-consumer"
MB = 1_000_000
GIB = 1024**3

_BORN_HOST = Host("10.0.0.17", 52814)
_TAGS = ("TagA", "TagB", "TagC", "TagD")  # equal lengths: every record of a run has one size
_POOL = 64  # distinct bodies (and pre-encoded baseline records) cycled through
# RocketMQ's MessageClientIDSetter: ip (8 hex) + pid (4) + class-loader hash (8), then a time
# part (8) and a counter (4): 32 hex digits in all.
_UNIQ_PREFIX = f"0A000011{os.getpid() & 0xFFFF:04X}5F3C9A1E"
_FLUSH_TYPES = {"async": FlushDiskType.ASYNC_FLUSH, "sync": FlushDiskType.SYNC_FLUSH}


# -- the machine -------------------------------------------------------------------------------


def warm_memory(mib: int) -> dict:
    """Write one byte into every page of ``mib`` MiB of anonymous memory, then free it.

    On a VM whose host backs guest memory lazily, the first touch of a guest page costs far more
    than a later one (measured on the StrataMQ bench VM: ~11-15 us a page the first time,
    ~1.5 us after). Every put run writes a few hundred MB of new page cache, so without this
    whichever run first reaches untouched memory is slowed by up to 2x, by luck. The time
    taken is returned as a diagnostic: a high ``us_per_page`` means the memory was cold.
    """
    if mib <= 0:
        return {"warm_mib": 0, "warm_s": 0.0, "warm_us_per_page": 0.0}
    size = mib * 1024 * 1024
    t0 = time.perf_counter()
    with mmap.mmap(-1, size) as buf:
        for pos in range(0, size, mmap.PAGESIZE):
            buf[pos] = 1
    elapsed = time.perf_counter() - t0
    return {"warm_mib": mib, "warm_s": elapsed,
            "warm_us_per_page": elapsed / (size // mmap.PAGESIZE) * 1e6}


# -- inputs ------------------------------------------------------------------------------------


def _bodies(body_size: int) -> list[bytes]:
    rng = random.Random(body_size)
    return [rng.randbytes(body_size) for _ in range(_POOL)]


def _make_messages(start: int, count: int, body_size: int, topic_queues: int,
                   bodies: list[bytes] | None = None) -> list[Message]:
    bodies = bodies or _bodies(body_size)
    born = int(time.time() * 1000)
    out = []
    for i in range(start, start + count):
        properties = {
            Prop.TAGS: _TAGS[i % len(_TAGS)],
            Prop.KEYS: f"order-{i:012d}",
            Prop.UNIQ_KEY: f"{_UNIQ_PREFIX}{(i >> 16) & 0xFFFFFFFF:08X}{i & 0xFFFF:04X}",
            Prop.WAIT_STORE_MSG_OK: "true",
        }
        out.append(Message(
            topic=TOPIC, body=bodies[i % len(bodies)], queue_id=i % topic_queues,
            properties=properties, born_timestamp=born, born_host=_BORN_HOST,
        ))
    return out


def _chunks(items: Sequence, size: int) -> list:
    return [items[i : i + size] for i in range(0, len(items), size)]


def _bench_config(root: Path, flush: str) -> StoreConfig:
    try:
        flush_type = _FLUSH_TYPES[flush]
    except KeyError:
        raise ValueError(f"flush must be one of {sorted(_FLUSH_TYPES)}, not {flush!r}") from None
    return StoreConfig(
        store_path_root_dir=str(root),
        mapped_file_size_commit_log=BENCH_SEGMENT_SIZE,
        flush_disk_type=flush_type,
    )


@contextmanager
def _scratch_dir(store_dir: str | None, prefix: str) -> Iterator[Path]:
    """A fresh directory: under ``store_dir`` (kept afterwards) or in the temp dir (removed)."""
    if store_dir is not None:
        Path(store_dir).mkdir(parents=True, exist_ok=True)
        yield Path(tempfile.mkdtemp(prefix=prefix, dir=store_dir))
        return
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _rate(count: float, seconds: float) -> float:
    return count / seconds if seconds > 0 else math.inf


# -- put / dispatch / get ----------------------------------------------------------------------


def _put_singly(store: MessageStore, messages: list[Message]) -> None:
    put = store.put_message
    for msg in messages:
        result = put(msg)
        if not result.ok:
            raise RuntimeError(f"put failed: {result.status.value} {result.error}")


def _put_batches(store: MessageStore, batches: list[list[Message]]) -> None:
    put = store.put_messages
    for batch in batches:
        result = put(batch)
        if not result.ok:
            raise RuntimeError(f"batch put failed: {result.status.value} {result.error}")


def _get_all(store: MessageStore, topic_queues: int) -> tuple[int, int]:
    """Read every queue from offset 0 to its end; return (records, bytes)."""
    get = store.get_messages
    found = GetMessageStatus.FOUND
    count = 0
    nbytes = 0
    for queue_id in range(topic_queues):
        offset = 0
        while True:
            result = get(GROUP, TOPIC, queue_id, offset, GET_MAX_COUNT)
            if result.status is not found:
                result.release()
                break
            count += len(result.records)
            nbytes += result.buffer_total_size
            offset = result.next_begin_offset
            result.release()
    return count, nbytes


def run_store_bench(messages: int, body_size: int, batch: int = 1, flush: str = "async",
                    store_dir: str | None = None, topic_queues: int = 4,
                    get_passes: int = 1) -> dict:
    """Put ``messages`` messages of ``body_size`` bytes from one thread (``batch`` per call;
    1 means ``put_message``), wait for dispatch, then read them all back ``get_passes`` times
    (the median pass is reported: one pass takes a fraction of a second and is noisy)."""
    if messages <= 0 or body_size < 0 or batch <= 0 or topic_queues <= 0 or get_passes <= 0:
        raise ValueError("messages, batch, topic_queues and get_passes must be positive, "
                         "body_size >= 0")
    msgs = _make_messages(0, messages, body_size, topic_queues)
    work: Callable[[MessageStore], None]
    if batch == 1:
        def work(store: MessageStore) -> None:
            _put_singly(store, msgs)
    else:
        batches = _chunks(msgs, batch)

        def work(store: MessageStore) -> None:
            _put_batches(store, batches)

    with _scratch_dir(store_dir, "stratamq-bench-") as root:
        store = MessageStore(_bench_config(root, flush)).open()
        try:
            record_size = len(store.commitlog.encode(msgs[0]).data)
            gc.collect()
            t0 = time.perf_counter()
            work(store)
            t1 = time.perf_counter()
            behind = store.dispatch_behind_bytes()
            if not store.wait_dispatched(timeout=600):
                raise RuntimeError("dispatch did not catch up within 600 s")
            t2 = time.perf_counter()
            store_bytes = store.max_physical_offset - store.min_physical_offset
            # Reads are timed on a quiet store: no background flush of the puts' dirty pages
            # competing for the two cores (that made the figure swing by 2x between runs).
            store.flush()
            passes = []
            for _ in range(get_passes):
                gc.collect()
                t3 = time.perf_counter()
                got, got_bytes = _get_all(store, topic_queues)
                passes.append(time.perf_counter() - t3)
                if got < messages:
                    raise RuntimeError(f"read back {got} of {messages} messages")
        finally:
            store.close()
    put_s, get_s = t1 - t0, statistics.median(passes)
    return {
        "messages": messages,
        "body_size": body_size,
        "batch": batch,
        "flush": flush,
        "topic_queues": topic_queues,
        "record_size": record_size,
        "store_bytes": store_bytes,
        "put_s": put_s,
        "put_msgs_per_s": _rate(messages, put_s),
        "put_mb_per_s": _rate(store_bytes / MB, put_s),
        "put_body_mb_per_s": _rate(messages * body_size / MB, put_s),
        "dispatch_behind_bytes_at_put_end": behind,
        "dispatch_lag_s": t2 - t1,
        "messages_read": got,
        "get_s": get_s,
        "get_msgs_per_s": _rate(got, get_s),
        "get_mb_per_s": _rate(got_bytes / MB, get_s),
        "get_msgs_per_s_passes": [_rate(got, p) for p in passes],
    }


# -- recovery ----------------------------------------------------------------------------------


def run_recovery_bench(store_bytes: int, body_size: int, store_dir: str | None = None,
                       repeat: int = 1, index: bool = True) -> dict:
    """Time ``open()`` of a ~``store_bytes`` store after a simulated crash.

    The store is closed cleanly (everything flushed), then ``abort`` is created and the
    checkpoint zeroed, so recovery treats the shutdown as a crash and scans, CRC checks and
    re-dispatches from the first segment. With ``repeat`` > 1 the same store is crashed and
    reopened that many times and the median time is reported. The page cache is warm (a process
    crash, not a power loss), so this measures recovery's CPU cost more than the disk's.

    ``index`` (``messageIndexEnable``): with the zeroed checkpoint, every index file is
    untrusted and the whole key index is rebuilt from the CommitLog, as after a real crash for
    the newest index file; without it, the figure is the CommitLog scan plus the ConsumeQueue
    replay alone.
    """
    if store_bytes <= 0 or repeat <= 0:
        raise ValueError("store_bytes and repeat must be positive")
    topic_queues = 4
    write_batch = 32
    bodies = _bodies(body_size)
    times: list[float] = []
    with _scratch_dir(store_dir, "stratamq-recovery-") as root:
        config = _bench_config(root, "async")
        config.message_index_enable = index
        written = 0
        store = MessageStore(config).open()
        try:
            while store.max_physical_offset < store_bytes:
                batch = _make_messages(written, write_batch, body_size, topic_queues, bodies)
                result = store.put_messages(batch)
                if not result.ok:
                    raise RuntimeError(f"put failed: {result.status.value} {result.error}")
                written += len(batch)
            log_bytes = store.max_physical_offset
        finally:
            store.close()
        segments = len(list(store.layout.commitlog_dir.iterdir()))
        for _ in range(repeat):
            store.layout.abort.touch()
            store.layout.checkpoint.write_bytes(bytes(OS_PAGE_SIZE))
            gc.collect()
            t0 = time.perf_counter()
            recovered = MessageStore(config).open()
            times.append(time.perf_counter() - t0)
            try:
                report = recovered.recovery
                readable = sum(
                    recovered.get_max_offset_in_queue(TOPIC, q) for q in range(topic_queues)
                )
            finally:
                recovered.close()
            if report is None or not report.abnormal or report.start_offset != 0:
                raise RuntimeError(f"recovery did not scan from the first segment: {report}")
            if (report.records_scanned < written or readable < written
                    or report.end_offset < log_bytes):
                raise RuntimeError(
                    f"recovery lost data: wrote {written} records ({log_bytes} bytes), scanned "
                    f"{report.records_scanned}, {readable} readable, end {report.end_offset}"
                )
    recovery_s = statistics.median(times)
    assert report is not None  # set by every run above
    scanned = report.bytes_scanned
    return {
        "body_size": body_size,
        "index": index,
        "messages": written,
        "store_bytes": log_bytes,
        "segments": segments,
        "records_scanned": report.records_scanned,
        "bytes_scanned": scanned,
        "runs": repeat,
        "recovery_s": recovery_s,
        "recovery_s_runs": times,
        "recovery_mb_per_s": _rate(scanned / MB, recovery_s),
        "recovery_s_per_gib": recovery_s / (scanned / GIB) if scanned else math.nan,
    }


# -- the raw baseline --------------------------------------------------------------------------


def raw_mmap_baseline(messages: int, body_size: int, batch: int = 1, *, fsync: bool = False,
                      directory: str | None = None, topic_queues: int = 4) -> dict:
    """Copy ``messages`` pre-encoded records of the store's size for ``body_size`` into an mmap
    of a ``posix_fallocate``d file: one slice assignment per message (per ``batch`` records when
    ``batch`` > 1), plus one ``fdatasync`` after each when ``fsync`` is set."""
    if messages <= 0 or batch <= 0:
        raise ValueError("messages and batch must be positive")
    host = StoreConfig().store_host
    records = [
        bytes(codec.encode(m, host, max_message_size=1 << 30).data)
        for m in _make_messages(0, _POOL, body_size, topic_queues)
    ]
    blobs = [b"".join(records[(j * batch + k) % _POOL] for k in range(batch)) for j in range(_POOL)]
    full, rest = divmod(messages, batch)
    puts = [blobs[j % _POOL] for j in range(full)]
    if rest:
        puts.append(b"".join(records[k % _POOL] for k in range(rest)))
    total = sum(len(p) for p in puts)
    map_size = max(OS_PAGE_SIZE, -(-total // OS_PAGE_SIZE) * OS_PAGE_SIZE)

    fd, path = tempfile.mkstemp(prefix="stratamq-baseline-", dir=directory)
    try:
        os.posix_fallocate(fd, 0, map_size)
        with mmap.mmap(fd, map_size, access=mmap.ACCESS_WRITE) as buf:
            gc.collect()
            t0 = time.perf_counter()
            pos = 0
            if fsync:
                fdatasync = os.fdatasync
                for blob in puts:
                    end = pos + len(blob)
                    buf[pos:end] = blob
                    pos = end
                    fdatasync(fd)
            else:
                for blob in puts:
                    end = pos + len(blob)
                    buf[pos:end] = blob
                    pos = end
            elapsed = time.perf_counter() - t0
    finally:
        os.close(fd)
        os.unlink(path)
    return {
        "messages": messages,
        "body_size": body_size,
        "batch": batch,
        "fsync": fsync,
        "record_size": len(records[0]),
        "bytes": total,
        "seconds": elapsed,
        "msgs_per_s": _rate(messages, elapsed),
        "mb_per_s": _rate(total / MB, elapsed),
    }
