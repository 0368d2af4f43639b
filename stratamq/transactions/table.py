"""The open transactions, rebuilt from the CommitLog: a store dispatcher that follows the half
topic, the op topic, committed records and ``TRANS_CHECK_MAX_TIME_TOPIC``.

A transaction is keyed by its id (the half's unique id). Its half may have several copies in
the half queue (each check writes one, as RocketMQ does); all of them belong to it. It ends
when the first of these comes by, in log order:

* a record of the commit type carrying its id (the committed message: COMMIT);
* an op record naming the half queue offset of any of its copies (ROLLBACK when no commit
  record came first; after one, the op is the last step of the COMMIT);
* its half in ``TRANS_CHECK_MAX_TIME_TOPIC`` (discarded after too many checks).

So a store written by Apache RocketMQ opens with the same state, and a broker killed between
a commit's two writes knows the commit happened (the op is written again by the next check
round). The engine also ends transactions itself the moment its writes return
(``close``); the dispatcher seeing the same records later changes nothing.

Restart: ``durable_offset()`` is the lowest CommitLog offset of any copy of a transaction not
wholly ended (or, with none, how far it has read), as persisted in ``checkpoint.py``'s file;
the store replays from there, which is all this table needs (every record ending a half comes
after it). It also holds the store's clean-up back from removing an open half (up to the
store's ``dispatcherRetentionHoldMaxBytes``, past which it warns).

Thread-safety: ``dispatch``/``dispatch_batch`` run on whoever holds the store's dispatch
round; every other method may be called from any thread. One lock guards the tables.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from stratamq import record as codec
from stratamq.message import DispatchInfo, Prop
from stratamq.record.layout import SysFlag
from stratamq.store.log_reader import CommitLogReader
from stratamq.transactions.checkpoint import read_replay_from, write_replay_from
from stratamq.transactions.messages import (
    CHECK_IMMUNITY_TIME,
    CHECK_MAX_TOPIC,
    CHECK_TIMES,
    HALF_TOPIC,
    OP_TOPIC,
    REMOVE_TAG,
    op_offsets,
    transaction_id_of,
)

log = logging.getLogger(__name__)

__all__ = ["COMMIT", "DISCARD", "ROLLBACK", "HalfCopy", "OpenTransaction", "TransactionTable"]

COMMIT, ROLLBACK, DISCARD = "COMMIT", "ROLLBACK", "DISCARD"
_COMMIT_TYPE = SysFlag.TRANSACTION_COMMIT_TYPE
_TYPE_MASK = SysFlag.TRANSACTION_MASK
_SPECIAL_TOPICS = frozenset({HALF_TOPIC, OP_TOPIC, CHECK_MAX_TOPIC})
# Ended transactions remembered (id -> how), so a client retrying EndTransaction is answered
# as the first time and a late copy of an ended half is not taken for a new one.
ENDED_MEMORY = 200_000
_CANDIDATES = 64  # checkpoint candidates waiting for the CommitLog flush to pass them


@dataclass(slots=True)
class HalfCopy:
    physical_offset: int
    queue_offset: int
    size: int


@dataclass(slots=True)
class OpenTransaction:
    """One transaction not ended yet. ``lock`` serializes its end and its checks (held by
    the engine around its writes, never by the dispatcher)."""

    transaction_id: str
    real_topic: str
    producer_group: str
    first_stored: int  # store time of its first copy, ms: what its age counts from
    immunity_ms: int | None  # CHECK_IMMUNITY_TIME_IN_SECONDS, when the producer set one
    check_times: int
    copies: list[HalfCopy] = field(default_factory=list)
    committed: bool = False  # a commit record came by; only the op is missing
    ended_at: int = -1  # CommitLog offset of the record that ended it (commit, op, discard)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def latest(self) -> HalfCopy:
        return self.copies[-1]


class TransactionTable:
    """The store dispatcher holding every open transaction (see the module docstring).

    ``checkpoint``: where the replay offset is kept (None: never persisted, replay from the
    start of the CommitLog on every open)."""

    def __init__(self, checkpoint: Path | None) -> None:
        self._checkpoint = checkpoint
        self._durable = read_replay_from(checkpoint) if checkpoint is not None else 0
        self._lock = threading.Lock()
        self._open: dict[str, OpenTransaction] = {}
        self._by_queue_offset: dict[int, str] = {}  # half queue offset -> transaction id
        # Committed, op not seen yet (the op is written after the commit record).
        self._op_missing: dict[str, OpenTransaction] = {}
        self._ended: OrderedDict[str, tuple[str, OpenTransaction]] = OrderedDict()
        self._seen_to = self._durable  # end of the last record dispatched
        self._candidates: deque[tuple[int, int]] = deque(maxlen=_CANDIDATES)
        self._reader: CommitLogReader | None = None
        self.on_end: Callable[[OpenTransaction, str], None] | None = None  # metrics

    # -- the store's dispatcher interface -------------------------------------------------------

    def attach(self, reader: CommitLogReader) -> None:
        self._reader = reader

    def durable_offset(self) -> int:
        return self._durable

    def replay_floor(self, topic: str, queue_id: int) -> int:
        return self._durable

    def dispatch(self, info: DispatchInfo) -> None:
        if (info.topic in _SPECIAL_TOPICS
                or (info.sys_flag & _TYPE_MASK == _COMMIT_TYPE and self._open)):
            self._special(info)
        self._seen_to = max(self._seen_to, info.physical_offset + info.size)

    def dispatch_batch(self, infos: list[DispatchInfo],
                       failed: Callable[[DispatchInfo, OSError], None]) -> None:
        special = _SPECIAL_TOPICS
        for info in infos:
            if (info.topic in special
                    or (info.sys_flag & _TYPE_MASK == _COMMIT_TYPE and self._open)):
                self._special(info)
        if infos:
            last = infos[-1]
            self._seen_to = max(self._seen_to, last.physical_offset + last.size)

    # -- what the records mean ------------------------------------------------------------------

    def _special(self, info: DispatchInfo) -> None:
        topic = info.topic
        props = info.properties
        if topic == HALF_TOPIC:
            self._add_half(info)
        elif topic == OP_TOPIC:
            if props.get(Prop.TAGS) != REMOVE_TAG:
                log.error("op record at %d has tag %r, not %r: ignored", info.physical_offset,
                          props.get(Prop.TAGS), REMOVE_TAG)
                return
            body = self._body(info)
            if body is not None:
                self._end_by_op(op_offsets(body), info.physical_offset)
        elif topic == CHECK_MAX_TOPIC:
            self._end(transaction_id_of(props, info.physical_offset), DISCARD,
                      info.physical_offset)
        else:  # a committed message
            txn_id = props.get(Prop.UNIQ_KEY)
            if txn_id is not None:
                with self._lock:
                    txn = self._open.pop(txn_id, None)
                    if txn is None:
                        return
                    txn.committed = True
                    self._op_missing[txn_id] = txn
                self._ended_as(txn, COMMIT, info.physical_offset)

    def _body(self, info: DispatchInfo) -> bytes | None:
        raw = self._reader.read_bytes(info.physical_offset, info.size) if self._reader else None
        if raw is None:
            log.error("op record at %d cannot be read: the halves it ends stay open",
                      info.physical_offset)
            return None
        return bytes(codec.decode(raw).body)

    def _add_half(self, info: DispatchInfo) -> None:
        props = info.properties
        txn_id = transaction_id_of(props, info.physical_offset)
        copy = HalfCopy(info.physical_offset, info.queue_offset, info.size)
        checks = _int(props.get(CHECK_TIMES)) or 0
        self.add_copy(txn_id, copy, checks, props, info.store_timestamp)

    def add_copy(self, txn_id: str, copy: HalfCopy, check_times: int,
                 props: dict[str, str], stored: int) -> None:
        """A copy of a half (from the dispatcher, or from the engine as soon as a check's copy
        is written): added to its transaction, or opening it."""
        with self._lock:
            if txn_id in self._ended:
                return  # a late copy of an ended transaction
            txn = self._open.get(txn_id) or self._op_missing.get(txn_id)
            if txn is None:
                immunity = _int(props.get(CHECK_IMMUNITY_TIME))
                txn = OpenTransaction(
                    txn_id, props.get(Prop.REAL_TOPIC, ""), props.get(Prop.PRODUCER_GROUP, ""),
                    stored, immunity * 1000 if immunity is not None else None, check_times)
                self._open[txn_id] = txn
            elif any(c.physical_offset == copy.physical_offset for c in txn.copies):
                return  # replayed
            txn.copies.append(copy)
            txn.check_times = max(txn.check_times, check_times)
            self._by_queue_offset[copy.queue_offset] = txn_id

    def _end_by_op(self, offsets: list[int], at: int) -> None:
        for offset in offsets:
            with self._lock:
                txn_id = self._by_queue_offset.get(offset)
                if txn_id is None:
                    continue
                done = self._op_missing.pop(txn_id, None)
                if done is not None:  # the op after a commit record: nothing more to do
                    self._forget_copies(done)
                    continue
            self._end(txn_id, ROLLBACK, at)

    def _end(self, txn_id: str, how: str, at: int) -> OpenTransaction | None:
        with self._lock:
            txn = self._open.pop(txn_id, None)
            if txn is None:
                return None
            self._forget_copies(txn)
        self._ended_as(txn, how, at)
        return txn

    def _forget_copies(self, txn: OpenTransaction) -> None:
        for c in txn.copies:
            if self._by_queue_offset.get(c.queue_offset) == txn.transaction_id:
                del self._by_queue_offset[c.queue_offset]

    def _ended_as(self, txn: OpenTransaction, how: str, at: int) -> None:
        with self._lock:
            txn.ended_at = at
            self._ended[txn.transaction_id] = (how, txn)
            if len(self._ended) > ENDED_MEMORY:
                self._ended.popitem(last=False)
        if self.on_end is not None:
            self.on_end(txn, how)

    # -- for the engine -------------------------------------------------------------------------

    def get(self, txn_id: str) -> OpenTransaction | None:
        with self._lock:
            return self._open.get(txn_id)

    def ended_as(self, txn_id: str) -> str | None:
        with self._lock:
            ended = self._ended.get(txn_id)
            return ended[0] if ended is not None else None

    def close(self, txn: OpenTransaction, how: str, at: int, *, op_written: bool) -> None:
        """The engine ended ``txn`` with the record at ``at`` (stored); without ``op_written``
        (the op write failed after a commit) it waits in the op-missing list for the check
        round."""
        with self._lock:
            if self._open.get(txn.transaction_id) is txn:
                del self._open[txn.transaction_id]
            elif self._op_missing.get(txn.transaction_id) is not txn:
                return  # ended already (the dispatcher saw its records first)
            if op_written:
                self._op_missing.pop(txn.transaction_id, None)
                self._forget_copies(txn)
            else:
                txn.committed = True
                self._op_missing[txn.transaction_id] = txn
            already = self._ended.get(txn.transaction_id) is not None
        if not already:
            self._ended_as(txn, how, at)

    def op_written(self, txn: OpenTransaction) -> None:
        with self._lock:
            if self._op_missing.pop(txn.transaction_id, None) is not None:
                self._forget_copies(txn)

    def op_missing(self, txn: OpenTransaction) -> bool:
        with self._lock:
            return self._op_missing.get(txn.transaction_id) is txn

    def open_transactions(self) -> list[OpenTransaction]:
        with self._lock:
            return list(self._open.values())

    def missing_ops(self) -> list[OpenTransaction]:
        with self._lock:
            return list(self._op_missing.values())

    def __len__(self) -> int:
        return len(self._open)

    def by_topic(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        with self._lock:
            for txn in self._open.values():
                counts[txn.real_topic] = counts.get(txn.real_topic, 0) + 1
        return counts

    def __iter__(self) -> Iterator[OpenTransaction]:
        return iter(self.open_transactions())

    def truncate_from(self, offset: int) -> None:
        """A slave's CommitLog was cut back to ``offset`` (``ReplicaLog.truncate``): copies
        from there on are gone, and transactions ended by a record from there on are open
        again (with the copies they have left); the replay offset moves back below them."""
        reopened = 0
        with self._lock:
            for txn in [*self._open.values(), *self._op_missing.values(),
                        *(t for _, t in self._ended.values() if t.ended_at >= offset)]:
                self._forget_copies(txn)
                self._open.pop(txn.transaction_id, None)
                self._op_missing.pop(txn.transaction_id, None)
                if txn.ended_at >= offset:
                    self._ended.pop(txn.transaction_id, None)
                    txn.ended_at, txn.committed = -1, False
                    reopened += 1
                txn.copies = [c for c in txn.copies if c.physical_offset < offset]
                if not txn.copies:
                    continue
                if txn.committed:  # its commit record is before the cut: only the op is not
                    self._op_missing[txn.transaction_id] = txn
                else:
                    self._open[txn.transaction_id] = txn
                for c in txn.copies:
                    self._by_queue_offset[c.queue_offset] = txn.transaction_id
            lows = [t.copies[0].physical_offset
                    for t in (*self._open.values(), *self._op_missing.values())]
            self._seen_to = min(self._seen_to, offset)
            self._candidates.clear()
            durable = min([self._durable, offset, *lows])
        if reopened:
            log.warning("CommitLog cut back to %d: %d transactions ended after it are open "
                        "again", offset, reopened)
        if durable < self._durable:
            if self._checkpoint is not None:
                write_replay_from(self._checkpoint, durable)
            self._durable = durable

    # -- the replay offset ----------------------------------------------------------------------

    def save(self, flushed_offset: int) -> None:
        """Persist the replay offset, once the CommitLog is flushed past every record it
        relies on: a candidate (floor, read up to) is taken now and written only when
        ``flushed_offset`` has reached its "read up to" (an op record lost with an unflushed
        tail must not leave its half behind the replay offset)."""
        with self._lock:
            lows = [c.physical_offset for txns in (self._open, self._op_missing)
                    for t in txns.values() for c in t.copies[:1]]
            seen = self._seen_to
        self._candidates.append((min([*lows, seen]), seen))
        best = None
        while self._candidates and self._candidates[0][1] <= flushed_offset:
            best = self._candidates.popleft()
        if best is None or best[0] <= self._durable:
            return
        if self._checkpoint is not None:
            write_replay_from(self._checkpoint, best[0])
        self._durable = best[0]


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        return None
