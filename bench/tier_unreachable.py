"""What a broken tier costs a broker (issue 26, item 8): the broker's CPU while its tier cannot
be written, with ``tier flush`` called again and again as an operator (or a script) would.

    python bench/tier_unreachable.py [--quick] [--seconds S] [--messages N]

A real broker process (``stratamq broker start``) per case, its CPU read from
``/proc/PID/stat`` over a window of ``--seconds``, while a ``TierFlush`` (5 s timeout) is
called for the whole window, the next as soon as one answers but at most one a second. Each
broker starts on a working tier and uploads half of ``--messages``; then the tier breaks and
the other half is sent (so every queue has something to upload). Prints one JSON object per
line:

* ``env``: interpreter, CPUs, the settings of the run;
* ``tier_unreachable`` per ``case``: ``posix_broken`` (the POSIX tier's directory replaced by
  a file: every write and listing fails at once), ``s3_unreachable`` (moto's S3 server on
  loopback, stopped: every request is refused) and ``posix_working`` (the same
  calls against a working tier, the baseline; its broker also serves the second half's
  uploads): ``cpu_fraction`` (broker CPU seconds / wall
  seconds: the share of one core; issue target < 0.05 while unreachable), the ``log_lines``
  the broker wrote in the window, the ``flush_calls`` made and how many answered
  ``committed``, and the ``lastError`` the tier status showed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from broker import Server  # noqa: E402  (bench/broker.py)

from stratamq.benchmarks.grpc_load import send_load  # noqa: E402

os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench-secret")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")

TOPIC = "TierTopic"
TARGET = 0.05  # of one core, while the tier is unreachable (issue 26)
FLUSH_EVERY_S = 1.0  # a flush starts at most this often (one waits up to its 5 s timeout)


def emit(obj: dict) -> None:
    print(json.dumps(obj), flush=True)


class Broker(Server):
    """A broker subprocess (bench/broker.py's ``Server``: its CPU, its stop); counts the lines
    it writes (its log) from a drain thread."""

    def __init__(self, workdir: Path, settings: str) -> None:
        from stratamq.broker.metadata import MetadataStore

        store = workdir / "store"
        MetadataStore(store).create_topic(TOPIC, 4, "NORMAL")
        conf = workdir / "broker.conf"
        conf.write_text("mappedFileSizeCommitLog=67108864\nhaListenPort=0\n" + settings)
        env = {**os.environ, "PYTHONPATH": str(ROOT), "HOME": str(workdir)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "stratamq.cli", "broker", "start", "--config", str(conf),
             "--store", str(store), "--listen", "127.0.0.1:0"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        assert self.proc.stdout is not None
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError("the broker exited before serving")
            if "listening on" in line:
                self.endpoint = line.split("listening on", 1)[1].split()[0]
                break
        self.lines = 0
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for _line in self.proc.stdout:
            self.lines += 1



def _send(broker: Broker, messages: int) -> int:
    seconds = max(1.0, messages / 4000)
    stats = asyncio.run(send_load(broker.endpoint, TOPIC, 16, seconds, inflight=8,
                                  body_size=512, channels=1))
    return int(stats["msgs_per_s"] * seconds)


def run_case(case: str, args: argparse.Namespace) -> dict:
    """Broker up on a working tier, messages sent and flushed; then the tier breaks (or not:
    the baseline), more messages are sent, and the window is measured."""
    from stratamq.client.admin import AdminClient

    workdir = Path(tempfile.mkdtemp(prefix=f"tier-unreachable-{case}-", dir=args.dir))
    tier = workdir / "tier"
    s3 = None
    if case == "s3_unreachable":
        import s3fs
        from tiered import S3Process  # bench/tiered.py: moto's server as its own process

        s3 = S3Process()
        s3fs.S3FileSystem(client_kwargs={"endpoint_url": s3.endpoint},
                          skip_instance_cache=True).mkdir("bench")
        settings = ("tieredBackendServiceProvider=s3\ntieredStoreFilePath=s3://bench/t\n"
                    f"tieredStoreS3Endpoint={s3.endpoint}\n")
    else:
        settings = f"tieredBackendServiceProvider=posix\ntieredStoreFilePath={tier}\n"
    broker = Broker(workdir, settings)
    try:
        sent = _send(broker, args.messages // 2)
        with AdminClient(broker.endpoint, timeout=60) as admin:
            assert admin.call("TierFlush", timeout_s=60)["committed"], "the first flush failed"
            if case == "posix_broken":  # every write and listing fails at once
                shutil.move(tier, workdir / "tier-aside")
                tier.write_text("not a directory")
            elif s3 is not None:  # every request is refused
                s3.stop()
            sent += _send(broker, args.messages // 2)
            lines0, cpu0, t0 = broker.lines, broker.cpu_seconds(), time.monotonic()
            calls = committed = 0
            while time.monotonic() - t0 < args.seconds:
                time.sleep(max(0.0, t0 + calls * FLUSH_EVERY_S - time.monotonic()))
                reply = admin.call("TierFlush", timeout_s=5)
                calls += 1
                committed += bool(reply["committed"])
            wall = time.monotonic() - t0
            cpu = broker.cpu_seconds() - cpu0
            lines = broker.lines - lines0
            status = admin.call("TierStatus")
        return {"bench": "tier_unreachable", "case": case, "seconds": round(wall, 1),
                "messages_sent": sent, "cpu_seconds": round(cpu, 2),
                "cpu_fraction": round(cpu / wall, 4),
                "target": TARGET if case != "posix_working" else None,
                "log_lines": lines, "flush_calls": calls, "flush_committed": committed,
                "lastError": status.get("lastError"),
                "lastErrorSince": status.get("lastErrorSince")}
    finally:
        broker.stop()
        if s3 is not None:
            s3.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short window (10 s)")
    parser.add_argument("--seconds", type=float, default=30.0,
                        help="the measured window per case")
    parser.add_argument("--messages", type=int, default=8000,
                        help="messages sent before the window (roughly)")
    parser.add_argument("--dir", default=None, help="where the stores go (default: $TMPDIR)")
    args = parser.parse_args()
    if args.quick:
        args.seconds = min(args.seconds, 10.0)
        args.messages = min(args.messages, 4000)
    emit({"bench": "env", "python": platform.python_version(), "cpus": os.cpu_count(),
          "seconds": args.seconds, "messages": args.messages})
    for case in ("posix_broken", "s3_unreachable", "posix_working"):
        emit(run_case(case, args))


if __name__ == "__main__":
    main()
