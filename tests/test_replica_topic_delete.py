"""A slave applies its master's topic deletion at the master's cutoff, however late.

The deletion reaches a slave with the next state sync, seconds after the bytes: by then the
slave may hold, and have dispatched, messages of the topic created again on the master. Those
stay on the slave as they stay on the master; only the old generation goes, also after a
crash of the slave."""

from __future__ import annotations

import pytest

from stratamq.config import StoreConfig
from stratamq.message import Message
from stratamq.store.message_store import MessageStore

SEGMENT = 64 * 1024


def _config(root, **extra) -> StoreConfig:
    return StoreConfig(store_path_root_dir=str(root), mapped_file_size_commit_log=SEGMENT,
                       mapped_file_size_consume_queue=100 * 20, **extra)


def _bodies(store: MessageStore, topic: str, queue_id: int) -> list[bytes]:
    got = store.get_messages("G", topic, queue_id, 0, max_count=1000)
    with got:
        return [m.body for m in got.messages()]


def _copy_all(master: MessageStore, slave: MessageStore) -> None:
    """The master's whole log onto the slave, in chunks as the HA link hands them over."""
    reader = master.log_reader
    offset, end, pending = 0, master.commitlog.max_offset, b""
    while offset < end:
        data = reader.read_range(offset, min(end, offset + 3000))
        offset += len(data)
        pending += data
        taken = slave.replica.append(slave.replica.end(), pending)
        pending = pending[taken:]
    assert pending == b""


def _queues(store: MessageStore, topic: str) -> dict[int, list[bytes]]:
    return {q: _bodies(store, topic, q) for q in range(2)}


def test_a_late_deletion_keeps_what_the_slave_already_has_of_the_new_generation(tmp_path):
    master = MessageStore(_config(tmp_path / "master")).open()
    for i in range(120):
        assert master.put_message(Message("T", b"old-%d" % i, i % 2)).ok
        assert master.put_message(Message("Other", b"other-%d" % i, i % 2)).ok
    assert master.wait_dispatched()
    master.delete_topic("T")
    cutoff = master.deleted_topics.cutoffs["T"]
    for i in range(30):
        assert master.put_message(Message("T", b"new-%d" % i, i % 2)).ok
        assert master.put_message(Message("Other", b"after-%d" % i, i % 2)).ok
    assert master.wait_dispatched()
    expected_t, expected_other = _queues(master, "T"), _queues(master, "Other")
    assert expected_t[0][:2] == [b"new-0", b"new-2"]

    slave_cfg = _config(tmp_path / "slave", broker_role="SLAVE")
    slave = MessageStore(slave_cfg).open()
    _copy_all(master, slave)  # bytes first, the deletion later: the order a slave meets them
    assert slave.wait_dispatched()
    assert _bodies(slave, "T", 0)[0] == b"old-0"  # not deleted here yet

    slave.delete_topic("T", at=cutoff)
    assert slave.wait_dispatched()
    assert _queues(slave, "T") == expected_t
    assert _queues(slave, "Other") == expected_other  # dispatched again, not twice
    assert slave.get_max_offset_in_queue("T", 0) == 15
    slave.close()

    with MessageStore(slave_cfg) as reopened:  # its note of the cutoff survives a restart
        assert _queues(reopened, "T") == expected_t
    master.close()


def test_a_cutoff_past_the_slaves_log_is_refused(tmp_path):
    with MessageStore(_config(tmp_path / "slave", broker_role="SLAVE")) as slave:
        with pytest.raises(ValueError, match="this log ends at 0"):
            slave.delete_topic("T", at=1 << 20)
        assert slave.deleted_topics.cutoffs == {}


def test_a_deletion_that_cannot_pause_dispatch_notes_nothing_and_a_later_try_applies_it(tmp_path):
    """A slave catching up holds a dispatch round for as long as its dispatch is held back;
    the state-sync thread's deletion waits for it at most its timeout, and then leaves no
    note of a cutoff whose queues were never deleted (else no later sync would retry it)."""
    master = MessageStore(_config(tmp_path / "master")).open()
    for i in range(20):
        assert master.put_message(Message("T", b"old-%d" % i, i % 2)).ok
    assert master.wait_dispatched()
    master.delete_topic("T")
    cutoff = master.deleted_topics.cutoffs["T"]
    slave = MessageStore(_config(tmp_path / "slave", broker_role="SLAVE")).open()
    _copy_all(master, slave)
    assert slave.wait_dispatched()

    # A round that does not end (here: this test holds the round lock).
    with slave.reput.paused(), pytest.raises(TimeoutError):
        slave.delete_topic("T", timeout=0.2, at=cutoff)
    assert "T" not in slave.deleted_topics.cutoffs
    assert _bodies(slave, "T", 0)[0] == b"old-0"

    slave.delete_topic("T", at=cutoff)  # the next sync
    assert slave.deleted_topics.cutoffs["T"] == cutoff
    assert _queues(slave, "T") == {0: [], 1: []}
    slave.close()
    master.close()
