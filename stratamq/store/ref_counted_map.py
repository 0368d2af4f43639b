"""The lifetime of a file mapped into memory: reference counting that keeps the map alive for
readers, and disk reservation ahead of writes into it.

Shared by the segment files (``mapped_file.py``) and the index files (``index_file.py``). The
owner holds one reference from birth; readers on any thread take and give back their own;
``destroy`` unlinks at once and unmaps when the last reference goes (or forcibly after a
delay), so a reader never touches an unmapped file.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = ["RefCountedMap"]


class RefCountedMap:
    """The lifetime of a file mapped into memory and shared with readers.

    The owner holds one reference from birth; each reader takes one with ``hold()`` and gives
    it back with ``release()``. ``destroy()`` unlinks the file at once and unmaps it when the
    last reader lets go, or forcibly after ``interval_forcibly_ms`` (RocketMQ's
    ``destroyMapedFileIntervalForcibly``), so a reader never sees an unmapped file by surprise.
    Subclasses set ``path``, ``_fd`` and ``_map`` and may extend ``_unmap``.
    """

    path: Path
    _fd: int  # -1 for an evictable file (see map_budget)
    _map: mmap.mmap | None  # None while an evictable file is unmapped
    _error: type[OSError] = OSError  # what a failed reservation raises

    @contextlib.contextmanager
    def _descriptor(self, flags: int = os.O_RDWR) -> Iterator[int]:
        """The file's descriptor; an evictable file keeps none, and opens one for the call."""
        if self._fd >= 0:
            yield self._fd
            return
        fd = os.open(self.path, flags)
        try:
            yield fd
        finally:
            os.close(fd)

    def _reserve(self, start: int, end: int) -> None:
        """Give ``[start, end)`` real disk blocks before writing into the map there: writing
        into a hole of a map on a full disk raises SIGBUS and kills the process, while
        ``fallocate`` turns "disk full" into an ordinary OSError (ENOSPC) a caller can report."""
        try:
            with self._descriptor() as fd:
                os.posix_fallocate(fd, start, end - start)
        except OSError as exc:
            raise self._error(
                exc.errno, f"cannot reserve disk space in {self.path}: {exc.strerror}"
            ) from exc

    def _init_lifetime(self) -> None:
        self._refs = 1  # the owner's reference, dropped by destroy()
        self._available = True
        self._closed = False
        self._lock = threading.Lock()
        self._destroy_requested_at = 0.0

    def hold(self) -> bool:
        with self._lock:
            if not self._available:
                return False
            self._refs += 1
            return True

    def release(self) -> None:
        with self._lock:
            self._refs -= 1
            close = self._refs <= 0 and not self._closed
        if close:
            self._close_map()

    @property
    def available(self) -> bool:
        return self._available

    @property
    def closed(self) -> bool:
        return self._closed

    def destroy(self, interval_forcibly_ms: int = 0) -> bool:
        """Stop new readers, delete the file, and unmap once readers let go.

        Returns True once the map is closed. Called again after ``interval_forcibly_ms`` it drops
        the readers' references.
        """
        now = time.monotonic()
        with self._lock:
            first = self._available
            if first:
                self._available = False
                self._destroy_requested_at = now
                self._refs -= 1  # the owner's reference
            elif (now - self._destroy_requested_at) * 1000 >= interval_forcibly_ms:
                self._refs = 0
            close = self._refs <= 0 and not self._closed
        if first:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)  # readers keep their map; the name is gone at once
        if close:
            self._close_map()
        return self._closed

    def close(self) -> None:
        """Unmap without deleting (shutdown)."""
        with self._lock:
            self._available = False
            self._refs = 0
        self._close_map()

    def _close_map(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._unmap()

    def _unmap(self) -> None:
        # A view exported without a reference may still be alive; the map is freed with it.
        if self._map is not None:
            with contextlib.suppress(BufferError):
                self._map.close()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
