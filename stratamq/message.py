"""The domain types of a message: what a producer hands the store (``Message``), what a read
decodes (``StoredMessage``), what the dispatchers see (``DispatchInfo``), hosts, property names
and the errors a record can raise.

The bytes of a record are ``stratamq.record``'s business (``docs/formats/commitlog-record.md``);
this module knows no byte offsets.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass, field
from functools import lru_cache
from typing import NamedTuple

__all__ = [
    "DispatchInfo",
    "Host",
    "Message",
    "MessageIllegal",
    "PropertiesTooLarge",
    "Prop",
    "RecordCorrupt",
    "StoredMessage",
]


class Prop:
    """Property names RocketMQ gives meaning to (``MessageConst``)."""

    KEYS = "KEYS"
    TAGS = "TAGS"
    UNIQ_KEY = "UNIQ_KEY"
    WAIT_STORE_MSG_OK = "WAIT"
    DELAY_LEVEL = "DELAY"
    TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
    REAL_TOPIC = "REAL_TOPIC"
    REAL_QUEUE_ID = "REAL_QID"
    TRANSACTION_PREPARED = "TRAN_MSG"
    PRODUCER_GROUP = "PGROUP"
    MESSAGE_GROUP = "__SHARDINGKEY"
    CLUSTER = "CLUSTER"



class MessageIllegal(ValueError):
    """A message the store refuses to write (RocketMQ's MESSAGE_ILLEGAL)."""


class PropertiesTooLarge(MessageIllegal):
    """The encoded properties exceed 32,767 bytes (RocketMQ's PROPERTIES_SIZE_EXCEEDED)."""


class RecordCorrupt(ValueError):
    """Bytes at a position are not a valid record; ``reason`` says which check failed.
    ``queue_offset``: the queue offset of the unit that pointed there, when a read knows it."""

    def __init__(self, position: int, reason: str, queue_offset: int | None = None) -> None:
        super().__init__(f"corrupt record at {position}: {reason}")
        self.position = position
        self.reason = reason
        self.queue_offset = queue_offset


class Host(NamedTuple):
    """An IPv4 or IPv6 address and port as a record stores it."""

    ip: str
    port: int

    @property
    def is_v6(self) -> bool:
        return ":" in self.ip

    def packed(self) -> bytes:
        return _pack_ip(self.ip)

    def __str__(self) -> str:
        return f"[{self.ip}]:{self.port}" if self.is_v6 else f"{self.ip}:{self.port}"

    @classmethod
    def parse(cls, text: str) -> Host:
        """Parse ``ip:port`` or ``[ipv6]:port``."""
        host, _, port = text.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"not host:port: {text!r}")
        host = host.strip("[]")
        ipaddress.ip_address(host)  # raises a clear ValueError on a bad address
        return cls(host, int(port))


@lru_cache(maxsize=1024)
def _pack_ip(ip: str) -> bytes:
    return ipaddress.ip_address(ip).packed


def _ip_text(packed: bytes) -> str:
    return _ip_text_cached(bytes(packed))


# Decoding a record formats two addresses; a store sees few distinct ones, and ``ipaddress``
# costs microseconds each (a large part of a lookup by key), so remember them.
@lru_cache(maxsize=4096)
def _ip_text_cached(packed: bytes) -> str:
    return socket.inet_ntoa(packed) if len(packed) == 4 else str(ipaddress.ip_address(packed))


@lru_cache(maxsize=4096)
def _host(packed: bytes, port: int) -> Host:
    return Host(_ip_text_cached(packed), port)




@dataclass
class Message:
    """A message as a producer hands it to the store (before it has a position)."""

    topic: str
    body: bytes
    queue_id: int = 0
    properties: dict[str, str] = field(default_factory=dict)
    flag: int = 0
    sys_flag: int = 0
    born_timestamp: int = 0
    born_host: Host = Host("127.0.0.1", 0)
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0

    @property
    def tags(self) -> str | None:
        return self.properties.get(Prop.TAGS)

    @property
    def keys(self) -> list[str]:
        return self.properties.get(Prop.KEYS, "").split()


class StoredMessage:
    """A record decoded from the CommitLog. ``body`` is as stored (see ``decompressed_body``)."""

    __slots__ = (
        "total_size", "magic_code", "body_crc", "queue_id", "flag", "queue_offset",
        "physical_offset", "sys_flag", "born_timestamp", "born_host", "store_timestamp",
        "store_host", "reconsume_times", "prepared_transaction_offset", "body", "topic",
        "properties",
    )  # fmt: skip

    def __init__(self, **values: object) -> None:
        for name, value in values.items():
            setattr(self, name, value)

    total_size: int
    magic_code: int
    body_crc: int
    queue_id: int
    flag: int
    queue_offset: int
    physical_offset: int
    sys_flag: int
    born_timestamp: int
    born_host: Host
    store_timestamp: int
    store_host: Host
    reconsume_times: int
    prepared_transaction_offset: int
    body: bytes
    topic: str
    properties: dict[str, str]

    @property
    def tags(self) -> str | None:
        return self.properties.get(Prop.TAGS)

    @property
    def keys(self) -> list[str]:
        return self.properties.get(Prop.KEYS, "").split()

    @property
    def msg_id(self) -> str:
        from stratamq.record.codec import offset_msg_id  # the record package imports this one

        return offset_msg_id(self.store_host, self.physical_offset)

    def decompressed_body(self) -> bytes:
        from stratamq.record.codec import decompress_body

        return decompress_body(self.body, self.sys_flag)

    def __repr__(self) -> str:
        return (
            f"StoredMessage(topic={self.topic!r}, queue_id={self.queue_id}, "
            f"queue_offset={self.queue_offset}, physical_offset={self.physical_offset}, "
            f"size={self.total_size})"
        )




class DispatchInfo(NamedTuple):
    """What the dispatchers need from a record, without copying its body."""

    topic: str
    queue_id: int
    queue_offset: int
    physical_offset: int
    size: int
    tags_code: int
    store_timestamp: int
    sys_flag: int
    properties: dict[str, str]

    @property
    def keys(self) -> list[str]:
        return self.properties.get(Prop.KEYS, "").split()

    @property
    def uniq_key(self) -> str | None:
        return self.properties.get(Prop.UNIQ_KEY)
