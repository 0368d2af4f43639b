"""The OffsetMap: md5(key) -> the last queue offset seen for that key, in bounded memory.

Seed 001's map (RocketMQ's ``CompactionLog.OffsetMap``), laid out like Kafka's
``SkimpyOffsetMap``: an open-addressing table of 24-byte entries (the 16-byte digest as two
64-bit words, and an 8-byte offset) in three numpy arrays, filled to at most 90 %, so a key
costs at most 24 / 0.9 = 26.7 bytes. Linear probing from ``digest mod capacity`` (md5 bits are
uniform). An offset of -1 marks an empty slot (queue offsets are never negative).

Keys go in and are looked up in bulk (``put_many`` / ``get_many``): one vectorised probe step
at a time over all pending keys, never a Python loop per key and never a dict of objects.
``put_many`` stops when the map is full and says how many it took: a round then compacts up to
there and the next round goes on from there (the incremental build).

Not thread-safe: one round owns its map.
"""

from __future__ import annotations

import hashlib

import numpy as np

__all__ = ["ENTRY_BYTES", "LOAD_FACTOR", "OffsetMap", "digests_of"]

ENTRY_BYTES = 8 + 8 + 8  # digest high word, low word, offset
LOAD_FACTOR = 0.9
EMPTY = -1


def digests_of(keys: list[str]) -> np.ndarray:
    """md5 of each key (UTF-8), as an (n, 2) array of big-endian 64-bit words."""
    raw = b"".join(hashlib.md5(k.encode("utf-8")).digest() for k in keys)
    return np.frombuffer(raw, dtype=">u8").reshape(-1, 2)


def _words(digests: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(high, low) native uint64 words of digests given as (n, 2) words or n 16-byte voids."""
    if digests.dtype.kind == "V":
        digests = np.ascontiguousarray(digests).view(">u8").reshape(-1, 2)
    return digests[:, 0].astype(np.uint64), digests[:, 1].astype(np.uint64)


class OffsetMap:
    """An open-addressing table of ``memory_bytes // 24`` slots (see the module docstring)."""

    def __init__(self, memory_bytes: int) -> None:
        capacity = max(memory_bytes // ENTRY_BYTES, 16)
        self.capacity = capacity
        self.max_entries = int(capacity * LOAD_FACTOR)
        self._hi = np.zeros(capacity, dtype=np.uint64)
        self._lo = np.zeros(capacity, dtype=np.uint64)
        self._off = np.full(capacity, EMPTY, dtype=np.int64)
        self.size = 0  # keys held
        self.last_offset = -1  # the highest offset put (RocketMQ's OffsetMap.lastOffset)

    @property
    def nbytes(self) -> int:
        return self._hi.nbytes + self._lo.nbytes + self._off.nbytes

    def bytes_per_key(self) -> float:
        return self.nbytes / self.size if self.size else float("inf")

    @property
    def full(self) -> bool:
        return self.size >= self.max_entries

    def _slots(self, lo: np.ndarray) -> np.ndarray:
        return (lo % np.uint64(self.capacity)).astype(np.int64)

    def _find(self, hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
        """For each digest, its slot, or where the probe met an empty slot (as -slot - 1)."""
        found = np.empty(len(hi), dtype=np.int64)
        pending = np.arange(len(hi))
        slot = self._slots(lo)
        cap = self.capacity
        while pending.size:
            s = slot
            off = self._off[s]
            empty = off == EMPTY
            match = ~empty & (self._hi[s] == hi[pending]) & (self._lo[s] == lo[pending])
            done = empty | match
            found[pending[match]] = s[match]
            found[pending[empty]] = -s[empty] - 1
            keep = ~done
            pending = pending[keep]
            slot = s[keep] + 1
            slot[slot == cap] = 0
        return found

    def get_many(self, digests: np.ndarray) -> np.ndarray:
        """The offset held for each digest, -1 where the map has none."""
        hi, lo = _words(digests)
        where = self._find(hi, lo)
        out = np.full(len(hi), EMPTY, dtype=np.int64)
        hit = where >= 0
        out[hit] = self._off[where[hit]]
        return out

    def put_many(self, digests: np.ndarray, offsets: np.ndarray) -> int:
        """Put ``digests[i] -> offsets[i]``, stopping before the first key that would take the
        map past its load factor; return how many were put. A key keeps the highest offset it
        is given (a round puts offsets in increasing order, so that is the last one)."""
        n = len(offsets)
        room = self.max_entries - self.size
        if n == 0:
            return 0
        hi, lo = _words(digests)
        offsets = np.asarray(offsets, dtype=np.int64)
        take = n
        if n > room:
            # Which positions bring a key the map does not hold yet, for the first time?
            absent = np.flatnonzero(self._find(hi, lo) < 0)
            order = absent[np.lexsort((hi[absent], lo[absent]))]  # stable: first one first
            repeat = np.zeros(len(order), dtype=bool)
            repeat[1:] = (hi[order[1:]] == hi[order[:-1]]) & (lo[order[1:]] == lo[order[:-1]])
            new_at = np.zeros(n, dtype=np.int64)
            new_at[order[~repeat]] = 1
            # Stop at the first position whose key would be one too many.
            take = int(np.searchsorted(np.cumsum(new_at), room, side="right"))
            if take == 0:
                return 0
            hi, lo, offsets = hi[:take], lo[:take], offsets[:take]
        self._insert(hi, lo, offsets)
        self.last_offset = max(self.last_offset, int(offsets.max()))
        return take

    def _insert(self, hi: np.ndarray, lo: np.ndarray, offsets: np.ndarray) -> None:
        """Insert digests: a held key keeps the higher offset, a new one takes an empty slot."""
        pending = np.arange(len(hi))
        slot = self._slots(lo)
        cap = self.capacity
        owner = np.empty(0, dtype=np.int64)
        while pending.size:
            s = slot
            empty = self._off[s] == EMPTY
            match = ~empty & (self._hi[s] == hi[pending]) & (self._lo[s] == lo[pending])
            if match.any():
                np.maximum.at(self._off, s[match], offsets[pending[match]])
            # Several keys may want one empty slot (or one key twice): one of them takes it,
            # found by scattering claimants into the slots and reading back who stayed; the
            # others look at the same slot again next step (a match, or another key's).
            claim = np.flatnonzero(empty)
            if claim.size:
                if owner.size < cap:
                    owner = np.empty(cap, dtype=np.int64)
                owner[s[claim]] = claim
                won = claim[owner[s[claim]] == claim]
                ws, wp = s[won], pending[won]
                self._hi[ws], self._lo[ws], self._off[ws] = hi[wp], lo[wp], offsets[wp]
                self.size += len(won)
                settled = match
                settled[won] = True
            else:
                settled = match
            advance = ~settled & ~empty  # another key's slot: probe the next one
            keep = ~settled
            slot = s + advance
            slot[slot == cap] = 0
            pending, slot = pending[keep], slot[keep]

    def put(self, digest: bytes, offset: int) -> bool:
        """One key (tests, small callers); False if the map is full."""
        return self.put_many(np.frombuffer(digest, dtype=">u8").reshape(1, 2),
                             np.array([offset])) == 1

    def get(self, digest: bytes) -> int:
        return int(self.get_many(np.frombuffer(digest, dtype=">u8").reshape(1, 2))[0])
