"""The official RocketMQ client producing and consuming through a cluster's failovers (helpers
for the cluster fault tests; no tests here).

Each keeps one client on one broker endpoint of the group and, when a call fails, starts a
fresh client on the next endpoint: a fresh client queries the route again, as a long-lived one
does on its route refresh (every 30 s, too slow for a test). What was acknowledged is kept by
message id with the queue and offset of the receipt, so a test can check that every
acknowledged message is readable afterwards, and where.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass

from rocketmq import ClientConfiguration, Credentials, FilterExpression, Producer, SimpleConsumer
from test_broker_harness import message

log = logging.getLogger(__name__)


def config(endpoint: str) -> ClientConfiguration:
    # A stopped (SIGSTOP) or partitioned broker never answers: give up on it soon and move on.
    return ClientConfiguration(endpoint, Credentials(), request_timeout=3)


@dataclass(frozen=True)
class Acked:
    body: bytes
    queue: int
    offset: int
    endpoint: str  # the client's entry point when it was acknowledged


class _Rotating(threading.Thread):
    """Runs ``_session`` with a client on one endpoint until it fails, then on the next."""

    def __init__(self, endpoints: list[str]) -> None:
        super().__init__(daemon=True)
        self.endpoints = endpoints
        self.stop = threading.Event()
        self.errors = 0

    def finish(self) -> None:
        self.stop.set()
        self.join(60)
        assert not self.is_alive(), f"{type(self).__name__} did not stop"

    def run(self) -> None:
        turn = 0
        while not self.stop.is_set():
            endpoint = self.endpoints[turn % len(self.endpoints)]
            turn += 1
            clients: list = []  # what _session started, to shut down
            try:
                self._session(endpoint, clients)
            except Exception as exc:  # the broker died or refused: a fresh client elsewhere
                self.errors += 1
                log.info("%s on %s: %s", type(self).__name__, endpoint, exc)
                self.stop.wait(0.2)
            finally:
                for client in clients:
                    with contextlib.suppress(Exception):
                        client.shutdown()

    def _session(self, endpoint: str, clients: list) -> None:
        raise NotImplementedError


class OfficialProducer(_Rotating):
    """Sends numbered bodies with ``rocketmq.Producer`` until ``finish()``."""

    def __init__(self, endpoints: list[str], topic: str) -> None:
        super().__init__(endpoints)
        self.topic = topic
        self.acked: dict[str, Acked] = {}  # message id -> where it was acknowledged
        self._sent = 0

    def _session(self, endpoint: str, clients: list) -> None:
        producer = Producer(config(endpoint), (self.topic,))
        clients.append(producer)
        producer.startup()
        while not self.stop.is_set():
            body = b"official-%06d" % self._sent
            self._sent += 1
            receipt = producer.send(message(self.topic, body))
            queue = receipt.message_queue.message_queue0().id
            self.acked[receipt.message_id] = Acked(body, queue, int(receipt.offset), endpoint)


class OfficialConsumer(_Rotating):
    """Receives and acknowledges with ``rocketmq.SimpleConsumer`` until ``finish()``.

    ``acked``: id -> when (monotonic) its first acknowledgement was answered OK (the client
    raises on any other answer); ``repeats``: the ids delivered again after that, each time
    it happened."""

    def __init__(self, endpoints: list[str], topic: str, group: str,
                 invisible_s: int = 10) -> None:
        super().__init__(endpoints)
        self.topic = topic
        self.group = group
        self.invisible_s = invisible_s
        self.received: set[str] = set()  # message ids
        self.acked: dict[str, float] = {}
        self.repeats: list[str] = []

    def _session(self, endpoint: str, clients: list) -> None:
        consumer = SimpleConsumer(config(endpoint), self.group,
                                  {self.topic: FilterExpression()}, await_duration=1)
        clients.append(consumer)
        consumer.startup()
        while not self.stop.is_set():
            for m in consumer.receive(32, self.invisible_s):
                if m.message_id in self.acked:
                    self.repeats.append(m.message_id)
                self.received.add(m.message_id)
                consumer.ack(m)
                self.acked.setdefault(m.message_id, time.monotonic())
