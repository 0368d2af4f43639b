"""The ``stratamq`` source on damaged or half-written store directories: it reads every whole
record, never a torn one, and fails (or, with failOnDataLoss=false, warns) naming the CommitLog
offset and file instead of silently returning fewer rows.

Most cases run the source's own planning and split reading (what a Spark task runs) on real
files damaged here; the last ones go through the shared local Spark to show the user's error."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
from conftest_spark import spark_session  # noqa: F401  (the shared `spark` fixture)
from damage import patch, records

from stratamq import record as codec
from stratamq.config import StoreConfig
from stratamq.record import Host, Message, SysFlag
from stratamq.spark import planning
from stratamq.spark.export import check_export_target, run_export
from stratamq.spark.planning import QueueSplit
from stratamq.spark.reading import DataLoss, read_log_split, read_queue_split
from stratamq.store.message_store import MessageStore

SEGMENT = 64 * 1024


def config(root: Path) -> StoreConfig:
    return StoreConfig(store_path_root_dir=str(root), mapped_file_size_commit_log=SEGMENT,
                       mapped_file_size_consume_queue=100 * 20)


def messages(start: int, count: int, topic: str = "A") -> list[Message]:
    return [Message(topic, b"m-%d|" % i * 9, i % 2, {"KEYS": f"k{i}"})
            for i in range(start, start + count)]


def store_with(root: Path, count: int) -> StoreConfig:
    cfg = config(root)
    with MessageStore(cfg).open() as store:
        assert store.put_messages(messages(0, count)).ok
        store.wait_dispatched()
    return cfg


def whole_read(root: Path, fail_on_data_loss: bool = True) -> list[dict]:
    """A whole-store read as the source plans and runs it (all splits, in this process)."""
    catalog = planning.Catalog.load(str(root))
    low, end = planning.commitlog_bounds(str(root))
    splits = planning.log_splits(str(root), catalog, low, end, 3,
                                 fail_on_data_loss=fail_on_data_loss)
    return [row for s in splits for b in read_log_split(s) for row in b.to_pylist()]


def queue_read(root: Path, queue_id: int, end: int, fail: bool = True) -> list[dict]:
    split = QueueSplit(str(root), "A", queue_id, 0, end, fail)
    return [row for b in read_queue_split(split) for row in b.to_pylist()]


# -- a write under way, and the segment created ahead of it ------------------------------------


def test_a_half_written_record_is_not_read_even_with_the_next_segment_created(tmp_path):
    root = tmp_path / "store"
    cfg = store_with(root, 300)
    seg, pos, size = records(root)[-1]
    write_pos = pos + size
    data, _, ts_pos = codec.encode_record(Message("A", b"B" * 400, 0, {"KEYS": "torn"}),
                                          Host("127.0.0.1", 10911), 4 * 1024 * 1024)
    buf = bytearray(data)
    codec.stamp(buf, 0, 150, int(seg.name) + write_pos, int(time.time() * 1000), ts_pos)
    patch(seg, write_pos, bytes(buf[: len(buf) * 6 // 10]))  # what reached the page cache
    # The store creates the next segment before it needs it: zeros, no record.
    nxt = root / "commitlog" / f"{int(seg.name) + cfg.mapped_file_size_commit_log:020d}"
    nxt.write_bytes(bytes(cfg.mapped_file_size_commit_log))
    (root / "commitlog" / f"{int(nxt.name) + SEGMENT:020d}").write_bytes(b"")  # an empty file

    assert planning.commitlog_bounds(str(root))[1] == int(seg.name) + write_pos
    rows = whole_read(root)
    assert len(rows) == 300 and all(r["keys"] != "torn" for r in rows)


# -- damage inside the last segment ----------------------------------------------------------


@pytest.mark.parametrize("what", ["size", "body"])
def test_damage_in_the_last_segment_fails_naming_the_offset(tmp_path, what):
    root = tmp_path / "store"
    store_with(root, 2000)
    recs = records(root)
    last_seg = recs[-1][0]
    in_last = [r for r in recs if r[0] == last_seg]
    seg, pos, _ = in_last[len(in_last) // 2] if what == "size" else in_last[-10]
    if what == "size":
        patch(seg, pos + 1, b"\x7f")  # an impossible total size
    else:
        data = seg.read_bytes()
        body_at = data.index(b"m-", pos)  # bodies are b"m-<i>|" repeated
        patch(seg, body_at + 1, b"#")  # one body byte: only the CRC says so
    with pytest.raises(codec.RecordCorrupt) as err:
        whole_read(root)
    assert f"corrupt record at {int(seg.name) + pos}" in str(err.value)
    assert seg.name in str(err.value)


def test_zeros_where_records_were_fail_naming_the_offset(tmp_path):
    root = tmp_path / "store"
    store_with(root, 2000)
    seg, pos, size = records(root)[100]  # not in the last segment
    patch(seg, pos, bytes(size * 3))  # a lost write: three records' worth of zeros
    with pytest.raises(codec.RecordCorrupt) as err:
        whole_read(root)
    assert f"corrupt record at {int(seg.name) + pos}" in str(err.value)
    assert "zero bytes" in str(err.value)


@pytest.fixture
def small_tail(monkeypatch):
    """The end of the last segment found from a walk of only its last few records' bytes (a
    64 KiB test segment is otherwise all inside the window)."""
    from stratamq.spark import reading

    monkeypatch.setattr(reading, "TAIL_WINDOW", 2048)
    monkeypatch.setattr(reading, "TAIL_CRC_RECORDS", 4)


def test_the_tail_walk_finds_the_end_a_whole_walk_finds(tmp_path, small_tail):
    root = tmp_path / "store"
    store_with(root, 2000)
    seg, pos, size = records(root)[-1]
    assert pos > 8 * 2048  # the last segment holds far more than the window
    assert planning.commitlog_bounds(str(root))[1] == int(seg.name) + pos + size
    assert len(whole_read(root)) == 2000
    # A torn last record (the body not all there): the end is before it.
    patch(seg, pos + size - 30, bytes(30))
    assert planning.commitlog_bounds(str(root))[1] == int(seg.name) + pos
    assert len(whole_read(root)) == 1999


def test_damage_before_the_tail_window_fails_the_read_naming_the_offset(tmp_path, small_tail):
    root = tmp_path / "store"
    store_with(root, 2000)
    in_last = [r for r in records(root) if r[0] == records(root)[-1][0]]
    seg, pos, size = in_last[len(in_last) // 4]  # far before the window
    patch(seg, pos, bytes(size * 2))  # a lost write: zeros where two records were
    with pytest.raises(codec.RecordCorrupt) as err:
        whole_read(root)
    assert f"corrupt record at {int(seg.name) + pos}" in str(err.value)
    assert "zero bytes" in str(err.value) and seg.name in str(err.value)


# -- segments that are gone ---------------------------------------------------------------------


def test_a_segment_missing_from_the_middle_is_data_loss(tmp_path, caplog):
    root = tmp_path / "store"
    store_with(root, 2000)
    segs = sorted((root / "commitlog").iterdir())
    assert len(segs) >= 4
    gone = segs[1]
    gone.unlink()
    with pytest.raises(DataLoss) as err:
        whole_read(root)
    assert gone.name in str(err.value) and "failOnDataLoss=false" in str(err.value)
    caplog.set_level(logging.WARNING)
    rows = whole_read(root, fail_on_data_loss=False)
    kept = sum(1 for seg, _, _ in records(root))
    assert len(rows) == kept < 2000 and gone.name in caplog.text


def test_a_segment_deleted_after_planning(tmp_path, caplog):
    root = tmp_path / "store"
    store_with(root, 2000)
    catalog = planning.Catalog.load(str(root))
    low, end = planning.commitlog_bounds(str(root))
    plans = {fail: planning.log_splits(str(root), catalog, low, end, 1, fail_on_data_loss=fail)
             for fail in (True, False)}
    first = sorted((root / "commitlog").iterdir())[0]
    lost = sum(1 for seg, _, _ in records(root) if seg == first)
    first.unlink()  # retention ran between planning and the task
    with pytest.raises(DataLoss, match="failOnDataLoss=false"):
        [b for s in plans[True] for b in read_log_split(s)]
    caplog.set_level(logging.WARNING)
    rows = sum(b.num_rows for s in plans[False] for b in read_log_split(s))
    assert rows == 2000 - lost and first.name in caplog.text


def test_a_store_whose_commitlog_is_empty_but_whose_queues_are_not(tmp_path, caplog):
    root = tmp_path / "store"
    store_with(root, 50)
    for seg in (root / "commitlog").iterdir():
        seg.unlink()
    with pytest.raises(DataLoss, match="the CommitLog has no segments"):
        queue_read(root, 0, 25)
    caplog.set_level(logging.WARNING)
    assert queue_read(root, 0, 25, fail=False) == []
    assert whole_read(root) == []


# -- damage found through a ConsumeQueue, and bodies that do not inflate --------------------


def test_topic_reads_name_the_commitlog_offset_file_and_queue(tmp_path):
    root = tmp_path / "store"
    store_with(root, 600)
    recs = records(root)
    seg, pos, _ = next(r for r in recs if int(r[0].name) > 0)  # in a later segment
    queue_id = codec.decode(seg.read_bytes(), pos).queue_id
    patch(seg, pos + 1, b"\x7f")  # its total size: impossible
    with pytest.raises(codec.RecordCorrupt) as err:
        queue_read(root, queue_id, 300)
    text = str(err.value)
    assert f"at {int(seg.name) + pos}" in text and seg.name in text
    assert f"A/{queue_id}" in text


def test_a_compressed_body_that_does_not_inflate(tmp_path):
    root = tmp_path / "store"
    cfg = config(root)
    with MessageStore(cfg).open() as store:
        assert store.put_messages(messages(0, 5)).ok
        store.wait_dispatched()
    seg, pos, _ = records(root)[2]
    flag_at = pos + codec.SYS_FLAG_POS
    flag = int.from_bytes(seg.read_bytes()[flag_at:flag_at + 4], "big")
    patch(seg, flag_at, (flag | SysFlag.COMPRESSED).to_bytes(4, "big"))  # a body that is not
    with pytest.raises(codec.RecordCorrupt) as err:
        whole_read(root)
    assert f"corrupt record at {int(seg.name) + pos}" in str(err.value)
    assert "does not inflate" in str(err.value)


# -- the export pipeline ------------------------------------------------------------------------


def test_export_refuses_an_output_another_checkpoint_wrote(spark, tmp_path):
    root = tmp_path / "store"
    store_with(root, 40)
    out = tmp_path / "out"
    first = run_export(spark, {"path": str(root)}, str(out),
                       checkpoint=str(tmp_path / "ck1"), progress=False)
    assert first["exported"] == 40
    # A second query with a new checkpoint: Spark's file sink would skip its first batch and
    # the checkpoint would record those messages as exported. Refused, naming both flags.
    with pytest.raises(ValueError, match="--out .* --checkpoint"):
        run_export(spark, {"path": str(root)}, str(out), checkpoint=str(tmp_path / "ck2"),
                   progress=False)
    check_export_target(str(out), str(tmp_path / "ck1"))  # its own checkpoint: fine
    with pytest.raises(ValueError):  # a file: URI is the same directory
        check_export_target(f"file://{out}", str(tmp_path / "ck2"))


def test_the_user_sees_the_offset_through_spark(spark, tmp_path):
    root = tmp_path / "store"
    store_with(root, 2000)
    seg, pos, _ = [r for r in records(root) if r[0] == records(root)[-1][0]][5]
    patch(seg, pos + 1, b"\x7f")
    with pytest.raises(Exception) as err:
        spark.read.format("stratamq").load(str(root)).count()
    assert f"corrupt record at {int(seg.name) + pos}" in str(err.value)
