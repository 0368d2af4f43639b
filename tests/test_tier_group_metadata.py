"""The group's copy of the tier metadata (controller mode, ``tiered/group_metadata.py``) on a
real POSIX directory and a real S3-compatible server (moto_server): a publish of a lower epoch
than the stored copy's is refused and counted, whatever the order the writers come in; and
object-store parts of a group's tier are never replaced by other bytes."""

from __future__ import annotations

import json
import threading

import pytest
from s3_server import S3Server

from stratamq.config import StoreConfig
from stratamq.tiered.drivers import FileSegmentFactory, TierIOError
from stratamq.tiered.group_metadata import GroupTierMetadata, adopt_group, writer
from stratamq.tiered.naming import METADATA_FILE, FileSegmentType


@pytest.fixture(scope="module")
def s3():
    server = S3Server().start()
    yield server
    server.stop()


def config(tmp_path, provider: str, s3: S3Server | None = None) -> StoreConfig:
    if provider == "posix":
        return StoreConfig(store_path_root_dir=str(tmp_path / "store"),
                           tiered_backend_service_provider="posix",
                           tiered_store_file_path=str(tmp_path / "tier"))
    assert s3 is not None
    bucket = s3.new_bucket(s3.filesystem())
    return StoreConfig(store_path_root_dir=str(tmp_path / "store"),
                       tiered_backend_service_provider="s3",
                       tiered_store_file_path=f"s3://{bucket}/tier",
                       tiered_store_s3_endpoint=s3.endpoint)


def document(epoch: int, broker: int, marker: int) -> bytes:
    return json.dumps({"writerEpoch": epoch, "writerBrokerId": broker,
                       "marker": marker}).encode()


@pytest.mark.parametrize("provider", ["posix", "s3"])
def test_a_lower_epoch_never_overwrites_a_higher_one(tmp_path, provider, s3):
    cfg = config(tmp_path, provider, s3)
    old, new = GroupTierMetadata(cfg, "c1", "g"), GroupTierMetadata(cfg, "c1", "g")
    assert old.read() is None
    assert old.publish(document(1, 1, 1), 1)
    assert new.publish(document(2, 2, 2), 2)
    assert not old.publish(document(1, 1, 3), 1)  # the old master, woken
    assert old.fenced == 1 and new.fenced == 0
    assert writer(new.read() or b"") == (2, 2) and json.loads(new.read() or b"")["marker"] == 2
    assert new.publish(document(2, 2, 4), 2)  # the same master goes on

    # Writers of many epochs at once: the copy ends at the highest, every lower one that came
    # after it refused.
    results: dict[int, bool] = {}

    def publish(epoch: int) -> None:
        results[epoch] = GroupTierMetadata(cfg, "c1", "g").publish(
            document(epoch, epoch, epoch), epoch)

    threads = [threading.Thread(target=publish, args=(e,)) for e in range(3, 8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert writer(new.read() or b"") == (7, 7)  # (5 writers: the last loses at most 4 races)
    assert results[7]


def test_a_broker_new_to_its_group_starts_from_the_groups_copy(tmp_path):
    cfg = config(tmp_path, "posix")
    GroupTierMetadata(cfg, "c1", "g").publish(document(3, 1, 7), 3)
    assert adopt_group(GroupTierMetadata(cfg, "c1", "g"), cfg.root)
    local = tmp_path / "store" / METADATA_FILE
    assert json.loads(local.read_bytes())["marker"] == 7
    # A store with a document of its own keeps it.
    GroupTierMetadata(cfg, "c1", "g").publish(document(4, 2, 8), 4)
    assert not adopt_group(GroupTierMetadata(cfg, "c1", "g"), cfg.root)
    assert json.loads(local.read_bytes())["marker"] == 7


def test_a_groups_object_store_part_is_never_replaced_by_other_bytes(tmp_path, s3):
    cfg = config(tmp_path, "s3", s3)
    factory = FileSegmentFactory(cfg, "c1")
    factory.exclusive_parts = True
    segment = factory.create_segment(FileSegmentType.COMMIT_LOG, "g/T/0", 0)
    segment.commit0(b"acknowledged records", 0, True)
    segment.commit0(b"acknowledged records", 0, True)  # the same bytes again: a retry
    with pytest.raises(TierIOError, match="other bytes"):
        segment.commit0(b"an old master's tail", 0, True)
    assert segment.read0(0, 20) == b"acknowledged records"
