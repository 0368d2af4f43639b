"""The remoting frame codec: round trips in both header encodings, RocketMQ's exact bytes, and
hostile frames (length lies, huge headers, bad JSON) refused with FrameError, never a crash;
over TCP, unknown codes get REQUEST_CODE_NOT_SUPPORTED and broken streams a closed connection
while the server goes on serving others."""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stratamq.remoting.codec import (
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    FrameDecoder,
    FrameError,
    RemotingCommand,
    decode_frame,
    encode,
)
from stratamq.remoting.codes import LANGUAGES, RequestCode, ResponseCode, SerializeType
from stratamq.remoting.transport import RemotingClient, RemotingServer

_text = st.text(max_size=40)
_commands = st.builds(
    RemotingCommand,
    code=st.integers(-32768, 32767),
    opaque=st.integers(-(1 << 31), (1 << 31) - 1),
    flag=st.integers(0, 3),
    language=st.sampled_from(LANGUAGES),
    version=st.integers(-32768, 32767),
    remark=st.none() | st.text(min_size=1, max_size=40),
    ext_fields=st.dictionaries(st.text(min_size=1, max_size=20), _text, max_size=8),
    body=st.binary(max_size=300),
    serialize_type=st.sampled_from(SerializeType),
)


@given(_commands)
def test_round_trip(cmd: RemotingCommand) -> None:
    frame = encode(cmd)
    (length,) = struct.unpack_from(">i", frame)
    assert length == len(frame) - 4
    assert frame[4] == int(cmd.serialize_type)  # the high byte of the header-length word
    assert decode_frame(frame[4:]) == cmd


@settings(max_examples=50)
@given(st.lists(_commands, min_size=1, max_size=5), st.integers(1, 64))
def test_stream_cut_anywhere(cmds: list[RemotingCommand], chunk: int) -> None:
    stream = b"".join(encode(c) for c in cmds)
    decoder = FrameDecoder()
    got: list[RemotingCommand] = []
    for i in range(0, len(stream), chunk):
        got += decoder.feed(stream[i:i + chunk])
    assert got == cmds and decoder.buffered == 0


def test_binary_header_bytes_as_rocketmq_writes_them() -> None:
    # RocketMQSerializable.rocketMQProtocolEncode: code short, language byte, version short,
    # opaque int, flag int, remark (int length + UTF-8), ext fields (int length, then short
    # key length + key, int value length + value).
    cmd = RemotingCommand(310, opaque=7, flag=FLAG_RESPONSE, language="JAVA", version=453,
                          remark="ok", ext_fields={"a": "g1"}, body=b"xy",
                          serialize_type=SerializeType.ROCKETMQ)
    header = (struct.pack(">hbhii", 310, 0, 453, 7, 1) + struct.pack(">i", 2) + b"ok"
              + struct.pack(">i", 2 + 1 + 4 + 2) + struct.pack(">h", 1) + b"a"
              + struct.pack(">i", 2) + b"g1")
    assert encode(cmd) == (struct.pack(">i", 4 + len(header) + 2)
                           + struct.pack(">I", (1 << 24) | len(header)) + header + b"xy")


def test_json_header_from_a_node_client() -> None:
    # ali-ons writes ext fields as JSON numbers and booleans, and no serialize type.
    header = json.dumps({"code": 11, "language": "JAVA", "opaque": 5, "flag": 0,
                         "version": 121, "extFields": {"queueId": 3, "unitMode": False,
                                                       "topic": "T", "none": None}}).encode()
    cmd = decode_frame(struct.pack(">i", len(header)) + header + b"body")
    assert cmd.ext_fields == {"queueId": "3", "unitMode": "false", "topic": "T"}
    assert (cmd.code, cmd.opaque, cmd.version, cmd.body) == (11, 5, 121, b"body")
    response = cmd.response(ResponseCode.SUCCESS)
    assert response.opaque == 5 and response.is_response and not response.is_oneway


def _frame(header: bytes, kind: int = 0, body: bytes = b"", length: int | None = None) -> bytes:
    total = 4 + len(header) + len(body) if length is None else length
    return struct.pack(">iI", total, (kind << 24) | len(header)) + header + body


@pytest.mark.parametrize("frame", [
    pytest.param(_frame(b"{not json"), id="bad-json"),
    pytest.param(_frame(b"[1, 2]"), id="json-not-object"),
    pytest.param(_frame(b'{"opaque": 1}'), id="no-code"),
    pytest.param(_frame(b'{"code": "ten"}'), id="code-not-int"),
    pytest.param(_frame(b'{"code": 1, "opaque": 99999999999}'), id="opaque-overflow"),
    pytest.param(_frame(b'{"code": 1, "extFields": [1]}'), id="ext-not-object"),
    pytest.param(_frame(b"\xff\xfe"), id="not-utf8"),
    pytest.param(_frame(b"", kind=7), id="unknown-serialize-type"),
    pytest.param(struct.pack(">iI", 8, 1000) + b"abcd", id="header-longer-than-frame"),
    pytest.param(_frame(b"\x00" * 5, kind=1), id="binary-too-short"),
    pytest.param(_frame(struct.pack(">hbhii", 1, 0, 0, 0, 0) + struct.pack(">i", 1 << 30)
                        + struct.pack(">i", 0), kind=1), id="remark-length-lie"),
    pytest.param(_frame(struct.pack(">hbhii", 1, 0, 0, 0, 0) + struct.pack(">i", 0)
                        + struct.pack(">i", 50) + b"\x00\x01k", kind=1), id="fields-length-lie"),
    pytest.param(_frame(struct.pack(">hbhii", 1, 0, 0, 0, 0) + struct.pack(">i", 0)
                        + struct.pack(">i", 7) + struct.pack(">h", -3) + b"kxxxx", kind=1),
                 id="negative-key-length"),
])
def test_hostile_frames_raise_frame_error(frame: bytes) -> None:
    with pytest.raises(FrameError):
        FrameDecoder().feed(frame)


@pytest.mark.parametrize("length", [0, 3, -1, 16 * 1024 * 1024 + 1, 0x7FFFFFFF])
def test_length_lies_raise_before_buffering(length: int) -> None:
    # A length past the limit is refused at once, not after waiting for gigabytes to arrive.
    with pytest.raises(FrameError):
        FrameDecoder().feed(struct.pack(">i", length) + b"\x00" * 8)


@settings(max_examples=200)
@given(st.binary(max_size=200))
def test_garbage_never_escapes_as_another_error(data: bytes) -> None:
    with contextlib.suppress(FrameError):  # any other exception fails the test
        FrameDecoder(max_frame=1 << 16).feed(data)


# -- over TCP -----------------------------------------------------------------------------------


async def _echo(cmd: RemotingCommand, conn: object) -> RemotingCommand:
    return cmd.response(ResponseCode.SUCCESS, remark="echo", ext_fields=cmd.ext_fields,
                        body=cmd.body)


async def _fails(cmd: RemotingCommand, conn: object) -> RemotingCommand:
    raise RuntimeError("handler broke")


def test_server_answers_unknown_codes_and_survives_broken_streams() -> None:
    async def scenario() -> None:
        server = RemotingServer({1: _echo, 2: _fails})
        port = await server.start("127.0.0.1", 0)
        client = RemotingClient(f"127.0.0.1:{port}")
        try:
            for kind in SerializeType:
                got = await client.invoke(RemotingCommand(1, ext_fields={"k": "v"}, body=b"b",
                                                          serialize_type=kind))
                assert (got.code, got.remark, got.ext_fields, got.body, got.serialize_type) == (
                    ResponseCode.SUCCESS, "echo", {"k": "v"}, b"b", kind)
            unknown = await client.invoke(RemotingCommand(RequestCode.QUERY_MESSAGE))
            assert unknown.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
            assert "request type 12 not supported" in (unknown.remark or "")
            failed = await client.invoke(RemotingCommand(2))
            assert failed.code == ResponseCode.SYSTEM_ERROR and "handler broke" in failed.remark

            # A broken stream: the server closes that connection ...
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(_frame(b"{broken"))
            await writer.drain()
            assert await asyncio.wait_for(reader.read(), 10) == b""
            writer.close()
            # ... and a length lie too, without waiting for the bytes it announced.
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(struct.pack(">i", 0x7FFFFFFF))
            await writer.drain()
            assert await asyncio.wait_for(reader.read(), 10) == b""
            writer.close()
            # A oneway request is not answered; the next one is, on the same connection.
            conn = await client.connect()
            await conn.oneway(RemotingCommand(1))
            got = await client.invoke(RemotingCommand(1, body=b"after"))
            assert got.body == b"after"
            assert RemotingCommand(1, flag=FLAG_ONEWAY).is_oneway
        finally:
            await client.close()
            await server.close()

    asyncio.run(scenario())


def test_a_connection_past_its_in_flight_limit_is_answered_system_busy() -> None:
    async def scenario() -> list[int]:
        release = asyncio.Event()

        async def slow(cmd: RemotingCommand, conn: object) -> RemotingCommand:
            await release.wait()
            return cmd.response(ResponseCode.SUCCESS)

        server = RemotingServer({1: slow}, max_in_flight=2)
        port = await server.start("127.0.0.1", 0)
        client = RemotingClient(f"127.0.0.1:{port}")
        try:
            conn = await client.connect()
            calls = [asyncio.ensure_future(conn.invoke(RemotingCommand(1), 10))
                     for _ in range(3)]
            busy = await asyncio.wait_for(asyncio.shield(calls[2]), 10)  # answered at once
            release.set()
            return [busy.code] + [(await c).code for c in calls[:2]]
        finally:
            await client.close()
            await server.close()

    assert asyncio.run(scenario()) == [ResponseCode.SYSTEM_BUSY, ResponseCode.SUCCESS,
                                       ResponseCode.SUCCESS]
