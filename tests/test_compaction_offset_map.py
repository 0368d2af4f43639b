"""The OffsetMap at scale: 10 million keys in bounded memory, at most 27 bytes per key."""

from __future__ import annotations

import numpy as np
import pytest

from stratamq.compaction.offset_map import ENTRY_BYTES, LOAD_FACTOR, OffsetMap, digests_of

KEYS = 10_000_000


@pytest.mark.slow
def test_ten_million_keys_cost_at_most_27_bytes_each():
    # The map sized for exactly 10 million keys at its load factor.
    offset_map = OffsetMap(int(np.ceil(KEYS / LOAD_FACTOR)) * ENTRY_BYTES)
    rng = np.random.default_rng(16)
    # md5 digests are uniform 128-bit values; drawing them directly saves hashing 10 million
    # strings (the map only ever sees digests).
    sample: list[tuple[np.ndarray, np.ndarray]] = []
    chunk = 1_000_000
    for start in range(0, KEYS, chunk):
        digests = rng.integers(0, 2**63, size=(chunk, 2), dtype=np.int64).astype(">u8")
        offsets = np.arange(start, start + chunk, dtype=np.int64)
        assert offset_map.put_many(digests, offsets) == chunk
        sample.append((digests[::97].copy(), offsets[::97].copy()))
    assert offset_map.size == KEYS
    bytes_per_key = offset_map.nbytes / offset_map.size
    print(f"OffsetMap: {KEYS} keys in {offset_map.nbytes} bytes = {bytes_per_key:.2f} B/key")
    assert bytes_per_key <= 27
    # Every key is found with its offset; absent keys are not.
    for digests, offsets in sample:
        assert (offset_map.get_many(digests) == offsets).all()
    absent = rng.integers(0, 2**63, size=(10_000, 2), dtype=np.int64).astype(">u8")
    assert (offset_map.get_many(absent) == -1).all()
    # Updating held keys is always possible; one key more is refused.
    digests, offsets = sample[0]
    assert offset_map.put_many(digests, offsets + KEYS) == len(digests)
    assert (offset_map.get_many(digests) == offsets + KEYS).all()
    more = offset_map.max_entries - offset_map.size
    extra = rng.integers(0, 2**63, size=(more + 1, 2), dtype=np.int64).astype(">u8")
    assert offset_map.put_many(extra, np.arange(more + 1)) == more


def test_a_key_keeps_its_latest_offset_within_and_across_batches():
    offset_map = OffsetMap(24 * 100)
    keys = ["a", "b", "a", "c", "a"]
    assert offset_map.put_many(digests_of(keys), np.arange(5)) == 5
    assert offset_map.get_many(digests_of(["a", "b", "c", "d"])).tolist() == [4, 1, 3, -1]
    assert offset_map.put_many(digests_of(["b"]), np.array([9])) == 1
    assert offset_map.get_many(digests_of(["b"])).tolist() == [9]
    assert offset_map.last_offset == 9 and offset_map.size == 3
