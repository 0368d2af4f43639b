"""Message-based replication of compaction topics (seed 001, last section): the hook.

A compaction topic's CompactionLog keeps the newest message of every key for as long as the
topic lives, while the CommitLog keeps only recent data, and a master may have compacted old
files away. So a slave cannot rebuild a CompactionLog by copying files: it pulls the topic
from its master as a consumer does, from queue offset 0 up to where its own CommitLog (which
byte replication copied and dispatches) takes over, hands every message to its compaction log,
and then has it compact once more, so what it keeps is compacted; after that the normal path
(dispatch of the replicated CommitLog) continues.

This module is that loop, free of sockets (``replicate_queue`` / ``replicate_topic``), plus a
``PullSource`` over the master's ``PullMessage`` RPC (``GrpcPullSource``, raw CommitLog records
so every message keeps its queue offset, physical offset and store time). The sink is anything
with ``put_replicated(message)`` and ``force_compaction(topic)``; nothing calls this yet.

Wiring it to ``stratamq.compaction.CompactionStore`` (which arrived after this hook) needs, on
the compaction side, a public ``put_replicated`` doing what its ``dispatch`` does for one
record (KEYS md5, tombstone flag, ``CompactionLog.append`` at the record's queue offset; the
slave's CommitLog has the master's physical offsets, so ``physical_end`` stays meaningful),
and ``run_now(topic)`` as ``force_compaction``. On the slave broker the pull must run before
dispatch reaches the topic's replicated records: a CompactionLog takes queue offsets only past
its newest, so the older ones pulled later would be refused. The place is
``BrokerReplication.start`` on a SLAVE, before the ``HAClient`` starts copying, with ``until``
= the queue offset of each queue's first record in the slave's own CommitLog (ask the master's
``QueryOffset`` by that record's store time, or 0 for an empty slave), and the compaction
topics from the master's ``SyncState`` metadata.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Protocol

from stratamq import record as codec
from stratamq.message import StoredMessage

__all__ = ["CompactionSink", "GrpcPullSource", "PullSource", "replicate_queue",
           "replicate_topic"]

log = logging.getLogger(__name__)

PULL_BATCH = 256  # messages per pull


class PullSource(Protocol):
    def pull(self, topic: str, queue_id: int, offset: int, max_count: int
             ) -> tuple[list[StoredMessage], int]:
        """Messages from ``offset`` on (at most ``max_count``) and the offset to pull next;
        a compacted queue skips offsets, so the next offset can be past the last message's."""
        ...


class CompactionSink(Protocol):
    def put_replicated(self, message: StoredMessage) -> None: ...

    def force_compaction(self, topic: str) -> None: ...


def replicate_queue(source: PullSource, sink: CompactionSink, topic: str, queue_id: int, *,
                    until: int, start: int = 0, batch: int = PULL_BATCH) -> int:
    """Pull ``[start, until)`` of one queue into ``sink``; return how many messages went."""
    offset, count = start, 0
    while offset < until:
        messages, next_offset = source.pull(topic, queue_id, offset, batch)
        for message in messages:
            if message.queue_offset >= until:
                return count
            sink.put_replicated(message)
            count += 1
        if next_offset <= offset:  # nothing more to pull (the master's queue ends there)
            break
        offset = next_offset
    return count


def replicate_topic(source: PullSource, sink: CompactionSink, topic: str,
                    until: dict[int, int] | Iterable[tuple[int, int]]) -> dict[int, int]:
    """Every queue of ``topic`` up to ``until[queue_id]``, then one forced compaction; the
    messages pulled per queue."""
    pulled = {qid: replicate_queue(source, sink, topic, qid, until=end)
              for qid, end in dict(until).items()}
    sink.force_compaction(topic)
    log.info("compaction topic %s rebuilt from its master: %s messages", topic,
             sum(pulled.values()))
    return pulled


class GrpcPullSource:
    """``PullMessage`` on the master, asking for raw CommitLog records (the format StrataMQ's
    Spark source uses), decoded into ``StoredMessage`` with their original offsets."""

    def __init__(self, endpoint: str, group: str = "stratamq-ha-replica",
                 timeout: float = 30.0) -> None:
        import grpc
        from rocketmq.grpc_protocol import service_pb2_grpc

        self.group = group
        self.timeout = timeout
        self.channel = grpc.insecure_channel(endpoint)
        self.stub = service_pb2_grpc.MessagingServiceStub(self.channel)

    def pull(self, topic: str, queue_id: int, offset: int, max_count: int
             ) -> tuple[list[StoredMessage], int]:
        from rocketmq.grpc_protocol import definition_pb2 as pb
        from rocketmq.grpc_protocol import service_pb2 as svc

        request = svc.PullMessageRequest(
            group=pb.Resource(name=self.group), offset=offset, batch_size=max_count,
            message_queue=pb.MessageQueue(topic=pb.Resource(name=topic), id=queue_id),
            filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"))
        request.long_polling_timeout.FromMilliseconds(0)
        messages: list[StoredMessage] = []
        next_offset = offset
        for reply in self.stub.PullMessage(request, timeout=self.timeout,
                                           metadata=(("x-stratamq-pull-format", "records"),)):
            if reply.HasField("status") and reply.status.code not in (
                    pb.OK, pb.MESSAGE_NOT_FOUND, pb.ILLEGAL_OFFSET):
                raise RuntimeError(f"pull of {topic}/{queue_id} at {offset} failed: "
                                   f"{pb.Code.Name(reply.status.code)} {reply.status.message}")
            if reply.HasField("message"):
                messages.append(codec.decode(reply.message.body))
            elif reply.HasField("next_offset"):
                next_offset = reply.next_offset
        return messages, next_offset

    def close(self) -> None:
        self.channel.close()
