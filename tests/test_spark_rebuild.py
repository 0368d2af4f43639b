"""``rebuild``: ConsumeQueues (files, RocksDB) and the index rebuilt by Spark equal what the
store's own dispatcher builds from the same CommitLog, byte for byte / row for row.

The reference is made by the store itself: a copy of the store without its derived files is
opened by ``MessageStore``, whose dispatcher replays the whole CommitLog into new ones.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest_spark import spark_session  # noqa: F401  (the shared `spark` fixture)

from stratamq import record as codec
from stratamq.config import StoreConfig
from stratamq.message import Message
from stratamq.record import SysFlag
from stratamq.spark.pipelines.common import PipelineError
from stratamq.spark.pipelines.rebuild import run_rebuild
from stratamq.store.consume_queue_store import (
    STORE_TYPE_FILES,
    STORE_TYPE_ROCKSDB,
    read_store_type,
)
from stratamq.store.message_store import MessageStore
from stratamq.store.rocksdb_cq_format import OFFSET_CF, rocksdb_options

SEGMENT = 64 * 1024
DERIVED = ("consumequeue", "index", "rocksdb")
SMALL = {"split_bytes": 32 * 1024, "partition_bytes": 8 * 1024}  # many tasks, many ranges


def _config(root: Path, store_type: str = STORE_TYPE_FILES) -> StoreConfig:
    # Small geometry: ConsumeQueue files of 100 units, index files of 199 entries and 61
    # slots, so a few thousand messages span many files of each kind.
    return StoreConfig(store_path_root_dir=str(root), mapped_file_size_commit_log=SEGMENT,
                       mapped_file_size_consume_queue=100 * 20, max_hash_slot_num=61,
                       max_index_num=200, store_type=store_type)


def _fill(root: Path, store_type: str) -> None:
    """Messages of five topics (tags, keys with spaces and empty words, no keys, non-ASCII
    keys), prepared and rolled-back transactional records, and a deleted topic whose name
    is used again afterwards."""
    with MessageStore(_config(root, store_type)).open() as store:
        for i in range(0, 2400, 8):
            batch = []
            for j in range(i, i + 8):
                props = {"TAGS": ["TagA", "TagB", "é"][j % 3]} if j % 4 else {}
                if j % 3 == 0:
                    props["KEYS"] = f"key-{j}  other-{j} ü{j}" if j % 9 == 0 else f"key-{j}"
                if j % 5 == 0:
                    props["UNIQ_KEY"] = f"7F00000100002A9F0000{j:012X}"
                batch.append(Message(f"Topic{j % 5}", b"b" * (j % 300), j % 3, props))
            assert store.put_messages(batch).ok
            if i == 800:
                assert store.put_message(Message("Topic1", b"prepared", 0, {"KEYS": "tx"},
                                                 sys_flag=SysFlag.TRANSACTION_PREPARED_TYPE)).ok
                assert store.put_message(Message("Topic1", b"rollback", 0, {"KEYS": "rb"},
                                                 sys_flag=SysFlag.TRANSACTION_ROLLBACK_TYPE)).ok
            if i == 1600:
                assert store.wait_dispatched(30)
                store.delete_topic("Topic4")
        assert store.wait_dispatched(30)


def _copy_without_derived(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    for name in DERIVED:
        shutil.rmtree(dst / name, ignore_errors=True)
    return dst


def _dispatcher_built(src: Path, dst: Path, store_type: str) -> Path:
    """What the store's dispatcher builds from ``src``'s CommitLog alone."""
    _copy_without_derived(src, dst)
    with MessageStore(_config(dst, store_type)).open() as store:
        assert store.wait_dispatched(30)
    return dst


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def _index_files(root: Path) -> list[bytes]:
    """Index file contents in file order (names are creation times, so they differ)."""
    return [p.read_bytes() for p in sorted((root / "index").iterdir())]


def _rocksdb_rows(root: Path) -> tuple[list, list]:
    from rocksdict import AccessType, Rdict

    db = Rdict(str(root / "rocksdb" / "consumequeue"), options=rocksdb_options(),
               access_type=AccessType.read_only(),
               column_families={OFFSET_CF: rocksdb_options()})
    try:
        return list(db.items()), list(db.get_column_family(OFFSET_CF).items())
    finally:
        db.close()


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> dict[str, Path]:
    """One store per ConsumeQueue type, written by MessageStore; then the CommitLog's first
    segment is deleted as retention would, so queues start past offset 0 (blank head units)."""
    base = tmp_path_factory.mktemp("rebuild")
    out = {}
    for store_type in (STORE_TYPE_FILES, STORE_TYPE_ROCKSDB):
        root = base / store_type
        _fill(root, store_type)
        first = min((root / "commitlog").iterdir())
        first.unlink()
        out[store_type] = root
    return out


def test_files_and_index_equal_the_dispatchers_byte_for_byte(spark, stores, tmp_path):
    src = stores[STORE_TYPE_FILES]
    expected = _dispatcher_built(src, tmp_path / "expected", STORE_TYPE_FILES)
    rebuilt = _copy_without_derived(src, tmp_path / "rebuilt")

    summary = run_rebuild(spark, str(rebuilt), "all", config=_config(rebuilt), progress=False,
                          **SMALL)

    want = _files(expected / "consumequeue")
    assert len(want) > 20  # 15 queues, most of several files
    assert _files(rebuilt / "consumequeue") == want
    assert _index_files(rebuilt) == _index_files(expected)
    assert summary["index_files"] == len(_index_files(expected)) > 3
    assert summary["splits"] > 3 and summary["stages"]["write consumequeue"]["rows"] > 1000
    assert not (rebuilt / "spark-rebuild").exists()
    # The rebuilt store opens and serves what the original served (Topic4 was deleted).
    with MessageStore(_config(rebuilt), read_only=True).open() as store:
        assert sorted(store.consume_queues.topics()) == ["Topic0", "Topic1", "Topic2",
                                                          "Topic3", "Topic4"]
        topic4 = store.consume_queues.find("Topic4", 0)
        assert topic4.min_offset() == 0  # the new generation only, from offset 0
        got = store.get_messages("g", "Topic4", 0, 0, 1000)
        assert got.status.name == "FOUND"
        assert len(list(got.messages())) == topic4.max_offset() > 0
        got.release()


def test_rocksdb_consume_queue_equals_the_dispatchers_row_for_row(spark, stores, tmp_path):
    src = stores[STORE_TYPE_ROCKSDB]
    expected = _dispatcher_built(src, tmp_path / "expected", STORE_TYPE_ROCKSDB)
    rebuilt = _copy_without_derived(src, tmp_path / "rebuilt")

    run_rebuild(spark, str(rebuilt), "cq", STORE_TYPE_ROCKSDB, config=_config(rebuilt),
                progress=False, **SMALL)

    units, offsets = _rocksdb_rows(rebuilt)
    want_units, want_offsets = _rocksdb_rows(expected)
    assert len(units) > 1500
    assert units == want_units
    assert offsets == want_offsets  # min/max rows, the checkpoint and the expiry watermark
    assert read_store_type(rebuilt) == STORE_TYPE_ROCKSDB
    assert not (rebuilt / "index").exists()  # --what cq leaves the index alone


def test_files_store_moves_to_rocksdb(spark, stores, tmp_path):
    """A files store rebuilt as RocksDB records the new type and answers like the files."""
    from stratamq.store.consume_queue_store import compare_stores

    rebuilt = tmp_path / "rebuilt"
    shutil.copytree(stores[STORE_TYPE_FILES], rebuilt)
    run_rebuild(spark, str(rebuilt), "cq", STORE_TYPE_ROCKSDB, config=_config(rebuilt),
                progress=False, **SMALL)
    assert read_store_type(rebuilt) == STORE_TYPE_ROCKSDB
    with (MessageStore(_config(rebuilt, STORE_TYPE_ROCKSDB), read_only=True).open() as rocks,
          MessageStore(_config(rebuilt, STORE_TYPE_FILES), read_only=True,
                       force_store_type=True).open() as files):
        check = compare_stores(files.consume_queues, rocks.consume_queues)
    assert check["same"], check["problems"]
    assert check["units"] > 1500


def test_a_locked_store_is_refused_and_left_alone(spark, stores, tmp_path):
    root = tmp_path / "busy"
    shutil.copytree(stores[STORE_TYPE_FILES], root)
    before = _files(root / "consumequeue")
    with MessageStore(_config(root)).open(), pytest.raises(PipelineError, match="open in "
                                                            "another process"):
        run_rebuild(spark, str(root), "all", config=_config(root), progress=False)
    assert _files(root / "consumequeue") == before


def test_damage_fails_naming_the_record_and_leaves_the_store_as_it_was(spark, stores,
                                                                        tmp_path):
    root = tmp_path / "damaged"
    shutil.copytree(stores[STORE_TYPE_FILES], root)
    before = _files(root / "consumequeue") | {"index": b"".join(_index_files(root))}
    segment = sorted((root / "commitlog").iterdir())[1]
    data = bytearray(segment.read_bytes())
    at = int(codec.walk_records(bytes(data), 0, len(data), len(data)).positions[10])
    data[at:at + 4] = (7).to_bytes(4, "big")  # the 11th record's size: no longer a record
    segment.write_bytes(bytes(data))

    with pytest.raises(PipelineError) as failed:
        run_rebuild(spark, str(root), "all", config=_config(root), progress=False, **SMALL)
    text = str(failed.value)
    assert "the store is unchanged" in text and segment.name in text
    assert str(int(segment.name) + at) in text  # the CommitLog offset of the damage
    assert "org.apache" not in text and "Traceback" not in text
    after = _files(root / "consumequeue") | {"index": b"".join(_index_files(root))}
    assert after == before
    assert not (root / "spark-rebuild").exists()
