"""The asyncio adapter over ``codec``: a server dispatching requests by code, and a client.

Both ends are a ``Connection``: it reads frames, hands requests to the server's handler for
their code (each in a task of its own, as RocketMQ runs processors on executors: a long-polled
pull does not hold up the heartbeat behind it) and matches responses to waiting ``invoke``
calls by their opaque. A request whose code has no handler is answered
``REQUEST_CODE_NOT_SUPPORTED``; a handler that raises is answered ``SYSTEM_ERROR`` with the
error's text (RocketMQ's ``NettyRemotingAbstract.processRequestCommand``); a oneway request
gets no answer either way. A frame that does not decode closes the connection
(``NettyDecoder``), and so does a peer that sends faster than its answers are read
(the write buffer's high-water mark): nothing crashes the server. A connection with
``MAX_IN_FLIGHT`` requests being handled has the next answered ``SYSTEM_BUSY`` at once, as
RocketMQ answers when a processor's thread pool is full.

Thread-safety: everything here on its one event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import socket
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from stratamq.remoting.codec import (
    DEFAULT_MAX_FRAME,
    FLAG_ONEWAY,
    FrameDecoder,
    FrameError,
    RemotingCommand,
    encode,
)
from stratamq.remoting.codes import ResponseCode
from stratamq.remoting.relay import SocketRelay

log = logging.getLogger(__name__)

__all__ = ["Connection", "Handler", "RemotingClient", "RemotingServer", "RemotingTimeout",
           "is_remoting", "listen_socket"]

Handler = Callable[[RemotingCommand, "Connection"], Awaitable[RemotingCommand | None]]

_READ_CHUNK = 256 * 1024
# Answers a peer leaves unread past this close its connection, rather than growing the
# broker's memory without bound (a client that writes and never reads).
_MAX_UNSENT = 64 * 1024 * 1024
# Requests of one connection being handled at once; past it a request is answered
# SYSTEM_BUSY at once, as RocketMQ answers when its processor's thread pool rejects one.
MAX_IN_FLIGHT = 4096
_OVERLOAD = "[OVERLOAD]system busy, start flow control for a while"
_opaques = itertools.count(1)


def is_remoting(first: bytes) -> bool:
    """Whether a connection's first byte starts a remoting frame: its length field, below
    the 16 MiB frame limit, begins with a zero byte, where HTTP/2's preface begins with the
    "P" of "PRI * HTTP/2.0" and TLS with its record type 0x16 (both go to gRPC)."""
    return first[:1] == b"\x00"


def listen_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: any free one), as a shared port's."""
    if ":" in host:  # "::" listens on IPv4 too, as gRPC's [::] does
        return socket.create_server((host.strip("[]"), port), family=socket.AF_INET6,
                                    backlog=1024, dualstack_ipv6=host.strip("[]") == "::"
                                    and socket.has_dualstack_ipv6())
    return socket.create_server((host, port), backlog=1024)


class RemotingTimeout(TimeoutError):
    """No response within the timeout (RocketMQ's RemotingTimeoutException)."""


class Connection:
    """One TCP connection speaking remoting, either end."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 handlers: Mapping[int, Handler] | None = None,
                 max_frame: int = DEFAULT_MAX_FRAME, max_in_flight: int = MAX_IN_FLIGHT) -> None:
        self.reader, self.writer = reader, writer
        self.max_in_flight = max_in_flight
        self.handlers = handlers or {}
        self.decoder = FrameDecoder(max_frame)
        peer = writer.get_extra_info("peername") or ("127.0.0.1", 0)
        self.host, self.port = str(peer[0]), int(peer[1])
        # The form a ``broker.ports.Call`` takes its peer in.
        self.peer = (f"ipv6:[{self.host}]:{self.port}" if ":" in self.host
                     else f"ipv4:{self.host}:{self.port}")
        self.address = f"{self.host}:{self.port}"
        self.closed = asyncio.Event()
        self.attributes: dict[str, Any] = {}  # what handlers remember per connection
        self._pending: dict[int, asyncio.Future[RemotingCommand]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    # -- sending --------------------------------------------------------------------------------

    def send(self, cmd: RemotingCommand) -> None:
        if self.closed.is_set() or self.writer.is_closing():
            return
        self.writer.write(encode(cmd))
        if self.writer.transport.get_write_buffer_size() > _MAX_UNSENT:
            log.warning("remoting: closing %s: it leaves %d bytes of answers unread",
                        self.address, self.writer.transport.get_write_buffer_size())
            self.writer.transport.abort()

    async def invoke(self, cmd: RemotingCommand, timeout: float = 3.0) -> RemotingCommand:
        """Send a request and wait for its response."""
        cmd.opaque = next(_opaques) & 0x7FFFFFFF
        future: asyncio.Future[RemotingCommand] = asyncio.get_running_loop().create_future()
        self._pending[cmd.opaque] = future
        try:
            self.send(cmd)
            await self.writer.drain()
            return await asyncio.wait_for(future, timeout)
        except TimeoutError:
            raise RemotingTimeout(f"no response to code {cmd.code} from {self.address} "
                                  f"within {timeout:g} s") from None
        finally:
            self._pending.pop(cmd.opaque, None)

    async def oneway(self, cmd: RemotingCommand) -> None:
        cmd.opaque = next(_opaques) & 0x7FFFFFFF
        cmd.flag |= FLAG_ONEWAY
        self.send(cmd)
        await self.writer.drain()

    # -- receiving ------------------------------------------------------------------------------

    async def run(self, first: bytes = b"") -> None:
        """Read until the peer closes or breaks the stream; then close. ``first``: bytes
        already read (a port that told protocols apart by them)."""
        try:
            data = first
            while True:
                if data:
                    for cmd in self.decoder.feed(data):
                        self._received(cmd)
                data = await self.reader.read(_READ_CHUNK)
                if not data:
                    break
        except FrameError as exc:
            log.warning("remoting: closing %s: %s", self.address, exc)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            await self.close()

    def _received(self, cmd: RemotingCommand) -> None:
        if cmd.is_response:
            future = self._pending.get(cmd.opaque)
            if future is not None and not future.done():
                future.set_result(cmd)
            return
        if len(self._tasks) >= self.max_in_flight:
            if not cmd.is_oneway:
                self.send(cmd.response(ResponseCode.SYSTEM_BUSY, _OVERLOAD))
            return
        task = asyncio.get_running_loop().create_task(self._serve(cmd))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, cmd: RemotingCommand) -> None:
        handler = self.handlers.get(cmd.code)
        response: RemotingCommand | None
        if handler is None:
            response = cmd.response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                                    f" request type {cmd.code} not supported")
        else:
            try:
                response = await handler(cmd, self)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.exception("remoting: code %d from %s failed", cmd.code, self.address)
                response = cmd.response(ResponseCode.SYSTEM_ERROR, f"{type(exc).__name__}: {exc}")
        if response is None or cmd.is_oneway:
            return
        response.opaque = cmd.opaque
        try:
            self.send(response)
        except FrameError as exc:  # a response too big for a frame: say so instead
            log.error("remoting: response to code %d cannot be encoded: %s", cmd.code, exc)
            self.send(cmd.response(ResponseCode.SYSTEM_ERROR, str(exc)))

    async def close(self) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        for future in self._pending.values():
            if not future.done():
                future.set_exception(ConnectionError(f"connection to {self.address} closed"))
        for task in list(self._tasks):
            task.cancel()
        self.writer.close()
        with contextlib.suppress(Exception):
            await self.writer.wait_closed()


class RemotingServer:
    """Serves remoting connections with ``handlers`` (request code -> coroutine).

    ``on_close(connection)`` is called for each connection that ends (clients forget their
    channels). ``serve(reader, writer)`` serves one accepted connection, so another listener
    can hand connections over."""

    def __init__(self, handlers: Mapping[int, Handler], max_frame: int = DEFAULT_MAX_FRAME,
                 on_close: Callable[[Connection], None] | None = None,
                 max_in_flight: int = MAX_IN_FLIGHT) -> None:
        self.handlers = dict(handlers)
        self.max_frame = max_frame
        self.max_in_flight = max_in_flight
        self.on_close = on_close
        self.connections: set[Connection] = set()
        self._server: asyncio.Server | None = None
        # A shared port (start's forward): its listener, accept task and relay.
        self._listener: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._routing: set[asyncio.Task[None]] = set()
        self._relay: SocketRelay | None = None

    async def start(self, host: str, port: int, forward: tuple[str, int] | None = None,
                    listener: socket.socket | None = None) -> int:
        """Listen; returns the port bound (``port`` 0: any free one). ``forward``: the port
        is shared, and connections that do not start with a remoting frame (gRPC's HTTP/2 or
        TLS) are relayed to this address, byte for byte (``relay.SocketRelay``); then
        ``listener``, if given, is the port's socket, bound already (``listen_socket``)."""
        if forward is None:
            self._server = await asyncio.start_server(self.serve, host, port,
                                                      reuse_address=True)
            return int(self._server.sockets[0].getsockname()[1])
        # Shared: accept here and peek at each connection's first byte before anything
        # reads it, so a gRPC connection is handed to the relay untouched.
        listener = listener if listener is not None else listen_socket(host, port)
        listener.setblocking(False)
        self._listener = listener
        self._relay = SocketRelay(forward)
        self._accepting = asyncio.get_running_loop().create_task(self._accept(listener))
        return int(listener.getsockname()[1])

    async def _accept(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, _ = await loop.sock_accept(listener)
            except OSError as exc:
                if listener.fileno() == -1:
                    return
                log.warning("remoting: accept failed: %s", exc)
                await asyncio.sleep(0.1)  # (out of file descriptors: let some close)
                continue
            task = loop.create_task(self._route(sock))
            self._routing.add(task)
            task.add_done_callback(self._routing.discard)

    async def _route(self, sock: socket.socket) -> None:
        """Serve ``sock`` as remoting or relay it to gRPC, by its first byte (peeked)."""
        loop = asyncio.get_running_loop()
        readable: asyncio.Future[None] = loop.create_future()

        def ready() -> None:
            if not readable.done():
                readable.set_result(None)

        loop.add_reader(sock.fileno(), ready)
        try:
            await readable
            first = sock.recv(1, socket.MSG_PEEK)
        except (ConnectionError, OSError):
            first = b""
        except BaseException:  # (cancelled: the server is closing)
            loop.remove_reader(sock.fileno())
            sock.close()
            raise
        loop.remove_reader(sock.fileno())
        if not first:
            sock.close()
        elif is_remoting(first):
            reader, writer = await asyncio.open_connection(sock=sock)
            await self.serve(reader, writer)
        else:
            assert self._relay is not None
            await self._relay.start(sock)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    first: bytes = b"") -> None:
        conn = Connection(reader, writer, self.handlers, self.max_frame, self.max_in_flight)
        self.connections.add(conn)
        try:
            await conn.run(first)
        finally:
            self.connections.discard(conn)
            if self.on_close is not None:
                try:
                    self.on_close(conn)
                except Exception:
                    log.exception("remoting: on_close failed for %s", conn.address)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        if self._listener is not None:
            self._listener.close()
        if self._accepting is not None:
            self._accepting.cancel()
            with contextlib.suppress(BaseException):
                await self._accepting
        for task in list(self._routing):
            task.cancel()
        for conn in list(self.connections):
            await conn.close()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None


    def relayed_peer(self, grpc_peer: str) -> str:
        """The client behind a connection this port relays to gRPC (``SocketRelay.client_of``)."""
        return self._relay.client_of(grpc_peer) if self._relay is not None else grpc_peer

    def close_relays(self) -> None:
        """End the relayed connections (``close`` leaves them: gRPC finishes its calls)."""
        if self._relay is not None:
            self._relay.close()


class RemotingClient:
    """A client connection to one address (``host:port``): ``invoke`` and ``oneway``.

    ``handlers`` answer requests the server sends (a broker's ``NOTIFY_CONSUMER_IDS_CHANGED``)."""

    def __init__(self, address: str, handlers: Mapping[int, Handler] | None = None) -> None:
        self.address = address
        self.handlers = handlers
        self._conn: Connection | None = None
        self._reading: asyncio.Task[None] | None = None

    async def connect(self, timeout: float = 3.0) -> Connection:
        if self._conn is not None and not self._conn.closed.is_set():
            return self._conn
        host, _, port = self.address.rpartition(":")
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host.strip("[]"), int(port)), timeout)
        self._conn = Connection(reader, writer, self.handlers)
        self._reading = asyncio.get_running_loop().create_task(self._conn.run())
        return self._conn

    async def invoke(self, cmd: RemotingCommand, timeout: float = 3.0) -> RemotingCommand:
        conn = await self.connect(timeout)
        return await conn.invoke(cmd, timeout)

    async def oneway(self, cmd: RemotingCommand) -> None:
        conn = await self.connect()
        await conn.oneway(cmd)

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()
        if self._reading is not None:
            with contextlib.suppress(BaseException):
                await self._reading
        self._conn = self._reading = None
