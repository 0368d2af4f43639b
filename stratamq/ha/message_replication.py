"""Message-based replication of compaction topics (seed 001, last section; RocketMQ's
``CompactionLog.pullMessageFromMaster`` with its ``MessageFetcher``).

A compaction topic's CompactionLog keeps the newest message of every key for as long as the
topic lives, while the CommitLog keeps only recent data, and a master may have compacted old
files away. So a slave cannot rebuild a CompactionLog by copying files: it pulls the topic from
its master as a consumer does and hands every record to its compaction store
(``CompactionStore.put_replicated``), then has it compact once (a forced round), so what it
keeps is compacted. After that the normal path (dispatch of the replicated CommitLog) goes on.

The two paths must not both write a queue while it is being pulled: a CompactionLog takes
queue offsets only past its newest, so a record dispatched from the slave's own CommitLog
(queue offset 900) before the pull reached offset 0 would make the pulled ones be refused.
``CompactionGate`` is the slave's compaction dispatcher in front of the store: a queue is
*closed* until its pull has caught up with the master, and a closed queue's records are held
back (only the highest queue offset held back is remembered); the pull goes on until it is
past that offset, then opens the queue under the same lock, and dispatch takes over from the
next record. Both paths skip queue offsets the CompactionLog already has, so they converge.
A cut-back (the slave was ahead of its master) caps what a closed queue held back at the
slave's own queue end after the cut, so the pull does not wait for offsets that are gone; and a
queue whose pull stops short of what it held (the master does not serve it yet) waits for the
next pass, leaving the other queues their turn.

Where a pull starts: the queue's own CompactionLog end (its next offset), so a slave that was
killed or restarted resumes where its durable log stops, and an up-to-date queue costs one
empty pull at start. RocketMQ pulls only into an empty log and up to the offset dispatch
started at; pulling to the master's end instead also covers a topic the slave learnt to be a
compaction topic late (the topic list is copied every ``haStateSyncInterval``).

While the master cannot be reached a closed queue stays closed: reads of offsets past its
CompactionLog fall through to the slave's local ConsumeQueue (uncompacted, but complete for
what the slave's CommitLog holds).

Pure parts: ``replicate_queue`` (the pull loop) and ``CompactionGate``. ``GrpcPullSource`` is
the master's ``PullMessage`` asking for raw CommitLog records; ``CompactionReplicator`` is the
thread that runs it on a slave. Thread-safety: the gate's ``dispatch`` runs on the store's
dispatch thread, ``try_open`` on the replicator's; they share one lock.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from stratamq import record as codec
from stratamq.client.connection import BrokerEndpoint
from stratamq.message import DispatchInfo
from stratamq.store.log_reader import CommitLogReader
from stratamq.store.read_chain import QueueOffsets

__all__ = ["CompactionGate", "CompactionReplicator", "CompactionSink", "GrpcPullSource",
           "PullCut", "PullSource", "replicate_queue"]

log = logging.getLogger(__name__)

PULL_BATCH = 256  # records per pull
PULL_GROUP = "stratamq-ha-replica"
# Pulls in a row that bring nothing new before a closed queue waits for the next pass: the
# master's dispatch lagging its CommitLog is caught up within them, a slave holding records
# the master does not have (yet) leaves the other queues their turn.
STALL_TRIES = 5


class PullSource(Protocol):
    def pull(self, topic: str, queue_id: int, offset: int, max_count: int
             ) -> tuple[list[bytes], int]:
        """Raw CommitLog records from ``offset`` on (at most ``max_count``) and the offset to
        pull next; a compacted queue skips offsets, so the next offset can be past the last
        record's."""
        ...


class CompactionSink(Protocol):
    """What ``stratamq.compaction.CompactionStore`` offers the replicator."""

    def put_replicated(self, record: bytes | memoryview) -> bool: ...

    def offsets(self, topic: str, queue_id: int) -> QueueOffsets | None: ...

    def run_now(self, topic: str | None = None) -> Any: ...


def replicate_queue(source: PullSource, sink: CompactionSink, topic: str, queue_id: int,
                    start: int, *, until: int | None = None, batch: int = PULL_BATCH,
                    stop: threading.Event | None = None,
                    put: Callable[[bytes], bool] | None = None) -> tuple[int, int]:
    """Pull from ``start`` up to ``until`` (None: to the master's end) into ``sink`` (through
    ``put`` when given); return (records the sink took, the offset to pull next)."""
    put = put or sink.put_replicated
    offset, taken = start, 0
    while (until is None or offset < until) and not (stop is not None and stop.is_set()):
        records, next_offset = source.pull(topic, queue_id, offset, batch)
        for record in records:
            if until is not None and codec.decode_dispatch_info(record, 0).queue_offset >= until:
                return taken, until
            taken += put(record)
        if next_offset <= offset:  # nothing more to pull (the master's queue ends there)
            break
        offset = next_offset
    return taken, offset


class _Dispatcher(Protocol):
    def dispatch(self, info: DispatchInfo) -> None: ...

    def durable_offset(self) -> int: ...

    def attach(self, reader: CommitLogReader) -> None: ...

    def replay_floor(self, topic: str, queue_id: int) -> int: ...

    def destroy_topic(self, topic: str) -> None: ...

    def truncate_from(self, physical_offset: int) -> None: ...


class PullCut(RuntimeError):
    """The slave's log was cut back since the pull read where to start: it starts again from
    the CompactionLog's end (records past the cut would leave a gap of queue offsets)."""


class _Policies(Protocol):
    def policy(self, topic: str) -> object | None: ...


class CompactionGate:
    """A slave's compaction dispatcher: the compaction store's dispatch, with every compaction
    queue closed until ``try_open`` (see the module docstring). Owns the open set and the
    held-back offsets; ``dispatch`` on the dispatch thread, the rest from any thread."""

    def __init__(self, inner: _Dispatcher, policies: _Policies,
                 local_end: Callable[[str, int], int] | None = None) -> None:
        self.inner = inner
        self.policies = policies
        # The next queue offset of the slave's own ConsumeQueue for a queue (cut back with the
        # CommitLog before the dispatchers are): what a cut-back caps held-back offsets at.
        self.local_end = local_end
        self._open: frozenset[tuple[str, int]] = frozenset()  # replaced, read without a lock
        self._held: dict[tuple[str, int], int] = {}  # highest queue offset held back
        self._lock = threading.Lock()
        # A cut-back and a pulled record's append exclude each other; ``cuts`` counts the
        # cut-backs, so a pull that began before one knows to start again.
        self._cut_lock = threading.Lock()
        self.cuts = 0

    def dispatch(self, info: DispatchInfo) -> None:
        key = (info.topic, info.queue_id)
        if key not in self._open and self.policies.policy(info.topic) is not None:
            with self._lock:
                if key not in self._open:
                    held = self._held.get(key, -1)
                    self._held[key] = max(held, info.queue_offset)
                    return
        self.inner.dispatch(info)

    def is_open(self, topic: str, queue_id: int) -> bool:
        return (topic, queue_id) in self._open

    def put_pulled(self, sink: CompactionSink, record: bytes, cuts: int) -> bool:
        """Hand one pulled record to ``sink``, unless the log was cut back since the pull read
        ``cuts`` (raises :class:`PullCut`): never during a cut, so a record is either cut or
        appended after it."""
        with self._cut_lock:
            if self.cuts != cuts:
                raise PullCut(f"the log was cut back during the pull ({cuts} -> {self.cuts})")
            return sink.put_replicated(record)

    def try_open(self, topic: str, queue_id: int, pulled_to: int,
                 cuts: int | None = None) -> bool:
        """Open the queue if the pull reached past everything held back (``pulled_to`` is the
        next offset to pull) and (``cuts`` given) no cut-back came since the pull began;
        False: pull on."""
        key = (topic, queue_id)
        with self._cut_lock, self._lock:
            if (cuts is not None and cuts != self.cuts) or self._held.get(key, -1) >= pulled_to:
                return False
            self._held.pop(key, None)
            self._open = self._open | {key}
            return True

    # -- the rest of the dispatcher seam, passed through ----------------------------------------

    def durable_offset(self) -> int:
        return self.inner.durable_offset()

    def attach(self, reader: CommitLogReader) -> None:
        self.inner.attach(reader)

    def replay_floor(self, topic: str, queue_id: int) -> int:
        return self.inner.replay_floor(topic, queue_id)

    def truncate_from(self, physical_offset: int) -> None:
        """The slave's CommitLog was cut back (ReplicaLog.truncate): so are the CompactionLogs,
        and so is what a closed queue held back. A held offset past the cut names a record
        that is gone: kept, the queue would stay closed until the master wrote that far (the
        pull loop never passes it). It is capped at the slave's own queue end after the cut
        (the records below the cut the queue held back; none without ``local_end``); the
        dispatch that goes on from the cut holds the master's replacement records again."""
        with self._cut_lock:
            self.inner.truncate_from(physical_offset)
            self.cuts += 1
            self._cap_held()

    def _cap_held(self) -> None:
        with self._lock:
            for key, held in list(self._held.items()):
                cap = self.local_end(*key) - 1 if self.local_end is not None else -1
                if cap < 0:
                    del self._held[key]
                elif cap < held:
                    self._held[key] = cap

    def destroy_topic(self, topic: str) -> None:
        with self._lock:  # a topic made again under the same name is pulled again
            self._open = frozenset(k for k in self._open if k[0] != topic)
            self._held = {k: v for k, v in self._held.items() if k[0] != topic}
        self.inner.destroy_topic(topic)


class GrpcPullSource:
    """``PullMessage`` on the master, asking for raw CommitLog records (the format StrataMQ's
    Spark source uses), so every record keeps its queue offset, physical offset and store
    time. Signed with the broker's ACL keys when it has them."""

    def __init__(self, endpoint: str | BrokerEndpoint, group: str = PULL_GROUP,
                 timeout: float = 30.0) -> None:
        from rocketmq.grpc_protocol import service_pb2_grpc

        self.broker = (endpoint if isinstance(endpoint, BrokerEndpoint)
                       else BrokerEndpoint(endpoint))
        self.group = group
        self.timeout = timeout
        self.channel = self.broker.channel()
        self.stub = service_pb2_grpc.MessagingServiceStub(self.channel)

    def pull(self, topic: str, queue_id: int, offset: int, max_count: int
             ) -> tuple[list[bytes], int]:
        from rocketmq.grpc_protocol import definition_pb2 as pb
        from rocketmq.grpc_protocol import service_pb2 as svc

        request = svc.PullMessageRequest(
            group=pb.Resource(name=self.group), offset=offset, batch_size=max_count,
            message_queue=pb.MessageQueue(topic=pb.Resource(name=topic), id=queue_id),
            filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"))
        request.long_polling_timeout.FromMilliseconds(0)
        records: list[bytes] = []
        next_offset = offset
        metadata = self.broker.metadata(("x-stratamq-pull-format", "records"))
        for reply in self.stub.PullMessage(request, timeout=self.timeout, metadata=metadata):
            if reply.HasField("status") and reply.status.code not in (
                    pb.OK, pb.MESSAGE_NOT_FOUND, pb.ILLEGAL_OFFSET):
                raise RuntimeError(f"pull of {topic}/{queue_id} at {offset} failed: "
                                   f"{pb.Code.Name(reply.status.code)} {reply.status.message}")
            if reply.HasField("message"):
                records.append(reply.message.body)
            elif reply.HasField("next_offset"):
                next_offset = reply.next_offset
        return records, next_offset

    def close(self) -> None:
        self.channel.close()


class CompactionReplicator:
    """The slave's thread that brings every closed compaction queue up to its master and opens
    it, then forces one compaction round of each topic it pulled into (seed 001). It looks for
    closed queues every ``interval`` s (new compaction topics arrive with the state copy).
    Owns its thread and pull source; ``info`` from any thread."""

    def __init__(self, gate: CompactionGate, sink: CompactionSink,
                 source: Callable[[], PullSource],
                 queues: Callable[[], list[tuple[str, int]]], interval: float = 1.0) -> None:
        self.gate, self.sink = gate, sink
        self.make_source = source
        self.queues = queues
        self.interval = interval
        self.progress: dict[tuple[str, int], dict[str, Any]] = {}
        self.last_error = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="ha-compaction-replicator")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        source: PullSource | None = None
        try:
            while True:
                try:
                    source = source or self.make_source()
                    self.pass_once(source)
                    self.last_error = ""
                except Exception as exc:  # the master is away or refused: try again later
                    if str(exc) != self.last_error:
                        log.warning("pulling compaction topics from the master failed: %s", exc)
                    self.last_error = str(exc)
                if self._stop.wait(self.interval):
                    return
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                close()

    def pass_once(self, source: PullSource) -> dict[str, int]:
        """Catch up every closed queue; force a round of each topic that got records. The
        records taken per topic."""
        taken: dict[str, int] = {}
        for topic, queue_id in self.queues():
            if self._stop.is_set():
                break
            if not self.gate.is_open(topic, queue_id):
                taken[topic] = taken.get(topic, 0) + self.catch_up(source, topic, queue_id)
        for topic, count in taken.items():
            if count and not self._stop.is_set():
                self.sink.run_now(topic)
                log.info("compaction topic %s: %d records pulled from the master, compacted",
                         topic, count)
        return taken

    def catch_up(self, source: PullSource, topic: str, queue_id: int) -> int:
        """Pull one queue from its CompactionLog's end until it is open, or until the master
        has served nothing new ``STALL_TRIES`` times in a row (the queue stays closed and is
        pulled again on the next pass, so one queue never keeps the others waiting); records
        taken."""
        cuts = self.gate.cuts  # read before the start: a cut after it restarts the pull
        held = self.sink.offsets(topic, queue_id)
        start = offset = held[1] if held is not None else 0
        row = self.progress[(topic, queue_id)] = {
            "topic": topic, "queueId": queue_id, "state": "PULLING", "from": start,
            "pulled": 0, "nextOffset": start, "startTimestamp": int(time.time() * 1000)}
        stalled = 0
        while not self._stop.is_set():
            before = offset
            try:
                taken, offset = replicate_queue(
                    source, self.sink, topic, queue_id, offset, stop=self._stop,
                    put=functools.partial(self.gate.put_pulled, self.sink, cuts=cuts))
            except PullCut:
                taken = -1
            if taken < 0 or cuts != self.gate.cuts:
                # The CompactionLog was cut back under the pull: go on from its new end.
                cuts = self.gate.cuts
                held = self.sink.offsets(topic, queue_id)
                offset = held[1] if held is not None else 0
                row["nextOffset"], stalled = offset, 0
                continue
            row["pulled"] += taken
            row["nextOffset"] = offset
            if self.gate.try_open(topic, queue_id, offset, cuts):
                row["state"] = "DONE"
                row["doneTimestamp"] = int(time.time() * 1000)
                break
            stalled = stalled + 1 if offset <= before else 0
            if stalled >= STALL_TRIES:
                row["state"] = "WAITING"  # for the master to serve what the slave holds
                break
            # The slave holds a record the master's queue does not serve yet (its dispatch
            # lags its CommitLog): ask again shortly.
            self._stop.wait(0.05)
        return int(row["pulled"])

    def info(self) -> dict[str, Any]:
        rows = sorted(self.progress.values(), key=lambda r: (r["topic"], r["queueId"]))
        return {"queues": rows, "lastError": self.last_error}
