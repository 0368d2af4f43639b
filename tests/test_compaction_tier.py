"""Compacted files in the tier: a compaction topic's tier copy is its compacted set (a POSIX
directory and a real S3-compatible server on loopback: moto's server mode through s3fs), read
back the same after local files are deleted and by a new store on the same tier; a second
round replaces the tier copy whole; a SIGKILLed upload leaves the old set or the new one."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from compaction_util import HOUR, TOPIC, as_table, put, read_from, small_config
from s3_server import S3Server

from stratamq import tiered
from stratamq.compaction.policy import StaticPolicies, TopicPolicy
from stratamq.compaction.service import CompactionStore
from stratamq.compaction.swap import KILL_ENV
from stratamq.compaction.tier_format import MANIFEST_NAME, TierManifest
from stratamq.compaction.tiering import link
from stratamq.store.message_store import MessageStore
from stratamq.store.results import GetMessageStatus

PROC = Path(__file__).resolve().parent / "compaction_tier_proc.py"
NOW = 1_700_000_000_000


@pytest.fixture(scope="module")
def s3():
    server = S3Server().start()
    yield server
    server.stop()


def tier_settings(kind: str, where: str, s3: S3Server | None = None) -> dict:
    if kind == "s3":
        assert s3 is not None
        return {"tiered_backend_service_provider": "s3", "tiered_store_file_path": where,
                "tiered_store_s3_endpoint": s3.endpoint}
    return {"tiered_backend_service_provider": "posix", "tiered_store_file_path": where}


class Tiered:
    """A store with compaction and a tier plugged in, linked as the broker links them."""

    def __init__(self, root: Path, settings: dict) -> None:
        self.config = small_config(root, file_reserved_time=0, **settings)
        self.store = MessageStore(self.config)
        self.tier = tiered.wire(self.store, cluster="DefaultCluster", broker="broker-a",
                                background=False)
        assert self.tier is not None
        self.comp = CompactionStore(self.config, StaticPolicies({TOPIC: TopicPolicy(HOUR)}))
        self.comp.plug_into(self.store)
        self.ctier = link(self.comp, self.tier)
        assert self.ctier is not None
        self.store.open()
        self.tier.start()

    def compact(self, now: int = NOW):
        assert self.store.wait_dispatched()
        return self.comp.run_now(now_ms=now)

    def release(self, now: int | None = None) -> int:
        return sum(self.comp.tier_pass(c, now_ms=now) for c in self.comp.queues())

    def local_files(self) -> list[str]:
        [clog] = self.comp.queues()
        return sorted(p.name for p in clog.paths.log_dir.iterdir() if p.name.isdigit())

    def close(self) -> None:
        self.store.close()
        self.comp.close()
        assert self.tier is not None
        self.tier.close()


def open_tiered(root: Path, settings: dict) -> Tiered:
    return Tiered(root, settings)


def raw_rows(store: MessageStore) -> list[tuple[int, str, bytes, str]]:
    """(queue offset, message id, record bytes, key) of the queue read from its start."""
    out = []
    for msg in read_from(store):
        out.append((msg.queue_offset, msg.msg_id, msg.body, msg.properties.get("KEYS", "")))
    return out


def record_bytes(store: MessageStore) -> dict[int, bytes]:
    got: dict[int, bytes] = {}
    offset, end = 0, store.get_max_offset_in_queue(TOPIC, 0)
    while offset < end:
        with store.get_messages("raw", TOPIC, 0, offset, 16) as result:
            for rec in result.records:
                got[rec.queue_offset] = bytes(rec.buffer)
            offset = result.next_begin_offset
    return got


def write_versions(store: MessageStore, model: dict[str, bytes], start: int, count: int,
                   keys: int) -> None:
    for i in range(start, start + count):
        key = f"k{i % keys}"
        if i % 13 == 0:
            put(store, key, b"")  # a tombstone
            model.pop(key, None)
        else:
            value = b"v%d-" % i + bytes(200)
            put(store, key, value)
            model[key] = value


def tier_manifest(parts: Tiered) -> TierManifest:
    raw = parts.ctier.docs.read(MANIFEST_NAME)
    assert raw is not None
    return TierManifest.parse("manifest", raw)


@pytest.mark.parametrize("kind", ["posix", "s3"])
def test_tiered_compaction_topic_reads_back_the_same(kind, tmp_path, s3):
    where = (f"s3://{s3.new_bucket(s3.filesystem())}/tier" if kind == "s3"
             else str(tmp_path / "tier"))
    settings = tier_settings(kind, where, s3)
    parts = open_tiered(tmp_path / "store", settings)
    model: dict[str, bytes] = {}
    write_versions(parts.store, model, 0, 700, 50)
    [report] = parts.compact()
    assert report.removed > 0
    before = raw_rows(parts.store)
    before_bytes = record_bytes(parts.store)
    assert as_table([m for m in read_from(parts.store)]) == model
    # The tier holds the compacted files, not the raw stream: no flat files for the topic.
    manifest = tier_manifest(parts)
    entry = manifest.queues[(TOPIC, 0)]
    assert sum(f.units for f in entry.files) < 700
    assert parts.tier.files.get(TOPIC, 0) is None
    # Local retention lets the tiered files go (all but the one being written).
    files_before = parts.local_files()
    assert parts.release() == len(files_before) - 1
    assert len(parts.local_files()) == 1
    assert raw_rows(parts.store) == before
    assert record_bytes(parts.store) == before_bytes
    parts.close()
    # Reopened: the released files are still served from the tier.
    parts = open_tiered(tmp_path / "store", settings)
    assert raw_rows(parts.store) == before
    parts.close()
    # A new store on the same tier serves the compacted files it holds (sealed ones).
    fresh = open_tiered(tmp_path / "fresh", settings)
    tiered_rows = raw_rows(fresh.store)
    assert tiered_rows == [r for r in before if r[0] <= entry.files[-1].last_offset]
    assert {o: b for o, b in record_bytes(fresh.store).items()} == {
        o: b for o, b in before_bytes.items() if o <= entry.files[-1].last_offset}
    fresh.close()


def test_a_second_round_replaces_the_tier_copy(tmp_path):
    settings = tier_settings("posix", str(tmp_path / "tier"))
    parts = open_tiered(tmp_path / "store", settings)
    model: dict[str, bytes] = {}
    write_versions(parts.store, model, 0, 600, 40)
    parts.compact(NOW - 2 * HOUR)
    first = tier_manifest(parts)
    assert parts.release() > 0
    write_versions(parts.store, model, 600, 400, 60)
    [report] = parts.compact()  # restores the released files, compacts, uploads
    assert report.skipped is None and report.removed > 0
    second = tier_manifest(parts)
    assert second.generation > first.generation
    parts.release()
    assert as_table(read_from(parts.store)) == model
    rows = raw_rows(parts.store)
    parts.close()
    # Only the files the new manifest names are left in the tier.
    named = {(f.generation, f.name) for f in second.queues[(TOPIC, 0)].files}
    found = set()
    for path in (tmp_path / "tier").rglob("*"):
        if path.is_file() and "COMPACTION" in path.parts:
            gen = int(path.parts[path.parts.index("COMPACTION") + 1])
            found.add((gen, path.name[8:]))
    assert found == named
    # And a new store on the tier reads the second round's set.
    fresh = open_tiered(tmp_path / "fresh", settings)
    last = second.queues[(TOPIC, 0)].files[-1].last_offset
    assert raw_rows(fresh.store) == [r for r in rows if r[0] <= last]
    fresh.close()


def test_a_broker_on_an_adopted_tier_keeps_its_new_versions_through_a_round(tmp_path):
    """A new store on a tier holds no local file of the queue: its first local files must not
    take the names of the tier's files, or the round's restore replaces them (and the new
    versions in them) with the tier's."""
    settings = tier_settings("posix", str(tmp_path / "tier"))
    parts = open_tiered(tmp_path / "store", settings)
    model: dict[str, bytes] = {}
    write_versions(parts.store, model, 0, 600, 40)
    parts.compact()
    parts.close()
    fresh = open_tiered(tmp_path / "fresh", settings)
    try:
        assert fresh.comp.queues()[0].tier_only()  # served from the tier, nothing local
        write_versions(fresh.store, model, 600, 400, 40)
        [report] = fresh.compact()  # restores the tier's files, then compacts
        assert report.skipped is None
        assert as_table(read_from(fresh.store)) == model
    finally:
        fresh.close()


def store_with_released_files(tmp_path: Path) -> tuple[dict, dict[str, bytes]]:
    """A store (closed) whose compacted files were released to a POSIX tier: the tier's
    settings and the model of the table."""
    settings = tier_settings("posix", str(tmp_path / "tier"))
    parts = open_tiered(tmp_path / "store", settings)
    model: dict[str, bytes] = {}
    write_versions(parts.store, model, 0, 600, 40)
    parts.compact()
    assert parts.release() > 0
    parts.close()
    return settings, model


def reopened_with_released_files(tmp_path: Path
                                  ) -> tuple[Tiered, dict[str, bytes], dict[Path, bytes]]:
    """``store_with_released_files`` reopened, with the model of its table and the tier's
    compaction files' bytes (to take them away and give them back)."""
    settings, model = store_with_released_files(tmp_path)
    logs = {p: p.read_bytes() for p in (tmp_path / "tier").rglob("*")
            if p.is_file() and "COMPACTION" in p.parts}
    return open_tiered(tmp_path / "store", settings), model, logs


def test_a_broker_on_an_adopted_tier_gives_new_messages_offsets_past_its_records(tmp_path):
    """A new store whose only history is a compaction tier starts its empty CommitLog past the
    records the tier holds: a new message's physical offset, and the offset message id built
    on it, must not name a record the tier still serves."""
    settings, _model = store_with_released_files(tmp_path)
    fresh = open_tiered(tmp_path / "fresh", settings)
    try:
        held = {m.physical_offset: m for m in read_from(fresh.store)}
        assert held and all(m.topic == TOPIC for m in held.values())
        tier_end = max(off + m.total_size for off, m in held.items())
        put(fresh.store, "k-new", b"after the adoption")
        newest = read_from(fresh.store)[-1]
        assert newest.body == b"after the adoption"
        assert newest.physical_offset >= tier_end
        assert fresh.store.look_message_by_msg_id(newest.msg_id).body == b"after the adoption"
    finally:
        fresh.close()


def test_a_failed_tier_read_answers_nothing_found_yet_instead_of_raising(tmp_path):
    """As for any tiered topic: while the tier cannot serve a released file, a read finds
    nothing at its offset (the reader asks again), rather than failing the receive or pull."""
    parts, model, logs = reopened_with_released_files(tmp_path)
    try:
        for path in logs:
            path.write_bytes(b"")  # the tier lost the files (or cannot be reached)
        released = parts.comp.queues()[0].tier_only()[0].entry
        assert released.last_offset > released.first_offset
        # A file's first offset, and one inside it (found in its units, read from the tier).
        for offset in (released.first_offset, released.first_offset + 1):
            with parts.store.get_messages("test", TOPIC, 0, offset, 8) as result:
                assert result.status is GetMessageStatus.OFFSET_FOUND_NULL
                assert result.next_begin_offset == offset and not result.records
        for path, data in logs.items():
            path.write_bytes(data)
        assert as_table(read_from(parts.store)) == model
    finally:
        parts.close()


def test_a_time_lookup_the_tier_cannot_serve_answers_the_files_first_offset(tmp_path):
    """A consumer reset by time on a queue whose released file cannot be read from the tier
    gets that file's first offset (it may see older versions again; it skips none) instead of
    an error; once the tier serves the file again the lookup finds the exact offset."""
    parts, _model, logs = reopened_with_released_files(tmp_path)
    try:
        files = [seg.entry for seg in parts.comp.queues()[0].tier_only()]
        late = files[-1].last_timestamp
        # The first file that may hold the time, by the manifest's timestamps.
        holder = next(f for f in files if f.last_timestamp >= late)
        for path in logs:
            path.write_bytes(b"")
        # Asked of the compaction queue itself (the store answers the least of its sources,
        # and the local ConsumeQueue still holds the topic's uncompacted messages).
        assert parts.comp.offset_by_time(TOPIC, 0, late) == holder.first_offset
        assert parts.store.get_offset_in_queue_by_time(TOPIC, 0, late) <= holder.first_offset
        for path, data in logs.items():
            path.write_bytes(data)
        exact = parts.comp.offset_by_time(TOPIC, 0, late)
        assert exact is not None
        assert holder.first_offset <= exact <= holder.last_offset
    finally:
        parts.close()


def test_a_read_while_local_files_are_released_finds_them_local_or_in_the_tier(tmp_path,
                                                                             monkeypatch):
    """Releasing local files and serving them from the tier is one step for a reader: a read
    between the two would find the offsets in neither and skip past them."""
    from stratamq.compaction.segment import Segment

    parts = open_tiered(tmp_path / "store", tier_settings("posix", str(tmp_path / "tier")))
    try:
        model: dict[str, bytes] = {}
        write_versions(parts.store, model, 0, 600, 50)
        parts.compact()
        [clog] = parts.comp.queues()
        first = clog.min_offset()
        seen: list[tuple[list[int], int]] = []
        retire = Segment.destroy

        def read_then_retire(seg, *args, **kwargs):  # runs as the released files go
            with parts.store.get_messages("test", TOPIC, 0, first, 1) as result:
                seen.append(([r.queue_offset for r in result.records], result.next_begin_offset))
            return retire(seg, *args, **kwargs)

        monkeypatch.setattr(Segment, "destroy", read_then_retire)
        assert parts.release() > 0
        monkeypatch.undo()
        assert seen and all(s == ([first], first + 1) for s in seen), seen
        assert as_table(read_from(parts.store)) == model
    finally:
        parts.close()


def test_a_tag_filtered_read_of_tier_files_skips_no_matching_message(tmp_path):
    """A read from the tier fetches at most ``max_bytes`` of a file at a time; with a tag filter
    the units it did not fetch must be read next, not passed over."""
    parts = open_tiered(tmp_path / "store", tier_settings("posix", str(tmp_path / "tier")))
    try:
        for i in range(600):
            put(parts.store, f"k{i}", b"v%d-" % i + bytes(200), TAGS="odd" if i % 2 else "even")
        parts.compact()
        assert parts.release() > 0  # the sealed files are served from the tier now
        everything = read_from(parts.store)
        want = [m.queue_offset for m in everything if m.properties.get("TAGS") == "odd"]
        got: list[int] = []
        offset, end = 0, parts.store.get_max_offset_in_queue(TOPIC, 0)
        while offset < end:
            with parts.store.get_messages("test", TOPIC, 0, offset, 32, max_bytes=2000,
                                          tag_filter="odd") as result:
                got += [m.queue_offset for m in result.messages()]
                assert result.next_begin_offset > offset
                offset = result.next_begin_offset
        assert got == want
    finally:
        parts.close()


def _run_round(root: Path, tier: Path, kill_at: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != KILL_ENV}
    if kill_at:
        env[KILL_ENV] = kill_at
    return subprocess.run([sys.executable, str(PROC), "round", str(root), str(tier), str(NOW)],
                          env=env, capture_output=True, text=True, timeout=120)


def _tier_rows(base: Path, tier: Path) -> list:
    fresh = open_tiered(base / "fresh", tier_settings("posix", str(tier)))
    try:
        return [[o, k, b.hex()] for o, _i, b, k in raw_rows(fresh.store)]
    finally:
        fresh.close()
        shutil.rmtree(base / "fresh")


@pytest.fixture(scope="module")
def tiered_twice(tmp_path_factory):
    """A store whose tier holds a first round, with more versions written since; the tier read
    by a new store before the next round, and after it (run whole in a process of its own)."""
    base = tmp_path_factory.mktemp("tierkill")
    parts = open_tiered(base / "store", tier_settings("posix", str(base / "tier")))
    model: dict[str, bytes] = {}
    write_versions(parts.store, model, 0, 600, 40)
    parts.compact(NOW - 2 * HOUR)
    write_versions(parts.store, model, 600, 400, 60)
    parts.close()
    old = _tier_rows(base, base / "tier")
    whole = base / "whole"
    shutil.copytree(base, whole, ignore=shutil.ignore_patterns("whole"))
    done = _run_round(whole / "store", whole / "tier", None)
    assert done.returncode == 0, done.stderr[-3000:]
    new = _tier_rows(whole, whole / "tier")
    assert new != old
    return base, old, new


@pytest.mark.slow
@pytest.mark.parametrize("step", ["tier-files-uploaded", "tier-manifest-written"])
def test_a_kill_during_the_tier_upload_leaves_the_old_set_or_the_new(tiered_twice, step,
                                                                     tmp_path):
    base, old, new = tiered_twice
    copy = tmp_path / "copy"
    shutil.copytree(base, copy, ignore=shutil.ignore_patterns("whole"))
    died = _run_round(copy / "store", copy / "tier", step)
    assert died.returncode == -signal.SIGKILL, (died.returncode, died.stderr[-3000:])
    got = _tier_rows(copy, copy / "tier")
    assert got == (old if step == "tier-files-uploaded" else new)
    # The killed store reopens, finishes tiering, and leaves no file the manifest does not
    # name.
    parts = open_tiered(copy / "store", tier_settings("posix", str(copy / "tier")))
    parts.compact()
    manifest = tier_manifest(parts)
    parts.close()
    named = {(f.generation, f.name) for f in manifest.queues[(TOPIC, 0)].files}
    found = {(int(p.parts[p.parts.index("COMPACTION") + 1]), p.name[8:])
             for p in (copy / "tier").rglob("*") if p.is_file() and "COMPACTION" in p.parts}
    assert found == named
    assert _tier_rows(copy, copy / "tier") == new
    assert json.loads((copy / "tier").joinpath(*_manifest_parts()).read_text())["generation"] \
        == manifest.generation


def tier_files(tier: Path) -> set[tuple[int, str]]:
    """(generation, name) of every compacted file in a POSIX tier."""
    return {(int(p.parts[p.parts.index("COMPACTION") + 1]), p.name[8:])
            for p in tier.rglob("*") if p.is_file() and "COMPACTION" in p.parts}


@pytest.mark.slow
def test_a_kill_during_a_queues_first_upload_leaves_no_orphan_after_the_open(tmp_path):
    store, tier = tmp_path / "store", tmp_path / "tier"
    parts = open_tiered(store, tier_settings("posix", str(tier)))
    model: dict[str, bytes] = {}
    write_versions(parts.store, model, 0, 600, 40)
    parts.close()
    died = _run_round(store, tier, "tier-files-uploaded")
    assert died.returncode == -signal.SIGKILL, (died.returncode, died.stderr[-3000:])
    assert tier_files(tier)  # uploaded, but no manifest names the queue
    parts = open_tiered(store, tier_settings("posix", str(tier)))
    try:
        assert tier_files(tier) == set()  # the open swept them
        assert parts.ctier.entry(TOPIC, 0) is None
        assert as_table(read_from(parts.store)) == model
        parts.compact()
        named = {(f.generation, f.name) for f in tier_manifest(parts).queues[(TOPIC, 0)].files}
        assert named and tier_files(tier) == named
    finally:
        parts.close()


def _manifest_parts() -> list[str]:
    from stratamq.tiered.naming import broker_config_path

    return broker_config_path("DefaultCluster", "broker-a", MANIFEST_NAME).split("/")
