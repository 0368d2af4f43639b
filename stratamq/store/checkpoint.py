"""The ``checkpoint`` file: how far flushed data is known to reach, by store timestamp.

Spec: ``docs/formats/checkpoint.md``. RocketMQ 5 keeps five big-endian longs at the start of a
4 KiB file; the rest of the page is unused::

    0  physic_msg_timestamp   store time of the newest CommitLog record known flushed
    8  logics_msg_timestamp   store time of the newest record whose ConsumeQueue unit is flushed
    16 index_msg_timestamp    store time of the newest record whose index entry is flushed
    24 master_flushed_offset  replication (issue: HA)
    32 confirm_phy_offset     replication (issue: HA)

Recovery after a crash starts from the newest CommitLog segment whose first record is older than
``min_timestamp()``: everything before it reached the disk with its ConsumeQueue units.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

from stratamq.limits import OS_PAGE_SIZE

_LAYOUT = struct.Struct(">qqqqq")
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
