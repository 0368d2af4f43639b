"""``walk_records`` (the bulk walk of a segment's size chain: the slave's check of what it
copies, the Spark source, verify) answers exactly what the record-by-record walk answers,
whether records come in runs of one size (followed without scanning every byte) or not."""

from __future__ import annotations

import random
import struct

import numpy as np
import pytest

from stratamq import record as codec
from stratamq.config import StoreConfig
from stratamq.message import Message
from stratamq.store.message_store import MessageStore

SEGMENT = 256 * 1024
RUN_BODY = 300


def _sequential(buf: bytes, pos: int, end: int, limit: int) -> tuple[list[int], int, str]:
    """The walk one record at a time: the reference."""
    out = []
    while pos < end:
        if pos + 8 > limit:
            return out, pos, "zero" if pos == limit else "corrupt"
        size, magic = struct.unpack_from(">iI", buf, pos)
        if magic in (codec.MESSAGE_MAGIC_CODE_V1, codec.MESSAGE_MAGIC_CODE_V2) \
                and size >= codec.MIN_RECORD_SIZE and pos + size <= limit:
            out.append(pos)
            pos += size
            continue
        if magic == codec.MESSAGE_MAGIC_CODE_V1 or magic == codec.MESSAGE_MAGIC_CODE_V2:
            return out, pos, "corrupt"
        if magic == codec.BLANK_MAGIC_CODE:
            return out, pos, "blank"
        return out, pos, "zero" if size == 0 and magic == 0 else "corrupt"
    return out, pos, "end"


@pytest.fixture(scope="module")
def segment(tmp_path_factory) -> bytes:
    """A full segment: runs of one size, a stretch of varying sizes, and a record whose body
    holds fake headers of the run's size exactly where the run's stride would put records,
    then the blank filler."""
    config = StoreConfig(store_path_root_dir=str(tmp_path_factory.mktemp("walk")),
                         mapped_file_size_commit_log=SEGMENT)
    rng = random.Random(3)
    with MessageStore(config) as store:
        def put(body: bytes) -> int:
            result = store.put_message(Message("Walk", body, 0))
            assert result.ok
            return result.messages[0].size

        run_size = put(b"r" * RUN_BODY)
        for _ in range(150):
            assert put(b"r" * RUN_BODY) == run_size
        for _ in range(40):
            put(b"v" * rng.randrange(10, 900))
        for _ in range(100):
            put(b"r" * RUN_BODY)
        trap_at = store.commitlog.max_offset
        body = bytearray(b"t" * 4000)
        for k in range(1, 4000 // run_size + 1):  # where the stride would put records
            at = k * run_size - codec.HEADER_SIZE_V4
            if 0 <= at <= len(body) - 8:
                struct.pack_into(">iI", body, at, run_size, codec.MESSAGE_MAGIC_CODE_V2)
        put(bytes(body))
        assert codec.read_size_and_magic(store.log_reader.read_range(trap_at, trap_at + 8),
                                         0)[0] > run_size
        while store.commitlog.max_offset < SEGMENT:  # runs again, up to the segment's filler
            put(b"r" * RUN_BODY)
        return bytes(store.commitlog.files.files[0].buffer[:SEGMENT])


def test_the_bulk_walk_is_the_sequential_walk(segment):
    rng = random.Random(11)
    starts = _sequential(segment, 0, SEGMENT, SEGMENT)[0]
    assert _sequential(segment, 0, SEGMENT, SEGMENT)[2] == "blank"
    windows = [(0, SEGMENT, SEGMENT)]
    for _ in range(200):
        pos = rng.choice(starts)
        end = min(SEGMENT, pos + rng.randrange(1, SEGMENT))
        windows.append((pos, end, rng.choice([SEGMENT, max(end, SEGMENT - rng.randrange(5000))])))
    for pos, end, limit in windows:
        walk = codec.walk_records(segment, pos, end, limit)
        positions, stop, reason = _sequential(segment, pos, end, limit)
        assert (list(np.asarray(walk.positions)), walk.stop, walk.reason) \
            == (positions, stop, reason), (pos, end, limit)


def test_damage_after_a_run_stops_the_walk_where_the_sequential_walk_stops(segment):
    starts = _sequential(segment, 0, SEGMENT, SEGMENT)[0]
    at = starts[60]  # inside the first run
    for damage, reason in ((b"\0" * 8, "zero"), (b"\x01\x02\x03\x04\x05\x06\x07\x08", "corrupt"),
                           (struct.pack(">iI", 5, codec.MESSAGE_MAGIC_CODE_V2), "corrupt"),
                           (struct.pack(">iI", 7, codec.MESSAGE_MAGIC_CODE_V2)[:4] + b"\0" * 4,
                            "corrupt")):
        torn = bytearray(segment)
        torn[at : at + 8] = damage
        walk = codec.walk_records(bytes(torn), 0, SEGMENT, SEGMENT)
        assert list(np.asarray(walk.positions)) == starts[:60]
        assert (walk.stop, walk.reason) == (at, reason)


def _checked_chain(buf: bytes, pos: int, limit: int, base: int) -> tuple[list[int], int]:
    """The size chain from ``pos`` one record at a time, each record checked as recovery checks
    it (``check_record``, no CRC), up to the first that fails or does not lie whole before
    ``limit``: the reference for ``stamped_runs``."""
    out = []
    while pos + 8 <= limit:
        magic = codec.read_size_and_magic(buf, pos)[1]
        if magic not in (codec.MESSAGE_MAGIC_CODE_V1, codec.MESSAGE_MAGIC_CODE_V2):
            break
        try:
            size = codec.check_record(buf, pos, limit, base + pos, False)
        except codec.RecordCorrupt:
            break
        out.append(pos)
        pos += size
    return out, pos


def test_stamped_runs_stop_on_the_checked_chain_never_past_a_bad_record(segment):
    """Whatever the start, limit and damage (a record's size, magic code, stored offset or
    lengths changed), ``stamped_runs`` ends on the record-by-record checked chain and never
    past where it stops; undamaged, it follows a whole run of one size."""
    rng = random.Random(17)
    starts = _checked_chain(segment, 0, SEGMENT, 0)[0]
    first_run_end = next(b for a, b in zip(starts, starts[1:])
                         if b - a != starts[1] - starts[0])
    assert codec.stamped_runs(segment, 0, SEGMENT, 0) >= first_run_end
    for case in range(600):
        buf = bytearray(segment)
        victim = rng.choice(starts)
        size = codec.read_size_and_magic(segment, victim)[0]
        # Its size, magic code, stored offset, body length, or a byte of its topic and
        # properties (their lengths among them).
        field = rng.choice((0, 4, codec.PHYSICAL_OFFSET_POS + 4, codec.HEADER_SIZE_V4 - 4,
                            codec.HEADER_SIZE_V4 + rng.randrange(size - codec.HEADER_SIZE_V4
                                                                 - 3)))
        if case % 4:  # one in four undamaged
            buf[victim + field + rng.randrange(4)] ^= 1 << rng.randrange(8)
        pos = rng.choice(starts)
        limit = rng.choice([SEGMENT, min(SEGMENT, pos + rng.randrange(8, SEGMENT))])
        chain, stop = _checked_chain(bytes(buf), pos, limit, 0)
        got = codec.stamped_runs(buf, pos, limit, 0)
        assert got in chain or got == stop, (case, pos, limit, victim, field)
        assert got <= stop


def test_records_pass_is_the_record_by_record_check(segment):
    """``records_pass`` on a walk's positions answers, record by record, what ``check_record``
    (no CRC) answers, whatever byte of a record's header, topic or properties was damaged."""
    rng = random.Random(23)
    starts = _checked_chain(segment, 0, SEGMENT, 0)[0]
    for _ in range(200):
        buf = bytearray(segment)
        for victim in rng.sample(starts, 5):
            size = codec.read_size_and_magic(segment, victim)[0]
            at = rng.choice((rng.randrange(8), codec.PHYSICAL_OFFSET_POS + rng.randrange(8),
                             codec.HEADER_SIZE_V4 - 1 - rng.randrange(4),
                             codec.HEADER_SIZE_V4 + rng.randrange(size - codec.HEADER_SIZE_V4)))
            buf[victim + at] ^= 1 << rng.randrange(8)
        positions = rng.sample(starts, 50)
        want = []
        for pos in positions:
            try:
                codec.check_record(buf, pos, SEGMENT, pos, False)
                want.append(codec.read_size_and_magic(buf, pos)[1]
                            in (codec.MESSAGE_MAGIC_CODE_V1, codec.MESSAGE_MAGIC_CODE_V2))
            except codec.RecordCorrupt:
                want.append(False)
        assert list(codec.records_pass(bytes(buf), positions, 0)) == want
