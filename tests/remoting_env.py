"""Helpers for the remoting tests (no tests here): a NameServer subprocess, a broker with its
remoting port, and a blocking raw-frame client built on the codec."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from broker_proc import free_port
from test_broker_harness import FAST_CONF, PROJECT, BrokerProcess

from stratamq.remoting.codec import RemotingCommand
from stratamq.remoting.codes import SerializeType
from stratamq.remoting.transport import RemotingClient


@dataclass
class NameServerProcess:
    proc: subprocess.Popen
    address: str

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(30)
        self.proc.stdout.close()


def start_namesrv(*options: str) -> NameServerProcess:
    proc = subprocess.Popen(
        [sys.executable, "-m", "stratamq.cli", "namesrv", "start", "--listen", "127.0.0.1:0",
         *options],
        cwd=PROJECT, env=dict(os.environ, PYTHONUNBUFFERED="1"), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    line = proc.stdout.readline()
    m = re.search(r"listening on (\S+)", line)
    if not m:
        proc.kill()
        raise AssertionError(f"NameServer did not start: {line!r}{proc.stdout.read()}")
    return NameServerProcess(proc, m.group(1))


def remoting_broker(store: Path, namesrv: str = "", extra: str = "") -> tuple[BrokerProcess, str]:
    """A broker subprocess serving remoting on a free port; returns it and that address."""
    port = free_port()
    conf = (FAST_CONF + f"remotingListenPort={port}\nhaListenPort=0\n"
            + (f"namesrvAddr={namesrv}\n" if namesrv else "") + extra)
    return BrokerProcess(store, conf).start(), f"127.0.0.1:{port}"


def invoke(address: str, code: int, fields: dict[str, str] | None = None, body: bytes = b"",
           kind: SerializeType = SerializeType.JSON, timeout: float = 30) -> RemotingCommand:
    """One request on a fresh connection; its response."""
    async def one() -> RemotingCommand:
        client = RemotingClient(address)
        try:
            return await client.invoke(RemotingCommand(code, ext_fields=dict(fields or {}),
                                                       body=body, serialize_type=kind),
                                       timeout)
        finally:
            await client.close()

    return asyncio.run(one())
