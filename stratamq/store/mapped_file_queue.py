"""An ordered run of equal-size segment files forming one logical byte space.

Used for the CommitLog (segments named by start offset, 1 GiB by default) and for every
ConsumeQueue (files named by byte offset of their first unit). Contracts:

* one appender thread calls ``last_mapped_file(create=True)``, ``truncate_dirty_files`` and
  ``flush``; ``delete_expired`` and ``delete_below`` come from the clean-up thread;
* readers on any thread call ``find_by_offset``, ``min_offset``, ``max_offset``: the list of
  files is replaced, never mutated in place, so a reader's snapshot stays consistent.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING

from stratamq.store.layout import parse_segment_name, segment_name
from stratamq.store.mapped_file import ALLOCATE_AHEAD, MappedFile, MappedFileError
from stratamq.store.service import ServiceThread

if TYPE_CHECKING:
    from stratamq.store.consume_queue_pending import PendingFile, PendingFiles

log = logging.getLogger(__name__)


class AllocateMappedFileService(ServiceThread):
    """Creates the next segment (and the one after it) in the background.

    The appender asks for the file it needs now plus the following one; the second is created
    while the first fills, so a roll-over rarely waits on ``fallocate`` and ``mmap``.
    """

    join_timeout = 10.0

    def __init__(self) -> None:
        super().__init__("allocate-mapped-file")
        self._requests: dict[Path, Future[MappedFile]] = {}
        self._sizes: dict[Path, int] = {}
        self._queue: queue.Queue[Path | None] = queue.Queue()
        self._lock = threading.Lock()

    def _submit(self, path: Path, size: int) -> Future[MappedFile]:
        with self._lock:
            fut = self._requests.get(path)
            if fut is None:
                fut = Future()
                self._requests[path] = fut
                self._sizes[path] = size
                self._queue.put(path)
            return fut

    def request(self, path: Path, next_path: Path, size: int, timeout: float = 30.0) -> MappedFile:
        fut = self._submit(path, size)
        self._submit(next_path, size)
        try:
            return fut.result(timeout)
        finally:
            with self._lock:
                self._requests.pop(path, None)

    def run(self) -> None:
        while True:
            path = self._queue.get()
            if path is None:
                return
            with self._lock:
                fut = self._requests.get(path)
                size = self._sizes.pop(path, 0)
            if fut is None or fut.done():
                continue
            try:
                fut.set_result(MappedFile(path, size))
            except BaseException as exc:  # reported to whoever waits on the file
                fut.set_exception(exc)

    def on_shutdown(self) -> None:
        self._queue.put(None)  # the thread waits on the queue, not on wakeup()

    def shutdown(self) -> None:
        """Stop the thread and remove pre-allocated files nobody took (they hold no data)."""
        super().shutdown()
        with self._lock:
            pending = list(self._requests.values())
            self._requests.clear()
        for fut in pending:
            if fut.done() and fut.exception() is None:
                fut.result().destroy()


class MappedFileQueue:
    """Segment files of one directory, ordered by start offset."""

    def __init__(
        self,
        directory: Path,
        mapped_file_size: int,
        *,
        allocator: AllocateMappedFileService | None = None,
        read_only: bool = False,
        allocate_ahead: int = ALLOCATE_AHEAD,
        evictable: bool = False,
        readahead: bool = True,
        pending: PendingFiles | None = None,
    ) -> None:
        self.directory = directory
        self.readahead = readahead  # False: the kernel reads no more than a fault's page
        self.allocate_ahead = allocate_ahead
        self.evictable = evictable  # files may be unmapped while idle (see map_budget)
        self.mapped_file_size = mapped_file_size
        self.allocator = allocator
        # Where ``create_with`` leaves a new file's bytes in memory, to be created off the
        # appender's path (ConsumeQueues; see consume_queue_pending.py); None: created at once.
        self.pending = pending
        self.read_only = read_only
        self._files: list[MappedFile] = []
        # Serialises list replacements: the appender adds at the tail while the clean-up
        # thread drops from the head; without it one replacement could undo the other.
        self._files_lock = threading.Lock()
        self.flushed_where = 0
        self.committed_where = 0
        # Store time of the newest record known to be flushed: feeds the checkpoint.
        self.store_timestamp = 0

    @staticmethod
    def size_on_disk(directory: Path) -> int | None:
        """The size of existing segments, so a store opens with the sizes it was written with."""
        if not directory.is_dir():
            return None
        for entry in sorted(directory.iterdir()):
            if parse_segment_name(entry.name) is not None and entry.is_file():
                return entry.stat().st_size
        return None

    # -- loading --------------------------------------------------------------------------------

    def load(self, listing: list[tuple[int, os.DirEntry[str]]] | None = None) -> None:
        """Map every segment in the directory; refuse gaps and size mismatches clearly.
        ``listing``: the segments as the caller listed them, (start offset, entry) sorted
        (evictable files: their sizes are checked from the entries, nothing is opened)."""
        if listing is not None and self.evictable:
            self._load_unmapped(listing)
            return
        if not self.directory.is_dir():
            if not self.read_only:
                self.directory.mkdir(parents=True, exist_ok=True)
            return
        names = sorted(
            (start, entry)
            for entry in self.directory.iterdir()
            if entry.is_file() and (start := parse_segment_name(entry.name)) is not None
        )
        files: list[MappedFile] = []
        try:
            for start, path in names:
                if files and start != files[-1].file_end_offset:
                    raise MappedFileError(
                        f"{self.directory}: segment {path.name} does not follow "
                        f"{files[-1].path.name} (size {self.mapped_file_size}); a file is missing"
                    )
                if start % self.mapped_file_size:
                    raise MappedFileError(f"{path}: start offset not a multiple of the file size")
                # An evictable file stays unmapped until first used (see MappedFile.hold).
                mf = MappedFile(path, self.mapped_file_size, read_only=self.read_only,
                                allocate_ahead=self.allocate_ahead, evictable=self.evictable,
                                readahead=self.readahead, mapped=not self.evictable)
                mf.set_positions(self.mapped_file_size)  # recovery sets the real end
                files.append(mf)
        except BaseException:
            for mf in files:
                mf.close()
            raise
        self._files = files

    def _load_unmapped(self, listing: list[tuple[int, os.DirEntry[str]]]) -> None:
        files: list[MappedFile] = []
        size = self.mapped_file_size
        for start, entry in listing:
            if files and start != files[-1].file_end_offset:
                raise MappedFileError(
                    f"{self.directory}: segment {entry.name} does not follow "
                    f"{files[-1].path.name} (size {size}); a file is missing")
            if start % size:
                raise MappedFileError(f"{entry.path}: start offset not a multiple of the file size")
            mf = MappedFile(self.directory / entry.name, size, read_only=self.read_only,
                            allocate_ahead=self.allocate_ahead, evictable=True,
                            readahead=self.readahead, mapped=False,
                            known_size=entry.stat().st_size)
            mf.set_positions(size)  # recovery sets the real end
            files.append(mf)
        self._files = files

    # -- lookups --------------------------------------------------------------------------------

    @property
    def files(self) -> list[MappedFile]:
        return self._files

    def first(self) -> MappedFile | None:
        files = self._files
        return files[0] if files else None

    def last(self) -> MappedFile | None:
        files = self._files
        return files[-1] if files else None

    def min_offset(self) -> int:
        first = self.first()
        return first.file_from_offset if first else 0

    def max_offset(self) -> int:
        """End of the written bytes across all segments."""
        last = self.last()
        return last.file_from_offset + last.read_position if last else 0

    def find_by_offset(self, offset: int) -> MappedFile | None:
        files = self._files
        if not files:
            return None
        index = (offset - files[0].file_from_offset) // self.mapped_file_size
        if 0 <= index < len(files):
            mf = files[index]
            if mf.file_from_offset <= offset < mf.file_end_offset:
                return mf
        return None

    # -- appending ------------------------------------------------------------------------------

    def last_mapped_file(self, start_offset: int = 0, create: bool = True) -> MappedFile | None:
        """The file to append to; creates the next one if there is none or the last is full."""
        last = self.last()
        if last is not None and not last.is_full():
            return last
        if not create or self.read_only:
            return last
        if last is None:
            create_offset = start_offset - start_offset % self.mapped_file_size
        else:
            create_offset = last.file_end_offset
        path = self.directory / segment_name(create_offset)
        if self.allocator is not None:
            next_path = self.directory / segment_name(create_offset + self.mapped_file_size)
            mf = self.allocator.request(path, next_path, self.mapped_file_size)
        else:
            self.directory.mkdir(parents=True, exist_ok=True)
            mf = MappedFile(path, self.mapped_file_size, allocate_ahead=self.allocate_ahead,
                            evictable=self.evictable, readahead=self.readahead)
        with self._files_lock:
            self._files = [*self._files, mf]
        return mf

    def create_with(self, data: bytes | bytearray,
                    start_offset: int = 0) -> MappedFile | PendingFile:
        """Create the next file (for an empty queue: the one holding ``start_offset``) with
        ``data`` at its start, written without mapping it (evictable files only; see
        ``MappedFile._create_with``), or, with ``pending``, a pending file in its place that
        is created later. The last file must be full."""
        if not self.evictable:
            raise ValueError(f"{self.directory}: only evictable files are created unmapped")
        last = self.last()
        if last is not None and not last.is_full():
            raise MappedFileError(f"{self.directory}: the last file has room; nothing to create")
        if last is None:
            create_offset = start_offset - start_offset % self.mapped_file_size
        else:
            create_offset = last.file_end_offset
        path = self.directory / segment_name(create_offset)
        if self.pending is not None:
            pf = self.pending.start(self, path, data)
            if pf is not None:
                with self._files_lock:
                    self._files = [*self._files, pf]  # type: ignore[list-item]
                return pf
        self.directory.mkdir(parents=True, exist_ok=True)
        mf = MappedFile(path, self.mapped_file_size,
                        allocate_ahead=self.allocate_ahead, evictable=True,
                        readahead=self.readahead, initial=data)
        with self._files_lock:
            self._files = [*self._files, mf]
        return mf

    # -- flushing -------------------------------------------------------------------------------

    def flush(self, least_pages: int = 0) -> bool:
        """Flush the segment holding ``flushed_where``; True if nothing was left to flush."""
        mf = self.find_by_offset(self.flushed_where) or (
            self.first() if self.flushed_where == 0 else None
        )
        if mf is None:
            return True
        timestamp = mf.store_timestamp
        where = mf.file_from_offset + mf.flush(least_pages)
        done = where == self.flushed_where
        self.flushed_where = where
        self.committed_where = max(self.committed_where, where)
        if timestamp:
            self.store_timestamp = max(self.store_timestamp, timestamp)
        return done

    def flush_all(self) -> None:
        """Flush until every written byte is on disk."""
        for _ in range(len(self._files) + 2):
            if self.flush(0) and self.flushed_where >= self.max_offset():
                return

    # -- truncation and deletion ----------------------------------------------------------------

    def truncate_dirty_files(self, offset: int, *, zero_tail: bool = True) -> None:
        """Make ``offset`` the end of the data: later files are deleted, the containing one is
        cut and its tail zeroed, so stale records or units behind the cut can never be taken
        for live ones by a later recovery (a read-only queue only stops short of them).
        ``zero_tail=False``: the caller read the tail and found only zeros."""
        with self._files_lock:  # a pending file is not created meanwhile (PendingFiles.create)
            self._truncate_dirty_files(offset, zero_tail)

    def _truncate_dirty_files(self, offset: int, zero_tail: bool) -> None:
        keep: list[MappedFile] = []
        for mf in self._files:
            if mf.file_end_offset <= offset:
                keep.append(mf)
            elif mf.file_from_offset <= offset:
                mf.set_positions(offset - mf.file_from_offset)
                if zero_tail and not self.read_only:
                    mf.zero_from(mf.wrote_position)
                keep.append(mf)
            else:
                if self.read_only:
                    mf.close()  # a read-only view of the store just stops short
                else:
                    log.warning("deleting dirty segment %s beyond offset %d", mf.path, offset)
                    mf.destroy()
        self._files = keep
        self.flushed_where = self.committed_where = min(offset, self.max_offset())

    def delete_below(self, offset: int, interval_forcibly_ms: int = 0) -> list[MappedFile]:
        """Delete whole files that end at or before ``offset`` (never the last file)."""
        with self._files_lock:
            files = self._files
            doomed = [mf for mf in files[:-1] if mf.file_end_offset <= offset]
            if doomed:
                self._files = files[len(doomed):]
        if doomed:
            for mf in doomed:
                mf.destroy(interval_forcibly_ms)
        return doomed

    def destroy(self) -> None:
        """Delete every file (a queue removed with its topic)."""
        with self._files_lock:
            files, self._files = self._files, []
        for mf in files:
            mf.destroy()
        self.flushed_where = self.committed_where = 0

    def close(self) -> None:
        with self._files_lock:
            files, self._files = self._files, []
        for mf in files:
            mf.close()
