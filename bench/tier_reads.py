"""The cost of checking tier records before they are served (issue 26, item 6), on cold reads
of a POSIX tier, against the same reads with the checks off, in the same run.

    python bench/tier_reads.py [--quick] [--messages N] [--repeat N] [--dir DIR]
                               [--skip-broker] [--broker-only]

Prints one JSON object per line:

* ``env``: interpreter and counts;
* ``cold_read_checks``: messages/s of a sequential read of every queue from the tier, 32
  messages a read, by a fresh fetcher (an empty read-ahead cache: every record is read from
  the tier's files and checked once), with the checks (``checked_msgs_per_s``: body CRC,
  topic, queue id and queue offset of every record, ``record.copy_check``) and without
  (``unchecked_msgs_per_s``: ``TierFetcher.check_records = False``, the read path as it was
  before the checks), with read-ahead (the default) and without (``no_read_ahead_*``: each read
  goes to the tier and is checked itself), for three uses of what is read: ``decode`` (each
  record decoded into a message, as ``PullMessage`` and pop consumers are served: the cold
  read a consumer sees), ``records`` (each record's bytes copied, as the Spark source's raw
  ``PullMessage`` is served) and ``none`` (the records only located, never touched: the
  fetcher alone, where the checks weigh the most). Rates are messages per CPU second of this
  process (the reads are CPU-bound here, and on a shared machine wall time mostly measures
  the neighbours). ``ratio`` = checked / unchecked, best of ``repeat`` rounds each, the two
  run back to back in every round; ``median_round_ratio`` is the median of the rounds' own
  ratios. Target: ``ratio`` >= 0.9.

* ``broker_cold_pull``: the same reads as a user sees them, through a real broker process
  (``stratamq broker start``): a consumer pulls every queue from offset 0 with ``PullMessage``
  over gRPC (batch 32, one call at a time), after ``store clean --tiered-only`` removed the
  local CommitLog files holding them, so every message comes from the tier. One broker with
  the checks, one on the same data without (``STRATAMQ_BENCH_UNCHECKED_TIER_READS=1``, a
  switch of the benchmark only), each a fresh process per round (an empty read-ahead cache),
  the two alternating which goes first. ``*_msgs_per_s``: wall-clock rate the consumer got;
  ``*_broker_cpu_us_per_msg``: the broker's CPU (user + system) per message; ``ratio`` =
  checked / unchecked msgs/s and ``cpu_ratio`` = unchecked / checked broker CPU per message
  (both < 1 when the checks cost), each the median of the rounds' own ratios.

A POSIX tier on local disk, whose files stay in the page cache, is the case where the checks
weigh the most: no network time hides them (on S3, ``bench/tiered.py``'s ``cold_read``, each
read-ahead waits for a GET).
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from stratamq import tiered
from stratamq.config import StoreConfig
from stratamq.message import Message
from stratamq.store.filter import TagFilter
from stratamq.store.message_store import MessageStore
from stratamq.store.read_chain import ReadRequest
from stratamq.tiered.fetcher import UNCHECKED_READS_ENV

TOPIC = "Bench"
FILLER = "BenchFiller"
QUEUES = 4
BODY = bytes(range(256)) * 4  # 1 KiB
FULL = {"messages": 40_000, "repeat": 5}
QUICK = {"messages": 20_000, "repeat": 3}


def emit(row: dict) -> None:
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}),
          flush=True)


def config(root: Path, **extra) -> StoreConfig:
    return StoreConfig(**{
        "store_path_root_dir": str(root / "store"), "mapped_file_size_commit_log": 64 << 20,
        "tiered_backend_service_provider": "posix",
        "tiered_store_file_path": str(root / "tier"), **extra})


def build(root: Path, n: int, **extra) -> int:
    """``n`` messages in ``TOPIC``, uploaded to the tier; returns where they end in the
    CommitLog."""
    store = MessageStore(config(root, **extra))
    tier = tiered.wire(store, cluster="DefaultCluster", broker="broker-a", background=False)
    assert tier is not None
    store.open()
    try:
        for i in range(n):
            msg = Message(TOPIC, BODY, i % QUEUES, {"KEYS": f"key-{i}", "TAGS": f"t{i % 3}"})
            assert store.put_message(msg).ok
        end = store.max_physical_offset
        # Filler past them, so that the file being written holds none of them.
        for _ in range(extra.get("mapped_file_size_commit_log", 0) // len(BODY) + 16):
            assert store.put_message(Message(FILLER, BODY, 0, {})).ok
        assert store.wait_dispatched(120)
        store.flush()
        assert tier.flush(600), "tier flush did not complete"
    finally:
        store.close()
        tier.close()
    return end


def cold_read(cfg: StoreConfig, n: int, checked: bool, use: str) -> float:
    """Every queue read sequentially, 32 messages a read, by a fresh fetcher: msgs/s.
    ``use``: what is done with each record served (see the module docstring)."""
    reader = tiered.TieredStore(cfg, "DefaultCluster", "broker-a", read_only=True)
    reader.fetcher.check_records = checked
    got = 0
    t0 = time.process_time()
    for q in range(QUEUES):
        offset = 0
        while True:
            res = reader.fetcher.read(ReadRequest(TOPIC, q, offset, 32, 1 << 30,
                                                  TagFilter(None)))
            if res is None or not res.records:
                break
            got += len(res.records)
            if use == "records":
                for rec in res.records:
                    bytes(rec.buffer)
            elif use == "decode":
                for _msg in res.messages():
                    pass
            offset = res.next_begin_offset
            res.release()
    rate = got / (time.process_time() - t0)
    assert got == n, got
    assert reader.fetcher.damage.corrupt_records == 0
    reader.close()
    return rate


def in_process(work: Path, n: int, repeat: int) -> None:
    """The ``cold_read_checks*`` lines: a fetcher in this process."""
    build(work, n)
    for name, extra in (("cold_read_checks", {}),
                        ("cold_read_checks_no_read_ahead",
                         {"read_ahead_cache_enable": False})):
        cfg = config(work, **extra)
        for use in ("decode", "records", "none"):
            checked, unchecked, rounds = [], [], []
            for r in range(repeat):  # alternating which goes first: the machine is shared
                order = (True, False) if r % 2 == 0 else (False, True)
                rates = {c: cold_read(cfg, n, c, use) for c in order}
                checked.append(rates[True])
                unchecked.append(rates[False])
                rounds.append(rates[True] / rates[False])
            emit({"bench": name, "use": use, "messages": n,
                  "checked_msgs_per_s": max(checked),
                  "unchecked_msgs_per_s": max(unchecked),
                  "ratio": max(checked) / max(unchecked),
                  "median_round_ratio": statistics.median(rounds), "target": 0.9,
                  "repeat": repeat})



# -- through a broker ------------------------------------------------------------------------------

BROKER_SEGMENT = 1 << 20  # small CommitLog files: all but the filler's leave the local disk


def broker_data(root: Path, n: int) -> Path:
    """A store whose ``n`` messages only the tier holds (local CommitLog files cleaned), and
    the broker.conf to serve it; returns the conf."""
    from stratamq.broker.metadata import MetadataStore

    end = build(root, n, mapped_file_size_commit_log=BROKER_SEGMENT)
    meta = MetadataStore(root / "store")
    meta.create_topic(TOPIC, QUEUES, "NORMAL")
    meta.create_topic(FILLER, 1, "NORMAL")
    conf = root / "broker.conf"
    conf.write_text(f"mappedFileSizeCommitLog={BROKER_SEGMENT}\nhaListenPort=0\n"
                    "tieredBackendServiceProvider=posix\n"
                    f"tieredStoreFilePath={root / 'tier'}\n")
    out = subprocess.run([sys.executable, "-m", "stratamq.cli", "store", "clean", "--store",
                          str(root / "store"), "--config", str(conf), "--tiered-only"],
                         check=True, capture_output=True, text=True).stdout
    cleaned = json.loads(out.strip().splitlines()[-1])
    assert cleaned["min_offset"] >= end, f"local files still hold the messages: {cleaned}"
    return conf


def pull_all(endpoint: str, n: int) -> int:
    """Every queue of ``TOPIC`` from offset 0 with ``PullMessage`` (batch 32): messages got."""
    import grpc
    from rocketmq.grpc_protocol import definition_pb2 as pb
    from rocketmq.grpc_protocol import service_pb2 as svc
    from rocketmq.grpc_protocol import service_pb2_grpc

    got = 0
    with grpc.insecure_channel(endpoint) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        for q in range(QUEUES):
            queue = pb.MessageQueue(topic=pb.Resource(name=TOPIC), id=q)
            offset, end = 0, n // QUEUES + (q < n % QUEUES)
            while offset < end:
                request = svc.PullMessageRequest(
                    group=pb.Resource(name="BenchReplay"), offset=offset, batch_size=32,
                    message_queue=queue,
                    filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"))
                request.long_polling_timeout.FromMilliseconds(0)
                nxt = offset
                for reply in stub.PullMessage(request, timeout=60):
                    kind = reply.WhichOneof("content")
                    if kind == "message":
                        got += 1
                    elif kind == "next_offset":
                        nxt = reply.next_offset
                assert nxt > offset, f"queue {q} stuck at {offset}"
                offset = nxt
    return got


def broker_round(conf: Path, root: Path, n: int, checked: bool) -> tuple[float, float]:
    """A fresh broker (checks on or off) serving every message once from the tier: (msgs/s,
    broker CPU seconds per message)."""
    from broker import Server  # bench/broker.py

    env = {} if checked else {UNCHECKED_READS_ENV: "1"}
    server = Server([sys.executable, "-m", "stratamq.cli", "broker", "start", "--config",
                     str(conf), "--store", str(root / "store"), "--listen", "127.0.0.1:0"],
                    env=env)
    try:
        cpu0, t0 = server.cpu_seconds(), time.perf_counter()
        got = pull_all(server.endpoint, n)
        wall, cpu = time.perf_counter() - t0, server.cpu_seconds() - cpu0
    finally:
        server.stop()
    assert got == n, (got, n)
    return got / wall, cpu / got


def broker_cold_pull(root: Path, n: int, repeat: int) -> None:
    conf = broker_data(root, n)
    rates: dict[bool, list[float]] = {True: [], False: []}
    cpus: dict[bool, list[float]] = {True: [], False: []}
    for r in range(repeat):  # alternating which goes first: the machine is shared
        for checked in ((True, False) if r % 2 == 0 else (False, True)):
            rate, cpu = broker_round(conf, root, n, checked)
            rates[checked].append(rate)
            cpus[checked].append(cpu)
    emit({"bench": "broker_cold_pull", "messages": n, "batch": 32,
          "checked_msgs_per_s": statistics.median(rates[True]),
          "unchecked_msgs_per_s": statistics.median(rates[False]),
          "checked_broker_cpu_us_per_msg": statistics.median(cpus[True]) * 1e6,
          "unchecked_broker_cpu_us_per_msg": statistics.median(cpus[False]) * 1e6,
          "ratio": statistics.median(c / u for c, u in zip(rates[True], rates[False])),
          "cpu_ratio": statistics.median(u / c for c, u in zip(cpus[True], cpus[False])),
          "target": 0.9, "repeat": repeat})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--messages", type=int)
    ap.add_argument("--repeat", type=int)
    ap.add_argument("--dir")
    ap.add_argument("--skip-broker", action="store_true", help="no broker_cold_pull")
    ap.add_argument("--broker-only", action="store_true", help="only broker_cold_pull")
    args = ap.parse_args()
    sizes = dict(QUICK if args.quick else FULL)
    for key in sizes:
        if getattr(args, key) is not None:
            sizes[key] = getattr(args, key)
    n, repeat = sizes["messages"], sizes["repeat"]
    work = Path(tempfile.mkdtemp(prefix="bench-tier-reads-", dir=args.dir))
    try:
        emit({"bench": "env", "python": platform.python_version(),
              "machine": platform.machine(), "messages": n, "body_bytes": len(BODY),
              "queues": QUEUES, "tier": "posix (local disk, page cache warm)"})
        if not args.broker_only:
            in_process(work, n, repeat)
        if not args.skip_broker:
            broker_cold_pull(work / "broker", n, repeat)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
