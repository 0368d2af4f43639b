"""The replication link's two messages, byte for byte (spec: ``docs/formats/ha-transfer.md``).

Seed 004 section 1.6 and RocketMQ's ``DefaultHAConnection`` / ``DefaultHAClient``; big-endian
as Java's ``ByteBuffer``:

* master -> slave, a transfer frame: physical offset (8 bytes, signed), body size (4 bytes,
  signed), then that many CommitLog bytes, which belong at that offset. A body size of 0 is a
  heartbeat: the master has nothing to send and its transfer position is the offset.
* master -> slave, first on every link (StrataMQ's; RocketMQ's classic link has none): a
  lineage frame, a transfer header with physical offset -1 and body size 32, then the
  lineage of the master's CommitLog and the master's store id, 16 bytes each (UUIDs,
  ``stratamq/store/identity.py``).
* slave -> master, a report: the slave's max CommitLog offset (8 bytes, signed). The first
  report asks where to start; each later one acknowledges every byte before it.

Pure: no I/O.
"""

from __future__ import annotations

import struct
import uuid

__all__ = ["LINEAGE_BODY_SIZE", "LINEAGE_OFFSET", "MAX_BODY_SIZE", "REPORT", "REPORT_SIZE",
           "TRANSFER_HEADER", "TRANSFER_HEADER_SIZE", "decode_lineage", "encode_header",
           "encode_lineage", "encode_report"]

TRANSFER_HEADER = struct.Struct(">qi")  # physical offset, body size
TRANSFER_HEADER_SIZE = TRANSFER_HEADER.size  # 12, RocketMQ's TRANSFER_HEADER_SIZE = 8 + 4
REPORT = struct.Struct(">q")  # the slave's max CommitLog offset
REPORT_SIZE = REPORT.size  # 8, RocketMQ's REPORT_HEADER_SIZE
# RocketMQ's slave reads into a 4 MiB buffer (HAClient READ_MAX_BUFFER_SIZE) and
# haTransferBatchSize may not exceed it: a larger body is not a frame a master sends.
MAX_BODY_SIZE = 4 * 1024 * 1024
LINEAGE_OFFSET = -1  # no CommitLog byte has it: the frame is the master's lineage
LINEAGE_BODY_SIZE = 32  # lineage UUID, master's store id UUID


def encode_header(offset: int, size: int) -> bytes:
    return TRANSFER_HEADER.pack(offset, size)


def encode_report(offset: int) -> bytes:
    return REPORT.pack(offset)


def encode_lineage(lineage: str, store_id: str) -> bytes:
    return (encode_header(LINEAGE_OFFSET, LINEAGE_BODY_SIZE) + uuid.UUID(lineage).bytes
            + uuid.UUID(store_id).bytes)


def decode_lineage(body: bytes | memoryview) -> tuple[str, str]:
    """(lineage, store id) of a lineage frame's body."""
    raw = bytes(body)
    return str(uuid.UUID(bytes=raw[:16])), str(uuid.UUID(bytes=raw[16:32]))
