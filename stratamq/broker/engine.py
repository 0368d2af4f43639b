"""The pop/receive engine: pop, ack, invisible time, redelivery, DLQ, FIFO.

No gRPC and no waiting here: ``receiving.py`` turns requests into calls on ``PopEngine`` (and
waits, when a pop finds nothing, in ``polling.py``), so tests drive the semantics directly.

Semantics (Apache RocketMQ 5's pop consumption, simplified where noted):

* A receive pops up to ``batch`` messages of one topic for one group, across all the topic's
  readable queues (starting at the queue the client named, so clients spread out). A popped
  message is *in flight* until acked or until its invisible time passes; then the next receive
  delivers it again with ``delivery_attempt`` + 1. Redelivery is served from the original queue
  (RocketMQ copies the message into ``%RETRY%<group>`` first; serving it in place keeps FIFO
  order and writes nothing per retry).
* A message whose ``delivery_attempt`` reached the group's ``retryMaxTimes + 1`` is not
  delivered again: it is copied to ``%DLQ%<group>`` (queue 0, with ``DLQ_ORIGIN_TOPIC`` /
  ``DLQ_ORIGIN_MESSAGE_ID``) and leaves the group's in-flight set.
* FIFO (the topic is FIFO or the group is ``consumeMessageOrderly``): a queue with a message in
  flight delivers nothing new to that group, and an expired message is redelivered only when
  every earlier one in flight in its queue has expired too. Producers' message groups map to
  queues by hash, so the next message of a group is delivered only after the previous one was
  acked (a queue is the unit of order, so groups sharing a queue also wait for each other).
* A new group starts at each queue's min offset: it sees every message still retained.
* Messages a group's tag filter rejects count as consumed by that group.
* Every state change is persisted (``PopState``) before the response leaves, so a restart, even
  after SIGKILL, neither loses an unacked message (it is redelivered after its invisible time)
  nor redelivers an acked one.

Thread-safety: every public method may be called from any thread; a lock per (group, topic)
serialises pops and acks of that pair. Acks, invisible-time changes and DLQ moves call
``notify(topic)`` (``LongPolls.notify``) after they changed the state.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from rocketmq.grpc_protocol import definition_pb2 as pb

from stratamq.broker.convert import (
    DLQ_ORIGIN_MESSAGE_ID,
    DLQ_ORIGIN_TOPIC,
    Receipt,
    message_id_of,
)
from stratamq.broker.errors import BrokerError, damage_text
from stratamq.broker.metadata import (
    GroupConfig,
    MetadataStore,
    TopicConfig,
    dlq_topic,
    is_system_topic,
)
from stratamq.broker.pop_state import InFlight, PopState
from stratamq.broker.ports import QueueStore
from stratamq.message import Message, Prop, RecordCorrupt, StoredMessage
from stratamq.store.filter import TagFilter
from stratamq.store.results import GetMessageStatus

Code = pb.Code
log = logging.getLogger(__name__)

__all__ = ["PopEngine", "Popped", "now_ms"]


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class Popped:
    message: StoredMessage
    receipt: Receipt
    attempt: int
    invisible_ms: int


class PopEngine:
    """Pops, acks and redelivers for every group; any thread (see the module docstring).

    Handed the queues it reads and writes dead letters to, the metadata (for DLQ topics) and
    the pop state it owns the writes of."""

    def __init__(self, store: QueueStore, meta: MetadataStore, state: PopState,
                 notify: Callable[[str], None] = lambda topic: None) -> None:
        self.store = store
        self.meta = meta
        self.state = state
        self.notify = notify  # (topic): wakes its long polls (an ack may free a FIFO queue)
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self.on_dlq: Callable[[str, str], None] | None = None  # (group, topic): metrics

    def _lock(self, group: str, topic: str) -> threading.Lock:
        key = (group, topic)
        lock = self._locks.get(key)
        if lock is None:
            with self._locks_guard:
                lock = self._locks.setdefault(key, threading.Lock())
        return lock

    @staticmethod
    def orderly(topic: TopicConfig, group: GroupConfig) -> bool:
        return topic.message_type == "FIFO" or group.consume_message_orderly

    # -- receive --------------------------------------------------------------------------------

    def next_visible(self, group: str, topic: str) -> int | None:
        """When the next in-flight message turns visible (ms since the epoch; None: none will
        by itself). A long poll waits no longer than this.

        Entries already visible are left out: the pop that just ran did not deliver them, so
        they are blocked (a FIFO queue behind an earlier invisible message) and only an ack,
        a change of invisible time (both notify) or a later expiry can free them; counting them
        would turn the long poll into a busy loop.
        """
        now = now_ms()
        return min((e.visible_at for e in self.state.entries(group, topic).values()
                    if e.visible_at > now), default=None)

    def pop_once(self, group: GroupConfig, topic: TopicConfig, filt: TagFilter, batch: int,
                 invisible_ms: int, start_queue: int = 0) -> list[Popped]:
        g, t = group.name, topic.name
        orderly = self.orderly(topic, group)
        with self._lock(g, t):
            now = now_ms()
            out: list[Popped] = []
            put: dict[tuple[int, int], InFlight] = {}
            delete: list[tuple[int, int]] = []
            cursors: dict[int, int] = {}
            damage: str | None = None  # a damaged message that stopped a queue, if any
            visible_at = now + invisible_ms
            gen = now

            # 1. Redeliver what has become visible again (oldest queue position first), read
            # in runs of consecutive offsets: one store read per run, not per message. The
            # in-flight entries are scanned only when one of them is due: with thousands in
            # flight, sorting them all for every pop was most of a pop's cost.
            earliest = self.state.earliest(g, t)
            due_now = earliest is not None and earliest <= now
            entries = self.state.entries(g, t) if due_now else {}
            blocked: set[int] = set()
            due: list[tuple[int, int, InFlight]] = []
            for (qid, off) in sorted(entries):
                if len(due) >= batch:
                    break
                e = entries[(qid, off)]
                if e.visible_at > now:
                    blocked.add(qid)
                    continue
                if orderly and qid in blocked:
                    continue
                due.append((qid, off, e))
            held = self._read_runs(g, t, [(qid, off) for qid, off, _e in due])
            for qid, off, e in due:
                msg = held.get((qid, off))
                if msg is None:  # removed by retention: nothing left to deliver
                    delete.append((qid, off))
                    continue
                if e.attempt >= group.max_delivery_attempts:
                    self._put_dlq(g, msg, e.attempt)
                    delete.append((qid, off))
                    continue
                ne = InFlight(visible_at, e.attempt + 1, max(gen, e.generation + 1))
                put[(qid, off)] = ne
                out.append(Popped(msg, Receipt(qid, off, ne.generation, visible_at),
                                  ne.attempt, invisible_ms))
            # Queues still holding a message in flight: closed to new FIFO deliveries.
            if not orderly:
                busy: set[int] = set()
            elif due_now:
                busy = {q for (q, _o) in (set(entries) - set(delete)) | set(put)}
            else:
                busy = self.state.busy_queues(g, t)

            # 2. New messages, queue by queue from the cursor.
            qcount = topic.read_queue_nums
            for i in range(qcount):
                if len(out) >= batch:
                    break
                qid = (start_queue + i) % qcount
                if orderly and qid in busy:
                    continue
                cursor = self.state.cursor(g, t, qid)
                if cursor is None:
                    cursor = self.store.get_min_offset_in_queue(t, qid)
                got = self.store.get_messages(g, t, qid, cursor, max_count=batch - len(out),
                                              tag_filter=filt)
                with got:
                    status = got.status
                    if status in (GetMessageStatus.FOUND, GetMessageStatus.NO_MATCHED_MESSAGE,
                                  GetMessageStatus.MESSAGE_WAS_REMOVING,
                                  GetMessageStatus.OFFSET_TOO_SMALL):
                        new_cursor = got.next_begin_offset
                    elif status is GetMessageStatus.OFFSET_FOUND_NULL:
                        # A hole (data lost from the tier): past it, to what exists. Its
                        # next offset is the cursor itself when the data is there but could
                        # not be read now: the cursor stays.
                        new_cursor = max(cursor, got.next_begin_offset)
                    elif status is GetMessageStatus.OFFSET_OVERFLOW_BADLY:
                        new_cursor = got.max_offset  # the queue lost its tail (power cut)
                    else:
                        new_cursor = cursor
                    try:
                        for msg in got.messages():
                            key = (qid, msg.queue_offset)
                            ne = InFlight(visible_at, 1, gen)
                            put[key] = ne
                            out.append(Popped(msg, Receipt(qid, msg.queue_offset, gen,
                                                           visible_at), 1, invisible_ms))
                    except RecordCorrupt as exc:
                        # Delivered up to the damaged message; the queue's cursor stays on
                        # it, and the other queues are still served.
                        damage = f"{t}/{qid}: {damage_text(exc)}"
                        log.error("ReceiveMessage of group %r: %s", g, damage)
                        if exc.queue_offset is not None:
                            new_cursor = exc.queue_offset
                        else:
                            new_cursor = cursor
                if new_cursor != cursor or self.state.cursor(g, t, qid) is None:
                    cursors[qid] = new_cursor
            if put or delete or cursors:
                self.state.apply(g, t, cursors=cursors, put=put, delete=delete)
            if not out and damage is not None:
                raise BrokerError(Code.INTERNAL_SERVER_ERROR, damage)
            return out

    def _read_one(self, group: str, topic: str, qid: int, offset: int) -> StoredMessage | None:
        return self._read_runs(group, topic, [(qid, offset)]).get((qid, offset))

    def _read_runs(self, group: str, topic: str, keys: list[tuple[int, int]]
                   ) -> dict[tuple[int, int], StoredMessage]:
        """The messages at sorted (queue id, offset) keys, one read per consecutive run."""
        out: dict[tuple[int, int], StoredMessage] = {}
        i = 0
        while i < len(keys):
            qid, first = keys[i]
            j = i + 1
            while j < len(keys) and keys[j] == (qid, first + (j - i)):
                j += 1
            with self.store.get_messages(group, topic, qid, first, max_count=j - i) as got:
                for msg in got.messages():
                    if first <= msg.queue_offset < first + (j - i):
                        out[(qid, msg.queue_offset)] = msg
            i = j
        return out

    def _put_dlq(self, group: str, msg: StoredMessage, attempts: int) -> None:
        name = dlq_topic(group)
        self.meta.create_topic(name, 1, "NORMAL", exist_ok=True)
        props = dict(msg.properties)
        props[DLQ_ORIGIN_TOPIC] = msg.topic
        props[DLQ_ORIGIN_MESSAGE_ID] = message_id_of(msg)
        props["RECONSUME_TIME"] = str(max(0, attempts - 1))
        props.pop(Prop.MESSAGE_GROUP, None)  # a DLQ is one plain queue
        result = self.store.put_messages([Message(
            name, msg.decompressed_body(), 0, props, born_timestamp=msg.born_timestamp,
            born_host=msg.born_host, reconsume_times=max(0, attempts - 1))])
        if not result.ok:
            # Keep the message in flight: losing it would be worse than retrying the move.
            raise BrokerError(Code.INTERNAL_ERROR, f"cannot write to {name}: {result.status} "
                              f"{result.error}")
        if self.on_dlq is not None:
            self.on_dlq(group, msg.topic)

    # -- ack and friends ------------------------------------------------------------------------

    def handle(self, group: str, topic: str, receipt: Receipt) -> str:
        """The receipt handle a client gets for ``receipt`` (signed for the group and topic)."""
        return receipt.encode(self.state.receipt_key, group, topic)

    def _current(self, group: str, topic: str, handle: str) -> tuple[Receipt, InFlight | None]:
        r = Receipt.decode(handle, self.state.receipt_key, group, topic)
        e = self.state.entry(group, topic, r.queue_id, r.offset)
        if e is not None and e.generation != r.generation:
            raise BrokerError(Code.INVALID_RECEIPT_HANDLE,
                              "receipt handle is stale: the message was delivered again or its "
                              "invisible time was changed since")
        return r, e

    def check_handle(self, group: str, topic: str, handle: str) -> None:
        """Raise INVALID_RECEIPT_HANDLE unless ``handle`` is one this broker issued for the
        group and topic and is still current (not superseded by a later delivery)."""
        self._current(group, topic, handle)

    def ack(self, group: str, topic: str, handle: str) -> None:
        """Ack one delivery. Acking a message no longer in flight (acked already) is a no-op."""
        error = self.ack_many(group, topic, [handle])[0]
        if error is not None:
            raise error

    def ack_many(self, group: str, topic: str, handles: list[str]) -> list[BrokerError | None]:
        """Ack many deliveries in one pop-state write: per handle None (acked, or acked
        already) or the error refusing it; a bad handle does not keep the others from going."""
        results: list[BrokerError | None] = []
        delete: list[tuple[int, int]] = []
        with self._lock(group, topic):
            for handle in handles:
                try:
                    r, e = self._current(group, topic, handle)
                except BrokerError as exc:
                    results.append(exc)
                    continue
                if e is not None:
                    delete.append((r.queue_id, r.offset))
                results.append(None)
            if delete:
                self.state.apply(group, topic, delete=delete)
        self.notify(topic)  # a FIFO queue may have become free
        return results

    def change_invisible(self, group: str, topic: str, handle: str, invisible_ms: int) -> str:
        with self._lock(group, topic):
            r, e = self._current(group, topic, handle)
            if e is None:
                raise BrokerError(Code.INVALID_RECEIPT_HANDLE,
                                  "message is not in flight (already acked or moved to the DLQ)")
            now = now_ms()
            ne = InFlight(now + invisible_ms, e.attempt, max(now, e.generation + 1))
            self.state.apply(group, topic, put={(r.queue_id, r.offset): ne})
        self.notify(topic)
        return self.handle(group, topic, Receipt(r.queue_id, r.offset, ne.generation,
                                                 ne.visible_at))

    def forward_to_dlq(self, group: str, topic: str, handle: str) -> None:
        with self._lock(group, topic):
            r, e = self._current(group, topic, handle)
            if e is None:
                return
            msg = self._read_one(group, topic, r.queue_id, r.offset)
            if msg is not None:
                self._put_dlq(group, msg, e.attempt)
            self.state.apply(group, topic, delete=[(r.queue_id, r.offset)])
        self.notify(topic)

    # -- progress -------------------------------------------------------------------------------

    def consumed_offsets(self) -> dict[tuple[str, int], dict[str, int]]:
        """Per (topic, queue id), each group's consumed offset: its pop progress (everything
        below is acked), else the offset it committed by UpdateOffset; 0 for a queue of the
        topic it has consumed nothing of. What the store's forced clean-up keeps files for
        (``MessageStore.set_consumed_offsets``); called from the clean-up thread."""
        out: dict[tuple[str, int], dict[str, int]] = {}
        for group, topic in self.state.groups_of():
            cfg = self.meta.topic(topic)
            qids = range(cfg.queue_count) if cfg else self.state.cursor_queues(group, topic)
            for q in qids:
                done = self.state.committed(group, topic, q)
                if done is None:
                    done = self.state.offset(group, topic, q)
                out.setdefault((topic, q), {})[group] = done or 0
        return out

    def progress(self, group: str) -> list[dict]:
        """Per topic and queue: max offset, the group's consumed offset, in flight, lag."""
        rows = []
        topics = sorted({t for (g, t) in self.state.groups_of()
                         if g == group and not is_system_topic(t)})
        for t in topics:
            cfg = self.meta.topic(t)
            qids = range(cfg.queue_count) if cfg else self.state.cursor_queues(group, t)
            entries = self.state.entries(group, t)
            for q in qids:
                max_off = self.store.get_max_offset_in_queue(t, q)
                committed = self.state.committed(group, t, q)
                if committed is None:
                    committed = self.state.offset(group, t, q)
                if committed is None:
                    committed = self.store.get_min_offset_in_queue(t, q)
                rows.append({"topic": t, "queue_id": q, "max_offset": max_off,
                             "consumer_offset": committed,
                             "inflight": sum(1 for (qq, _o) in entries if qq == q),
                             "lag": max(0, max_off - committed)})  # fmt: skip
        return rows
