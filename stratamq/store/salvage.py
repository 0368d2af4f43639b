"""Set aside what a recovery cut would delete, before it deletes it.

Recovery cuts the CommitLog at the first record that fails its checks (``recovery.py``). At a
torn tail that throws away nothing acknowledged; but a corrupt record or a lost write in the
middle of the log has valid records behind it, and RocketMQ's recovery deletes them with the
cut. StrataMQ keeps them: before the cut, the bytes after it go to
``<store>/damaged/<time>-<cut offset>/`` (``docs/formats/damaged-commitlog.md``):

* the cut segment's tail, from the cut to its last non-zero byte, is *copied* (the segment
  itself stays in the log, cut and zeroed from there);
* every later segment is *hard-linked* there whole (it costs no space; the log then drops its
  own name for it).

The set-aside files are plain CommitLog bytes named by the CommitLog offset of their first
byte, so records in them carry their own offsets and can be read with the record codec (and,
after a repair, put back). Nothing here decides whether to cut: it only makes the cut lossless.
A file system too full for the copy raises ``OSError`` (ENOSPC) before anything is cut.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from stratamq.store.layout import segment_name
from stratamq.store.mapped_file import MappedFile

__all__ = ["set_aside_after_cut"]

log = logging.getLogger(__name__)

_CHUNK = 1 << 20


def _last_nonzero_end(mf: MappedFile, start: int) -> int:
    """Position just past the last non-zero byte at or after ``start`` (``start`` if none)."""
    end = start
    for _, extent_end in mf._data_extents(start):
        end = max(end, extent_end)
    while end > start:  # reserved (fallocated) space reads as data but holds zeros
        low = max(start, end - _CHUNK)
        chunk = bytes(mf.buffer[low:end]).rstrip(b"\0")
        if chunk:
            return low + len(chunk)
        end = low
    return start


def _copy(mf: MappedFile, start: int, stop: int, dest: Path) -> None:
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        pos = start
        while pos < stop:
            written = os.write(fd, mf.buffer[pos:min(stop, pos + _CHUNK)])
            pos += written
        os.fsync(fd)
    finally:
        os.close(fd)


def set_aside_after_cut(files: list[MappedFile], cut: int, damaged_root: Path) -> Path | None:
    """Keep every byte of ``files`` after CommitLog offset ``cut`` under ``damaged_root``.

    Returns the directory written (None when there was nothing after the cut). On ENOSPC or
    any other write error, what was written so far is removed and the error raised: the
    caller must not cut then."""
    pieces: list[tuple[MappedFile, int, int]] = []  # (segment, from, to) within the segment
    for mf in files:
        if mf.file_end_offset <= cut:
            continue
        start = max(0, cut - mf.file_from_offset)
        stop = _last_nonzero_end(mf, start)
        if stop > start:
            pieces.append((mf, start, stop))
    if not pieces:
        return None
    stamp = time.strftime("%Y%m%d%H%M%S", time.gmtime())
    into = damaged_root / f"{stamp}-{segment_name(cut)}"
    into.mkdir(parents=True)
    try:
        for mf, start, stop in pieces:
            dest = into / segment_name(mf.file_from_offset + start)
            if start == 0 and mf.file_from_offset > cut:
                os.link(mf.path, dest)  # a whole later segment: a second name, no copy
            else:
                _copy(mf, start, stop, dest)
        dir_fd = os.open(into, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:
        for made in into.iterdir():
            made.unlink()
        into.rmdir()
        raise
    return into
