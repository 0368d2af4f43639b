"""Damaged and lost tier data on an embedded store with a POSIX tier: the tier's files are
damaged for real (a body byte flipped, a ConsumeQueue unit overwritten with another's, a file
truncated or deleted) after the local copies were cleaned up, and what a reader gets is
checked: a damaged record is never served (its neighbours are), said once at ERROR, counted
and shown in ``tier status``; a read over lost data skips the whole gap in one read, or is
served by the local store when it still holds the messages."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from damage import patch
from s3_server import S3Server
from test_tier_store import TOPIC, drop_local, fill, open_tiered, read_all, tier_config

from stratamq import record as codec
from stratamq.store.consume_queue_format import UNIT, UNIT_SIZE
from stratamq.store.results import GetMessageStatus
from stratamq.tiered.naming import cluster_dir


def queue_dir(tmp_path: Path, queue_id: int = 0) -> Path:
    return tmp_path / "tier" / cluster_dir("DefaultCluster") / "broker-a" / TOPIC / str(queue_id)


def tier_files(tmp_path: Path, kind: str) -> list[Path]:
    """A queue's tier files of one kind (COMMIT_LOG / CONSUME_QUEUE), in offset order."""
    return sorted((queue_dir(tmp_path) / kind).iterdir(),
                  key=lambda p: int(p.name[-20:]))


def tier_unit(tmp_path: Path, queue_offset: int) -> tuple[Path, int, tuple[int, int, int]]:
    """(CONSUME_QUEUE file, position, (flat offset, size, tags code)) of a unit in the tier."""
    for path in reversed(tier_files(tmp_path, "CONSUME_QUEUE")):
        base = int(path.name[-20:]) // UNIT_SIZE
        if base <= queue_offset:
            at = (queue_offset - base) * UNIT_SIZE
            return path, at, UNIT.unpack_from(path.read_bytes(), at)
    raise AssertionError(f"no unit {queue_offset}")


def flat_position(tmp_path: Path, flat_offset: int) -> tuple[Path, int]:
    """The tier CommitLog file and position holding a flat CommitLog offset."""
    for path in reversed(tier_files(tmp_path, "COMMIT_LOG")):
        base = int(path.name[-20:])
        if base <= flat_offset:
            return path, flat_offset - base
    raise AssertionError(f"no file holds {flat_offset}")


def read_following(store, queue_id: int) -> tuple[dict[int, bytes], list[tuple]]:
    """Every record of a queue, following ``next_begin_offset`` from 0 as a reader does, and
    each read that brought no record: (offset, status, next offset)."""
    out: dict[int, bytes] = {}
    empty = []
    offset = 0
    high = store.get_max_offset_in_queue(TOPIC, queue_id)
    while offset < high:
        with store.get_messages("reader", TOPIC, queue_id, offset, 16) as got:
            for rec in got.records:
                out[rec.queue_offset] = bytes(rec.buffer)
            if not got.records:
                empty.append((offset, got.status, got.next_begin_offset))
            assert got.next_begin_offset > offset, (offset, got.status)
            offset = got.next_begin_offset
    return out, empty


def errors(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.parametrize("cache", [True, False])
def test_a_flipped_body_byte_is_never_served(tmp_path, caplog, cache):
    store, tier = open_tiered(tier_config(tmp_path, read_ahead_cache_enable=cache))
    try:
        fill(store, 200)
        before = read_all(store, 0)
        assert tier.flush(60)
        drop_local(store, tier)
        _path, _at, (flat, size, _code) = tier_unit(tmp_path, 40)
        path, at = flat_position(tmp_path, flat)
        body = at + 88 + 4  # the body follows the 88-byte header and its length
        patch(path, body + 20, bytes([path.read_bytes()[body + 20] ^ 0x01]))
        with caplog.at_level(logging.ERROR):
            for _ in range(2):  # read twice: said once
                got = read_all(store, 0)
                assert got == {o: b for o, b in before.items() if o != 40}
            # Nor by a lookup: by key (the tier index), by offset message id.
            damaged = codec.decode(before[40])
            assert store.query_messages(TOPIC, "order-80") == []
            assert store.look_message_by_msg_id(damaged.msg_id) is None
            assert store.query_messages(TOPIC, "order-82")[0].body == codec.decode(
                before[41]).body
        said = [m for m in errors(caplog) if "queue offset 40 is corrupt" in m]
        assert len(said) == 1 and "body CRC" in said[0], errors(caplog)
        row = next(r for r in tier.status(lambda t, q: None) if r["queue_id"] == 0)
        assert row["corrupt_records"] == 1 and row["corrupt_offsets"] == [40]
        assert tier.fetcher.damage.corrupt_records == 1
    finally:
        store.close()
        tier.close()


def test_a_unit_overwritten_with_another_s_serves_neither_twice(tmp_path, caplog):
    store, tier = open_tiered(tier_config(tmp_path))
    try:
        fill(store, 200)
        before = read_all(store, 0)
        assert tier.flush(60)
        drop_local(store, tier)
        path, at, _unit = tier_unit(tmp_path, 20)
        other_path, other_at, _ = tier_unit(tmp_path, 10)
        patch(path, at, other_path.read_bytes()[other_at:other_at + UNIT_SIZE])
        with caplog.at_level(logging.ERROR):
            got = read_all(store, 0)
            with store.get_messages("g", TOPIC, 0, 20, 4) as one:  # a read from it
                offsets = [r.queue_offset for r in one.records]
                assert offsets and offsets == list(range(21, 21 + len(offsets)))
        assert got == {o: b for o, b in before.items() if o != 20}
        assert [codec.decode(b).queue_offset for b in got.values()] == sorted(got)
        said = [m for m in errors(caplog) if "queue offset 20 is corrupt" in m]
        assert len(said) == 1 and f"{TOPIC}/0 at queue offset 10" in said[0]
    finally:
        store.close()
        tier.close()


def test_a_damaged_tier_record_the_local_store_holds_is_served_from_it(tmp_path, caplog):
    """FORCE reads the tier first; a record that fails its checks there is read locally."""
    store, tier = open_tiered(tier_config(tmp_path, tiered_storage_level="FORCE"))
    try:
        fill(store, 200)
        before = read_all(store, 0)
        assert tier.flush(60)
        _path, _at, (flat, _size, _code) = tier_unit(tmp_path, 7)
        path, at = flat_position(tmp_path, flat)
        patch(path, at + 100, b"\xff\xfe")
        with caplog.at_level(logging.ERROR):
            assert read_all(store, 0) == before
        assert tier.fetcher.damage.corrupt_records == 1
        assert tier.fetcher.served > 50  # the others (but a local read's worth) from the tier
    finally:
        store.close()
        tier.close()


SMALL_FILES = {"tiered_store_commit_log_max_size": 8 * 1024,
               "tiered_store_consume_queue_max_size": 20 * UNIT_SIZE}


@pytest.mark.parametrize("kind,how", [("COMMIT_LOG", "truncate"), ("COMMIT_LOG", "delete"),
                                      ("CONSUME_QUEUE", "delete")])
def test_lost_tier_data_is_a_gap_crossed_in_one_read(tmp_path, caplog, kind, how):
    store, tier = open_tiered(tier_config(tmp_path, **SMALL_FILES))
    try:
        fill(store, 200)
        before = read_all(store, 0)
        assert tier.flush(60)
        drop_local(store, tier)
        local_low = store.local_source.offsets(TOPIC, 0).low
        victim = tier_files(tmp_path, kind)[1]
        if how == "truncate":
            with victim.open("r+b") as f:
                f.truncate(victim.stat().st_size // 2)
        else:
            victim.unlink()
        with caplog.at_level(logging.ERROR):
            got, empty = read_following(store, 0)
        lost = sorted(set(before) - set(got))
        assert lost and lost == list(range(lost[0], lost[-1] + 1))  # one run of offsets
        assert lost[-1] < local_low
        assert got == {o: b for o, b in before.items() if o not in lost}
        # The whole gap in one read: OFFSET_FOUND_NULL with the offset after it.
        assert empty == [(lost[0], GetMessageStatus.OFFSET_FOUND_NULL, lost[-1] + 1)]
        said = [m for m in errors(caplog) if "is missing" in m]
        assert len(said) == 1 and f"{lost[0]}..{lost[-1]}" in said[0] and victim.name in said[0]
        row = next(r for r in tier.status(lambda t, q: None) if r["queue_id"] == 0)
        assert row["missing_ranges"] == [[lost[0], lost[-1] + 1]]
        assert row["missing_messages"] == len(lost)
        read_following(store, 0)
        assert len([m for m in errors(caplog) if "is missing" in m]) == 1  # said once
    finally:
        store.close()
        tier.close()


def test_what_the_tier_lost_is_served_by_the_local_store_that_still_holds_it(tmp_path):
    """FORCE reads the tier first: files it lost fall through to the local copies; with the
    local head cleaned up (while the tier held it: clean-up keeps what the tier lost), a read
    at 0 skips to what the local store still holds."""
    store, tier = open_tiered(tier_config(tmp_path, tiered_storage_level="FORCE",
                                          **SMALL_FILES))
    try:
        fill(store, 200)
        before = read_all(store, 0)
        assert tier.flush(60)
        saved = {path: path.read_bytes() for path in tier_files(tmp_path, "COMMIT_LOG")}
        for path in saved:
            path.unlink()
        got, empty = read_following(store, 0)
        assert got == before and not empty  # all of it from the local store
        for path, data in saved.items():  # the tier holds it again: the local head may go
            path.write_bytes(data)
        drop_local(store, tier)
        for path in saved:
            path.unlink()
        local_low = store.local_source.offsets(TOPIC, 0).low
        got, empty = read_following(store, 0)
        assert got == {o: b for o, b in before.items() if o >= local_low}
        assert empty == [(0, GetMessageStatus.OFFSET_FOUND_NULL, local_low)]
    finally:
        store.close()
        tier.close()


def test_objects_gone_from_s3_are_a_gap_crossed_in_one_read(tmp_path, caplog):
    """On an object store a file is a directory of parts: all of one file's parts deleted."""
    server = S3Server().start()
    try:
        config = tier_config(tmp_path, "s3", server, **SMALL_FILES)
        store, tier = open_tiered(config)
        try:
            fill(store, 200)
            before = read_all(store, 0)
            assert tier.flush(60)
            drop_local(store, tier)
            victim = tier.files.get(TOPIC, 0).commit_log.segments[2]
            fs = server.filesystem()
            fs.rm(victim.path, recursive=True)
            with caplog.at_level(logging.ERROR):
                got, empty = read_following(store, 0)
            lost = sorted(set(before) - set(got))
            assert lost and lost == list(range(lost[0], lost[-1] + 1))
            assert got == {o: b for o, b in before.items() if o not in lost}
            assert empty == [(lost[0], GetMessageStatus.OFFSET_FOUND_NULL, lost[-1] + 1)]
            assert len([m for m in errors(caplog) if "is missing" in m]) == 1
        finally:
            store.close()
            tier.close()
    finally:
        server.stop()


def test_an_unmounted_posix_tier_is_not_a_gap(tmp_path):
    store, tier = open_tiered(tier_config(tmp_path))
    try:
        fill(store, 200)
        before = read_all(store, 0)
        assert tier.flush(60)
        drop_local(store, tier)
        (tmp_path / "tier").rename(tmp_path / "elsewhere")  # as if its file system went away
        with store.get_messages("g", TOPIC, 0, 0, 8) as got:
            assert (got.status, got.next_begin_offset) == (GetMessageStatus.OFFSET_FOUND_NULL, 0)
        assert tier.fetcher.damage.missing_messages == 0
        (tmp_path / "elsewhere").rename(tmp_path / "tier")
        assert read_all(store, 0) == before
    finally:
        store.close()
        tier.close()


def test_a_tier_that_does_not_answer_is_not_a_gap(tmp_path):
    """The S3 server goes away: a read of what only the tier holds is answered with the same
    offset (try again), nothing is skipped or said missing; once the server is back, every
    message is served."""
    server = S3Server().start()
    try:
        store, tier = open_tiered(tier_config(tmp_path, "s3", server))
        try:
            fill(store, 200)
            before = read_all(store, 0)
            assert tier.flush(60)
            drop_local(store, tier)
            server.stop()
            with store.get_messages("g", TOPIC, 0, 0, 8) as got:
                assert (got.status, got.next_begin_offset) == (
                    GetMessageStatus.OFFSET_FOUND_NULL, 0)
            assert tier.fetcher.damage.missing_messages == 0
            server.start()
            assert read_all(store, 0) == before
        finally:
            store.close()
            tier.close()
    finally:
        server.stop()
