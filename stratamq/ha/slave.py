"""The slave's side of replication: RocketMQ's DefaultHAClient as a thin socket adapter around
``protocol.SlaveConnection``.

One thread connects to ``haMasterAddress``, reports the log's end, and applies what arrives:

* the master's lineage comes first (``protocol.judge_lineage``): a slave holding no bytes
  takes it; a slave of another lineage keeps every byte, closes the link, logs at ERROR,
  reports ``lineageMismatch`` and asks again every ``LINEAGE_RETRY`` s (``stratamq ha reseed``
  clears its log to follow that master); a slave of unknown lineage follows without cutting
  its log until the master's log has shown to hold what it holds;
* transfer frames go to ``ReplicaLog.append`` at their offsets, the many frames of one read
  to ``ReplicaLog.append_pieces`` (written in place, not gathered first); a record cut by a
  frame's end waits for its rest in memory (and, written in place, past the log's end, where
  nothing reads it); after each read the new end is reported if it moved, and at least every
  ``haSendHeartbeatInterval`` anyway;
* a check frame (before the log's end) is compared with the local bytes; if they differ the
  log is cut back to the frame's offset (``ReplicaLog.truncate``) and the link reconnects (a
  check below where this slave's copy starts has nothing to compare and passes);
* a heartbeat before the log's end (the master lost a tail this slave has) cuts the log back
  to it; the stream then goes on from there;
* while the master streams a backlog (a read of ``STREAM_READ`` bytes or more), the slave's
  dispatch is held back (``ReplicaLog.hold_dispatch``), so the copy does not share the GIL
  with it; it is released when reads get small again (caught up), when dispatch lags by
  ``DISPATCH_LAG_MAX`` bytes, and whenever the link closes. A slave's reads of what it copied
  meanwhile wait for that catch-up round;
* a frame after the log's end (the master no longer holds what this slave needs), bytes that
  are not records, or a silent link (``haHousekeepingInterval``) close the link; it is tried
  again after ``haSendHeartbeatInterval`` (RocketMQ: 5 s, its default).

Thread-safety: ``runtime_info`` from any thread (plain attribute reads); everything else runs
on the client's thread. The client owns its socket; the store is reached through the
``ReplicaLog`` and ``CommitLogReader`` it is handed.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable

from stratamq.config import StoreConfig
from stratamq.ha.master import FlowMonitor
from stratamq.ha.protocol import (
    Gap,
    HAConnectionState,
    Heartbeat,
    LineageVerdict,
    MasterEnd,
    MasterLineage,
    Overlap,
    ProtocolError,
    SlaveConnection,
    Transfer,
    judge_lineage,
)
from stratamq.store.identity import StoreIdentity
from stratamq.store.log_reader import CommitLogReader
from stratamq.store.replica import ReplicaDataError, ReplicaLog, TruncateReport

__all__ = ["HAClient"]

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 3.0  # s (RocketMQ's connectTimeoutMillis)
READ_SIZE = 4 * 1024 * 1024  # RocketMQ's READ_MAX_BUFFER_SIZE
# A read this large means the master is sending a backlog (it coalesces up to 1 MiB of frames
# per send when behind; a slave in step reads what one put batch wrote).
STREAM_READ = 1024 * 1024
CAUGHT_UP_READ = 256 * 1024  # a read below this (or none): in step again, dispatch goes on
DISPATCH_LAG_MAX = 1024 * 1024 * 1024  # dispatch never lags more than a default segment
IDLE_READ_WAIT = 1.0  # s a read waits before the loop looks at heartbeats and housekeeping
HELD_READ_WAIT = 0.02  # s, while dispatch is held
# Frames of one read adding up to this are written in place (ReplicaLog.append_pieces: a
# system call, no gathering copy); fewer bytes (a slave in step) are gathered and copied into
# the map, as a put is.
IN_PLACE_BYTES = 256 * 1024
# A master of another lineage stays so until someone acts (restores its store, reseeds this
# one): asked again this often, not at every heartbeat interval.
LINEAGE_RETRY = 30.0  # s


class _Tail:
    """The head of a record whose rest comes in later frames (the master streams bytes, not
    records). Its chunks are joined only once the record can be whole, so a large record costs
    one copy, not one per frame."""

    def __init__(self) -> None:
        self.start = 0
        self.chunks: list[bytes] = []
        self.size = 0
        self.need = 0  # the record's size, once its first 4 bytes are here

    def clear(self) -> None:
        self.chunks, self.size, self.need = [], 0, 0

    def keep(self, start: int, rest: bytes) -> None:
        self.start = start
        self.chunks = [rest] if rest else []
        self.size = len(rest)
        self.need = int.from_bytes(rest[:4], "big") if len(rest) >= 4 else 0

    def extend(self, bodies: list[memoryview]) -> None:
        """Keep frames' bodies (copied: they are views of a buffer the next read reuses)."""
        for body in bodies:
            self.chunks.append(bytes(body))
            self.size += len(body)


def _skip(pieces: list, n: int) -> list:
    """``pieces`` without their first ``n`` bytes."""
    at = 0
    while at < len(pieces) and n >= len(pieces[at]):
        n -= len(pieces[at])
        at += 1
    rest = pieces[at:]
    if rest and n:
        rest[0] = memoryview(rest[0])[n:]
    return rest


class _Reconnect(Exception):
    """Close the link and connect again; ``wait`` says whether to pause first."""

    def __init__(self, why: str, wait: bool = True) -> None:
        super().__init__(why)
        self.wait = wait


class _LineageMismatch(_Reconnect):
    """The master's log is of another lineage than this slave's: follow nothing of it."""


class HAClient:
    """Copies the master's CommitLog into this store; see the module docstring."""

    def __init__(self, config: StoreConfig, replica: ReplicaLog, reader: CommitLogReader,
                 identity: StoreIdentity, master_address: str | None = None) -> None:
        self.config = config
        self.replica = replica
        self.reader = reader
        self.identity = identity
        self.master_lineage: str | None = None  # the master's, last heard
        self.master_store_id: str | None = None
        self.lineage_mismatch = False
        self._confirming = False  # following a master of a lineage this log has not confirmed
        self.master_address = master_address or config.ha_master_address
        self.state = HAConnectionState.READY
        self.flow = FlowMonitor(False, 0)
        self.last_read_ms = 0
        self.last_write_ms = 0
        self.master_offset = -1  # the master's stream position last seen (frame or heartbeat)
        self.reported = -1
        self._report_time = 0.0  # monotonic time of the last report
        self.last_error = ""
        self.last_truncation: TruncateReport | None = None
        self.connects = 0
        # Called once, on this thread, when the log is first in step with the master's (its
        # checks passed or it was cut back: the stream goes on from its end). A controller-mode
        # slave holds dispatch at its confirm offset until then (BrokerReplication).
        self.on_in_step: Callable[[], None] | None = None
        self._sock: socket.socket | None = None
        self._read_buf = bytearray(READ_SIZE)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="ha-client")

    def start(self) -> None:
        import numpy  # noqa: F401  (the bulk record check's; imported now, not mid-copy)

        self._thread.start()

    def shutdown(self) -> None:
        self._stop.set()
        sock = self._sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(10)
        self.replica.release_dispatch()
        self.state = HAConnectionState.SHUTDOWN

    # -- the loop ------------------------------------------------------------------------------

    def _run(self) -> None:
        pause = self.config.ha_send_heartbeat_interval / 1000
        while not self._stop.is_set():
            wait = pause
            try:
                self._session()
            except _LineageMismatch as exc:
                wait = max(LINEAGE_RETRY, pause)
                if str(exc) != self.last_error and not self._stop.is_set():
                    log.error("replication from master %s: %s", self.master_address, exc)
                self.last_error = str(exc)
            except _Reconnect as exc:
                wait = pause if exc.wait else 0
                if str(exc):
                    self._note_error(str(exc))
            except (OSError, ProtocolError, ReplicaDataError) as exc:
                self._note_error(f"{type(exc).__name__}: {exc}")
            except Exception as exc:  # keep replicating; a bug is logged with its trace
                log.exception("replication from %s failed", self.master_address)
                self.last_error = repr(exc)
            finally:
                self._close()
            if wait:
                self._stop.wait(wait)

    def _note_error(self, why: str) -> None:
        if self._stop.is_set():
            return  # shutting down: the link's end is expected
        if why != self.last_error:
            log.warning("replication from master %s: %s", self.master_address, why)
        self.last_error = why

    def _close(self) -> None:
        self.replica.release_dispatch()
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()
        if not self._stop.is_set():
            self.state = HAConnectionState.READY

    def _session(self) -> None:
        host, _, port = self.master_address.rpartition(":")
        sock = socket.create_connection((host.strip("[]"), int(port)), CONNECT_TIMEOUT)
        self._sock = sock
        if self._stop.is_set():
            return
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(IDLE_READ_WAIT)
        self.connects += 1
        self.state = HAConnectionState.TRANSFER
        replica = self.replica
        replica.discard_unpublished()  # the stream starts at the end again
        proto = SlaveConnection(replica.end(), replica.is_empty())
        log.info("connected to master %s; asking for the CommitLog from offset %d",
                 self.master_address, replica.end())
        heartbeat = self.config.ha_send_heartbeat_interval / 1000
        housekeeping = self.config.ha_housekeeping_interval / 1000
        last_read = time.monotonic()
        self._report(replica.end())
        tail = _Tail()
        # One buffer for every read: a fresh 4 MiB object per read would fault in new pages each
        # time. Events are views of it, handled before the next read.
        buf = self._read_buf
        while not self._stop.is_set():
            try:
                n = sock.recv_into(buf)
            except TimeoutError:
                n = -1
            now = time.monotonic()
            if n == 0:
                raise _Reconnect("the master closed the connection")
            if n > 0:
                last_read = now
                self.last_read_ms = int(time.time() * 1000)
                self.flow.add(n)
                self._apply(proto, proto.receive_data(memoryview(buf)[:n]), tail)
            elif now - last_read > housekeeping:
                raise _Reconnect(f"nothing from the master for {housekeeping:.0f} s "
                                 "(haHousekeepingInterval)")
            self._pace_dispatch(sock, n)
            end = replica.end()
            if end != self.reported or now - self._report_time > heartbeat:
                self._report(end)

    def _pace_dispatch(self, sock: socket.socket, read: int) -> None:
        """Hold dispatch back while a backlog streams in; let it go once in step (see the
        module docstring). While held, a read waits only ``HELD_READ_WAIT``: the stream's end
        shows as a read that finds nothing, and dispatch must not wait a whole second for it."""
        replica = self.replica
        if replica.dispatch_held:
            if read < CAUGHT_UP_READ or replica.dispatch_lag() >= DISPATCH_LAG_MAX:
                replica.release_dispatch()
                sock.settimeout(IDLE_READ_WAIT)
        elif read >= STREAM_READ and replica.dispatch_lag() < DISPATCH_LAG_MAX // 2:
            replica.hold_dispatch()
            sock.settimeout(HELD_READ_WAIT)

    def _apply(self, proto: SlaveConnection, events: list, tail: _Tail) -> None:
        replica = self.replica
        run: list[memoryview] = []  # bodies of consecutive frames, appended together
        run_start = run_end = 0
        for event in events:
            if self.on_in_step is not None and isinstance(event, (Transfer, Heartbeat)):
                self._in_step()  # the checks before passed (a failed one reconnected)
            if isinstance(event, Transfer):
                if self._confirming:
                    self._confirm()
                size = len(event.body)
                self.master_offset = event.offset + size
                if run and event.offset == run_end:
                    run.append(event.body)
                else:
                    self._append(run, run_start, tail)
                    run, run_start = [event.body], event.offset
                run_end = event.offset + size
                continue
            self._append(run, run_start, tail)
            run = []
            if isinstance(event, MasterLineage):
                self._judge(event)
            elif isinstance(event, Overlap):
                if event.offset < self.reader.min_offset:
                    continue  # this slave's copy starts later: nothing there to compare
                local = self.reader.read_bytes(event.offset, len(event.body))
                if local != event.body:
                    self._truncate(event.offset, "its bytes there differ from the master's (the "
                                   "master's log took another course after that offset)")
                    raise _Reconnect("", wait=False)
            elif isinstance(event, MasterEnd):
                self.master_offset = event.offset
                tail.clear()
                if event.offset < replica.end():
                    self._truncate(event.offset, "the master's log ends there (it lost a tail "
                                   "this slave holds)")
                replica.discard_unpublished()  # what follows comes from that end
                proto.expected = replica.end()
                if self.on_in_step is not None:
                    self._in_step()
            elif isinstance(event, Gap):
                raise _Reconnect(
                    f"the master sent bytes for offset {event.offset} but this slave's log "
                    f"ends at {event.expected}: the master no longer holds what lies between "
                    "(this slave needs a new copy of the master's store)")
            else:  # Heartbeat
                if self._confirming:
                    self._confirm()
                self.master_offset = event.offset
                self.last_error = ""
        self._append(run, run_start, tail)

    def _append(self, run: list[memoryview], start: int, tail: _Tail) -> None:
        """Append consecutive frames' bytes in one go (a slave catching up reads many frames
        at once: one check and one write for them all, not one per frame)."""
        if not run:
            return
        if tail.size:
            if tail.size + sum(len(body) for body in run) < tail.need:
                tail.extend(run)  # still inside one large record
                return
            pieces: list = [*tail.chunks, *run]
            start = tail.start
        else:
            pieces = run
        if len(pieces) > 1 and not self.replica.is_empty() \
                and sum(len(piece) for piece in pieces) >= IN_PLACE_BYTES:
            # Many frames (a slave catching up): written into the segment as they are and
            # checked there, not gathered into one buffer first (one copy less).
            done = 0
            segment = self.replica.segment_size
            while pieces:  # a run may cross into the next segment
                taken = self.replica.append_pieces(start + done, pieces)
                done += taken
                pieces = _skip(pieces, taken)
                if not taken or (start + done) % segment:
                    break  # what is left is the head of a record: its rest comes later
            tail.keep(start + done, b"".join(pieces))
            self.last_error = ""
            return
        view = memoryview(pieces[0] if len(pieces) == 1 else b"".join(pieces))
        done = 0
        while done < len(view):  # a run may cross into the next segment
            taken = self.replica.append(start + done, view[done:])
            if not taken:
                break
            done += taken
        tail.keep(start + done, bytes(view[done:]))
        self.last_error = ""  # replicating again

    def _judge(self, event: MasterLineage) -> None:
        """Follow the master only if its log is of this slave's lineage (see the module
        docstring)."""
        own = self.identity.lineage
        replica = self.replica
        holds = not replica.is_empty() and replica.end() > self.reader.min_offset
        verdict = judge_lineage(own, event.lineage, holds_data=holds)
        self.master_lineage, self.master_store_id = event.lineage, event.store_id
        self.lineage_mismatch = verdict is LineageVerdict.MISMATCH
        self._confirming = verdict is LineageVerdict.CONFIRM
        if verdict is LineageVerdict.MISMATCH:
            raise _LineageMismatch(
                f"the master's CommitLog is of lineage {event.lineage} (store "
                f"{event.store_id}), this slave's of {own}: the master's store was wiped or "
                f"replaced. This slave keeps its log ({replica.end() - self.reader.min_offset} "
                "bytes) and its topics and follows nothing of that master; `stratamq ha reseed "
                "--store DIR` (broker stopped) discards them to follow it")
        if verdict is LineageVerdict.ADOPT:
            log.info("this slave holds no CommitLog bytes: it takes its master's lineage %s",
                     event.lineage)
            self.identity.set_lineage(event.lineage)
        elif verdict is LineageVerdict.CONFIRM:
            log.warning("this slave's CommitLog is of an unknown lineage: it follows master %s "
                        "(lineage %s) without cutting its log until the master's log shows "
                        "it holds what this slave holds", self.master_address, event.lineage)

    def _in_step(self) -> None:
        in_step, self.on_in_step = self.on_in_step, None
        if in_step is not None:
            in_step()

    def _confirm(self) -> None:
        """The master streams from this slave's end: its log holds what this slave holds."""
        assert self.master_lineage is not None
        self._confirming = False
        self.identity.set_lineage(self.master_lineage)
        log.info("this slave's CommitLog is of its master's lineage %s", self.master_lineage)

    def _truncate(self, offset: int, reason: str) -> None:
        if self._confirming:
            self.lineage_mismatch = True
            raise _LineageMismatch(
                f"the master would cut this slave's log back to {offset} ({reason}), but this "
                f"slave's log is of an unknown lineage and the master's of "
                f"{self.master_lineage}: nothing is cut; `stratamq ha reseed --store DIR` "
                "(broker stopped) discards this slave's log to follow that master")
        report = self.replica.truncate(offset, reason)
        self.last_truncation = report

    def _report(self, offset: int) -> None:
        sock = self._sock
        assert sock is not None
        sock.sendall(SlaveConnection.report(offset))
        self.reported = offset
        self._report_time = time.monotonic()
        self.last_write_ms = int(time.time() * 1000)

    # -- status --------------------------------------------------------------------------------

    def runtime_info(self) -> dict:
        """RocketMQ's HARuntimeInfo for a slave (haClientRuntimeInfo), plus what was cut."""
        end = self.replica.end()
        return {
            "master": False,
            "role": "SLAVE",
            "haClientRuntimeInfo": {
                "masterAddr": self.master_address,
                "state": self.state.value,
                "maxOffset": end,
                "masterOffset": self.master_offset,
                "behindBytes": max(0, self.master_offset - end) if self.master_offset >= 0
                else None,
                "lastReadTimestamp": self.last_read_ms,
                "lastWriteTimestamp": self.last_write_ms,
                "transferredByteInSecond": self.flow.transferred_per_second(),
                "connects": self.connects,
                "lastError": self.last_error,
                "masterLineage": self.master_lineage,
                "masterStoreId": self.master_store_id,
                "lastTruncation": (self.last_truncation.as_dict()
                                   if self.last_truncation is not None else None),
            },
        }
