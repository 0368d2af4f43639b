"""One index file: RocketMQ's on-disk hash index from ``topic#key`` to CommitLog offsets.

Spec: ``docs/formats/index-file.md``. A file is a 40-byte header, a table of ``hash_slot_num``
4-byte slots and ``index_num`` 20-byte entries, all big-endian::

    header  begin_timestamp q | end_timestamp q | begin_phy_offset q | end_phy_offset q
            | hash_slot_count i | index_count i
    slot    i   number of the newest entry whose key hash falls in this slot (0 = empty)
    entry   key_hash i | phy_offset q | time_diff_s i | prev_entry i

Entry 0 is never used (``index_count`` starts at 1), so "0" means "no entry" everywhere.
Entries of one slot form a list through ``prev_entry``, newest first (head insertion).

Ownership and threads: one writer (the dispatcher thread) calls ``put_keys``; any thread may
call ``select`` / ``contains`` while it holds a reference (``hold``/``release``; ``select`` takes
its own). The file owns its descriptor and its ``mmap``; ``destroy`` unlinks at once and unmaps
when the last reader lets go (or forcibly after an interval), like ``MappedFile``.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from stratamq.javahash import POW31 as _POW31
from stratamq.javahash import hash_u32 as _hash_u32
from stratamq.javahash import java_string_hash
from stratamq.limits import INT_MAX, OS_PAGE_SIZE
from stratamq.store.ref_counted_map import RefCountedMap

HEADER = struct.Struct(">qqqqii")
SLOT = struct.Struct(">i")
ENTRY = struct.Struct(">iqii")
HEADER_SIZE = HEADER.size
SLOT_SIZE = SLOT.size
ENTRY_SIZE = ENTRY.size
assert (HEADER_SIZE, SLOT_SIZE, ENTRY_SIZE) == (40, 4, 20)
_SLOT_UNPACK = SLOT.unpack_from
_SLOT_PACK = SLOT.pack_into
_ENTRY_PACK = ENTRY.pack_into
_ENTRY_UNPACK = ENTRY.unpack_from
_PREV = struct.Struct(">i")  # an entry's prev_entry field, read alone
_PREV_AT = ENTRY_SIZE - _PREV.size
# More uncounted entries than keys one record can carry (properties are < 32 KiB) means junk.
_MAX_UNCOUNTED = 32768

INVALID_INDEX = 0  # slot / prev_entry value meaning "none"
KEY_SEPARATOR = "#"  # between topic and key (IndexService.buildKey)
NAME_DIGITS = 17  # yyyyMMddHHmmssSSS, local time (UtilAll.timeMillisToHumanString)
# Reserve disk for entries this far past the write position before writing through the map:
# a write into a hole of a full disk raises SIGBUS (see MappedFile._ensure_allocated).
ENTRY_ALLOCATE_AHEAD = 1024 * 1024
# The slot table is reserved this many bytes at a time: one page at a time cost an fallocate
# for nearly every key of a new file's first ~40,000 (5,000 pages hit at random), which was
# most of the dispatcher's time per record in a young store; 64 KiB chunks take ~320 calls.
SLOT_RESERVE_CHUNK = 16 * OS_PAGE_SIZE


class IndexFileError(OSError):
    """An index file could not be created, mapped or written (disk full, wrong size...)."""


def file_size(hash_slot_num: int, index_num: int) -> int:
    return HEADER_SIZE + hash_slot_num * SLOT_SIZE + index_num * ENTRY_SIZE


_POW31_NP = None  # javahash.POW31 as a numpy array, built on first batch use
# Per key length L: 31**(L-1), ..., 31, 1 mod 2**32, contiguous, for the one-length batch path
# (a reversed view of _POW31_NP made numpy take a strided copy per call: half its time).
_POW31_REVERSED: dict[int, Any] = {}  # numpy arrays (numpy is imported on first use)


def key_hash(key: str) -> int:
    """RocketMQ's ``indexKeyHashMethod``: ``abs(hashCode)``, and 0 for Integer.MIN_VALUE."""
    h = abs(java_string_hash(key))
    return 0 if h > INT_MAX else h


_PREFIX_HASHES: dict[str, int] = {}  # topic -> hashCode of "topic#": few topics, hashed once


def topic_key_hash(topic: str, key: str) -> int:
    """``key_hash(build_key(topic, key))`` without hashing the topic again each time:
    hashCode(a + b) = hashCode(a) * 31**len(b) + hashCode(b), mod 2**32."""
    prefix = _PREFIX_HASHES.get(topic)
    if prefix is None:
        prefix = _hash_u32(topic + KEY_SEPARATOR)[0]
        if len(_PREFIX_HASHES) < 100_000:
            _PREFIX_HASHES[topic] = prefix
    h, n = _hash_u32(key)
    h = (prefix * (_POW31[n] if n < len(_POW31) else pow(31, n, 1 << 32)) + h) & 0xFFFFFFFF
    h = abs(h - (1 << 32) if h & 0x80000000 else h)
    return 0 if h > INT_MAX else h


# Below this many keys the numpy set-up costs more than it saves (measured: about even at 6
# to 8 keys of 45 characters, numpy twice as fast at 16, a 16-message send's round).
HASH_BATCH_MIN = 8


def key_hashes(keys: Sequence[str]) -> list[int]:
    """:func:`key_hash` of each key. Large ASCII batches are hashed with numpy in one pass
    over all their characters: each character times 31 to the power of its distance from
    its key's end, summed per key (uint64 sums cannot overflow: keys are < 2**16 units)."""
    if len(keys) < HASH_BATCH_MIN:
        return [key_hash(k) for k in keys]
    joined = "".join(keys)
    if not joined.isascii():
        return [key_hash(k) for k in keys]
    import numpy as np  # only the batch path needs it

    size = len(keys[0])
    lengths = list(map(len, keys))
    if 0 < size <= len(_POW31) and lengths.count(size) == len(keys):
        # Keys of one length (a topic's message ids): one matrix-vector product with the
        # powers of 31 as uint32, whose sums wrap mod 2**32 as Java's int does (numpy casts
        # the characters itself); a fraction of the general path's steps for the small
        # batches of a dispatch round.
        powers = _POW31_REVERSED.get(size)
        if powers is None:
            powers = _POW31_REVERSED[size] = np.array(_POW31[size - 1 :: -1], dtype=np.uint32)
        sums = np.frombuffer(joined.encode("ascii"), dtype=np.uint8).reshape(
            len(keys), size).dot(powers)
    else:
        if max(lengths) > len(_POW31) or min(lengths) == 0:
            return [key_hash(k) for k in keys]
        global _POW31_NP
        if _POW31_NP is None:
            _POW31_NP = np.array(_POW31, dtype=np.uint64)
        data = np.frombuffer(joined.encode("ascii"), dtype=np.uint8)
        lens = np.array(lengths, dtype=np.int64)
        ends = np.cumsum(lens)
        exponents = np.repeat(ends - 1, lens) - np.arange(len(data), dtype=np.int64)
        sums = np.add.reduceat(data * _POW31_NP[exponents], ends - lens)
    # abs() of the low 32 bits read as a Java int, in Python: for a round's few keys the
    # four numpy calls this took cost more than the loop.
    out = []
    for h in sums.tolist():
        h &= 0xFFFFFFFF
        if h & 0x80000000:
            h = (1 << 32) - h  # abs of the negative int; 2**31 is Integer.MIN_VALUE:
            if h > INT_MAX:  # its abs is negative in Java, and RocketMQ maps it to 0
                h = 0
        out.append(h)
    return out


def build_key(topic: str, key: str) -> str:
    return f"{topic}{KEY_SEPARATOR}{key}"


def file_name_for(ms: int) -> str:
    """The 17-digit local-time name RocketMQ gives a file created at ``ms``."""
    stamp = datetime.fromtimestamp(ms / 1000)
    return stamp.strftime("%Y%m%d%H%M%S") + f"{ms % 1000:03d}"


def is_index_file_name(name: str) -> bool:
    return len(name) == NAME_DIGITS and name.isdigit()


@dataclass
class IndexHeader:
    begin_timestamp: int = 0
    end_timestamp: int = 0
    begin_phy_offset: int = 0
    end_phy_offset: int = 0
    hash_slot_count: int = 0
    index_count: int = 1

    def pack(self) -> bytes:
        return HEADER.pack(self.begin_timestamp, self.end_timestamp, self.begin_phy_offset,
                           self.end_phy_offset, self.hash_slot_count, self.index_count)

    @classmethod
    def unpack(cls, buf: bytes | memoryview | mmap.mmap) -> IndexHeader:
        return cls(*HEADER.unpack_from(buf, 0))


class IndexFile(RefCountedMap):
    """One index file, mapped. ``create=True`` makes a new one (it must not exist yet).

    ``begin_phy_offset``/``begin_timestamp`` seed the header of a new file with where the
    previous file ended, as RocketMQ does; the first ``put_keys`` overwrites them.
    """

    _error = IndexFileError
    _map: mmap.mmap  # always mapped: index files are never evicted (see map_budget)

    def __init__(self, path: Path, hash_slot_num: int, index_num: int, *,
                 read_only: bool = False, create: bool = False,
                 begin_phy_offset: int = 0, begin_timestamp: int = 0) -> None:
        if hash_slot_num <= 0 or index_num <= 1:
            raise ValueError("an index file needs at least 1 hash slot and 2 entries")
        self.path = path
        self.hash_slot_num = hash_slot_num
        self.index_num = index_num
        self.read_only = read_only
        self.size = file_size(hash_slot_num, index_num)
        self._entries_at = HEADER_SIZE + hash_slot_num * SLOT_SIZE
        self._init_lifetime()
        self.dirty = False  # written since the last flush
        flags = os.O_RDONLY if read_only else os.O_RDWR
        if create:
            flags |= os.O_CREAT | os.O_EXCL
        try:
            self._fd = os.open(path, flags, 0o644)
        except OSError as exc:
            raise IndexFileError(exc.errno, f"cannot open index file {path}: {exc.strerror}"
                                 ) from exc
        try:
            actual = os.fstat(self._fd).st_size
            if create:
                os.ftruncate(self._fd, self.size)  # sparse, like RocketMQ's
                # The header's blocks before the map exists: no full disk is met through it.
                self._reserve(0, HEADER_SIZE)
            elif actual != self.size:
                raise IndexFileError(
                    f"{path}: size {actual} bytes, expected {self.size} for maxHashSlotNum="
                    f"{hash_slot_num}, maxIndexNum={index_num}"
                )
            access = mmap.ACCESS_READ if read_only else mmap.ACCESS_WRITE
            self._map = mmap.mmap(self._fd, self.size, access=access)
        except BaseException:
            os.close(self._fd)
            if create:
                with contextlib.suppress(OSError):
                    os.unlink(path)
            raise
        # Disk reserved so far: the header page and the slot table in chunks of
        # SLOT_RESERVE_CHUNK as keys land in them (the table is written at random places;
        # reserving all of it would cost 20 MB per default file), entries in chunks ahead of
        # the write position.
        self._slot_pages: set[int] = set()  # chunk numbers (slot_at // SLOT_RESERVE_CHUNK)
        self._entries_allocated_until = self._entries_at
        if create:
            self.header = IndexHeader(begin_timestamp, begin_timestamp, begin_phy_offset,
                                      begin_phy_offset, 0, 1)
            self._map[0:HEADER_SIZE] = self.header.pack()
            self.dirty = True
        else:
            self.header = IndexHeader.unpack(self._map)
            # Reserving what is already allocated is a cheap no-op, so start from nothing.
            self._entries_allocated_until = self.entry_pos(self.header.index_count)

    # -- geometry -------------------------------------------------------------------------------

    def slot_pos(self, hash_: int) -> int:
        return HEADER_SIZE + (hash_ % self.hash_slot_num) * SLOT_SIZE

    def entry_pos(self, number: int) -> int:
        return self._entries_at + number * ENTRY_SIZE

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def index_count(self) -> int:
        return self.header.index_count

    @property
    def entries(self) -> int:
        """Entries written (``index_count`` counts the unused entry 0 too)."""
        return max(0, self.header.index_count - 1)

    @property
    def begin_timestamp(self) -> int:
        return self.header.begin_timestamp

    @property
    def end_timestamp(self) -> int:
        return self.header.end_timestamp

    @property
    def begin_phy_offset(self) -> int:
        return self.header.begin_phy_offset

    @property
    def end_phy_offset(self) -> int:
        return self.header.end_phy_offset

    def is_full(self) -> bool:
        return self.header.index_count >= self.index_num

    def is_time_matched(self, begin: int, end: int) -> bool:
        """Does [begin, end] overlap this file's time span (RocketMQ's isTimeMatched)."""
        b, e = self.header.begin_timestamp, self.header.end_timestamp
        return (begin < b and end > e) or b <= begin <= e or b <= end <= e

    # -- checking -------------------------------------------------------------------------------

    def damage(self) -> str | None:
        """Why this file cannot be trusted, or None. Checks the header against itself and
        against the newest entry; a write cut short (entry without header, header without
        slot) shows up here."""
        h = self.header
        count = h.index_count
        if not 1 <= count <= self.index_num:
            return f"index count {count} outside 1..{self.index_num}"
        if not 0 <= h.hash_slot_count <= count:
            return f"hash slot count {h.hash_slot_count} exceeds index count {count}"
        if count > 1:
            if h.begin_phy_offset > h.end_phy_offset or h.begin_phy_offset < 0:
                return f"physical offsets {h.begin_phy_offset}..{h.end_phy_offset} out of order"
            if h.begin_timestamp > h.end_timestamp or h.begin_timestamp <= 0:
                return f"timestamps {h.begin_timestamp}..{h.end_timestamp} out of order"
            hash_, phys, _, prev = ENTRY.unpack_from(self._map, self.entry_pos(count - 1))
            if phys != h.end_phy_offset:
                return (f"newest entry #{count - 1} points at {phys}, header says "
                        f"{h.end_phy_offset}")
            if not 0 <= prev < count - 1:
                return f"newest entry #{count - 1} links to entry {prev}"
            (head,) = SLOT.unpack_from(self._map, self.slot_pos(hash_))
            if head != count - 1:
                return f"slot of newest entry #{count - 1} holds {head}: slot write lost"
        # By pread: the entry past the newest may be a hole (a read fault there on a full
        # tmpfs is a SIGBUS; pread of a hole allocates nothing).
        if (count < self.index_num
                and os.pread(self._fd, ENTRY_SIZE, self.entry_pos(count)) != bytes(ENTRY_SIZE)):
            return f"entry #{count} is written but not counted in the header"
        return None

    # -- writing (the dispatcher thread only) ---------------------------------------------------

    def put_key(self, hash_: int, phy_offset: int, store_timestamp: int) -> bool:
        """Add one entry; False if the file is full."""
        return self.put_keys((hash_,), phy_offset, store_timestamp) == 1

    def put_keys(self, hashes: Sequence[int], phy_offset: int, store_timestamp: int) -> int:
        """Add one entry per hash for the record at ``phy_offset``; return how many were added
        (fewer than asked once the file is full).

        Each entry is written before its slot, and the header counts the record's entries
        only after all of them are written (RocketMQ's order, once per record rather than per
        key): a reader or a crash never sees a header claiming an unwritten entry. A slot may
        briefly point at an entry not counted yet; readers step over it (see ``_chain``)."""
        if self.header.index_count >= self.index_num or not hashes:
            return 0
        added = self._add(hashes, phy_offset, store_timestamp)
        self._write_header()
        return added

    def put_records(self, hashes: Sequence[int], offsets: Sequence[int],
                    timestamps: Sequence[int]) -> bool:
        """``put_keys`` for each record in turn, the header written once at the end: the same
        bytes as one ``put_keys`` per record, for a dispatch round at a time. False (nothing
        written) unless every key fits in this file.

        One entry per key, flat: its hash, and its record's CommitLog offset and store time.
        A record's keys are consecutive and share its offset, and consecutive records have
        different offsets (a record's offset is its own), so a change of offset is where the
        next record starts. Flat, because most records carry one key (their message id):
        a list per record, and a loop over it, cost more than writing the entry.

        One loop over the round's keys (``_add``'s steps, its set-up done once per round and
        the entries' disk reserved up front): a call and a dozen attribute reads per record
        were as much as the writes of a message id's entry.

        The header still never counts an unwritten entry: it is written after all of them
        (and when a write raises, once it counts the records written before, as the calls
        per record would have left it)."""
        h = self.header
        count = h.index_count
        total = len(hashes)
        if count + total > self.index_num:
            return False
        if not total:
            return True
        m = self._map
        slots = self.hash_slot_num
        slot_pages = self._slot_pages
        entries_at = self._entries_at
        last_end = entries_at + (count + total) * ENTRY_SIZE
        if last_end > self._entries_allocated_until:
            target = min(self.size, last_end + ENTRY_ALLOCATE_AHEAD)
            self._reserve(self._entries_allocated_until, target)
            self._entries_allocated_until = target
        # Once every chunk of the slot table is reserved (a file's first few thousand keys),
        # the per-key check goes.
        slot_chunks_left = len(slot_pages) < (entries_at - 1) // SLOT_RESERVE_CHUNK + 1
        slot_count = h.hash_slot_count
        begin_ts = h.begin_timestamp
        done: tuple[int, int, int, int] | None = None  # counts, phys, ts of whole records
        record = -1  # the offset of the record being written (none yet)
        record_ts = diff = 0
        try:
            for hash_, phys, ts in zip(hashes, offsets, timestamps):
                if phys != record:  # the next record's first key
                    if record >= 0:
                        done = (count, slot_count, record, record_ts)
                    record, record_ts = phys, ts
                    if count <= 1:  # the file's first entry: see _add
                        h.begin_phy_offset = phys
                        h.begin_timestamp = begin_ts = ts
                    diff = (ts - begin_ts) // 1000 if begin_ts > 0 else 0
                    if diff < 0:
                        diff = 0
                    elif diff > INT_MAX:
                        diff = INT_MAX
                slot_at = HEADER_SIZE + (hash_ % slots) * SLOT_SIZE
                if slot_chunks_left:
                    chunk = slot_at // SLOT_RESERVE_CHUNK
                    if chunk not in slot_pages:
                        self._reserve(chunk * SLOT_RESERVE_CHUNK,
                                      min(entries_at, (chunk + 1) * SLOT_RESERVE_CHUNK))
                        slot_pages.add(chunk)
                (head,) = _SLOT_UNPACK(m, slot_at)
                if head <= INVALID_INDEX or head >= count:
                    head = INVALID_INDEX
                    slot_count += 1
                _ENTRY_PACK(m, entries_at + count * ENTRY_SIZE, hash_, phys, diff, head)
                _SLOT_PACK(m, slot_at, count)
                count += 1
            done = (count, slot_count, record, record_ts)
        finally:
            if done is not None:
                h.index_count, h.hash_slot_count, h.end_phy_offset, h.end_timestamp = done
                self.dirty = True
                self._write_header()
        return True

    def _add(self, hashes: Sequence[int], phy_offset: int, store_timestamp: int) -> int:
        """Write the entries and slots of one record and count them in ``header`` (in memory:
        the caller writes the header once its records are written)."""
        h = self.header
        count = h.index_count
        limit = self.index_num
        m = self._map
        slots = self.hash_slot_num
        slot_pages = self._slot_pages
        entries_at = self._entries_at
        if count <= 1:
            # RocketMQ computes the first entry's delta against the previous file's end time
            # and only then resets the begin time; we reset first so the delta (0) is right.
            h.begin_phy_offset = phy_offset
            h.begin_timestamp = store_timestamp
        diff = (store_timestamp - h.begin_timestamp) // 1000 if h.begin_timestamp > 0 else 0
        diff = min(max(diff, 0), INT_MAX)
        slot_count = h.hash_slot_count
        added = 0
        try:
            for hash_ in hashes:
                if count >= limit:
                    break
                slot_at = HEADER_SIZE + (hash_ % slots) * SLOT_SIZE
                chunk = slot_at // SLOT_RESERVE_CHUNK
                if chunk not in slot_pages:
                    self._reserve(chunk * SLOT_RESERVE_CHUNK,
                                  min(entries_at, (chunk + 1) * SLOT_RESERVE_CHUNK))
                    slot_pages.add(chunk)
                entry_at = entries_at + count * ENTRY_SIZE
                if entry_at + ENTRY_SIZE > self._entries_allocated_until:
                    target = min(self.size, entry_at + ENTRY_SIZE + ENTRY_ALLOCATE_AHEAD)
                    self._reserve(self._entries_allocated_until, target)
                    self._entries_allocated_until = target
                (head,) = _SLOT_UNPACK(m, slot_at)
                if head <= INVALID_INDEX or head >= count:
                    head = INVALID_INDEX
                    slot_count += 1
                _ENTRY_PACK(m, entry_at, hash_, phy_offset, diff, head)
                _SLOT_PACK(m, slot_at, count)
                count += 1
                added += 1
        finally:
            # Counted only if the whole record was written, or if the file filled up (the
            # caller writes the rest in the next file): a reserve that failed mid-record
            # leaves its written entries uncounted, as before.
            if added == len(hashes) or count >= limit:
                h.hash_slot_count = slot_count
                h.index_count = count
                h.end_phy_offset = phy_offset
                h.end_timestamp = store_timestamp
                self.dirty = True
        return added

    def _write_header(self) -> None:
        h = self.header
        HEADER.pack_into(self._map, 0, h.begin_timestamp, h.end_timestamp, h.begin_phy_offset,
                         h.end_phy_offset, h.hash_slot_count, h.index_count)

    def flush(self) -> None:
        if self.read_only or not self.dirty or self._closed:
            return
        if not self.hold():
            return
        try:
            self.dirty = False
            os.fdatasync(self._fd)  # releases the GIL; writes back pages dirtied via the map
        finally:
            self.release()

    # -- reading (any thread) -------------------------------------------------------------------

    def _head(self, hash_: int, count: int) -> int:
        """The newest counted entry of the hash's slot (0 if none). The writer links an entry
        into its slot before the header counts it (put_keys): step over such entries to the
        counted ones they link to, rather than miss the whole list."""
        m = self._map
        # Through the descriptor, not the map: a slot no key has reached is a hole, and a read
        # fault in a hole of a full tmpfs is a SIGBUS (pread of a hole allocates nothing).
        raw = os.pread(self._fd, SLOT_SIZE, HEADER_SIZE + (hash_ % self.hash_slot_num) * SLOT_SIZE)
        (number,) = _SLOT_UNPACK(raw) if len(raw) == SLOT_SIZE else (0,)
        skipped = 0
        while count <= number < self.index_num and skipped < _MAX_UNCOUNTED:
            number = _PREV.unpack_from(m, self.entry_pos(number) + _PREV_AT)[0]
            skipped += 1
        return number

    def _chain(self, hash_: int) -> Iterator[tuple[int, int, int, int]]:
        """(key_hash, phy_offset, time_diff, number) along the slot's list, newest first.
        Caller holds a reference. Bad links end the walk rather than loop."""
        m = self._map
        count = self.header.index_count
        if count <= 1:
            return
        number = self._head(hash_, count)
        seen = 0
        while INVALID_INDEX < number < count and seen < count:
            hash_read, phys, diff, prev = _ENTRY_UNPACK(m, self.entry_pos(number))
            yield hash_read, phys, diff, number
            if prev == number:
                return
            number = prev
            seen += 1

    def select(self, hash_: int, begin: int, end: int) -> Iterator[int]:
        """Physical offsets of entries with this key hash stored in [begin, end] (by the
        entry's second-granular time), newest first. The key itself is not stored: callers
        check the message (hashes collide). The walk of ``_chain``, inlined: this is the
        inner loop of every lookup."""
        if not self.hold():
            return
        try:
            header = self.header
            count = header.index_count
            if count <= 1:
                return
            base = header.begin_timestamp
            m = self._map
            entries_at = self._entries_at
            number = self._head(hash_, count)
            seen = 0
            while INVALID_INDEX < number < count and seen < count:
                hash_read, phys, diff, prev = _ENTRY_UNPACK(m, entries_at + number * ENTRY_SIZE)
                if diff < 0:
                    return
                t = base + diff * 1000
                if hash_read == hash_ and begin <= t <= end:
                    yield phys
                if t < begin or prev == number:
                    return  # older entries are older still; or a self-link
                number = prev
                seen += 1
        finally:
            self.release()

    def contains(self, hash_: int, phy_offset: int) -> bool:
        """Is there an entry for (hash, offset)? Walks only entries at or after the offset."""
        if not self.hold():
            return False
        try:
            for hash_read, phys, _, _ in self._chain(hash_):
                if phys < phy_offset:
                    return False
                if hash_read == hash_ and phys == phy_offset:
                    return True
            return False
        finally:
            self.release()

    def __repr__(self) -> str:
        h = self.header
        return (f"IndexFile({self.name}, entries={self.entries}, "
                f"phy={h.begin_phy_offset}..{h.end_phy_offset})")


__all__ = [
    "ENTRY", "ENTRY_SIZE", "HASH_BATCH_MIN", "HEADER", "HEADER_SIZE", "INVALID_INDEX",
    "IndexFile", "IndexFileError", "IndexHeader", "SLOT", "SLOT_SIZE", "build_key",
    "file_name_for", "file_size", "is_index_file_name", "java_string_hash", "key_hash",
    "key_hashes",
    "topic_key_hash",
]  # fmt: skip
