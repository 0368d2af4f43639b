"""A store's identity and its CommitLog's lineage (docs/formats/store-identity.md): made with
the store, kept across opens, given to an older directory as "unknown", never silently remade
when damaged; and, over real sockets in this process, how a slave of unknown lineage follows a
master only without cutting its log."""

from __future__ import annotations

import json

import pytest
from test_ha_link import _put, _slave_of, nodes, same_log  # noqa: F401  (nodes: fixture)
from waiting import wait_until

from stratamq.config import StoreConfig
from stratamq.message import Message
from stratamq.store.identity import StoreIdentityError
from stratamq.store.message_store import MessageStore


def _open(root, **extra) -> MessageStore:
    return MessageStore(StoreConfig(store_path_root_dir=str(root),
                                    mapped_file_size_commit_log=64 * 1024, **extra)).open()


def test_a_new_store_is_its_own_lineage_and_keeps_its_identity(tmp_path):
    store = _open(tmp_path / "s")
    first = store.identity.current
    assert first.lineage == first.store_id
    assert store.put_message(Message("T", b"x")).ok
    store.close()
    on_disk = json.loads((tmp_path / "s" / "storeIdentity.json").read_text())
    assert on_disk["storeId"] == first.store_id and on_disk["lineage"] == first.store_id
    again = _open(tmp_path / "s")
    assert again.identity.current == first
    again.close()


def test_a_directory_with_data_but_no_identity_gets_one_of_unknown_lineage(tmp_path):
    store = _open(tmp_path / "s")
    assert store.put_message(Message("T", b"x")).ok
    store.close()
    (tmp_path / "s" / "storeIdentity.json").unlink()  # as RocketMQ or an older StrataMQ left it
    looked = MessageStore(StoreConfig(store_path_root_dir=str(tmp_path / "s")),
                          read_only=True).open()
    assert looked.identity is None  # a read-only look writes nothing
    looked.close()
    assert not (tmp_path / "s" / "storeIdentity.json").exists()
    store = _open(tmp_path / "s")
    assert store.identity.lineage is None and store.identity.store_id
    store.close()


def test_a_damaged_identity_is_read_from_its_backup_or_stops_the_open(tmp_path):
    store = _open(tmp_path / "s")
    kept = store.identity.store_id
    store.identity.set_lineage("0f1e2d3c-4b5a-4968-8776-8594a3b2c1d0")  # keeps a .bak
    store.close()
    path = tmp_path / "s" / "storeIdentity.json"
    path.write_text('{"storeId": "not-a-uuid"')
    store = _open(tmp_path / "s")
    assert store.identity.store_id == kept and store.identity.lineage == kept  # the .bak's
    store.close()
    path.write_text("garbage")
    path.with_name(path.name + ".bak").write_text("garbage")
    with pytest.raises(StoreIdentityError, match="storeIdentity.json"):
        _open(tmp_path / "s")


def _forget_lineage(node) -> None:
    """Stop ``node`` and make its directory one from before identities."""
    node.stop()
    (node.root / "storeIdentity.json").unlink()
    (node.root / "storeIdentity.json.bak").unlink(missing_ok=True)


def test_a_slave_of_unknown_lineage_takes_its_masters_once_the_master_holds_its_log(nodes):  # noqa: F811
    master = nodes("master", ha_listen_port=0).start()
    _put(master.store, 500)
    slave = _slave_of(nodes, master)
    wait_until(lambda: same_log(master, slave), what="the slave to catch up")
    _forget_lineage(slave)
    slave.start()
    assert slave.store.identity.lineage is None
    _put(master.store, 100, "b")
    wait_until(lambda: same_log(master, slave), what="the slave to follow again")
    assert slave.store.identity.lineage == master.store.identity.lineage
    assert slave.ha.runtime_info()["lineageMismatch"] is False


def test_a_slave_of_unknown_lineage_never_cuts_its_log_for_a_master(nodes):  # noqa: F811
    master = nodes("master", ha_listen_port=0).start()
    _put(master.store, 500)
    slave = _slave_of(nodes, master)
    wait_until(lambda: same_log(master, slave), what="the slave to catch up")
    held = slave.end
    _forget_lineage(slave)
    other = nodes("other", ha_listen_port=0).start()  # another store, with less in it
    _put(other.store, 50, "o")
    slave.start(ha_master_address=f"127.0.0.1:{other.ha.listen_port}")
    wait_until(lambda: slave.ha.runtime_info()["lineageMismatch"],
               what="the slave to refuse the cut")
    assert slave.end == held
    assert slave.ha.runtime_info()["haClientRuntimeInfo"]["lastTruncation"] is None
    assert slave.store.identity.lineage is None
