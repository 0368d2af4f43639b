"""The master's side of replication: RocketMQ's DefaultHAService, HAConnection and
GroupTransferService as thin socket adapters around ``protocol.MasterConnection``.

* ``HAServer`` accepts slave connections on ``haListenPort`` (AcceptSocketService).
* Each ``SlaveLink`` first sends the lineage of this store's CommitLog (``protocol.py``: a
  slave of another lineage does not follow), then runs a reader thread (ReadSocketService:
  the slave's reports; a link silent for ``haHousekeepingInterval`` is closed) and a writer
  thread (WriteSocketService: CommitLog bytes from where the slave asked, at most
  ``haTransferBatchSize`` per frame, and a heartbeat after ``haSendHeartbeatInterval``
  without a write; ``haFlowControlEnable`` caps it at ``maxHaTransferByteInSecond``).
* ``HAServer.wait_for_slave`` is the put waiter (GroupTransferService + CommitLog.handleHA):
  under SYNC_MASTER a put whose bytes end at ``end`` returns once a slave acknowledged ``end``,
  FLUSH_SLAVE_TIMEOUT after ``syncFlushTimeout``, and SLAVE_NOT_AVAILABLE at once when no
  slave is connected within ``haMaxGapNotInSync`` bytes (RocketMQ's isSlaveOK).

Thread-safety: ``wait_for_slave`` from any put thread; the acknowledged maximum
(``push2slave_max_offset``) only grows, under ``_acked``. ``runtime_info`` from any thread.
The server owns its sockets; the CommitLog is read through the ``CommitLogReader`` it is handed.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable, Sequence

from stratamq.config import StoreConfig
from stratamq.ha.protocol import (
    HAConnectionState,
    MasterConnection,
    ProtocolError,
    SlaveAck,
    SlaveRequest,
    plan_transfer,
)
from stratamq.record import BLANK_MAGIC_CODE, read_size_and_magic
from stratamq.store.log_reader import CommitLogReader
from stratamq.store.results import PutMessageStatus

__all__ = ["FlowMonitor", "HAServer", "SlaveLink"]

log = logging.getLogger(__name__)

DATA_WAIT = 0.1  # s: a writer with nothing to send looks again this often (RocketMQ: 100 ms)
SEND_COALESCE = 1024 * 1024  # bytes of frames a writer hands to one sendmsg when behind


class FlowMonitor:
    """Bytes sent per second, and how many more may go this second (RocketMQ's FlowMonitor).
    One writer thread adds; any thread reads."""

    def __init__(self, enabled: bool, max_per_second: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.enabled = enabled
        self.max_per_second = max_per_second
        self._clock = clock
        self._second = int(clock())
        self._this_second = 0
        self._last_second = 0

    def _roll(self) -> None:
        now = int(self._clock())
        if now != self._second:
            self._last_second = self._this_second if now == self._second + 1 else 0
            self._this_second = 0
            self._second = now

    def add(self, n: int) -> None:
        self._roll()
        self._this_second += n

    def can_transfer(self) -> int:
        if not self.enabled:
            return 1 << 62
        self._roll()
        return max(0, self.max_per_second - self._this_second)

    def transferred_per_second(self) -> int:
        self._roll()
        return self._last_second


def _send_all(sock: socket.socket, parts: Sequence[bytes | memoryview]) -> None:
    """Write ``parts`` whole, without joining them (a frame is header + CommitLog bytes)."""
    views = [memoryview(p) for p in parts if p]
    while views:
        sent = sock.sendmsg(views)
        while sent and views:
            if sent >= len(views[0]):
                sent -= len(views[0])
                views.pop(0)
            else:
                views[0] = views[0][sent:]
                sent = 0


class SlaveLink:
    """One connected slave: its protocol state and the two threads serving it."""

    def __init__(self, server: HAServer, sock: socket.socket, address: str) -> None:
        self.server = server
        self.sock = sock
        self.address = address
        self.proto = MasterConnection()
        self.state = HAConnectionState.TRANSFER
        self.flow = FlowMonitor(server.config.ha_flow_control_enable,
                                server.config.max_ha_transfer_byte_in_second)
        self.last_read = time.monotonic()
        self.last_write = time.monotonic()
        self._requested = threading.Event()
        self._closed = threading.Event()
        self._reader = threading.Thread(target=self._read_loop, daemon=True,
                                        name=f"ha-read-{address}")
        self._writer = threading.Thread(target=self._write_loop, daemon=True,
                                        name=f"ha-write-{address}")

    def start(self) -> None:
        self._reader.start()
        self._writer.start()

    @property
    def position(self) -> int:
        """How far the slave is known or said to be: for isSlaveOK and lag, never for acks."""
        proto = self.proto
        if proto.plan is None:
            return -1
        return max(proto.acked, min(proto.reported, proto.sent_to))

    def close(self, why: str = "") -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        self.state = HAConnectionState.SHUTDOWN
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self.server._remove(self)
        log.info("replication link to slave %s closed%s", self.address, f": {why}" if why else "")

    def join(self, timeout: float) -> None:
        for thread in (self._reader, self._writer):
            if thread.is_alive() and thread is not threading.current_thread():
                thread.join(timeout)

    # -- reading the slave's reports (ReadSocketService) ---------------------------------------

    def _read_loop(self) -> None:
        housekeeping = self.server.config.ha_housekeeping_interval / 1000
        self.sock.settimeout(1.0)
        why = ""
        try:
            while not self._closed.is_set():
                try:
                    data = self.sock.recv(65536)
                except TimeoutError:
                    if time.monotonic() - self.last_read > housekeeping:
                        why = f"no report for {housekeeping:.0f} s (haHousekeepingInterval)"
                        break
                    continue
                if not data:
                    why = "the slave closed the connection"
                    break
                self.last_read = time.monotonic()
                for event in self.proto.receive_data(data):
                    if isinstance(event, SlaveRequest):
                        log.info("slave %s asks for the CommitLog from offset %d", self.address,
                                 event.offset)
                        self._requested.set()
                    elif isinstance(event, SlaveAck):
                        self.server.notify_transfer_some(event.offset)
        except (OSError, ProtocolError) as exc:
            why = str(exc)
        self.close(why)

    # -- streaming the CommitLog (WriteSocketService) ------------------------------------------

    def _write_loop(self) -> None:
        try:
            lineage, store_id = self.server.lineage()
            _send_all(self.sock, (MasterConnection.lineage_frame(lineage, store_id),))
            while not self._requested.wait(1.0):
                if self._closed.is_set():
                    return
            self._begin()
            self._stream()
        except OSError as exc:
            self.close(str(exc))
        except Exception as exc:  # a bug must not leave a half-served slave connected
            log.exception("replication to slave %s failed", self.address)
            self.close(repr(exc))

    def _begin(self) -> None:
        server = self.server
        reader = server.reader
        request = self.proto.request
        assert request is not None
        plan = plan_transfer(
            request, master_min=reader.min_offset, master_max=reader.end(),
            segment_size=reader.segment_size,
            from_min_offset=server.config.ha_new_slave_transfer_from == "MIN_OFFSET",
            epochs=server.epochs())
        self.proto.begin(plan)
        if plan.behind_retention:
            log.error("slave %s needs the CommitLog from %d, but this master's starts at %d: it "
                      "cannot catch up by replication (give it a copy of this store)",
                      self.address, request, plan.start)
        parts: list[bytes] = []
        for offset in plan.checks:
            for at, body in self._check_records(offset, plan.start):
                parts += [self.proto.check_frame(at, len(body)), body]
        if plan.cut_to is not None:
            log.warning("slave %s reports offset %d, past this master's end %d: it will cut its "
                        "log back", self.address, request, plan.cut_to)
            parts.append(self.proto.cut_frame())
        if parts:
            _send_all(self.sock, parts)
            self.last_write = time.monotonic()
        log.info("replicating to slave %s from offset %d (%d checks)", self.address,
                 plan.start, len(plan.checks))

    def _check_records(self, offset: int, below: int) -> list[tuple[int, bytes]]:
        """What to send for the epoch at ``offset``: the head of its record, and when that is a
        segment's blank filler also the head of the next segment's first record."""
        reader = self.server.reader
        limit = self.server.config.ha_transfer_batch_size
        out = []
        while offset < below:
            head = reader.read_bytes(offset, 8)
            if head is None:
                break
            size, magic = read_size_and_magic(head, 0)
            body = reader.read_bytes(offset, max(8, min(size, limit, below - offset)))
            if body is None:
                break
            out.append((offset, body))
            if magic != BLANK_MAGIC_CODE:
                break
            offset += size
        return out

    def _stream(self) -> None:
        server = self.server
        reader = server.reader
        proto = self.proto
        batch = server.config.ha_transfer_batch_size
        heartbeat = server.config.ha_send_heartbeat_interval / 1000
        sock = self.sock
        sock.settimeout(server.config.ha_housekeeping_interval / 1000)
        while not self._closed.is_set():
            seen = server.data_seq  # before looking: an append after this wakes the wait
            # Frames of at most haTransferBatchSize, as RocketMQ sends them; while the slave is
            # behind, several go out in one system call, straight from the segment's map (no
            # copy of them is made first).
            allowed = min(SEND_COALESCE, self.flow.can_transfer())
            with reader.view_range(proto.sent_to, proto.sent_to + allowed) as data:
                parts: list[bytes | memoryview] = []
                for at in range(0, len(data), batch):
                    body = data[at : at + batch]
                    parts += (proto.data_frame(len(body)), body)
                    self.flow.add(len(body) + 12)
                if parts:
                    _send_all(sock, parts)
                    del parts, body  # views of the segment: gone before it is released
                    self.last_write = time.monotonic()
                    continue
            if proto.sent_to < reader.min_offset:
                self.close(f"offset {proto.sent_to} was deleted by clean-up before the slave "
                           f"got it (the CommitLog now starts at {reader.min_offset})")
                return
            if time.monotonic() - self.last_write > heartbeat:
                _send_all(sock, (proto.heartbeat(),))
                self.last_write = time.monotonic()
            server.wait_for_data(seen, DATA_WAIT)

    def runtime_info(self, master_max: int, now_ms: int,
                     store_time_at: Callable[[int], int | None]) -> dict:
        position = self.position
        lag_bytes = max(0, master_max - position) if position >= 0 else master_max
        lag_ms = 0
        if 0 <= position < master_max:
            stored = store_time_at(position)
            lag_ms = max(0, now_ms - stored) if stored else 0
        return {
            "addr": self.address,
            "state": self.state.value,
            "slaveAckOffset": self.proto.acked,
            "slaveReportedOffset": self.proto.reported,
            "diff": lag_bytes,
            "lagMs": lag_ms,
            "inSync": position >= 0 and master_max - position
            < self.server.config.ha_max_gap_not_in_sync,
            "transferredByteInSecond": self.flow.transferred_per_second(),
            "transferFromWhere": self.proto.sent_to,
        }


class HAServer:
    """Accepts slaves and streams the CommitLog to them; see the module docstring.

    Handed the store's ``CommitLogReader``, a function listing the epoch offsets to check,
    ``store_time_at(offset)`` (the store time of the record at an offset, for lag in time) and
    ``lineage()`` (this store's lineage and id, sent to each slave first)."""

    def __init__(self, config: StoreConfig, reader: CommitLogReader,
                 epochs: Callable[[], list[int]], store_time_at: Callable[[int], int | None],
                 lineage: Callable[[], tuple[str, str]], host: str = "127.0.0.1") -> None:
        self.config = config
        self.reader = reader
        self.epochs = epochs
        self.lineage = lineage
        self.store_time_at = store_time_at
        self.host = host
        self.port = config.ha_listen_port
        self.links: list[SlaveLink] = []
        self._links_lock = threading.Lock()
        self.push2slave_max_offset = 0
        self._acked = threading.Condition()
        self._data = threading.Condition()
        self.data_seq = 0  # appends seen (wake_writers), so a writer never misses one
        # Called when ``push2slave_max_offset`` grows (a controller-mode master's dispatch
        # waits for it: ``BrokerReplication.switch_role``).
        self.on_acked: Callable[[], None] | None = None
        self._listener: socket.socket | None = None
        self._stopped = threading.Event()
        self._acceptor = threading.Thread(target=self._accept_loop, daemon=True,
                                          name="ha-accept")

    def start(self) -> int:
        """Listen (port 0: any free port) and accept; return the port."""
        listener = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self.host, self.config.ha_listen_port))
        listener.listen(16)
        listener.settimeout(1.0)
        self._listener = listener
        self.port = listener.getsockname()[1]
        self._acceptor.start()
        log.info("replication (%s) serves slaves on %s:%d", self.config.broker_role.value,
                 self.host, self.port)
        return self.port

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._stopped.is_set():
            try:
                sock, peer = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._stopped.is_set():
                    return
                log.exception("replication accept failed")
                time.sleep(1)
                continue
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            link = SlaveLink(self, sock, f"{peer[0]}:{peer[1]}")
            with self._links_lock:
                self.links = [*self.links, link]
            log.info("slave %s connected", link.address)
            link.start()

    def _remove(self, link: SlaveLink) -> None:
        with self._links_lock:
            self.links = [x for x in self.links if x is not link]

    def shutdown(self) -> None:
        self._stopped.set()
        if self._listener is not None:
            self._listener.close()
        if self._acceptor.is_alive():
            self._acceptor.join(5)
        links = self.links
        for link in links:
            link.close("the master is shutting down")
        self.wake_writers()
        for link in links:
            link.join(5)
        with self._acked:
            self._acked.notify_all()

    # -- acknowledgements and the put waiter ---------------------------------------------------

    def notify_transfer_some(self, offset: int) -> None:
        with self._acked:
            if offset <= self.push2slave_max_offset:
                return
            self.push2slave_max_offset = offset
            self._acked.notify_all()
        on_acked = self.on_acked
        if on_acked is not None:
            on_acked()

    def wake_writers(self) -> None:
        """Something was appended: writers waiting for data look again."""
        with self._data:
            self.data_seq += 1
            self._data.notify_all()

    def wait_for_data(self, seen: int, timeout: float) -> None:
        """Wait up to ``timeout`` s unless an append came since ``data_seq`` was ``seen``."""
        with self._data:
            if self.data_seq == seen:
                self._data.wait(timeout)

    def is_slave_ok(self, end: int) -> bool:
        """RocketMQ's isSlaveOK: a slave is connected and at most haMaxGapNotInSync behind."""
        links = self.links
        if not links:
            return False
        best = max([self.push2slave_max_offset, *(link.position for link in links)])
        return end - best < self.config.ha_max_gap_not_in_sync

    def wait_for_slave(self, end: int) -> PutMessageStatus | None:
        """The put waiter: see the module docstring."""
        self.wake_writers()
        if self.push2slave_max_offset >= end:
            return None
        if self._stopped.is_set() or not self.is_slave_ok(end):
            return PutMessageStatus.SLAVE_NOT_AVAILABLE
        timeout = self.config.sync_flush_timeout / 1000
        with self._acked:
            done = self._acked.wait_for(
                lambda: self.push2slave_max_offset >= end or self._stopped.is_set(), timeout)
        if done and self.push2slave_max_offset >= end:
            return None
        log.warning("transfer to slave timed out: offset %d not acknowledged in %d ms", end,
                    self.config.sync_flush_timeout)
        return PutMessageStatus.FLUSH_SLAVE_TIMEOUT

    # -- status --------------------------------------------------------------------------------

    def runtime_info(self) -> dict:
        """RocketMQ's HARuntimeInfo for a master, plus lag in time per slave."""
        master_max = self.reader.end()
        now_ms = int(time.time() * 1000)
        conns = [link.runtime_info(master_max, now_ms, self.store_time_at)
                 for link in self.links]
        return {
            "master": True,
            "role": self.config.broker_role.value,
            "haListenAddress": f"{self.host}:{self.port}",
            "masterCommitLogMaxOffset": master_max,
            "push2SlaveMaxOffset": self.push2slave_max_offset,
            "inSyncSlaveNums": sum(1 for c in conns if c["inSync"]),
            "haConnectionInfo": conns,
        }
