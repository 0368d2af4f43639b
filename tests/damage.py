"""Helpers for tests that damage store files on purpose: find records, overwrite bytes."""

from __future__ import annotations

from pathlib import Path

from stratamq import record as codec


def record_starts(segment: Path) -> list[int]:
    """Positions of the records of a CommitLog segment, following sizes from its start (to the
    blank record, zeros or the first damaged header)."""
    data = segment.read_bytes()
    out, pos = [], 0
    while pos + 8 <= len(data):
        size, magic = codec.read_size_and_magic(data, pos)
        if size <= 0 or magic not in (codec.MESSAGE_MAGIC_CODE_V1, codec.MESSAGE_MAGIC_CODE_V2):
            break
        out.append(pos)
        pos += size
    return out


def records(root: Path) -> list[tuple[Path, int, int]]:
    """(segment file, position, size) of every record of a store's CommitLog."""
    out = []
    for segment in sorted((root / "commitlog").iterdir()):
        data = segment.read_bytes()
        out += [(segment, pos, codec.read_size_and_magic(data, pos)[0])
                for pos in record_starts(segment)]
    return out


def patch(path: Path, pos: int, data: bytes) -> None:
    """Overwrite bytes of a file in place."""
    with path.open("r+b") as f:
        f.seek(pos)
        f.write(data)
