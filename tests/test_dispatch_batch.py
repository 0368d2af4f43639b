"""A dispatch round's run of records handed to each dispatcher at once (``dispatch_batch``)
must leave the ConsumeQueue and index files byte for byte as dispatching record by record
(``dispatch``) does: random rounds of puts over several topics and queues, with and without
KEYS, into a live store, then the same CommitLog dispatched again record by record into a
fresh ConsumeQueue store and index."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stratamq.config import StoreConfig
from stratamq.message import DispatchInfo, Message, Prop
from stratamq.record import SysFlag
from stratamq.store.consume_queue_file_store import FileConsumeQueueStore
from stratamq.store.dispatch import ReputService
from stratamq.store.index_service import IndexService
from stratamq.store.layout import StoreLayout
from stratamq.store.message_store import MessageStore

CQ_FILE = 10 * 20  # ten units a file: rounds cross ConsumeQueue files
SLOTS, ENTRIES = 13, 4000  # few slots: keys of a round share them


class RecordByRecord:
    """A dispatcher without ``dispatch_batch``: the reput service then goes record by
    record."""

    def __init__(self, inner: FileConsumeQueueStore | IndexService) -> None:
        self.inner = inner

    def dispatch(self, info) -> None:
        self.inner.dispatch(info)

    def commit_dispatch(self) -> None:
        self.inner.commit_dispatch()


def _files(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes()
            for p in sorted(directory.rglob("*")) if p.is_file()}


_message = st.tuples(st.sampled_from(["A", "B", "Topic-C"]), st.integers(0, 2),
                     st.sampled_from([None, "k1", "k1 k2", " k3  k1 "]), st.booleans())


@settings(max_examples=20, deadline=None)
@given(st.lists(st.lists(_message, min_size=1, max_size=24), min_size=1, max_size=8))
def test_batched_dispatch_writes_the_files_of_record_by_record_dispatch(
        tmp_path_factory, batch_runs, rounds):
    root = tmp_path_factory.mktemp("store")
    cfg = StoreConfig(store_path_root_dir=str(root), mapped_file_size_commit_log=1024 * 1024,
                      mapped_file_size_consume_queue=CQ_FILE, max_hash_slot_num=SLOTS,
                      max_index_num=ENTRIES)
    n = 0
    with MessageStore(cfg).open() as store:
        for round_ in rounds:
            batch = []
            for topic, queue_id, keys, uniq in round_:
                props = {Prop.UNIQ_KEY: f"ID{n:030X}"} if uniq else {}
                if keys is not None:
                    props[Prop.KEYS] = keys
                batch.append(Message(topic, b"body-%d" % n, queue_id=queue_id,
                                     properties=props))
                n += 1
            assert store.put_messages(batch).ok
            assert store.reput.wait_caught_up(10)
        files = store.commitlog.files
        end = files.max_offset()
        other = tmp_path_factory.mktemp("again")
        layout = StoreLayout(other)
        cq = FileConsumeQueueStore(layout, CQ_FILE)
        index = IndexService(other / "index", SLOTS, ENTRIES)
        again = ReputService(files, [RecordByRecord(cq), RecordByRecord(index)], 0)
        assert again.replay(end) == n
        cq.close()
        index.close()
    assert batch_runs, "the live store never took the batched path"
    assert _files(root / "consumequeue") == _files(other / "consumequeue")
    live_index = list(_files(root / "index").values())
    assert live_index == list(_files(other / "index").values()) and len(live_index) <= 1


@pytest.fixture(scope="module")
def batch_runs():
    """Records the runs the live store's ConsumeQueue store took through ``dispatch_batch``."""
    runs: list[int] = []
    original = FileConsumeQueueStore.dispatch_batch

    def counting(self, infos, failed):
        runs.append(len(infos))
        return original(self, infos, failed)

    FileConsumeQueueStore.dispatch_batch = counting  # type: ignore[method-assign]
    try:
        yield runs
    finally:
        FileConsumeQueueStore.dispatch_batch = original  # type: ignore[method-assign]


def _put_units(store: FileConsumeQueueStore, infos) -> None:
    """The reference: each record's unit written on its own (``put_unit``), no staging."""
    for info in infos:
        if info.sys_flag & SysFlag.TRANSACTION_PREPARED_TYPE:
            continue
        store.find_or_create(info.topic, info.queue_id).put_unit(
            info.queue_offset, info.physical_offset, info.size, info.tags_code)


_step = st.one_of(
    st.tuples(st.just("batch"), st.lists(st.tuples(st.integers(0, 2), st.booleans()),
                                         min_size=1, max_size=30)),
    st.tuples(st.just("dispatch"), st.lists(st.tuples(st.integers(0, 2), st.booleans()),
                                            min_size=1, max_size=5)),
    st.tuples(st.just("replay"), st.integers(1, 20)),
    st.tuples(st.just("cut"), st.floats(0.0, 1.0)),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(_step, min_size=1, max_size=25), st.lists(st.sampled_from([0, 3, 12]),
                                                          min_size=3, max_size=3))
def test_staged_units_land_where_units_written_one_by_one_do(tmp_path_factory, steps, starts):
    """A queue's staging cursor lives across rounds; whatever else writes or cuts its units
    (a record dispatched on its own, a replay, a cut back) must leave the files as writing
    every unit on its own would: rounds of runs (``dispatch_batch``), single records
    (``dispatch``), replays of records already in and cuts (``truncate_dirty``), over queues
    that start at 0 or part-way into a file, with prepared records in between."""
    staged_root = tmp_path_factory.mktemp("staged")
    plain_root = tmp_path_factory.mktemp("plain")
    staged = FileConsumeQueueStore(StoreLayout(staged_root), CQ_FILE)
    plain = FileConsumeQueueStore(StoreLayout(plain_root), CQ_FILE)
    history: list[DispatchInfo] = []
    next_offset = dict(enumerate(starts))
    position = 0

    def new_records(picks) -> list[DispatchInfo]:
        nonlocal position
        out = []
        for queue_id, prepared in picks:
            size = 40 + (position % 7) * 10
            flag = SysFlag.TRANSACTION_PREPARED_TYPE if prepared and queue_id == 1 else 0
            offset = 0 if flag else next_offset[queue_id]
            if not flag:
                next_offset[queue_id] += 1
            out.append(DispatchInfo("T", queue_id, offset, position, size, queue_id * 7,
                                    1000 + position, flag, {}))
            position += size
        history.extend(out)
        return out

    for kind, arg in steps:
        if kind == "batch":
            infos = new_records(arg)
            staged.dispatch_batch(infos, lambda info, exc: pytest.fail(str(exc)))
        elif kind == "dispatch":
            infos = new_records(arg)
            for info in infos:
                staged.dispatch(info)
        elif kind == "replay":
            infos = history[-arg:]
            staged.dispatch_batch(infos, lambda info, exc: pytest.fail(str(exc)))
        else:
            staged.commit_dispatch()
            end = int(position * arg)
            staged.truncate_dirty(end)
            plain.truncate_dirty(end)
            history = [i for i in history if i.physical_offset + i.size <= end]
            position = max((i.physical_offset + i.size for i in history), default=0)
            for queue_id in next_offset:
                queue = plain.find("T", queue_id)
                if queue is not None and queue.max_offset() > 0:
                    next_offset[queue_id] = queue.max_offset()
            continue
        _put_units(plain, infos)
        staged.commit_dispatch()
    staged.close()
    plain.close()
    assert _files(staged_root / "consumequeue") == _files(plain_root / "consumequeue")
