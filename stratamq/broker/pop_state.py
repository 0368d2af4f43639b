"""Durable consumer progress and in-flight (popped, not yet acked) messages, in RocksDB.

Spec: ``docs/formats/broker-pop-state.md``. The database lives in ``<root>/config/popState``.

Why RocksDB (rocksdict) and not a JSON file or a home-made journal: every receive and every ack
changes this state, so it must be written per request, atomically for several keys at once (a
pop moves a cursor *and* records the popped offsets), and it must survive a SIGKILL between any
two of those writes. A RocksDB ``WriteBatch`` is exactly that: one atomic WAL append per
request. The WAL is in the OS page cache once ``write`` returns, so a killed process loses
nothing; ``popStateSyncWrite=true`` also fsyncs it so a power cut loses nothing either.
Compaction keeps the files small however many acks went by, which a journal would have to
reimplement.

Keys are ``kind \\0 group \\0 topic \\0`` then big-endian integers, so one group's or one
topic's keys are contiguous:

* ``C``: ``queue_id u32`` -> ``offset u64``: the pop cursor, the next never-delivered offset.
* ``I``: ``queue_id u32, offset u64`` -> ``visible_at_ms i64, attempt u32, generation i64``:
  one in-flight message. ``attempt`` counts deliveries (1 = first); ``generation`` changes on
  every delivery and every invisible-time change, so a receipt handle from before either is
  recognised as stale.
* ``O``: ``queue_id u32`` -> ``offset u64``: the offset a pull consumer committed (UpdateOffset).
* ``S`` (empty group and topic) ``receipt-key`` -> 32 random bytes: the key receipt handles are
  signed with, made on first open and kept, so handles stay valid across restarts.

The whole state is also held in memory (loaded at open); the in-memory copy is the read path.
Thread-safety: callers serialise writers per (group, topic) (see ``PopEngine``) so a
read-modify-write of one pair is atomic; the dicts are only mutated, under ``_mutex``, together
with the batch that persists the change. Readers on other threads (admin progress, metrics,
GetOffset) get copies taken under ``_mutex``: iterating the live dicts while a receive on
another thread inserts a key raises "dictionary changed size during iteration".
"""

from __future__ import annotations

import base64
import heapq
import os
import struct
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rocksdict import Options, Rdict, WriteBatch, WriteOptions

__all__ = ["InFlight", "PopState"]

_QID = struct.Struct(">I")
_QID_OFF = struct.Struct(">IQ")
_OFFSET = struct.Struct(">Q")
_ENTRY = struct.Struct(">qIq")
_RECEIPT_KEY = b"S\0\0\0receipt-key"


@dataclass
class InFlight:
    visible_at: int  # ms since the epoch when the message may be delivered again
    attempt: int  # deliveries so far (1 after the first)
    generation: int  # identifies the latest receipt handle


def _prefix(kind: bytes, group: str, topic: str) -> bytes:
    return kind + b"\0" + group.encode() + b"\0" + topic.encode() + b"\0"


def _heap_of(table: dict[tuple[int, int], InFlight]) -> list[tuple[int, int, int]]:
    heap = [(e.visible_at, qid, off) for (qid, off), e in table.items()]
    heapq.heapify(heap)
    return heap


def _split(key: bytes) -> tuple[bytes, str, str, bytes]:
    kind, group, topic, rest = key.split(b"\0", 3)
    return kind, group.decode(), topic.decode(), rest


class PopState:
    """Cursors, in-flight entries and pull offsets of every group; see the module docstring."""

    def __init__(self, path: Path, sync: bool = False) -> None:
        path.mkdir(parents=True, exist_ok=True)
        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        self.db = Rdict(str(path), opts)
        self.write_opts = WriteOptions()
        self.write_opts.sync = sync
        self.cursors: dict[tuple[str, str, int], int] = {}
        self.inflight: dict[tuple[str, str], dict[tuple[int, int], InFlight]] = {}
        self.offsets: dict[tuple[str, str, int], int] = {}
        self._mutex = threading.Lock()
        # Per pair, a min-heap of (visible_at, queue_id, offset) over its in-flight entries,
        # so a pop learns "is anything due?" without scanning thousands of entries in flight.
        # Lazy: a heap item is stale once its entry was deleted or re-put with another
        # visible_at (skipped when it reaches the top; the heap is rebuilt from the table
        # when stale items outnumber live ones). Built on first use; every put pushes.
        self._heaps: dict[tuple[str, str], list[tuple[int, int, int]]] = {}
        self.receipt_key: bytes = b""
        for key, value in self.db.items():
            kind, group, topic, rest = _split(bytes(key))  # type: ignore[arg-type]
            if kind == b"S":
                if key == _RECEIPT_KEY:
                    self.receipt_key = bytes(value)
                continue
            if kind == b"C":
                self.cursors[(group, topic, _QID.unpack(rest)[0])] = _OFFSET.unpack(value)[0]
            elif kind == b"O":
                self.offsets[(group, topic, _QID.unpack(rest)[0])] = _OFFSET.unpack(value)[0]
            elif kind == b"I":
                qid, off = _QID_OFF.unpack(rest)
                self.inflight.setdefault((group, topic), {})[(qid, off)] = InFlight(
                    *_ENTRY.unpack(value))

        if len(self.receipt_key) != 32:
            self.receipt_key = os.urandom(32)
            synced = WriteOptions()
            synced.sync = True
            self.db.put(_RECEIPT_KEY, self.receipt_key, synced)

    def close(self) -> None:
        self.db.flush_wal(True)
        self.db.close()

    # -- reads ----------------------------------------------------------------------------------

    def cursor(self, group: str, topic: str, queue_id: int) -> int | None:
        return self.cursors.get((group, topic, queue_id))

    def entries(self, group: str, topic: str) -> dict[tuple[int, int], InFlight]:
        """A copy of the pair's in-flight table (safe to iterate while others pop/ack)."""
        with self._mutex:
            return dict(self.inflight.get((group, topic), {}))

    def entry(self, group: str, topic: str, queue_id: int, offset: int) -> InFlight | None:
        """One in-flight entry, without copying the pair's table (an ack looks up one)."""
        with self._mutex:
            return self.inflight.get((group, topic), {}).get((queue_id, offset))

    def earliest(self, group: str, topic: str) -> int | None:
        """The smallest ``visible_at`` of the pair's in-flight entries (None: none in flight):
        a pop scans the entries for redeliveries only once this is due."""
        pair = (group, topic)
        with self._mutex:
            table = self.inflight.get(pair)
            if not table:
                return None
            heap = self._heaps.get(pair)
            if heap is None:
                heap = self._heaps[pair] = _heap_of(table)
            while heap:
                visible_at, qid, off = heap[0]
                e = table.get((qid, off))
                if e is not None and e.visible_at == visible_at:
                    return visible_at
                heapq.heappop(heap)  # stale: acked, or re-put with another time
            # Unreachable while every put pushes; rebuilt rather than trusted if it happens.
            heap[:] = _heap_of(table)
            return heap[0][0] if heap else None

    def busy_queues(self, group: str, topic: str) -> set[int]:
        """The queues with a message of the pair in flight."""
        with self._mutex:
            return {qid for (qid, _off) in self.inflight.get((group, topic), ())}

    def offset(self, group: str, topic: str, queue_id: int) -> int | None:
        """The offset a pull consumer committed with UpdateOffset, if any."""
        return self.offsets.get((group, topic, queue_id))

    def committed(self, group: str, topic: str, queue_id: int) -> int | None:
        """Everything below this offset is consumed (acked or filtered out) by the group."""
        cursor = self.cursors.get((group, topic, queue_id))
        if cursor is None:
            return None
        pending = [off for (q, off) in self.entries(group, topic) if q == queue_id]
        return min([cursor, *pending])

    def groups_of(self) -> set[tuple[str, str]]:
        """Every (group, topic) with a cursor, an in-flight table or a committed offset."""
        with self._mutex:
            return ({(g, t) for (g, t, _q) in self.cursors} | set(self.inflight)
                    | {(g, t) for (g, t, _q) in self.offsets})

    def cursor_queues(self, group: str, topic: str) -> list[int]:
        with self._mutex:
            return sorted(q for (g, t, q) in self.cursors if g == group and t == topic)

    # -- writes ---------------------------------------------------------------------------------

    def apply(self, group: str, topic: str, *, cursors: dict[int, int] | None = None,
              put: dict[tuple[int, int], InFlight] | None = None,
              delete: Iterable[tuple[int, int]] = ()) -> None:
        """Persist a set of changes atomically, then mirror them in memory."""
        batch = WriteBatch(raw_mode=True)
        delete = list(delete)
        if cursors:
            prefix = _prefix(b"C", group, topic)
            for qid, off in cursors.items():
                batch.put(prefix + _QID.pack(qid), _OFFSET.pack(off))
        prefix = _prefix(b"I", group, topic)
        if put:
            for (qid, off), e in put.items():
                batch.put(prefix + _QID_OFF.pack(qid, off),
                          _ENTRY.pack(e.visible_at, e.attempt, e.generation))
        for qid, off in delete:
            batch.delete(prefix + _QID_OFF.pack(qid, off))
        self.db.write(batch, self.write_opts)
        pair = (group, topic)
        with self._mutex:
            for qid, off in (cursors or {}).items():
                self.cursors[(group, topic, qid)] = off
            table = self.inflight.setdefault(pair, {})
            if put:
                table.update(put)
            for key in delete:
                table.pop(key, None)
            heap = self._heaps.get(pair)
            if put and heap is not None:
                if len(heap) + len(put) > 2 * len(table) + 64:
                    self._heaps[pair] = _heap_of(table)  # mostly stale: start afresh
                else:
                    for (qid, off), e in put.items():
                        heapq.heappush(heap, (e.visible_at, qid, off))

    def set_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        batch = WriteBatch(raw_mode=True)
        batch.put(_prefix(b"O", group, topic) + _QID.pack(queue_id), _OFFSET.pack(offset))
        self.db.write(batch, self.write_opts)
        with self._mutex:
            self.offsets[(group, topic, queue_id)] = offset

    # -- replication (a slave broker copies its master's state: broker/replication.py) -------

    def snapshot(self) -> dict[str, Any]:
        """The whole state as JSON-ready data (taken under the mutex: one consistent view)."""
        with self._mutex:
            return {
                "receiptKey": base64.b64encode(self.receipt_key).decode(),
                "cursors": [[g, t, q, o] for (g, t, q), o in sorted(self.cursors.items())],
                "offsets": [[g, t, q, o] for (g, t, q), o in sorted(self.offsets.items())],
                "inflight": [[g, t, q, o, e.visible_at, e.attempt, e.generation]
                             for (g, t), table in sorted(self.inflight.items())
                             for (q, o), e in sorted(table.items())],
            }

    def restore(self, snap: dict[str, Any]) -> bool:
        """Make the state ``snap`` (from ``snapshot``), durably and atomically; False when it
        already was. ValueError for a snapshot that is not one."""
        try:
            key = base64.b64decode(snap["receiptKey"], validate=True)
            cursors = {(str(g), str(t), int(q)): int(o) for g, t, q, o in snap["cursors"]}
            offsets = {(str(g), str(t), int(q)): int(o) for g, t, q, o in snap["offsets"]}
            inflight: dict[tuple[str, str], dict[tuple[int, int], InFlight]] = {}
            for g, t, q, o, visible_at, attempt, generation in snap["inflight"]:
                inflight.setdefault((str(g), str(t)), {})[(int(q), int(o))] = InFlight(
                    int(visible_at), int(attempt), int(generation))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a pop-state snapshot: {exc!r}") from None
        if len(key) != 32:
            raise ValueError("not a pop-state snapshot: the receipt key is not 32 bytes")
        with self._mutex:
            if (key == self.receipt_key and cursors == self.cursors and offsets == self.offsets
                    and {k: v for k, v in self.inflight.items() if v} == inflight):
                return False
        batch = WriteBatch(raw_mode=True)
        for old in list(self.db.keys()):
            if bytes(old)[:1] in (b"C", b"I", b"O"):  # type: ignore[arg-type]
                batch.delete(old)
        for (g, t, q), o in cursors.items():
            batch.put(_prefix(b"C", g, t) + _QID.pack(q), _OFFSET.pack(o))
        for (g, t, q), o in offsets.items():
            batch.put(_prefix(b"O", g, t) + _QID.pack(q), _OFFSET.pack(o))
        for (g, t), table in inflight.items():
            for (q, o), e in table.items():
                batch.put(_prefix(b"I", g, t) + _QID_OFF.pack(q, o),
                          _ENTRY.pack(e.visible_at, e.attempt, e.generation))
        batch.put(_RECEIPT_KEY, key)
        self.db.write(batch, self.write_opts)
        with self._mutex:
            self.receipt_key = key
            self.cursors, self.offsets, self.inflight = cursors, offsets, inflight
            self._heaps = {}
        return True

    def drop_topic(self, topic: str) -> None:
        """Forget every group's state for a deleted topic."""
        self._drop(lambda group, t: t == topic)

    def drop_group(self, group: str) -> None:
        """Forget a group's offsets and in-flight messages on every topic (RocketMQ's
        ``removeOffset`` of a deleted subscription group)."""
        self._drop(lambda g, topic: g == group)

    def _drop(self, which: Callable[[str, str], bool]) -> None:
        batch = WriteBatch(raw_mode=True)
        for key in list(self.db.keys()):
            kind, g, t, _rest = _split(bytes(key))  # type: ignore[arg-type]
            if which(g, t) and kind != b"S":
                batch.delete(key)
        self.db.write(batch, self.write_opts)
        with self._mutex:
            for table in (self.cursors, self.offsets):
                for k in [k for k in table if which(k[0], k[1])]:
                    del table[k]
            for pair in [p for p in self.inflight if which(p[0], p[1])]:
                del self.inflight[pair]
                self._heaps.pop(pair, None)
