"""The record codec: round trips (property-based), exact bytes, and refusals."""

from __future__ import annotations

import struct
import zlib

import lz4.frame
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from stratamq import record as codec
from stratamq.record import (
    Host,
    Message,
    MessageIllegal,
    PropertiesTooLarge,
    RecordCorrupt,
    SysFlag,
)

STORE = Host("127.0.0.1", 10911)
MAX = 4 * 1024 * 1024

prop_text = st.text(
    alphabet=st.characters(blacklist_characters="\x00\x01\x02", blacklist_categories=("Cs",)),
    max_size=20,
)
hosts = st.one_of(
    st.builds(Host, st.ip_addresses(v=4).map(str), st.integers(0, 65535)),
    st.builds(Host, st.ip_addresses(v=6).map(str), st.integers(0, 65535)),
)


def place(msg: Message, store_host: Host = STORE, queue_offset: int = 7,
          physical_offset: int = 4096, store_ts: int = 1_700_000_000_123) -> bytearray:
    record = codec.encode(msg, store_host, max_message_size=MAX)
    data = bytearray(record.data)
    codec.stamp(data, 0, queue_offset, physical_offset, store_ts, record.store_timestamp_pos)
    return data


@settings(max_examples=200, deadline=None)
@given(
    topic=st.text(min_size=1, max_size=300).filter(lambda t: "\x00" not in t),
    body=st.binary(max_size=2000),
    props=st.dictionaries(prop_text.filter(bool), prop_text, max_size=6),
    queue_id=st.integers(0, 2**31 - 1),
    flag=st.integers(-(2**31), 2**31 - 1),
    born=hosts,
    store=hosts,
    born_ts=st.integers(0, 2**62),
    reconsume=st.integers(0, 1000),
    queue_offset=st.integers(0, 2**62),
    physical_offset=st.integers(0, 2**62),
)
def test_round_trip(topic, body, props, queue_id, flag, born, store, born_ts, reconsume,
                    queue_offset, physical_offset):
    msg = Message(topic, body, queue_id, props, flag=flag, born_timestamp=born_ts,
                  born_host=born, reconsume_times=reconsume)
    data = place(msg, store, queue_offset, physical_offset, 1234)
    assert codec.check_record(data, 0, len(data), physical_offset, True) == len(data)
    out = codec.decode(data, check_crc=True)
    assert out.topic == topic
    assert out.body == body
    assert out.properties == props
    assert (out.queue_id, out.flag, out.queue_offset, out.physical_offset) == (
        queue_id, flag, queue_offset, physical_offset)
    assert (out.born_timestamp, out.store_timestamp, out.reconsume_times) == (born_ts, 1234,
                                                                              reconsume)
    assert out.born_host == Host(str(born.ip), born.port)
    assert out.store_host == Host(str(store.ip), store.port)
    long_topic = len(topic.encode()) > 127
    assert out.magic_code == (codec.MESSAGE_MAGIC_CODE_V2 if long_topic
                              else codec.MESSAGE_MAGIC_CODE_V1)
    assert bool(out.sys_flag & SysFlag.BORN_HOST_V6) == born.is_v6
    assert bool(out.sys_flag & SysFlag.STORE_HOST_V6) == store.is_v6
    info = codec.decode_dispatch_info(data, 0)
    assert (info.topic, info.queue_id, info.queue_offset, info.size) == (
        topic, queue_id, queue_offset, len(data))
    assert info.tags_code == codec.tags_hash_code(props.get("TAGS"))


def test_exact_layout_of_a_v1_ipv4_record():
    msg = Message("T", b"abc", 3, {"TAGS": "A"}, flag=5, born_timestamp=11,
                  born_host=Host("10.0.0.1", 50000))
    data = place(msg, queue_offset=2, physical_offset=99, store_ts=22)
    expected = struct.pack(
        ">iIiiiqqiq4siq4siiqi", len(data), 0xDAA320A7, zlib.crc32(b"abc") & 0x7FFFFFFF, 3, 5,
        2, 99, 0, 11, bytes([10, 0, 0, 1]), 50000, 22, bytes([127, 0, 0, 1]), 10911, 0, 0, 3,
    ) + b"abc" + b"\x01T" + struct.pack(">H", 7) + b"TAGS\x01A\x02"
    assert bytes(data) == expected
    assert len(data) == 91 + 3 + 1 + 7


def test_tags_hash_code_is_javas_string_hashcode():
    # Values Java computes: "TagA".hashCode() (seen in the reference ConsumeQueue units).
    assert codec.tags_hash_code("TagA") == 0x27A807
    assert codec.tags_hash_code("") == 0
    assert codec.tags_hash_code(None) == 0
    # Overflow wraps to a negative int like Java's.
    assert codec.tags_hash_code("polygenelubricants") == -(2**31)
    # A character outside the BMP hashes as two UTF-16 code units.
    assert codec.tags_hash_code("\U0001F600") == 31 * 0xD83D + 0xDE00


def test_offset_msg_id_round_trip():
    msg_id = codec.offset_msg_id(Host("127.0.0.1", 10911), 0x1234)
    assert msg_id == "7F00000100002A9F0000000000001234"
    assert codec.parse_offset_msg_id(msg_id) == (Host("127.0.0.1", 10911), 0x1234)
    v6 = codec.offset_msg_id(Host("::1", 8080), 7)
    assert len(v6) == 56
    assert codec.parse_offset_msg_id(v6) == (Host("::1", 8080), 7)
    with pytest.raises(ValueError):
        codec.parse_offset_msg_id("XYZ")
    with pytest.raises(ValueError):
        codec.parse_offset_msg_id("00" * 10)


@pytest.mark.parametrize(
    ("kind", "compress"),
    [
        (SysFlag.COMPRESSION_ZLIB, zlib.compress),
        (0, zlib.compress),  # before the type bits existed: zlib
        (SysFlag.COMPRESSION_ZSTD, lambda b: zstandard.ZstdCompressor().compress(b)),
        (SysFlag.COMPRESSION_LZ4, lz4.frame.compress),
    ],
)
def test_compressed_bodies_are_inflated_on_read(kind, compress):
    original = b"payload " * 200
    stored = compress(original)
    msg = Message("T", stored, sys_flag=SysFlag.COMPRESSED | kind)
    out = codec.decode(place(msg), check_crc=True)
    assert out.body == stored  # the CRC covers the stored bytes
    assert out.body_crc == zlib.crc32(stored) & 0x7FFFFFFF
    assert out.decompressed_body() == original


def test_transaction_types_decide_dispatch():
    assert SysFlag.is_dispatchable(0)
    assert SysFlag.is_dispatchable(SysFlag.TRANSACTION_COMMIT_TYPE)
    assert not SysFlag.is_dispatchable(SysFlag.TRANSACTION_PREPARED_TYPE)
    assert not SysFlag.is_dispatchable(SysFlag.TRANSACTION_ROLLBACK_TYPE | SysFlag.COMPRESSED)


@pytest.mark.parametrize(
    ("msg", "error"),
    [
        (Message("", b"x"), MessageIllegal),
        (Message("T", b"x" * (MAX + 1)), MessageIllegal),
        (Message("x" * 40000, b"x"), MessageIllegal),
        (Message("T", b"x", properties={"K": "a\x01b"}), MessageIllegal),
        (Message("T", b"x", properties={"K\x02": "v"}), MessageIllegal),
        (Message("T", b"x", properties={"": "v"}), MessageIllegal),
        (Message("T", b"x", properties={"K": "v" * 40000}), PropertiesTooLarge),
        (Message("T", b"x", queue_id=-1), MessageIllegal),
    ],
)
def test_refused_messages_say_why(msg, error):
    with pytest.raises(error) as info:
        codec.encode(msg, STORE, max_message_size=MAX)
    assert str(info.value)


def test_check_record_reports_each_kind_of_damage():
    good = place(Message("Topic", b"body" * 10, properties={"TAGS": "A"}), physical_offset=0)
    n = len(good)

    def damaged(mutate) -> bytearray:
        data = bytearray(good)
        mutate(data)
        return data

    cases = {
        "magic": damaged(lambda d: d.__setitem__(slice(4, 8), b"\x00\x00\x00\x01")),
        "size": damaged(lambda d: d.__setitem__(slice(0, 4), struct.pack(">i", n + 50))),
        "CRC": damaged(lambda d: d.__setitem__(100, d[100] ^ 0x01)),
        "physical": damaged(lambda d: d.__setitem__(slice(28, 36), struct.pack(">q", 5))),
        "length": damaged(lambda d: d.__setitem__(slice(84, 88), struct.pack(">i", 39))),
    }
    for expected, data in cases.items():
        with pytest.raises(RecordCorrupt) as info:
            codec.check_record(data, 0, len(data), 0, True)
        assert expected.lower() in info.value.reason.lower(), (expected, info.value.reason)
    with pytest.raises(RecordCorrupt):
        codec.check_record(good[: n - 3], 0, n - 3, 0, True)  # torn
    blank = codec.encode_blank(64) + bytes(56)
    assert codec.check_record(blank, 0, 64, 0, True) == 0


def _encode_each(messages: list[Message], store: Host) -> tuple[str, object]:
    try:
        return "ok", [codec.encode_record(m, store, MAX) for m in messages]
    except Exception as exc:
        return type(exc).__name__, str(exc)


def _encode_batch(messages: list[Message], store: Host) -> tuple[str, object]:
    try:
        return "ok", codec.encode_records(messages, store, MAX)
    except Exception as exc:
        return type(exc).__name__, str(exc)


# A batch as a broker puts it (one topic, one born host, a UNIQ_KEY each), with now and then a
# message that takes the general path (several properties, a bytearray body) or is refused.
batch_messages = st.lists(
    st.builds(
        Message,
        topic=st.one_of(st.sampled_from(["T", "Topic%16", "x" * 300, ""]),
                        st.text(min_size=1, max_size=20)),
        body=st.one_of(st.binary(max_size=300), st.binary(max_size=50).map(bytearray),
                       st.just(b"x" * (MAX + 1))),
        queue_id=st.one_of(st.integers(0, 7), st.integers(-2, 2**31 + 1)),
        properties=st.one_of(
            st.builds(lambda v: {"UNIQ_KEY": v}, prop_text),
            st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3),
            st.builds(lambda v: {"UNIQ_KEY": v}, st.just("v" * 33000))),
        flag=st.one_of(st.just(0), st.integers(-(2**32), 2**32)),
        born_timestamp=st.integers(0, 2**62),
        born_host=st.one_of(st.just(Host("127.0.0.1", 0)), hosts),
    ),
    max_size=12,
)


@settings(max_examples=300, deadline=None)
@given(messages=batch_messages, store=hosts)
def test_batch_encoding_gives_the_bytes_and_refusals_of_encoding_each(messages, store):
    """``encode_records`` (the CommitLog's batch path) is byte for byte ``encode_record`` per
    message, and refuses a batch with the error the first bad message gets on its own."""
    assert _encode_batch(messages, store) == _encode_each(messages, store)
