"""A real ``stratamq broker start`` subprocess on 127.0.0.1 for end-to-end tests.

Topics are created in the store's metadata before the broker starts (the same JSON the admin
RPCs write), so these tests do not depend on the admin service or its access rules.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from stratamq.broker.metadata import MetadataStore


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class BrokerProc:
    proc: subprocess.Popen
    endpoint: str
    store: Path
    conf: Path
    output: list[str] = field(default_factory=list)

    def kill(self) -> None:
        """SIGKILL: no shutdown, no flush, ``abort`` stays."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode


def create_topics(store: Path, topics: list[tuple[str, int, str]]) -> None:
    meta = MetadataStore(store)
    for name, queues, kind in topics:
        if meta.topic(name) is None:
            meta.create_topic(name, queues, kind)


def start_broker(tmp_path: Path, settings: dict[str, str] | None = None,
                 topics: list[tuple[str, int, str]] = (), env: dict[str, str] | None = None,
                 store: Path | None = None, port: int = 0) -> BrokerProc:
    store = store or tmp_path / "store"
    store.mkdir(parents=True, exist_ok=True)
    create_topics(store, list(topics))
    conf = tmp_path / "broker.conf"
    lines = {"mappedFileSizeCommitLog": str(4 * 1024 * 1024),
             "mappedFileSizeConsumeQueue": str(10_000 * 20), **(settings or {})}
    conf.write_text("".join(f"{k}={v}\n" for k, v in lines.items()))
    proc = subprocess.Popen(
        [sys.executable, "-m", "stratamq.cli", "broker", "start", "--config", str(conf),
         "--store", str(store), "--listen", f"127.0.0.1:{port}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, **(env or {})},  # HOME is private already (tests/conftest.py)
    )
    output: list[str] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        output.append(line)
        if "listening on" in line:
            endpoint = line.split("listening on", 1)[1].split()[0]
            # Keep draining stdout (stderr goes there too): a full pipe would block the broker
            # on its next log line.
            threading.Thread(target=lambda: output.extend(proc.stdout), daemon=True).start()
            return BrokerProc(proc, endpoint, store, conf, output)
    proc.kill()
    raise RuntimeError("broker did not start:\n" + "".join(output) + proc.stdout.read())


def queue_sizes_when_visible(spark, endpoint: str, topic: str, total: int) -> dict[int, int]:
    """Per-queue message counts of ``topic`` once ``total`` messages are readable.

    A send is acknowledged once it is in the CommitLog; its ConsumeQueue unit (what QueryOffset
    END reports) follows a moment later, so a read right after a write may see fewer."""
    deadline = time.monotonic() + 60
    while True:
        frame = (spark.read.format("stratamq").option("endpoints", endpoint)
                 .option("topics", topic).load())
        sizes = {r.queue_id: r["count"] for r in frame.groupBy("queue_id").count().collect()}
        if sum(sizes.values()) >= total or time.monotonic() > deadline:
            return sizes
        time.sleep(0.2)


def self_signed_cert(directory: Path, name: str = "server") -> tuple[Path, Path]:
    """A certificate and key for 127.0.0.1 / localhost, made with openssl (for TLS tests)."""
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
         "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )
    return cert, key
