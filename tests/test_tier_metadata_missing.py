"""Tier metadata (issue 26, item 5): with the metadata file deleted, a store whose tier holds
its files is refused with a clear error (not started quietly serving part of the history),
on a POSIX tier and on a real S3-compatible server; and a save never replaces the last good
``.bak`` with a document that lost queues."""

from __future__ import annotations

import json
import shutil

import pytest
from s3_server import S3Server
from test_tier_store import TOPIC, fill, open_tiered, read_all, tier_config

from stratamq.tiered import MetadataMissing
from stratamq.tiered.metadata import MetadataStore
from stratamq.tiered.naming import METADATA_FILE


@pytest.fixture(scope="module")
def s3():
    server = S3Server().start()
    yield server
    server.stop()


def _tiered_history(tmp_path, kind: str, s3: S3Server):
    """A store whose older files went to the tier, closed; its config."""
    cfg = tier_config(tmp_path, kind, s3)
    store, tier = open_tiered(cfg)
    try:
        fill(store, 300)
        assert tier.flush(60)
        while True:  # local files the tier holds go: only the tier has the early messages
            before = store.commitlog.min_offset
            store.cleanup.run_once(force=True)
            if store.commitlog.min_offset == before:
                break
        assert store.commitlog.min_offset > 0
        assert len(read_all(store, 0)) == 150
    finally:
        store.close()
        tier.close()
    return cfg


@pytest.mark.parametrize("kind", ["posix", "s3"])
def test_a_deleted_metadata_file_is_refused(kind, tmp_path, s3):
    cfg = _tiered_history(tmp_path, kind, s3)
    meta = tmp_path / "store" / METADATA_FILE
    backup = meta.with_name(meta.name + ".bak")
    assert backup.exists()
    saved = meta.read_bytes()

    meta.unlink()
    with pytest.raises(MetadataMissing, match=r"tieredStoreMetadata\.json is missing.*\.bak"):
        open_tiered(cfg)
    backup.unlink()  # both gone: the tier's own files still say there is history
    with pytest.raises(MetadataMissing, match="the tier holds files of broker broker-a"):
        open_tiered(cfg)
    assert not meta.exists() and not backup.exists()  # nothing was written over

    meta.write_bytes(saved)  # restored: the whole history is served again
    store, tier = open_tiered(cfg)
    try:
        assert len(read_all(store, 0)) == len(read_all(store, 1)) == 150
    finally:
        store.close()
        tier.close()


def test_a_new_tier_starts_without_metadata(tmp_path):
    """Nothing in the tier and no metadata yet: a first start, not a loss."""
    cfg = tier_config(tmp_path)
    store, tier = open_tiered(cfg)
    try:
        fill(store, 10)
        assert tier.flush(60)
    finally:
        store.close()
        tier.close()
    assert (tmp_path / "store" / METADATA_FILE).exists()


def test_a_save_never_replaces_the_backup_with_a_document_that_lost_queues(tmp_path):
    cfg = _tiered_history(tmp_path, "posix", None)
    meta = tmp_path / "store" / METADATA_FILE
    backup = meta.with_name(meta.name + ".bak")

    def queues(path) -> set[tuple[str, str]]:
        table = json.loads(path.read_bytes())["queueMetadataTable"]
        return {(t, q) for t, qs in table.items() for q in qs}

    assert queues(backup) == queues(meta) == {(TOPIC, "0"), (TOPIC, "1")}
    doc = json.loads(meta.read_bytes())
    del doc["queueMetadataTable"][TOPIC]["1"]  # a document that lost a queue (an old copy)
    meta.write_text(json.dumps(doc))
    good_backup = backup.read_bytes()

    store = MetadataStore(cfg.root)
    store.mark_dirty()
    store.persist()
    store.mark_dirty()
    store.persist()
    assert backup.read_bytes() == good_backup  # still the last good version
    assert queues(meta) == {(TOPIC, "0")}

    # Queues deleted on purpose are no loss: the backup rotates as usual again.
    meta.write_bytes(good_backup)
    store = MetadataStore(cfg.root)
    store.delete_queue(TOPIC, 0)
    store.persist()  # the file of both queues becomes the backup
    store = MetadataStore(cfg.root)  # a restart: the document says queue 0 went on purpose
    store.delete_queue(TOPIC, 1)
    store.persist()  # the file of queue 1 becomes the backup (queue 0 was deleted)
    assert queues(backup) == {(TOPIC, "1")} and queues(meta) == set()


def test_an_interrupted_save_is_finished_not_refused(tmp_path):
    """A stop between the save's two renames leaves the previous document as the .bak and the
    new one, whole, as the .tmp: the start finishes the rename."""
    cfg = _tiered_history(tmp_path, "posix", None)
    meta = tmp_path / "store" / METADATA_FILE
    shutil.copy(meta, meta.with_name(meta.name + ".tmp"))
    meta.replace(meta.with_name(meta.name + ".bak"))
    store, tier = open_tiered(cfg)
    try:
        assert len(read_all(store, 0)) == 150
    finally:
        store.close()
        tier.close()
