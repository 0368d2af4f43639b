"""The ``checkpoint`` file: how far flushed data is known to reach, by store timestamp.

Spec: ``docs/formats/checkpoint.md``. RocketMQ 5 keeps five big-endian longs at the start of a
4 KiB file; the rest of the page is unused::

    0  physic_msg_timestamp   store time of the newest CommitLog record known flushed
    8  logics_msg_timestamp   store time of the newest record whose ConsumeQueue unit is flushed
    16 index_msg_timestamp    store time of the newest record whose index entry is flushed
    24 master_flushed_offset  replication (issue: HA)
    32 confirm_phy_offset     controller mode: where dispatch may go (ConfirmOffsetSlot)

Recovery after a crash starts from the newest CommitLog segment whose first record is older than
``min_timestamp()``: everything before it reached the disk with its ConsumeQueue units.
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
from dataclasses import dataclass
from pathlib import Path

from stratamq.limits import OS_PAGE_SIZE

_LAYOUT = struct.Struct(">qqqqq")
_CONFIRM_AT = 32  # confirm_phy_offset's place in _LAYOUT
_CONFIRM = struct.Struct(">q")
FILE_SIZE = OS_PAGE_SIZE
# RocketMQ backs the minimum off by 3 s (StoreCheckpoint.getMinTimestamp) so that records stored
# within the same moment as the last flush are rescanned too.
SAFETY_MARGIN_MS = 3_000


@dataclass
class StoreCheckpoint:
    physic_msg_timestamp: int = 0
    logics_msg_timestamp: int = 0
    index_msg_timestamp: int = 0
    master_flushed_offset: int = 0
    confirm_phy_offset: int = 0

    @classmethod
    def read(cls, path: Path) -> StoreCheckpoint:
        """Load the file; a missing or short file reads as zeros (recover from the start)."""
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return cls()
        if len(raw) < _LAYOUT.size:
            return cls()
        return cls(*_LAYOUT.unpack_from(raw, 0))

    def to_bytes(self) -> bytes:
        data = _LAYOUT.pack(
            self.physic_msg_timestamp,
            self.logics_msg_timestamp,
            self.index_msg_timestamp,
            self.master_flushed_offset,
            self.confirm_phy_offset,
        )
        return data + bytes(FILE_SIZE - len(data))

    def write(self, path: Path) -> None:
        """Overwrite in place and fdatasync: one page, so the update is never half-seen."""
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.pwrite(fd, self.to_bytes(), 0)
            os.fdatasync(fd)
        finally:
            os.close(fd)

    def min_timestamp(self) -> int:
        """Records stored before this time are durable in the CommitLog and its ConsumeQueues."""
        low = min(self.physic_msg_timestamp, self.logics_msg_timestamp)
        return max(0, low - SAFETY_MARGIN_MS)


class ConfirmOffsetSlot:
    """``confirm_phy_offset`` kept current in the checkpoint file between its writes (a
    controller-mode store): each change goes straight into the file's mapped page, so a
    process that dies (SIGKILL) leaves the newest value for the next open; the page reaches
    the disk with the checkpoint's next write. A put is acknowledged only after its end is
    noted here (``raise_to``), so an open never holds dispatch below an acknowledged message.

    Thread-safety: ``raise_to`` and ``set`` from any thread (one lock); ``close`` once, after
    the last of them. The checkpoint's in-memory ``confirm_phy_offset`` follows every change,
    so a whole-page write (``StoreCheckpoint.write``) never puts an older value back.
    """

    def __init__(self, path: Path, checkpoint: StoreCheckpoint) -> None:
        self.checkpoint = checkpoint
        self._lock = threading.Lock()
        fd = os.open(path, os.O_RDWR)
        try:  # the checkpoint was written (one whole page) before this opens
            self._map: mmap.mmap | None = mmap.mmap(fd, FILE_SIZE)
        finally:
            os.close(fd)

    @property
    def value(self) -> int:
        return self.checkpoint.confirm_phy_offset

    def set(self, offset: int) -> None:
        """The confirm offset is ``offset`` now (it may move back: a cut log)."""
        with self._lock:
            self._put(offset)

    def raise_to(self, offset: int) -> None:
        """Everything before ``offset`` is confirmed (a put about to be acknowledged)."""
        with self._lock:
            if offset > self.checkpoint.confirm_phy_offset:
                self._put(offset)

    def _put(self, offset: int) -> None:
        self.checkpoint.confirm_phy_offset = offset
        if self._map is not None:
            _CONFIRM.pack_into(self._map, _CONFIRM_AT, offset)

    def close(self) -> None:
        with self._lock:
            mapped, self._map = self._map, None
        if mapped is not None:
            mapped.close()
