"""``PosixFileSegment``: tier files in a directory (RocketMQ's ``PosixFileSegment``).

Each upload is ``pwrite`` at the committed position followed by ``fdatasync`` (RocketMQ opens
the file ``rwd``), so a commit is on disk when it returns. A write cut short (a full disk, a
crash) leaves a prefix of the same bytes: the next commit writes them again at the same
position (see ``base.FileSegment``). Directories are created on the first write, not when a
segment object is made, so reading a tier never creates anything.

Thread-safety: descriptors are opened per call; positioned reads and writes need no lock.
"""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

from stratamq.tiered.drivers.base import FileSegment, SegmentLimits, TierIOError
from stratamq.tiered.naming import FileSegmentType

__all__ = ["PosixFileSegment"]

log = logging.getLogger(__name__)


class PosixFileSegment(FileSegment):
    def __init__(self, limits: SegmentLimits, file_type: FileSegmentType, file_path: str,
                 base_offset: int, full_path: Path) -> None:
        super().__init__(limits, file_type, file_path, base_offset)
        self._full_path = full_path

    @property
    def path(self) -> str:
        return str(self._full_path)

    def get_size(self) -> int:
        try:
            return self._full_path.stat().st_size
        except FileNotFoundError:
            return 0
        except OSError as exc:
            raise TierIOError(f"cannot stat tier file {self._full_path}: {exc}") from exc

    def exists(self) -> bool:
        return self._full_path.exists()

    def create_file(self) -> None:
        self._full_path.parent.mkdir(parents=True, exist_ok=True)
        self._full_path.touch(exist_ok=True)

    def destroy_file(self) -> None:
        self.close()
        try:
            self._full_path.unlink()
            log.info("deleted tier file %s", self._full_path)
        except FileNotFoundError:
            pass

    def read0(self, position: int, length: int) -> bytes:
        try:
            fd = os.open(self._full_path, os.O_RDONLY)
        except OSError as exc:
            raise TierIOError(f"cannot open tier file {self._full_path}: {exc}") from exc
        try:
            data = os.pread(fd, length, position)
        finally:
            os.close(fd)
        if len(data) != length:
            raise TierIOError(f"tier file {self._full_path}: {length} bytes at {position} asked, "
                              f"{len(data)} there")
        return data

    def commit0(self, data: bytes, position: int, append: bool) -> None:
        self._full_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self._full_path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            if position > size:
                raise TierIOError(errno.EINVAL, f"tier file {self._full_path}: write at "
                                  f"{position} would leave a gap after {size} bytes")
            view = memoryview(data)
            at = position
            while view:
                written = os.pwrite(fd, view, at)
                view = view[written:]
                at += written
            os.fdatasync(fd)
        finally:
            os.close(fd)

    def truncate0(self, size: int) -> None:
        try:
            os.truncate(self._full_path, size)
        except FileNotFoundError:
            if size:
                raise TierIOError(f"tier file {self._full_path} is gone") from None
        except OSError as exc:
            raise TierIOError(f"cannot truncate tier file {self._full_path}: {exc}") from exc
