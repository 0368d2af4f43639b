"""CommitLogReader: the one way plugged-in parts read the CommitLog (records, ranges, bytes),
with damage reported through a reporter and walked past."""

from __future__ import annotations

from stratamq import record as codec
from stratamq.config import StoreConfig
from stratamq.message import Message
from stratamq.store.log_reader import CommitLogReader
from stratamq.store.message_store import MessageStore

SEGMENT = 16 * 1024


class Collect:
    def __init__(self) -> None:
        self.seen: list[tuple[int, int, str]] = []

    def corruption(self, offset: int, skipped: int, reason: str) -> None:
        self.seen.append((offset, skipped, reason))


def _store(tmp_path) -> MessageStore:
    return MessageStore(StoreConfig(store_path_root_dir=str(tmp_path / "s"),
                                    mapped_file_size_commit_log=SEGMENT))


def test_records_walk_every_segment_past_blank_fillers(tmp_path):
    with _store(tmp_path).open() as store:
        result = store.put_messages([Message("R", b"%05d" % i * 100, i % 3) for i in range(90)])
        assert result.ok
        assert len(store.commitlog.files.files) >= 3  # records crossed segment ends
        reader = store.log_reader
        got = list(reader.records(0))
        assert [r.physical_offset for r in got] == [m.physical_offset for m in result.messages]
        assert [codec.decode(r.data).body for r in got] == [b"%05d" % i * 100 for i in range(90)]
        # From the middle, and up to an end: exactly the records starting in between.
        mid = result.messages[40].physical_offset
        end = result.messages[60].physical_offset
        assert [r.physical_offset for r in reader.records(mid, end)] == \
            [m.physical_offset for m in result.messages[40:60]]
        one = result.messages[7]
        assert reader.read_bytes(one.physical_offset, one.size) == got[7].data
        # A raw range stops at the end of its segment.
        raw = reader.read_range(0, reader.end())
        assert 0 < len(raw) <= SEGMENT and raw[: got[0].data.__len__()] == got[0].data


def test_damage_is_reported_and_walked_past(tmp_path):
    with _store(tmp_path).open() as store:
        result = store.put_messages([Message("R", b"y" * 300, 0) for _ in range(20)])
        assert result.ok
        store.flush()
        victim = result.messages[5]
        mf = store.commitlog.files.find_by_offset(victim.physical_offset)
        rel = victim.physical_offset - mf.file_from_offset
        mf.buffer[rel + 4 : rel + 8] = b"\xde\xad\xbe\xef"  # its magic code, destroyed
        reporter = Collect()
        got = [r.physical_offset for r in store.log_reader.records(0, reporter=reporter)]
    expected = [m.physical_offset for m in result.messages]
    assert got == expected[:5] + expected[6:]  # everything but the damaged record
    ((offset, skipped, reason),) = reporter.seen
    assert offset == victim.physical_offset and skipped == victim.size
    assert "magic" in reason


def test_a_reader_bounded_by_an_end_does_not_read_past_it(tmp_path):
    with _store(tmp_path).open() as store:
        result = store.put_messages([Message("R", b"z" * 100, 0) for _ in range(10)])
        cut = result.messages[4].physical_offset
        reader = CommitLogReader(store.commitlog.files, end=lambda: cut)
        assert [r.physical_offset for r in reader.records(0)] == \
            [m.physical_offset for m in result.messages[:4]]
        assert len(reader.read_range(0, 10**9)) == cut


def test_a_viewed_range_is_the_read_range_and_lets_the_segment_go(tmp_path):
    """``view_range`` (the master's zero-copy send) holds exactly ``read_range``'s bytes, from
    any start, clipped to its segment and to the reader's end; once the ``with`` is left, the
    segment can be unmapped."""
    with _store(tmp_path).open() as store:
        result = store.put_messages([Message("R", b"%05d" % i * 60, 0) for i in range(120)])
        assert result.ok and len(store.commitlog.files.files) >= 3
        cut = result.messages[100].physical_offset
        for reader in (store.log_reader, CommitLogReader(store.commitlog.files, end=lambda: cut)):
            for start in (0, 5, SEGMENT - 3, SEGMENT, 2 * SEGMENT + 77, cut, reader.end()):
                for end in (start + 1, start + 1000, start + 3 * SEGMENT):
                    with reader.view_range(start, end) as view:
                        assert bytes(view) == reader.read_range(start, end), (start, end)
        first = store.commitlog.files.files[0]
        with store.log_reader.view_range(10, 2000) as view:
            assert len(view) == 1990
            piece = view[100:200]
            del piece
    # Closing a map that a view still exported would fail (and leave it mapped).
    assert first._map is not None and first._map.closed
