"""Bad input is refused where it enters, with an error naming what is wrong.

- Topic names at put time: a topic is a ConsumeQueue directory name, so one that is not a
  RocketMQ topic name (or is too long for a directory) must be refused before anything is
  written, not acknowledged and then left to break dispatch and every later open.
- ``config/topics.json`` and ``config/subscriptionGroup.json``: a malformed shape or a value
  the admin API would refuse stops ``broker start`` with one message naming the file, the entry
  and the key, and the file is left untouched.
- ``broker.conf``: every value outside its declared range stops ``broker start`` before it
  listens, naming the key, the value and the range.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stratamq import record as codec
from stratamq.broker.metadata import (
    MetadataError,
    MetadataStore,
    TopicConfig,
    check_name,
    check_topic_name,
    dlq_topic,
)
from stratamq.config import BrokerConfig, InvalidSetting, StoreConfig, load_broker_conf
from stratamq.message import Message
from stratamq.store.message_store import MessageStore, topic_name_problem
from stratamq.store.results import GetMessageStatus, PutMessageStatus

PROJECT = Path(__file__).resolve().parents[1]


def drain(store: MessageStore, topic: str, queue_id: int = 0) -> list[bytes]:
    bodies, offset = [], store.get_min_offset_in_queue(topic, queue_id)
    while True:
        with store.get_messages("g", topic, queue_id, offset, 64) as got:
            if got.status is not GetMessageStatus.FOUND:
                return bodies
            bodies.extend(m.body for m in got.messages())
            offset = got.next_begin_offset


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


# -- topic names at put time ---------------------------------------------------------------------

BAD_TOPICS = {
    "parent_path": ("../../escape", "'.', '/'"),
    "slash": ("a/b", "'/'"),
    "dot_dot": ("..", "'.'"),
    "dot": (".", "'.'"),
    "dotted": ("orders.v1", "'.'"),
    "space": ("a b", "' '"),
    "non_ascii": ("Tö", "'ö'"),
    "nul": ("a\x00b", "'\\x00'"),
    "empty": ("", "topic is empty"),
    "longer_than_a_directory_name": ("x" * 256, "256 bytes, longer than 255"),
    "the_qa_long_topic": ("x" * 300, "300 bytes, longer than 255"),
}


@pytest.mark.parametrize("topic, named", BAD_TOPICS.values(), ids=BAD_TOPICS.keys())
def test_put_refuses_a_topic_that_cannot_be_a_directory(tmp_path, small_config, topic, named):
    cfg = dataclasses.replace(small_config, store_path_root_dir=str(tmp_path / "deep" / "store"))
    with MessageStore(cfg).open() as store:
        result = store.put_message(Message(topic, b"refused", 0))
        assert result.status is PutMessageStatus.MESSAGE_ILLEGAL
        assert named in result.error
        assert not result.messages and store.max_physical_offset == 0
        # The store keeps serving: later puts are accepted and dispatched.
        assert store.put_message(Message("Normal", b"after", 0)).ok
        assert store.wait_dispatched()
        assert store.reput.error is None
    # Nothing beside the store, nothing in it but the one valid topic.
    assert tree(tmp_path / "deep") == {"store"} | {f"store/{p}" for p in tree(cfg.root)}
    assert sorted(os.listdir(cfg.root / "consumequeue")) == ["Normal"]
    with MessageStore(cfg).open() as store:  # and it opens read-write again
        assert drain(store, "Normal") == [b"after"]
        assert store.put_message(Message("Normal", b"reopened", 0)).queue_offset == 1


def test_a_refused_batch_writes_nothing(small_config):
    batch = [Message("Good", b"one", 0), Message("bad/topic", b"two", 0),
             Message("Good", b"three", 0)]
    with MessageStore(small_config).open() as store:
        result = store.put_messages(batch)
        assert result.status is PutMessageStatus.MESSAGE_ILLEGAL and "'/'" in result.error
        assert store.max_physical_offset == 0
        # No queue offset was taken by the refused batch either.
        assert store.put_message(Message("Good", b"four", 0)).queue_offset == 0
        store.wait_dispatched()
        assert drain(store, "Good") == [b"four"]


def test_topics_up_to_the_directory_limit_are_stored_as_message_version_2(small_config):
    longest = "L" * 255
    with MessageStore(small_config).open() as store:
        assert store.put_message(Message(longest, b"v2", 0)).ok
        assert store.put_message(Message("x" * 127, b"v1", 0)).ok
        store.wait_dispatched()
    with MessageStore(small_config).open() as store:  # reopens and replays fine
        with store.get_messages("g", longest, 0, 0) as got:
            (m,) = got.messages()
            assert m.magic_code == codec.MESSAGE_MAGIC_CODE_V2 and m.body == b"v2"
        with store.get_messages("g", "x" * 127, 0, 0) as got:
            assert next(iter(got.messages())).magic_code == codec.MESSAGE_MAGIC_CODE_V1


# Names Apache RocketMQ itself writes (system, retry and dead-letter topics, the reference
# store's topics) and the edge characters of its rule.
ROCKETMQ_TOPICS = [
    "BenchTopic0", "rmq_sys_wheel_timer", "rmq_sys_REVIVE_LOG_DefaultCluster",
    "SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC",
    "TRANS_CHECK_MAX_TIME_TOPIC", "TBW102", "%RETRY%billing", "%DLQ%billing",
    "DefaultCluster_REPLY_TOPIC", "broker-a", "a|b", "-_%|",
]  # fmt: skip


def test_rocketmq_and_system_topics_are_accepted(small_config):
    with MessageStore(small_config).open() as store:
        for topic in ROCKETMQ_TOPICS:
            assert store.put_message(Message(topic, topic.encode(), 1)).ok, topic
        store.wait_dispatched()
        assert all(drain(store, t, 1) == [t.encode()] for t in ROCKETMQ_TOPICS)


# Valid characters and the ones people try (path parts, blanks, dots, non-ASCII), so both
# accepted and refused names come up; lengths reach past the broker's 127.
NAME_TEXT = st.one_of(
    st.text(alphabet=st.sampled_from("aZ09_-%|./ :\x00\u00f6\u4e3b"), max_size=12),
    st.builds(lambda prefix, n, tail: prefix + "g" * n + tail,
              st.sampled_from(["", "%RETRY%", "%DLQ%", "../"]), st.integers(100, 140),
              st.sampled_from(["", ".", "|"])),
)


@settings(max_examples=300, deadline=None)
@given(NAME_TEXT)
def test_the_broker_accepts_no_topic_the_store_refuses(name):
    try:
        check_topic_name(name)
    except MetadataError:
        return
    assert topic_name_problem(name) is None


def test_dead_letter_topics_of_the_longest_group_names_are_created_and_stored(tmp_path):
    group = "g" * 127  # the longest group name the broker accepts
    check_name("group", group)
    meta = MetadataStore(tmp_path)
    cfg = meta.create_topic(dlq_topic(group), 1, exist_ok=True)
    assert cfg.name == "%DLQ%" + group and len(cfg.name) > 127
    assert topic_name_problem(cfg.name) is None
    with pytest.raises(MetadataError, match="must match"):
        meta.create_topic("t" * 128, 1)


# -- config/topics.json and config/subscriptionGroup.json ------------------------------------------


def broker_start(store: Path, *extra: str) -> subprocess.CompletedProcess:
    """``stratamq broker start`` as a real process (one that wrongly starts fails by timeout)."""
    return subprocess.run(
        [sys.executable, "-m", "stratamq.cli", "broker", "start", "--store", str(store),
         "--listen", "127.0.0.1:0", *extra],
        capture_output=True, text=True, timeout=120, cwd=PROJECT,
    )


def write_config(store: Path, name: str, content: str, *, with_bak: bool) -> Path:
    path = store / "config" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)
    if with_bak:
        path.with_name(name + ".bak").write_text("{}")
    return path


def topic(**fields) -> dict:
    return {"topicName": "X", "readQueueNums": 4, "writeQueueNums": 4, "perm": 6, **fields}


def table(entries: dict) -> str:
    return json.dumps({"dataVersion": {"counter": 1}, "topicConfigTable": entries})


def groups(entries: dict) -> str:
    return json.dumps({"subscriptionGroupTable": entries})


# (file, content, words the error must contain: the entry and the key where there is one)
BAD_CONFIG = {
    "topics_list": ("topics.json", "[]", ["JSON object", "list"]),
    "topics_null": ("topics.json", "null", ["JSON object", "null"]),
    "topics_truncated": ("topics.json", '{"topicConfigTable": {"X": {"topi',
                         ["cannot read"]),
    "table_not_an_object": ("topics.json", '{"topicConfigTable": 5}', ["'topicConfigTable'"]),
    "data_version_not_an_object": ("topics.json", '{"dataVersion": 5, "topicConfigTable": {}}',
                                   ["'dataVersion'"]),
    "entry_null": ("topics.json", table({"X": None}), ["entry 'X'", "object", "null"]),
    "entry_without_name": ("topics.json", table({"X": {"readQueueNums": 4}}),
                           ["entry 'X'", "'topicName'", "missing"]),
    "name_differs_from_key": ("topics.json", table({"X": topic(topicName="Y")}),
                              ["entry 'X'", "'topicName'", "'Y'"]),
    "queues_not_a_number": ("topics.json", table({"X": topic(readQueueNums="abc")}),
                            ["entry 'X'", "'readQueueNums'", "'abc'"]),
    "queues_negative": ("topics.json", table({"X": topic(readQueueNums=-1)}),
                        ["entry 'X'", "'readQueueNums'", "1..1024", "-1"]),
    "queues_too_many": ("topics.json", table({"X": topic(writeQueueNums=100000)}),
                        ["entry 'X'", "'writeQueueNums'", "1..1024", "100000"]),
    "perm_out_of_range": ("topics.json", table({"X": topic(perm=99)}),
                          ["entry 'X'", "'perm'", "0..15"]),
    "name_is_a_path": ("topics.json", table({"a b/..": topic(topicName="a b/..")}),
                       ["entry 'a b/..'", "'topicName'", "must match"]),
    "unknown_message_type": ("topics.json",
                             table({"X": topic(attributes={"message.type": "BOGUS"})}),
                             ["entry 'X'", "message.type", "'BOGUS'"]),
    "groups_list": ("subscriptionGroup.json", "[]", ["JSON object", "list"]),
    "group_table_not_an_object": ("subscriptionGroup.json", '{"subscriptionGroupTable": 5}',
                                  ["'subscriptionGroupTable'"]),
    "group_without_name": ("subscriptionGroup.json", groups({"G": {"retryMaxTimes": 1}}),
                           ["entry 'G'", "'groupName'", "missing"]),
    "retry_times_not_a_number": ("subscriptionGroup.json",
                                 groups({"G": {"groupName": "G", "retryMaxTimes": "x"}}),
                                 ["entry 'G'", "'retryMaxTimes'", "'x'"]),
    "retry_times_negative": ("subscriptionGroup.json",
                             groups({"G": {"groupName": "G", "retryMaxTimes": -5}}),
                             ["entry 'G'", "'retryMaxTimes'", "0..1000", "-5"]),
    "backoff_not_positive": ("subscriptionGroup.json", groups({"G": {
        "groupName": "G", "groupRetryPolicy": {"customizedRetryPolicy": {"next": [1000, 0]}}}}),
                             ["entry 'G'", "customizedRetryPolicy.next"]),
}


@pytest.mark.parametrize("name, content, words", BAD_CONFIG.values(), ids=BAD_CONFIG.keys())
def test_broker_start_refuses_a_bad_config_file_and_leaves_it_alone(tmp_path, name, content,
                                                                    words):
    store = tmp_path / "store"
    path = write_config(store, name, content, with_bak=False)
    proc = broker_start(store)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "listening" not in proc.stdout and "Traceback" not in proc.stderr
    error = proc.stderr
    assert str(path) in error, error
    for word in words:
        assert word in error, (word, error)
    # No .bak exists, so the error must not send the user to one.
    assert ".bak" not in error
    assert path.read_text() == content
    assert not path.with_name(name + ".bak").exists()


def test_a_bad_config_file_error_points_to_the_bak_only_when_there_is_one(tmp_path):
    store = tmp_path / "store"
    path = write_config(store, "topics.json", "{not json", with_bak=True)
    proc = broker_start(store)
    assert proc.returncode == 1
    assert f"the previous version is in {path}.bak" in proc.stderr
    assert path.read_text() == "{not json"


def test_rocketmq_written_metadata_loads(tmp_path):
    """What a RocketMQ broker leaves in topics.json (system, retry and DLQ topics, broker and
    cluster topics, mixed read/write queue counts) and subscriptionGroup.json loads as is."""
    names = ["TBW102", "SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC", "rmq_sys_wheel_timer",
             "%RETRY%" + "g" * 127, "%DLQ%billing", "DefaultCluster", "broker-a", "Orders"]
    topics = {n: {"topicName": n, "readQueueNums": 16, "writeQueueNums": 8, "perm": 7,
                  "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0, "order": False,
                  "attributes": {}} for n in names}  # fmt: skip
    topics["Orders"]["attributes"] = {"+message.type": "FIFO"}
    group = {"groupName": "billing", "consumeEnable": True, "retryMaxTimes": 3,
             "groupRetryPolicy": {"type": "EXPONENTIAL", "exponentialRetryPolicy": {
                 "initial": 1000, "max": 7200000, "multiplier": 2}},
             "attributes": {}}  # fmt: skip
    write_config(tmp_path, "topics.json", table(topics), with_bak=False)
    write_config(tmp_path, "subscriptionGroup.json", groups({"billing": group}), with_bak=False)
    meta = MetadataStore(tmp_path)
    assert sorted(t.name for t in meta.topics(include_system=True)) == sorted(names)
    assert meta.topic("Orders") == TopicConfig("Orders", 16, 8, 7, "FIFO")
    assert meta.group("billing").retry_max_times == 3


# -- broker.conf ranges ----------------------------------------------------------------------------

BAD_SETTINGS = {
    "mappedFileSizeCommitLog=0": "4096..2147483647",
    "mappedFileSizeCommitLog=-5": "4096..2147483647",
    "mappedFileSizeConsumeQueue=0": "20..",
    "maxMessageSize=-1": "1..1073741824",
    "maxMessageSize=0": "1..1073741824",
    "maxHashSlotNum=0": "1..2147483647",
    "maxIndexNum=-1": "1..2147483647",
    "fileReservedTime=-3": "0..2147483647",
    "deleteWhen=99": "0..23",
    "brokerName=": "must not be empty",
    "listenPort=70000": "0..65535",
    "diskMaxUsedSpaceRatio=150": "1..99",
    "defaultTopicQueueNums=0": "1..1024",
    "retryMaxTimes=-5": "0..1000",
    "flushIntervalCommitLog=0": "1..2147483647",
    "brokerIP1=my-host": "IPv4 or IPv6 address",
    "storeType=rocks": "default|defaultRocksDB",
}


@pytest.mark.parametrize("line, allowed", BAD_SETTINGS.items(), ids=BAD_SETTINGS.keys())
def test_broker_start_refuses_an_out_of_range_setting_before_listening(tmp_path, line, allowed):
    conf = tmp_path / "broker.conf"
    conf.write_text(f"# bad value below\n{line}\n")
    proc = broker_start(tmp_path / "store", "--config", str(conf))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "listening" not in proc.stdout and "Traceback" not in proc.stderr
    key, value = line.split("=", 1)
    assert str(conf) in proc.stderr and f"{key}=" in proc.stderr and value in proc.stderr
    assert allowed in proc.stderr, proc.stderr
    assert not (tmp_path / "store").exists()  # refused before the store was opened


def test_settings_are_checked_however_a_config_is_built(tmp_path):
    with pytest.raises(InvalidSetting, match=r"maxIndexNum=-1 is out of range: must be 1\.\."):
        StoreConfig(max_index_num=-1)
    with pytest.raises(InvalidSetting, match="mappedFileSizeCommitLog=0"):
        dataclasses.replace(StoreConfig(), mapped_file_size_commit_log=0)
    with pytest.raises(InvalidSetting, match="mappedFileSizeCommitLog='big'"):
        MessageStore(store_path_root_dir=str(tmp_path), mapped_file_size_commit_log="big")
    with pytest.raises(InvalidSetting, match="maxHashSlotNum=.* and maxIndexNum=.*index file"):
        StoreConfig(max_index_num=200_000_000)
    with pytest.raises(InvalidSetting, match="minInvisibleTimeMillsForRecv=.*maxInvisibleTime"):
        BrokerConfig(min_invisible_time_mills_for_recv=10, max_invisible_time_mills=5)
    with pytest.raises(InvalidSetting, match="flushDiskType='SOMETIMES'"):
        StoreConfig(flush_disk_type="SOMETIMES")
    assert StoreConfig(flush_disk_type="SYNC_FLUSH").flush_disk_type.value == "SYNC_FLUSH"
    assert not (tmp_path / "commitlog").exists()


def test_the_small_sizes_tests_and_tools_use_are_in_range():
    StoreConfig(mapped_file_size_commit_log=8192, mapped_file_size_consume_queue=16 * 20,
                max_hash_slot_num=16, max_index_num=20, delete_commit_log_files_interval=0,
                destroy_mapped_file_interval_forcibly=0, clean_resource_interval=20)
    store_cfg, broker_cfg, unknown = load_broker_conf(text=(
        "deleteWhen=03;15\nminInvisibleTimeMillsForRecv=1000\nlistenPort=0\n"
        "tls.server.need.client.auth=REQUIRE\nbrokerIP1=::1\n"))
    assert store_cfg.delete_when == "03;15" and store_cfg.broker_ip == "::1" and not unknown
    assert broker_cfg.min_invisible_time_mills_for_recv == 1000


def test_every_numeric_setting_declares_its_range():
    for cls in (StoreConfig, BrokerConfig):
        for f in dataclasses.fields(cls):
            if type(f.default) is int:
                assert f.metadata["minimum"] is not None, f.metadata["key"]
                assert f.metadata["minimum"] <= f.default <= f.metadata["maximum"]


@pytest.mark.parametrize("name", ["NL\n", "NL\r\n", "\nNL", "N L"])
def test_names_must_match_whole_not_up_to_a_trailing_newline(tmp_path, name):
    """``^...$`` with re.match accepts "NL\\n"; such a name once made a second topic beside
    "NL" and a directory whose name ends in a newline."""
    with pytest.raises(MetadataError):
        check_topic_name(name)
    with pytest.raises(MetadataError):
        check_name("group", name)
    assert topic_name_problem(name) is not None
    with MessageStore(StoreConfig(store_path_root_dir=str(tmp_path / "s"))).open() as store:
        result = store.put_message(Message(name, b"x"))
        assert result.status == PutMessageStatus.MESSAGE_ILLEGAL
        assert "contains" in result.error
    assert not (tmp_path / "s" / "consumequeue").exists() or not any(
        (tmp_path / "s" / "consumequeue").iterdir())
