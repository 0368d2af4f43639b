"""ConsumeQueues in one RocksDB (``storeType=defaultRocksDB``), on stock RocksDB via rocksdict.

Spec: ``docs/formats/rocksdb-consumequeue.md`` (seed 003); the row layouts are in
``rocksdb_cq_format.py``: a ``default`` column family of units (keys sort a queue's units in
offset order, so a read is one seek plus ``next()``) and an ``offset`` column family of each
queue's min/max rows plus one checkpoint row.

Durability: writes go in a WriteBatch per dispatch round with the WAL disabled; the CommitLog is
the log. RocksDB's own flushes (a full memtable) write both column families atomically
(``atomic_flush``); the flush service's thorough rounds flush the units, then the offset table
(``_flush_tables``). Either way the offset table on disk never runs ahead of the units, and its
checkpoint row says how far it covers: after a crash the message store re-dispatches from there
(``max_physic_offset``), idempotently (a unit at or below a queue's last physical offset is
skipped). A read-only open (the Spark source beside a running broker) sees the store as of the
last thorough flush.

Expiry: RocketMQ drops expired units in a compaction filter of its own RocksDB build; stock
RocksDB from Python has none. Here the in-memory offset table says which queues' first unit
points below the CommitLog's new min offset (no scan of units); for each such queue a binary
search over its units finds the first live one, a ``delete_range`` removes the units below it
and the min row moves up, in one batch. ``min_offset()`` also checks a queue against the
CommitLog's min offset when it is read, so a reader never sees a stale min even before the
clean-up service ran.

Start-up reads three rows (the checkpoint, the expiry watermark and whether the offset table is
empty), not the offset table: 100,000 queues are 200,000 rows, and parsing them in Python cost
more than the rest of a restart. The offset table is cached in memory, filled one queue at a time
on first use (one ``get`` per row) and whole (one bulk iteration) only for what needs every queue:
listing topics, recovery after a crash that cut the CommitLog, expiry past the watermark,
destroying a topic. The cache is write-through and authoritative, including "no such queue"
entries, so a hit never touches RocksDB.

Expiry watermark: the ``min`` row of ``CHECKPOINT_TOPIC`` queue 0 holds the CommitLog min offset
the last full expiry pass ran for; every ``min`` row points at or above it (new units are never
below the CommitLog's min offset), so a call for an offset not above it is answered without
looking at any queue — in particular the one every restart makes.

Threads: the dispatcher thread calls ``dispatch``/``commit_dispatch``; any thread may read.
``_lock`` serialises writes to RocksDB and the in-memory tables, and cache fills (so a fill cannot
put back a row a concurrent write replaced). A cache hit takes no lock (a read sees either the old
or the new row of a dict, both consistent with RocksDB after the write). Each reading thread
reuses one RocksDB iterator until the next write: creating an iterator (and its implicit
snapshot) cost more than the seek and the ``next()`` calls of a short read.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from rocksdict import (
    AccessType,
    ColumnFamily,
    Rdict,
    RdictIter,
    WriteBatch,
    WriteOptions,
)

from stratamq.record import DispatchInfo, SysFlag
from stratamq.store.consume_queue_store import STORE_TYPE_ROCKSDB, allocated_bytes
from stratamq.store.rocksdb_cq_format import (
    BATCH_MAX,
    CHECKPOINT_KEY,
    CQ_VALUE,
    EXPIRED_BELOW_KEY,
    I32,
    I64,
    MAX_RECORD_SPAN,
    OFFSET_CF,
    OFFSET_VALUE,
    SYSTEM_KEYS,
    CqRow,
    cq_key,
    offset_key,
    parse_offset_key,
    queue_prefix,
    queue_range,
    rocksdb_options,
    topic_head,
    topic_range,
)
from stratamq.store.rocksdb_cq_queue import QueueOffsets, RocksDBConsumeQueue

log = logging.getLogger(__name__)

_UNKNOWN = object()  # a cache miss (None is a cached "no such queue")
OffsetRow = tuple[int, int]  # queue offset, phys


# An offset table of at most this many rows (two per queue) is read whole on the first queue
# miss instead of row by row: about 2 us a row (0.5 s for 125,000 queues) in one pass, against
# 10-50 us per queue for point reads; a store with more queues stays lazy.
FULL_LOAD_MAX_ROWS = 250_000


class RocksDBConsumeQueueStore:
    """Every ConsumeQueue in one RocksDB under ``path``. A dispatcher."""

    store_type = STORE_TYPE_ROCKSDB

    def __init__(self, path: Path, *, read_only: bool = False) -> None:
        self.path = Path(path)
        self.read_only = read_only
        self._db: Rdict | None = None
        self._offset_cf: Rdict | None = None
        self._offset_cfh: ColumnFamily | None = None
        # The offset table's cache (module docstring): (topic, queue id) -> (queue offset,
        # phys) of the queue's last / first unit, or None for "no such queue". A key absent
        # here is unknown unless ``_complete``, when it is absent from RocksDB too.
        self._max: dict[tuple[str, int], OffsetRow | None] = {}
        self._min: dict[tuple[str, int], OffsetRow | None] = {}
        self._complete = False
        self._small: bool | None = None  # see _table_is_small
        self._max_phys = -1  # end of the newest record covered (the checkpoint row)
        self._expired_below = 0  # the expiry watermark row
        self._handles: dict[tuple[str, int], RocksDBConsumeQueue] = {}
        self._lock = threading.RLock()
        # The open batch of the current dispatch round, and what it changes once written.
        self._batch: WriteBatch | None = None
        self._pending = 0
        self._pending_max: dict[tuple[str, int], OffsetRow] = {}
        self._pending_min: dict[tuple[str, int], OffsetRow] = {}
        self._pending_end = -1
        self._prefixes: dict[str, bytes] = {}
        # Reused iterators: thread id -> (write generation it was made at, iterator).
        self._generation = 0
        self._iters: dict[int, tuple[int, RdictIter]] = {}
        # Where the CommitLog starts now; set by the message store so reads see expiry at once.
        self.commitlog_min_offset: Callable[[], int] | None = None

    # -- lifecycle ------------------------------------------------------------------------------


    @property
    def db(self) -> Rdict:
        if self._db is None:
            raise RuntimeError(f"RocksDB ConsumeQueue store {self.path} is not open")
        return self._db

    @property
    def offset_cf(self) -> Rdict:
        if self._offset_cf is None:
            raise RuntimeError(f"RocksDB ConsumeQueue store {self.path} is not open")
        return self._offset_cf
    def load(self) -> None:
        """Open RocksDB and read the checkpoint and watermark rows; no queue is read."""
        if self.read_only:
            if not (self.path / "CURRENT").exists():
                self._complete = True
                return  # no RocksDB here: an empty store
            self._db = Rdict(str(self.path), options=rocksdb_options(),
                             access_type=AccessType.read_only(),
                             column_families={OFFSET_CF: rocksdb_options()})
        else:
            self.path.mkdir(parents=True, exist_ok=True)
            opts = rocksdb_options()
            opts.create_if_missing(True)
            opts.create_missing_column_families(True)
            # Both tables flush together: after a crash the offset table still describes
            # exactly the units that survived.
            opts.set_atomic_flush(True)
            self._db = Rdict(str(self.path), options=opts,
                             column_families={OFFSET_CF: rocksdb_options()})
            wo = WriteOptions()
            # The CommitLog is the log (seed 003). (rocksdict's stub calls it a method; it is a
            # property, read back as True.)
            wo.disable_wal = True  # type: ignore[method-assign,assignment]
            self.db.set_write_options(wo)
        self._offset_cf = self.db.get_column_family(OFFSET_CF)
        self._offset_cfh = self.db.get_column_family_handle(OFFSET_CF)
        value = self.offset_cf.get(CHECKPOINT_KEY)
        if value is not None:
            self._max_phys = I64.unpack(value)[0]
        value = self.offset_cf.get(EXPIRED_BELOW_KEY)
        if value is not None:
            self._expired_below = I64.unpack(value)[0]
        # A new (or emptied) store knows every queue already: no get per first dispatch.
        it = self.offset_cf.iter()
        it.seek_to_first()
        while it.valid() and it.key() in SYSTEM_KEYS:
            it.next()
        self._complete = not it.valid()
        del it

    def recover(self) -> None:
        """Nothing to scan: RocksDB recovered itself; ``truncate_dirty`` cuts past-the-end."""

    def flush(self, least_pages: int) -> None:
        """Write the open batch; on a thorough round (0) also flush memtables to SST files."""
        if self.read_only or self._db is None:
            return
        self.commit_dispatch()
        if least_pages == 0:
            self._flush_tables()

    def _flush_tables(self) -> None:
        """Memtables of both tables to SST files.

        A manual flush covers one column family, whatever ``atomic_flush`` says: so both are
        flushed, units first, under the lock so no batch lands between the two. A crash between
        them leaves offset rows (and the checkpoint) older than the units, which replay repairs;
        the other order could leave rows pointing at lost units. Flushing only the units, the
        offset table reached disk when its memtable filled or at close: after a crash, replay
        started from an old checkpoint, and a read-only reader (Spark beside a running broker)
        saw no new message.
        """
        with self._lock:
            self.db.flush()
            if self._offset_cf is not None:
                self.offset_cf.flush()

    def close(self) -> None:
        if self._db is None:
            return
        if not self.read_only:
            self.commit_dispatch()
            self._flush_tables()
        self._iters.clear()  # an iterator must not outlive its database
        self._offset_cf = None
        self._offset_cfh = None
        self.db.close()
        self._db = None
        self._handles.clear()

    # -- the offset table's cache ---------------------------------------------------------------

    def max_row(self, key: tuple[str, int]) -> OffsetRow | None:
        row = self._max.get(key, _UNKNOWN)
        if row is _UNKNOWN:
            return self._fill(key)[0]
        return row  # type: ignore[return-value]

    def _min_row(self, key: tuple[str, int]) -> OffsetRow | None:
        row = self._min.get(key, _UNKNOWN)
        if row is _UNKNOWN:
            return self._fill(key)[1]
        return row  # type: ignore[return-value]

    def _fill(self, key: tuple[str, int]) -> tuple[OffsetRow | None, OffsetRow | None]:
        """Read one queue's two offset rows into the cache (under the lock, so a concurrent
        write's newer rows win) and return them."""
        with self._lock:
            cf = self._offset_cf
            if self._complete or cf is None:
                return self._max.get(key), self._min.get(key)
            if self._table_is_small():
                # One pass over a small table costs about what a few dozen point reads do, and
                # every later first use of a queue is then a dict hit.
                self._load_all()
                return self._max.get(key), self._min.get(key)
            rows: list[OffsetRow | None] = []
            topic_bytes = key[0].encode("utf-8")
            # Both rows in one multi-get: a queue's first read pays one RocksDB round trip.
            values = cf.get([offset_key(topic_bytes, key[1], True),
                             offset_key(topic_bytes, key[1], False)])
            for value, is_max, table in zip(values or (None, None), (True, False),
                                            (self._max, self._min)):
                row = table.get(key, _UNKNOWN)
                if row is _UNKNOWN:
                    row = None
                    if value is not None and len(value) == OFFSET_VALUE.size:
                        phys, queue_offset = OFFSET_VALUE.unpack(value)
                        row = (queue_offset, phys)
                    if not is_max and row is None:
                        row = rows[0]  # a missing min row: the queue starts where it ends
                    table[key] = row
                rows.append(row)  # type: ignore[arg-type]
            return rows[0], rows[1]

    def _table_is_small(self) -> bool:
        """Whether the offset table is small enough to load whole on the first miss (RocksDB's
        key-count estimate, read once: start-up stays lazy for a large table)."""
        if self._small is None:
            try:
                rows = self.offset_cf.property_int_value("rocksdb.estimate-num-keys")
            except Exception:  # the property is an estimate; without it, stay lazy
                rows = None
            self._small = rows is not None and rows <= FULL_LOAD_MAX_ROWS
        return self._small

    def _load_all(self) -> None:
        """Fill the cache with the whole offset table: one iteration, for what needs every
        queue. Rows already cached are newer or the same, so they are kept."""
        with self._lock:
            if self._complete or self._offset_cf is None:
                return
            unpack = OFFSET_VALUE.unpack
            for raw_key, value in self.offset_cf.items():
                key = bytes(raw_key)  # type: ignore[arg-type]  # raw_mode: keys are bytes
                if key in SYSTEM_KEYS:
                    continue
                parsed = parse_offset_key(key)
                if parsed is None or len(value) != OFFSET_VALUE.size:
                    log.warning("rocksdb consumequeue: skipping malformed offset row %r",
                                key[:64])
                    continue
                topic, is_max, queue_id = parsed
                phys, queue_offset = unpack(value)
                (self._max if is_max else self._min).setdefault((topic, queue_id),
                                                                (queue_offset, phys))
            for queue, row in self._max.items():
                if row is not None and self._min.get(queue) is None:
                    self._min[queue] = row  # a missing min row: the queue starts where it ends
            self._complete = True

    def _queue_rows(self) -> list[tuple[tuple[str, int], OffsetRow]]:
        """Every queue's (key, max row), the whole table loaded."""
        self._load_all()
        return [(key, row) for key, row in list(self._max.items()) if row is not None]

    def _forget(self, key: tuple[str, int]) -> None:
        """A destroyed queue: cached as absent, so no fill can bring its old rows back."""
        self._max[key] = None
        self._min[key] = None
        self._handles.pop(key, None)

    # -- writing --------------------------------------------------------------------------------

    def _write(self, batch: WriteBatch) -> None:
        """Write a batch, then retire the reused iterators (they would not see it). Callers
        update the cache after this, so a reader that sees a new row gets a new iterator."""
        self.db.write(batch)
        self._generation += 1
        self._iters.clear()  # idle threads' iterators must not pin deleted files

    def reading_iterator(self) -> RdictIter | None:
        """This thread's iterator, made after the newest write."""
        ident = threading.get_ident()
        generation = self._generation
        cached = self._iters.get(ident)
        if cached is not None and cached[0] == generation:
            return cached[1]
        db = self._db
        if db is None:
            return None
        it = db.iter()
        self._iters[ident] = (generation, it)
        return it

    def _prefix(self, topic: str, queue_id: int) -> bytes:
        head = self._prefixes.get(topic)
        if head is None:
            head = topic_head(topic.encode("utf-8"))
            if len(self._prefixes) < 100_000:
                self._prefixes[topic] = head
        return head + I32.pack(queue_id)

    def replay_floor(self, topic: str, queue_id: int) -> int:
        """Records of this queue below the returned offset are here (see ``dispatch``)."""
        key = (topic, queue_id)
        with self._lock:
            last = self._pending_max.get(key) or self._max.get(key)
        return last[1] + 1 if last is not None else -1

    def dispatch(self, info: DispatchInfo) -> None:
        if not SysFlag.is_dispatchable(info.sys_flag):
            return
        key = (info.topic, info.queue_id)
        with self._lock:
            last = self._pending_max.get(key) or self.max_row(key)
            if last is not None and info.physical_offset <= last[1]:
                return  # already have it: a replay after recovery
            if last is not None and info.queue_offset != last[0] + 1:
                log.error("%s/%d: queue offset %d after %d; keeping it",
                          info.topic, info.queue_id, info.queue_offset, last[0])
            if self._batch is None:
                self._batch = WriteBatch(raw_mode=True)
            prefix = self._prefix(info.topic, info.queue_id)
            self._batch.put(cq_key(prefix, info.queue_offset),
                            CQ_VALUE.pack(info.physical_offset, info.size, info.tags_code,
                                          info.store_timestamp))
            row = (info.queue_offset, info.physical_offset)
            self._pending_max[key] = row
            if key not in self._pending_min and self._min_row(key) is None:
                self._pending_min[key] = row
            self._pending_end = info.physical_offset + info.size
            self._pending += 1
            if self._pending >= BATCH_MAX:
                self._commit_locked()

    def commit_dispatch(self) -> None:
        """Write the open batch (units + offset rows + checkpoint row) without the WAL."""
        with self._lock:
            self._commit_locked()

    def _commit_locked(self) -> None:
        batch = self._batch
        if not self._pending or self._db is None or batch is None:
            return
        cfh = self._offset_cfh
        for (topic, queue_id), (queue_offset, phys) in self._pending_max.items():
            batch.put(offset_key(topic.encode("utf-8"), queue_id, True),
                      OFFSET_VALUE.pack(phys, queue_offset), cfh)
        for (topic, queue_id), (queue_offset, phys) in self._pending_min.items():
            batch.put(offset_key(topic.encode("utf-8"), queue_id, False),
                      OFFSET_VALUE.pack(phys, queue_offset), cfh)
        end = max(self._pending_end, self._max_phys)
        batch.put(CHECKPOINT_KEY, I64.pack(end), cfh)
        self._write(batch)
        # Only now may readers see the new units.
        self._min.update(self._pending_min)
        self._max.update(self._pending_max)
        self._max_phys = end
        self._batch = None
        self._pending = 0
        self._pending_max = {}
        self._pending_min = {}

    # -- queues ---------------------------------------------------------------------------------

    def find(self, topic: str, queue_id: int) -> RocksDBConsumeQueue | None:
        key = (topic, queue_id)
        handle = self._handles.get(key)
        if handle is None:
            if self.max_row(key) is None:
                return None
            handle = self._handles.setdefault(key, RocksDBConsumeQueue(self, topic, queue_id))
        return handle

    def __iter__(self) -> Iterator[RocksDBConsumeQueue]:
        for topic, queue_id in sorted(key for key, _ in self._queue_rows()):
            handle = self.find(topic, queue_id)
            if handle is not None:
                yield handle

    def queues(self) -> list[RocksDBConsumeQueue]:
        return list(self)

    def topics(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for (topic, queue_id), _ in self._queue_rows():
            out.setdefault(topic, []).append(queue_id)
        return {t: sorted(q) for t, q in sorted(out.items())}

    def queue_offset_table(self) -> dict[tuple[str, int], int]:
        """Next queue offsets; until the whole table is loaded, a dict that fills itself per
        queue on first use (``_QueueOffsets``)."""
        if self._complete:
            return {key: row[0] + 1 for key, row in self._max.items() if row is not None}
        return QueueOffsets(self)

    def get_row(self, key: bytes) -> bytes | None:
        db = self._db
        return db.get(key) if db is not None else None

    # -- recovery and retention -----------------------------------------------------------------

    def max_physic_offset(self) -> int:
        return self._max_phys

    def _first_unit_where(self, prefix: bytes, low: int, high: int,
                          predicate: Callable[[CqRow], bool]) -> tuple[int, int]:
        """Binary search over [low, high) for the first unit satisfying a predicate that is
        false then true along the queue: (queue offset, its phys), or (high, -1) if none. A
        missing unit counts as false (it is below an expiry hole)."""
        found_phys = -1
        while low < high:
            mid = (low + high) // 2
            value = self.get_row(cq_key(prefix, mid))
            unit = CQ_VALUE.unpack(value) if value is not None else None
            if unit is not None and predicate(unit):
                high = mid
                found_phys = unit[0]
            else:
                low = mid + 1
        return low, found_phys

    def truncate_dirty(self, commitlog_end: int) -> int:
        """Drop units whose records end past ``commitlog_end`` (a CommitLog cut after a crash):
        their rows go by ``delete_range`` and the max rows move back."""
        if self.read_only or self._db is None:
            return 0
        with self._lock:
            self._commit_locked()
            if self._max_phys <= commitlog_end:
                return 0  # nothing was dispatched past the end: no queue to look at
            dropped = 0
            batch = WriteBatch(raw_mode=True)
            new_max: dict[tuple[str, int], tuple[int, int]] = {}
            gone: list[tuple[str, int]] = []
            for key, (max_q, max_p) in self._queue_rows():
                if max_p + MAX_RECORD_SPAN <= commitlog_end:
                    continue  # its last record starts far before the end: it ends before too
                prefix = self._prefix(*key)
                low = (self._min_row(key) or (0, 0))[0]
                cut, _ = self._first_unit_where(prefix, low, max_q + 1,
                                                lambda u: u[0] + u[1] > commitlog_end)
                if cut > max_q:
                    continue
                dropped += max_q + 1 - cut
                batch.delete_range(cq_key(prefix, cut), queue_range(prefix)[1])
                topic_bytes = key[0].encode("utf-8")
                if cut > low:
                    prev = CQ_VALUE.unpack(self.get_row(cq_key(prefix, cut - 1)) or b"")
                    new_max[key] = (cut - 1, prev[0])
                    batch.put(offset_key(topic_bytes, key[1], True),
                              OFFSET_VALUE.pack(prev[0], cut - 1), self._offset_cfh)
                elif low > 0:  # empty now, but its next offset stays where it was
                    new_max[key] = (low - 1, -1)
                    batch.put(offset_key(topic_bytes, key[1], True),
                              OFFSET_VALUE.pack(-1, low - 1), self._offset_cfh)
                else:
                    gone.append(key)
                    batch.delete(offset_key(topic_bytes, key[1], True), self._offset_cfh)
                    batch.delete(offset_key(topic_bytes, key[1], False), self._offset_cfh)
                log.warning("%s/%d: dropping %d units past CommitLog end %d",
                            key[0], key[1], max_q + 1 - cut, commitlog_end)
            batch.put(CHECKPOINT_KEY, I64.pack(commitlog_end), self._offset_cfh)
            self._write(batch)
            self._max.update(new_max)
            for key in gone:
                self._forget(key)
            self._max_phys = commitlog_end
            return dropped

    def correct_min_offsets(self, commitlog_min_offset: int) -> None:
        self.delete_expired(commitlog_min_offset)

    def delete_expired(self, min_commitlog_offset: int) -> int:
        """Remove units whose records are below ``min_commitlog_offset``; return how many.

        Nothing is looked at if the expiry watermark is already there (every restart). Else only
        queues whose min row points below it are touched (found in the offset table, no unit
        scanned), and the watermark moves up in the last batch."""
        if min_commitlog_offset <= self._expired_below:
            return 0
        removed = 0
        with self._lock:
            self._commit_locked()
            for key, _ in self._queue_rows():
                row = self._min.get(key)
                if row is not None and row[1] < min_commitlog_offset:
                    removed += self._expire_queue_locked(key, min_commitlog_offset)
            if not self.read_only and self._db is not None:
                batch = WriteBatch(raw_mode=True)
                batch.put(EXPIRED_BELOW_KEY, I64.pack(min_commitlog_offset), self._offset_cfh)
                self._write(batch)
            self._expired_below = min_commitlog_offset
        return removed

    def _expire_queue_locked(self, key: tuple[str, int], min_commitlog_offset: int) -> int:
        min_row, max_row = self._min_row(key), self.max_row(key)
        if min_row is None or max_row is None or min_row[1] >= min_commitlog_offset:
            return 0
        min_q = min_row[0]
        prefix = self._prefix(*key)
        new_min, phys = self._first_unit_where(prefix, min_q, max_row[0] + 1,
                                               lambda u: u[0] >= min_commitlog_offset)
        if phys < 0:  # every unit is gone: the queue is empty and starts at its max offset
            phys = min_commitlog_offset
        if not self.read_only and self._db is not None:
            batch = WriteBatch(raw_mode=True)
            batch.delete_range(cq_key(prefix, min_q), cq_key(prefix, new_min))
            batch.put(offset_key(key[0].encode("utf-8"), key[1], False),
                      OFFSET_VALUE.pack(phys, new_min), self._offset_cfh)
            self._write(batch)
        self._min[key] = (new_min, phys)
        return new_min - min_q

    def queue_min_offset(self, key: tuple[str, int], prefix: bytes) -> int:
        row = self._min_row(key)
        if row is None:
            return 0
        watermark = self.commitlog_min_offset
        if watermark is not None and row[1] < watermark():
            # The CommitLog moved on since the last clean-up: expire this queue now.
            with self._lock:
                self._expire_queue_locked(key, watermark())
                row = self._min_row(key) or row
        return row[0]

    def destroy_queue(self, topic: str, queue_id: int) -> None:
        """Remove a queue: one range delete for its units, two deletes for its offset rows."""
        if self.read_only or self._db is None:
            return
        topic_bytes = topic.encode("utf-8")
        with self._lock:
            self._commit_locked()
            batch = WriteBatch(raw_mode=True)
            batch.delete_range(*queue_range(queue_prefix(topic_bytes, queue_id)))
            batch.delete(offset_key(topic_bytes, queue_id, True), self._offset_cfh)
            batch.delete(offset_key(topic_bytes, queue_id, False), self._offset_cfh)
            self._write(batch)
            self._forget((topic, queue_id))

    def destroy_topic(self, topic: str) -> None:
        """Remove every queue of a topic: one range delete in each column family."""
        if self.read_only or self._db is None:
            return
        start, end = topic_range(topic.encode("utf-8"))
        with self._lock:
            self._commit_locked()
            rows = self._queue_rows()  # every queue of the topic must be cached as gone
            batch = WriteBatch(raw_mode=True)
            batch.delete_range(start, end)
            batch.delete_range(start, end, self._offset_cfh)
            self._write(batch)
            for key, _ in rows:
                if key[0] == topic:
                    self._forget(key)

    def disk_bytes(self) -> int:
        return allocated_bytes(self.path) if self.path.exists() else 0

    def compact(self) -> None:
        """Compact everything: range-deleted rows leave the SST files."""
        if self._db is not None and not self.read_only:
            self.commit_dispatch()
            self.db.compact_range(None, None)
            self.offset_cf.compact_range(None, None)


__all__ = ["RocksDBConsumeQueue", "RocksDBConsumeQueueStore"]
