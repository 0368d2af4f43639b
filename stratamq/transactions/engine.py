"""Ending transactions and checking back on orphaned ones: RocketMQ's
``EndTransactionProcessor`` and ``TransactionalMessageServiceImpl.check`` over narrow parts,
free of any protocol (the gRPC adapter calls it; the 4.x remoting protocol can too).

The engine is handed: ``put(messages)`` (store them, one result each, in order), ``look(offset)``
(the record at a CommitLog offset), ``caught_up()`` (wait until the dispatcher has read every
stored record), ``notify(check)`` (send a check to a live producer; False when none is
connected) and the settings. It never touches the store or the broker otherwise.

End (``end``): COMMIT writes the committed message to the real topic, then the op record;
ROLLBACK the op record only. Each transaction's lock makes its end happen once: a retried
EndTransaction, or a check's answer racing the producer's own, finds it ended and is answered
as the first (the same resolution: OK; the other: ``TransactionEnded``). A crash between a
commit's two writes leaves the commit record, which the table reads as the end on the next
open; the missing op is written by the next check round.

Check (``check_round``), each ``transactionCheckInterval``: every open transaction older than
its ``CHECK_IMMUNITY_TIME_IN_SECONDS`` (the client's orphaned-transaction recovery duration),
else ``transactionTimeOut``, is checked: with no live producer it waits for the next round and
the check is not counted; else, past ``transactionCheckMax`` checks, its half moves to
``TRANS_CHECK_MAX_TIME_TOPIC`` (an ERROR is logged, as RocketMQ does); else a copy of the half
with the count raised is written (the count survives restarts) and the producer is asked.

Thread-safety: any thread; ``check_round`` from one thread at a time (the check service).
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple

from stratamq.message import Host, Message, Prop, StoredMessage
from stratamq.transactions.messages import (
    HALF_TOPIC,
    check_copy,
    committed_message,
    discarded_message,
    op_message,
)
from stratamq.transactions.table import (
    COMMIT,
    DISCARD,
    ROLLBACK,
    HalfCopy,
    OpenTransaction,
    TransactionTable,
)

log = logging.getLogger(__name__)

__all__ = ["CheckRequest", "Resolution", "Stored", "TransactionEngine", "TransactionError",
           "TransactionSettings", "KILL_ENV"]

# Test hook (a real SIGKILL at a named point, as compaction's swap has): "commit-stored" kills
# the process after a commit's message is stored and before its op record.
KILL_ENV = "STRATAMQ_TRANSACTION_KILL_AT"


class Resolution(Enum):
    COMMIT = "COMMIT"
    ROLLBACK = "ROLLBACK"
    UNKNOWN = "UNKNOWN"


class Stored(NamedTuple):
    """One message's put: stored or not (why), and where."""

    ok: bool
    physical_offset: int = -1
    queue_offset: int = -1
    problem: str = ""


class CheckRequest(NamedTuple):
    """What a producer is asked: the half (topic and queue as it was sent) and its ids;
    where the check's copy was stored and its check count (a 4.x producer answers with the
    copy's CommitLog and queue offsets, as RocketMQ's check hands it the renewed half)."""

    producer_group: str
    real_topic: str
    transaction_id: str
    half: StoredMessage
    copy_offset: int = -1
    copy_queue_offset: int = -1
    check_times: int = 0


@dataclass(frozen=True)
class TransactionSettings:
    check_interval_ms: int = 30_000  # transactionCheckInterval
    timeout_ms: int = 6_000  # transactionTimeOut
    check_max: int = 15  # transactionCheckMax


class TransactionError(Exception):
    """An EndTransaction refused; ``kind``: "not-found", "ended", "store"."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


Put = Callable[[list[Message]], list[Stored]]
Look = Callable[[int], StoredMessage | None]
Notify = Callable[[CheckRequest], bool]


@dataclass
class CheckReport:
    checked: int = 0
    discarded: int = 0
    waiting_for_producer: int = 0
    ops_rewritten: int = 0


class TransactionEngine:
    """See the module docstring. ``on_finish(topic, how, seconds)`` is told of every commit
    and rollback (metrics); ``commits`` / ``rollbacks`` count them per real topic."""

    def __init__(self, table: TransactionTable, put: Put, look: Look,
                 caught_up: Callable[[], object], store_host: Host,
                 settings: TransactionSettings | None = None,
                 notify: Notify | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.table = table
        self.put = put
        self.look = look
        self.caught_up = caught_up
        self.store_host = store_host
        self.settings = settings or TransactionSettings()
        self.notify = notify
        self.clock = clock
        self.commits: dict[str, int] = {}  # real topic -> count (rocketmq_commit_messages_total)
        self.rollbacks: dict[str, int] = {}
        # (real topic, how, seconds from the half's store time): rocketmq_finish_message_latency
        self.on_finish: Callable[[str, str, float], None] | None = None
        self._kill_at = os.environ.get(KILL_ENV)
        table.on_end = self._count_end

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    def _count_end(self, txn: OpenTransaction, how: str) -> None:
        counts = self.commits if how == COMMIT else self.rollbacks if how == ROLLBACK else None
        if counts is not None:
            counts[txn.real_topic] = counts.get(txn.real_topic, 0) + 1
            if self.on_finish is not None:
                self.on_finish(txn.real_topic, how,
                               max(0.0, (self._now_ms() - txn.first_stored) / 1000))

    # -- EndTransaction -------------------------------------------------------------------------

    def end(self, producer_group: str, transaction_id: str, resolution: Resolution,
            from_check: bool = False) -> None:
        """Commit or roll back; UNKNOWN leaves the transaction open for the next check."""
        txn = self.table.get(transaction_id)
        if txn is None:
            self.caught_up()  # a half acknowledged a moment ago may not be dispatched yet
            txn = self.table.get(transaction_id)
        # gRPC producers' group is the topic (the proxy's convention); a half written by a
        # 4.x producer names its own group.
        if txn is None or producer_group not in (txn.producer_group, txn.real_topic):
            self._already(transaction_id, resolution)
            return
        if resolution is Resolution.UNKNOWN:
            log.info("transaction %s: the producer answered UNKNOWN%s; checked again later",
                     transaction_id, " to a check" if from_check else "")
            return
        with txn.lock:
            if self.table.get(transaction_id) is not txn:
                self._already(transaction_id, resolution)
                return
            half = self._half(txn.latest)
            if half is None:
                raise TransactionError("store", "Find prepared transaction message failed")
            commit_at = -1
            if resolution is Resolution.COMMIT:
                stored = self.put([committed_message(half)])[0]
                if not stored.ok:
                    raise TransactionError("store", f"commit not stored: {stored.problem}")
                commit_at = stored.physical_offset
                if self._kill_at == "commit-stored":
                    log.warning("%s=commit-stored: killing the process", KILL_ENV)
                    os.kill(os.getpid(), signal.SIGKILL)
            op = self.put([op_message([c.queue_offset for c in txn.copies],
                                      self.store_host)])[0]
            if not op.ok and resolution is Resolution.ROLLBACK:
                raise TransactionError("store", f"rollback not stored: {op.problem}")
            if not op.ok:
                log.error("transaction %s committed, but its op record was not stored (%s): "
                          "the next check round writes it", transaction_id, op.problem)
            self.table.close(txn, COMMIT if resolution is Resolution.COMMIT else ROLLBACK,
                             op.physical_offset if op.ok else commit_at,
                             op_written=op.ok)

    def _already(self, transaction_id: str, resolution: Resolution) -> None:
        ended = self.table.ended_as(transaction_id)
        if ended is None:
            raise TransactionError("not-found", "cannot found transaction data")
        if resolution is Resolution.UNKNOWN or ended == resolution.value:
            return  # a retry of the same end: answered as the first was
        how = {COMMIT: "committed", ROLLBACK: "rolled back",
               DISCARD: "moved to TRANS_CHECK_MAX_TIME_TOPIC after too many checks"}[ended]
        raise TransactionError("ended", f"transaction {transaction_id} was already {how}")

    def _half(self, copy: HalfCopy) -> StoredMessage | None:
        half = self.look(copy.physical_offset)
        if half is None or half.topic != HALF_TOPIC or Prop.REAL_TOPIC not in half.properties:
            log.error("the half at CommitLog offset %d cannot be read", copy.physical_offset)
            return None
        return half

    # -- check-back -----------------------------------------------------------------------------

    def check_round(self) -> CheckReport:
        """One round of checks (see the module docstring)."""
        report = CheckReport()
        self._write_missing_ops(report)
        now = self._now_ms()
        s = self.settings
        due = [t for t in self.table.open_transactions()
               if now - t.first_stored > (t.immunity_ms if t.immunity_ms is not None
                                          else s.timeout_ms)]
        due.sort(key=lambda t: t.first_stored)
        batch: list[tuple[OpenTransaction, StoredMessage, Message]] = []
        for txn in due:
            if not txn.lock.acquire(blocking=False):
                continue  # being ended right now
            try:
                if self.table.get(txn.transaction_id) is not txn:
                    continue
                if txn.check_times < s.check_max and (
                        self.notify is None or not self._has_producer(txn)):
                    report.waiting_for_producer += 1  # (its half is not even read)
                    continue
                half = self._half(txn.latest)
                if half is None:
                    continue
                if txn.check_times >= s.check_max:
                    self._discard(txn, half, report)
                    continue
                batch.append((txn, half, check_copy(half, txn.check_times + 1)))
            finally:
                txn.lock.release()
            if len(batch) >= 256:
                self._check(batch, report)
                batch = []
        if batch:
            self._check(batch, report)
        return report

    def _has_producer(self, txn: OpenTransaction) -> bool:
        probe = getattr(self.notify, "has_producer", None)
        return True if probe is None else bool(probe(txn.producer_group, txn.real_topic))

    def _check(self, batch: list[tuple[OpenTransaction, StoredMessage, Message]],
               report: CheckReport) -> None:
        """Write the check copies of ``batch`` in one put, then ask the producers."""
        results = self.put([copy for _, _, copy in batch])
        for (txn, half, copy), stored in zip(batch, results, strict=True):
            if not stored.ok:
                log.error("transaction %s: check copy not stored (%s); checked next round",
                          txn.transaction_id, stored.problem)
                continue
            checks = int(copy.properties["TRANSACTION_CHECK_TIMES"])
            self.table.add_copy(txn.transaction_id,
                                HalfCopy(stored.physical_offset, stored.queue_offset, 0),
                                checks, copy.properties, txn.first_stored)
            report.checked += 1
            assert self.notify is not None
            self.notify(CheckRequest(txn.producer_group, txn.real_topic, txn.transaction_id,
                                     half, stored.physical_offset, stored.queue_offset,
                                     checks))

    def _discard(self, txn: OpenTransaction, half: StoredMessage, report: CheckReport) -> None:
        log.error("transaction %s (topic %s) was checked %d times without an answer: its half "
                  "moves to TRANS_CHECK_MAX_TIME_TOPIC (transactionCheckMax)",
                  txn.transaction_id, txn.real_topic, txn.check_times)
        stored = self.put([discarded_message(half)])[0]
        if not stored.ok:
            log.error("transaction %s: not moved (%s); tried again next round",
                      txn.transaction_id, stored.problem)
            return
        self.table.close(txn, DISCARD, stored.physical_offset, op_written=True)
        report.discarded += 1

    def _write_missing_ops(self, report: CheckReport) -> None:
        """Op records of commits whose op was not stored (a crash between the two writes,
        or a failed op write)."""
        for txn in self.table.missing_ops():
            with txn.lock:
                if not self.table.op_missing(txn):
                    continue  # written by the end that held the lock
                op = self.put([op_message([c.queue_offset for c in txn.copies],
                                          self.store_host)])[0]
                if op.ok:
                    self.table.op_written(txn)
                    report.ops_rewritten += 1

    # -- listing --------------------------------------------------------------------------------

    def open_transactions(self) -> list[dict[str, object]]:
        """Open transactions, oldest first: id, real topic, producer group, age, checks."""
        now = self._now_ms()
        rows = [{"transaction_id": t.transaction_id, "topic": t.real_topic,
                 "producer_group": t.producer_group, "age_ms": max(0, now - t.first_stored),
                 "checks": t.check_times,
                 "half_offset": t.latest.physical_offset}
                for t in self.table.open_transactions()]
        rows.sort(key=lambda r: -int(r["age_ms"]))  # type: ignore[call-overload]
        return rows
