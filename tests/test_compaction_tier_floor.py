"""A round never runs past the compacted files the tier alone holds (``tierFloor``): the
store's round run on the queue's files alone (what the Spark ``compact`` pipeline's executors
do) is skipped, the floor stays in ``state.json``, and every released record is still read back
after a reopen and kept in the tier by the next upload; the broker's round restores the
released files first and compacts with every key (a real POSIX tier)."""

from __future__ import annotations

import json
from pathlib import Path

from compaction_util import HOUR, TOPIC, as_table, read_from, small_config
from test_compaction_tier import (
    NOW,
    open_tiered,
    raw_rows,
    tier_manifest,
    tier_settings,
    write_versions,
)

from stratamq.compaction import bcq_format as bcq
from stratamq.compaction.layout import CompactionLayout
from stratamq.compaction.log import CompactionLog
from stratamq.compaction.policy import TopicPolicy
from stratamq.compaction.round import run_round
from stratamq.store.layout import StoreLayout


def released_history(base: Path) -> tuple[dict, list, dict[str, bytes], list[str]]:
    """A store whose first compacted files were released to a POSIX tier (tierFloor set), with
    newer versions written after; closed. (settings, rows read, model, released file names)."""
    settings = tier_settings("posix", str(base / "tier"))
    parts = open_tiered(base / "store", settings)
    model: dict[str, bytes] = {}
    write_versions(parts.store, model, 0, 600, 40)
    parts.compact(NOW - 2 * HOUR)
    before_release = set(parts.local_files())
    assert parts.release() > 0
    released = sorted(before_release - set(parts.local_files()))
    write_versions(parts.store, model, 600, 400, 60)
    assert parts.store.wait_dispatched()
    [clog] = parts.comp.queues()
    assert clog.state.tier_floor > 0 and clog.tier_only()
    rows = raw_rows(parts.store)
    parts.close()
    return settings, rows, model, released


def state_json(base: Path) -> dict:
    return json.loads((base / "store" / "compaction" / "compactionLog" / TOPIC / "0"
                       / "state.json").read_text())


def test_a_round_on_the_local_files_alone_keeps_the_tier_floor(tmp_path):
    settings, rows, model, released = released_history(tmp_path)
    floor = state_json(tmp_path)["tierFloor"]
    # The store's round on the queue's files, the store closed and no tier linked: what the
    # Spark compact pipeline's rewrite task runs.
    paths = CompactionLayout(StoreLayout(str(tmp_path / "store"))).queue(TOPIC, 0)
    config = small_config(tmp_path / "store")
    clog = CompactionLog(paths, config.compaction_mapped_file_size,
                         bcq.cq_file_size(config.compaction_cq_mapped_file_size),
                         destroy_interval_ms=0)
    clog.load()
    try:
        report = run_round(clog, TopicPolicy(HOUR), 1 << 20, NOW)
    finally:
        clog.close()
    assert report.skipped is not None and "tierFloor" in report.skipped
    assert str(paths.state) in report.skipped
    assert state_json(tmp_path)["tierFloor"] == floor
    # Reopened with the tier: every record is read back, the released ones from the tier.
    parts = open_tiered(tmp_path / "store", settings)
    assert raw_rows(parts.store) == rows
    assert as_table(read_from(parts.store)) == model
    # The next upload keeps naming the released files, so the tier keeps them.
    [clog] = parts.comp.queues()
    parts.comp.tier_pass(clog, release=False)
    named = {f.name for f in tier_manifest(parts).queues[(TOPIC, 0)].files}
    assert set(released) <= named
    parts.close()
    for name in released:
        assert list((tmp_path / "tier").rglob(f"*{name[8:]}")), f"{name} left the tier"


def test_the_brokers_round_restores_then_compacts_with_every_key(tmp_path):
    settings, rows, model, _released = released_history(tmp_path)
    parts = open_tiered(tmp_path / "store", settings)
    # Past the first round's tombstone retention: the round may drop them, so it must see
    # the older values the released files hold, or deleted keys would come back.
    [report] = parts.compact(NOW + 2 * HOUR)
    assert report.skipped is None and report.removed > 0
    [clog] = parts.comp.queues()
    assert not clog.tier_only() and clog.state.tier_floor == 0
    assert as_table(read_from(parts.store)) == model
    parts.close()
    parts = open_tiered(tmp_path / "store", settings)
    assert as_table(read_from(parts.store)) == model
    parts.close()


def test_a_tier_file_damaged_in_the_tier_is_not_restored(tmp_path):
    settings, rows, model, released = released_history(tmp_path)
    [damaged] = [p for p in (tmp_path / "tier").rglob("*")
                 if p.is_file() and p.parent.name == "COMMIT_LOG" and p.name.endswith(released[0])]
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF  # bit rot in the middle of a record
    damaged.write_bytes(bytes(data))
    parts = open_tiered(tmp_path / "store", settings)
    generation = tier_manifest(parts).generation
    local = parts.local_files()
    [report] = parts.compact(NOW + 2 * HOUR)
    assert report.skipped is not None
    assert "CRC" in report.skipped and str(damaged) in report.skipped
    # Nothing local changed, nothing was uploaded again: the floor and the tier copy stand.
    [clog] = parts.comp.queues()
    assert clog.state.tier_floor == state_json(tmp_path)["tierFloor"] > 0
    after = parts.local_files()  # the file being written was sealed; nothing restored
    assert set(local) <= set(after) and not set(released) & set(after)
    assert tier_manifest(parts).generation == generation
    parts.close()
