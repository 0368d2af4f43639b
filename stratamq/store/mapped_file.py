"""A memory-mapped segment file: writes, disk reservation ahead of them, flush, data extents.

Its lifetime (reference counting, ``destroy``) is ``RefCountedMap``'s (``ref_counted_map.py``);
faulting its pages in ahead of the writer is ``page_populate.py``'s.

Ownership: a ``MappedFile`` owns its file descriptor and its ``mmap``. The one writer (the
CommitLog's or a ConsumeQueue's appender, under that owner's lock) writes through
``write_at``; any thread may read through ``select`` while it holds a reference. ``destroy``
marks the file unavailable, unlinks it, and closes the map only when the last reference is
released (or, forcibly, after ``destroy_mapped_file_interval_forcibly``), so a reader never
touches an unmapped file.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
import os
from collections.abc import Sequence
from pathlib import Path

from stratamq.limits import OS_PAGE_SIZE
from stratamq.store.layout import parse_segment_name
from stratamq.store.map_budget import budget
from stratamq.store.page_populate import populate, populate_supported
from stratamq.store.ref_counted_map import RefCountedMap

# populate_supported is imported from here too (tests/test_prefault.py).
__all__ = ["ALLOCATE_AHEAD", "MappedFile", "MappedFileError", "SegmentPositions",
           "populate_supported"]

_ZERO_CHUNK = bytes(1024 * 1024)
ALLOCATE_AHEAD = 4 * 1024 * 1024  # bytes of disk reserved past the write position


class MappedFileError(OSError):
    """A segment file could not be created or mapped (disk full, permissions, wrong size)."""


# A write this large (a slave catching up appends megabytes at once) goes through the file
# descriptor, not the map: a first store into a page of the map faults, and the kernel fills the
# page with zeros (a hole or an unwritten extent) before the copy, while ``pwrite`` of whole
# pages copies once. Measured on 4 MiB writes into a new segment: 62 ms CPU per 128 MiB through
# the map, 35 ms through pwrite. The page cache is one: the map sees the bytes at once. Small
# writes (puts, ConsumeQueue units) stay in the map: a system call each would cost more.
PWRITE_BYTES = 256 * 1024
IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024


def _pwrite_all(fd: int, data: bytes | bytearray | memoryview, position: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, position)
        if n <= 0:  # a regular file raises (ENOSPC, EIO) rather than take nothing; be sure
            raise OSError(errno.EIO, f"pwrite wrote nothing at {position}")
        view, position = view[n:], position + n


class SegmentPositions:
    """Where a segment lies in its queue's byte space and how much of it is written: a
    ``MappedFile``, or a ConsumeQueue file still in memory (consume_queue_pending.py)."""

    path: Path
    file_from_offset: int
    file_size: int
    wrote_position: int

    def _place(self, path: Path, file_size: int) -> None:
        """Where the segment named ``path`` lies: its name is its first offset."""
        start = parse_segment_name(path.name)
        if start is None:
            raise MappedFileError(f"{path}: not a 20-digit segment file name")
        self.path = path
        self.file_from_offset = start
        self.file_size = file_size

    @property
    def file_end_offset(self) -> int:
        return self.file_from_offset + self.file_size

    @property
    def read_position(self) -> int:
        return self.wrote_position

    def is_full(self) -> bool:
        return self.wrote_position >= self.file_size


class MappedFile(RefCountedMap, SegmentPositions):
    """One fixed-size segment file mapped into memory.

    Positions are relative to the file start: ``wrote_position`` is where the next append goes,
    ``committed_position`` equals it (records are written straight into the map), and
    ``flushed_position`` is what is known to be on disk.
    """

    _error = MappedFileError

    def __init__(self, path: Path, file_size: int, *, read_only: bool = False,
                 allocate_ahead: int = ALLOCATE_AHEAD, evictable: bool = False,
                 readahead: bool = True, mapped: bool = True,
                 initial: bytes | bytearray | None = None,
                 known_size: int | None = None) -> None:
        self._place(path, file_size)
        self.read_only = read_only
        self.wrote_position = 0
        self.committed_position = 0
        self.flushed_position = 0
        self.store_timestamp = 0  # store time of the newest record appended (for the checkpoint)
        self._init_lifetime()
        self.allocate_ahead = allocate_ahead
        self._allocated_until = 0  # blocks reserved below this position (see _ensure_allocated)
        self._address: int | None = None  # where the map starts in memory (for prefault)
        self.readahead = readahead
        self.evictable = evictable
        if initial is not None:
            self._create_with(initial)
            return
        if not mapped:
            self._open_unmapped(known_size)
            return
        flags = os.O_RDONLY if read_only else os.O_RDWR | os.O_CREAT
        try:
            self._fd = os.open(path, flags, 0o644)
        except OSError as exc:
            raise MappedFileError(exc.errno, f"cannot open segment {path}: {exc.strerror}") from exc
        try:
            actual = os.fstat(self._fd).st_size
            if actual != file_size:
                if read_only or actual != 0:
                    raise MappedFileError(
                        f"{path}: size {actual} bytes, expected {file_size}; "
                        "segments of one queue must all have the same size"
                    )
                os.ftruncate(self._fd, file_size)  # sparse, like RocketMQ's segments
                # The first bytes the writer will write through the map get their blocks
                # before the map exists: a file created on a full disk fails here, with
                # ENOSPC, never later with SIGBUS. No zeros are written (fallocate).
                try:
                    self._ensure_allocated(0)
                except OSError:
                    with contextlib.suppress(OSError):
                        os.unlink(path)  # no empty segment left behind to be loaded later
                    raise
            access = mmap.ACCESS_READ if read_only else mmap.ACCESS_WRITE
            self._map = mmap.mmap(self._fd, file_size, access=access)
            self._advise()
        except BaseException:
            os.close(self._fd)
            raise
        self.buffer = memoryview(self._map)
        if evictable:
            # The map keeps a descriptor of its own; ours would double the cost of each file.
            os.close(self._fd)
            self._fd = -1
            budget.mapped(self)

    def _open_unmapped(self, known_size: int | None) -> None:
        """An existing evictable file, left unmapped until its first reader or writer
        (``hold``, ``write_at``): a store of many queues reopens without a map per file, and
        recovery reads a queue's newest units with ``pread`` (``read_data``). Its size is
        checked now, as a mapped open would (``known_size``: as the caller's listing saw it)."""
        if not self.evictable:
            raise ValueError(f"{self.path}: only an evictable file may open unmapped")
        try:
            actual = os.stat(self.path).st_size if known_size is None else known_size
        except OSError as exc:
            raise MappedFileError(exc.errno,
                                  f"cannot open segment {self.path}: {exc.strerror}") from exc
        if actual == 0 and not self.read_only:
            # Created, then the process died before its size was set: as a mapped open, give
            # it its size (sparse: nothing to reserve until a write through the map).
            try:
                os.truncate(self.path, self.file_size)
            except OSError as exc:
                raise MappedFileError(exc.errno, f"cannot size segment {self.path}: "
                                                 f"{exc.strerror}") from exc
        elif actual != self.file_size:
            raise MappedFileError(
                f"{self.path}: size {actual} bytes, expected {self.file_size}; "
                "segments of one queue must all have the same size"
            )
        self._fd = -1
        self._map = None
        self.buffer = memoryview(b"")  # no map yet: hold() maps the file

    def _create_with(self, data: bytes | bytearray) -> None:
        """Create an evictable file holding ``data`` at its start, written with ``pwrite`` and
        left unmapped (``hold`` or the next ``write_at`` maps it). A new ConsumeQueue file costs
        no ``fallocate``, ``mmap``, page fault or ``munmap``: a store of many queues of few
        messages creates one per queue. ``pwrite`` reserves the blocks it writes, so a full
        disk is an ENOSPC here (the file removed), never a SIGBUS; the rest stays sparse, and
        a later write through the map reserves its range first (``_ensure_allocated``)."""
        if not self.evictable or self.read_only:
            raise ValueError(f"{self.path}: only a writable evictable file is created unmapped")
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise MappedFileError(exc.errno,
                                  f"cannot open segment {self.path}: {exc.strerror}") from exc
        try:
            actual = os.fstat(fd).st_size
            if actual not in (0, self.file_size):
                raise MappedFileError(
                    f"{self.path}: size {actual} bytes, expected {self.file_size}; "
                    "segments of one queue must all have the same size"
                )
            try:
                if not actual:
                    os.ftruncate(fd, self.file_size)  # sparse, like RocketMQ's segments
                _pwrite_all(fd, data, 0)
            except OSError as exc:
                if not actual:
                    with contextlib.suppress(OSError):
                        os.unlink(self.path)  # no empty segment left behind to be loaded later
                raise MappedFileError(exc.errno, f"cannot write segment {self.path}: "
                                                 f"{exc.strerror}") from exc
        finally:
            os.close(fd)
        self._fd = -1
        self._map = None
        self.buffer = memoryview(b"")  # no map yet: hold() maps the file
        self.wrote_position = self.committed_position = len(data)

    # -- eviction (see map_budget) ----------------------------------------------------------------

    def hold(self) -> bool:
        if not self.evictable:
            return super().hold()
        with self._lock:
            if not self._available:
                return False
            if self._map is None:
                self._remap()
            self._refs += 1
        budget.mapped(self)
        return True

    def _remap(self) -> None:
        """Map an evicted file again (under ``_lock``)."""
        fd = os.open(self.path, os.O_RDONLY if self.read_only else os.O_RDWR)
        try:
            access = mmap.ACCESS_READ if self.read_only else mmap.ACCESS_WRITE
            self._map = mmap.mmap(fd, self.file_size, access=access)
        finally:
            os.close(fd)
        self._advise()
        self.buffer = memoryview(self._map)

    def _advise(self) -> None:
        """Turn the kernel's read-ahead off for a file that asked (``readahead=False``).

        A fault in a map reads around it: with a large ``read_ahead_kb`` (8 MiB on some
        virtual disks) the first unit written into a new 6 MB ConsumeQueue file made the
        kernel fill the page cache with the whole file's zeros, ~5-10 ms of system time per
        file, and as long again to drop those pages when the file was deleted. A ConsumeQueue
        is read a few units at a time, and recovery asks for its written range itself
        (``will_need``)."""
        if self.readahead or self._map is None:
            return
        with contextlib.suppress(OSError, AttributeError, ValueError):
            self._map.madvise(mmap.MADV_RANDOM)

    def try_evict(self) -> bool:
        """Unmap if nothing but the owner holds the file (no reader, no write under way)."""
        with self._lock:
            if self._refs != 1 or self._map is None or self._closed or not self._available:
                return False
            self.buffer.release()
            with contextlib.suppress(BufferError):
                self._map.close()
            self._map = None
            return True

    def prefault(self, start: int, end: int, write: bool = True) -> bool:
        """Fault the pages of ``[start, end)`` in, for writing or (``write=False``) reading,
        ahead of the writer and on another thread, changing no byte (see
        ``store/prefault.py``); disk is reserved first as ``write_at`` would. False if
        nothing was faulted in (an evictable or read-only file, a file being deleted, a
        kernel that cannot)."""
        if self.evictable or self.read_only or end <= start or not self.hold():
            return False
        try:
            if end > self._allocated_until:
                # Racing the writer's own reservation is safe: each side reserves from a
                # position below which disk is already reserved, and fallocate is idempotent.
                self._ensure_allocated(end)
            if self._address is None:
                assert self._map is not None  # not evictable: mapped while held
                view = (ctypes.c_char * self.file_size).from_buffer(self._map)
                self._address = ctypes.addressof(view)
                del view  # the map must not stay exported: closing it would fail
            first = start - start % mmap.PAGESIZE
            return populate(self._address + first, min(end, self.file_size) - first, write)
        except OSError:
            return False  # the writer meets a full disk itself, and reports it
        finally:
            self.release()

    def _ensure_allocated(self, end: int) -> None:
        """Reserve disk blocks up to ``end`` (and a chunk beyond) before writing into the map;
        segments are sparse files, and stay sparse past the reservation (see ``_reserve``)."""
        target = min(self.file_size, end + self.allocate_ahead)
        self._reserve(self._allocated_until, target)
        self._allocated_until = target

    # -- positions ------------------------------------------------------------------------------

    def set_positions(self, position: int) -> None:
        self.wrote_position = self.committed_position = self.flushed_position = position

    # -- writing --------------------------------------------------------------------------------

    def write_at(self, position: int, data: bytes | bytearray | memoryview) -> None:
        end = position + len(data)
        if end > self._allocated_until:
            self._ensure_allocated(end)
        if self.evictable:
            # Written under the lifetime lock rather than between a hold and a release: it
            # keeps eviction and closing out just the same, for one lock instead of three
            # (a ConsumeQueue unit is written per record dispatched).
            with self._lock:
                if not self._available:
                    raise MappedFileError(errno.EBADF, f"{self.path} was deleted or closed")
                if self._map is None:
                    self._remap()
                self._map[position:end] = data  # type: ignore[index]
            budget.mapped(self)
        elif len(data) >= PWRITE_BYTES:
            _pwrite_all(self._fd, data, position)
        else:
            self._map[position:end] = data  # type: ignore[index]
        self.wrote_position = self.committed_position = end

    def write_pieces(self, position: int, pieces: Sequence[bytes | bytearray | memoryview],
                     limit: int) -> int:
        """Write the bytes of ``pieces`` one after another at ``position``, at most ``limit`` of
        them, through the file descriptor (one ``pwritev`` for many pieces: nothing gathered),
        WITHOUT moving ``wrote_position``: readers do not see them until ``publish``. Returns
        how many bytes were written. Only for a file that keeps its descriptor."""
        if self._fd < 0:
            raise MappedFileError(errno.EBADF, f"{self.path}: no descriptor to write through")
        views = []
        left = limit
        for piece in pieces:
            if left <= 0:
                break
            view = memoryview(piece)[:left]
            if view:
                views.append(view)
                left -= len(view)
        total = limit - left
        if position + total > self._allocated_until:
            self._ensure_allocated(position + total)
        at = position
        while views:
            n = os.pwritev(self._fd, views[:IOV_MAX], at)
            if n <= 0:
                raise OSError(errno.EIO, f"pwritev wrote nothing at {at}")
            at += n
            while n:  # drop what was written; a piece written in part keeps its rest
                if n >= len(views[0]):
                    n -= len(views.pop(0))
                else:
                    views[0] = views[0][n:]
                    n = 0
        return total

    def publish(self, end: int) -> None:
        """Make the bytes below ``end`` part of the file (after ``write_pieces``)."""
        if not self.wrote_position <= end <= self.file_size:
            raise ValueError(f"cannot publish up to {end}: wrote position {self.wrote_position}")
        self.wrote_position = self.committed_position = end

    def zero_from(self, position: int) -> int:
        """Zero every non-zero byte from ``position`` to the end; return how many chunks changed.

        Used after truncating a damaged tail so stale records behind it can never be mistaken
        for live ones by a later recovery. Pages that are already zero are only read, so a
        sparse tail stays sparse.
        """
        if not self.hold():
            return 0
        try:
            return self._zero_from(position)
        finally:
            self.release()

    def _zero_from(self, position: int) -> int:
        m = self._map
        assert m is not None
        changed = 0
        chunk = len(_ZERO_CHUNK)
        # Only the file's data extents can hold stale bytes: holes and fallocated-but-unwritten
        # extents read as zeros. Skipping them keeps a reopen from reading a mostly empty 1 GiB
        # segment page by page (SEEK_DATA reports unwritten extents as holes on ext4 and tmpfs).
        for start, end in self._data_extents(position):
            pos = start
            while pos < end:
                n = min(chunk, end - pos)
                if m[pos : pos + n] != _ZERO_CHUNK[:n]:
                    m[pos : pos + n] = _ZERO_CHUNK[:n]
                    changed += 1
                pos += n
        return changed

    def data_end(self) -> int:
        """Where the file's last data extent ends: no byte past it was ever written (holes
        and fallocated, unwritten extents read as zeros). Recovery scans no further: reading
        a hole through the map makes tmpfs allocate a page for it, and on a full tmpfs that
        fault is a SIGBUS that kills the process. ``file_size`` where the file system cannot
        tell (no SEEK_DATA)."""
        extents = self._data_extents(0)
        return extents[-1][1] if extents else 0

    def read_data(self) -> bytes:
        """The file's bytes up to its last data extent (``data_end``), read with ``pread``:
        what recovery scans, without mapping the file (a hole is never read)."""
        with self._descriptor(os.O_RDONLY) as fd:
            extents = self._data_extents(0, fd)
            end = extents[-1][1] if extents else 0
            data = os.pread(fd, end, 0) if end else b""
        if len(data) != end:
            raise MappedFileError(errno.EIO, f"{self.path}: short read ({len(data)} of {end})")
        return data

    def will_need(self, start: int, end: int) -> None:
        """Ask the kernel to read ``[start, end)`` in now, in large requests (a file mapped
        without read-ahead would otherwise be read a page per fault)."""
        if end <= start:
            return
        with contextlib.suppress(OSError, AttributeError), \
                self._descriptor(os.O_RDONLY) as fd:
            os.posix_fadvise(fd, start, end - start, os.POSIX_FADV_WILLNEED)

    def _data_extents(self, position: int, fd: int = -1) -> list[tuple[int, int]]:
        """``(start, end)`` ranges at or after ``position`` that may hold non-zero bytes
        (``fd``: a descriptor of the file the caller has open)."""
        extents = []
        pos = position
        try:
            with (contextlib.nullcontext(fd) if fd >= 0
                  else self._descriptor(os.O_RDONLY)) as fd:
                while pos < self.file_size:
                    try:
                        start = os.lseek(fd, pos, os.SEEK_DATA)
                    except OSError as exc:
                        if exc.errno == errno.ENXIO:  # no data after pos
                            break
                        raise
                    if start >= self.file_size:
                        break
                    end = min(os.lseek(fd, start, os.SEEK_HOLE), self.file_size)
                    extents.append((start, end))
                    pos = end
        except OSError:  # a file system without SEEK_DATA: treat everything as data
            return [(position, self.file_size)]
        return extents

    # -- flushing -------------------------------------------------------------------------------

    def is_able_to_flush(self, least_pages: int) -> bool:
        flush, write = self.flushed_position, self.wrote_position
        if self.is_full():
            return write > flush
        if least_pages > 0:
            return (write // OS_PAGE_SIZE) - (flush // OS_PAGE_SIZE) >= least_pages
        return write > flush

    def flush(self, least_pages: int = 0) -> int:
        """Make written bytes durable if at least ``least_pages`` dirty pages wait; return the
        new flushed position. ``fdatasync`` rather than ``mmap.flush``: it releases the GIL, and
        on Linux it writes back pages dirtied through the map the same as ``msync`` does."""
        if self.read_only or not self.is_able_to_flush(least_pages):
            return self.flushed_position
        if self.evictable:
            # No need to map it again: syncing the file by path writes back the pages the map
            # (current or evicted) dirtied.
            target = self.wrote_position
            try:
                with self._descriptor(os.O_RDONLY) as fd:
                    os.fdatasync(fd)
            except FileNotFoundError:
                return self.flushed_position  # deleted under us: nothing left to keep
            self.flushed_position = max(self.flushed_position, target)
            return self.flushed_position
        if not self.hold():
            return self.flushed_position
        try:
            target = self.wrote_position
            os.fdatasync(self._fd)
            self.flushed_position = max(self.flushed_position, target)
        finally:
            self.release()
        return self.flushed_position

    # -- reading (reference counting is RefCountedMap's) -------------------------------------------

    def select(self, position: int, size: int) -> memoryview:
        """A zero-copy view of ``size`` bytes at ``position``; the caller must hold a reference."""
        return self.buffer[position : position + size]

    def _unmap(self) -> None:
        if self._map is not None:
            self.buffer.release()
        if self.evictable:
            budget.unmapped(self)
        super()._unmap()

    def __repr__(self) -> str:
        return (
            f"MappedFile({self.path.name}, wrote={self.wrote_position}, "
            f"flushed={self.flushed_position}, size={self.file_size})"
        )
