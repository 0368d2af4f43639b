"""Transactional messages over gRPC: the thin layer between the RocketMQ 5 protocol and the
protocol-free engine in ``stratamq/transactions`` (what the proxy's ``EndTransactionActivity``
and ``GrpcClientChannel`` do).

* ``ProducerStreams``: the open ``Telemetry`` streams of producers and the topics each
  publishes; a check (``RecoverOrphanedTransactionCommand``) goes down one of them, round
  robin, as the proxy picks one channel of the group.
* ``EndTransactionService``: ``EndTransaction`` checked as the proxy checks it and handed to
  the engine. The producer group is the topic, as the proxy has it for gRPC clients.
* ``TransactionCollector``: RocketMQ 5's transaction metrics by their names.
* ``plug_transactions`` / ``start_transactions``: the table plugged into the store before it
  opens, and the engine and its check thread once the writer runs.

Thread-safety: ``ProducerStreams`` any thread (commands are handed to the stream's loop);
``EndTransactionService.end_transaction`` in the executor (it waits for puts).
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc

from stratamq.broker.clients import ok_status
from stratamq.broker.convert import to_pb_message
from stratamq.broker.errors import BrokerError
from stratamq.broker.lookup import Lookup
from stratamq.broker.ports import Call
from stratamq.broker.validate import check_topic, put_status
from stratamq.message import Message
from stratamq.store.layout import StoreLayout
from stratamq.store.results import PutMessageStatus
from stratamq.transactions import (
    CheckRequest,
    Resolution,
    Stored,
    TransactionCheckService,
    TransactionEngine,
    TransactionError,
    TransactionSettings,
    TransactionTable,
)
from stratamq.transactions.checkpoint import CHECKPOINT_NAME
from stratamq.transactions.messages import CHECK_IMMUNITY_TIME

if TYPE_CHECKING:
    from stratamq.broker.writer import GroupWriter
    from stratamq.store.message_store import MessageStore

__all__ = ["AnyProducer", "EndTransactionService", "ProducerStreams", "TransactionCollector",
           "plug_transactions", "recovery_duration", "register_metrics", "start_transactions"]

Code = pb.Code
_LATENCY_BUCKETS_S = (1, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 43200, 86400)
_RESOLUTIONS = {pb.COMMIT: Resolution.COMMIT, pb.ROLLBACK: Resolution.ROLLBACK}


# ProxyConfig.maxTransactionRecoverySecond: the longest orphaned-transaction recovery duration
# a producer may set on a half message.
MAX_TRANSACTION_RECOVERY_SECOND = 3600


def recovery_duration(sp: pb.SystemProperties) -> dict[str, str]:
    """The property the proxy stores for a half message's orphaned-transaction recovery
    duration (``CHECK_IMMUNITY_TIME_IN_SECONDS``, whole seconds), checked as it checks it."""
    if not sp.HasField("orphaned_transaction_recovery_duration"):
        return {}
    seconds = sp.orphaned_transaction_recovery_duration.seconds
    if seconds > MAX_TRANSACTION_RECOVERY_SECOND:
        raise BrokerError(Code.BAD_REQUEST, "the max transaction recovery time of message is "
                          f"too large, max is {MAX_TRANSACTION_RECOVERY_SECOND}")
    return {CHECK_IMMUNITY_TIME: str(seconds)}


class ProducerStreams:
    """Open producer ``Telemetry`` streams: (loop, outbox) by stream, with their topics."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._streams: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Queue[Any],
                                       frozenset[str]]] = {}
        self._turn = itertools.count()
        self.sent = 0

    def register(self, outbox: asyncio.Queue[Any], topics: frozenset[str]) -> None:
        """On the stream's loop: this stream publishes ``topics`` (its latest settings)."""
        with self._lock:
            self._streams[id(outbox)] = (asyncio.get_running_loop(), outbox, topics)

    def forget(self, outbox: asyncio.Queue[Any]) -> None:
        with self._lock:
            self._streams.pop(id(outbox), None)

    def _of(self, topic: str) -> list[tuple[asyncio.AbstractEventLoop, asyncio.Queue[Any]]]:
        with self._lock:
            return [(loop, q) for loop, q, topics in self._streams.values() if topic in topics]

    def has_producer(self, producer_group: str, topic: str) -> bool:
        return bool(self._of(topic))

    def __call__(self, check: CheckRequest) -> bool:
        streams = self._of(check.real_topic)
        if not streams:
            return False
        loop, outbox = streams[next(self._turn) % len(streams)]
        message = to_pb_message(check.half, message_type="TRANSACTION", topic=check.real_topic)
        message.system_properties.queue_id = int(check.half.properties.get("REAL_QID", "0"))
        command = svc.TelemetryCommand(
            recover_orphaned_transaction_command=svc.RecoverOrphanedTransactionCommand(
                message=message, transaction_id=check.transaction_id))
        try:
            loop.call_soon_threadsafe(outbox.put_nowait, command)
        except RuntimeError:  # the loop closed: the stream is gone
            return False
        self.sent += 1
        return True


class AnyProducer:
    """The engine's notifier over both protocols: a check goes to the first of ``notifiers``
    (gRPC producer streams, 4.x remoting producers) that has a live producer for it."""

    def __init__(self, *notifiers: Any) -> None:
        self.notifiers = notifiers

    def has_producer(self, producer_group: str, topic: str) -> bool:
        return any(n.has_producer(producer_group, topic) for n in self.notifiers)

    def __call__(self, check: CheckRequest) -> bool:
        return any(n.has_producer(check.producer_group, check.real_topic) and n(check)
                   for n in self.notifiers)


class EndTransactionService:
    """``EndTransaction`` as the proxy answers it (see the module docstring)."""

    def __init__(self, lookup: Lookup, engine: TransactionEngine) -> None:
        self.lookup = lookup
        self.engine = engine

    def end_transaction(self, request: svc.EndTransactionRequest, call: Call
                        ) -> svc.EndTransactionResponse:
        topic = request.topic.name
        check_topic(topic)
        if not request.transaction_id.strip():
            raise BrokerError(Code.INVALID_TRANSACTION_ID, "transaction id cannot be empty")
        self.lookup.authorize(call, f"Topic:{topic}", "Pub")
        resolution = _RESOLUTIONS.get(request.resolution, Resolution.UNKNOWN)
        try:
            self.engine.end(topic, request.transaction_id, resolution,
                            from_check=request.source == pb.SOURCE_SERVER_CHECK)
        except TransactionError as exc:
            code = Code.INTERNAL_SERVER_ERROR if exc.kind == "store" else (
                Code.INVALID_TRANSACTION_ID)
            raise BrokerError(code, exc.message) from None
        return svc.EndTransactionResponse(status=ok_status())


class TransactionCollector(Collector):
    """``rocketmq_half_messages`` (gauge), ``rocketmq_commit_messages_total`` and
    ``rocketmq_rollback_messages_total`` (counters), per real topic, read at scrape time."""

    def __init__(self, engine: TransactionEngine, node: tuple[str, str, str]) -> None:
        self.engine = engine
        self.node = list(node)

    def collect(self) -> Iterator[Any]:
        labels = ["cluster", "node_type", "node_id", "topic"]
        half = GaugeMetricFamily("rocketmq_half_messages", "open half messages", labels=labels)
        for topic, count in sorted(self.engine.table.by_topic().items()):
            half.add_metric([*self.node, topic], count)
        yield half
        for name, doc, counts in (
                ("rocketmq_commit_messages", "transactions committed", self.engine.commits),
                ("rocketmq_rollback_messages", "transactions rolled back",
                 self.engine.rollbacks)):
            family = CounterMetricFamily(name, doc, labels=labels)
            for topic, count in sorted(dict(counts).items()):
                family.add_metric([*self.node, topic], count)
            yield family


def register_metrics(engine: TransactionEngine, registry: Any,
                     node: tuple[str, str, str]) -> None:
    """The transaction series in the broker's Prometheus ``registry``."""
    registry.register(TransactionCollector(engine, node))
    latency = Histogram("rocketmq_finish_message_latency",
                        "seconds from a half message to its commit or rollback",
                        ["cluster", "node_type", "node_id", "topic"],
                        buckets=_LATENCY_BUCKETS_S, registry=registry)
    engine.on_finish = lambda topic, how, seconds: latency.labels(*node, topic).observe(seconds)


def plug_transactions(store: MessageStore, root: str | Any) -> TransactionTable:
    """The table, plugged into ``store`` before it opens (it replays from its checkpoint)."""
    table = TransactionTable(StoreLayout(root).config_dir / CHECKPOINT_NAME)
    store.add_dispatcher(table)
    return table


def _puts(writer: GroupWriter) -> Callable[[list[Message]], list[Stored]]:
    def put(messages: list[Message]) -> list[Stored]:
        out = []
        for r in writer.put_wait(messages):
            a = r.appended
            if r.status is PutMessageStatus.PUT_OK and a is not None:
                out.append(Stored(True, a.physical_offset, a.queue_offset))
            else:
                code, text = put_status(r.status)
                out.append(Stored(False, problem=f"{text} ({r.error})" if r.error else text))
        return out

    return put


def start_transactions(table: TransactionTable, store: MessageStore, writer: GroupWriter,
                       settings: TransactionSettings, streams: ProducerStreams | AnyProducer,
                       may_check: Callable[[], bool]
                       ) -> tuple[TransactionEngine, TransactionCheckService]:
    engine = TransactionEngine(table, _puts(writer), store.look_message_by_offset,
                               lambda: store.wait_dispatched(5.0), store.config.store_host,
                               settings, streams)
    service = TransactionCheckService(engine, lambda: store.flushed_offset, may_check)
    service.start()
    return engine, service
