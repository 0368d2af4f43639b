"""``ObjectFileSegment``: tier files on an object store, through ``fsspec`` (``s3fs`` for
``s3://``; any other fsspec URL works the same way).

Objects cannot be appended to, so a tier file is a *directory of parts*: every commit writes
one immutable object named by the 20-digit position of its first byte in the file::

    <file>/00000000000000000000      the first upload
    <file>/00000000000000004194304   the next one, starting where the first ended

The file's size is the sum of its parts, which must be contiguous from 0. A put either lands
whole or not at all, and a retry puts the same bytes under the same name, so a failed upload
can never leave a duplicate or a gap: after a failure the listing says whether the part is
there (``base.FileSegment`` corrects the commit position from it). A read of a range takes the
parts that overlap it (one ranged GET each). Spec: ``docs/formats/tier-layout.md``.

Thread-safety: any thread; the cached part list is replaced under a lock.
"""

from __future__ import annotations

import bisect
import logging
import threading
from typing import Any

from stratamq.tiered.drivers.base import FileSegment, SegmentLimits, TierCorrupt, TierIOError
from stratamq.tiered.naming import FileSegmentType, parse_part_name, part_name

__all__ = ["ObjectFileSegment", "list_directory", "list_parts"]

log = logging.getLogger(__name__)

MAX_RECORDED_PARTS = 256  # part positions a file's metadata records (more: it is listed)


def list_directory(fs: Any, path: str) -> tuple[list[tuple[str, int]], list[str]]:
    """(name and size of each object, name of each subdirectory) directly under ``path``;
    both empty when there is nothing. On S3 one ``ListObjectsV2`` per page: s3fs's ``ls``
    of a missing path also lists its parent, a second request on every new file."""
    call = getattr(fs, "call_s3", None)
    if call is None or not hasattr(fs, "split_path"):
        try:
            entries = fs.ls(path, detail=True, refresh=True)
        except FileNotFoundError:
            return [], []
        files = [(e["name"].rstrip("/").rsplit("/", 1)[-1], int(e.get("size") or 0))
                 for e in entries if e.get("type", "file") == "file"]
        dirs = [e["name"].rstrip("/").rsplit("/", 1)[-1] for e in entries
                if e.get("type") == "directory"]
        return files, dirs
    bucket, key, _ = fs.split_path(path)
    prefix = key.rstrip("/") + "/" if key else ""
    files, dirs = [], []
    request = {"Bucket": bucket, "Prefix": prefix, "Delimiter": "/"}
    while True:
        page = call("list_objects_v2", **request)
        files += [(o["Key"][len(prefix):], int(o["Size"])) for o in page.get("Contents", [])]
        dirs += [p["Prefix"][len(prefix):].rstrip("/") for p in page.get("CommonPrefixes", [])]
        if not page.get("IsTruncated"):
            return files, dirs
        request["ContinuationToken"] = page["NextContinuationToken"]


def list_parts(fs: Any, path: str) -> list[tuple[int, int]]:
    """(position, size) of each part of the file at ``path``, sorted; [] when there is none.
    Objects under the file that are not parts are ignored."""
    try:
        files, _dirs = list_directory(fs, path)
    except Exception as exc:  # botocore / aiohttp errors are not OSErrors
        raise TierIOError(f"cannot list tier file {path}: {exc}") from exc
    parts = []
    for name, size in files:
        position = parse_part_name(name)
        if position is not None:
            parts.append((position, size))
    parts.sort()
    return parts


def _contiguous_size(path: str, parts: list[tuple[int, int]]) -> int:
    end = 0
    for position, size in parts:
        if position != end:
            raise TierCorrupt(f"tier file {path}: part at {position} does not follow the "
                              f"parts before it (they end at {end})")
        end += size
    return end


class ObjectFileSegment(FileSegment):
    def __init__(self, limits: SegmentLimits, file_type: FileSegmentType, file_path: str,
                 base_offset: int, fs: Any, full_path: str, *, exclusive: bool = False) -> None:
        super().__init__(limits, file_type, file_path, base_offset)
        self._fs = fs
        self.exclusive = exclusive  # parts are never replaced (see commit0)
        self._full_path = full_path
        self._parts_lock = threading.Lock()
        self._starts: list[int] = []  # cached part positions, sorted
        self._sizes: list[int] = []
        self._listed = False

    @property
    def path(self) -> str:
        return self._full_path

    def _refresh(self) -> int:
        parts = list_parts(self._fs, self._full_path)
        size = _contiguous_size(self._full_path, parts)
        with self._parts_lock:
            self._starts = [p for p, _ in parts]
            self._sizes = [s for _, s in parts]
            self._listed = True
        return size

    def get_size(self) -> int:
        return self._refresh()

    def mark_new(self) -> None:
        with self._parts_lock:
            self._starts, self._sizes, self._listed = [], [], True

    def part_positions(self) -> list[int] | None:
        limit = self.commit_position
        with self._parts_lock:
            if not self._listed:
                return None
            positions = [p for p in self._starts if p < limit]
        # A file of many small uploads (a quiet queue) is listed instead: the metadata stays
        # small.
        return positions if len(positions) <= MAX_RECORDED_PARTS else None

    def known_parts(self, positions: list[int], size: int) -> None:
        starts = sorted(p for p in positions if 0 <= p < size)
        if not starts or starts[0] != 0:
            return  # not a layout this file can have: list it when it is read
        sizes = [b - a for a, b in zip(starts, [*starts[1:], size], strict=True)]
        with self._parts_lock:
            self._starts, self._sizes, self._listed = starts, sizes, True

    def exists(self) -> bool:
        return bool(list_parts(self._fs, self._full_path))

    def create_file(self) -> None:
        pass  # a file exists once its first part is written

    def destroy_file(self) -> None:
        self.close()
        try:
            self._fs.rm(self._full_path, recursive=True)
            log.info("deleted tier file %s", self._full_path)
        except FileNotFoundError:
            pass
        except Exception as exc:
            raise TierIOError(f"cannot delete tier file {self._full_path}: {exc}") from exc

    def read0(self, position: int, length: int) -> bytes:
        end = position + length
        with self._parts_lock:
            covered = self._listed and self._starts and (
                self._starts[-1] + self._sizes[-1] >= end)
        if not covered:
            self._refresh()
        with self._parts_lock:
            starts, sizes = self._starts, self._sizes
        pieces = []
        at = position
        index = max(0, bisect.bisect_right(starts, position) - 1)
        while at < end:
            if index >= len(starts) or starts[index] > at:
                raise TierIOError(f"tier file {self._full_path}: no part holds byte {at}")
            part_end = starts[index] + sizes[index]
            stop = min(end, part_end)
            name = f"{self._full_path}/{part_name(starts[index])}"
            try:
                pieces.append(self._fs.cat_file(name, start=at - starts[index],
                                                end=stop - starts[index]))
            except Exception as exc:
                raise TierIOError(f"cannot read {stop - at} bytes of {name}: {exc}") from exc
            at = stop
            index += 1
        data = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        if len(data) != length:
            raise TierIOError(f"tier file {self._full_path}: {length} bytes at {position} "
                              f"asked, {len(data)} read")
        return data

    def commit0(self, data: bytes, position: int, append: bool) -> None:
        name = f"{self._full_path}/{part_name(position)}"
        try:
            if self.exclusive:
                self._put_exclusive(name, data)
            else:
                self._fs.pipe_file(name, data)
        except TierIOError:
            raise
        except Exception as exc:
            raise TierIOError(f"cannot upload {len(data)} bytes to {name}: {exc}") from exc
        with self._parts_lock:
            index = bisect.bisect_left(self._starts, position)
            if index < len(self._starts) and self._starts[index] == position:
                self._sizes = [*self._sizes[:index], len(data), *self._sizes[index + 1:]]
            else:
                self._starts = [*self._starts[:index], position, *self._starts[index:]]
                self._sizes = [*self._sizes[:index], len(data), *self._sizes[index:]]

    def _put_exclusive(self, name: str, data: bytes) -> None:
        """Write the part only where there is none (a conditional put, ``If-None-Match: *``).
        One already there with these very bytes is this upload landed before (a retry after
        a lost answer, or another master of the group that uploaded the same acknowledged
        records at the same place); other bytes are another master's: refused."""
        from stratamq.tiered.group_metadata import precondition_failed

        try:
            self._fs.pipe_file(name, data, IfNoneMatch="*")
            return
        except Exception as exc:
            if not precondition_failed(exc):
                raise
        self._fs.invalidate_cache(name)
        if bytes(self._fs.cat_file(name)) != data:
            raise TierIOError(f"tier part {name} holds other bytes (written by another master "
                              "of the group): not replaced")

    def truncate0(self, size: int) -> None:
        """Delete the parts at or after ``size``; a cut inside a part is refused (parts are
        whole uploads of whole records, so a crash cannot leave one torn)."""
        for position, length in list_parts(self._fs, self._full_path):
            if position < size < position + length:
                raise TierCorrupt(f"tier file {self._full_path}: cannot cut at {size}, inside "
                                  f"the part at {position}")
            if position >= size:
                try:
                    self._fs.rm_file(f"{self._full_path}/{part_name(position)}")
                except Exception as exc:
                    raise TierIOError(f"cannot delete a part of {self._full_path}: {exc}") \
                        from exc
        self._refresh()
