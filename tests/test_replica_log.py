"""The store's replication seam: a slave's raw appends at its master's physical offsets (whole
records, checked as recovery checks them, a record cut by the end of a chunk handed again with
its rest) and its cut back to an earlier offset (ConsumeQueues and dispatch follow)."""

from __future__ import annotations

import random
import struct

import pytest

from stratamq import record as codec
from stratamq.config import StoreConfig
from stratamq.message import Message
from stratamq.store.message_store import MessageStore
from stratamq.store.replica import ReplicaDataError, whole_records
from stratamq.store.results import PutMessageStatus

SEGMENT = 64 * 1024


def _config(root, **extra) -> StoreConfig:
    return StoreConfig(store_path_root_dir=str(root), mapped_file_size_commit_log=SEGMENT,
                       mapped_file_size_consume_queue=100 * 20, **extra)


def _master(tmp_path, n: int = 300, size: int = 700) -> MessageStore:
    store = MessageStore(_config(tmp_path / "master")).open()
    rng = random.Random(7)
    for i in range(n):
        body = bytes(rng.randrange(256) for _ in range(rng.randrange(size // 2, size)))
        msg = Message("Repl", body + b"#%d" % i, i % 3, {"KEYS": f"k{i}"})
        assert store.put_message(msg).ok
    assert store.wait_dispatched()
    store.flush()
    return store


def _slave(tmp_path, name: str = "slave") -> MessageStore:
    return MessageStore(_config(tmp_path / name, broker_role="SLAVE")).open()


def _copy(master: MessageStore, slave: MessageStore, start: int, chunks: random.Random) -> None:
    """Stream the master's bytes from ``start`` in chunks of random sizes, as frames arrive,
    handing a record cut by a chunk's end again with the next chunk."""
    reader = master.log_reader
    pending = b""
    offset = start
    end = master.commitlog.max_offset
    while offset < end:
        data = reader.read_range(offset, offset + chunks.randrange(1, 5000))
        assert data
        offset += len(data)
        pending += data
        where = slave.replica.end() if not slave.replica.is_empty() else start
        taken = slave.replica.append(where, pending)
        pending = pending[taken:]
    assert pending == b""


def _segments(store: MessageStore, upto: int) -> dict[str, bytes]:
    out = {}
    for mf in store.commitlog.files.files:
        if mf.file_from_offset < upto:
            n = min(upto - mf.file_from_offset, mf.file_size)
            out[mf.path.name] = bytes(mf.buffer[:n])
    return out


def test_raw_appends_make_a_byte_identical_readable_log(tmp_path):
    master = _master(tmp_path)
    slave = _slave(tmp_path)
    try:
        assert len(master.commitlog.files.files) >= 3  # blanks and roll-overs are copied too
        _copy(master, slave, 0, random.Random(1))
        end = master.commitlog.max_offset
        assert slave.commitlog.max_offset == end
        assert _segments(slave, end) == _segments(master, end)
        assert slave.wait_dispatched()
        for qid in range(3):
            got = slave.get_messages("g", "Repl", qid, 0, max_count=1000, max_bytes=10**8)
            want = master.get_messages("g", "Repl", qid, 0, max_count=1000, max_bytes=10**8)
            assert [m.body for m in got.messages()] == [m.body for m in want.messages()]
            assert len(got.records) == 100
            got.release()
            want.release()
        assert slave.query_messages("Repl", "k42")[0].body.endswith(b"#42")
    finally:
        master.close()
        slave.close()


def test_a_slave_refuses_puts(tmp_path):
    slave = _slave(tmp_path)
    try:
        result = slave.put_message(Message("Repl", b"x"))
        assert result.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
        assert "SLAVE" in result.error
        assert slave.commitlog.max_offset == 0
    finally:
        slave.close()


def test_a_new_slave_may_start_at_the_masters_last_segment(tmp_path):
    master = _master(tmp_path)
    slave = _slave(tmp_path)
    try:
        last = master.commitlog.files.last().file_from_offset
        assert last > 0
        _copy(master, slave, last, random.Random(2))
        end = master.commitlog.max_offset
        assert slave.commitlog.min_offset == last and slave.commitlog.max_offset == end
        assert _segments(slave, end) == {k: v for k, v in _segments(master, end).items()
                                         if int(k) >= last}
        assert slave.wait_dispatched()
        # Queues start where the copy started: the first units point into the last segment.
        got = slave.get_messages("g", "Repl", 0, slave.get_min_offset_in_queue("Repl", 0))
        assert got.status.name == "FOUND"
        got.release()
    finally:
        master.close()
        slave.close()
    # Reopened after a clean close, the copy is intact.
    with MessageStore(_config(tmp_path / "slave", broker_role="SLAVE")) as again:
        assert again.commitlog.max_offset == end


def test_bytes_not_at_the_end_or_not_records_are_refused_and_nothing_is_written(tmp_path):
    master = _master(tmp_path, n=20)
    slave = _slave(tmp_path)
    try:
        data = master.log_reader.read_range(0, 10_000)
        with pytest.raises(ReplicaDataError, match="segment boundary"):
            slave.replica.append(100, data)
        first = codec.read_size_and_magic(data, 0)[0]
        assert slave.replica.append(0, data[:first]) == first
        with pytest.raises(ReplicaDataError, match="log ends at"):
            slave.replica.append(0, data)  # the same bytes again: not at the end
        with pytest.raises(ReplicaDataError, match="physical offset"):
            slave.replica.append(first, data[:first])  # a record stamped for another place
        flipped = bytearray(data[first:])
        flipped[4] ^= 0xFF  # the magic code
        with pytest.raises(ReplicaDataError, match="magic"):
            slave.replica.append(first, flipped)
        with pytest.raises(ReplicaDataError, match="zero bytes"):
            slave.replica.append(first, bytes(64))
        assert slave.commitlog.max_offset == first
    finally:
        master.close()
        slave.close()


def _copy_in_pieces(master: MessageStore, slave: MessageStore, start: int,
                    chunks: random.Random) -> None:
    """Stream the master's bytes as a slave catching up gets them: several frames per call
    (``append_pieces``), a record cut by the last piece handed again with the next pieces."""
    reader = master.log_reader
    pending: list[bytes] = []
    offset = start
    end = master.commitlog.max_offset
    while offset < end:
        for _ in range(chunks.randrange(1, 6)):
            data = reader.read_range(offset, offset + chunks.randrange(1, 3000))
            if data:
                offset += len(data)
                pending.append(bytes(data))
        where = slave.replica.end() if not slave.replica.is_empty() else start
        taken = slave.replica.append_pieces(where, pending)
        rest = b"".join(pending)[taken:]
        pending = [rest] if rest else []
    if pending:  # the last record was cut by the last piece of a call
        assert slave.replica.append_pieces(slave.replica.end(), pending) == len(pending[0])


def test_frames_written_in_place_make_the_same_byte_identical_log(tmp_path):
    """Pieces are written past the log's end and checked where they landed; only whole records
    become visible, and a record cut by a call's end waits for its rest."""
    master = _master(tmp_path)
    slave = _slave(tmp_path)
    try:
        _copy_in_pieces(master, slave, 0, random.Random(5))
        end = master.commitlog.max_offset
        assert slave.commitlog.max_offset == end
        assert _segments(slave, end) == _segments(master, end)
        assert slave.wait_dispatched()
        got = slave.get_messages("g", "Repl", 1, 0, max_count=1000, max_bytes=10**8)
        assert len(got.records) == 100
        got.release()
    finally:
        master.close()
        slave.close()


def test_pieces_that_are_not_records_leave_the_log_and_the_bytes_past_it_as_they_were(tmp_path):
    master = _master(tmp_path, n=20)
    slave = _slave(tmp_path)
    try:
        data = bytes(master.log_reader.read_range(0, 10_000))
        first = codec.read_size_and_magic(data, 0)[0]
        assert slave.replica.append(0, data[:first]) == first
        second = codec.read_size_and_magic(data, first)[0]
        mf = slave.commitlog.files.last()
        shifted = bytearray(data[first:])
        shifted[second + codec.PHYSICAL_OFFSET_POS + 7] ^= 0x01  # the 2nd record, off by one
        with pytest.raises(ReplicaDataError, match="physical offset"):
            slave.replica.append_pieces(first, [shifted[:500], shifted[500:]])
        assert slave.commitlog.max_offset == first
        assert bytes(mf.buffer[first : first + len(shifted)]) == bytes(len(shifted))
        # Whole records, then the head of one: only the records count; the rest comes later.
        cut = first + second + 100
        assert slave.replica.append_pieces(first, [data[first : first + 300],
                                                   data[first + 300 : cut]]) == second
        assert slave.commitlog.max_offset == first + second
        # The head of the third record lies past the end until its rest comes; a new stream
        # (which may bring other bytes there) starts from zeros.
        end = first + second
        assert bytes(mf.buffer[end:cut]) == data[end:cut]
        slave.replica.discard_unpublished()
        assert bytes(mf.buffer[end:cut]) == bytes(cut - end)
        assert slave.commitlog.max_offset == end
        assert slave.replica.append_pieces(end, [data[end:]]) > 0  # and goes on from there
    finally:
        master.close()
        slave.close()


def test_whole_records_stops_before_a_record_cut_by_the_chunk_end(tmp_path):
    master = _master(tmp_path, n=10)
    try:
        data = master.log_reader.read_range(0, 10_000)
        sizes = []
        pos = 0
        while pos < len(data):
            size = codec.read_size_and_magic(data, pos)[0]
            sizes.append(size)
            pos += size
        view = memoryview(data)
        assert whole_records(view, 0, SEGMENT) == len(data)
        assert whole_records(view[: sizes[0] + 3], 0, SEGMENT) == sizes[0]  # header cut
        assert whole_records(view[: sizes[0] + 100], 0, SEGMENT) == sizes[0]  # body cut
        assert whole_records(view[: sizes[0] - 1], 0, SEGMENT) == 0
    finally:
        master.close()


def test_a_blank_filler_must_end_its_segment():
    blank = codec.encode_blank(100) + bytes(92)
    assert whole_records(memoryview(blank), SEGMENT - 100, SEGMENT) == 100
    with pytest.raises(ReplicaDataError, match="does not end its segment"):
        whole_records(memoryview(blank), SEGMENT - 200, SEGMENT)
    # Its head alone is a continuation.
    assert whole_records(memoryview(blank[:50]), SEGMENT - 100, SEGMENT) == 0


def test_truncate_cuts_the_log_queues_and_dispatch_back_and_says_what_it_cut(tmp_path):
    master = _master(tmp_path)
    slave = _slave(tmp_path)
    try:
        _copy(master, slave, 0, random.Random(3))
        assert slave.wait_dispatched()
        # Cut at the record of queue 1's 50th message.
        got = master.get_messages("g", "Repl", 1, 50, max_count=1)
        cut = got.records[0].physical_offset
        got.release()
        before = slave.commitlog.max_offset
        report = slave.replica.truncate(cut, reason="test")
        assert report.offset == cut and report.previous_end == before
        assert report.bytes_cut == before - cut
        assert report.records_cut == 300 - (50 * 3 + 1)  # messages 151..299
        assert report.dropped_units == report.records_cut
        assert slave.commitlog.max_offset == cut
        assert slave.get_max_offset_in_queue("Repl", 1) == 50
        assert slave.get_max_offset_in_queue("Repl", 0) == 51
        # The copy goes on from the cut, and reads serve the new bytes.
        other = MessageStore(_config(tmp_path / "other")).open()
        try:
            _copy(master, other, 0, random.Random(4))
            pending = master.log_reader.read_range(cut, cut + 10**6)
            assert slave.replica.append(cut, pending) > 0
        finally:
            other.close()
        assert slave.wait_dispatched()
        got = slave.get_messages("g", "Repl", 1, 50, max_count=1)
        assert got.records[0].decode().body.endswith(b"#151")
        got.release()
    finally:
        master.close()
        slave.close()


def test_large_chunks_are_checked_in_bulk_as_strictly(tmp_path):
    """A slave catching up appends megabytes at once; those are checked in bulk (size chain,
    magic codes, stored physical offsets) and refused just as a small chunk would be."""
    from stratamq.store.replica import BULK_CHECK_BYTES

    segment = 1024 * 1024
    config = StoreConfig(store_path_root_dir=str(tmp_path / "big"),
                         mapped_file_size_commit_log=segment)
    with MessageStore(config) as master:
        for i in range(600):
            assert master.put_message(Message("Repl", b"%d|" % i + b"b" * 900, i % 3)).ok
        data = master.log_reader.read_range(0, segment)
    starts = []
    pos = 0
    while pos + 8 <= len(data):
        size = codec.read_size_and_magic(data, pos)[0]
        starts.append(pos)
        pos += size
    chunk = memoryview(data)[: starts[-1] + 100]  # ends inside the last record
    assert len(chunk) >= BULK_CHECK_BYTES
    assert whole_records(chunk, 0, segment) == starts[-1]
    middle = starts[len(starts) // 2]
    shifted = bytearray(chunk)
    shifted[middle + codec.PHYSICAL_OFFSET_POS + 7] ^= 0x01  # its stored offset, off by one
    with pytest.raises(ReplicaDataError, match=f"offset {middle}.*physical offset"):
        whole_records(memoryview(shifted), 0, segment)
    torn = bytearray(chunk)
    torn[middle + 4] ^= 0xFF  # a magic code
    with pytest.raises(ReplicaDataError, match=f"offset {middle}"):
        whole_records(memoryview(torn), 0, segment)
    # A size that swallows the next record: the chain still lands on a record, but the
    # lengths inside no longer add up (as the record-by-record check finds).
    merged = bytearray(chunk)
    i = len(starts) // 3
    struct.pack_into(">i", merged, starts[i], starts[i + 2] - starts[i])
    assert len(merged[: starts[i + 3]]) < BULK_CHECK_BYTES <= len(merged)
    for damaged in (merged, merged[: starts[i + 3]]):  # in bulk, and record by record
        with pytest.raises(ReplicaDataError, match=f"offset {starts[i]}.*lengths"):
            whole_records(memoryview(damaged), 0, segment)


def test_dispatch_held_back_while_catching_up_goes_on_when_released(tmp_path):
    master = _master(tmp_path)
    slave = _slave(tmp_path)
    try:
        half = master.get_messages("g", "Repl", 0, 50, max_count=1)
        middle = half.records[0].physical_offset
        half.release()
        while slave.replica.end() < middle:  # whole segments, then up to the middle
            at = slave.replica.end()
            assert slave.replica.append(at, master.log_reader.read_range(at, middle)) > 0
        assert slave.wait_dispatched()
        assert slave.get_max_offset_in_queue("Repl", 0) == 50
        slave.replica.hold_dispatch()
        _copy(master, slave, middle, random.Random(5))
        # Copied, not dispatched: the queues stay where they were (but for the one record
        # the dispatch thread was on when the hold came: it waits after dispatching it).
        assert slave.commitlog.max_offset == master.commitlog.max_offset
        assert not slave.wait_dispatched(timeout=0.5)
        assert sum(slave.get_max_offset_in_queue("Repl", q) for q in range(3)) <= 151
        assert slave.replica.dispatch_lag() > 0
        slave.replica.release_dispatch()
        assert slave.wait_dispatched()
        assert slave.replica.dispatch_lag() == 0
        assert [slave.get_max_offset_in_queue("Repl", q) for q in range(3)] == [100, 100, 100]
        # A cut while dispatch is held releases it first (it waits for the round to end).
        slave.replica.hold_dispatch()
        report = slave.replica.truncate(middle, reason="test")
        assert report.offset == middle and not slave.replica.dispatch_held
        assert slave.wait_dispatched()
        assert slave.get_max_offset_in_queue("Repl", 0) == 50
    finally:
        master.close()
        slave.close()
