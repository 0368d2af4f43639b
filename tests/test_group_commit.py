"""SYNC_FLUSH's group commit answering puts by callback (``store/flush.py``), on a real store:
answered once their bytes are on disk, FLUSH_DISK_TIMEOUT when the flush is stuck (the put
stays stored), never answered twice; the broker's writer over it; and when the broker's loop
counts as saturated (the condition for a group commit to linger)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator

import pytest

from stratamq.broker.writer import GroupWriter, LoopLoad
from stratamq.config import FlushDiskType, StoreConfig
from stratamq.message import Message
from stratamq.store.flush import GroupCommitService, _answer_all
from stratamq.store.message_store import MessageStore
from stratamq.store.results import PutMessageResult, PutMessageStatus

SEGMENT = 1024 * 1024
ANSWER = 30  # seconds a test waits for an answer before it fails


def _store(tmp_path, **settings) -> MessageStore:
    cfg = StoreConfig(store_path_root_dir=str(tmp_path / "store"),
                      mapped_file_size_commit_log=SEGMENT,
                      flush_disk_type=FlushDiskType.SYNC_FLUSH, **settings)
    return MessageStore(cfg)


def _group_commit(store: MessageStore) -> GroupCommitService:
    flusher = store._flusher
    assert isinstance(flusher, GroupCommitService)
    return flusher


@contextlib.contextmanager
def _flush_stuck(store: MessageStore) -> Iterator[None]:
    """Stall the group commit's thread, as a disk stuck in ``fdatasync`` would: a flush
    observer (what the broker's metrics hang there) that blocks until the block ends. It is
    stalled, and no later flush has begun, once the block is entered."""
    entered, release = threading.Event(), threading.Event()

    def observe(_seconds: float) -> None:
        entered.set()
        release.wait(ANSWER)

    store.flush_observers.append(observe)
    try:
        assert entered.wait(ANSWER)
        yield
    finally:
        store.flush_observers.remove(observe)
        release.set()


class Answers:
    """Collects ``wait_put_later`` answers: the result and the thread that gave it."""

    def __init__(self) -> None:
        self.got: list[tuple[PutMessageStatus, str]] = []
        self.event = threading.Event()

    def done(self, result: PutMessageResult) -> None:
        self.got.append((result.status, threading.current_thread().name))
        self.event.set()

    def wait(self) -> tuple[PutMessageStatus, str]:
        assert self.event.wait(ANSWER), "no answer"
        return self.got[0]


def test_a_put_is_answered_by_the_flush_thread_once_its_bytes_are_on_disk(tmp_path):
    with _store(tmp_path).open() as store:
        store.put_message(Message("G", b"first"))  # the segment exists
        messages = [Message("G", b"m%d" % i) for i in range(5)]
        answers = Answers()
        with _flush_stuck(store):  # the answer cannot come before the request is made
            appended = store.put_messages(messages, wait=False)
            last = appended.messages[-1]
            end = last.physical_offset + last.size
            assert store.commitlog.files.flushed_where < end
            store.wait_put_later(appended, messages, answers.done)
        status, thread = answers.wait()
        assert status is PutMessageStatus.PUT_OK
        assert thread == "flush-group-commit"
        assert store.commitlog.files.flushed_where >= end
        # Nothing to wait for (every message said WAIT=false): answered here, at once.
        no_wait = [Message("G", b"x", properties={"WAIT": "false"})]
        quick = Answers()
        store.wait_put_later(store.put_messages(no_wait, wait=False), no_wait, quick.done)
        assert quick.got == [(PutMessageStatus.PUT_OK, threading.current_thread().name)]


def test_a_stuck_flush_answers_flush_disk_timeout_once_and_keeps_the_message(tmp_path):
    with _store(tmp_path, sync_flush_timeout=200).open() as store:
        store.put_message(Message("G", b"first"))
        answers = Answers()
        with _flush_stuck(store):
            messages = [Message("G", b"stuck")]
            appended = store.put_messages(messages, wait=False)
            store.wait_put_later(appended, messages, answers.done)
            status, thread = answers.wait()
            assert status is PutMessageStatus.FLUSH_DISK_TIMEOUT
            assert thread == "flush-disk-watcher"
            # A put that blocks (a put from a thread) times out the same way.
            blocked = store.put_message(Message("G", b"blocked"))
            assert blocked.status is PutMessageStatus.FLUSH_DISK_TIMEOUT
            assert blocked.messages  # written all the same
        # Once the disk moves again the flush goes through and later puts are answered OK;
        # the timed-out request is not answered a second time.
        after = store.put_message(Message("G", b"after"))
        assert after.status is PutMessageStatus.PUT_OK
        assert len(answers.got) == 1
        assert store.wait_dispatched()
        with store.get_messages("g", "G", 0, 0, max_count=10) as got:
            assert [m.body for m in got.messages()] == [b"first", b"stuck", b"blocked",
                                                         b"after"]


def test_the_broker_writer_is_answered_by_the_group_commit_without_its_thread(tmp_path):
    """Puts from a loop under SYNC_FLUSH: waited for by the group commit's callback (the
    writer thread takes no job), each answered with its own offsets; with the flush stuck,
    FLUSH_DISK_TIMEOUT (the proxy's MASTER_PERSISTENCE_TIMEOUT), the messages stored."""
    with _store(tmp_path, sync_flush_timeout=200).open() as store:
        assert store.put_waits_call_back
        writer = GroupWriter(store).start()
        jobs = []
        real_submit = writer._submit
        writer._submit = lambda job: jobs.append(job) or real_submit(job)  # type: ignore

        async def puts(count: int):
            return await asyncio.gather(*(
                asyncio.wait_for(writer.put_async([Message("W", b"%d-%d" % (i, j))
                                                   for j in range(3)]), ANSWER)
                for i in range(count)))

        try:
            outcomes = asyncio.run(puts(20))
            with _flush_stuck(store):
                late = asyncio.run(puts(2))
        finally:
            assert writer.close()
        assert jobs == []
        offsets = sorted(r.appended.queue_offset for rs in outcomes for r in rs)
        assert offsets == list(range(60)) and all(r.ok for rs in outcomes for r in rs)
        assert {r.status for rs in late for r in rs} == {PutMessageStatus.FLUSH_DISK_TIMEOUT}
        assert all(r.appended is not None for rs in late for r in rs)


def test_a_group_wakes_each_waiter_once_after_every_answer():
    """What the answers of one group hand back (a loop's wake-up) is called once per distinct
    one, after all the answers: a loop woken before would find the group half answered."""
    calls: list[str] = []

    class Loop:
        def wake(self) -> None:
            calls.append("wake")

    loop = Loop()

    def answer(name: str):
        def done(flushed: bool):
            calls.append(f"{name}:{flushed}")
            return loop.wake
        return done

    def broken(flushed: bool):
        raise RuntimeError("a waiter's bug")

    _answer_all([(answer("a"), True), (broken, True), (answer("b"), True),
                 (answer("c"), False)])
    assert calls == ["a:True", "b:True", "c:False", "wake"]


def test_a_loop_counts_as_saturated_only_while_busy_over_a_whole_window():
    clock = {"cpu": 0.0, "wall": 0.0}
    load = LoopLoad(cpu_clock=lambda: clock["cpu"], wall_clock=lambda: clock["wall"])
    window = LoopLoad.WINDOW

    def spend(wall: float, busy: float) -> bool:
        clock["wall"] += wall
        clock["cpu"] += wall * busy
        return load.saturated()

    assert not spend(2 * window, 0.5)
    assert spend(2 * window, 0.9)
    assert spend(window / 4, 0.0)  # within a window: the last verdict stands
    assert not spend(window, 0.1)  # the whole time since the last sample: mostly idle
    assert spend(10 * window, 0.95)


@pytest.mark.parametrize("linger", [False, True])
def test_a_put_that_finds_the_flush_idle_never_lingers(tmp_path, linger):
    """However long the linger, a put whose flush is not already under way is flushed at
    once (the ten-minute linger set here would make this test time out)."""
    with _store(tmp_path, sync_flush_group_linger=1_000).open() as store:
        _group_commit(store).linger = 600.0
        store.put_message(Message("L", b"first"))
        answers = Answers()
        messages = [Message("L", b"second")]
        store.wait_put_later(store.put_messages(messages, wait=False), messages,
                             answers.done, linger)
        assert answers.wait()[0] is PutMessageStatus.PUT_OK
