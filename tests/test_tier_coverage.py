"""Tier-aware clean-up checks the tier, not only the metadata (issue 26, item 4): after the
tier lost its objects (a wiped POSIX directory, an S3 bucket emptied on a real S3-compatible
server), ``store clean --tiered-only`` and the store's own clean-up keep every local CommitLog
file, say which queues the tier does not hold, and every message is still served."""

from __future__ import annotations

import json
import logging
import shutil

import pytest
from s3_server import S3Server
from test_tier_cli import cli, lines, write_store
from test_tier_store import TOPIC, fill, open_tiered, tier_config

from stratamq.tiered.naming import cluster_dir


@pytest.fixture(scope="module")
def s3():
    server = S3Server().start()
    yield server
    server.stop()


def _conf(tmp_path, kind: str, s3: S3Server) -> tuple[str, object]:
    """(broker.conf text, a callable that wipes the broker's objects from the tier)."""
    base = "mappedFileSizeCommitLog=65536\nmappedFileSizeConsumeQueue=2000\n"
    broker_dir = f"{cluster_dir('DefaultCluster')}/broker-a"
    if kind == "posix":
        tier = tmp_path / "tier"

        def wipe() -> None:
            shutil.rmtree(tier / broker_dir / "Orders")

        return (base + f"tieredBackendServiceProvider=posix\ntieredStoreFilePath={tier}\n"), wipe
    fs = s3.filesystem()
    bucket = s3.new_bucket(fs)

    def wipe_s3() -> None:
        fs.rm(f"{bucket}/tier/{broker_dir}/Orders", recursive=True)
        assert not fs.find(f"{bucket}/tier/{broker_dir}/Orders")

    return (base + f"tieredBackendServiceProvider=s3\ntieredStoreFilePath=s3://{bucket}/tier\n"
            f"tieredStoreS3Endpoint={s3.endpoint}\n"), wipe_s3


@pytest.mark.parametrize("kind", ["posix", "s3"])
def test_store_clean_keeps_what_the_tier_lost(kind, tmp_path, s3):
    conf_text, wipe = _conf(tmp_path, kind, s3)
    conf = tmp_path / "broker.conf"
    conf.write_text(conf_text)
    store_dir = tmp_path / "store"
    write_store(store_dir)
    where = ("--store", str(store_dir), "--config", str(conf))
    flushed = cli("tier", "flush", *where)
    assert flushed.returncode == 0, flushed.stderr
    assert [r["tier_committed_offset"] for r in lines(flushed.stdout)] == [150, 150]

    wipe()  # the tier loses the queues' objects; the metadata still says they are there
    cleaned = cli("store", "clean", *where, "--tiered-only")
    assert cleaned.returncode == 0, cleaned.stderr
    report = json.loads(cleaned.stdout)
    assert report["deleted"]["commitlog"] == 0 and report["commitlog_files"] == []
    assert report["min_offset"] == report["min_offset_before"] == 0
    assert [(u["topic"], u["queue_id"]) for u in report["tier_unverified"]] == [
        ("Orders", 0), ("Orders", 1)]
    assert "local CommitLog records are kept" in cleaned.stderr
    dumped = lines(cli("store", "dump", *where, "--topic", "Orders").stdout)
    assert len(dumped) == 300  # every acknowledged message is still there, locally


def test_store_clean_up_keeps_what_the_tier_lost_and_goes_on_once_it_holds_it(tmp_path,
                                                                               caplog):
    """The store's own clean-up trusts the uploader's ``durable_offset()``: verified in the
    tier. Files the tier lost stay; once the tier holds the data again (here: the wiped
    directory put back) they go."""
    cfg = tier_config(tmp_path)
    store, tier = open_tiered(cfg)
    try:
        fill(store, 300)
        assert tier.flush(60)
        queue_dir = tmp_path / "tier" / cluster_dir("DefaultCluster") / "broker-a" / TOPIC
        kept = tmp_path / "kept"
        shutil.move(queue_dir, kept)
        caplog.set_level(logging.ERROR, logger="stratamq.tiered.coverage")
        store.cleanup.run_once(force=True)
        assert store.commitlog.min_offset == 0
        assert tier.uploader.coverage.unverified_queues == 2
        rows = tier.status(lambda t, q: None)
        assert all("holds 0 bytes" in r["tier_unverified"] for r in rows), rows
        errors = [r for r in caplog.records if "are kept" in r.getMessage()]
        assert len(errors) == 2  # one per queue
        store.cleanup.run_once(force=True)
        assert len([r for r in caplog.records if "are kept" in r.getMessage()]) == 2
        assert store.commitlog.min_offset == 0

        shutil.move(kept, queue_dir)
        tier.uploader.verify_coverage()
        store.cleanup.run_once(force=True)
        assert store.commitlog.min_offset > 0
        assert tier.uploader.coverage.unverified_queues == 0
        assert [r["tier_unverified"] for r in tier.status(lambda t, q: None)] == [None, None]
        for queue_id in (0, 1):  # all of it served, from the tier below the local files
            with store.get_messages("g", TOPIC, queue_id, 0, 200) as got:
                assert [r.queue_offset for r in got.records][:1] == [0]
    finally:
        store.close()
        tier.close()
