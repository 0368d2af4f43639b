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
from dataclasses import dataclass

from rocketmq import FilterExpression, Producer, SimpleConsumer
from test_broker_harness import config, message

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Acked:
    body: bytes
    queue: int
    offset: int
    endpoint: str  # the client's entry point when it was acknowledged


class _Rotating(threading.Thread):
    def __init__(self, endpoints: list[str]) -> None:
        super().__init__(daemon=True)
        self.endpoints = endpoints
        self.stop = threading.Event()
        self.errors = 0
        self._next = 0

    def finish(self) -> None:
        self.stop.set()
        self.join(60)
        assert not self.is_alive(), f"{type(self).__name__} did not stop"

    def _endpoint(self) -> str:
        endpoint = self.endpoints[self._next % len(self.endpoints)]
        self._next += 1
        return endpoint


class OfficialProducer(_Rotating):
    """Sends numbered bodies with ``rocketmq.Producer`` until ``finish()``."""

    def __init__(self, endpoints: list[str], topic: str) -> None:
        super().__init__(endpoints)
        self.topic = topic
        self.acked: dict[str, Acked] = {}  # message id -> where it was acknowledged

    def run(self) -> None:
        i = 0
        while not self.stop.is_set():
            endpoint = self._endpoint()
            producer = None
            try:
                producer = Producer(config(endpoint), (self.topic,))
                producer.startup()
                while not self.stop.is_set():
                    body = b"official-%06d" % i
                    i += 1
                    receipt = producer.send(message(self.topic, body))
                    queue = receipt.message_queue.message_queue0().id
                    self.acked[receipt.message_id] = Acked(body, queue, int(receipt.offset),
                                                           endpoint)
            except Exception as exc:  # the broker died or refused: a fresh client elsewhere
                self.errors += 1
                log.info("producer on %s: %s", endpoint, exc)
                self.stop.wait(0.2)
            finally:
                if producer is not None:
                    with contextlib.suppress(Exception):
                        producer.shutdown()


class OfficialConsumer(_Rotating):
    """Receives and acknowledges with ``rocketmq.SimpleConsumer`` until ``finish()``."""

    def __init__(self, endpoints: list[str], topic: str, group: str,
                 invisible_s: int = 10) -> None:
        super().__init__(endpoints)
        self.topic = topic
        self.group = group
        self.invisible_s = invisible_s
        self.received: set[str] = set()  # message ids

    def run(self) -> None:
        while not self.stop.is_set():
            endpoint = self._endpoint()
            consumer = None
            try:
                consumer = SimpleConsumer(config(endpoint), self.group,
                                          {self.topic: FilterExpression()}, await_duration=1)
                consumer.startup()
                while not self.stop.is_set():
                    for m in consumer.receive(32, self.invisible_s):
                        self.received.add(m.message_id)
                        consumer.ack(m)
            except Exception as exc:
                self.errors += 1
                log.info("consumer on %s: %s", endpoint, exc)
                self.stop.wait(0.2)
            finally:
                if consumer is not None:
                    with contextlib.suppress(Exception):
                        consumer.shutdown()
