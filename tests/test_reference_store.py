"""Ground truth: the store Apache RocketMQ 5.3 wrote (tests/data) read and re-written."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import REFERENCE_MESSAGES, reference_body

from stratamq import record as codec
from stratamq.config import StoreConfig
from stratamq.message import Host, Message
from stratamq.store.layout import parse_segment_name
from stratamq.store.message_store import MessageStore
from stratamq.store.results import GetMessageStatus


def expected_position(i: int) -> tuple[str, int, int]:
    """(topic, queue id, queue offset) of reference message i."""
    return f"BenchTopic{i % 4}", (i // 4) % 4, i // 16


def read_all(store: MessageStore) -> dict[tuple[str, int, int], codec.StoredMessage]:
    out = {}
    for topic, queue_ids in store.topics().items():
        for qid in queue_ids:
            offset = store.get_min_offset_in_queue(topic, qid)
            while True:
                with store.get_messages("test", topic, qid, offset, max_count=100) as result:
                    if result.status is not GetMessageStatus.FOUND:
                        assert result.status is GetMessageStatus.OFFSET_OVERFLOW_ONE
                        break
                    for record in result.records:
                        msg = record.decode()
                        assert msg.queue_offset == record.queue_offset
                        out[(topic, qid, msg.queue_offset)] = msg
                    offset = result.next_begin_offset
    return out


@pytest.mark.parametrize("read_only", [True, False])
def test_every_reference_message_is_served(reference_copy, read_only):
    config = StoreConfig(store_path_root_dir=str(reference_copy))  # default sizes: 1 GiB, 300k
    with MessageStore(config, read_only=read_only).open() as store:
        # Opened with the sizes found on disk, not the configured defaults.
        assert store.commitlog.files.mapped_file_size == 1024 * 1024
        assert store.consume_queues.find("BenchTopic0", 0).file_size == 20_000
        assert store.recovery.abnormal is False
        messages = read_all(store)
        assert len(messages) == REFERENCE_MESSAGES
        for i in range(REFERENCE_MESSAGES):
            topic, qid, qoff = expected_position(i)
            msg = messages[(topic, qid, qoff)]
            assert msg.body == reference_body(i)
            assert msg.keys == [f"key-{i}"]
            assert msg.tags == "TagA"
            assert msg.properties["CLUSTER"] == "DefaultCluster"
            assert msg.born_host == Host("127.0.0.1", 50000)
            assert msg.store_host == Host("127.0.0.1", 10911)
            assert store.look_message_by_offset(msg.physical_offset).body == msg.body
        first = messages[("BenchTopic0", 0, 0)]
        assert first.total_size == 1246 and first.physical_offset == 0
        assert first.magic_code == codec.MESSAGE_MAGIC_CODE_V1
        for qid in range(4):
            assert store.get_max_offset_in_queue("BenchTopic3", qid) == REFERENCE_MESSAGES // 16


def test_reference_opens_read_only_without_changing_a_byte(reference_store):
    before = {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in reference_store.rglob("*")}
    with MessageStore(StoreConfig(store_path_root_dir=str(reference_store)),
                      read_only=True).open() as store:
        assert len(store.topics()) == 4
    after = {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in reference_store.rglob("*")}
    assert before == after


def test_appending_to_the_reference_store_continues_its_queues(reference_copy):
    config = StoreConfig(store_path_root_dir=str(reference_copy))
    with MessageStore(config).open() as store:
        result = store.put_message(Message("BenchTopic0", b"after rocketmq", 0,
                                           {"TAGS": "TagB", "KEYS": "new"}))
        assert result.ok
        assert result.queue_offset == 1250  # RocketMQ wrote offsets 0..1249 in this queue
        assert result.physical_offset == 25008498  # the end RocketMQ left
    with MessageStore(config).open() as store:
        assert store.recovery.abnormal is False
        with store.get_messages("g", "BenchTopic0", 0, 1250) as got:
            (msg,) = list(got.messages())
        assert msg.body == b"after rocketmq" and msg.tags == "TagB"
        assert len(read_all(store)) == REFERENCE_MESSAGES + 1


def test_strata_writes_the_same_bytes_rocketmq_wrote(reference_store, tmp_path):
    """Re-put the reference's 20,000 messages (same fields, same segment sizes): every
    ConsumeQueue file comes out byte-identical and every CommitLog record differs only in its
    store timestamp - so RocketMQ can read what StrataMQ writes."""
    with MessageStore(StoreConfig(store_path_root_dir=str(reference_store)),
                      read_only=True).open() as ref:
        originals = read_all(ref)
    ordered = [originals[expected_position(i)] for i in range(REFERENCE_MESSAGES)]
    ours = tmp_path / "ours"
    config = StoreConfig(store_path_root_dir=str(ours), mapped_file_size_commit_log=1024 * 1024,
                         mapped_file_size_consume_queue=20_000, listen_port=10911)
    with MessageStore(config).open() as store:
        for m in ordered:
            result = store.put_message(Message(
                m.topic, m.body, m.queue_id, dict(m.properties), flag=m.flag,
                sys_flag=m.sys_flag, born_timestamp=m.born_timestamp, born_host=m.born_host,
            ))
            assert result.ok
            assert result.physical_offset == m.physical_offset
            assert result.queue_offset == m.queue_offset

    def files(root: Path, sub: str) -> dict[str, Path]:
        return {str(p.relative_to(root)): p for p in (root / sub).rglob("*") if p.is_file()}

    ref_cq, our_cq = files(reference_store, "consumequeue"), files(ours, "consumequeue")
    assert sorted(ref_cq) == sorted(our_cq)
    for name, path in ref_cq.items():
        assert path.read_bytes() == our_cq[name].read_bytes(), name

    ref_log, our_log = files(reference_store, "commitlog"), files(ours, "commitlog")
    assert sorted(ref_log) == sorted(our_log)
    for name, path in ref_log.items():
        assert parse_segment_name(os.path.basename(name)) is not None
        theirs, mine = path.read_bytes(), our_log[name].read_bytes()
        assert len(theirs) == len(mine)
        pos = 0
        while pos + 8 <= len(theirs):
            size, magic = codec.read_size_and_magic(theirs, pos)
            if size == 0:
                break
            assert codec.read_size_and_magic(mine, pos) == (size, magic), (name, pos)
            if magic == codec.BLANK_MAGIC_CODE:
                break  # RocketMQ leaves whatever was in its buffer after the blank's header
            ts_pos = pos + 56  # store timestamp (IPv4 born host)
            assert theirs[pos:ts_pos] == mine[pos:ts_pos], (name, pos)
            assert theirs[ts_pos + 8 : pos + size] == mine[ts_pos + 8 : pos + size], (name, pos)
            pos += size
