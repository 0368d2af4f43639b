"""RocketMQ remoting frames: bytes in, commands out, and back. No I/O here.

A frame (docs/formats/remoting-frame.md; RocketMQ's ``RemotingCommand`` and
``RocketMQSerializable``)::

    int32 length            # of everything after this field: 4 + header + body
    int32 type_and_length   # high byte: SerializeType (0 JSON, 1 ROCKETMQ); low 3 bytes: header
    header                  # the command's fields, as JSON or RocketMQ's binary layout
    body                    # the rest (a message body, a JSON document, raw records)

Big-endian throughout. ``FrameDecoder`` cuts a stream into frames and decodes them; a frame
that cannot be decoded raises ``FrameError``, after which the connection must be closed, as
RocketMQ's ``NettyDecoder`` closes the channel (nothing of a broken stream can be trusted).

Thread-safety: ``RemotingCommand`` is a plain dataclass owned by whoever built it; a
``FrameDecoder`` belongs to one connection.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import Any

from stratamq.remoting.codes import LANGUAGES, SerializeType

__all__ = ["DEFAULT_MAX_FRAME", "FLAG_ONEWAY", "FLAG_RESPONSE", "FrameDecoder", "FrameError",
           "RemotingCommand", "decode_frame", "encode"]

FLAG_RESPONSE = 1 << 0  # RemotingCommand.RPC_TYPE: set on responses
FLAG_ONEWAY = 1 << 1  # RemotingCommand.RPC_ONEWAY: the sender wants no response

# RocketMQ's ``com.rocketmq.remoting.frameMaxLength`` default: longer frames close the channel.
DEFAULT_MAX_FRAME = 16 * 1024 * 1024

_INT = struct.Struct(">i")
_PREFIX = struct.Struct(">iI")  # length, type_and_length
# The ROCKETMQ header's fixed part: code, language, version, opaque, flag.
_FIXED = struct.Struct(">hbhii")
_SHORT = struct.Struct(">h")
_HEADER_LENGTH_MASK = 0xFFFFFF


class FrameError(ValueError):
    """A frame that cannot be decoded (or encoded): the stream is broken, close it."""


@dataclass(slots=True)
class RemotingCommand:
    """One request or response. ``ext_fields`` holds the custom header's fields as strings
    (what RocketMQ's ``CommandCustomHeader`` classes are made from)."""

    code: int
    opaque: int = 0
    flag: int = 0
    language: str = "JAVA"
    version: int = 0
    remark: str | None = None
    ext_fields: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    serialize_type: SerializeType = SerializeType.JSON

    @property
    def is_response(self) -> bool:
        return bool(self.flag & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & FLAG_ONEWAY)

    def response(self, code: int, remark: str | None = None,
                 ext_fields: dict[str, str] | None = None, body: bytes = b"") -> RemotingCommand:
        """The response to this request: same opaque and header encoding, the response flag."""
        return RemotingCommand(code, self.opaque, FLAG_RESPONSE, "JAVA", self.version, remark,
                               ext_fields or {}, body, self.serialize_type)


# -- encoding -----------------------------------------------------------------------------------


def _json_header(cmd: RemotingCommand) -> bytes:
    # The fields of RocketMQ's JSON header, in fastjson's (alphabetical) order; nulls left out.
    doc: dict[str, Any] = {"code": cmd.code}
    if cmd.ext_fields:
        doc["extFields"] = cmd.ext_fields
    doc["flag"] = cmd.flag
    doc["language"] = cmd.language
    doc["opaque"] = cmd.opaque
    if cmd.remark is not None:
        doc["remark"] = cmd.remark
    doc["serializeTypeCurrentRPC"] = cmd.serialize_type.name
    doc["version"] = cmd.version
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()


def _binary_header(cmd: RemotingCommand) -> bytes:
    try:
        language = LANGUAGES.index(cmd.language)
    except ValueError:
        language = LANGUAGES.index("OTHER")
    try:
        parts = [_FIXED.pack(cmd.code, language, cmd.version, cmd.opaque, cmd.flag)]
    except struct.error as exc:
        raise FrameError(f"a field does not fit RocketMQ's binary header: {exc}") from None
    remark = cmd.remark.encode() if cmd.remark else b""
    parts += [_INT.pack(len(remark)), remark]
    fields = bytearray()
    for key, value in cmd.ext_fields.items():
        k, v = key.encode(), value.encode()
        if len(k) > 0x7FFF:
            raise FrameError(f"ext field name of {len(k)} bytes (at most 32767)")
        fields += _SHORT.pack(len(k)) + k + _INT.pack(len(v)) + v
    parts += [_INT.pack(len(fields)), bytes(fields)]
    return b"".join(parts)


def encode(cmd: RemotingCommand) -> bytes:
    """The whole frame, length prefix included."""
    header = (_json_header(cmd) if cmd.serialize_type is SerializeType.JSON
              else _binary_header(cmd))
    if len(header) > _HEADER_LENGTH_MASK:
        raise FrameError(f"header of {len(header)} bytes (at most {_HEADER_LENGTH_MASK})")
    return b"".join((_PREFIX.pack(4 + len(header) + len(cmd.body),
                                  (int(cmd.serialize_type) << 24) | len(header)),
                     header, cmd.body))


# -- decoding -----------------------------------------------------------------------------------


def _field_text(value: Any) -> str:
    """An ext field as Java reads it into a ``HashMap<String, String>``: clients written in
    other languages (ali-ons) send numbers and booleans unquoted."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(value, separators=(",", ":"))


def _int_field(doc: dict[str, Any], name: str, default: int, bits: int = 32) -> int:
    value = doc.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, str) and value.lstrip("-").isdigit():
            value = int(value)
        else:
            raise FrameError(f"header field {name!r} is not an integer: {value!r}")
    if not -(1 << (bits - 1)) <= value < (1 << (bits - 1)):
        raise FrameError(f"header field {name!r} out of range: {value}")
    return int(value)


def _decode_json(header: bytes) -> RemotingCommand:
    try:
        doc = json.loads(header)
    except (UnicodeDecodeError, ValueError) as exc:
        raise FrameError(f"header is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise FrameError("header is not a JSON object")
    if "code" not in doc:
        raise FrameError("header has no code")
    ext = doc.get("extFields") or {}
    if not isinstance(ext, dict):
        raise FrameError("extFields is not a JSON object")
    remark = doc.get("remark")
    language = doc.get("language") or "JAVA"
    if not isinstance(language, str) or (remark is not None and not isinstance(remark, str)):
        raise FrameError("language and remark must be strings")
    return RemotingCommand(
        _int_field(doc, "code", 0), _int_field(doc, "opaque", 0), _int_field(doc, "flag", 0),
        language, _int_field(doc, "version", 0), remark,
        {str(k): _field_text(v) for k, v in ext.items() if v is not None},
        b"", SerializeType.JSON)


def _read_text(buf: memoryview, pos: int, size: int, end: int) -> tuple[str, int]:
    if size < 0 or pos + size > end:
        raise FrameError(f"string of {size} bytes at {pos} runs past the header ({end})")
    try:
        return str(buf[pos:pos + size], "utf-8"), pos + size
    except UnicodeDecodeError as exc:
        raise FrameError(f"string at {pos} is not UTF-8: {exc}") from None


def _decode_binary(header: memoryview) -> RemotingCommand:
    end = len(header)
    if end < _FIXED.size + 8:
        raise FrameError(f"binary header of {end} bytes is shorter than its fixed part")
    code, language, version, opaque, flag = _FIXED.unpack_from(header)
    pos = _FIXED.size
    (remark_len,) = _INT.unpack_from(header, pos)
    remark, pos = _read_text(header, pos + 4, remark_len, end)
    if pos + 4 > end:
        raise FrameError("binary header ends before its ext fields")
    (fields_len,) = _INT.unpack_from(header, pos)
    pos += 4
    if fields_len < 0 or pos + fields_len > end:
        raise FrameError(f"ext fields of {fields_len} bytes run past the header ({end})")
    stop = pos + fields_len
    fields: dict[str, str] = {}
    while pos < stop:
        if pos + 2 > stop:
            raise FrameError("ext field name length cut short")
        (klen,) = _SHORT.unpack_from(header, pos)
        key, pos = _read_text(header, pos + 2, klen, stop)
        if pos + 4 > stop:
            raise FrameError("ext field value length cut short")
        (vlen,) = _INT.unpack_from(header, pos)
        fields[key], pos = _read_text(header, pos + 4, vlen, stop)
    lang = LANGUAGES[language] if 0 <= language < len(LANGUAGES) else "OTHER"
    return RemotingCommand(code, opaque, flag, lang, version, remark or None, fields, b"",
                           SerializeType.ROCKETMQ)


def decode_frame(frame: bytes | bytearray | memoryview) -> RemotingCommand:
    """One frame without its length prefix: type_and_length, header, body."""
    view = memoryview(frame)
    if len(view) < 4:
        raise FrameError(f"frame of {len(view)} bytes has no header length")
    (word,) = _INT.unpack_from(view)
    kind, header_len = (word >> 24) & 0xFF, word & _HEADER_LENGTH_MASK
    if header_len > len(view) - 4:
        raise FrameError(f"header length {header_len} exceeds the frame ({len(view) - 4})")
    header = view[4:4 + header_len]
    if kind == SerializeType.JSON:
        cmd = _decode_json(bytes(header))
    elif kind == SerializeType.ROCKETMQ:
        cmd = _decode_binary(header)
    else:
        raise FrameError(f"unknown serialize type {kind}")
    cmd.body = bytes(view[4 + header_len:])
    return cmd


class FrameDecoder:
    """Cuts a byte stream into commands (RocketMQ's length-field frame decoder).

    ``feed(data)`` returns the commands completed so far; a length below 4 or above
    ``max_frame``, or a frame that does not decode, raises ``FrameError`` (close the
    connection: the rest of the stream cannot be framed)."""

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self.max_frame = max_frame
        self._buf = bytearray()

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes) -> list[RemotingCommand]:
        buf = self._buf
        buf += data
        out: list[RemotingCommand] = []
        pos = 0
        while len(buf) - pos >= 4:
            (length,) = _INT.unpack_from(buf, pos)
            if length < 4 or length > self.max_frame:
                raise FrameError(f"frame length {length} outside 4..{self.max_frame}")
            if len(buf) - pos - 4 < length:
                break
            # A copy: the buffer is cut below, which a live view of it would forbid.
            out.append(decode_frame(bytes(buf[pos + 4:pos + 4 + length])))
            pos += 4 + length
        if pos:
            del buf[:pos]
        return out
