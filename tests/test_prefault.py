"""Faulting CommitLog pages in ahead of the appender (``store/prefault.py``) must not change a
byte: not of what is written, not of what is not written yet, whatever the two threads do at
the same time."""

from __future__ import annotations

import os
import threading

import pytest

from stratamq.config import FlushDiskType, StoreConfig
from stratamq.record import Message, Prop
from stratamq.store.mapped_file import MappedFile, populate_supported
from stratamq.store.message_store import MessageStore
from stratamq.store.results import GetMessageStatus

SEGMENT = 4 * 1024 * 1024


@pytest.mark.parametrize("write", [True, False], ids=["for-writing", "for-reading"])
def test_prefault_changes_no_byte_and_reserves_what_it_faults_in(tmp_path, write):
    mf = MappedFile(tmp_path / f"{0:020d}", SEGMENT, allocate_ahead=64 * 1024)
    data = os.urandom(100_000)
    mf.write_at(0, data)
    before = bytes(mf.buffer)
    # Overlapping the written bytes, starting mid-page, running past the reservation.
    faulted = mf.prefault(5_000, 3 * 1024 * 1024, write)
    assert faulted == populate_supported()
    assert bytes(mf.buffer) == before
    assert mf.buffer[:100_000] == data and not any(mf.buffer[100_000:])
    if faulted:
        assert os.stat(mf.path).st_blocks * 512 >= 3 * 1024 * 1024  # reserved first
    mf.write_at(100_000, b"after")  # the writer goes on as before
    assert bytes(mf.buffer[100_000:100_005]) == b"after"
    mf.close()
    with open(tmp_path / f"{0:020d}", "rb") as f:
        on_disk = f.read()
    assert on_disk[:100_005] == data + b"after" and not any(on_disk[100_005:])


def test_prefault_racing_the_writer_keeps_every_byte(tmp_path):
    """A thread faults pages in over and over across the region another thread is writing:
    every written byte stays, and the rest stays zero."""
    mf = MappedFile(tmp_path / f"{0:020d}", SEGMENT, allocate_ahead=64 * 1024)
    chunks = [os.urandom(16_500) for _ in range(200)]
    stop = threading.Event()

    def fault() -> None:
        while not stop.is_set():
            at = mf.wrote_position
            mf.prefault(max(0, at - 8192), at + 256 * 1024)

    faulter = threading.Thread(target=fault)
    faulter.start()
    try:
        for chunk in chunks:
            mf.write_at(mf.wrote_position, chunk)
    finally:
        stop.set()
        faulter.join()
    written = b"".join(chunks)
    assert bytes(mf.buffer[: len(written)]) == written
    assert not any(mf.buffer[len(written):])
    mf.close()


@pytest.mark.parametrize("flush", [FlushDiskType.ASYNC_FLUSH, FlushDiskType.SYNC_FLUSH])
def test_a_store_with_the_prefaulter_reads_back_every_record(tmp_path, flush):
    """Pages faulted in for writing (ASYNC_FLUSH) or, under SYNC_FLUSH, for reading: every
    record reads back, and the file past the last one stays zero."""
    cfg = StoreConfig(store_path_root_dir=str(tmp_path), mapped_file_size_commit_log=SEGMENT,
                      flush_disk_type=flush)
    bodies = [os.urandom(500 + i % 1500) for i in range(6000)]
    with MessageStore(cfg).open() as store:
        for at in range(0, len(bodies), 16):  # across several segments
            batch = [Message("T", body, (at + i) % 3, {Prop.UNIQ_KEY: f"ID{at + i:030X}"})
                     for i, body in enumerate(bodies[at : at + 16])]
            assert store.put_messages(batch).ok
        assert store.reput.wait_caught_up(10)
        if populate_supported():
            assert store._prefaulter is not None and store._prefaulter.faulted > 0
            assert store._prefaulter.write is (flush is FlushDiskType.ASYNC_FLUSH)
        got = []
        for queue_id in range(3):
            offset = 0
            while True:
                with store.get_messages("g", "T", queue_id, offset, 64) as result:
                    if result.status is not GetMessageStatus.FOUND:
                        break
                    got.extend((m.properties[Prop.UNIQ_KEY], m.body) for m in result.messages())
                    offset = result.next_begin_offset
        last = store.commitlog.files.last()
        assert not any(last.buffer[last.wrote_position:])
    assert sorted(got) == sorted((f"ID{i:030X}", b) for i, b in enumerate(bodies))
