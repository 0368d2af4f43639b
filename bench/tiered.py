"""Tiered storage benchmark against an S3-compatible server on loopback (moto's server mode,
through s3fs over HTTP), each figure against a baseline measured in the same run.

    python bench/tiered.py [--quick] [--messages N] [--lookups N] [--dir DIR]

Prints one JSON object per line:

* ``env``: interpreter and counts;

Tier and baseline talk to the server through the same ``s3fs`` client (made and connected
before anything is timed): a broker makes its client once, and the first request of a new one
(credentials, endpoint, connection: 0.2-0.5 s here) is not what either figure is about. The
server (``python -m moto.server``) runs in a process of its own on loopback, as a real S3 is
another machine: it does not share this process's GIL with the uploader or the baseline
client, and its CPU time is measured apart (``/proc/PID/stat``).
* ``upload``: MB/s of ``tier flush`` (local records read, CommitLog parts and ConsumeQueue
  parts uploaded, keys indexed, the index file sealed and uploaded) against a bare ``s3fs``
  put of the same bytes (every object the flush wrote: CommitLog, ConsumeQueue and index) as
  objects of the same sizes to the same server; ``ratio`` = tier / bare (issue target >= 0.7).
  Each queue's first batch (its files created in the tier). Also the CPU seconds per MB of
  each side, median of the rounds: this process's (``*_cpu_s_per_mb``: the uploader, or the
  bare client) and the server's (``*_server_cpu_s_per_mb``); the S3 requests each side sent
  in its last round, by operation (``*_requests``); and the median over rounds of the
  bare/tier wall ratio of the two runs of a round (``median_round_ratio``: a round's two runs
  are back to back, so on a shared machine it moves less than the ratio of the bests);
* ``upload_steady``: the same for a queue's later batches: a store whose queues already have
  their tier files (one message each, flushed first) uploads the same number of messages;
* ``cold_read``: messages/s of a sequential read of every queue from the tier, 32 messages a
  read, with a fresh fetcher, with read-ahead (``read_ahead``) and without (``no_read_ahead``),
  against a bare ranged read of the same CommitLog objects in read-ahead-sized ranges, split
  into records (``ratio`` = tier / bare; issue target >= 0.5 with read-ahead), and the
  read-ahead cache's hit ratio;
* ``key_lookup``: key lookups per second on uploaded (sealed) index files, index only and with
  the record read from the tier, against the local index's lookups of the same keys; and the
  object reads per lookup, cold (first lookup of a file: header and slot table) and warm
  (issue target: one ranged read per lookup).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench-secret")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")

from stratamq import tiered  # noqa: E402
from stratamq.config import StoreConfig  # noqa: E402
from stratamq.message import Message  # noqa: E402
from stratamq.store.filter import TagFilter  # noqa: E402
from stratamq.store.message_store import MessageStore  # noqa: E402
from stratamq.store.read_chain import ReadRequest  # noqa: E402
from stratamq.tiered.drivers.object_store import list_parts  # noqa: E402

TOPIC = "Bench"
QUEUES = 4
BODY = b"x" * 1024
FULL = {"messages": 40_000, "lookups": 5_000, "repeat": 3}
QUICK = {"messages": 8_000, "lookups": 1_000, "repeat": 2}


def emit(row: dict) -> None:
    out = {k: (round(v, 4) if isinstance(v, float) and abs(v) < 100 else
               round(v, 1) if isinstance(v, float) else v) for k, v in row.items()}
    print(json.dumps(out), flush=True)


class S3Process:
    """moto's S3 server as a process of its own on a free loopback port."""

    def __init__(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while True:  # polled until it listens
            if self.proc.poll() is not None:
                raise RuntimeError(f"moto server exited with {self.proc.returncode}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("moto server did not listen within 60 s") from None
                time.sleep(0.05)

    def cpu_seconds(self) -> float:
        """User + system CPU time the server process used so far."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Requests:
    """S3 operations the shared client sends, by name (a botocore event hook: every request
    of the tier and of the baseline goes through it)."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def attach(self, fs) -> None:
        fs.s3.meta.events.register("before-parameter-build.s3", self._note)

    def _note(self, model, **_kw) -> None:
        self.counts[model.name] += 1


REQUESTS = Requests()


class Meter:
    """Wall seconds, this process's CPU seconds and the server's, and the S3 requests sent,
    of one timed step."""

    def __init__(self, server: S3Process) -> None:
        self.server = server

    def __enter__(self) -> Meter:
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        self.server_cpu = self.server.cpu_seconds()
        self.requests = Counter(REQUESTS.counts)
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.wall
        self.cpu = time.process_time() - self.cpu
        self.server_cpu = self.server.cpu_seconds() - self.server_cpu
        self.requests = REQUESTS.counts - self.requests


def config(root: Path, endpoint: str, bucket: str, **extra) -> StoreConfig:
    return StoreConfig(**{
        "store_path_root_dir": str(root), "mapped_file_size_commit_log": 64 * 1024 * 1024,
        "tiered_backend_service_provider": "s3", "tiered_store_file_path": f"s3://{bucket}/t",
        "tiered_store_s3_endpoint": endpoint,
        "tiered_store_index_file_max_hash_slot_num": 50_000,
        "tiered_store_index_file_max_index_num": 40_000,
        # Every flush seals the index file it wrote (as before RocketMQ's idle rule): the
        # upload figures include sealing and uploading it, and the lookups need sealed files.
        "tiered_store_index_file_rolling_idle_interval": 0, **extra})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--messages", type=int)
    ap.add_argument("--lookups", type=int)
    ap.add_argument("--repeat", type=int)
    ap.add_argument("--dir")
    args = ap.parse_args()
    sizes = dict(QUICK if args.quick else FULL)
    for key in sizes:
        if getattr(args, key) is not None:
            sizes[key] = getattr(args, key)
    work = Path(tempfile.mkdtemp(prefix="bench-tiered-", dir=args.dir))
    server = S3Process()
    try:
        run(work, server, sizes)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


def tier_parts(fs, tier) -> list[tuple[str, int]]:
    """(object name, size) of every part the tier holds: CommitLog, ConsumeQueue, index."""
    files = [f for flat in tier.files.files()
             for f in (*flat.commit_log.segments, *flat.consume_queue.segments)]
    if tier.index is not None:  # the sealed index files the flush uploaded: tier bytes too
        files += list(tier.index.flat.segments)
    return [(f"{f.path}/{pos}", size) for f in files for pos, size in list_parts(fs, f.path)]


def upload_once(cfg: StoreConfig, fs, server: S3Process, n: int, *, warm: bool = False):
    """A store of ``n`` messages, then ``tier flush`` measured: (store, tier, part sizes,
    meter). ``warm``: each queue's tier files made first (one message each, flushed), so the
    measured flush is a queue's later batch."""
    store = MessageStore(cfg)
    tier = tiered.wire(store, cluster="DefaultCluster", broker="broker-a", background=False,
                       fs=fs)
    assert tier is not None and tier.uploader is not None
    store.open()
    before: set[tuple[str, int]] = set()
    if warm:
        for q in range(QUEUES):
            assert store.put_message(Message(TOPIC, BODY, q, {"KEYS": f"warm-{q}"})).ok
        assert store.wait_dispatched(60)
        store.flush()
        assert tier.flush(600), "tier flush did not complete"
        before = set(tier_parts(fs, tier))
    for i in range(n):  # one put per message keeps each message its own record
        assert store.put_message(Message(TOPIC, BODY, i % QUEUES, {"KEYS": f"key-{i}"})).ok
    assert store.wait_dispatched(60)
    store.flush()
    with Meter(server) as meter:
        assert tier.flush(600), "tier flush did not complete"
    parts = [size for name, size in tier_parts(fs, tier) if (name, size) not in before]
    return store, tier, parts, meter


def bare_put(fs, server: S3Process, parts: list[int], prefix: str) -> Meter:
    payload = os.urandom(max(parts))
    with Meter(server) as meter:
        for i, size in enumerate(parts):
            fs.pipe_file(f"{prefix}/{i:08d}", payload[:size])
    return meter


def upload_row(name: str, parts: list[int], tier_m: list[Meter], bare_m: list[Meter],
               repeat: int) -> dict:
    total = sum(parts)
    mb = total / 1e6
    tier_best = max(mb / m.wall for m in tier_m)
    bare_best = max(mb / m.wall for m in bare_m)

    def per_mb(meters: list[Meter], attr: str) -> float:
        return statistics.median(getattr(m, attr) for m in meters) / mb

    return {"bench": name, "objects": len(parts), "bytes": total, "tier_mb_s": tier_best,
            "bare_s3fs_put_mb_s": bare_best, "ratio": tier_best / bare_best, "target": 0.7,
            "repeat": repeat, "tier_cpu_s_per_mb": per_mb(tier_m, "cpu"),
            "bare_cpu_s_per_mb": per_mb(bare_m, "cpu"),
            "tier_server_cpu_s_per_mb": per_mb(tier_m, "server_cpu"),
            "bare_server_cpu_s_per_mb": per_mb(bare_m, "server_cpu"),
            "tier_requests": dict(sorted(tier_m[-1].requests.items())),
            "bare_requests": dict(sorted(bare_m[-1].requests.items())),
            "median_round_ratio": statistics.median(b.wall / t.wall for t, b in
                                                    zip(tier_m, bare_m, strict=True))}


def run(work: Path, server: S3Process, sizes: dict[str, int]) -> None:
    import s3fs

    endpoint = server.endpoint
    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": endpoint}, skip_instance_cache=True,
                           use_listings_cache=False)
    fs.mkdir("bench")
    REQUESTS.attach(fs)
    n = sizes["messages"]
    emit({"bench": "env", "python": platform.python_version(), "machine": platform.machine(),
          "messages": n, "body_bytes": len(BODY), "queues": QUEUES, "lookups": sizes["lookups"],
          "s3": "moto server (its own process) on loopback, s3fs over HTTP"})
    repeat = sizes["repeat"]
    rows = {}
    for warm in (False, True):
        tier_m, bare_m = [], []
        for r in range(repeat):  # alternating tier and bare: the machine is shared
            tag = f"{'w' if warm else ''}{r}"
            cfg = config(work / f"store{tag}", endpoint, "bench",
                         tiered_store_file_path=f"s3://bench/t{tag}")
            store, tier, parts, meter = upload_once(cfg, fs, server, n, warm=warm)
            tier_m.append(meter)
            bare_m.append(bare_put(fs, server, parts, f"bench/bare{tag}"))
            if warm or r < repeat - 1:
                store.close()
                tier.close()
            else:  # read back below
                kept = (cfg, store, tier)
        rows[warm] = upload_row("upload_steady" if warm else "upload", parts, tier_m, bare_m,
                                repeat)
    emit(rows[False])
    emit(rows[True])
    cfg, store, tier = kept

    # -- cold sequential reads ------------------------------------------------------------------
    local_keys = [f"key-{random.randrange(n)}" for _ in range(sizes["lookups"])]
    t0 = time.perf_counter()
    # The local index alone (the read chain would ask the tier too).
    local_hits = sum(len(store.local_source.query_by_key(TOPIC, k, 1, 0, 2**62))
                     for k in local_keys)
    local_lookup_s = time.perf_counter() - t0
    store.close()
    tier.close()
    rates = {"read_ahead": 0.0, "no_read_ahead": 0.0}
    hit_ratio = 0.0
    bare_read = 0.0
    base = {"tiered_store_file_path": cfg.tiered_store_file_path}
    for _ in range(repeat):
        for name, extra in (("read_ahead", base),
                            ("no_read_ahead", {**base, "read_ahead_cache_enable": False})):
            rate, hits = cold_read(config(cfg.root, endpoint, "bench", **extra), n, fs)
            rates[name] = max(rates[name], rate)
            hit_ratio = hits if name == "read_ahead" else hit_ratio
        bare_read = max(bare_read, bare_ranged_read(cfg, fs))
    emit({"bench": "cold_read", "messages": n, "read_ahead_msgs_per_s": rates["read_ahead"],
          "no_read_ahead_msgs_per_s": rates["no_read_ahead"],
          "bare_ranged_read_msgs_per_s": bare_read,
          "ratio": rates["read_ahead"] / bare_read,
          "no_read_ahead_ratio": rates["no_read_ahead"] / bare_read, "target": 0.5,
          "read_ahead_hit_ratio": hit_ratio, "repeat": repeat})
    key_lookups(cfg, fs, n, sizes, local_keys, local_hits, local_lookup_s)


def cold_read(cfg: StoreConfig, n: int, fs) -> tuple[float, float]:
    """Every queue read sequentially, 32 messages a read, by a fresh fetcher (an empty
    read-ahead cache; the S3 client is the baseline's): (msgs/s, the read-ahead cache's hit
    ratio)."""
    reader = tiered.TieredStore(cfg, "DefaultCluster", "broker-a", read_only=True, fs=fs)
    got = 0
    t0 = time.perf_counter()
    for q in range(QUEUES):
        offset = 0
        while True:
            res = reader.fetcher.read(ReadRequest(TOPIC, q, offset, 32, 1 << 30,
                                                  TagFilter(None)))
            if res is None or not res.records:
                break
            got += len(res.records)
            offset = res.next_begin_offset
    rate = got / (time.perf_counter() - t0)
    assert got == n, got
    hits = reader.fetcher.cache.hit_ratio()
    reader.close()
    return rate, hits


def bare_ranged_read(cfg: StoreConfig, fs) -> float:
    """The same CommitLog objects read in ranges of the read-ahead's size, split into
    records: msgs/s."""
    import struct

    size_of = struct.Struct(">i")
    reader = tiered.TieredStore(cfg, "DefaultCluster", "broker-a", read_only=True, fs=fs)
    chunk = min(cfg.read_ahead_message_size_threshold,
                cfg.read_ahead_message_count_threshold * (len(BODY) + 200))
    got = 0
    t0 = time.perf_counter()
    for flat in reader.files.files():
        for seg in flat.commit_log.segments:
            for pos, size in list_parts(fs, seg.path):
                name = f"{seg.path}/{pos:020d}"
                for start in range(0, size, chunk):
                    data = fs.cat_file(name, start=start, end=min(size, start + chunk))
                    at = 0
                    while at + 4 <= len(data):
                        length = size_of.unpack_from(data, at)[0]
                        if at + length > len(data):
                            break
                        got += 1
                        at += length
    rate = got / (time.perf_counter() - t0)
    reader.close()
    return rate


def key_lookups(cfg: StoreConfig, fs, n: int, sizes: dict[str, int], local_keys: list[str],
                local_hits: int, local_lookup_s: float) -> None:
    reader = tiered.TieredStore(cfg, "DefaultCluster", "broker-a", read_only=True, fs=fs)
    # -- key lookups on uploaded (sealed) index files ----------------------------------------------
    index = reader.index
    assert index is not None and index.uploaded and not any(f.item_count for f in index.unsealed)
    keys = [f"key-{random.randrange(n)}" for _ in range(sizes["lookups"])]
    before = index.reads
    index.query(TOPIC, keys[0], 1, 0, 2**62)
    cold_reads = index.reads - before
    for k in keys[:200]:  # every file's header and slot table once
        index.query(TOPIC, k, 1, 0, 2**62)
    before = index.reads
    files_asked = 0
    t0 = time.perf_counter()
    for k in keys:
        hits = index.query(TOPIC, k, 1, 0, 2**62)
        assert hits, k
    index_s = time.perf_counter() - t0
    warm_reads = (index.reads - before) / len(keys)
    files_asked = len(index.uploaded)
    t0 = time.perf_counter()
    found = sum(len(reader.fetcher.query_by_key(TOPIC, k, 1, 0, 2**62)) for k in keys)
    full_s = time.perf_counter() - t0
    assert found == len(keys) and local_hits == len(local_keys)
    local_rate = len(local_keys) / local_lookup_s
    # Bare: one small ranged GET of an index object per lookup, the floor of any lookup that
    # reads the tier once.
    seg = index.uploaded[0].segment
    part = f"{seg.path}/{0:020d}"
    t0 = time.perf_counter()
    for i in range(len(keys)):
        fs.cat_file(part, start=(i * 28) % 4096, end=(i * 28) % 4096 + 56)
    bare_get = len(keys) / (time.perf_counter() - t0)
    emit({"bench": "key_lookup", "uploaded_index_files": files_asked,
          "index_lookups_per_s": len(keys) / index_s,
          "bare_ranged_get_per_s": bare_get,
          "ratio": (len(keys) / index_s) / bare_get,
          "lookups_with_record_per_s": len(keys) / full_s,
          "local_index_lookups_per_s": local_rate,
          "object_reads_per_lookup_warm": warm_reads,
          "object_reads_per_lookup_per_file_warm": warm_reads / max(1, files_asked),
          "object_reads_first_lookup_cold": cold_reads, "target_reads_per_file": 1})
    reader.close()


if __name__ == "__main__":
    sys.exit(main())
