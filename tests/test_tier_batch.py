"""The uploader's bulk paths against their record-at-a-time meaning: a queue's batch gathered
from a real local CommitLog holds exactly the records its units point at (dense windows and
sparse runs, across segment boundaries), the keys and store times found in bulk are the ones
the record codec reads, and ``put_many`` writes the same index bytes as one ``put`` per
key."""

from __future__ import annotations

import random

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given, settings

from stratamq import record as codec
from stratamq.config import StoreConfig
from stratamq.message import Message, Prop
from stratamq.store.message_store import MessageStore
from stratamq.tiered.batch import (
    Batch,
    _keys_in_bulk,
    _keys_record_by_record,
    gather,
    index_keys,
    store_times,
)
from stratamq.tiered.index_file import UnsealedIndexFile

TOPIC = "Orders"


@pytest.fixture
def store(tmp_path):
    store = MessageStore(StoreConfig(store_path_root_dir=str(tmp_path / "store"),
                                     mapped_file_size_commit_log=64 * 1024))
    store.open()
    rng = random.Random(7)
    for i in range(600):
        props = {}
        if i % 3:
            props["KEYS"] = " ".join(f"k{i}-{j}" for j in range(i % 4 + 1))
        if i % 7 == 0:
            props[Prop.UNIQ_KEY] = f"U{i:08X}"
        queue = 0 if i % 10 == 0 else 1 + i % 3  # queue 0 sparse, queues 1-3 dense
        body = rng.randbytes(rng.randrange(10, 900))
        assert store.put_message(Message(TOPIC, body, queue, props)).ok
    assert store.wait_dispatched(30)
    yield store
    store.close()


def units_of(store: MessageStore, queue: int) -> list[tuple[int, int, int]]:
    cq = store.consume_queues.find(TOPIC, queue)
    return list(cq.get_units(0, cq.max_offset()))


@pytest.mark.parametrize("queue", [0, 1])
def test_gather_holds_exactly_the_records_the_units_point_at(store, queue):
    units = units_of(store, queue)
    batch = gather(store.log_reader, 0, units, 1 << 30)
    assert batch is not None and len(batch) == len(units)
    reader = store.log_reader
    for i, (phys, size, code) in enumerate(units):
        at = int(batch.starts[i])
        assert batch.data[at : at + size] == reader.read_bytes(phys, size)
        assert int(batch.codes[i]) == code
    # Several local segments were crossed (64 KiB files).
    assert units[-1][0] // reader.segment_size > units[0][0] // reader.segment_size


def test_gather_stops_at_the_group_commit_size(store):
    units = units_of(store, 1)
    limit = sum(size for _p, size, _c in units[:10])
    batch = gather(store.log_reader, 0, units, limit)
    assert batch is not None and len(batch) == 10
    one = gather(store.log_reader, 0, units, 1)  # at least one record
    assert one is not None and len(one) == 1


def test_gather_refuses_what_is_not_a_plain_run(store):
    units = units_of(store, 1)
    blank = [*units[:3], (0, 0x7FFFFFFF, 0)]
    assert gather(store.log_reader, 0, blank, 1 << 30) is None
    wrong_size = [(units[0][0], units[0][1] + 1, units[0][2])]
    assert gather(store.log_reader, 0, wrong_size, 1 << 30) is None
    for tiny in (3, 20):  # shorter than any record: not read past the buffer or into the next
        assert gather(store.log_reader, 0, [*units[:3], (units[3][0], tiny, 0)], 1 << 30) is None
    past_end = [(store.log_reader.end() + 100, 200, 0)]
    assert gather(store.log_reader, 0, past_end, 1 << 30) is None


@pytest.mark.parametrize("queue", [0, 2])
def test_keys_and_times_found_in_bulk_are_the_codecs(store, queue):
    units = units_of(store, queue)
    batch = gather(store.log_reader, 0, units, 1 << 30)
    assert batch is not None
    flat_offsets = np.arange(len(batch), dtype=np.int64) * 1000
    times = store_times(batch)
    keys, rows = index_keys(batch)
    assert rows.tolist() == sorted(rows.tolist())  # grouped by record, in record order
    entries: dict[int, list[str]] = {}
    for key, row in zip(keys, rows.tolist(), strict=True):
        entries.setdefault(int(flat_offsets[row]), []).append(key)
    with_keys = 0
    for i in range(len(batch)):
        record = batch.data[int(batch.starts[i]) : int(batch.starts[i] + batch.sizes[i])]
        assert int(times[i]) == codec.record_store_timestamp(record, 0)
        expected = set((codec.record_property(record, Prop.KEYS) or "").split())
        if codec.record_property(record, Prop.UNIQ_KEY):
            expected.add(codec.record_property(record, Prop.UNIQ_KEY))
        if expected:
            with_keys += 1
            assert sorted(entries[i * 1000]) == sorted(expected)  # each key once
        else:
            assert i * 1000 not in entries
    assert 0 < with_keys <= len(batch)


def test_batch_of_records_handed_one_by_one():
    batch = Batch.of(5, [b"abc", b"", b"defgh"], [1, 2, 3])
    assert batch.data == b"abcdefgh" and batch.starts.tolist() == [0, 3, 3]
    assert batch.head(2).sizes.tolist() == [3, 0] and batch.nbytes() == 8


@pytest.mark.parametrize("slots", [1, 7, 1000])
def test_put_many_writes_the_bytes_of_one_put_per_key(tmp_path, slots):
    rng = random.Random(slots)
    one = UnsealedIndexFile(tmp_path / "one", slots, 400, begin_timestamp=1_000_000)
    many = UnsealedIndexFile(tmp_path / "many", slots, 400, begin_timestamp=1_000_000)
    for n in (0, 1, 120, 200):
        hashes = [rng.randrange(0, 2**31 - 1) for _ in range(n)]
        offsets = [rng.randrange(0, 2**40) for _ in range(n)]
        sizes = [rng.randrange(1, 5000) for _ in range(n)]
        times = [1_000_000 + rng.randrange(-5000, 10**8) for _ in range(n)]
        for h, o, s, t in zip(hashes, offsets, sizes, times, strict=True):
            assert one.put([h], 7, 3, o, s, t, header=False)
        many.put_many(np.array(hashes, dtype=np.int64), 7, 3, np.array(offsets, dtype=np.int64),
                      np.array(sizes, dtype=np.int64), np.array(times, dtype=np.int64))
        one.write_header()
        many.write_header()
        assert bytes(one.map) == bytes(many.map)
        assert (one.slot_count, one.item_count) == (many.slot_count, many.item_count)
    with pytest.raises(ValueError, match="do not fit"):
        many.put_many(np.zeros(many.room() + 1, dtype=np.int64), 7, 3,
                      *(np.zeros(many.room() + 1, dtype=np.int64),) * 3)
    hashes = [rng.randrange(0, 2**31 - 1) for _ in range(5)]
    assert one.query(hashes[0], 0, 2**62, 10) == many.query(hashes[0], 0, 2**62, 10)
    one.close()
    many.close()


# -- the bulk key path against the record path, on properties of every shape ---------------------

_NAMES = ["KEYS", "UNIQ_KEY", "TAGS", "XKEYS", "KEYSX", "UNIQ_KEYS"]
# Few values, so that a KEYS word often equals the record's UNIQ_KEY; some with spaces,
# non-ASCII or a stray SOH.
_WORDS = st.one_of(st.sampled_from(["", "a", "b", "ab", "a b", "b a b", " a", "a\t", "é",
                                    "k\u3000", "x\x01y"]),
                   st.text(alphabet=st.sampled_from("ab7-_ \t\x01é\u3000"), max_size=6))


@st.composite
def property_blocks(draw) -> tuple[list[bytes], bool]:
    """Records' raw properties (name SOH value STX ..., RocketMQ's layout, sometimes without
    the last STX or as raw bytes), and whether each is plain (the bulk path must take it)."""
    records, plain = [], True
    for _ in range(draw(st.integers(1, 12))):
        if draw(st.integers(0, 9)) == 0:
            raw = draw(st.binary(max_size=20))
            plain = False
        else:
            pairs = draw(st.lists(st.tuples(st.sampled_from(_NAMES), _WORDS), max_size=4))
            raw = b"".join(n.encode() + b"\x01" + v.encode() + b"\x02" for n, v in pairs)
            named = [n for n, _v in pairs]
            if named.count("KEYS") > 1 or named.count("UNIQ_KEY") > 1 or any(
                    not v.isascii() or any(c in v for c in " \t\u3000")
                    for n, v in pairs if n in ("KEYS", "UNIQ_KEY")):
                plain = False
            if raw and draw(st.booleans()) and draw(st.integers(0, 4)) == 0:
                raw = raw[:-1]  # no separator after the last property
                plain = False
        records.append(raw)
    return records, plain


@settings(max_examples=400, deadline=None)
@given(property_blocks())
def test_keys_in_bulk_are_the_record_paths(case):
    records, plain = case
    batch = Batch.of(0, records, [0] * len(records))
    start, end = batch.starts, batch.starts + batch.sizes
    expected = _keys_record_by_record(batch, np.zeros(len(records), dtype=bool), start, end)
    bulk = _keys_in_bulk(np.frombuffer(batch.data, dtype=np.uint8), start, end)
    if plain:
        assert bulk is not None
    if bulk is not None:
        assert bulk[0] == expected[0] and bulk[1].tolist() == expected[1].tolist()
