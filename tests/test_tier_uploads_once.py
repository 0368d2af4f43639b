"""Uploads happen once (issue 26, item 9): ``tier flush`` calls racing with each other and with
the uploader's scheduler during a producer run upload every sealed index file exactly once and
never fail; index files are sealed by RocketMQ's rule (full, or idle for
``tieredStoreIndexFileRollingIdleInterval``), not per flush, so the tier grows with what it
holds."""

from __future__ import annotations

import logging
import threading

from test_tier_store import TOPIC, open_tiered, tier_config

from stratamq.message import Message
from stratamq.tiered.index_file import HEADER

MESSAGES = 1500


def _produce(store, stop_after: int, done: threading.Event) -> None:
    try:
        for i in range(stop_after):
            msg = Message(TOPIC, b"body-%05d-" % i + bytes(200), i % 4, {"KEYS": f"key-{i}"})
            assert store.put_message(msg).ok
    finally:
        done.set()


def _flush_while(tier, produced: threading.Event, results: list[bool],
                 errors: list[BaseException], calls: int) -> None:
    try:
        for _ in range(calls):
            results.append(tier.flush(60))
            if produced.is_set():
                break
    except BaseException as exc:  # noqa: BLE001 - the test reports it
        errors.append(exc)


def _run_with_flushes(store, tier, flushers: int = 8, calls: int = 5) -> list[bool]:
    produced = threading.Event()
    results: list[bool] = []
    errors: list[BaseException] = []
    producer = threading.Thread(target=_produce, args=(store, MESSAGES, produced))
    threads = [threading.Thread(target=_flush_while,
                                args=(tier, produced, results, errors, calls))
               for _ in range(flushers)]
    producer.start()
    for t in threads:
        t.start()
    producer.join()
    for t in threads:
        t.join()
    assert not errors, errors
    assert store.wait_dispatched()
    assert tier.flush(60)
    return results


def test_concurrent_flushes_upload_each_sealed_index_file_once(tmp_path, caplog):
    """Small index files (300 items) fill during the run: the scheduler and eight flushing
    threads race to upload them. Every call answers, every key is in exactly one index file
    (the uploaded ones' items and the local ones' add up to the keys put), and no two uploaded
    files are the same file."""
    cfg = tier_config(tmp_path, tiered_store_index_file_max_index_num=300)
    caplog.set_level(logging.WARNING)
    store, tier = open_tiered(cfg, background=True)
    try:
        results = _run_with_flushes(store, tier)
        assert results and all(results)
        assert tier.index is not None
        uploaded = [u.segment.read(0, u.segment.commit_position) for u in tier.index.uploaded]
        headers = [HEADER.unpack_from(data) for data in uploaded]
        begins = [h[1] for h in headers]
        assert len(begins) >= 3
        # The same file twice would be the same bytes. (Not the same begin time: under a
        # loaded machine two files can start in the same millisecond of store time.)
        assert len(set(uploaded)) == len(uploaded), "an index file was uploaded twice"
        items = sum(h[4] for h in headers)
        items += sum(f.item_count for f in tier.index.unsealed)
        assert items == MESSAGES
        tier_files = sorted((tmp_path / "tier").rglob("INDEX/*"))
        assert len(tier_files) == len(begins)
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    finally:
        store.close()
        tier.close()


def test_flushes_do_not_seal_index_files(tmp_path):
    """A sealed index file is its whole slot table whatever it holds (40 MB at the default
    geometry, 1.6 MB here): forty flushes during a run leave the file being written local
    (neither full nor idle), and the tier holds about what was produced."""
    cfg = tier_config(tmp_path, tiered_store_index_file_max_hash_slot_num=200_000,
                      tiered_store_index_file_max_index_num=1_000_000)
    store, tier = open_tiered(cfg, background=True)
    try:
        results = _run_with_flushes(store, tier, flushers=4, calls=10)
        assert results and all(results)
        tier_bytes = sum(p.stat().st_size for p in (tmp_path / "tier").rglob("*")
                         if p.is_file())
        produced = store.commitlog.max_offset - store.commitlog.min_offset
        assert produced <= tier_bytes < 2 * produced
        assert tier.index is not None and tier.index.states()["uploaded"] == 0
        # Idle past tieredStoreIndexFileRollingIdleInterval: sealed and uploaded once.
        tier.config.tiered_store_index_file_rolling_idle_interval = 0
        assert tier.flush(60)
        assert tier.index.states() == {"unsealed": 1, "sealed": 0, "uploaded": 1}
    finally:
        store.close()
        tier.close()
