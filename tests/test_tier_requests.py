"""What the uploader asks of an S3 server (a real one on loopback, moto's server mode, through
s3fs over HTTP), request by request: a new topic's first upload is its PUTs alone, since the
broker's tier directory was listed once when the tier opened; a topic that directory already
held (files an older, restored metadata file does not know) is still looked up, and its files
are continued, not overwritten."""

from __future__ import annotations

import logging
from collections import Counter

import pytest
from s3_server import S3Server

from stratamq import tiered
from stratamq.config import StoreConfig
from stratamq.message import Message
from stratamq.store.message_store import MessageStore
from stratamq.tiered.naming import METADATA_FILE


@pytest.fixture(scope="module")
def s3():
    server = S3Server().start()
    yield server
    server.stop()


class Requests:
    """Every S3 operation a filesystem sends, with the key or prefix it names."""

    def __init__(self, fs) -> None:
        self.calls: list[tuple[str, str]] = []
        fs.s3.meta.events.register("before-parameter-build.s3", self._note)

    def _note(self, model, params, **_kw) -> None:
        self.calls.append((model.name, params.get("Key") or params.get("Prefix") or ""))

    def names(self) -> Counter[str]:
        return Counter(name for name, _where in self.calls)

    def listed(self) -> list[str]:
        return [where for name, where in self.calls if name == "ListObjectsV2"]


def config(tmp_path, s3: S3Server, bucket: str) -> StoreConfig:
    return StoreConfig(store_path_root_dir=str(tmp_path / "store"),
                       mapped_file_size_commit_log=256 * 1024,
                       tiered_backend_service_provider="s3",
                       tiered_store_file_path=f"s3://{bucket}/tier",
                       tiered_store_s3_endpoint=s3.endpoint,
                       tiered_store_index_file_max_hash_slot_num=97,
                       tiered_store_index_file_max_index_num=1000)


def open_tiered(cfg: StoreConfig, fs):
    store = MessageStore(cfg)
    tier = tiered.wire(store, cluster="DefaultCluster", broker="broker-a", background=False,
                       fs=fs)
    assert tier is not None
    store.open()
    return store, tier


def put(store: MessageStore, topic: str, count: int, start: int = 0) -> None:
    for i in range(start, start + count):
        msg = Message(topic, b"body-%05d-" % i + bytes(range(200)), i % 2, {"KEYS": f"k{i}"})
        assert store.put_message(msg).ok
    assert store.wait_dispatched()
    store.flush()


def tier_objects(fs, bucket: str, topic: str) -> dict[str, bytes]:
    return {path: fs.cat_file(path) for path in fs.find(f"{bucket}/tier")
            if f"/broker-a/{topic}/" in path}


def test_a_new_topics_first_upload_is_its_puts_alone(tmp_path, s3):
    fs = s3.filesystem()
    bucket = s3.new_bucket(fs)
    seen = Requests(fs)
    store, tier = open_tiered(config(tmp_path, s3, bucket), fs)
    try:
        assert seen.listed() == ["tier/212d6b50_DefaultCluster/broker-a/"]  # at the start
        put(store, "Fresh", 40)
        seen.calls.clear()
        assert tier.flush(60)
        # Per queue a CommitLog part and a ConsumeQueue part; the index file being written
        # stays local (sealed when full, or idle for tieredStoreIndexFileRollingIdleInterval).
        assert seen.names() == Counter({"PutObject": 2 * 2})
        put(store, "Fresh", 40, start=40)
        seen.calls.clear()
        assert tier.flush(60)
        assert seen.names() == Counter({"PutObject": 2 * 2})
    finally:
        store.close()
        tier.close()


def test_a_topic_the_tier_held_at_the_start_is_looked_up_and_continued(tmp_path, s3, caplog):
    fs = s3.filesystem()
    bucket = s3.new_bucket(fs)
    cfg = config(tmp_path, s3, bucket)
    meta = tmp_path / "store" / METADATA_FILE
    store, tier = open_tiered(cfg, fs)
    put(store, "Seed", 2)
    assert tier.flush(60)
    store.close()
    tier.close()
    older = meta.read_bytes()  # a document from before the Kept topic
    store, tier = open_tiered(cfg, fs)
    put(store, "Kept", 40)
    assert tier.flush(60)
    store.close()
    tier.close()
    before = tier_objects(fs, bucket, "Kept")
    meta.write_bytes(older)  # an older copy restored: the tier's Kept files are unknown to it
    seen = Requests(fs)
    store, tier = open_tiered(cfg, fs)
    try:
        put(store, "Kept", 20, start=40)
        put(store, "Fresh", 20)
        seen.calls.clear()
        with caplog.at_level(logging.WARNING, logger="stratamq.tiered"):
            assert tier.flush(60)
        assert any("/broker-a/Kept/" in where for where in seen.listed())
        assert not any("/Fresh/" in where for where in seen.listed())
        assert "the metadata did not know of: kept" in caplog.text
        after = tier_objects(fs, bucket, "Kept")
        assert {p: after[p] for p in before} == before  # continued, nothing rewritten
        records = [after[p] for p in sorted(after) if "/COMMIT_LOG/" in p]
        assert sum(data.count(b"body-") for data in records) == 60  # each message once
    finally:
        store.close()
        tier.close()
