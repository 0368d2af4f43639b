"""Replication protocol logic, free of I/O (h11's shape): bytes in, events out, bytes to send.

Both ends are state machines the socket adapters (``master.py``, ``slave.py``) feed with what
they read and ask for what to write; tests drive them directly with exact bytes. The wire
format is ``wire.py`` (seed 004 section 1.6, RocketMQ's DefaultHAConnection/DefaultHAClient).

What happens on a link:

0. The master sends its lineage first (``wire.py``): the id of the store whose log its
   CommitLog continues (``stratamq/store/identity.py``). ``judge_lineage`` decides whether the
   slave may follow it: a slave never cuts its log back, nor appends to it, for a master of
   another lineage (a wiped or different store: its epochs may even look the same).
1. The slave connects and reports its max CommitLog offset ``S`` (the first report is the
   request). ``plan_transfer`` decides what the master sends:

   * ``S == 0`` (an empty slave): stream from the start of the master's last segment (RocketMQ,
     seed 004) or, with ``haNewSlaveTransferFrom=MIN_OFFSET``, from its oldest byte.
   * ``S`` within the master's log: first the records at the master's epoch starts below ``S``
     (where its log may have begun to differ from what a slave holds: each start of a master
     life, each cut of its own log; ``epochs.py``), for the slave to compare with its own
     bytes; then stream from ``S``.
   * ``S`` past the master's end ``M`` (the master lost a tail the slave has): the same
     checks below ``M``, then a heartbeat at ``M``: the slave cuts its log back to ``M``.
   * ``S`` below the master's oldest byte: stream from there; the slave finds a gap it cannot
     fill and says so (it needs a new copy).

2. The master streams frames from its transfer position and an empty frame (a heartbeat) when
   it has had nothing to send for ``haSendHeartbeatInterval``.
3. The slave appends each frame at its offset and reports its new max offset after each batch
   and at least every ``haSendHeartbeatInterval``. A frame before its end is a check: equal
   bytes are skipped, different ones make the slave cut its log back to the frame's offset and
   reconnect. A frame after its end is a gap (an error). A heartbeat before its end means the
   master's log ends there: the slave cuts back to it and carries on.

A report counts as an acknowledgement only above where this connection's stream started and
at most what it has sent: a slave's first report may describe bytes the master never sent
(after the master lost a tail), and must not release a SYNC_MASTER put.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple

from stratamq.ha.wire import (
    LINEAGE_BODY_SIZE,
    LINEAGE_OFFSET,
    MAX_BODY_SIZE,
    REPORT,
    REPORT_SIZE,
    TRANSFER_HEADER,
    TRANSFER_HEADER_SIZE,
    decode_lineage,
    encode_header,
    encode_lineage,
    encode_report,
)

__all__ = ["Gap", "HAConnectionState", "Heartbeat", "LineageVerdict", "MasterConnection",
           "MasterEnd", "MasterLineage", "Overlap", "ProtocolError", "SlaveAck", "SlaveConnection",
           "SlaveRequest", "Transfer", "TransferPlan", "judge_lineage", "plan_transfer"]


class ProtocolError(Exception):
    """The peer sent something this protocol never sends; the link must be closed."""


class HAConnectionState(StrEnum):
    """RocketMQ's HAConnectionState (the states the classic link uses)."""

    READY = "READY"  # slave: not connected, (re)connecting
    TRANSFER = "TRANSFER"  # connected, streaming
    SHUTDOWN = "SHUTDOWN"  # closed


# -- events -------------------------------------------------------------------------------------

class SlaveRequest(NamedTuple):
    """Master side: the slave's first report, where it wants the stream to start."""

    offset: int


class SlaveAck(NamedTuple):
    """Master side: the slave holds every byte before ``offset`` (counted, see the module
    docstring)."""

    offset: int


class Transfer(NamedTuple):
    """Slave side: bytes that go at the end of the slave's log (a view of what was read: see
    ``SlaveConnection.receive_data``)."""

    offset: int
    body: memoryview


class Overlap(NamedTuple):
    """Slave side: bytes the master has at an offset the slave already holds: compare them."""

    offset: int
    body: memoryview


class MasterEnd(NamedTuple):
    """Slave side: the master's log ends at ``offset``, before the slave's end: cut back."""

    offset: int


class Heartbeat(NamedTuple):
    """Slave side: the master is alive and has nothing new."""

    offset: int


class MasterLineage(NamedTuple):
    """Slave side: the lineage of the master's CommitLog and the master's store id."""

    lineage: str
    store_id: str


class Gap(NamedTuple):
    """Slave side: the master sent bytes for ``offset``, after the slave's end ``expected``."""

    offset: int
    expected: int


# -- whether a slave may follow a master ----------------------------------------------------------

class LineageVerdict(StrEnum):
    FOLLOW = "FOLLOW"  # the same lineage: follow, cutting back where the epochs say
    ADOPT = "ADOPT"  # the slave holds no bytes: it takes the master's lineage and copies its log
    # The slave holds bytes of an unknown lineage (a directory from before identities): follow
    # while the master's log holds what the slave holds, take its lineage then; never cut.
    CONFIRM = "CONFIRM"
    MISMATCH = "MISMATCH"  # another lineage: keep every byte, follow only after a reseed


def judge_lineage(own: str | None, master: str, *, holds_data: bool) -> LineageVerdict:
    """Whether a slave whose log is of lineage ``own`` may follow a master of ``master``."""
    if not holds_data:
        return LineageVerdict.ADOPT if own != master else LineageVerdict.FOLLOW
    if own is None:
        return LineageVerdict.CONFIRM
    return LineageVerdict.FOLLOW if own == master else LineageVerdict.MISMATCH


# -- where a stream starts ----------------------------------------------------------------------

@dataclass(frozen=True)
class TransferPlan:
    start: int  # where the stream of CommitLog bytes begins
    checks: tuple[int, ...] = ()  # epoch starts whose records go first, for the slave to compare
    cut_to: int | None = None  # the slave reported more than the master has: it cuts back here
    behind_retention: bool = False  # the slave needs bytes the master no longer holds


def plan_transfer(request: int, *, master_min: int, master_max: int, segment_size: int,
                  from_min_offset: bool, epochs: Iterable[int]) -> TransferPlan:
    """Where the master starts streaming to a slave that reported ``request`` (see the module
    docstring)."""
    if request < 0:
        raise ProtocolError(f"slave reported a negative offset {request}")
    if request == 0:
        if from_min_offset:
            return TransferPlan(master_min)
        # RocketMQ's WriteSocketService: the start of the segment holding the master's end.
        return TransferPlan(max(master_min, master_max - master_max % segment_size))
    if request < master_min:
        return TransferPlan(master_min, behind_retention=True)
    known = min(request, master_max)
    checks = tuple(sorted({e for e in epochs if master_min <= e < known}))
    if request > master_max:
        return TransferPlan(master_max, checks, cut_to=master_max)
    return TransferPlan(request, checks)


# -- the master's side of one link --------------------------------------------------------------

class MasterConnection:
    """One slave's link, master side. Not thread-safe: the adapter's reader thread calls
    ``receive_data``, its writer thread the frame methods; they share only ``request`` (set
    once) and ``sent_to``/``plan`` (read by ``receive_data``), plain attribute reads."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self.request: int | None = None  # the slave's first report (slaveRequestOffset)
        self.plan: TransferPlan | None = None
        self.sent_to = -1  # nextTransferFromWhere: the stream's next offset
        self.acked = -1  # slaveAckOffset, as counted
        self.reported = -1  # the slave's latest report, counted or not

    def receive_data(self, data: bytes) -> list[SlaveRequest | SlaveAck]:
        buf = self._buf
        buf += data
        whole = len(buf) - len(buf) % REPORT_SIZE
        if not whole:
            return []
        values = [REPORT.unpack_from(buf, i)[0] for i in range(0, whole, REPORT_SIZE)]
        del buf[:whole]
        events: list[SlaveRequest | SlaveAck] = []
        ack = -1
        for value in values:
            if value < 0:
                raise ProtocolError(f"slave reported a negative offset {value}")
            self.reported = value
            if self.request is None:
                self.request = value
                events.append(SlaveRequest(value))
            elif (self.plan is not None and self.plan.start < value <= self.sent_to
                  and value > self.acked):
                ack = value
        if ack >= 0:
            self.acked = ack
            events.append(SlaveAck(ack))
        return events

    @staticmethod
    def lineage_frame(lineage: str, store_id: str) -> bytes:
        """The link's first frame: the master's lineage, before any other."""
        return encode_lineage(lineage, store_id)

    def begin(self, plan: TransferPlan) -> None:
        self.plan = plan
        self.sent_to = plan.start

    def check_frame(self, offset: int, size: int) -> bytes:
        """Header of a check frame: ``size`` bytes of the master's log at ``offset``."""
        plan = self.plan
        if plan is None or offset >= plan.start or self.sent_to != plan.start:
            raise ValueError(f"a check frame lies before the stream's start and goes before any "
                             f"streamed byte, not at {offset}")
        return encode_header(offset, size)

    def cut_frame(self) -> bytes:
        """The heartbeat telling a slave that is ahead where the master's log ends."""
        assert self.plan is not None and self.plan.cut_to is not None
        return encode_header(self.plan.cut_to, 0)

    def data_frame(self, size: int) -> bytes:
        """Header of the next ``size`` streamed bytes (they go at ``sent_to``)."""
        if not 0 < size <= MAX_BODY_SIZE:
            raise ValueError(f"frame body of {size} bytes")
        header = encode_header(self.sent_to, size)
        self.sent_to += size
        return header

    def heartbeat(self) -> bytes:
        return encode_header(self.sent_to, 0)


# -- the slave's side of one link ---------------------------------------------------------------

SlaveEvent = MasterLineage | Transfer | Overlap | MasterEnd | Heartbeat | Gap


class SlaveConnection:
    """One link to the master, slave side: turns the bytes read into events, knowing where the
    slave's log ends (``expected``: the next offset it can take). Single-threaded."""

    def __init__(self, log_end: int, log_empty: bool, max_body: int = MAX_BODY_SIZE) -> None:
        self.expected = log_end
        self.empty = log_empty  # an empty log takes its first bytes at any offset
        self.max_body = max_body
        self.master_lineage: MasterLineage | None = None  # the link's first frame, once read
        self._buf = bytearray()

    @staticmethod
    def report(offset: int) -> bytes:
        return encode_report(offset)

    def receive_data(self, data: bytes | bytearray | memoryview) -> list[SlaveEvent]:
        """Events for every whole frame read so far. Bodies are views of ``data`` (no copy per
        frame; a caller reading into a reused buffer handles the events before the next read);
        only a frame that spans two reads is copied whole."""
        view = memoryview(data)
        events: list[SlaveEvent] = []
        pos = self._complete(view, events)
        end = len(view)
        unpack = TRANSFER_HEADER.unpack_from
        while end - pos >= TRANSFER_HEADER_SIZE:
            offset, size = unpack(view, pos)
            self._check(offset, size)
            body_at = pos + TRANSFER_HEADER_SIZE
            if end - body_at < size:
                break
            pos = body_at + size
            events.append(self._classify(offset, size, view, body_at))
        if pos < end:
            self._buf += view[pos:]
        return events

    def _check(self, offset: int, size: int) -> None:
        if self.master_lineage is None:
            if offset != LINEAGE_OFFSET or size != LINEAGE_BODY_SIZE:
                raise ProtocolError(
                    f"the master's first frame (offset {offset}, {size} bytes) is not its "
                    "lineage: it is not a StrataMQ master that says which log it holds")
            return
        if offset < 0 or not 0 <= size <= self.max_body:
            raise ProtocolError(f"transfer frame for offset {offset} of {size} bytes")

    def _complete(self, view: memoryview, events: list[SlaveEvent]) -> int:
        """Finish the frame an earlier read began; return how much of ``view`` it took."""
        buf = self._buf
        if not buf:
            return 0
        pos = 0
        if len(buf) < TRANSFER_HEADER_SIZE:
            pos = min(TRANSFER_HEADER_SIZE - len(buf), len(view))
            buf += view[:pos]
            if len(buf) < TRANSFER_HEADER_SIZE:
                return pos
        offset, size = TRANSFER_HEADER.unpack_from(buf, 0)
        self._check(offset, size)
        take = min(TRANSFER_HEADER_SIZE + size - len(buf), len(view) - pos)
        buf += view[pos : pos + take]
        pos += take
        if len(buf) == TRANSFER_HEADER_SIZE + size:
            frame = memoryview(bytes(buf))
            buf.clear()
            events.append(self._classify(offset, size, frame, TRANSFER_HEADER_SIZE))
        return pos

    def _classify(self, offset: int, size: int, view: memoryview, at: int) -> SlaveEvent:
        if self.master_lineage is None:  # _check let only the lineage frame through
            self.master_lineage = MasterLineage(*decode_lineage(view[at : at + size]))
            return self.master_lineage
        expected = self.expected
        if size == 0:
            if offset < expected:
                self.expected = offset  # the adapter cuts its log back to it
                return MasterEnd(offset)
            return Heartbeat(offset)
        body = view[at : at + size]
        if self.empty:
            self.empty = False
            self.expected = offset + size
            return Transfer(offset, body)
        if offset == expected:
            self.expected = expected + size
            return Transfer(offset, body)
        if offset < expected:
            return Overlap(offset, body)
        return Gap(offset, expected)
