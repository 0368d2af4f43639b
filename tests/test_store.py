"""The embedded store's behaviour: rollover, statuses, filters, transactions, concurrency."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections import defaultdict

import pytest

from stratamq import record as codec
from stratamq.config import FlushDiskType, StoreConfig
from stratamq.record import Message, SysFlag
from stratamq.store.layout import parse_segment_name
from stratamq.store.message_store import MessageStore, StoreLocked
from stratamq.store.results import GetMessageStatus, PutMessageStatus


def msg(topic="T", body=b"x", queue_id=0, tags=None, keys=None, **kw) -> Message:
    props = {}
    if tags:
        props["TAGS"] = tags
    if keys:
        props["KEYS"] = keys
    return Message(topic, body, queue_id, props, **kw)


def drain(store, topic, queue_id, tag_filter=None) -> list[codec.StoredMessage]:
    out, offset = [], store.get_min_offset_in_queue(topic, queue_id)
    while True:
        with store.get_messages("g", topic, queue_id, offset, 64, tag_filter=tag_filter) as got:
            if got.status not in (GetMessageStatus.FOUND, GetMessageStatus.NO_MATCHED_MESSAGE):
                return out
            out.extend(got.messages())
            offset = got.next_begin_offset


def test_rollover_ends_each_segment_with_a_blank_record(small_config):
    bodies = [bytes([i % 251]) * (300 + i % 700) for i in range(600)]
    with MessageStore(small_config).open() as store:
        for i, body in enumerate(bodies):
            assert store.put_message(msg(body=body, queue_id=i % 3)).ok
        assert store.wait_dispatched()
        segments = store.commitlog.files.files
        assert len(segments) > 5
        for mf in segments[:-1]:
            assert parse_segment_name(mf.path.name) == mf.file_from_offset
            assert mf.file_from_offset % (64 * 1024) == 0
            pos = 0
            while True:
                size, magic = codec.read_size_and_magic(mf.buffer, pos)
                if magic == codec.BLANK_MAGIC_CODE:
                    assert pos + size == mf.file_size  # the blank fills the tail exactly
                    assert size >= codec.END_FILE_MIN_BLANK_LENGTH
                    break
                pos += size
    with MessageStore(small_config).open() as store:
        got = [m.body for q in range(3) for m in drain(store, "T", q)]
        assert sorted(got) == sorted(bodies)
        for q in range(3):
            assert [m.body for m in drain(store, "T", q)] == bodies[q::3]


def test_get_statuses_and_offsets(small_config):
    with MessageStore(small_config).open() as store:
        got = store.get_messages("g", "Nope", 0, 0)
        assert got.status is GetMessageStatus.NO_MATCHED_LOGIC_QUEUE
        for i in range(10):
            r = store.put_message(msg(body=b"m%d" % i, tags="A" if i % 2 else "B"))
            assert r.ok and r.queue_offset == i
        store.wait_dispatched()
        assert (store.get_min_offset_in_queue("T", 0), store.get_max_offset_in_queue("T", 0)) == (
            0, 10)
        with store.get_messages("g", "T", 0, 3, max_count=4) as got:
            assert got.status is GetMessageStatus.FOUND
            assert [m.body for m in got.messages()] == [b"m3", b"m4", b"m5", b"m6"]
            assert got.next_begin_offset == 7
            assert (got.min_offset, got.max_offset) == (0, 10)
        got = store.get_messages("g", "T", 0, 10)
        assert (got.status, got.next_begin_offset) == (GetMessageStatus.OFFSET_OVERFLOW_ONE, 10)
        got = store.get_messages("g", "T", 0, 50)
        assert got.status is GetMessageStatus.OFFSET_OVERFLOW_BADLY
        assert got.next_begin_offset == 0  # min is 0: RocketMQ points back at the start
        with store.get_messages("g", "T", 0, 0, tag_filter="A") as got:
            assert [m.body for m in got.messages()] == [b"m1", b"m3", b"m5", b"m7", b"m9"]
            assert got.next_begin_offset == 10
        with store.get_messages("g", "T", 0, 0, tag_filter="C || D") as got:
            assert got.status is GetMessageStatus.NO_MATCHED_MESSAGE
            assert got.next_begin_offset == 10  # skipped past what cannot match
        with store.get_messages("g", "T", 0, 0, tag_filter="A || B") as got:
            assert len(got.records) == 10
        # max_bytes caps a read but always returns at least one message.
        one = store.get_messages("g", "T", 0, 0, max_count=10, max_bytes=1)
        assert len(one.records) == 1 and one.next_begin_offset == 1
        one.release()


def test_offset_too_small_after_the_head_of_the_log_is_gone(small_config):
    with MessageStore(small_config).open() as store:
        for _ in range(400):
            assert store.put_message(msg(body=bytes(500), queue_id=0)).ok
    commitlog = small_config.root / "commitlog"
    first = sorted(commitlog.iterdir())[0]
    first.unlink()  # what retention does (issue 3); the queue must not serve garbage
    with MessageStore(small_config).open() as store:
        low = store.get_min_offset_in_queue("T", 0)
        assert low > 0
        got = store.get_messages("g", "T", 0, 0)
        assert (got.status, got.next_begin_offset) == (GetMessageStatus.OFFSET_TOO_SMALL, low)
        with store.get_messages("g", "T", 0, low, max_count=1) as got:
            (m,) = list(got.messages())
            assert m.queue_offset == low and m.physical_offset >= 64 * 1024


def test_prepared_and_rolled_back_transactions_are_not_consumable(small_config):
    with MessageStore(small_config).open() as store:
        store.put_message(msg(body=b"prepared", sys_flag=SysFlag.TRANSACTION_PREPARED_TYPE))
        store.put_message(msg(body=b"rollback", sys_flag=SysFlag.TRANSACTION_ROLLBACK_TYPE))
        store.put_message(msg(body=b"committed", sys_flag=SysFlag.TRANSACTION_COMMIT_TYPE))
        store.put_message(msg(body=b"plain"))
        store.wait_dispatched()
        assert [m.body for m in drain(store, "T", 0)] == [b"committed", b"plain"]


def test_msg_id_finds_the_message(small_config):
    with MessageStore(small_config).open() as store:
        ids = [store.put_message(msg(body=b"n%d" % i)).msg_id for i in range(5)]
        host, offset = codec.parse_offset_msg_id(ids[3])
        assert host == small_config.store_host
        assert store.look_message_by_offset(offset).body == b"n3"
        assert store.look_message_by_offset(offset + 1) is None


def test_long_topic_uses_message_version_2(small_config):
    topic = "t" * 200
    with MessageStore(small_config).open() as store:
        assert store.put_message(msg(topic=topic, body=b"long")).ok
        store.wait_dispatched()
        (m,) = drain(store, topic, 0)
        assert m.magic_code == codec.MESSAGE_MAGIC_CODE_V2 and m.body == b"long"


def test_batch_put_assigns_consecutive_offsets_across_queues(small_config):
    batch = [msg(body=b"b%d" % i, queue_id=i % 2) for i in range(50)]
    with MessageStore(small_config).open() as store:
        store.put_message(msg(body=b"first", queue_id=1))
        result = store.put_messages(batch)
        assert result.ok and len(result.messages) == 50
        assert [a.queue_offset for a in result.messages[:4]] == [0, 1, 1, 2]
        offsets = [a.physical_offset for a in result.messages]
        assert offsets == sorted(offsets)
        store.wait_dispatched()
        assert [m.body for m in drain(store, "T", 1)] == [b"first"] + [b"b%d" % i
                                                                      for i in range(1, 50, 2)]


def test_concurrent_writers_lose_and_duplicate_nothing(small_config):
    writers, per_writer = 4, 500
    acks = defaultdict(list)

    def write(w: int) -> None:
        for i in range(per_writer):
            q = i % 2
            body = b"w%d-%d" % (w, i)
            r = store.put_message(msg(body=body, queue_id=q))
            assert r.ok
            acks[w].append((q, r.queue_offset, body))

    with MessageStore(small_config).open() as store:
        threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        store.wait_dispatched()
        by_queue = {q: drain(store, "T", q) for q in range(2)}
    for messages in by_queue.values():
        assert [m.queue_offset for m in messages] == list(range(len(messages)))
    stored = {(q, m.queue_offset): m.body for q, ms in by_queue.items() for m in ms}
    assert len(stored) == writers * per_writer
    for entries in acks.values():
        for q, offset, body in entries:
            assert stored[(q, offset)] == body
        for q in range(2):
            mine = [o for qq, o, _ in entries if qq == q]
            assert mine == sorted(mine)  # one writer's messages keep their order


def test_sync_flush_puts_are_on_disk_when_acknowledged(small_config):
    config = StoreConfig(**{**vars(small_config), "flush_disk_type": FlushDiskType.SYNC_FLUSH})
    with MessageStore(config).open() as store:
        for i in range(50):
            r = store.put_message(msg(body=b"s%d" % i))
            assert r.status is PutMessageStatus.PUT_OK
            end = r.physical_offset + r.messages[0].size
            assert store.commitlog.files.flushed_where >= end
        r = store.put_messages([msg(body=b"batch%d" % i) for i in range(20)])
        last = r.messages[-1]
        assert store.commitlog.files.flushed_where >= last.physical_offset + last.size


def test_a_second_process_cannot_open_the_store(small_config):
    with MessageStore(small_config).open():
        code = (
            "import sys\n"
            "from stratamq.config import StoreConfig\n"
            "from stratamq.store.message_store import MessageStore, StoreLocked\n"
            f"cfg = StoreConfig(store_path_root_dir={str(small_config.root)!r})\n"
            "try:\n"
            "    MessageStore(cfg).open()\n"
            "except StoreLocked as e:\n"
            "    print('locked:', e); sys.exit(3)\n"
        )
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 3, proc.stderr
        assert "open in another process" in proc.stdout
        with pytest.raises(StoreLocked):
            MessageStore(small_config).open()  # also within one process


def test_closed_or_read_only_store_refuses_puts(small_config):
    store = MessageStore(small_config).open()
    store.put_message(msg())
    store.close()
    assert store.put_message(msg()).status is PutMessageStatus.SERVICE_NOT_AVAILABLE
    with MessageStore(small_config, read_only=True).open() as ro:
        r = ro.put_message(msg())
        assert r.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
        assert len(drain(ro, "T", 0)) == 1


def test_refusals_write_nothing(small_config):
    with MessageStore(small_config).open() as store:
        before = store.max_physical_offset
        too_big = store.put_message(msg(body=bytes(small_config.max_message_size + 1)))
        assert too_big.status is PutMessageStatus.MESSAGE_ILLEGAL
        assert "maxMessageSize" in too_big.error
        no_fit = store.put_message(msg(body=bytes(70 * 1024)))  # bigger than a 64 KiB segment
        assert no_fit.status is PutMessageStatus.MESSAGE_ILLEGAL
        props = store.put_message(Message("T", b"x", properties={"K": "v" * 40_000}))
        assert props.status is PutMessageStatus.PROPERTIES_SIZE_EXCEEDED
        assert store.max_physical_offset == before
        assert store.put_message(msg(body=b"fine")).ok


def test_prepared_messages_take_no_queue_offset(small_config):
    with MessageStore(small_config).open() as store:
        a = store.put_message(msg(body=b"a"))
        p = store.put_message(msg(body=b"p", sys_flag=SysFlag.TRANSACTION_PREPARED_TYPE))
        b = store.put_message(msg(body=b"b"))
        assert (a.queue_offset, p.queue_offset, b.queue_offset) == (0, 0, 1)
        store.wait_dispatched()
    with MessageStore(small_config).open() as store:
        assert store.get_max_offset_in_queue("T", 0) == 2
        assert [m.body for m in drain(store, "T", 0)] == [b"a", b"b"]


def _cq_file(config, topic="T", queue_id=0):
    return config.root / "consumequeue" / topic / str(queue_id) / ("0" * 20)


def test_a_blank_unit_inside_a_queue_hides_nothing(small_config):
    from stratamq.store.consume_queue_format import BLANK_UNIT

    with MessageStore(small_config).open() as store:
        for i in range(3):
            store.put_message(msg(body=b"m%d" % i))
    path = _cq_file(small_config)
    data = bytearray(path.read_bytes())
    data[20:40] = BLANK_UNIT  # a filler left in the middle (e.g. by an older writer)
    path.write_bytes(bytes(data))
    with MessageStore(small_config).open() as store:
        assert store.get_min_offset_in_queue("T", 0) == 0
        assert [m.body for m in drain(store, "T", 0)] == [b"m0", b"m2"]


@pytest.mark.parametrize("read_only", [True, False])
@pytest.mark.parametrize("unit_3", [bytes(20), b"\xff" * 20], ids=["never-written", "torn"])
def test_stale_units_behind_the_end_do_not_break_opening(small_config, read_only, unit_3):
    with MessageStore(small_config).open() as store:
        for i in range(5):
            store.put_message(msg(body=b"m%d" % i))
    path = _cq_file(small_config)
    data = bytearray(path.read_bytes())
    # Unit 3 never written (zeros) or torn (a negative offset), unit 4 left over: RocketMQ
    # leaves such tails, and recovery ends the queue at the first such unit.
    data[60:80] = unit_3
    path.write_bytes(bytes(data))
    with MessageStore(small_config, read_only=read_only).open() as store:
        got = [m.body for m in drain(store, "T", 0)]
        # A writable open re-dispatches units 3 and 4 from the CommitLog; a read-only one
        # stops at the end the ConsumeQueue shows.
        assert got == ([b"m0", b"m1", b"m2"] if read_only else [b"m%d" % i for i in range(5)])


def test_a_store_holding_a_record_no_directory_can_take_still_opens(tmp_path, small_config,
                                                                     caplog):
    """Records an older StrataMQ acknowledged (before puts checked topic names) whose topic
    cannot be a directory: dispatch skips them, naming the record, and the store opens."""
    import dataclasses
    import logging

    cfg = dataclasses.replace(small_config, store_path_root_dir=str(tmp_path / "d" / "store"))
    with MessageStore(cfg).open() as store:
        store.reput.shutdown()  # write the records the way an unchecked put path did
        store.commitlog.append([Message("x" * 300, b"long", 0), Message("../../escape", b"e", 0),
                                Message("Normal", b"ok", 0)])
    caplog.set_level(logging.ERROR)
    with MessageStore(cfg).open() as store:
        assert store.reput.skipped == 2
        assert store.put_message(Message("Normal", b"after", 0)).ok
        assert store.wait_dispatched() and store.reput.error is None
        with store.get_messages("g", "Normal", 0, 0) as got:
            assert [m.body for m in got.messages()] == [b"ok", b"after"]
    assert "x" * 80 in caplog.text and "CommitLog offset 0" in caplog.text
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["store"]  # nothing escaped
    with MessageStore(cfg).open() as store:  # and again, with nothing left to skip
        assert store.reput.error is None


def test_a_dispatcher_that_dies_wakes_its_waiters(tmp_path, python_exe):
    # A queue's directory cannot be created (a file stands where its topic's directory goes):
    # dispatch stops with an error that names the record and the cause, and wait_dispatched
    # returns False at once rather than at its (here ten-minute) timeout. (This test once ran
    # the process out of descriptors; a new ConsumeQueue file no longer keeps one.) New
    # queues' files are created by the flush thread (consume_queue_pending.py): the error
    # comes from there, within a flush interval, and stops dispatch the same way.
    script = f"""
import time
from stratamq.config import StoreConfig
from stratamq.message import Message
from stratamq.store.message_store import MessageStore
cfg = StoreConfig(store_path_root_dir={str(tmp_path / "store")!r},
                  mapped_file_size_commit_log=64 * 1024, mapped_file_size_consume_queue=2000)
with MessageStore(cfg).open() as store:
    store.layout.consumequeue_dir.mkdir(parents=True, exist_ok=True)
    (store.layout.consumequeue_dir / "T").write_bytes(b"not a directory")
    assert store.put_messages([Message("T", b"x", q, {{}}) for q in range(200)]).ok
    deadline = time.monotonic() + 60
    while store.reput.error is None and time.monotonic() < deadline:
        store.wait_dispatched(0.1)
    print("caught up:", store.wait_dispatched(600))
    print("error:", store.reput.error)
    print("put after:", store.put_messages([Message("T", b"y", 0, {{}})]).status.value)
"""
    done = subprocess.run([python_exe, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert "caught up: False" in done.stdout, done.stdout + done.stderr[-2000:]
    assert "Not a directory" in done.stdout and "CommitLog offset" in done.stdout
