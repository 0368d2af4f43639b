"""Warm-ahead (store/warm_ahead.py): page-cache pages populated past a catching-up slave's end
on a thread of their own. It must never change a byte: a copy with it is byte-identical to
the master, and what lies past the slave's end stays zero."""

from __future__ import annotations

import os
import random
import sys

import pytest

from stratamq.config import StoreConfig
from stratamq.message import Message
from stratamq.store.layout import segment_name
from stratamq.store.message_store import MessageStore
from stratamq.store.warm_ahead import WarmAhead
from tests.waiting import wait_until

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="MADV_POPULATE_READ is Linux's")

SEGMENT = 1024 * 1024
CHUNK = 300 * 1024  # what one read of a slave catching up hands ReplicaLog.append_pieces


def _config(root, **extra) -> StoreConfig:
    return StoreConfig(store_path_root_dir=str(root), mapped_file_size_commit_log=SEGMENT,
                       message_index_enable=False, **extra)


def _master(tmp_path) -> MessageStore:
    store = MessageStore(_config(tmp_path / "master")).open()
    rng = random.Random(3)
    for i in range(3000):
        body = bytes(rng.randrange(256) for _ in range(rng.randrange(400, 1200)))
        assert store.put_message(Message("Warm", body, i % 4)).ok
    store.flush()
    return store


def _copy_in_reads(master: MessageStore, slave: MessageStore) -> None:
    """The master's log as a catching-up slave gets it: reads of CHUNK bytes in frames of
    32 KiB, a record cut by a read's end handed again with the next read."""
    reader = master.log_reader
    end = master.commitlog.max_offset
    offset, pending = 0, b""
    while offset < end or pending:
        data = bytes(reader.read_range(offset, offset + CHUNK)) if offset < end else b""
        offset += len(data)
        pending += data
        where = slave.replica.end() if not slave.replica.is_empty() else 0
        frames = [pending[at : at + 32768] for at in range(0, len(pending), 32768)]
        taken = slave.replica.append_pieces(where, frames)
        pending = pending[taken:]
        assert taken or offset < end, "the last read must complete its records"


def test_a_copy_with_warm_ahead_is_byte_identical_and_the_bytes_past_its_end_stay_zero(
        tmp_path):
    master = _master(tmp_path)
    slave = MessageStore(_config(tmp_path / "slave", broker_role="SLAVE")).open()
    try:
        _copy_in_reads(master, slave)
        end = master.commitlog.max_offset
        assert end > 2 * SEGMENT  # the copy crossed into later segments
        warm = slave.replica._warm
        assert warm is not None and warm.warmed_bytes > 0  # it did populate pages
        assert slave.commitlog.max_offset == end
        for mine, theirs in zip(slave.commitlog.files.files, master.commitlog.files.files,
                                strict=True):
            assert mine.path.name == theirs.path.name
            n = min(end - mine.file_from_offset, SEGMENT)
            assert bytes(mine.buffer[:n]) == bytes(theirs.buffer[:n])
        last = slave.commitlog.files.last()
        assert last is not None
        assert not any(last.buffer[end - last.file_from_offset :])
        assert slave.wait_dispatched()
        got = slave.get_messages("g", "Warm", 0, 0, max_count=1000, max_bytes=10**8)
        assert len(got.records) == 750
        got.release()
    finally:
        master.close()
        slave.close()
    assert warm is not None and not warm.running  # closing the store stopped its thread


def test_warm_ahead_follows_the_end_into_a_segment_created_later_and_changes_nothing(
        tmp_path):
    first = tmp_path / segment_name(0)
    with open(first, "wb") as f:
        f.truncate(SEGMENT)
    warm = WarmAhead(tmp_path, SEGMENT, ahead=SEGMENT // 2)
    try:
        warm.advance(SEGMENT - SEGMENT // 4)
        # Up to the first segment's end; the next one does not exist yet.
        wait_until(lambda: warm.warmed_bytes >= SEGMENT // 4, what="the first segment's tail")
        with open(tmp_path / segment_name(SEGMENT), "wb") as f:
            f.truncate(SEGMENT)
        warm.advance(SEGMENT)  # the writer moved into the new segment
        wait_until(lambda: warm.warmed_bytes >= SEGMENT // 4 + SEGMENT // 2,
                   what="the new segment's head")
    finally:
        warm.close()
    assert not warm.running
    for name in (segment_name(0), segment_name(SEGMENT)):
        path = tmp_path / name
        assert os.path.getsize(path) == SEGMENT
        assert not any(path.read_bytes())


def test_the_warmer_lets_go_of_its_map_once_the_writer_stops(tmp_path):
    """A segment the slave deletes (a cut, clean-up) must not stay alive in the warmer's map
    after the copy has stopped."""
    path = tmp_path / segment_name(0)
    with open(path, "wb") as f:
        f.truncate(SEGMENT)
    warm = WarmAhead(tmp_path, SEGMENT, ahead=SEGMENT // 4)

    def mapped() -> bool:
        with open("/proc/self/maps") as maps:
            return str(path) in maps.read()

    try:
        warm.advance(0)
        wait_until(lambda: warm.warmed_bytes >= SEGMENT // 4, what="the window")
        wait_until(lambda: not mapped(), what="the warmer to unmap the idle segment")
        assert warm.running  # idle, not gone: the next advance goes on
        warm.advance(SEGMENT // 2)
        wait_until(lambda: warm.warmed_bytes >= SEGMENT // 2, what="the next window")
    finally:
        warm.close()
    assert not mapped()
