"""The vectorised bulk reader (``message.walk_records`` / ``locate_fields`` and
``spark.rows.records_to_batch``) against the one-record-at-a-time codec, without Spark."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pyarrow as pa
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from stratamq import record as codec
from stratamq.record import Host, Message, SysFlag
from stratamq.spark.rows import _msg_ids, _properties, records_to_batch

STORE = Host("10.1.2.3", 10911)


def segment(messages: list[Message], store_host: Host = STORE, tail: bytes = b"",
            size: int | None = None) -> tuple[bytearray, list[int]]:
    """Records laid out as the store lays them out (positions stamped), then ``tail``."""
    buf = bytearray()
    positions = []
    for i, msg in enumerate(messages):
        rec = codec.encode(msg, store_host, max_message_size=1 << 22)
        pos = len(buf)
        buf += rec.data
        codec.stamp(buf, pos, i, pos, 1_700_000_000_000 + i, rec.store_timestamp_pos)
        positions.append(pos)
    buf += tail
    if size is not None:
        buf += bytes(size - len(buf))
    return buf, positions


def sequential_walk(buf, pos: int, end: int, limit: int) -> tuple[list[int], int, str]:
    """The walk the bulk one must equal: one record at a time."""
    out = []
    while pos < end:
        if pos + 8 > limit:
            return out, pos, "zero" if pos == limit else "corrupt"
        total, magic = struct.unpack_from(">iI", buf, pos)
        if magic in (codec.MESSAGE_MAGIC_CODE_V1, codec.MESSAGE_MAGIC_CODE_V2):
            if total < codec.MIN_RECORD_SIZE or pos + total > limit:
                return out, pos, "corrupt"
            out.append(pos)
            pos += total
        elif magic == codec.BLANK_MAGIC_CODE:
            return out, pos, "blank"
        elif total == 0 and magic == 0:
            return out, pos, "zero"
        else:
            return out, pos, "corrupt"
    return out, pos, "end"


def walk(buf, pos, end, limit):
    w = codec.walk_records(buf, pos, end, limit)
    return [int(p) for p in w.positions], w.stop, w.reason


def fake_header(size: int) -> bytes:
    return struct.pack(">iI", size, codec.MESSAGE_MAGIC_CODE_V1)


def test_bodies_that_contain_record_headers_do_not_fool_the_walk():
    # Bodies carrying what looks like a record start (magic code and a plausible size), even
    # sizes that land exactly on another body's fake header.
    bodies = [b"x" * 7 + fake_header(120) + b"y" * 200, fake_header(100) * 30,
              b"", fake_header(95) + bytes(91), b"z" * 999]
    msgs = [Message(f"T{i % 3}", body, i % 4, {"KEYS": f"k{i}"})
            for i, body in enumerate(bodies * 5)]
    buf, positions = segment(msgs, tail=codec.encode_blank(64), size=16 * 1024)
    for end in (len(buf), 1, 300, 1000, 4096):
        assert walk(buf, 0, end, len(buf)) == sequential_walk(buf, 0, end, len(buf))
    assert walk(buf, 0, len(buf), len(buf))[0] == positions
    assert walk(buf, 0, len(buf), len(buf))[2] == "blank"


@pytest.mark.parametrize("tail", [b"", b"\xff" * 40, fake_header(60) + b"\x00" * 20,
                                  struct.pack(">iI", 10**6, codec.MESSAGE_MAGIC_CODE_V2)])
def test_walk_reports_where_and_why_it_stops(tail):
    msgs = [Message("Topic", b"b" * (i * 13), 0, {}) for i in range(20)]
    buf, positions = segment(msgs, tail=tail)
    limit = len(buf)
    got = walk(buf, 0, limit, limit)
    assert got == sequential_walk(buf, 0, limit, limit)
    assert got[0] == positions and got[1] == positions[-1] + len(
        codec.encode(msgs[-1], STORE, max_message_size=1 << 20).data)
    # Reading zeroes after the data (a preallocated segment) stops cleanly.
    padded = buf + bytes(64) if not tail else buf
    assert walk(padded, 0, len(padded), len(padded)) == sequential_walk(padded, 0, len(padded),
                                                                         len(padded))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(max_size=300), min_size=1, max_size=30), st.data())
def test_walk_equals_sequential_walk_from_any_record(bodies, data):
    msgs = [Message("T" * data.draw(st.integers(1, 200)), b, 1, {}) for b in bodies]
    buf, positions = segment(msgs, tail=codec.encode_blank(8))
    start = data.draw(st.sampled_from(positions))
    end = data.draw(st.integers(start + 1, len(buf) + 10))
    assert walk(buf, start, end, len(buf)) == sequential_walk(buf, start, end, len(buf))
    limit = data.draw(st.integers(start, len(buf)))  # a split's limit can cut the data short
    assert walk(buf, start, end, limit) == sequential_walk(buf, start, end, limit)


TEXT = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x01\x02")
PROPS = st.dictionaries(st.text(TEXT, min_size=1, max_size=8), st.text(TEXT, max_size=12),
                        max_size=5)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(PROPS.map(codec.encode_properties),
                          st.binary(max_size=20).map(lambda b: b.replace(b"\x80", b"")),
                          st.sampled_from([b"", b"\x02", b"\x01", b"a\x01b", b"\x02\x02a\x01",
                                           b"a\x01b\x01c\x02", b"noseparator\x02k\x01v"])),
                max_size=12))
def test_properties_parse_like_the_codec(raws):
    raws = [r for r in raws if _utf8(r)]
    got = _properties(pa.array(raws, pa.binary())).to_pylist()
    assert [dict(pairs) for pairs in got] == [codec.decode_properties(r) for r in raws]


def _utf8(raw: bytes) -> bool:
    try:
        raw.decode()
        return True
    except UnicodeDecodeError:
        return False


def test_properties_of_a_sliced_column():
    raws = pa.array([b"A\x01x\x02", b"B\x01y\x02C\x01z\x02", b"", b"D\x01w"], pa.binary())
    assert [dict(p) for p in _properties(raws.slice(1, 3)).to_pylist()] == [
        {"B": "y", "C": "z"}, {}, {"D": "w"}]


def test_records_to_batch_edge_cases_match_the_codec():
    long_topic = "L" * 300  # written as a V2 record
    v6 = Host("2001:db8::7", 40000)
    plain = b"hello " * 50
    msgs = [
        Message("Empty", b"", 0, {}),  # empty body, no properties
        Message(long_topic, b"v2", 3, {"TAGS": "a", "KEYS": "k1 k2"}),
        Message("Six", b"from v6", 1, {"TAGS": "t"}, born_host=v6),
        Message("Zip", zlib.compress(plain), 2, {"TAGS": "z"},
                sys_flag=SysFlag.COMPRESSED | SysFlag.COMPRESSION_ZLIB),
        Message("Zstd", zstandard.ZstdCompressor().compress(plain[::-1]), 2, {},
                sys_flag=SysFlag.COMPRESSED | SysFlag.COMPRESSION_ZSTD),
        Message("Tx", b"prepared", 0, {}, sys_flag=SysFlag.TRANSACTION_PREPARED_TYPE),
        Message("Tx", b"rolled back", 0, {}, sys_flag=SysFlag.TRANSACTION_ROLLBACK_TYPE),
        Message("Tx", b"committed", 0, {"TAGS": "c"}, sys_flag=SysFlag.TRANSACTION_COMMIT_TYPE),
        Message("Plain", b"d", 0, {"TAGS": "x", "KEYS": ""}),
    ]
    buf, positions = segment(msgs)
    base = 1 << 30
    for p in positions:  # as if the segment started at 1 GiB
        struct.pack_into(">q", buf, p + codec.PHYSICAL_OFFSET_POS, base + p)
    batch = records_to_batch(buf, positions, base)
    rows = batch.to_pylist()
    kept = [i for i, m in enumerate(msgs) if SysFlag.is_dispatchable(m.sys_flag)]
    assert len(rows) == len(kept) == 7
    for row, i in zip(rows, kept):
        want = codec.decode(buf, positions[i])
        assert row["topic"] == want.topic == msgs[i].topic
        assert row["body"] == codec.decompress_body(want.body, want.sys_flag)
        assert dict(row["properties"]) == want.properties
        assert row["tags"] == want.properties.get("TAGS")
        assert row["keys"] == want.properties.get("KEYS")
        assert row["commitlog_offset"] == base + positions[i]
        assert row["msg_id"] == codec.offset_msg_id(STORE, base + positions[i])
        assert row["born_host"] == str(want.born_host)
        assert row["store_host"] == str(STORE)
        assert row["queue_offset"] == i and row["queue_id"] == msgs[i].queue_id
        assert row["sys_flag"] == want.sys_flag
        assert row["store_timestamp"].timestamp() * 1000 == want.store_timestamp
    assert rows[kept.index(3)]["body"] == plain and rows[kept.index(4)]["body"] == plain[::-1]
    assert rows[kept.index(2)]["born_host"] == "[2001:db8::7]:40000"
    assert rows[kept.index(0)]["properties"] == [] and rows[kept.index(0)]["body"] == b""


def test_ipv6_store_host_message_ids():
    v6 = Host("::1", 10911)
    buf, positions = segment([Message("A", b"a", 0, {}), Message("B", b"b", 0, {})], v6)
    rows = records_to_batch(buf, positions, 0).to_pylist()
    assert [r["msg_id"] for r in rows] == [codec.offset_msg_id(v6, p) for p in positions]
    assert [r["store_host"] for r in rows] == ["[::1]:10911"] * 2


_HOSTS = [Host("127.0.0.1", 10911), Host("10.1.2.3", 0), Host("255.255.255.255", 65535),
          Host("0.0.0.0", 80)]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(_HOSTS), st.integers(0, (1 << 63) - 1)),
                min_size=1, max_size=40))
def test_bulk_message_ids_equal_the_codecs(rows):
    """One store host or several in a batch: every id as ``codec.offset_msg_id`` makes it."""
    ips = np.array([int.from_bytes(bytes(map(int, h.ip.split("."))), "big") for h, _ in rows],
                   dtype=np.uint32)
    ports = np.array([h.port for h, _ in rows], dtype=np.int32)
    offsets = np.array([off for _, off in rows], dtype=np.int64)
    assert _msg_ids(ips, ports, offsets).to_pylist() == [
        codec.offset_msg_id(h, off) for h, off in rows]


def test_a_record_whose_stored_offset_is_not_its_position_is_reported():
    buf, positions = segment([Message("A", b"a" * 10, 0, {}) for _ in range(3)])
    struct.pack_into(">q", buf, positions[1] + codec.PHYSICAL_OFFSET_POS, 12345)
    with pytest.raises(codec.RecordCorrupt) as err:
        records_to_batch(buf, positions, 0)
    assert err.value.position == positions[1]


def test_log_bounds_match_a_store_open_and_cut_a_torn_tail(tmp_path):
    from stratamq.config import StoreConfig
    from stratamq.spark.reading import log_bounds
    from stratamq.store.message_store import MessageStore

    config = StoreConfig(store_path_root_dir=str(tmp_path), mapped_file_size_commit_log=8192)
    with MessageStore(config).open() as store:
        assert store.put_messages([Message("T", b"m%d" % i * 20, 0, {}) for i in range(60)]).ok
        store.wait_dispatched()
        last = store.put_messages([Message("T", b"the last one" * 5, 0, {})])
        assert last.ok
    with MessageStore(config, read_only=True).open() as store:
        opened = (store.min_physical_offset, store.max_physical_offset)
    assert log_bounds(str(tmp_path)) == opened and opened[1] > 8192
    # A write caught half way (the body not all there yet): the end is before that record.
    at = last.messages[0].physical_offset
    path = tmp_path / "commitlog" / f"{at - at % 8192:020d}"
    with open(path, "r+b") as f:
        f.seek(at % 8192 + codec.HEADER_SIZE_V4 + 3)
        f.write(b"\x00" * 20)
    assert log_bounds(str(tmp_path)) == (0, at)
    assert log_bounds(str(tmp_path / "no-store-here")) == (0, 0)


WORDS = st.lists(st.sampled_from(["a", "b", "k1", "K1", "é", "x-y", ""]), max_size=5)
SPACES = st.sampled_from([" ", "  ", "\t", " \n "])


@settings(deadline=None)
@given(st.lists(st.tuples(st.none() | st.builds(lambda w, s, e: s.join(w) + e, WORDS, SPACES,
                                                st.sampled_from(["", " "])),
                          st.none() | st.sampled_from(["", "a", "k1", "U1"])), max_size=12))
def test_offload_index_keys_are_the_uploaders(rows):
    """Per message the offload indexes what the tier's uploader does (``tiered.batch``): the
    distinct words of KEYS and a non-empty UNIQ_KEY, here sorted so a rerun writes the same
    bytes."""
    from stratamq.spark.pipelines.offload_rows import _keys

    maps = [[(k, v) for k, v in (("KEYS", keys), ("UNIQ_KEY", uniq)) if v is not None]
            for keys, uniq in rows]
    got = _keys(pa.array(maps, pa.map_(pa.string(), pa.string()))).to_pylist()
    want = [sorted(set((keys or "").split()) | ({uniq} if uniq else set()))
            for keys, uniq in rows]
    assert got == want
