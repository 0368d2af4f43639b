"""A small synchronous client of the broker's MessagingService (RocketMQ 5's gRPC protocol),
for the command line: send, receive + ack, and read one queue offset.

The official clients are the way to build applications; this exists so a console producer or
consumer starts in a fraction of a second, writes no log files, and shows the broker's status
codes as they are. Requests are signed like the official clients' (``stratamq.signature``)
when credentials are given.
"""

from __future__ import annotations

import base64
import os
import socket
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc

from stratamq.client.connection import BrokerEndpoint, check_endpoint

__all__ = ["MessagingClient", "MessagingError", "message_row"]


def message_row(m: pb.Message) -> dict[str, Any]:
    """A received message as one JSON object; the body as text when it is UTF-8."""
    sp = m.system_properties
    row: dict[str, Any] = {
        "topic": m.topic.name, "queue_id": sp.queue_id, "queue_offset": sp.queue_offset,
        "message_id": sp.message_id, "tag": sp.tag or None, "keys": list(sp.keys),
        "properties": dict(m.user_properties),
        "born_timestamp": sp.born_timestamp.ToMilliseconds(),
        "store_timestamp": sp.store_timestamp.ToMilliseconds(),
        "delivery_attempt": sp.delivery_attempt or None,
    }
    try:
        row["body"] = bytes(m.body).decode("utf-8")
    except UnicodeDecodeError:
        row["body_b64"] = base64.b64encode(m.body).decode("ascii")
    return row



class MessagingError(RuntimeError):
    """The broker answered a status other than OK; ``code`` is the protocol's Code name."""

    def __init__(self, code: int, message: str) -> None:
        self.code = pb.Code.Name(code) if code in pb.Code.values() else str(code)
        super().__init__(f"{self.code}: {message}")


def _check(status: pb.Status, *allowed: int) -> None:
    if status.code not in (pb.OK, *allowed):
        raise MessagingError(status.code, status.message)


class MessagingClient:
    """``with MessagingClient("127.0.0.1:10911") as c: c.send("Orders", b"hi")``."""

    def __init__(self, endpoint: str | BrokerEndpoint, access_key: str | None = None,
                 secret_key: str | None = None, timeout: float = 10.0) -> None:
        self.broker = (endpoint if isinstance(endpoint, BrokerEndpoint) else BrokerEndpoint(
            check_endpoint(endpoint), access_key=access_key, secret_key=secret_key))
        self.endpoint = self.broker.endpoint
        self.timeout = timeout
        self.client_id = f"{socket.gethostname()}@{os.getpid()}@stratamq-cli"
        self.channel = self.broker.channel()
        self.stub = service_pb2_grpc.MessagingServiceStub(self.channel)

    def __enter__(self) -> MessagingClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.channel.close()

    def _metadata(self) -> list[tuple[str, str]]:
        return list(self.broker.metadata(("x-mq-client-id", self.client_id),
                                         ("x-mq-language", "PYTHON")))

    def send(self, topic: str, body: bytes, *, tag: str | None = None,
             keys: Iterable[str] = (), properties: Mapping[str, str] | None = None,
             message_group: str | None = None, deliver_at_ms: int | None = None
             ) -> dict[str, Any]:
        sp = pb.SystemProperties(message_id=uuid.uuid4().hex.upper(), keys=list(keys))
        if tag:
            sp.tag = tag
        if message_group:
            sp.message_group = message_group
        if deliver_at_ms is not None:
            sp.delivery_timestamp.FromMilliseconds(deliver_at_ms)
        sp.born_timestamp.GetCurrentTime()
        sp.born_host = socket.gethostbyname("localhost")
        msg = pb.Message(topic=pb.Resource(name=topic), body=body, system_properties=sp,
                         user_properties=dict(properties or {}))
        reply = self.stub.SendMessage(svc.SendMessageRequest(messages=[msg]),
                                      metadata=self._metadata(), timeout=self.timeout)
        _check(reply.status)
        entry = reply.entries[0]
        return {"topic": topic, "message_id": entry.message_id, "offset": entry.offset}

    def receive(self, group: str, topic: str, *, batch: int = 16, invisible_ms: int = 30_000,
                wait_ms: int = 5_000, tag_expression: str = "*") -> list[pb.Message]:
        request = svc.ReceiveMessageRequest(
            group=pb.Resource(name=group), batch_size=batch,
            message_queue=pb.MessageQueue(topic=pb.Resource(name=topic), id=-1),
            filter_expression=pb.FilterExpression(type=pb.TAG, expression=tag_expression))
        request.invisible_duration.FromMilliseconds(invisible_ms)
        request.long_polling_timeout.FromMilliseconds(wait_ms)
        out = []
        for r in self.stub.ReceiveMessage(request, metadata=self._metadata(),
                                          timeout=self.timeout + wait_ms / 1000):
            if r.HasField("status"):
                _check(r.status, pb.MESSAGE_NOT_FOUND)
            elif r.HasField("message"):
                out.append(r.message)
        return out

    def ack(self, group: str, topic: str, message: pb.Message) -> None:
        reply = self.stub.AckMessage(svc.AckMessageRequest(
            group=pb.Resource(name=group), topic=pb.Resource(name=topic),
            entries=[svc.AckMessageEntry(
                message_id=message.system_properties.message_id,
                receipt_handle=message.system_properties.receipt_handle)]),
            metadata=self._metadata(), timeout=self.timeout)
        _check(reply.status)

    def get(self, topic: str, queue_id: int, offset: int,
            group: str = "stratamq-cli") -> pb.Message | None:
        """The message at ``offset`` of the queue (RocketMQ's queryMsgByOffset), or None if
        the offset holds none (past the end, or removed by retention)."""
        request = svc.PullMessageRequest(
            group=pb.Resource(name=group), offset=offset, batch_size=1,
            message_queue=pb.MessageQueue(topic=pb.Resource(name=topic), id=queue_id),
            filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"))
        found = None
        for r in self.stub.PullMessage(request, metadata=self._metadata(), timeout=self.timeout):
            if r.HasField("status"):
                _check(r.status, pb.MESSAGE_NOT_FOUND, pb.ILLEGAL_OFFSET)
                if r.status.code != pb.OK:
                    return None
            elif r.HasField("message"):
                found = r.message
        if found is not None and found.system_properties.queue_offset != offset:
            return None  # the pull skipped ahead: nothing is stored at that offset
        return found
