"""``FileSegment``: one tier file (RocketMQ's ``FileSegment`` + ``FileSegmentProvider``).

The container layer appends buffers to a segment; ``commit()`` uploads what was appended since
the last commit, in one write at the committed position. Only the last segment of a
``FlatAppendFile`` is ever appended to; the others are immutable.

Commit with correction (never a duplicate, never a gap): a commit that fails keeps the exact
bytes it tried to write (``_inflight``) and the position it wrote them at. The next commit
first asks the driver for the file's real size:

* size == position + len(inflight): the failed write did land (a lost reply): done;
* size == position, or position < size < position + len (a write that stopped part-way on a
  POSIX file): write the same bytes at the same position again (a retry rewrites the landed
  prefix with identical bytes);
* anything else (the file is shorter than what was committed, or longer than what was written):
  someone else changed the file. Nothing is written, the error is logged, and the commit fails
  every time until an operator looks: the local CommitLog keeps the data (the uploader holds
  retention back).

RocketMQ instead takes the remote size as the new commit position and writes the whole buffer
there again, which duplicates a partly written buffer on a POSIX file.

Drivers implement the provider part: ``get_size``, ``exists``, ``create_file``,
``destroy_file``, ``read0`` and ``commit0``; a driver raises ``TierIOError`` (or any
``OSError``) when the backend fails.

Thread-safety: ``append`` and the position getters from any thread (under ``_file_lock``); one
``commit`` runs at a time (a second concurrent call returns False at once); ``read`` from any
thread.
"""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from enum import Enum

from stratamq.tiered.naming import FileSegmentType

__all__ = ["AppendResult", "FileSegment", "SegmentLimits", "TierCorrupt", "TierIOError"]

log = logging.getLogger(__name__)

Buffer = bytes | bytearray | memoryview  # what append copies from

NO_TIMESTAMP = 2**63 - 1  # RocketMQ's Long.MAX_VALUE: no message yet


class TierIOError(OSError):
    """The tier backend failed (the network, the server, the disk); the operation may be
    retried."""


class TierCorrupt(TierIOError):
    """A tier file is not what the metadata and the committed positions say it is."""


class AppendResult(Enum):
    """RocketMQ's ``AppendResult``."""

    SUCCESS = "SUCCESS"
    FILE_FULL = "FILE_FULL"
    FILE_CLOSED = "FILE_CLOSED"
    BUFFER_FULL = "BUFFER_FULL"
    UNKNOWN_ERROR = "UNKNOWN_ERROR"


class SegmentLimits:
    """What segments need from the settings: file sizes by type, the buffer bound, and the
    bound on uploads running at once (``tieredStoreMaxPendingLimit``), shared by every
    segment a factory makes."""

    def __init__(self, commit_log_max_size: int, consume_queue_max_size: int,
                 max_group_commit_count: int, max_pending: int) -> None:
        self.commit_log_max_size = commit_log_max_size
        # Whole units, so a unit never straddles two files.
        self.consume_queue_max_size = consume_queue_max_size - consume_queue_max_size % 20
        self.max_group_commit_count = max_group_commit_count
        self.pending = threading.BoundedSemaphore(max_pending)

    def max_size(self, file_type: FileSegmentType) -> int:
        if file_type is FileSegmentType.COMMIT_LOG:
            return self.commit_log_max_size
        if file_type is FileSegmentType.CONSUME_QUEUE:
            return self.consume_queue_max_size
        return 2**63 - 1


class FileSegment(ABC):
    """One tier file: ``base_offset`` is its first byte's offset in its file type's space."""

    def __init__(self, limits: SegmentLimits, file_type: FileSegmentType, file_path: str,
                 base_offset: int) -> None:
        self.limits = limits
        self.file_type = file_type
        self.file_path = file_path  # the queue's key: broker/topic/queueId
        self.base_offset = base_offset
        self.max_size = limits.max_size(file_type)
        self._file_lock = threading.Lock()
        self._commit_lock = threading.Lock()
        self.closed = False
        self.min_timestamp = NO_TIMESTAMP
        self.max_timestamp = NO_TIMESTAMP
        self.commit_position = 0
        self.append_position = 0
        self._buffers: list[bytes] = []
        self._inflight: bytes | None = None  # what the last, failed commit tried to write
        # Why the last commit failed (None after one that worked): the uploader reports it
        # once per change of state (``TierHealth``), so a failed attempt logs only at DEBUG.
        self.last_error: str | None = None

    def __lt__(self, other: FileSegment) -> bool:
        return self.base_offset < other.base_offset

    # -- provider (the driver) ----------------------------------------------------------------

    @property
    @abstractmethod
    def path(self) -> str:
        """Where the file is in the backend (for messages and listings)."""

    @abstractmethod
    def get_size(self) -> int:
        """The file's real length in the backend (0 if it does not exist); raises
        TierIOError when the backend cannot say."""

    @abstractmethod
    def exists(self) -> bool: ...

    @abstractmethod
    def create_file(self) -> None: ...

    @abstractmethod
    def destroy_file(self) -> None: ...

    @abstractmethod
    def read0(self, position: int, length: int) -> bytes:
        """``length`` bytes at ``position`` (both inside what was committed)."""

    @abstractmethod
    def commit0(self, data: bytes, position: int, append: bool) -> None:
        """Write ``data`` at ``position``; raise on failure (the caller corrects)."""

    @abstractmethod
    def truncate0(self, size: int) -> None:
        """Cut the file back to ``size`` bytes (a torn tail found after a crash)."""

    def truncate(self, size: int) -> None:
        with self._commit_lock:
            self.truncate0(size)

    # -- what a driver may remember of a file's layout (object stores: its parts) ------------

    def mark_new(self) -> None:
        """The file is known not to exist yet (the caller checked): nothing to look up."""
        return None  # only drivers that cache a layout have something to note

    def part_positions(self) -> list[int] | None:
        """Where each upload of the committed bytes starts, when the driver keeps a file as
        several objects and knows them all; None otherwise (the metadata then records none)."""
        return None

    def known_parts(self, positions: list[int], size: int) -> None:
        """Layout recorded in the metadata (``part_positions`` of an earlier run), so reads
        need no listing; ``size`` is the committed size it was recorded with."""
        return None

    # -- positions -----------------------------------------------------------------------------

    def init_position(self, position: int) -> None:
        with self._file_lock:
            self.commit_position = self.append_position = position
            self._buffers = []
            self._inflight = None

    @property
    def commit_offset(self) -> int:
        return self.base_offset + self.commit_position

    @property
    def append_offset(self) -> int:
        return self.base_offset + self.append_position

    def needs_commit(self) -> bool:
        return self.append_position > self.commit_position

    def update_timestamp(self, timestamp: int) -> None:
        with self._file_lock:
            self._note_time(timestamp)

    def _note_time(self, timestamp: int) -> None:
        if self.min_timestamp == NO_TIMESTAMP:
            self.min_timestamp = self.max_timestamp = timestamp
        else:
            self.min_timestamp = min(self.min_timestamp, timestamp)
            self.max_timestamp = max(self.max_timestamp, timestamp)

    # -- writing -------------------------------------------------------------------------------

    def append(self, data: Buffer, timestamp: int,
               last_timestamp: int | None = None) -> AppendResult:
        """Buffer ``data`` (one or more whole records or units, stored from ``timestamp`` to
        ``last_timestamp``) for the next commit; nothing is uploaded here."""
        chunk = data if isinstance(data, bytes) else bytes(data)
        with self._file_lock:
            if self.closed:
                return AppendResult.FILE_CLOSED
            if self.append_position + len(chunk) > self.max_size:
                return AppendResult.FILE_FULL
            if len(self._buffers) >= self.limits.max_group_commit_count:
                return AppendResult.BUFFER_FULL
            self._buffers.append(chunk)
            self.append_position += len(chunk)
            self._note_time(timestamp)
            if last_timestamp is not None:
                self._note_time(last_timestamp)
        return AppendResult.SUCCESS

    def room(self) -> int:
        """Bytes the segment can still take."""
        return self.max_size - self.append_position

    def commit(self) -> bool:
        """Upload what was appended; True once everything appended before the call is in the
        backend. False when it failed (retry later) or another commit is running."""
        if self.closed:
            return False
        if not self.needs_commit():
            return True
        if not self._commit_lock.acquire(blocking=False):
            return False
        try:
            return self._commit_locked()
        finally:
            self._commit_lock.release()

    def _commit_locked(self) -> bool:
        if self._inflight is not None and self._check_remote() == "fail":
            return False  # (after "landed" _inflight is None; after "retry" it is rewritten)
        if self._inflight is None:
            with self._file_lock:
                buffers, self._buffers = self._buffers, []
            if not buffers:
                return True
            self._inflight = b"".join(buffers)
        data = self._inflight
        position = self.commit_position
        try:
            with self.limits.pending:
                self.commit0(data, position, self.file_type is not FileSegmentType.INDEX)
        except Exception as exc:  # any backend failure: find out what landed
            log.debug("tier commit of %d bytes at %d to %s failed: %s", len(data), position,
                      self.path, exc)
            self.last_error = f"upload to {self.path} failed: {exc}"
            return self._check_remote() == "landed"
        with self._file_lock:
            self.commit_position = position + len(data)
            self._inflight = None
        self.last_error = None
        return True

    def _check_remote(self) -> str:
        """After a failed commit, compare the backend's size with what was being written:
        "landed" (it was all written: ``_inflight`` is cleared), "retry" (nothing, or a prefix
        of the same bytes, landed: write them again at the same position) or "fail"."""
        assert self._inflight is not None
        try:
            size = self.get_size()
        except OSError as exc:
            self.last_error = f"tier file {self.path}: cannot read its size: {exc}"
            log.debug("tier file %s: cannot read its size to correct the commit position "
                      "(commit=%d, append=%d, pending=%d): %s", self.path, self.commit_position,
                      self.append_position, len(self._inflight), exc)
            return "fail"
        expected = self.commit_position + len(self._inflight)
        if size == expected:
            with self._file_lock:
                self.commit_position = expected
                self._inflight = None
            self.last_error = None
            log.info("tier file %s: the failed upload had landed; commit position %d",
                     self.path, expected)
            return "landed"
        if self.commit_position <= size < expected:
            return "retry"
        self.last_error = (f"tier file {self.path} is {size} bytes but {self.commit_position} "
                           f"were committed and {len(self._inflight)} more were being written: "
                           "it was changed outside this broker; not writing to it (the local "
                           "CommitLog keeps the data)")
        log.debug("%s", self.last_error)
        return "fail"

    # -- reading -------------------------------------------------------------------------------

    def read(self, position: int, length: int) -> bytes:
        """Committed bytes from ``position`` (clipped to the commit position)."""
        if position < 0 or position >= self.commit_position:
            raise TierIOError(f"tier file {self.path}: read position {position} outside the "
                              f"committed {self.commit_position} bytes")
        if length <= 0:
            raise ValueError(f"tier file {self.path}: read length {length}")
        return self.read0(position, min(length, self.commit_position - position))

    def close(self) -> None:
        with self._file_lock:
            self.closed = True

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.path}, commit={self.commit_position}, "
                f"append={self.append_position})")
