"""The transaction table on a real store, no broker: rebuilt after a reopen from its checkpoint,
a crash between a commit's two writes read as committed, clean-up held off an open half, and a
slave following its master's half and op records, cut back included."""

from __future__ import annotations

from pathlib import Path

from stratamq.config import StoreConfig
from stratamq.message import Host, Message, Prop
from stratamq.store.message_store import MessageStore
from stratamq.transactions import TransactionTable
from stratamq.transactions.checkpoint import CHECKPOINT_NAME
from stratamq.transactions.messages import committed_message, half_message, op_message

SEGMENT = 64 * 1024
HOST = Host("127.0.0.1", 0)


def _config(root: Path, **extra) -> StoreConfig:
    return StoreConfig(store_path_root_dir=str(root), mapped_file_size_commit_log=SEGMENT,
                       mapped_file_size_consume_queue=100 * 20,
                       delete_commit_log_files_interval=0, **extra)


def _open(root: Path, **extra) -> tuple[MessageStore, TransactionTable]:
    table = TransactionTable(root / "config" / CHECKPOINT_NAME)
    store = MessageStore(_config(root, **extra))
    store.add_dispatcher(table)
    store.open()
    return store, table


def _half(store: MessageStore, name: str) -> int:
    sent = Message("Tx", name.encode(), 1, {Prop.UNIQ_KEY: name}, born_timestamp=1, born_host=HOST)
    r = store.put_message(half_message(sent, "Tx"))
    assert r.ok
    return r.physical_offset


def _commit(store: MessageStore, half_at: int, *, op: bool = True) -> None:
    store.wait_dispatched()
    half = store.look_message_by_offset(half_at)
    assert store.put_message(committed_message(half)).ok
    if op:
        assert store.put_message(op_message([half.queue_offset], HOST)).ok


def _roll_back(store: MessageStore, half_at: int) -> None:
    half = store.look_message_by_offset(half_at)
    assert store.put_message(op_message([half.queue_offset], HOST)).ok


def _fill(store: MessageStore, n: int) -> None:
    for i in range(n):
        assert store.put_message(Message("Other", b"x" * 1000 + b"%d" % i, i % 2)).ok
    assert store.wait_dispatched()
    store.flush()


def _state(table: TransactionTable) -> tuple[list[str], list[str], dict[str, str | None]]:
    ids = ("a", "b", "c", "d")
    return (sorted(t.transaction_id for t in table.open_transactions()),
            sorted(t.transaction_id for t in table.missing_ops()),
            {i: table.ended_as(i) for i in ids})


def test_reopened_from_its_checkpoint_with_the_same_state(tmp_path):
    root = tmp_path / "store"
    store, table = _open(root)
    try:
        _fill(store, 200)  # the first open transaction is well past the start of the log
        a, b = _half(store, "a"), _half(store, "b")
        c = _half(store, "c")
        d = _half(store, "d")
        _commit(store, a)
        _roll_back(store, b)
        _commit(store, d, op=False)  # a crash between a commit's two writes
        store.wait_dispatched()
        store.flush()
        table.save(store.flushed_offset)  # the candidate ...
        table.save(store.flushed_offset)  # ... written once the flush has passed it
        before = _state(table)
        assert before == (["c"], ["d"], {"a": "COMMIT", "b": "ROLLBACK", "c": None,
                                         "d": "COMMIT"})
        # Replays from the oldest half not wholly ended ("c"): "a" and "b" are behind it.
        assert a < table.durable_offset() <= c
    finally:
        store.close()
    again, table = _open(root)
    with again:
        assert _state(table)[:2] == before[:2]
        # Ended before the checkpoint's offset: not replayed, not needed.
        assert table.ended_as("d") == "COMMIT"


def test_clean_up_keeps_the_segment_of_an_open_half(tmp_path):
    store, table = _open(tmp_path / "store")
    try:
        open_at = _half(store, "c")
        _fill(store, 400)
        table.save(store.flushed_offset)
        table.save(store.flushed_offset)
        assert len(store.commitlog.files.files) >= 5
        store.cleanup.run_once(force=True)
        assert store.commitlog.min_offset <= open_at  # held by the open half
        assert store.look_message_by_offset(open_at) is not None
        _roll_back(store, open_at)
        store.wait_dispatched()
        store.flush()
        table.save(store.flushed_offset)
        table.save(store.flushed_offset)
        for _ in range(3):
            store.cleanup.run_once(force=True)
        assert store.commitlog.min_offset > open_at  # ended: its segment may go
    finally:
        store.close()


def test_a_slave_follows_and_a_cut_back_reopens_what_it_undid(tmp_path):
    master, _ = _open(tmp_path / "master")
    slave, table = _open(tmp_path / "slave", broker_role="SLAVE")
    try:
        a, b = _half(master, "a"), _half(master, "b")
        master.wait_dispatched()
        cut = master.commitlog.max_offset
        _commit(master, a)
        _roll_back(master, b)
        master.wait_dispatched()
        data = master.log_reader.read_range(0, master.commitlog.max_offset)
        assert slave.replica.append(0, data) == len(data)
        assert slave.wait_dispatched()
        assert _state(table)[0] == [] and table.ended_as("a") == "COMMIT"
        slave.replica.truncate(cut, reason="test")
        assert _state(table)[0] == ["a", "b"]  # their ends were cut off
        rest = master.log_reader.read_range(cut, master.commitlog.max_offset)
        assert slave.replica.append(cut, rest) == len(rest)
        assert slave.wait_dispatched()
        assert _state(table)[0] == [] and table.ended_as("b") == "ROLLBACK"
    finally:
        slave.close()
        master.close()
