"""Page-cache pages put in place ahead of a slave's copy, off its receive path (``WarmAhead``).

A slave catching up writes its master's log at memory speed, and much of what a write costs
is not the copy but getting a page for each 4 KiB: the kernel takes a free page and, on a
virtual machine whose free pages went back to its host (free-page reporting), the host faults
it in first. Measured on the development VM (perf, ``bench/ha.py``): writing 128 MB into new
page-cache pages costs 20-30 ms of CPU when the pages were recently freed and 0.1-0.3 s when
they come back from the host, nearly all of it in the copy into them
(``copy_folio_from_iter_atomic``); the bare socket copy the benchmark compares against pays
the same, at random.

``WarmAhead`` takes that part off the thread that receives: its own thread maps the segment
file read-only and asks the kernel to populate a window ahead of the log's end
(``MADV_POPULATE_READ``: page-cache pages for the holes and reserved-but-unwritten blocks,
zero-filled and clean, so nothing is written back for them). When the copy reaches them, a
write only copies. This is RocketMQ's ``warmMappedFile`` idea without its writes: nothing in
the file changes, so a warm that runs late, early or over bytes being cut is harmless.
Measured (128 MB cold catch-ups, A/B): the receiving thread's CPU 0.22 -> 0.11 s (medians),
the slave's total unchanged (0.255 -> 0.245 s): the work moves to a second core, where one is
free. The window is small (``WARM_AHEAD_BYTES``): pages warmed past where the stream ends are
wasted (a 32 MiB window cost 27% more CPU on a 128 MB catch-up). The system call goes through
ctypes, which releases the GIL; the writer only moves a target and never waits for the
warmer.

Best effort: without Linux 5.14's ``MADV_POPULATE_READ`` (or glibc's ``madvise``) it does
nothing; a segment not created yet (the allocator makes the next one in the background) is
looked at again when the writer moves on.

Thread-safety: ``advance`` and ``close`` from the appending thread; the warming runs on the
instance's own daemon thread, which owns its map (and drops it after a second with nothing
to do, so a segment deleted meanwhile is not kept alive by it).
"""

from __future__ import annotations

import ctypes
import errno
import logging
import mmap
import os
import threading
from pathlib import Path

from stratamq.store.layout import segment_name

__all__ = ["WARM_AHEAD_BYTES", "WarmAhead"]

log = logging.getLogger(__name__)

_MADV_POPULATE_READ = 22  # Linux 5.14+
WARM_AHEAD_BYTES = 8 * 1024 * 1024  # how far past the log's end pages are populated
WARM_STEP = 2 * 1024 * 1024  # one system call; the writer's target is looked at between them
IDLE_RELEASE = 1.0  # s with nothing to do before the warmer lets go of its map
_IDLE = (-1, -1)  # _next_range's answer when that time has passed

try:
    _libc = ctypes.CDLL(None, use_errno=True)  # calls through CDLL release the GIL
    _madvise = _libc.madvise
    _madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    _madvise.restype = ctypes.c_int
    _mmap = _libc.mmap
    _mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                      ctypes.c_int, ctypes.c_long)
    _mmap.restype = ctypes.c_void_p
    _munmap = _libc.munmap
    _munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
    _munmap.restype = ctypes.c_int
    _available = True
except (OSError, AttributeError):  # no glibc (not Linux)
    _available = False
_MAP_FAILED = ctypes.c_void_p(-1).value


class _Unsupported(Exception):
    """The kernel does not know MADV_POPULATE_READ: there is nothing to do."""


class _Segment:
    """One segment file mapped read-only by the warmer: its own map, made through libc
    (Python's ``mmap`` gives no address of a read-only map), never the store's."""

    def __init__(self, path: Path, start: int, size: int) -> None:
        self.start = start
        self.size = size
        fd = os.open(path, os.O_RDONLY)
        try:
            if os.fstat(fd).st_size != size:  # still being created
                raise OSError(errno.EAGAIN, f"{path} is not {size} bytes yet")
            address = _mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        finally:
            os.close(fd)  # the map keeps the file
        if address is None or address == _MAP_FAILED:
            raise OSError(ctypes.get_errno(), f"cannot map {path}")
        self.address: int = address

    def populate(self, rel: int, size: int) -> bool:
        """Populate ``[rel, rel + size)``; False if the kernel could not (the file changed
        under the map); raises _Unsupported on a kernel without the call."""
        if _madvise(self.address + rel, size, _MADV_POPULATE_READ) == 0:
            return True
        if ctypes.get_errno() == errno.EINVAL:
            raise _Unsupported
        return False

    def close(self) -> None:
        _munmap(self.address, self.size)


class WarmAhead:
    """Keeps the page cache of a log's segment files populated ``ahead`` bytes past its end;
    see the module docstring. ``directory`` holds segments of ``segment_size`` bytes named by
    their start offset."""

    def __init__(self, directory: Path, segment_size: int, ahead: int = WARM_AHEAD_BYTES
                 ) -> None:
        self.directory = directory
        self.segment_size = segment_size
        self.ahead = ahead
        self.warmed_bytes = 0  # how much it populated so far (status, tests)
        self._end = 0  # the log's end, as the writer last said
        self._cond = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None

    def advance(self, end: int) -> None:
        """The log now ends at ``end`` (it may also have moved back: a cut). Starts the
        warmer's thread the first time."""
        if not _available or self._closed:
            return
        with self._cond:
            self._end = end
            self._cond.notify()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, daemon=True, name="warm-ahead")
            self._thread.start()

    def close(self) -> None:
        """Stop the thread (it lets go of its map)."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(10)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _next_range(self, warmed: int, holding: bool) -> tuple[int, int] | None:
        """Wait until some of the window is not populated: (from, to), or None once closed.
        While ``holding`` a map, waits at most IDLE_RELEASE seconds and then answers
        _IDLE (the caller lets go of its map)."""
        with self._cond:
            while not self._closed:
                end = self._end
                if warmed < end or warmed > end + self.ahead:
                    warmed = end  # the writer went past the window, or the log was cut
                if warmed < end + self.ahead:
                    return warmed, end + self.ahead
                if not holding:
                    self._cond.wait()
                elif not self._cond.wait(IDLE_RELEASE):
                    return _IDLE
        return None

    def _wait_for_writer(self, end: int) -> None:
        with self._cond:
            while not self._closed and self._end == end:
                self._cond.wait()

    def _run(self) -> None:
        segment: _Segment | None = None
        warmed = 0  # populated from the log's end up to here
        try:
            while (todo := self._next_range(warmed, segment is not None)) is not None:
                if todo == _IDLE:
                    if segment is not None:
                        segment.close()
                        segment = None
                    continue
                warmed, goal = todo
                start = warmed - warmed % self.segment_size
                if segment is None or segment.start != start:
                    if segment is not None:
                        segment.close()
                        segment = None
                    try:
                        segment = _Segment(self.directory / segment_name(start), start,
                                           self.segment_size)
                    except OSError:  # not created yet, or cut away: when the writer moves on
                        self._wait_for_writer(self._end)
                        continue
                rel = warmed - start
                rel -= rel % mmap.PAGESIZE
                size = min(WARM_STEP, self.segment_size - rel, goal - start - rel)
                if not segment.populate(rel, size):
                    segment.close()
                    segment = None
                    self._wait_for_writer(self._end)
                    continue
                warmed = start + rel + size
                self.warmed_bytes += size
        except _Unsupported:
            log.debug("warm-ahead: this kernel has no MADV_POPULATE_READ; not warming")
        finally:
            if segment is not None:
                segment.close()
