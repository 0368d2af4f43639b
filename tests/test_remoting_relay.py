"""The shared port's relay on loopback sockets: a connection that does not start with a
remoting frame reaches the upstream server byte for byte (both ways, 8 MiB each way through
the transports' flow control, a half-close passed on), while remoting frames on the same port
are answered; closing the relays ends the relayed connections."""

from __future__ import annotations

import asyncio
import hashlib
import os

from stratamq.remoting.codec import RemotingCommand
from stratamq.remoting.codes import ResponseCode
from stratamq.remoting.transport import RemotingClient, RemotingServer

PAYLOAD = b"PRI * HTTP/2.0\r\n" + os.urandom(8 << 20)


async def _scenario() -> dict:
    async def upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Reads everything to EOF (the client's half-close), answers its digest and the bytes
        # back, then closes.
        data = await reader.read(-1)
        writer.write(hashlib.sha256(data).digest() + data)
        await writer.drain()
        writer.close()

    up = await asyncio.start_server(upstream, "127.0.0.1", 0)
    up_port = up.sockets[0].getsockname()[1]

    async def echo(cmd: RemotingCommand, conn: object) -> RemotingCommand:
        return cmd.response(ResponseCode.SUCCESS, body=cmd.body)

    server = RemotingServer({7: echo})
    port = await server.start("127.0.0.1", 0, ("127.0.0.1", up_port))
    out: dict = {}
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(PAYLOAD)
        await writer.drain()
        writer.write_eof()
        answer = await asyncio.wait_for(reader.read(-1), 60)
        out["digest"], out["echoed"] = answer[:32], answer[32:]
        writer.close()
        # Both directions ended: the relay let go of both sockets.
        for _ in range(200):
            if server._relay is not None and not server._relay.active:
                break
            await asyncio.sleep(0.05)
        out["left_after_eof"] = server._relay.active if server._relay is not None else -1

        client = RemotingClient(f"127.0.0.1:{port}")
        out["remoting"] = await client.invoke(RemotingCommand(7, body=b"same port"), 10)
        await client.close()

        # A relayed connection left open ends when the relays are closed (broker stop).
        held_reader, held_writer = await asyncio.open_connection("127.0.0.1", port)
        held_writer.write(b"PRI")
        await held_writer.drain()
        for _ in range(200):
            if server._relay is not None and server._relay.active:
                break
            await asyncio.sleep(0.05)
        out["active"] = server._relay.active if server._relay is not None else 0
        server.close_relays()
        out["after_close"] = await asyncio.wait_for(held_reader.read(), 10)
        held_writer.close()
    finally:
        await server.close()
        up.close()
        await up.wait_closed()
    return out


def test_relay_passes_bytes_both_ways_and_remoting_is_served_on_the_same_port():
    got = asyncio.run(_scenario())
    assert got["digest"] == hashlib.sha256(PAYLOAD).digest()
    assert got["echoed"] == PAYLOAD
    assert (got["remoting"].code, got["remoting"].body) == (ResponseCode.SUCCESS, b"same port")
    assert got["left_after_eof"] == 0
    assert got["active"] == 1
    assert got["after_close"] == b""


async def _who_is_behind() -> dict:
    seen: asyncio.Queue = asyncio.Queue()

    async def upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.put_nowait(writer.get_extra_info("peername"))  # the relay's socket, as gRPC sees
        await reader.read(-1)
        writer.close()

    up = await asyncio.start_server(upstream, "127.0.0.1", 0)
    server = RemotingServer({})
    port = await server.start("127.0.0.1", 0, ("127.0.0.1", up.sockets[0].getsockname()[1]))
    try:
        _reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"PRI * HTTP/2.0\r\n")
        await writer.drain()
        relay_host, relay_port = (await asyncio.wait_for(seen.get(), 10))[:2]
        client_port = writer.get_extra_info("sockname")[1]
        out = {"behind": server.relayed_peer(f"ipv4:{relay_host}:{relay_port}"),
               "client": f"ipv4:127.0.0.1:{client_port}",
               "relay": f"ipv4:{relay_host}:{relay_port}",
               "direct": server.relayed_peer("ipv4:10.1.2.3:4567")}
        writer.close()
    finally:
        await server.close()
        up.close()
        await up.wait_closed()
    return out


def test_grpc_sees_the_client_behind_the_relay_not_the_relays_own_socket():
    got = asyncio.run(_who_is_behind())
    assert got["relay"] != got["client"]  # what gRPC's context.peer() says: the relay
    assert got["behind"] == got["client"]  # what the broker shows: the client
    assert got["direct"] == "ipv4:10.1.2.3:4567"
