"""A dispatcher plugged into the store from outside (as a tier uploader or a compaction log
will be): fed every record, replayed from its own durable progress on open, and holding
CommitLog clean-up back while it lags, up to a bound."""

from __future__ import annotations

import logging

import pytest

from stratamq import record as codec
from stratamq.config import StoreConfig
from stratamq.message import DispatchInfo, Message
from stratamq.store.log_reader import CommitLogReader
from stratamq.store.message_store import MessageStore

SEGMENT = 64 * 1024


class LaggingDispatcher:
    """Remembers what it was given; ``durable`` is as far as it claims to have persisted."""

    def __init__(self, durable: int = 0) -> None:
        self.durable = durable
        self.offsets: list[int] = []

    def dispatch(self, info: DispatchInfo) -> None:
        self.offsets.append(info.physical_offset)

    def durable_offset(self) -> int:
        return self.durable


def _config(tmp_path, **extra) -> StoreConfig:
    return StoreConfig(store_path_root_dir=str(tmp_path / "store"),
                       mapped_file_size_commit_log=SEGMENT,
                       mapped_file_size_consume_queue=100 * 20,
                       delete_commit_log_files_interval=0, **extra)


def _fill(store: MessageStore, n: int = 300) -> None:
    for i in range(n):
        assert store.put_message(Message("Seam", b"x" * 1000 + b"%d" % i, i % 2)).ok
    assert store.wait_dispatched()
    store.flush()


def test_a_plugged_dispatcher_is_fed_holds_clean_up_and_is_replayed(tmp_path):
    toy = LaggingDispatcher(durable=0)
    store = MessageStore(_config(tmp_path))
    store.add_dispatcher(toy)
    store.open()
    try:
        _fill(store)
        assert len(toy.offsets) == 300
        segments = len(store.commitlog.files.files)
        assert segments >= 4
        # It has persisted nothing: no CommitLog file may go, even forced.
        report = store.cleanup.run_once(force=True)
        assert report.commitlog_files == [] and store.commitlog.min_offset == 0
        # It caught up to the end of the second segment: the first two may go, no more.
        toy.durable = 2 * SEGMENT
        report = store.cleanup.run_once(force=True)
        assert store.commitlog.min_offset == 2 * SEGMENT, report.as_dict()
        end = store.commitlog.max_offset
    finally:
        store.close()
    # Reopened, a dispatcher is replayed from its durable progress: what it had not persisted
    # (everything from 2 segments on) reaches it again.
    again = LaggingDispatcher(durable=3 * SEGMENT)
    store = MessageStore(_config(tmp_path))
    store.add_dispatcher(again)
    with store.open():
        assert again.offsets and min(again.offsets) >= 3 * SEGMENT - 1200
        assert [o for o in toy.offsets if o >= min(again.offsets)] == again.offsets
        assert store.commitlog.max_offset == end


def test_a_dispatcher_that_lags_past_the_bound_no_longer_holds_clean_up(tmp_path, caplog):
    toy = LaggingDispatcher(durable=0)
    store = MessageStore(_config(tmp_path, dispatcher_hold_max_bytes=SEGMENT))
    store.add_dispatcher(toy)
    store.open()
    try:
        _fill(store)
        with caplog.at_level(logging.WARNING):
            store.cleanup.run_once(force=True)
        # Files more than the bound behind the dispatched end went; the rest stay for it.
        assert 0 < store.commitlog.min_offset <= store.reput.reput_from - SEGMENT
        assert "dispatcherRetentionHoldMaxBytes" in caplog.text
    finally:
        store.close()


def test_dispatchers_are_added_before_open(tmp_path):
    with (MessageStore(_config(tmp_path)).open() as store,
          pytest.raises(RuntimeError, match="before the store is opened")):
        store.add_dispatcher(LaggingDispatcher())


def test_a_put_waits_on_each_waiter_in_turn(tmp_path):
    """Group commit is the first condition a SYNC_FLUSH put waits on; a plugged-in one (as a
    replication master's "a slave has the bytes") comes after it and can refuse the put."""
    from stratamq.config import FlushDiskType
    from stratamq.store.results import PutMessageStatus

    store = MessageStore(_config(tmp_path, flush_disk_type=FlushDiskType.SYNC_FLUSH))
    seen: list[tuple[int, bool]] = []
    store.add_put_waiter(lambda end: seen.append(
        (end, store.commitlog.files.flushed_where >= end)) or None)
    with store.open():
        first = store.put_message(Message("Wait", b"one"))
        assert first.status is PutMessageStatus.PUT_OK
        end = first.messages[-1].physical_offset + first.messages[-1].size
        assert seen == [(end, True)]  # called with the put's end, after the flush
        store.add_put_waiter(lambda end: PutMessageStatus.FLUSH_SLAVE_TIMEOUT)
        refused = store.put_message(Message("Wait", b"two"))
        assert refused.status is PutMessageStatus.FLUSH_SLAVE_TIMEOUT
        assert refused.messages  # stored all the same, as RocketMQ's broker does
        no_wait = store.put_message(Message("Wait", b"three", properties={"WAIT": "false"}))
        assert no_wait.status is PutMessageStatus.PUT_OK and len(seen) == 2


class MemorySource:
    """A toy read source: keeps a copy of every record a dispatcher hands it (as a tier
    would), and serves reads, offsets, lookups by time and key from that copy."""

    name = "toy"

    def __init__(self) -> None:
        self.records: dict[tuple[str, int], dict[int, bytes]] = {}
        self.reader: CommitLogReader | None = None
        self.reads = 0

    def attach(self, reader: CommitLogReader) -> None:
        self.reader = reader

    def dispatch(self, info: DispatchInfo) -> None:
        assert self.reader is not None
        data = self.reader.read_bytes(info.physical_offset, info.size)
        assert data is not None
        self.records.setdefault((info.topic, info.queue_id), {})[info.queue_offset] = data

    def offsets(self, topic, queue_id):
        from stratamq.store.read_chain import QueueOffsets

        held = self.records.get((topic, queue_id))
        return QueueOffsets(min(held), max(held) + 1) if held else None

    def read(self, request):
        from stratamq.store.results import GetMessageResult, GetMessageStatus, SelectedRecord

        held = self.records.get((request.topic, request.queue_id), {})
        if request.offset not in held:
            return None
        self.reads += 1
        result = GetMessageResult(GetMessageStatus.FOUND, request.offset, min(held),
                                  max(held) + 1)
        offset = request.offset
        while offset in held and len(result.records) < request.max_count:
            data = held[offset]
            msg = codec.decode(data)
            result.records.append(SelectedRecord(memoryview(data), msg.physical_offset, offset))
            offset += 1
        result.next_begin_offset = offset
        return result

    def offset_by_time(self, topic, queue_id, timestamp_ms):
        held = self.records.get((topic, queue_id), {})
        hits = [o for o, d in held.items() if codec.decode(d).store_timestamp >= timestamp_ms]
        return min(hits) if hits else None

    def query_by_key(self, topic, key, max_num, begin_ms, end_ms):
        found = [codec.decode(d) for (t, _q), held in self.records.items() if t == topic
                 for d in held.values()]
        return [m for m in found if key in m.keys][:max_num]

    def read_by_physical_offset(self, physical_offset):
        for held in self.records.values():
            for data in held.values():
                msg = codec.decode(data)
                if msg.physical_offset == physical_offset:
                    return msg
        return None

    def topics(self):
        out: dict[str, list[int]] = {}
        for topic, queue_id in self.records:
            out.setdefault(topic, []).append(queue_id)
        return out


def test_a_plugged_read_source_serves_what_local_clean_up_removed(tmp_path):
    toy = MemorySource()
    store = MessageStore(_config(tmp_path))
    store.add_dispatcher(toy)
    store.add_read_source(toy)
    with store.open():
        assert toy.reader is store.log_reader
        for i in range(300):
            props = {"KEYS": f"k{i}"}
            assert store.put_message(Message("Seam", b"x" * 1000 + b"%d" % i, 0, props)).ok
        assert store.wait_dispatched()
        store.flush()
        first_ids = [m.msg_id for m in store.get_messages("g", "Seam", 0, 0, 10).messages()]
        assert toy.reads == 0  # the local queue holds it: the toy is not asked
        store.cleanup.run_once(force=True)
        assert store.commitlog.min_offset > 0  # local segments are gone
        local = store.local_source.offsets("Seam", 0)
        assert local is not None and local.low > 0 or store.commitlog.min_offset > 0
        # Offset 0 is still served, with the same bytes and ids, from the toy source.
        with store.get_messages("g", "Seam", 0, 0, 10) as got:
            assert got.status.value == "FOUND"
            msgs = list(got.messages())
        assert [m.msg_id for m in msgs] == first_ids
        assert [m.queue_offset for m in msgs] == list(range(10))
        assert toy.reads >= 1
        assert store.get_min_offset_in_queue("Seam", 0) == 0
        assert store.get_max_offset_in_queue("Seam", 0) == 300
        assert store.get_offset_in_queue_by_time("Seam", 0, 0) == 0
        assert [m.body for m in store.query_messages("Seam", "k0")] == [b"x" * 1000 + b"0"]
        assert store.look_message_by_offset(msgs[0].physical_offset).body == msgs[0].body
        # Reading on from the toy's answer reaches the local queue again, without a gap.
        offset, seen = 0, []
        while offset < 300:
            with store.get_messages("g", "Seam", 0, offset, 32) as got:
                assert got.records, got.status
                seen += [r.queue_offset for r in got.records]
                offset = got.next_begin_offset
        assert seen == list(range(300))
