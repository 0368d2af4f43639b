"""Real etcd members on loopback, for the cluster tests and `bench/cluster.py`.

Each member is Debian's ``etcd`` binary (package ``etcd-server``; the Makefile's test target
installs it where missing) in its own directory under the test's tmp path, on free loopback
ports, started as a child process and stopped by its PID, never by name (the machine is
shared). ``EtcdCluster(tmp_path, size=3)`` is a 3-member cluster: one member can be killed and
the others go on (a quorum of 2).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def etcd_binary() -> str:
    path = shutil.which("etcd") or ("/usr/bin/etcd" if os.path.exists("/usr/bin/etcd") else None)
    if path is None:
        raise AssertionError("etcd is not installed: `make test` installs Debian's etcd-server")
    return path


class EtcdMember:
    def __init__(self, root: Path, name: str, also_listen: tuple[str, ...] = ()) -> None:
        self.name = name
        self.also_listen = also_listen  # more hosts to serve clients on (the client port)
        self.dir = root / name
        self.client_port = _free_port()
        self.peer_port = _free_port()
        self.proc: subprocess.Popen | None = None
        self.log = root / f"{name}.log"

    @property
    def client_url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    def start(self, initial_cluster: str, state: str = "new") -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        args = [etcd_binary(), "--name", self.name, "--data-dir", str(self.dir / "data"),
                "--listen-client-urls", ",".join(
                    [self.client_url, *(f"http://{h}:{self.client_port}"
                                        for h in self.also_listen)]),
                "--advertise-client-urls", self.client_url,
                "--listen-peer-urls", self.peer_url,
                "--initial-advertise-peer-urls", self.peer_url,
                "--initial-cluster", initial_cluster,
                "--initial-cluster-state", state,
                "--initial-cluster-token", f"stratamq-test-{os.getpid()}",
                # Fast elections among members on one loopback; defaults are for WANs.
                "--heartbeat-interval", "50", "--election-timeout", "500",
                "--quota-backend-bytes", str(64 << 20)]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.client_url}/health", timeout=1) as r:
                return b'"true"' in r.read()
        except OSError:
            return False

    def send(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGCONT)  # a stopped member cannot handle SIGTERM
                os.kill(proc.pid, sig)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(15)
        self.proc = None


class EtcdCluster:
    """``size`` members (1 or 3), started and healthy on construction; ``stop()`` ends them.
    ``also_listen``: hosts besides 127.0.0.1 the members serve clients on (a network
    namespace's link)."""

    def __init__(self, root: Path, size: int = 1, also_listen: tuple[str, ...] = ()) -> None:
        self.root = root / "etcd"
        self.root.mkdir(parents=True, exist_ok=True)
        self.members = [EtcdMember(self.root, f"m{i}", also_listen) for i in range(size)]
        initial = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
        for m in self.members:
            m.start(initial)
        self.wait_healthy()

    @property
    def endpoints(self) -> str:
        """``etcdEndpoints``: the members' client URLs, comma-separated."""
        return ",".join(m.client_url for m in self.members)

    def wait_healthy(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            live = [m for m in self.members if m.proc is not None]
            if live and all(m.healthy() for m in live):
                return
            for m in live:
                assert m.proc is not None
                if m.proc.poll() is not None:
                    raise AssertionError(f"etcd member {m.name} exited: "
                                         f"{m.log.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"etcd not healthy after {timeout:g} s")
            time.sleep(0.1)

    def stop(self) -> None:
        for m in self.members:
            m.stop()
