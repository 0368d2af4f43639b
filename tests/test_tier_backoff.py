"""A broken tier costs little (issue 26, item 8): with the POSIX tier's directory replaced by a
file (every write and listing fails), the uploader and ``tier flush`` back off instead of
retrying in a loop, the log gets one line when the tier starts failing and one when it works
again (not one per attempt), and ``tier status`` shows ``lastError`` and since when."""

from __future__ import annotations

import logging
import shutil
import time

from test_tier_store import fill, open_tiered, tier_config


def _tier_lines(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records
            if r.name.startswith("stratamq.tiered") and r.levelno >= logging.WARNING]


def test_a_broken_posix_tier_backs_off_and_says_so_once(tmp_path, caplog):
    cfg = tier_config(tmp_path)
    store, tier = open_tiered(cfg, background=True)
    try:
        fill(store, 100)
        assert tier.flush(60)
        root = tmp_path / "tier"
        aside = tmp_path / "tier-aside"
        shutil.move(root, aside)
        root.write_text("not a directory")  # the tier is broken: nothing can be written

        caplog.clear()
        caplog.set_level(logging.DEBUG, logger="stratamq.tiered")
        before = int(time.time() * 1000)
        fill(store, 100, start=100)
        flushes = 3
        assert [tier.flush(2) for _ in range(flushes)] == [False] * flushes
        failing = [r for r in _tier_lines(caplog) if "failing" in r.getMessage()]
        assert len(failing) == 1 and failing[0].levelno == logging.ERROR
        flush_lines = [r for r in _tier_lines(caplog) if "tier flush" in r.getMessage()]
        assert len(flush_lines) == flushes  # each flush says it did not finish, once
        assert len(_tier_lines(caplog)) == 1 + flushes  # nothing per attempt
        attempts = tier.uploader.health.failures
        assert attempts >= 2  # it was tried again (each a DEBUG line), with back-off between
        assert len([r for r in caplog.records if "still failing" in r.getMessage()]) == \
            attempts - 1

        rows = tier.status(lambda t, q: None)
        assert rows and all(r["lastError"] and "Not a directory" in r["lastError"]
                            for r in rows)
        assert all(before <= r["lastErrorSince"] <= int(time.time() * 1000) for r in rows)

        root.unlink()
        shutil.move(aside, root)  # repaired: the next attempt (after the back-off) works
        caplog.clear()
        assert tier.flush(60)
        works = [r for r in _tier_lines(caplog) if "works again" in r.getMessage()]
        assert len(works) == 1 and len(_tier_lines(caplog)) == 1
        rows = tier.status(lambda t, q: None)
        assert all(r["lastError"] is None and r["lastErrorSince"] is None for r in rows)
        assert [r["tier_committed_offset"] for r in rows] == [100, 100]
    finally:
        store.close()
        tier.close()
