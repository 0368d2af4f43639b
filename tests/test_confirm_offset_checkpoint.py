"""The checkpoint's ``confirm_phy_offset`` (docs/formats/checkpoint.md): a controller-mode
store keeps its confirm offset there and opens with dispatch held at it, so the tail its group
never confirmed is read by no consumer until the broker's role moves the bound. A store not in
controller mode opens as before, and an old checkpoint (the field never written: 0) opens too.
The live broker case, with real processes and SIGKILL: tests/test_cluster_restart_confirm.py."""

from __future__ import annotations

from pathlib import Path

from stratamq.config import StoreConfig
from stratamq.message import Message, Prop
from stratamq.store.checkpoint import StoreCheckpoint
from stratamq.store.message_store import MessageStore

TOPIC = "T"


def config(root: Path) -> StoreConfig:
    return StoreConfig(store_path_root_dir=str(root), mapped_file_size_commit_log=1 << 20,
                       mapped_file_size_consume_queue=20 * 1000)


def put(store: MessageStore, name: str) -> None:
    result = store.put_message(Message(TOPIC, name.encode(), properties={Prop.KEYS: name}))
    assert result.ok, result


def readable(store: MessageStore) -> list[bytes]:
    got = store.get_messages("g", TOPIC, 0, 0)
    try:
        return [m.body for m in got.messages()]
    finally:
        got.release()


def found_by_key(store: MessageStore, name: str) -> bool:
    return any(m.body == name.encode() for m in store.query_messages(TOPIC, name))


def confirmed_then_tail(root: Path) -> int:
    """A controller-mode master's store: two messages its group confirmed (dispatched), then
    one it alone holds (its bound stops before it). Closed; returns the confirm offset."""
    with MessageStore(config(root), controller_mode=True) as store:
        put(store, "confirmed-0")
        put(store, "confirmed-1")
        confirmed = store.max_physical_offset
        store.set_dispatch_bound(lambda: confirmed)
        put(store, "unconfirmed")
        assert store.wait_dispatched()
        assert readable(store) == [b"confirmed-0", b"confirmed-1"]
        assert store.max_physical_offset > confirmed
    return confirmed


def test_the_checkpoint_keeps_the_confirm_offset_and_an_open_holds_dispatch_there(tmp_path):
    confirmed = confirmed_then_tail(tmp_path)
    assert StoreCheckpoint.read(tmp_path / "checkpoint").confirm_phy_offset == confirmed
    with MessageStore(config(tmp_path), controller_mode=True) as store:
        # Before the role is known: what was dispatched is readable, the tail is not (by
        # queue nor by key), though it is in the CommitLog.
        assert store.wait_dispatched()
        assert readable(store) == [b"confirmed-0", b"confirmed-1"]
        assert found_by_key(store, "confirmed-1")
        assert not found_by_key(store, "unconfirmed")
        assert store.dispatch_progress()[1] == confirmed
        # The role decided that the tail is the group's (an elected master acknowledging
        # alone; a slave in step with its master): it is dispatched.
        store.set_dispatch_bound(None)
        assert store.wait_dispatched()
        assert readable(store) == [b"confirmed-0", b"confirmed-1", b"unconfirmed"]
        assert found_by_key(store, "unconfirmed")
    # The whole log is confirmed now, and the checkpoint says so.
    assert StoreCheckpoint.read(tmp_path / "checkpoint").confirm_phy_offset > confirmed


def test_a_store_not_in_controller_mode_dispatches_its_whole_log_as_before(tmp_path):
    confirmed_then_tail(tmp_path)
    with MessageStore(config(tmp_path)) as store:
        assert store.wait_dispatched()
        assert readable(store) == [b"confirmed-0", b"confirmed-1", b"unconfirmed"]
        before = StoreCheckpoint.read(tmp_path / "checkpoint").confirm_phy_offset
    # Not in controller mode the field is kept as read.
    assert StoreCheckpoint.read(tmp_path / "checkpoint").confirm_phy_offset == before


def test_an_old_checkpoint_without_the_field_opens_with_what_was_dispatched(tmp_path):
    with MessageStore(config(tmp_path)) as store:  # written before the field was kept
        put(store, "old-0")
        put(store, "old-1")
        assert store.wait_dispatched()
    path = tmp_path / "checkpoint"
    old = StoreCheckpoint.read(path)
    assert old.confirm_phy_offset == 0 and old.logics_msg_timestamp > 0
    with MessageStore(config(tmp_path), controller_mode=True) as store:
        assert store.wait_dispatched()
        assert readable(store) == [b"old-0", b"old-1"]
        # A record appended now waits for the role (the bound) like any unconfirmed one.
        store.set_dispatch_bound(None)
        put(store, "new")
        assert store.wait_dispatched()
        assert readable(store) == [b"old-0", b"old-1", b"new"]
    assert StoreCheckpoint.read(path).confirm_phy_offset > 0


def test_a_confirm_offset_past_the_recovered_log_holds_at_its_end(tmp_path):
    with MessageStore(config(tmp_path), controller_mode=True) as store:
        put(store, "a")
        end = store.max_physical_offset
    path = tmp_path / "checkpoint"
    cp = StoreCheckpoint.read(path)
    cp.confirm_phy_offset = end + 10_000  # e.g. a log that lost its unflushed end
    cp.write(path)
    with MessageStore(config(tmp_path), controller_mode=True) as store:
        assert store.dispatch_progress()[1] == end
        assert readable(store) == [b"a"]
