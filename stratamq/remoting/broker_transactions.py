"""Transactional messages over remoting: ``END_TRANSACTION`` and ``CHECK_TRANSACTION_STATE``
on the protocol-free engine in ``stratamq/transactions`` (the one the gRPC adapter uses).

* A 4.x transactional send (property ``TRAN_MSG=true``) is stored as the half message the
  gRPC path stores (``transactions.messages.half_message``, producer group from the header);
  see ``broker_send.py``.
* ``END_TRANSACTION`` as RocketMQ's ``EndTransactionProcessor``: a slave answers
  ``SLAVE_NOT_AVAILABLE``; a "not type" (UNKNOWN) answer or an unknown type gets no response;
  the half is read at ``commitLogOffset`` and checked (``checkPrepareMessage``: its producer
  group, queue offset and CommitLog offset must match the header's, else ``SYSTEM_ERROR``
  with RocketMQ's remarks); then the engine commits or rolls back, once per transaction (a
  retry answers as the first did; RocketMQ itself would store a second commit).
* ``RemotingProducers``: the 4.x producers of each group, from ``HEART_BEAT``'s
  ``producerDataSet`` (RocketMQ's ``ProducerManager``); a check goes to one live connection
  of the half's producer group, round robin, as ``CHECK_TRANSACTION_STATE`` oneway with
  ``CheckTransactionStateRequestHeader`` and the half encoded as ``MessageDecoder.encode``
  writes it (real topic and queue, the check copy's offsets), as ``Broker2Client`` sends it.

Thread-safety: ``RemotingProducers`` any thread (a check is handed to the server's loop);
handlers on the broker's event loop, the engine's work through ``run``.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any

from stratamq.broker.lookup import Lookup
from stratamq.broker.ports import Call
from stratamq.message import Message, Prop, StoredMessage
from stratamq.record.codec import encode_record, offset_msg_id, stamp
from stratamq.record.layout import SysFlag
from stratamq.remoting.broker_send import _int
from stratamq.remoting.clients import ConsumerTable
from stratamq.remoting.codec import FLAG_ONEWAY, RemotingCommand
from stratamq.remoting.codes import RequestCode, ResponseCode
from stratamq.remoting.errors import RemotingError, answer_in
from stratamq.remoting.transport import Connection
from stratamq.transactions import CheckRequest, Resolution, TransactionEngine, TransactionError
from stratamq.transactions.messages import CHECK_TIMES, HALF_TOPIC, transaction_id_of

__all__ = ["ProducerTable", "RemotingProducers", "TransactionHandlers", "check_body"]

_RESOLUTIONS = {SysFlag.TRANSACTION_COMMIT_TYPE: Resolution.COMMIT,
                SysFlag.TRANSACTION_ROLLBACK_TYPE: Resolution.ROLLBACK}
_NO_HALF = "Find prepared transaction message failed"


class ProducerTable(ConsumerTable):
    """The producers of each group with their connections (RocketMQ's ``ProducerManager``):
    the same bookkeeping as consumers (heartbeat, unregister, closed connection, 120 s)."""


def check_body(half: StoredMessage, check: CheckRequest) -> bytes:
    """The half as ``MessageDecoder.encode(msgExt, false)`` writes it for a check: the real
    topic and queue, the check copy's queue and CommitLog offsets and check count."""
    props = dict(half.properties)
    if check.check_times:
        props[CHECK_TIMES] = str(check.check_times)
    msg = Message(props.get(Prop.REAL_TOPIC, half.topic), bytes(half.body),
                  int(props.get(Prop.REAL_QUEUE_ID, half.queue_id)), props, half.flag,
                  half.sys_flag, half.born_timestamp, half.born_host, half.reconsume_times,
                  half.prepared_transaction_offset)
    data, _, timestamp_pos = encode_record(msg, half.store_host, 1 << 30)
    record = bytearray(data)
    offset = check.copy_offset if check.copy_offset >= 0 else half.physical_offset
    queue_offset = check.copy_queue_offset if check.copy_offset >= 0 else half.queue_offset
    stamp(record, 0, queue_offset, offset, half.store_timestamp, timestamp_pos)
    return bytes(record)


class RemotingProducers:
    """Sends checks to 4.x producers (see the module docstring); a notifier of the engine."""

    def __init__(self) -> None:
        self.table = ProducerTable()
        self.loop: asyncio.AbstractEventLoop | None = None  # the remoting server's, at start
        self._turn = itertools.count()
        self.sent = 0

    def has_producer(self, producer_group: str, topic: str) -> bool:
        return self.loop is not None and bool(self.table.connections(producer_group))

    def __call__(self, check: CheckRequest) -> bool:
        conns = self.table.connections(check.producer_group)
        loop = self.loop
        if not conns or loop is None:
            return False
        conn = conns[next(self._turn) % len(conns)]
        half = check.half
        offset = check.copy_offset if check.copy_offset >= 0 else half.physical_offset
        uniq = half.properties.get(Prop.UNIQ_KEY, "")
        header = {"tranStateTableOffset": str(check.copy_queue_offset if check.copy_offset >= 0
                                              else half.queue_offset),
                  "commitLogOffset": str(offset),
                  "offsetMsgId": offset_msg_id(half.store_host, offset),
                  "msgId": uniq, "transactionId": uniq}
        command = RemotingCommand(RequestCode.CHECK_TRANSACTION_STATE, flag=FLAG_ONEWAY,
                                  ext_fields=header, body=check_body(half, check))
        try:
            loop.call_soon_threadsafe(conn.send, command)
        except RuntimeError:  # the loop closed: the server is gone
            return False
        self.sent += 1
        return True


class TransactionHandlers:
    """``END_TRANSACTION`` over the engine (None until transactions run), the record at a
    CommitLog offset, and whether this broker is a slave."""

    def __init__(self, lookup: Lookup, engine: Callable[[], TransactionEngine | None],
                 look_up: Callable[[int], StoredMessage | None], is_slave: Callable[[], bool],
                 call_of: Callable[[RemotingCommand, Connection], Call],
                 run: Callable[..., Any]) -> None:
        self.lookup = lookup
        self.engine = engine
        self.look_up = look_up
        self.is_slave = is_slave
        self.call_of = call_of
        self.run = run

    async def end_transaction(self, request: RemotingCommand, conn: Connection
                              ) -> RemotingCommand | None:
        if self.is_slave():
            return request.response(ResponseCode.SLAVE_NOT_AVAILABLE)
        resolution = _RESOLUTIONS.get(_int(request.ext_fields, "commitOrRollback", -1))
        if resolution is None:  # "not type" (still pending) or no type: no response
            return None
        return await answer_in(self.run, self._end, request, conn, resolution)

    def _end(self, request: RemotingCommand, conn: Connection,
             resolution: Resolution) -> RemotingCommand:
        h = request.ext_fields
        engine = self.engine()
        if engine is None:
            raise RemotingError(ResponseCode.SYSTEM_ERROR,
                                "transactional messages are not served by this broker")
        offset = _int(h, "commitLogOffset")
        half = self.look_up(offset)
        if half is None or half.physical_offset != offset or half.topic != HALF_TOPIC \
                or Prop.REAL_TOPIC not in half.properties:
            raise RemotingError(ResponseCode.SYSTEM_ERROR, _NO_HALF)
        self.lookup.authorize(self.call_of(request, conn),
                              f"Topic:{half.properties[Prop.REAL_TOPIC]}", "Pub")
        group = h.get("producerGroup", "")
        if half.properties.get(Prop.PRODUCER_GROUP) != group:
            raise RemotingError(ResponseCode.SYSTEM_ERROR, "The producer group wrong")
        if half.queue_offset != _int(h, "tranStateTableOffset"):
            raise RemotingError(ResponseCode.SYSTEM_ERROR,
                                "The transaction state table offset wrong")
        from_check = h.get("fromTransactionCheck", "false").lower() == "true"
        try:
            engine.end(group, transaction_id_of(half.properties, offset), resolution,
                       from_check=from_check)
        except TransactionError as exc:
            raise RemotingError(ResponseCode.SYSTEM_ERROR, exc.message) from None
        return request.response(ResponseCode.SUCCESS)
