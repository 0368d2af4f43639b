"""``MemoryFileSegment``: tier files kept in this process's memory (RocketMQ's test provider).

Everything is lost when the process exits, so a memory tier suits tests and trials only: with
it, local CommitLog files deleted after upload are gone for good at the next start. Files live
in one process-wide table keyed by path, so a store closed and opened again in the same process
finds its tier again.

Thread-safety: the table and each file's bytes are guarded by one lock.
"""

from __future__ import annotations

import threading

from stratamq.tiered.drivers.base import FileSegment, SegmentLimits, TierIOError
from stratamq.tiered.naming import FileSegmentType

__all__ = ["MemoryFileSegment", "memory_files"]

_FILES: dict[str, bytearray] = {}
_LOCK = threading.Lock()


def memory_files() -> dict[str, bytearray]:
    """The process-wide table (path -> bytes), for status and tests."""
    return _FILES


class MemoryFileSegment(FileSegment):
    def __init__(self, limits: SegmentLimits, file_type: FileSegmentType, file_path: str,
                 base_offset: int, full_path: str) -> None:
        super().__init__(limits, file_type, file_path, base_offset)
        self._full_path = full_path

    @property
    def path(self) -> str:
        return self._full_path

    def get_size(self) -> int:
        with _LOCK:
            data = _FILES.get(self._full_path)
            return 0 if data is None else len(data)

    def exists(self) -> bool:
        with _LOCK:
            return self._full_path in _FILES

    def create_file(self) -> None:
        with _LOCK:
            _FILES.setdefault(self._full_path, bytearray())

    def destroy_file(self) -> None:
        self.close()
        with _LOCK:
            _FILES.pop(self._full_path, None)

    def read0(self, position: int, length: int) -> bytes:
        with _LOCK:
            data = _FILES.get(self._full_path)
            if data is None or position + length > len(data):
                raise TierIOError(f"memory tier file {self._full_path}: {length} bytes at "
                                  f"{position} are not there")
            return bytes(data[position : position + length])

    def commit0(self, data: bytes, position: int, append: bool) -> None:
        with _LOCK:
            stored = _FILES.setdefault(self._full_path, bytearray())
            if position > len(stored):
                raise TierIOError(f"memory tier file {self._full_path}: write at {position} "
                                  f"would leave a gap after {len(stored)} bytes")
            stored[position : position + len(data)] = data

    def truncate0(self, size: int) -> None:
        with _LOCK:
            stored = _FILES.get(self._full_path)
            if stored is not None:
                del stored[size:]
