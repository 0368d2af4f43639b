"""ConsumeQueue files not created yet: a new file's units wait in memory (``PendingFile``)
while the flush thread creates the real files in batches (``PendingFiles.create_all``).

Why: creating a ConsumeQueue file (its directory, ``open``, ``ftruncate``, the first units'
``pwrite``) costs ~0.5-1 ms of system time on ext4, so 10,000 new queues of one message each
spent 5-10 s on the dispatch path, where RocksDB ConsumeQueues take a batch write.

Contracts:

* a ``PendingFile`` sits in its queue's ``MappedFileQueue`` where the real file will be, and
  answers as a ``MappedFile`` does (positions, ``buffer`` slices, ``write_at``), so ``find``
  and every read of the queue serve its units exactly as file units;
* ``create`` makes the real file (``MappedFile(initial=...)``: sparse, the units written with
  ``pwrite``, later writes reserve their blocks first) and swaps it in, under the queue's
  ``_files_lock`` and the pending file's lock: a write racing the swap goes to the new file;
* nothing in memory only is ever claimed durable: the file store's ``flush`` creates every
  pending file before flushing, and raises if one could not be created, so the checkpoint's
  ConsumeQueue progress stays behind them and a crash re-dispatches them from the CommitLog;
  a close that cannot create them keeps the abort marker and saves no snapshot;
* memory is bounded (``PENDING_MAX_BYTES``): past it, files are created on the dispatch path
  as before.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from stratamq.store.consume_queue_format import UNIT, is_blank_unit
from stratamq.store.mapped_file import MappedFile, MappedFileError, SegmentPositions

if TYPE_CHECKING:
    from stratamq.store.mapped_file_queue import MappedFileQueue

log = logging.getLogger(__name__)

# Units held in memory by all pending files of a store together (1.6 million units); a write
# past it creates its file on the writer's thread.
PENDING_MAX_BYTES = 32 * 1024 * 1024
NAME_MAX = 255  # bytes of one directory entry's name (Linux)


class PendingFile(SegmentPositions):
    """A ConsumeQueue file's units before the file exists; see the module docstring."""

    evictable = True
    store_timestamp = 0  # a ConsumeQueue file never feeds the checkpoint's store time

    def __init__(self, path: Path, file_size: int, data: bytes | bytearray,
                 files: MappedFileQueue, owner: PendingFiles) -> None:
        self._place(path, file_size)
        self.files = files
        # Never shrinks (a cut zeroes its tail, as in a file): a reader's slice below its
        # read position always holds whole units.
        self.buffer = bytearray(data)
        self.wrote_position = self.committed_position = len(data)
        self.flushed_position = 0  # nothing of it is on disk
        self.lock = threading.Lock()
        self.moved_to: MappedFile | None = None  # the real file, once created
        self.dropped = False  # cut away, destroyed or closed: never to be created
        self._owner = owner

    @property
    def available(self) -> bool:
        return not self.dropped

    def hold(self) -> bool:
        return not self.dropped  # the buffer outlives the swap: nothing to keep mapped

    def release(self) -> None:
        pass

    def write_at(self, position: int, data: bytes | bytearray | memoryview) -> None:
        end = position + len(data)
        grown = 0
        with self.lock:
            real = self.moved_to
            if real is None:
                if self.dropped:
                    raise MappedFileError(errno.EBADF, f"{self.path} was deleted or closed")
                grown = max(0, end - len(self.buffer))
                self.buffer[position:end] = data
                self.wrote_position = self.committed_position = end
        if real is not None:  # created meanwhile: the file holds the same bytes below here
            real.write_at(position, data)
        elif grown and self._owner.grew(self, grown):
            self._owner.create(self)  # over the memory bound: create it now, on this thread

    def set_positions(self, position: int) -> None:
        with self.lock:
            real = self.moved_to
            if real is None:
                self.wrote_position = self.committed_position = position
        if real is not None:
            real.set_positions(position)

    def zero_from(self, position: int) -> int:
        with self.lock:
            real = self.moved_to
            if real is None:
                tail = len(self.buffer) - position
                if tail > 0:
                    self.buffer[position:] = bytes(tail)
                return 1 if tail > 0 else 0
        return real.zero_from(position)

    def flush(self, least_pages: int = 0) -> int:
        return self.flushed_position  # in memory: nothing to flush until it is created

    def read_data(self) -> bytes:
        return bytes(self.buffer[:self.wrote_position])

    def destroy(self, interval_forcibly_ms: int = 0) -> bool:
        self.close()
        return True

    def close(self) -> None:
        with self.lock:
            self.dropped = True
        self._owner.forget(self)

    def __repr__(self) -> str:
        return f"PendingFile({self.path.name}, wrote={self.wrote_position})"


class PendingFiles:
    """The pending files of one file ConsumeQueue store, and their creation."""

    def __init__(self, max_bytes: int = PENDING_MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._files: dict[PendingFile, None] = {}  # in creation order
        self._bytes = 0
        # The last creation that failed (a full disk): what ``check`` raises.
        self.error: MappedFileError | None = None
        # Told of a creation that failed, at once (the store stops dispatch with it: the
        # error a file created on the dispatch path would have raised, naming the record).
        self.on_error: Callable[[MappedFileError], None] | None = None

    def __len__(self) -> int:
        return len(self._files)

    def start(self, files: MappedFileQueue, path: Path, data: bytes | bytearray
              ) -> PendingFile | None:
        """A pending file at ``path`` holding ``data``, or None when the file should be made
        now: memory is at its bound, or the topic cannot be a directory name (the error that
        makes dispatch skip its record comes from the creation, as before)."""
        if len(os.fsencode(path.parent.parent.name)) > NAME_MAX:
            return None
        with self._lock:
            if self._bytes + len(data) > self.max_bytes:
                return None
            pf = PendingFile(path, files.mapped_file_size, data, files, self)
            self._files[pf] = None
            self._bytes += len(pf.buffer)
        return pf

    def grew(self, pf: PendingFile, n: int) -> bool:
        """``pf`` took ``n`` more bytes; True if memory is now over its bound."""
        with self._lock:
            if pf in self._files:  # not if it was created (and forgotten) meanwhile
                self._bytes += n
            return self._bytes > self.max_bytes

    def forget(self, pf: PendingFile) -> None:
        with self._lock:
            if self._files.pop(pf, 0) is None:
                self._bytes -= len(pf.buffer)

    def create(self, pf: PendingFile) -> MappedFile | None:
        """Create ``pf``'s real file with its units and put it in its place; None if it is
        no longer wanted (cut away, destroyed). Raises ``MappedFileError`` if the file cannot
        be created (the units stay pending and readable)."""
        files = pf.files
        with files._files_lock, pf.lock:
            if pf.moved_to is not None:
                return pf.moved_to
            if pf.dropped or not any(f is pf for f in files._files):
                pf.dropped = True
                real = None
            else:
                try:
                    try:
                        os.mkdir(files.directory)
                    except FileExistsError:
                        pass
                    except FileNotFoundError:  # not through create_all: no topic directory
                        os.makedirs(files.directory, exist_ok=True)
                except OSError as exc:
                    raise MappedFileError(exc.errno, f"cannot create ConsumeQueue directory "
                                          f"{files.directory}: {exc.strerror}") from exc
                real = MappedFile(pf.path, pf.file_size, allocate_ahead=files.allocate_ahead,
                                  evictable=True, readahead=files.readahead,
                                  initial=pf.buffer[:pf.wrote_position])
                files._files = [real if f is pf else f for f in files._files]
                pf.moved_to = real
        self.forget(pf)
        return real

    def create_all(self) -> MappedFileError | None:
        """Create every file pending now, one directory per topic made once (the flush
        thread, each round); the first error, if one stopped it (the rest stay pending)."""
        with self._lock:
            batch = list(self._files)
        if not batch:
            return None
        topics: set[Path] = set()
        failing = batch[0]
        try:
            for pf in batch:
                failing = pf
                if pf.dropped:  # its topic deleted meanwhile: make no directory for it
                    self.forget(pf)
                    continue
                topic_dir = pf.files.directory.parent
                if topic_dir not in topics:
                    try:
                        os.makedirs(topic_dir.parent, exist_ok=True)
                        try:
                            os.mkdir(topic_dir)
                        except FileExistsError:
                            if not topic_dir.is_dir():
                                raise NotADirectoryError(errno.ENOTDIR,
                                                         os.strerror(errno.ENOTDIR)) from None
                    except OSError as exc:
                        raise MappedFileError(exc.errno, f"cannot create ConsumeQueue "
                                              f"directory {topic_dir}: {exc.strerror}") from exc
                    topics.add(topic_dir)
                self.create(pf)
        except MappedFileError as exc:
            error = MappedFileError(exc.errno, f"{exc.strerror} (the ConsumeQueue file of "
                                    f"{_first_record(failing)})")
            if self.error is None or str(self.error) != str(error):
                log.error("%s; %d ConsumeQueue files wait in memory (readable; a crash loses "
                          "nothing: the next open re-dispatches them from the CommitLog)",
                          error, len(self._files))
                if self.on_error is not None:
                    self.on_error(error)
            self.error = error
            return error
        self.error = None
        return None

    def check(self) -> None:
        """Raise the creation error that keeps files pending (dispatch stops on it, as on a
        file it failed to create itself)."""
        error = self.error
        if error is not None and self._files:
            raise MappedFileError(error.errno, f"{error}; the ConsumeQueue units waiting for "
                                  "their files stay in memory until the store is closed")


def _first_record(pf: PendingFile) -> str:
    """The first record a pending file's units point at, for an error message."""
    topic_dir = pf.files.directory
    where = f"topic {topic_dir.parent.name[:80]!r}, queue {topic_dir.name}"
    for offset, size, _code in UNIT.iter_unpack(pf.buffer[:pf.wrote_position]):
        if not is_blank_unit(offset, size, _code):
            return f"the record at CommitLog offset {offset}, {where}"
    return where
