"""Tiered storage benchmark against an S3-compatible server on loopback (moto's server mode,
through s3fs over HTTP), each figure against a baseline measured in the same run.

    python bench/tiered.py [--quick] [--messages N] [--lookups N] [--dir DIR]

Prints one JSON object per line:

* ``env``: interpreter and counts;

Tier and baseline talk to the server through the same ``s3fs`` client (made and connected
before anything is timed): a broker makes its client once, and the first request of a new one
(credentials, endpoint, connection: 0.2-0.5 s here) is not what either figure is about.
* ``upload``: MB/s of ``tier flush`` (local records read, CommitLog parts and ConsumeQueue
  parts uploaded, keys indexed, the index file sealed and uploaded) against a bare ``s3fs``
  put of the same bytes (every object the flush wrote: CommitLog, ConsumeQueue and index) as
  objects of the same sizes to the same server; ``ratio`` = tier / bare (issue target >= 0.7);
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
import logging
import os
import platform
import random
import shutil
import socket
import sys
import tempfile
import time
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


def start_s3():
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    return server, f"http://127.0.0.1:{port}"


def config(root: Path, endpoint: str, bucket: str, **extra) -> StoreConfig:
    return StoreConfig(**{
        "store_path_root_dir": str(root), "mapped_file_size_commit_log": 64 * 1024 * 1024,
        "tiered_backend_service_provider": "s3", "tiered_store_file_path": f"s3://{bucket}/t",
        "tiered_store_s3_endpoint": endpoint,
        "tiered_store_index_file_max_hash_slot_num": 50_000,
        "tiered_store_index_file_max_index_num": 40_000, **extra})


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
    server, endpoint = start_s3()
    try:
        run(work, endpoint, sizes)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


def upload_once(cfg: StoreConfig, fs, n: int):
    """A store of ``n`` messages, then ``tier flush`` timed: (store, tier, bytes, part sizes,
    seconds)."""
    store = MessageStore(cfg)
    tier = tiered.wire(store, cluster="DefaultCluster", broker="broker-a", background=False,
                       fs=fs)
    assert tier is not None and tier.uploader is not None
    store.open()
    for i in range(n):  # one put per message keeps each message its own record
        assert store.put_message(Message(TOPIC, BODY, i % QUEUES, {"KEYS": f"key-{i}"})).ok
    assert store.wait_dispatched(60)
    store.flush()
    t0 = time.perf_counter()
    assert tier.flush(600), "tier flush did not complete"
    upload_s = time.perf_counter() - t0
    parts = []
    for flat in tier.files.files():
        for f in (*flat.commit_log.segments, *flat.consume_queue.segments):
            parts += [size for _pos, size in list_parts(fs, f.path)]
    if tier.index is not None:  # the sealed index file the flush uploaded: tier bytes too
        for f in tier.index.flat.segments:
            parts += [size for _pos, size in list_parts(fs, f.path)]
    return store, tier, sum(parts), parts, upload_s


def run(work: Path, endpoint: str, sizes: dict[str, int]) -> None:
    import s3fs

    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": endpoint}, skip_instance_cache=True,
                           use_listings_cache=False)
    fs.mkdir("bench")
    n = sizes["messages"]
    emit({"bench": "env", "python": platform.python_version(), "machine": platform.machine(),
          "messages": n, "body_bytes": len(BODY), "queues": QUEUES, "lookups": sizes["lookups"],
          "s3": "moto server on loopback, s3fs over HTTP"})
    repeat = sizes["repeat"]
    tier_best = bare_best = 0.0
    for r in range(repeat):  # alternating tier and bare: the machine is shared
        cfg = config(work / f"store{r}", endpoint, "bench",
                     tiered_store_file_path=f"s3://bench/t{r}")
        store, tier, total, parts, upload_s = upload_once(cfg, fs, n)
        payload = os.urandom(max(parts))
        t0 = time.perf_counter()
        for i, size in enumerate(parts):
            fs.pipe_file(f"bench/bare{r}/{i:08d}", payload[:size])
        bare_s = time.perf_counter() - t0
        tier_best = max(tier_best, total / upload_s / 1e6)
        bare_best = max(bare_best, total / bare_s / 1e6)
        if r < repeat - 1:
            store.close()
            tier.close()
    emit({"bench": "upload", "objects": len(parts), "bytes": total, "tier_mb_s": tier_best,
          "bare_s3fs_put_mb_s": bare_best, "ratio": tier_best / bare_best, "target": 0.7,
          "repeat": repeat})

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
