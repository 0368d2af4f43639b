"""A slave's CommitLog cut back (``store/replica.py`` ``ReplicaLog.truncate``, as the HA slave
does when it is ahead of its master) cuts the CompactionLogs back too: reading a compaction
topic from the start gives the latest value per key of what the CommitLog still holds (values
that were cut are gone; older versions a round removed in favour of a cut one are back), and
the master's replacement records at the same queue offsets are split out, also after a
restart and a later round."""

from __future__ import annotations

from compaction_util import (
    TOPIC,
    as_table,
    close,
    compact,
    open_store,
    put,
    read_from,
    small_config,
)

from stratamq.message import Message
from stratamq.store.message_store import MessageStore


def _put(store: MessageStore, key: str, value: bytes, log: list) -> None:
    result = store.put_message(Message(TOPIC, value, 0, {"KEYS": key}))
    assert result.ok
    log.append((result.physical_offset, key, value))


def _table(log: list, below: int | None = None) -> dict[str, bytes]:
    table: dict[str, bytes] = {}
    for phys, key, value in log:
        if below is not None and phys >= below:
            continue
        if value:
            table[key] = value
        else:
            table.pop(key, None)
    return table


def test_a_cut_back_cuts_the_compaction_log_and_takes_the_replacements(tmp_path):
    config = small_config(tmp_path / "store")
    store, comp = open_store(config)
    log: list = []
    for i in range(400):
        key = f"k{i % 25}"
        _put(store, key, b"" if i % 17 == 0 else b"v%d-" % i + bytes(150), log)
    # A round removes old versions, also ones whose replacement is about to be cut.
    [report] = compact(store, comp)
    assert report.removed > 0
    for i in range(400, 460):  # and some written after the round
        _put(store, f"k{i % 25}", b"w%d" % i, log)
    assert store.wait_dispatched()
    [clog] = comp.queues()
    assert len(clog.segments) > 2

    cut = log[250][0]  # in the compacted files: k0..k24's newest versions there go
    before = store.get_max_offset_in_queue(TOPIC, 0)
    truncation = store.replica.truncate(cut, "test")
    assert truncation.records_cut == 210
    assert store.get_max_offset_in_queue(TOPIC, 0) == before - 210 == 250
    assert clog.next_offset == 250
    assert as_table(read_from(store)) == _table(log, cut)
    assert [m.queue_offset for m in read_from(store)][-1] <= 249

    # The master's records after the cut point: the same queue offsets, new values.
    log = [entry for entry in log if entry[0] < cut]
    for i in range(60):
        _put(store, f"k{(i * 7) % 30}", b"n%d" % i, log)
    assert store.wait_dispatched()
    got = read_from(store)
    assert as_table(got) == _table(log)
    assert [m.queue_offset for m in got if m.queue_offset >= 250] == list(range(250, 310))

    # After a restart (the checkpoint was moved back) and a round, the same table.
    close(store, comp)
    store, comp = open_store(config)
    try:
        assert as_table(read_from(store)) == _table(log)
        compact(store, comp)
        assert as_table(read_from(store)) == _table(log)
        put(store, "k1", b"last")
        assert as_table(read_from(store)) == {**_table(log), "k1": b"last"}
    finally:
        close(store, comp)


def test_a_cut_back_past_every_compacted_record_changes_nothing(tmp_path):
    store, comp = open_store(small_config(tmp_path / "store"))
    try:
        log: list = []
        for i in range(120):
            _put(store, f"k{i % 10}", b"v%d" % i, log)
        compact(store, comp)
        table = as_table(read_from(store))
        end = store.commitlog.max_offset
        _put(store, "other", b"x", log)  # cut below: a record the CompactionLog has too
        assert store.wait_dispatched()
        store.replica.truncate(end, "test")
        assert as_table(read_from(store)) == table
        [clog] = comp.queues()
        assert clog.next_offset == 120
    finally:
        close(store, comp)
