"""Queue locks for orderly consumption: ``LOCK_BATCH_MQ`` / ``UNLOCK_BATCH_MQ``.

RocketMQ's ``RebalanceLockManager``: a (group, queue) is locked by one client id at a time; a
lock its holder does not renew expires after 60 s (``rocketmq.broker.rebalance.lockMaxLiveTime``)
and may then be taken by another client. The lock request answers the subset of the asked
queues the client now holds (``LockBatchResponseBody.lockOKMQSet``). Time is passed in
(``now_ms``) so expiry is tested without waiting.

Thread-safety: a lock; requests arrive on the event loop, tests call it directly.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from stratamq.remoting.codec import RemotingCommand
from stratamq.remoting.codes import ResponseCode
from stratamq.remoting.namesrv import to_json
from stratamq.remoting.transport import Connection

__all__ = ["LOCK_MAX_LIVE_MS", "QueueLocks"]

LOCK_MAX_LIVE_MS = 60_000

Queue = tuple[str, str, int]  # topic, broker name, queue id


def _queue(d: Any) -> Queue:
    return str(d["topic"]), str(d.get("brokerName", "")), int(d["queueId"])


def _queue_json(q: Queue) -> dict[str, Any]:
    return {"topic": q[0], "brokerName": q[1], "queueId": q[2]}


class QueueLocks:
    def __init__(self) -> None:
        self._held: dict[tuple[str, Queue], tuple[str, int]] = {}  # -> client id, last lock
        self._lock = threading.Lock()

    def lock(self, group: str, client_id: str, queues: list[Queue], now_ms: int) -> list[Queue]:
        """Take or renew each queue's lock for ``client_id``; the queues it holds now."""
        got = []
        with self._lock:
            for q in queues:
                holder = self._held.get((group, q))
                if holder is None or holder[0] == client_id \
                        or now_ms - holder[1] > LOCK_MAX_LIVE_MS:
                    self._held[(group, q)] = (client_id, now_ms)
                    got.append(q)
        return got

    def unlock(self, group: str, client_id: str, queues: list[Queue]) -> None:
        with self._lock:
            for q in queues:
                holder = self._held.get((group, q))
                if holder is not None and holder[0] == client_id:
                    del self._held[(group, q)]

    # -- the remoting handlers ------------------------------------------------------------------

    @staticmethod
    def _body(request: RemotingCommand) -> tuple[str, str, list[Queue]]:
        doc = json.loads(request.body or b"{}")
        return (str(doc.get("consumerGroup", "")), str(doc.get("clientId", "")),
                [_queue(q) for q in doc.get("mqSet") or []])

    async def lock_batch(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        try:
            group, client, queues = self._body(request)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            return request.response(ResponseCode.SYSTEM_ERROR, f"bad LockBatchRequestBody: {exc}")
        held = self.lock(group, client, queues, int(time.time() * 1000))
        return request.response(ResponseCode.SUCCESS, body=to_json(
            {"lockOKMQSet": [_queue_json(q) for q in held]}))

    async def unlock_batch(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        try:
            group, client, queues = self._body(request)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            return request.response(ResponseCode.SYSTEM_ERROR,
                                    f"bad UnlockBatchRequestBody: {exc}")
        self.unlock(group, client, queues)
        return request.response(ResponseCode.SUCCESS)
