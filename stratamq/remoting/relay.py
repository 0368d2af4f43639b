"""The byte relay behind a shared port: a connection that does not speak remoting (gRPC's
HTTP/2, or TLS) is passed to the gRPC server on its loopback port, byte for byte.

Each relayed connection is a pair of asyncio protocols on the broker's loop, each writing
what it receives straight into the other's transport: one callback and one ``send`` per
chunk, no streams, tasks or futures in between (the stream pumps this replaces cost a task
wake-up and a buffer copy per chunk). Flow control is the transports' own: a side whose
writes back up past the high-water mark stops the other side reading until it drains.
An EOF passes through as a half-close (both directions ended: both sockets closed); a side
that closes or breaks closes the other.

(Relay threads moving the bytes with ``splice(2)`` were measured too, and cost the broker
more CPU per gRPC call than this: every chunk woke a thread that then had to take the GIL
from the busy event loop.)

gRPC sees every relayed connection come from the relay's own loopback socket; ``client_of``
names the client behind it (``origins``: the relay's upstream port -> the client's address, in
gRPC's peer format), so client lists and born hosts show the client, not 127.0.0.1.

Thread-safety: everything on the broker's event loop, but ``client_of``, a dict read, which
gRPC's threads may call.
"""

from __future__ import annotations

import asyncio
import logging
import socket

log = logging.getLogger(__name__)

__all__ = ["SocketRelay"]


class _Side(asyncio.Protocol):
    """One end of a relayed connection: what it reads, its ``peer`` writes."""

    def __init__(self, relay: SocketRelay) -> None:
        self.relay = relay
        self.peer: _Side | None = None
        self.transport: asyncio.Transport | None = None
        self.early: list[bytes] = []  # read before the peer was connected
        self.eof = False
        self.lost = False
        self.origin_port: int | None = None  # the upstream side: its key in relay.origins

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.relay.sides.add(self)
        assert self.peer is not None
        if self.peer.early:
            transport.writelines(self.peer.early)
            self.peer.early.clear()
        if self.peer.eof and transport.can_write_eof():
            transport.write_eof()
        if self.peer.lost:  # (the other end went before this one was connected)
            transport.close()

    def data_received(self, data: bytes) -> None:
        assert self.peer is not None
        if self.peer.transport is None:
            self.early.append(data)
        else:
            self.peer.transport.write(data)

    def eof_received(self) -> bool:
        self.eof = True
        peer = self.peer.transport if self.peer is not None else None
        if peer is not None and peer.can_write_eof():
            peer.write_eof()
        if self.peer is not None and self.peer.eof:  # both directions ended: close both
            if peer is not None:
                peer.close()
            return False  # (this transport closes itself)
        return True  # keep the other direction open (HTTP/2 half-closes are rare, but legal)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.origin_port is not None:
            self.relay.origins.pop(self.origin_port, None)
        self.lost = True
        self.relay.sides.discard(self)
        peer = self.peer.transport if self.peer is not None else None
        if peer is not None:
            if exc is None:
                peer.close()
            else:
                peer.abort()

    def pause_writing(self) -> None:  # our writes back up: stop reading what feeds them
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()


class SocketRelay:
    """Relays accepted sockets to ``upstream`` (host, port); see the module docstring."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.sides: set[_Side] = set()
        self.origins: dict[int, str] = {}

    async def start(self, client: socket.socket) -> None:
        """Relay ``client`` (an accepted, connected socket; the relay owns it from now on)."""
        loop = asyncio.get_running_loop()
        inner, outer = _Side(self), _Side(self)
        inner.peer, outer.peer = outer, inner
        try:
            await loop.create_connection(lambda: inner, *self.upstream)
        except OSError as exc:
            log.error("remoting: cannot relay %s to gRPC at %s:%d: %s",
                      _peer(client), *self.upstream, exc)
            client.close()
            return
        # Before the client's side is connected, so before gRPC can read a byte of it.
        if inner.transport is not None:
            inner.origin_port = int(inner.transport.get_extra_info("sockname")[1])
            self.origins[inner.origin_port] = _grpc_peer(client)
        try:
            await loop.connect_accepted_socket(lambda: outer, client)
        except OSError:
            client.close()
            if inner.transport is not None:
                inner.transport.close()

    def client_of(self, grpc_peer: str) -> str:
        """The client behind a relayed connection, given gRPC's peer for it
        (``ipv4:127.0.0.1:<relay port>``); any other peer as it is."""
        host, _, port = grpc_peer.rpartition(":")
        if host != f"ipv4:{self.upstream[0]}" or not port.isdigit():
            return grpc_peer
        return self.origins.get(int(port), grpc_peer)

    @property
    def active(self) -> int:
        """Connections being relayed now."""
        return len(self.sides) // 2

    def close(self) -> None:
        for side in list(self.sides):
            if side.transport is not None:
                side.transport.abort()


def _grpc_peer(sock: socket.socket) -> str:
    """A socket's peer written as gRPC writes ``context.peer()``."""
    try:
        address = sock.getpeername()
    except OSError:
        return "unknown"
    if sock.family == socket.AF_INET6:
        return f"ipv6:[{address[0]}]:{address[1]}"
    return f"ipv4:{address[0]}:{address[1]}"


def _peer(sock: socket.socket) -> object:
    try:
        return sock.getpeername()
    except OSError:
        return "?"
