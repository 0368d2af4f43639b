"""Helpers for the broker tests (no tests here): a broker subprocess and the official client.

The official client writes its log under ``$HOME/logs``; tests/conftest.py already points HOME
at a private directory for the whole session and every subprocess it starts.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer
from rocketmq.grpc_protocol import service_pb2_grpc

PROJECT = Path(__file__).resolve().parents[1]

# Short invisible times and small files keep the suite quick.
FAST_CONF = """\
minInvisibleTimeMillsForRecv=1000
mappedFileSizeCommitLog=1048576
mappedFileSizeConsumeQueue=6000
grpcThreadPoolNums=64
"""


class BrokerProcess:
    """``stratamq broker start`` as a real subprocess on 127.0.0.1 with an ephemeral port."""

    def __init__(self, store: Path, conf_text: str = FAST_CONF, listen: str = "127.0.0.1:0",
                 command_prefix: tuple[str, ...] = ()):
        self.store = store
        self.conf = store.parent / f"{store.name}-broker.conf"
        self.conf.write_text(conf_text)
        self.listen = listen
        self.command_prefix = command_prefix  # e.g. ("ip", "netns", "exec", NAME)
        self.proc: subprocess.Popen | None = None
        self.endpoint = ""
        self.log = store.parent / f"{store.name}-broker.log"

    def start(self) -> BrokerProcess:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        with open(self.log, "ab") as log:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen(
                [*self.command_prefix, sys.executable, "-m", "stratamq.cli", "broker", "start",
                 "--store", str(self.store), "--listen", self.listen, "--config",
                 str(self.conf)],
                cwd=PROJECT, env=env, stdout=subprocess.PIPE, stderr=log, text=True)
        line = self.proc.stdout.readline()
        m = re.search(r"listening on (\S+)", line)
        if not m:
            self.proc.kill()
            raise AssertionError(f"broker did not start: {line!r} {self.log.read_text()}")
        self.endpoint = m.group(1)
        return self

    def terminate(self, timeout: float = 30) -> int:
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout)
        self.proc.stdout.close()
        return rc

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)
        self.proc.stdout.close()

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "stratamq.cli", *args, "--endpoint",
                               self.endpoint], cwd=PROJECT, capture_output=True, text=True,
                              timeout=60)


@pytest.fixture(scope="module", name="broker")
def module_broker(tmp_path_factory):
    """One broker for a test module (import ``module_broker`` and ``module_stub`` to use)."""
    b = BrokerProcess(tmp_path_factory.mktemp("broker") / "store").start()
    yield b
    b.terminate()


@pytest.fixture(scope="module", name="stub")
def module_stub(broker):
    """A raw stub on the module's broker."""
    channel, stub = raw_stub(broker)
    yield stub
    channel.close()


def create_topic(b: BrokerProcess, name: str, queues: int, mtype: str = "NORMAL") -> str:
    """Create ``name`` through the admin CLI (as a user would); return the name."""
    r = b.cli("topic", "create", "--topic", name, "--queues", str(queues), "--type", mtype)
    assert r.returncode == 0, r.stderr
    return name


def send(b: BrokerProcess, topic: str, bodies: list[bytes]) -> list[str]:
    """Send each body with a fresh producer; the message ids, in order."""
    p = Producer(config(b.endpoint), (topic,))
    p.startup()
    try:
        return [p.send(message(topic, body)).message_id for body in bodies]
    finally:
        p.shutdown()


def raw_stub(b: BrokerProcess) -> tuple[grpc.Channel, service_pb2_grpc.MessagingServiceStub]:
    """A raw stub, for the status codes the official client hides; close the channel."""
    channel = grpc.insecure_channel(b.endpoint)
    return channel, service_pb2_grpc.MessagingServiceStub(channel)


def config(endpoint: str) -> ClientConfiguration:
    return ClientConfiguration(endpoint, Credentials(), request_timeout=10)


def message(topic: str, body: bytes, tag: str | None = None, keys: tuple[str, ...] = (),
            props: dict[str, str] | None = None, group: str | None = None) -> Message:
    m = Message()
    m.topic = topic
    m.body = body
    if tag:
        m.tag = tag
    if keys:
        m.keys = keys[0]
        for k in keys[1:]:
            m.keys = k
    for k, v in (props or {}).items():
        m.add_property(k, v)
    if group:
        m.message_group = group
    return m


def receive_until(consumer, want: int, invisible: int = 15, deadline_s: float = 30,
                  ack: bool = True) -> list:
    """Receive until ``want`` messages arrived (acking each unless told not to)."""
    got: list = []
    end = time.monotonic() + deadline_s
    while len(got) < want and time.monotonic() < end:
        for m in consumer.receive(32, invisible):
            got.append(m)
            if ack:
                consumer.ack(m)
    return got


__all__ = ["BrokerProcess", "FilterExpression", "Message", "config", "create_topic", "message",
           "raw_stub", "receive_until", "send"]
