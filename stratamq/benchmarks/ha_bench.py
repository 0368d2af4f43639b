"""Replication benchmark (``bench/ha.py``): what replication costs a put, how fast a cold slave
catches up, and how far a slave trails under load.

The master store runs in the benchmark process; the slave is another process (``python -m
stratamq.benchmarks.ha_bench slave ...``) on loopback, as in production, so the two do not
share a GIL.

* ``put``: W writer threads put batches of B messages for T seconds with no replication, as an
  ASYNC_MASTER and as a SYNC_MASTER (a put returns once the slave acknowledged it); messages/s,
  MB/s and the p50/p99 latency of one batch put. While the ASYNC_MASTER runs, the slave's lag
  is sampled every 20 ms (bytes not acknowledged, and the age of the oldest such message).
* ``catch_up``: a slave with an empty store copies the master's whole CommitLog (MIN_OFFSET);
  MB/s from its request to its acknowledgement of the last byte (the bytes are in the slave's
  CommitLog: written to its mapped files, flushed by its flush service as any append), against
  a bare copy of the same bytes on loopback: the segment files sent with ``sendfile`` to a
  process that writes them to a file and answers when it has them all, run before and after
  the slave (the faster of the two is the baseline: the machine is shared). Reported apart:
  when the slave's dispatch (ConsumeQueues: what makes the bytes readable there) finished,
  which the slave process tells on its stdout (``time.monotonic`` is one clock for every
  process on Linux), and the CPU seconds each side spent (slave and master; each bare copy's
  sink and sender), which a shared machine's load does not skew as it skews MB/s.

The slave process runs with ``OPENBLAS_NUM_THREADS=1``: it stands for a broker, whose numpy
(and OpenBLAS's start-up spin, ~0.1 s of a core) is loaded with the CLI long before its slave
connects, where this helper's would be loaded just before the catch-up it measures.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import NamedTuple

from stratamq.config import BrokerRole, StoreConfig
from stratamq.ha import HAService
from stratamq.message import Message
from stratamq.store.message_store import MessageStore

__all__ = ["run_catch_up", "run_puts"]

MB = 1_000_000
TOPIC = "HaBench"
_BODY = b"r" * 1024


def _config(root: Path, role: str, segment: int, **extra: object) -> StoreConfig:
    return StoreConfig(store_path_root_dir=str(root), mapped_file_size_commit_log=segment,
                       broker_role=BrokerRole(role), ha_listen_port=0,
                       message_index_enable=False, **extra)  # type: ignore[arg-type]


def _start_slave(root: Path, master_port: int, segment: int, watch_end: int = 0,
                 dispatch_along: bool = False) -> subprocess.Popen:
    # numpy's OpenBLAS starts a thread that spins for ~0.1 s of CPU once numpy is loaded. A
    # broker loads numpy with the package's CLI, long before its slave connects; this helper
    # would load it in HAClient.start, just before, and the spin would land on a core in the
    # first tenth of a second of the catch-up measured. Nothing here uses BLAS.
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "stratamq.benchmarks.ha_bench", "slave", str(root),
         f"127.0.0.1:{master_port}", str(segment), str(watch_end), str(int(dispatch_along))],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE if watch_end else subprocess.DEVNULL,
        text=True, env=env)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"benchmark: timed out waiting for {what}")
        time.sleep(0.005)


def run_puts(mode: str, *, seconds: float, writers: int, batch: int, segment: int,
             workdir: Path) -> dict:
    """One put run: ``mode`` is none, ASYNC_MASTER or SYNC_MASTER."""
    root = workdir / f"put-{mode}"
    role = "ASYNC_MASTER" if mode == "none" else mode
    store = MessageStore(_config(root / "master", role, segment)).open()
    ha = slave = None
    lag_samples: list[tuple[int, int]] = []
    try:
        if mode != "none":
            ha = HAService.for_store(store)
            ha.start()
            assert ha.server is not None
            slave = _start_slave(root / "slave", ha.server.port, segment)
            server = ha.server
            _wait(lambda: bool(server.links) and server.links[0].proto.plan is not None, 60,
                  "the slave to connect")
        latencies: list[float] = []
        counts = [0] * writers
        stop = threading.Event()
        failures: list[str] = []

        def write(i: int) -> None:
            msgs = [Message(TOPIC, _BODY, (i + j) % 8) for j in range(batch)]
            mine: list[float] = []
            while not stop.is_set():
                for m in msgs:
                    m.properties = {}
                t0 = time.perf_counter()
                result = store.put_messages(msgs)
                mine.append(time.perf_counter() - t0)
                if not result.ok:
                    failures.append(str(result.status))
                    return
                counts[i] += batch
            latencies.extend(mine)

        threads = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
        start_end = store.commitlog.max_offset
        started = time.perf_counter()
        for t in threads:
            t.start()
        deadline = started + seconds
        while time.perf_counter() < deadline:
            if ha is not None and ha.server is not None and ha.server.links:
                info = ha.server.links[0].runtime_info(
                    store.commitlog.max_offset, int(time.time() * 1000), ha.store_time_at)
                lag_samples.append((info["diff"], info["lagMs"]))
            time.sleep(0.02)
        stop.set()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - started
        if failures:
            raise RuntimeError(f"{mode}: a put failed: {failures[0]}")
        written = store.commitlog.max_offset - start_end
        messages = sum(counts)
        lat = sorted(latencies)
        out = {
            "bench": "put", "mode": mode, "writers": writers, "batch": batch,
            "body_bytes": len(_BODY), "seconds": round(elapsed, 2), "messages": messages,
            "msgs_per_s": round(messages / elapsed), "mb_per_s": round(written / elapsed / MB, 1),
            "p50_ms": round(lat[len(lat) // 2] * 1000, 3),
            "p99_ms": round(lat[int(len(lat) * 0.99)] * 1000, 3),
        }
        if lag_samples:
            lags = sorted(b for b, _ in lag_samples)
            ages = sorted(ms for _, ms in lag_samples)
            out["lag"] = {"samples": len(lags), "bytes_p50": lags[len(lags) // 2],
                          "bytes_p99": lags[int(len(lags) * 0.99)], "bytes_max": lags[-1],
                          "ms_p50": ages[len(ages) // 2], "ms_p99": ages[int(len(ages) * 0.99)],
                          "ms_max": ages[-1]}
        return out
    finally:
        if slave is not None:
            _stop(slave)
        if ha is not None:
            ha.shutdown()
        store.close()
        shutil.rmtree(root, ignore_errors=True)


def _fill(store: MessageStore, total_bytes: int) -> None:
    msgs = [Message(TOPIC, _BODY, j % 8) for j in range(64)]
    while store.commitlog.max_offset < total_bytes:
        for m in msgs:
            m.properties = {}
        assert store.put_messages(msgs).ok
    store.flush()


def run_catch_up(*, total_mb: int, segment: int, batch_size: int, workdir: Path,
                 dispatch_along: bool = False) -> dict:
    """A cold slave's copy of ``total_mb`` MB against a bare socket copy of the same bytes.
    ``dispatch_along``: the slave never holds its dispatch back (how it copied before), for a
    comparison in the same run."""
    root = workdir / "catch-up"
    cfg = _config(root / "master", "ASYNC_MASTER", segment,
                  ha_new_slave_transfer_from="MIN_OFFSET", ha_transfer_batch_size=batch_size)
    store = MessageStore(cfg).open()
    ha = HAService.for_store(store)
    slave = None
    try:
        _fill(store, total_mb * MB)
        end = store.commitlog.max_offset
        copies = [_bare_copy(store, root / "sink")]
        ha.start()
        server = ha.server
        assert server is not None
        slave = _start_slave(root / "slave", server.port, segment, watch_end=end,
                             dispatch_along=dispatch_along)
        _wait(lambda: bool(server.links) and server.links[0].proto.plan is not None, 120,
              "the slave to connect")
        cpu_before = _cpu_seconds(slave.pid), time.process_time()
        started = time.monotonic()
        _wait(lambda: server.push2slave_max_offset >= end, 1800, "the slave to catch up")
        elapsed = time.monotonic() - started
        slave_cpu = _cpu_seconds(slave.pid) - cpu_before[0]
        master_cpu = time.process_time() - cpu_before[1]
        assert slave.stdout is not None
        dispatched = json.loads(slave.stdout.readline())["dispatched"] - started
        copies.append(_bare_copy(store, root / "sink2"))
        bare = [copy.seconds for copy in copies]
        baseline = min(bare)
        mbps = end / elapsed / MB
        return {"bench": "catch_up", "bytes": end, "transfer_batch": batch_size,
                "dispatch": "along the copy" if dispatch_along else "held while streaming",
                "slave_seconds": round(elapsed, 2), "slave_mb_per_s": round(mbps, 1),
                "slave_dispatched_seconds": round(dispatched, 2),
                "slave_dispatched_mb_per_s": round(end / dispatched / MB, 1),
                # CPU spent on the copy (not on waiting for a CPU on a shared machine):
                "slave_cpu_seconds": round(slave_cpu, 2),
                "master_cpu_seconds": round(master_cpu, 2),
                "bare_copy_seconds": [round(b, 2) for b in bare],
                # The bare copies' CPU (the sink process and the sending process), to set
                # against the slave's and the master's above:
                "bare_copy_cpu_seconds": [round(copy.cpu_seconds, 2) for copy in copies],
                "bare_copy_mb_per_s": round(end / baseline / MB, 1),
                "ratio": round(mbps / (end / baseline / MB), 3),
                "dispatched_ratio": round(end / dispatched / (end / baseline), 3),
                "target_ratio": 0.5}
    finally:
        if slave is not None:
            _stop(slave)
        ha.shutdown()
        store.close()
        shutil.rmtree(root, ignore_errors=True)


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class _Copy(NamedTuple):
    seconds: float
    cpu_seconds: float  # the sink's and the sender's, from the connection to the answer


def _bare_copy(store: MessageStore, sink_dir: Path) -> _Copy:
    """Send the CommitLog's segment files over loopback to a process that writes them to a
    file and answers when it has them all: the seconds that took, and the CPU it cost."""
    files = [mf.path for mf in store.commitlog.files.files]
    total = store.commitlog.max_offset - store.commitlog.min_offset
    sink_dir.mkdir(parents=True, exist_ok=True)
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        sink = subprocess.Popen([sys.executable, "-m", "stratamq.benchmarks.ha_bench", "sink",
                                 f"127.0.0.1:{port}", str(sink_dir / "copy"), str(total)])
        try:
            conn, _ = listener.accept()
            with conn:
                cpu_before = _cpu_seconds(sink.pid), time.process_time()
                started = time.perf_counter()
                left = total
                for path in files:
                    with path.open("rb") as f:
                        n = min(left, path.stat().st_size)
                        sent = 0
                        while sent < n:
                            sent += conn.sendfile(f, sent, n - sent)
                        left -= n
                conn.recv(8)
                elapsed = time.perf_counter() - started
                # Before the wait: until then the sink's /proc entry stays, even once it exits.
                cpu = (_cpu_seconds(sink.pid) - cpu_before[0]
                       + time.process_time() - cpu_before[1])
        finally:
            sink.wait(120)
    return _Copy(elapsed, cpu)


# -- the helper processes ----------------------------------------------------------------------

def _slave_main(root: str, master: str, segment: str, watch_end: str = "0",
                dispatch_along: str = "0") -> None:
    cfg = StoreConfig(store_path_root_dir=root, mapped_file_size_commit_log=int(segment),
                      broker_role=BrokerRole.SLAVE, ha_master_address=master,
                      message_index_enable=False)
    store = MessageStore(cfg).open()
    if int(dispatch_along):  # the comparison: a slave that never holds its dispatch back
        store.replica.hold_dispatch = lambda: None  # type: ignore[method-assign]
    ha = HAService.for_store(store)
    ha.start()
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    if int(watch_end):  # say when everything up to there is copied and dispatched
        while not done.wait(0.005):
            if (store.max_physical_offset >= int(watch_end)
                    and store.dispatch_behind_bytes() == 0):
                print(json.dumps({"dispatched": time.monotonic()}), flush=True)
                break
    done.wait()
    ha.shutdown()
    store.close()


def _sink_main(address: str, path: str, total: str) -> None:
    host, _, port = address.rpartition(":")
    want = int(total)
    with socket.create_connection((host, int(port))) as sock, open(path, "wb") as out:
        buf = bytearray(4 * 1024 * 1024)
        view = memoryview(buf)
        got = 0
        while got < want:
            n = sock.recv_into(view)
            if not n:
                break
            out.write(view[:n])
            got += n
        sock.sendall(got.to_bytes(8, "big"))


def tmp_workdir(base: str | None) -> Path:
    return Path(tempfile.mkdtemp(prefix="stratamq-ha-bench-", dir=base))


def median_run(runs: list[dict]) -> dict:
    """The run with the median throughput (a whole run, so its p99 and lag go with it)."""
    ordered = sorted(runs, key=lambda r: r["msgs_per_s"])
    return ordered[len(ordered) // 2]


def summary(puts: dict[str, dict], catch_ups: list[dict], along: list[dict] | None = None
            ) -> dict:
    """Each replicated mode's median put throughput over no replication's (target: sync >=
    0.5), and the catch-up ratios (target >= 0.5)."""
    def median(key: str, runs: list[dict] = catch_ups) -> float:
        values = sorted(c[key] for c in runs)
        return values[len(values) // 2]

    put_ratios = {}
    if puts:  # none with --catch-up-only
        none = puts["none"]["msgs_per_s"]
        put_ratios = {"async_over_none": round(puts["ASYNC_MASTER"]["msgs_per_s"] / none, 3),
                      "sync_over_none": round(puts["SYNC_MASTER"]["msgs_per_s"] / none, 3),
                      "target_sync_over_none": 0.5}
    return {"bench": "target", **put_ratios,
            "catch_up_ratio": median("ratio"), "target_catch_up_ratio": 0.5,
            "catch_up_dispatched_ratio": median("dispatched_ratio"),
            **({"catch_up_ratio_dispatch_along": median("ratio", along),
                "catch_up_dispatched_ratio_dispatch_along": median("dispatched_ratio", along)}
               if along else {})}


if __name__ == "__main__":
    kind, *args = sys.argv[1:]
    if kind == "slave":
        _slave_main(*args)
    elif kind == "sink":
        _sink_main(*args)
    else:
        raise SystemExit(f"unknown helper {kind!r}")
    os._exit(0)
