"""Timer (DELAY) messages: held in the CommitLog, indexed in RocksDB by delivery time.

Format: docs/formats/timer-store.md.

Life of a timer message, as in RocketMQ 5's timer store:

1. ``submit`` appends it to the CommitLog under the system topic ``rmq_sys_wheel_timer``
   (queue 0), the real topic and queue kept in the ``REAL_TOPIC`` / ``REAL_QID`` properties and
   the delivery time in ``TIMER_DELIVER_MS`` / ``TIMER_OUT_MS``. It is then exactly as durable
   as any other message (the CommitLog's own flush; SYNC_FLUSH waits for it).
2. The *enqueue* thread follows that topic's ConsumeQueue (the store's own dispatcher builds it,
   so nothing is added to the store's dispatch path) and writes one RocksDB key per message:
   ``(deliver_ms, physical offset)`` big-endian, so keys sort by delivery time. The ConsumeQueue
   offset it has indexed up to is written in the same WAL-less DB *after* the keys, so whatever
   prefix of writes survives a crash, the saved offset never runs ahead of the keys.
3. The *delivery* thread sleeps until the first key is due, re-reads each due record from the
   CommitLog, puts it to its real topic/queue with every other property unchanged (so the
   index still finds it by key and client message id), and deletes the key only once the
   CommitLog has flushed past the delivered copy. A crash therefore never loses a due message;
   it may deliver one twice (at-least-once).

Rebuild: the DB can be thrown away. ``timercheck`` (a small file written after each DB flush)
records a queue offset ``Q`` and a delivery time ``W`` such that every timer message below
``Q`` due before ``W`` has been delivered and flushed; re-indexing the timer ConsumeQueue from
its start while skipping exactly those reproduces every undelivered message.

Threads: ``submit`` may be called from any thread. The enqueue thread is the only writer of
keys and of the enqueue offset; the delivery thread the only deleter of keys and the only
writer of ``timercheck``. ``start``/``close`` from the owning (broker) thread.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import struct
import threading
import time
import zlib
from collections import deque
from pathlib import Path
from typing import NamedTuple

from rocketmq.grpc_protocol import definition_pb2
from rocksdict import Options, Rdict, WriteBatch, WriteOptions

from stratamq import record as codec
from stratamq.broker.errors import BrokerError
from stratamq.fileutil import atomic_write
from stratamq.message import Message, Prop
from stratamq.store.layout import StoreLayout
from stratamq.store.message_store import MessageStore
from stratamq.store.results import GetMessageStatus, PutMessageResult

log = logging.getLogger(__name__)

TIMER_TOPIC = "rmq_sys_wheel_timer"  # RocketMQ 5's TimerMessageStore.TIMER_TOPIC
TIMER_QUEUE_ID = 0
TIMER_OUT_MS = "TIMER_OUT_MS"  # RocketMQ's MessageConst.PROPERTY_TIMER_OUT_MS
TIMER_GROUP = "rmq_sys_timer_enqueue"  # reader name passed to get_messages (no progress kept)

_KEY = struct.Struct(">QQ")  # deliver_ms, physical offset
_VALUE = struct.Struct(">iqq")  # record size, record store time, timer ConsumeQueue offset
_META_PREFIX = b"\xff"  # sorts after every key: deliver_ms < 2**56 starts with 0x00
_META_ENQUEUE_OFFSET = _META_PREFIX + b"enqueue_offset"
_CHECK = struct.Struct(">qqqI")  # version, W (ms), Q (queue offset), crc32 of the first three
_CHECK_VERSION = 1
_END_KEY = b"\xff"


class IllegalDeliveryTime(BrokerError):
    """A delivery time further ahead than ``timerMaxDelaySec`` (RocketMQ refuses these too);
    RPC handlers answer it as ``Code.ILLEGAL_DELIVERY_TIME``."""

    def __init__(self, message: str) -> None:
        super().__init__(definition_pb2.Code.ILLEGAL_DELIVERY_TIME, message)


class TimerCheck(NamedTuple):
    """The ``timercheck`` file: what a rebuild may skip."""

    delivered_before_ms: int  # W
    below_queue_offset: int  # Q

    @classmethod
    def read(cls, path: Path) -> TimerCheck:
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return cls(0, 0)
        if len(raw) != _CHECK.size:
            log.warning("%s has %d bytes, not %d: ignored", path, len(raw), _CHECK.size)
            return cls(0, 0)
        version, w, q, crc = _CHECK.unpack(raw)
        if version != _CHECK_VERSION or zlib.crc32(raw[:-4]) != crc:
            log.warning("%s is damaged (version %d, bad crc?): ignored", path, version)
            return cls(0, 0)
        return cls(w, q)

    def write(self, path: Path) -> None:
        head = _CHECK.pack(_CHECK_VERSION, self.delivered_before_ms, self.below_queue_offset, 0)
        data = head[:-4] + struct.pack(">I", zlib.crc32(head[:-4]))
        atomic_write(path, data)


def _now_ms() -> int:
    return int(time.time() * 1000)


def timer_key(deliver_ms: int, physical_offset: int) -> bytes:
    return _KEY.pack(max(0, deliver_ms), physical_offset)


class TimerMessageStore:
    """Delay messages for one ``MessageStore``: ``submit`` them, ``start`` delivery.

    ``root`` holds ``timerdb/`` (RocksDB) and ``timercheck``; by default the store's root.
    """

    def __init__(
        self,
        store: MessageStore,
        *,
        max_delay_ms: int,
        flush_interval_ms: int,
        batch_size: int = 1024,
        root: Path | None = None,
    ) -> None:
        self.store = store
        self.max_delay_ms = max_delay_ms
        self.flush_interval = flush_interval_ms / 1000
        self.batch_size = batch_size
        root = Path(root) if root is not None else store.layout.root
        self.db_path = StoreLayout(root).timer_db
        self.check_path = StoreLayout(root).timer_check
        self.db: Rdict | None = None
        self._wo = WriteOptions()
        # Like the RocksDB ConsumeQueue: the CommitLog is the log. (rocksdict's stub calls it a
        # method; it is a property.)
        self._wo.disable_wal = True  # type: ignore[method-assign,assignment]
        self._stop = threading.Event()
        self._enqueue_wake = threading.Event()
        self._deliver_wake = threading.Event()
        self._lock = threading.Lock()  # guards _floor and _lowered
        self._floor = b""  # no live key that is not in flight sorts below this
        self._lowered = False
        self._next_due = 0  # ms of the first pending key the deliverer knows of
        self._enqueue_offset = 0
        self._check = TimerCheck(0, 0)
        # Delivered but not yet flushed in the CommitLog: (end offset, keys, min ms), in order.
        self._unflushed: deque[tuple[int, list[bytes], int]] = deque()
        self._inflight: set[bytes] = set()
        self._dirty = False
        self._last_flush = time.monotonic()
        self._threads: list[threading.Thread] = []
        self.delivered = 0  # counters for metrics and tests
        self.dropped = 0
        self.error: BaseException | None = None

    # -- lifecycle ------------------------------------------------------------------------------

    def open(self) -> TimerMessageStore:
        """Open (or rebuild) the index. Call after the store is open, before ``start``."""
        self._check = TimerCheck.read(self.check_path)
        try:
            self.db = self._open_db()
        except Exception as exc:  # a damaged DB is rebuilt from the CommitLog, never fatal
            log.error("timer index %s unusable (%s): rebuilding from the CommitLog",
                      self.db_path, exc)
            shutil.rmtree(self.db_path, ignore_errors=True)
            self.db = self._open_db()
        raw = self._rdb().get(_META_ENQUEUE_OFFSET)
        self._enqueue_offset = struct.unpack(">q", raw)[0] if raw else 0
        return self

    def _open_db(self) -> Rdict:
        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        db = Rdict(str(self.db_path), opts)
        db.set_write_options(self._wo)
        return db

    def rebuild(self) -> None:
        """Throw the index away and re-index from the timer ConsumeQueue (store open, timer
        not started)."""
        if self.db is not None:
            self._rdb().close()
            self.db = None
        shutil.rmtree(self.db_path, ignore_errors=True)
        with self._lock:
            self._floor, self._lowered = b"", False
        self._next_due = 0
        self._unflushed.clear()
        self._inflight.clear()
        self.open()

    def start(self) -> None:
        """Start indexing and delivering; again after ``close`` too (a broker elected master
        once more, ``broker/master_duties.py``)."""
        self._stop.clear()
        if self.db is None:
            self.open()
        # The store's dispatcher tells us when a timer record lands; polling is the fallback.
        self.store.add_dispatch_listener(self._on_dispatch)
        for name, target in (("timer-enqueue", self._enqueue_loop),
                             ("timer-deliver", self._deliver_loop)):
            thread = threading.Thread(target=self._guard(target), name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def close(self) -> None:
        """Stop both threads, persist the index and ``timercheck``. Call before the store's
        ``close`` (delivery needs the store)."""
        self._stop.set()
        self._enqueue_wake.set()
        self._deliver_wake.set()
        for thread in self._threads:
            thread.join(timeout=30)
        self._threads = []
        self.store.remove_dispatch_listener(self._on_dispatch)
        if self.db is not None:
            if self.store.is_open:
                self.store.flush()  # so in-flight keys may go now
                self._retire_flushed()
            self._flush_db()
            self._rdb().close()
            self.db = None

    def __enter__(self) -> TimerMessageStore:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _guard(self, target):
        def run() -> None:
            try:
                target()
            except Exception as exc:  # report loudly; sends keep working, delivery stops
                self.error = exc
                log.exception("timer thread %s stopped", threading.current_thread().name)
        return run

    # -- submitting -----------------------------------------------------------------------------


    def _rdb(self) -> Rdict:
        if self.db is None:
            raise RuntimeError(f"timer store {self.db_path} is not open")
        return self.db
    def submit(self, msg: Message, deliver_ms: int) -> PutMessageResult:
        """Store ``msg`` for delivery to its topic/queue at ``deliver_ms`` (epoch ms).

        A time already past is delivered at once (put straight to the real topic). Raises
        ``IllegalDeliveryTime`` beyond ``timerMaxDelaySec``.
        """
        now = _now_ms()
        self._check_delay(deliver_ms, now)
        if deliver_ms <= now:
            props = {**msg.properties, Prop.TIMER_DELIVER_MS: str(deliver_ms)}
            return self.store.put_message(dataclasses.replace(msg, properties=props))
        return self.store.put_message(_held(msg, deliver_ms))

    def hold(self, msg: Message, deliver_ms: int) -> Message:
        """The record that holds ``msg`` in the timer topic until ``deliver_ms``, for a caller
        that appends it itself (the broker's batched sends); ``IllegalDeliveryTime`` beyond
        ``timerMaxDelaySec``."""
        self._check_delay(deliver_ms, _now_ms())
        return _held(msg, deliver_ms)

    def submit_batch(self, items: list[tuple[Message, int]]) -> PutMessageResult:
        """``submit`` for many messages in one CommitLog append (one SendMessage request).

        Every message goes through the timer topic, even one already due: the delivery thread
        releases it at once."""
        now = _now_ms()
        for _msg, deliver_ms in items:  # all checked before anything is written
            self._check_delay(deliver_ms, now)
        return self.store.put_messages([_held(msg, deliver_ms) for msg, deliver_ms in items])

    def check_delay(self, deliver_ms: int) -> None:
        """Raise ``IllegalDeliveryTime`` if ``submit`` would refuse ``deliver_ms``."""
        self._check_delay(deliver_ms, _now_ms())

    def _check_delay(self, deliver_ms: int, now: int) -> None:
        if deliver_ms - now > self.max_delay_ms:
            raise IllegalDeliveryTime(
                f"delivery time {deliver_ms} is {deliver_ms - now} ms ahead, more than "
                f"timerMaxDelaySec ({self.max_delay_ms // 1000} s)"
            )

    def _on_dispatch(self, info: codec.DispatchInfo) -> None:
        if info.topic == TIMER_TOPIC:
            self._enqueue_wake.set()

    # -- enqueue: timer ConsumeQueue -> RocksDB --------------------------------------------------

    def _enqueue_loop(self) -> None:
        while not self._stop.is_set():
            if self.enqueue_some() == 0:
                self._enqueue_wake.wait(0.1)
                self._enqueue_wake.clear()

    def enqueue_some(self) -> int:
        """Index the next batch of timer records; return how many were read."""
        store = self.store
        offset = self._enqueue_offset
        result = store.get_messages(TIMER_GROUP, TIMER_TOPIC, TIMER_QUEUE_ID, offset,
                                    max_count=self.batch_size)
        with result:
            status = result.status
            if status is GetMessageStatus.OFFSET_TOO_SMALL:
                log.error("timer records %d..%d were deleted before they were indexed",
                          offset, result.next_begin_offset)
            elif status is GetMessageStatus.OFFSET_OVERFLOW_BADLY:
                # The CommitLog lost its unflushed tail in a crash, and the queue with it.
                log.warning("timer enqueue offset %d past queue end %d: moved back",
                            offset, result.max_offset)
            if status is not GetMessageStatus.FOUND:
                if result.next_begin_offset != offset and status in (
                    GetMessageStatus.OFFSET_TOO_SMALL, GetMessageStatus.OFFSET_OVERFLOW_BADLY,
                    GetMessageStatus.NO_MATCHED_MESSAGE, GetMessageStatus.MESSAGE_WAS_REMOVING,
                ):
                    self._save_enqueue_offset(WriteBatch(raw_mode=True), result.next_begin_offset)
                    return 1
                return 0
            batch = WriteBatch(raw_mode=True)
            lowest = None
            check = self._check
            for rec in result.records:
                info = codec.decode_dispatch_info(rec.buffer, 0)
                try:
                    deliver_ms = int(info.properties[TIMER_OUT_MS])
                except (KeyError, ValueError):
                    log.error("timer record at %d has no valid %s: skipped",
                              rec.physical_offset, TIMER_OUT_MS)
                    continue
                if (rec.queue_offset < check.below_queue_offset
                        and deliver_ms < check.delivered_before_ms):
                    continue  # delivered before the index was rebuilt
                key = timer_key(deliver_ms, rec.physical_offset)
                batch.put(key, _VALUE.pack(info.size, info.store_timestamp, rec.queue_offset))
                if lowest is None or key < lowest:
                    lowest = key
            count = len(result.records)
            next_offset = result.next_begin_offset
        self._save_enqueue_offset(batch, next_offset)
        if lowest is not None:
            with self._lock:
                if lowest < self._floor:
                    self._floor = lowest
                self._lowered = True
            if _KEY.unpack(lowest)[0] < self._next_due or self._next_due == 0:
                self._deliver_wake.set()
        return count

    def _save_enqueue_offset(self, batch: WriteBatch, offset: int) -> None:
        # Written last in the batch: a crash keeps a prefix of writes, never the offset alone.
        batch.put(_META_ENQUEUE_OFFSET, struct.pack(">q", offset))
        self._rdb().write(batch, self._wo)
        self._enqueue_offset = offset
        self._dirty = True

    # -- delivery: RocksDB -> real topic ---------------------------------------------------------

    def _deliver_loop(self) -> None:
        while not self._stop.is_set():
            self._retire_flushed()
            if time.monotonic() - self._last_flush >= self.flush_interval:
                self._flush_db()
            if self.deliver_due() > 0:
                continue
            wait_ms = self.flush_interval * 1000
            if self._next_due:
                wait_ms = min(wait_ms, max(1, self._next_due - _now_ms()))
            if self._unflushed:
                wait_ms = min(wait_ms, 50)  # look again soon for keys that may go
            self._deliver_wake.wait(wait_ms / 1000)
            self._deliver_wake.clear()

    def deliver_due(self) -> int:
        """Put every due message to its real topic (up to one batch); return how many."""
        now = _now_ms()
        with self._lock:
            start = self._floor
            self._lowered = False
        due: list[tuple[bytes, bytes]] = []
        stop = _END_KEY
        self._next_due = 0
        it = self._rdb().iter()
        it.seek(start)
        while it.valid():
            key = it.key()
            if key[:1] == _META_PREFIX:
                break
            if key in self._inflight:
                it.next()
                continue
            deliver_ms = _KEY.unpack(key)[0]
            if deliver_ms > now or len(due) >= self.batch_size:
                stop = key
                self._next_due = deliver_ms
                break
            due.append((key, it.value()))
            it.next()
        del it
        with self._lock:
            self._floor = min(self._floor, stop) if self._lowered else stop
        if due:
            self._deliver(due)
        return len(due)

    def _deliver(self, due: list[tuple[bytes, bytes]]) -> None:
        messages: list[Message] = []
        keys: list[bytes] = []
        dead = WriteBatch(raw_mode=True)
        for key, value in due:
            deliver_ms, phys = _KEY.unpack(key)
            size, store_ts, _ = _VALUE.unpack(value)
            try:
                held = self.store.look_message_by_offset(phys)
            except codec.RecordCorrupt:
                held = None
            if (held is None or held.topic != TIMER_TOPIC or held.total_size != size
                    or held.store_timestamp != store_ts
                    or Prop.REAL_TOPIC not in held.properties):
                # The record this key points to is gone: cut by crash recovery (it was never
                # flushed, so never acknowledged as durable) or removed by retention.
                log.warning("timer key (%d, %d) has no record behind it: dropped", deliver_ms,
                            phys)
                dead.delete(key)
                self.dropped += 1
                continue
            messages.append(_released(held))
            keys.append(key)
        if len(dead):
            self._rdb().write(dead, self._wo)
            self._dirty = True
        if not messages:
            return
        result = self.store.put_messages(messages)
        if not result.messages:
            log.error("timer delivery of %d messages failed (%s %s); retrying in 1 s",
                      len(messages), result.status, result.error)
            with self._lock:
                self._floor = min(self._floor, keys[0])
            self._stop.wait(1.0)
            return
        delivered = len(result.messages)  # a batch cut short (disk full) delivered a prefix
        last = result.messages[-1]
        done = keys[:delivered]
        self._inflight.update(done)
        self._unflushed.append((last.physical_offset + last.size, done,
                                _KEY.unpack(done[0])[0]))
        self.delivered += delivered
        if delivered < len(keys):
            with self._lock:
                self._floor = min(self._floor, keys[delivered])

    def _retire_flushed(self) -> None:
        """Delete the keys whose delivered copy the CommitLog has flushed."""
        flushed = self.store.flushed_offset
        if not self._unflushed or self._unflushed[0][0] > flushed:
            return
        batch = WriteBatch(raw_mode=True)
        while self._unflushed and self._unflushed[0][0] <= flushed:
            _, keys, _ = self._unflushed.popleft()
            for key in keys:
                batch.delete(key)
                self._inflight.discard(key)
        self._rdb().write(batch, self._wo)
        self._dirty = True

    def _flush_db(self) -> None:
        """Make the index durable, then record what a rebuild may skip."""
        self._last_flush = time.monotonic()
        if not self._dirty or self.db is None:
            return
        self._dirty = False
        queue_offset = self._enqueue_offset  # read first: everything below it is in the DB
        self._rdb().flush(True)
        with self._lock:
            floor = self._floor
        floor_ms = _KEY.unpack(floor)[0] if len(floor) == _KEY.size else (
            0 if floor == b"" else 2**62)
        if self._unflushed:
            floor_ms = min(floor_ms, min(entry[2] for entry in self._unflushed))
        self._check = TimerCheck(floor_ms, queue_offset)
        self._check.write(self.check_path)

    # -- inspection -----------------------------------------------------------------------------

    def pending(self) -> int:
        """Exact number of timer messages not yet delivered (iterates the index)."""
        count = 0
        it = self._rdb().iter()
        it.seek_to_first()
        while it.valid() and it.key()[:1] != _META_PREFIX:
            count += 1
            it.next()
        return count

    def pending_estimate(self) -> int:
        """RocksDB's estimate (cheap, for metrics)."""
        return max(0, (self._rdb().property_int_value("rocksdb.estimate-num-keys") or 1) - 1)

    def next_due_ms(self) -> int:
        return self._next_due

    @property
    def enqueue_offset(self) -> int:
        return self._enqueue_offset

    def enqueue_lag(self) -> int:
        """Timer records in the ConsumeQueue not yet indexed."""
        return max(0, self.store.get_max_offset_in_queue(TIMER_TOPIC, TIMER_QUEUE_ID)
                   - self._enqueue_offset)


def _held(msg: Message, deliver_ms: int) -> Message:
    """``msg`` as written to the timer topic: its real topic and queue kept in properties."""
    props = dict(msg.properties)
    props[Prop.TIMER_DELIVER_MS] = str(deliver_ms)
    props[TIMER_OUT_MS] = str(deliver_ms)
    props[Prop.REAL_TOPIC] = msg.topic
    props[Prop.REAL_QUEUE_ID] = str(msg.queue_id)
    return dataclasses.replace(msg, topic=TIMER_TOPIC, queue_id=TIMER_QUEUE_ID,
                               properties=props)


def _released(held: codec.StoredMessage) -> Message:
    """The message to put to its real topic: everything kept but the timer's routing."""
    props = dict(held.properties)
    topic = props.pop(Prop.REAL_TOPIC)  # present: checked by the caller
    queue_id = props.pop(Prop.REAL_QUEUE_ID, "0")
    return Message(
        topic=topic,
        body=held.body,
        queue_id=int(queue_id) if queue_id.isdigit() else 0,
        properties=props,
        flag=held.flag,
        sys_flag=held.sys_flag,
        born_timestamp=held.born_timestamp,
        born_host=held.born_host,
        reconsume_times=held.reconsume_times,
    )


__all__ = ["TIMER_TOPIC", "IllegalDeliveryTime", "TimerCheck", "TimerMessageStore", "timer_key"]
