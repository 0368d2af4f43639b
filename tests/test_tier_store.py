"""Tiered storage on an embedded store: messages uploaded to a POSIX directory or to a real
S3-compatible server on loopback (moto's server mode, through s3fs over HTTP), local files
deleted, and every message still served with the same bytes, offsets and ids under each read
policy; group commit triggers; local data that expired before upload; tier retention; a
restart after the metadata lagged the tier."""

from __future__ import annotations

import logging
import time

import pytest
from s3_server import S3Server
from waiting import wait_until

from stratamq import tiered
from stratamq.config import StoreConfig
from stratamq.message import Message
from stratamq.store.message_store import MessageStore
from stratamq.store.results import GetMessageStatus

SEGMENT = 64 * 1024
TOPIC = "Orders"


@pytest.fixture(scope="module")
def s3():
    server = S3Server().start()
    yield server
    server.stop()


def tier_config(tmp_path, kind: str = "posix", s3: S3Server | None = None,
                **extra) -> StoreConfig:
    if kind == "s3":
        assert s3 is not None
        bucket = s3.new_bucket(s3.filesystem())
        where = {"tiered_backend_service_provider": "s3",
                 "tiered_store_file_path": f"s3://{bucket}/tier",
                 "tiered_store_s3_endpoint": s3.endpoint}
    else:
        where = {"tiered_backend_service_provider": kind,
                 "tiered_store_file_path": str(tmp_path / "tier")}
    return StoreConfig(**{
        "store_path_root_dir": str(tmp_path / "store"),
        "mapped_file_size_commit_log": SEGMENT,
        "mapped_file_size_consume_queue": 100 * 20,
        "delete_commit_log_files_interval": 0,
        "tiered_store_index_file_max_hash_slot_num": 97,
        "tiered_store_index_file_max_index_num": 300,
        **where, **extra})


def open_tiered(config: StoreConfig, background: bool = False):
    store = MessageStore(config)
    tier = tiered.wire(store, cluster="DefaultCluster", broker="broker-a",
                       background=background)
    assert tier is not None
    store.open()
    tier.start()
    return store, tier


def fill(store: MessageStore, count: int, start: int = 0, queues: int = 2) -> None:
    for i in range(start, start + count):
        msg = Message(TOPIC, b"body-%05d-" % i + bytes(range(256)) * 2, i % queues,
                      {"KEYS": f"order-{i} common", "TAGS": f"t{i % 3}"})
        assert store.put_message(msg).ok
    assert store.wait_dispatched()
    store.flush()


def read_all(store: MessageStore, queue_id: int, start: int = 0) -> dict[int, bytes]:
    """Every record of a queue from ``start``, by queue offset, as raw bytes."""
    out: dict[int, bytes] = {}
    offset = start
    while True:
        with store.get_messages("reader", TOPIC, queue_id, offset, 17) as got:
            for rec in got.records:
                out[rec.queue_offset] = bytes(rec.buffer)
            if got.next_begin_offset <= offset and not got.records:
                return out
            if got.status not in (GetMessageStatus.FOUND, GetMessageStatus.NO_MATCHED_MESSAGE):
                return out
            offset = got.next_begin_offset


def drop_local(store: MessageStore, tier) -> None:
    """Local clean-up as far as it may go: every CommitLog file the tier holds (but the one
    being written), then the ConsumeQueue files below."""
    while True:
        before = store.commitlog.min_offset
        store.cleanup.run_once(force=True)
        if store.commitlog.min_offset == before:
            break
    assert store.commitlog.min_offset > 0


@pytest.mark.parametrize("kind", ["posix", "s3"])
def test_history_served_from_the_tier_after_local_files_go(kind, tmp_path, s3):
    store, tier = open_tiered(tier_config(tmp_path, kind, s3))
    try:
        fill(store, 400)
        before = {q: read_all(store, q) for q in (0, 1)}
        ids = {m.msg_id: m.body for m in store.query_messages(TOPIC, "common", 1000)}
        assert len(ids) == 400
        assert tier.flush(60)
        drop_local(store, tier)
        local = store.local_source.offsets(TOPIC, 0)
        assert local is not None and local.low > 0  # the local queue lost its head
        # Same bytes, same queue offsets, from offset 0 (the tier) to the end (the tier, then
        # whatever the local store still has).
        assert {q: read_all(store, q) for q in (0, 1)} == before
        assert store.get_min_offset_in_queue(TOPIC, 0) == 0  # min offsets from the tier
        assert store.get_max_offset_in_queue(TOPIC, 0) == 200
        assert tier.fetcher.served >= 200
        # Lookups: by key, by unique id and by offset message id reach the tier.
        first = next(iter(before[0].values()))
        from stratamq import record as codec
        msg0 = codec.decode(first)
        hits = store.query_messages(TOPIC, "order-0")
        assert [h.body for h in hits] == [msg0.body]
        assert store.look_message_by_msg_id(msg0.msg_id).body == msg0.body
        uniq = msg0.properties.get("UNIQ_KEY")
        if uniq:
            assert store.look_message_by_msg_id(uniq, TOPIC).body == msg0.body
        assert {m.msg_id for m in store.query_messages(TOPIC, "common", 1000)} == set(ids)
        # Offsets by time: the first message stored at or after a time, from the tier.
        t = codec.decode(before[1][37]).store_timestamp
        assert store.get_offset_in_queue_by_time(TOPIC, 1, t) <= 37
        assert codec.decode(before[1][store.get_offset_in_queue_by_time(
            TOPIC, 1, t)]).store_timestamp >= t
    finally:
        store.close()
        tier.close()


@pytest.mark.parametrize("policy", ["DISABLE", "NOT_IN_DISK", "NOT_IN_MEM", "FORCE"])
def test_read_policies(policy, tmp_path):
    """DISABLE: the tier serves nothing; NOT_IN_DISK: only what the local store lost;
    NOT_IN_MEM (with no memory window): everything it holds; FORCE: everything it holds.
    Whatever serves a read, the bytes are the same."""
    cfg = tier_config(tmp_path, tiered_storage_level=policy,
                      access_message_in_memory_max_ratio=0)
    store, tier = open_tiered(cfg)
    try:
        fill(store, 200)
        before = read_all(store, 0)
        assert tier.flush(60)
        served = tier.fetcher.served
        assert read_all(store, 0) == before
        from_tier_while_local = tier.fetcher.served - served
        if policy in ("NOT_IN_MEM", "FORCE"):
            assert from_tier_while_local == 100
        else:
            assert from_tier_while_local == 0
        drop_local(store, tier)
        if policy == "DISABLE":  # only what the local store still has
            low = store.get_min_offset_in_queue(TOPIC, 0)
            assert low > 0
            assert read_all(store, 0, low) == {o: b for o, b in before.items() if o >= low}
            with store.get_messages("g", TOPIC, 0, 0, 8) as got:
                assert got.status is GetMessageStatus.OFFSET_TOO_SMALL and not got.records
        else:
            assert read_all(store, 0) == before
    finally:
        store.close()
        tier.close()


def test_group_commit_by_count_time_and_size(tmp_path, caplog):
    cfg = tier_config(tmp_path, tiered_store_group_commit_count=50,
                      tiered_store_group_commit_timeout=3_600_000,
                      tiered_store_group_commit_size=1024 * 1024)
    store, tier = open_tiered(cfg, background=True)
    try:
        fill(store, 49, queues=1)
        wait_until(lambda: tier.uploader.lag(TOPIC, 0)[0] == 49)  # dispatched to the uploader
        # 49 < 50, not an hour old, 30 KB < 1 MiB: a round now starts nothing; it waits.
        assert tier.uploader.run_round() == 0
        assert tier.uploader.lag(TOPIC, 0)[0] == 49
        assert tier.files.get(TOPIC, 0) is None or tier.files.get(TOPIC, 0).commit_offset == 0
        fill(store, 1, start=49, queues=1)  # the 50th message makes the batch go
        wait_until(lambda: _committed(tier, 0) == 50)
        fill(store, 10, start=50, queues=1)
        assert tier.uploader.lag(TOPIC, 0)[0] == 10
    finally:
        store.close()
        tier.close()
    # Time: a batch whose oldest message is older than the timeout goes at the next scan.
    cfg = tier_config(tmp_path, tiered_store_group_commit_count=10_000,
                      tiered_store_group_commit_timeout=0)
    store, tier = open_tiered(cfg, background=True)
    try:
        wait_until(lambda: _committed(tier, 0) == 60)
        # Size: 8 messages of ~600 bytes pass a 4 KiB batch size.
    finally:
        store.close()
        tier.close()
    cfg = tier_config(tmp_path, tiered_store_group_commit_count=10_000,
                      tiered_store_group_commit_timeout=3_600_000,
                      tiered_store_group_commit_size=4096)
    store, tier = open_tiered(cfg, background=True)
    try:
        fill(store, 8, start=60, queues=1)
        wait_until(lambda: _committed(tier, 0) >= 66)
    finally:
        store.close()
        tier.close()


def _committed(tier, queue_id: int) -> int:
    flat = tier.files.get(TOPIC, queue_id)
    return flat.commit_offset if flat is not None else 0


def test_local_data_expired_before_upload_is_skipped_and_said(tmp_path, caplog):
    """The uploader lags past dispatcherRetentionHoldMaxBytes, local clean-up removes what
    it had not uploaded: the tier resumes at the local minimum and the log names the skipped
    offsets; reads of them answer with the next offset any source holds."""
    cfg = tier_config(tmp_path, dispatcher_hold_max_bytes=SEGMENT)
    store, tier = open_tiered(cfg)
    try:
        fill(store, 400)
        with caplog.at_level(logging.WARNING):
            store.cleanup.run_once(force=True)
        local_low = store.local_source.offsets(TOPIC, 0).low
        assert local_low > 0 and "dispatcherRetentionHoldMaxBytes" in caplog.text
        kept = read_all(store, 0, local_low)
        with caplog.at_level(logging.WARNING):
            assert tier.flush(60)
        assert f"queue offsets 0..{local_low - 1} were never tiered" in caplog.text
        assert tier.fetcher.offsets(TOPIC, 0) == (local_low, 200)
        drop_local(store, tier)
        assert read_all(store, 0, local_low) == kept
    finally:
        store.close()
        tier.close()


def test_tier_retention_is_independent_of_local(tmp_path):
    cfg = tier_config(tmp_path, tiered_store_commit_log_max_size=8 * 1024,
                      tiered_store_consume_queue_max_size=20 * 20,
                      tiered_store_file_reserved_time=1)
    store, tier = open_tiered(cfg)
    try:
        fill(store, 200)
        assert tier.flush(60)
        flat = tier.files.get(TOPIC, 0)
        files_before = len(flat.commit_log.segments)
        assert files_before > 3
        # An hour and a bit later every tier file but the newest of each kind has expired;
        # the local store, whose retention is 72 h, keeps everything.
        gone = tier.uploader.delete_expired(int(time.time() * 1000) + 3_700_000)
        assert gone > 0 and len(flat.commit_log.segments) == 1
        low = tier.fetcher.offsets(TOPIC, 0).low
        assert low > 0 and store.local_source.offsets(TOPIC, 0).low == 0
        assert store.get_min_offset_in_queue(TOPIC, 0) == 0  # the local store still has it
        assert len(read_all(store, 0)) == 100
    finally:
        store.close()
        tier.close()


def test_restart_trusts_the_tier_over_lagging_metadata(tmp_path):
    """The metadata is written after uploads; a crash between the two leaves it behind the
    tier. A restart takes the tier's sizes, rebuilds ConsumeQueue units the tier's CommitLog
    already holds, and uploads nothing twice."""
    cfg = tier_config(tmp_path)
    store, tier = open_tiered(cfg)
    fill(store, 100)
    assert tier.flush(60)
    stale = tier.metadata.encode()  # the metadata as of now
    fill(store, 100, start=100)
    assert tier.flush(60)
    store.close()
    tier.close()
    flat_path = tmp_path / "tier" / "212d6b50_DefaultCluster" / "broker-a" / TOPIC / "0"
    cl_file = next((flat_path / "COMMIT_LOG").iterdir())
    cq_file = next((flat_path / "CONSUME_QUEUE").iterdir())
    cl_bytes = cl_file.read_bytes()
    # As if the process died after the last CommitLog upload, before its units and the
    # metadata: the CONSUME_QUEUE file lost its last 30 units, the metadata is the old one.
    with open(cq_file, "r+b") as f:
        f.truncate(70 * 20)
    (tmp_path / "store" / "config" / "tieredStoreMetadata.json").write_bytes(stale)
    store, tier = open_tiered(cfg)
    try:
        assert tier.flush(60)
        assert cl_file.read_bytes() == cl_bytes  # nothing uploaded twice
        assert cq_file.stat().st_size == 100 * 20  # units rebuilt from the records
        before = read_all(store, 0)
        drop_local(store, tier)
        assert read_all(store, 0) == before and len(before) == 100
    finally:
        store.close()
        tier.close()


def test_index_lookups_from_sealed_and_uploaded_files_after_local_index_is_gone(tmp_path):
    """Keys are found in the tier index in every state, UNSEALED (being written), SEALED (full,
    not uploaded) and uploaded, once the store's own index files are deleted."""
    server = S3Server().start()
    try:
        # Idle interval 0: a flush seals the index file being written (RocketMQ's rule with
        # tieredStoreIndexFileRollingIdleInterval=0), so every state is reached.
        cfg = tier_config(tmp_path, "s3", server, tiered_store_index_file_max_index_num=120,
                          tiered_store_index_file_rolling_idle_interval=0)
        store, tier = open_tiered(cfg)
        fill(store, 150)
        assert tier.flush(60)  # records, then every index file, sealed and uploaded
        assert tier.index.states()["uploaded"] >= 2
        fill(store, 150, start=150)
        assert tier.uploader.flush(60, index=False)  # records up; full index files stay local
        drop_local(store, tier)
        store.close()
        tier.close()
        for f in (tmp_path / "store" / "index").iterdir():
            f.unlink()  # the store's own index is gone
        store, tier = open_tiered(cfg)
        states = tier.index.states()
        assert states["uploaded"] >= 2 and states["sealed"] >= 1 and states["unsealed"] == 1
        for i in (3, 77, 160, 230, 299):  # uploaded, uploaded, sealed, sealed, unsealed
            got = store.query_messages(TOPIC, f"order-{i}")
            assert [m.body[:10] for m in got] == [b"body-%05d" % i], i
        reads = tier.index.reads
        assert store.query_messages(TOPIC, "order-20")
        assert tier.index.reads > reads  # read from an uploaded file in the tier
        assert tier.flush(60)
        assert tier.index.states() == {"unsealed": 1, "sealed": 0,
                                       "uploaded": states["uploaded"] + states["sealed"] + 1}
        for i in (160, 299):
            assert [m.body[:10] for m in store.query_messages(TOPIC, f"order-{i}")] == [
                b"body-%05d" % i]
        store.close()
        tier.close()
    finally:
        server.stop()


def test_restart_after_a_crash_past_an_index_upload_uploads_it_once(tmp_path):
    """An index file is recorded in the metadata (with its time range) before its upload, and
    its size only at the next write: a crash between the two leaves the document saying 0
    bytes and the local file in place. The restart takes the size from the tier, drops the
    local file it recognises, and uploads nothing twice; its keys are found in the tier."""
    cfg = tier_config(tmp_path, tiered_store_index_file_rolling_idle_interval=0)
    store, tier = open_tiered(cfg)
    fill(store, 60)
    assert tier.flush(60)
    assert tier.index is not None
    index_dir = tmp_path / "store" / "tiered_index_file"
    meta_file = tmp_path / "store" / "config" / "tieredStoreMetadata.json"
    fill(store, 60, start=60)
    kept: dict[str, bytes] = {}
    commit = tier.index.flat.commit

    def commit_and_remember(**options) -> bool:  # what a crash right after this upload leaves
        kept["metadata"] = meta_file.read_bytes()
        kept.update({p.name: p.read_bytes() for p in index_dir.iterdir() if p.is_file()})
        return commit(**options)

    tier.index.flat.commit = commit_and_remember  # type: ignore[method-assign]
    assert tier.flush(60)
    uploaded = tier.index.states()["uploaded"]
    store.close()
    tier.close()
    index_files = sorted((tmp_path / "tier").rglob("INDEX/*"))
    tier_bytes = {p: p.read_bytes() for p in index_files}
    meta_file.write_bytes(kept.pop("metadata"))
    for name, data in kept.items():
        (index_dir / name).write_bytes(data)
    store, tier = open_tiered(cfg)
    try:
        assert tier.index is not None
        assert tier.index.states()["uploaded"] == uploaded
        assert tier.flush(60)
        assert sorted((tmp_path / "tier").rglob("INDEX/*")) == index_files
        assert {p: p.read_bytes() for p in index_files} == tier_bytes  # nothing twice
        for f in (tmp_path / "store" / "index").iterdir():
            f.unlink()  # the store's own index is gone: lookups go to the tier
        for i in (5, 70, 119):
            got = store.query_messages(TOPIC, f"order-{i}")
            assert [m.body[:10] for m in got] == [b"body-%05d" % i], i
    finally:
        store.close()
        tier.close()
