"""Shared helpers for the compaction tests: a small-file store with compaction plugged in, and
reading a queue from its start the way a consumer of a compaction topic does."""

from __future__ import annotations

from pathlib import Path

from stratamq.compaction.policy import StaticPolicies, TopicPolicy
from stratamq.compaction.service import CompactionStore
from stratamq.config import StoreConfig
from stratamq.message import Message, StoredMessage
from stratamq.store.message_store import MessageStore

TOPIC = "Kv"
HOUR = 3600 * 1000


def small_config(root: Path, **extra) -> StoreConfig:
    """CommitLog segments of 256 KiB; CompactionLog files of 40 KiB and batch CQ files of
    32 units, so a few hundred messages make many files."""
    settings = dict(store_path_root_dir=str(root), mapped_file_size_commit_log=256 * 1024,
                    max_message_size=1024, compaction_mapped_file_size=40 * 1024,
                    compaction_cq_mapped_file_size=32 * 64, max_offset_map_size=24 * 1024,
                    delete_commit_log_files_interval=0)
    settings.update(extra)
    return StoreConfig(**settings)


def open_store(config: StoreConfig, policies=None, *, start: bool = False,
               read_only: bool = False) -> tuple[MessageStore, CompactionStore]:
    policies = policies or StaticPolicies({TOPIC: TopicPolicy(HOUR)})
    store = MessageStore(config, read_only=read_only)
    compaction = CompactionStore(config, policies, read_only=read_only).plug_into(store)
    store.open()
    if start:
        compaction.start()
    return store, compaction


def close(store: MessageStore, compaction: CompactionStore) -> None:
    store.close()
    compaction.close()


def put(store: MessageStore, key: str | None, value: bytes, queue_id: int = 0,
        topic: str = TOPIC, **props: str) -> int:
    properties = dict(props)
    if key is not None:
        properties["KEYS"] = key
    result = store.put_message(Message(topic, value, queue_id, properties))
    assert result.ok, result
    return result.queue_offset


def put_version(store: MessageStore, i: int, keys: int) -> None:
    """Message ``i`` of a mixed workload over ``keys`` keys and 2 queues: mostly a new value of
    key ``i % keys``, sometimes a keyless message or either kind of tombstone."""
    key, queue_id = f"k{i % keys}", i % 2
    if i % 17 == 0:
        put(store, None, b"no key %d" % i, queue_id)
    elif i % 23 == 0:
        put(store, key, b"", queue_id)  # tombstone: empty body
    elif i % 29 == 0:
        put(store, key, b"gone %d" % i, queue_id, TOMBSTONE="true")
    else:
        put(store, key, b"value %d of %s" % (i, key.encode()), queue_id)


def read_from(store: MessageStore, offset: int = 0, queue_id: int = 0, topic: str = TOPIC,
              batch: int = 32) -> list[StoredMessage]:
    """Every message from ``offset`` to the queue's end, following next_begin_offset."""
    assert store.wait_dispatched()
    end = store.get_max_offset_in_queue(topic, queue_id)
    out: list[StoredMessage] = []
    while offset < end:
        with store.get_messages("test", topic, queue_id, offset, batch) as got:
            out += list(got.messages())
            assert got.next_begin_offset > offset, (offset, got.status)
            offset = got.next_begin_offset
    return out


def as_table(messages: list[StoredMessage]) -> dict[str, bytes]:
    """What a consumer of a compaction topic builds: the latest value per key, deletes applied."""
    table: dict[str, bytes] = {}
    for msg in messages:
        key = msg.properties.get("KEYS")
        if key is None:
            continue
        if not msg.body or msg.properties.get("TOMBSTONE") == "true":
            table.pop(key, None)
        else:
            table[key] = msg.body
    return table


def compact(store: MessageStore, compaction: CompactionStore, **kwargs):
    """A round of every queue now, once everything put so far is dispatched."""
    assert store.wait_dispatched()
    return compaction.run_now(**kwargs)
