"""Tier drivers (memory, POSIX, object store through fsspec/s3fs against a real S3 server on
loopback): append-only segments, ranged reads, and commits that survive a backend outage
without a duplicate or a gap."""

from __future__ import annotations

import os

import pytest
from s3_server import S3Server

from stratamq.config import StoreConfig
from stratamq.tiered.drivers import FileSegmentFactory
from stratamq.tiered.drivers.object_store import list_parts
from stratamq.tiered.naming import FileSegmentType


@pytest.fixture(scope="module")
def s3():
    server = S3Server().start()
    yield server
    server.stop()


def _factory(kind: str, tmp_path, s3=None) -> FileSegmentFactory:
    if kind == "memory":
        cfg = StoreConfig(tiered_backend_service_provider="memory",
                          tiered_store_file_path=str(tmp_path))
    elif kind == "posix":
        cfg = StoreConfig(tiered_backend_service_provider="posix",
                          tiered_store_file_path=str(tmp_path / "tier"))
    else:
        bucket = s3.new_bucket(s3.filesystem())
        cfg = StoreConfig(tiered_backend_service_provider="s3",
                          tiered_store_file_path=f"s3://{bucket}/prefix",
                          tiered_store_s3_endpoint=s3.endpoint)
    return FileSegmentFactory(cfg, "DefaultCluster")


@pytest.mark.parametrize("kind", ["memory", "posix", "s3"])
def test_append_commit_read_across_commits(kind, tmp_path, s3):
    factory = _factory(kind, tmp_path, s3)
    seg = factory.create_segment(FileSegmentType.COMMIT_LOG, "broker-a/T/0", 1000)
    assert seg.get_size() == 0 and not seg.exists()
    chunks = [bytes([i]) * (100 + i) for i in range(5)]
    for i, chunk in enumerate(chunks[:3]):
        assert seg.append(chunk, 1_000 + i).name == "SUCCESS"
    assert seg.commit_position == 0 and seg.append_position == 303
    with pytest.raises(OSError):
        seg.read(0, 10)  # nothing committed yet: nothing readable
    assert seg.commit()
    for chunk in chunks[3:]:
        seg.append(chunk, 2_000)
    assert seg.commit()
    data = b"".join(chunks)
    assert seg.get_size() == len(data) and seg.commit_offset == 1000 + len(data)
    # A range that spans two uploads (two objects on S3) reads back whole.
    assert seg.read(250, 200) == data[250:450]
    assert seg.read(len(data) - 5, 100) == data[-5:]  # clipped to what is committed
    assert (seg.min_timestamp, seg.max_timestamp) == (1_000, 2_000)
    # The layout of seed 000: hash-prefixed cluster, the queue, the type, a hash-prefixed name.
    assert "/212d6b50_DefaultCluster/broker-a/T/0/COMMIT_LOG/a9b7ba7000000000000000001000" \
        in seg.path
    again = factory.create_segment(FileSegmentType.COMMIT_LOG, "broker-a/T/0", 1000)
    again.init_position(again.get_size())
    assert again.read(0, len(data)) == data
    seg.destroy_file()
    assert again.get_size() == 0


@pytest.mark.parametrize("kind", ["memory", "posix", "s3"])
def test_a_full_segment_refuses_more(kind, tmp_path, s3):
    factory = _factory(kind, tmp_path, s3)
    factory.limits.commit_log_max_size = 250
    seg = factory.create_segment(FileSegmentType.COMMIT_LOG, "broker-a/T/0", 0)
    assert seg.append(b"a" * 200, 1).name == "SUCCESS"
    assert seg.append(b"b" * 51, 1).name == "FILE_FULL"
    assert seg.append_position == 200


def test_posix_torn_tail_is_cut_and_rewritten(tmp_path):
    """A write cut short leaves a prefix: the next commit writes the same bytes again at the
    same place (no duplicate), and a torn tail found later can be truncated."""
    factory = _factory("posix", tmp_path)
    seg = factory.create_segment(FileSegmentType.COMMIT_LOG, "broker-a/T/0", 0)
    seg.append(b"A" * 100, 1)
    assert seg.commit()
    seg.append(b"B" * 100, 2)
    # The bytes of an interrupted upload: half of them reached the file.
    with open(seg.path, "ab") as f:
        f.write(b"B" * 50)
    seg._inflight, seg._buffers = b"B" * 100, []  # what the interrupted commit was writing
    assert seg.commit()
    with open(seg.path, "rb") as f:
        assert f.read() == b"A" * 100 + b"B" * 100
    seg.truncate(100)
    assert os.path.getsize(seg.path) == 100


def test_s3_outage_mid_upload_no_duplicate_no_gap(tmp_path):
    """The S3 server goes away between uploads and during one: commits fail, nothing is
    lost, and once it is back the file holds every byte exactly once. A put that reached the
    server although the client saw an error is recognised from the listing, not repeated."""
    server = S3Server().start()
    try:
        factory = _factory("s3", tmp_path, server)
        seg = factory.create_segment(FileSegmentType.COMMIT_LOG, "broker-a/T/0", 0)
        seg.append(b"1" * 1000, 1)
        assert seg.commit()
        server.stop()
        seg.append(b"2" * 1000, 2)
        assert not seg.commit()  # the server is down: the bytes wait
        seg.append(b"3" * 1000, 3)  # more arrive meanwhile
        assert not seg.commit()
        server.start()
        assert seg.commit()  # the failed batch first, exactly as it was
        assert seg.commit()  # then what arrived after it
        fs = server.filesystem()
        assert [p for p, _ in list_parts(fs, seg.path)] == [0, 1000, 2000]
        assert fs.cat_file(f"{seg.path}/{0:020d}") == b"1" * 1000
        assert seg.read(0, 3000) == b"1" * 1000 + b"2" * 1000 + b"3" * 1000

        # A lost reply: the put lands, the client sees a failure.
        server.stop()
        seg.append(b"4" * 500, 4)
        assert not seg.commit()
        server.start()
        fs.pipe_file(f"{seg.path}/{3000:020d}", b"4" * 500)  # what the server had received
        assert seg.commit()
        assert seg.commit_position == 3500
        assert [p for p, _ in list_parts(fs, seg.path)] == [0, 1000, 2000, 3000]
        assert seg.read(2990, 20) == b"3" * 10 + b"4" * 10
    finally:
        server.stop()


def test_s3_file_changed_behind_the_broker_is_not_written(tmp_path, s3):
    """A file shorter than what was committed (someone deleted parts) is never written over:
    the commit fails every time and says why."""
    factory = _factory("s3", tmp_path, s3)
    seg = factory.create_segment(FileSegmentType.CONSUME_QUEUE, "broker-a/T/0", 0)
    seg.append(b"x" * 40, 1)
    assert seg.commit()
    s3.filesystem().rm(seg.path, recursive=True)
    seg._inflight = b"y" * 20  # a commit that failed, to be retried
    seg.append(b"z" * 20, 2)
    assert not seg.commit() and not seg.commit()
    # Why, for the uploader to log once per change of state (TierHealth), not per attempt.
    assert seg.last_error is not None and "changed outside this broker" in seg.last_error
    assert list_parts(s3.filesystem(), seg.path) == []
