"""What the console asks the broker, through the clients the CLI uses (never the Broker object).

The pages make their admin calls on the event loop (``acall``: grpc.aio on the same endpoint,
TLS and signature included): a worker thread between a page and its answer cost a quarter of
a millisecond, as much as a small RPC itself (bench/console.py). Message reads and sends, and
the charts' sampler, use the blocking clients (the app runs those in a worker thread). Errors
are ``AdminError`` (the gRPC status code name and the broker's message), whichever client
raised them.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Sequence
from typing import Any

import grpc
from starlette.concurrency import run_in_threadpool

from stratamq.client.admin import SERVICE, AdminClient, AdminError, refusal, request_body
from stratamq.client.connection import BrokerEndpoint, broker_answered
from stratamq.client.messaging import MessagingClient, MessagingError

__all__ = ["AdminError", "ConsoleBroker", "DLQ_PREFIX", "unreachable"]

DLQ_PREFIX = "%DLQ%"
# A point past any store time: ResetOffset to it puts a group at the end of every queue.
FAR_FUTURE_MS = 2**62
MAX_LISTED = 64  # messages one page lists (RocketMQ's maxMsgsNumBatch)


def message_view(m: Any) -> dict[str, Any]:
    """A message as the pages show it: the body kept as bytes (text, JSON or hex)."""
    sp = m.system_properties
    return {"topic": m.topic.name, "queue_id": sp.queue_id, "queue_offset": sp.queue_offset,
            "message_id": sp.message_id, "tag": sp.tag or None, "keys": list(sp.keys),
            "properties": dict(m.user_properties),
            "born_timestamp": sp.born_timestamp.ToMilliseconds(),
            "store_timestamp": sp.store_timestamp.ToMilliseconds(),
            "body": bytes(m.body),
            "dlq_origin_topic": (sp.dead_letter_queue.topic
                                 if sp.HasField("dead_letter_queue") else None)}


def unreachable(endpoint: BrokerEndpoint, timeout: float = 10.0) -> str | None:
    """Why no broker answers a call at ``endpoint``, in gRPC's words (a TLS handshake that
    failed, nothing listening), or None when one answers: a refusal (ACL) is an answer too."""
    channel = endpoint.channel()
    try:
        channel.unary_unary(f"/{SERVICE}/BrokerStatus")(
            request_body({}), timeout=timeout, metadata=endpoint.metadata() or None)
    except grpc.RpcError as exc:
        if not broker_answered(exc):
            code = exc.code()
            return exc.details() or (code.name if code is not None else "UNKNOWN")
    finally:
        channel.close()
    return None


class ConsoleBroker:
    """One broker endpoint and the credentials to call it with; the channels are kept open."""

    def __init__(self, endpoint: BrokerEndpoint, timeout: float = 10.0) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        self.admin = AdminClient(endpoint, timeout=timeout)
        self.messaging = MessagingClient(endpoint, timeout=timeout)
        self._aio: grpc.aio.Channel | None = None  # made in the serving loop, on first use

    def close(self) -> None:
        self.admin.close()
        self.messaging.channel.close()

    async def aclose(self) -> None:
        """Close the event loop's channel (from that loop, before it stops)."""
        if self._aio is not None:
            await self._aio.close()
            self._aio = None

    async def acall(self, method: str, service: str = SERVICE, **request: Any
                    ) -> dict[str, Any]:
        """``call`` on the running event loop."""
        if self._aio is None:
            self._aio = self.endpoint.aio_channel()
        stub = self._aio.unary_unary(f"/{service}/{method}")
        try:
            reply = await stub(request_body(request), timeout=self.timeout,
                               metadata=self.endpoint.metadata() or None)
        except grpc.RpcError as exc:
            raise refusal(exc, self.endpoint.endpoint) from None
        return dict(json.loads(reply))

    async def aoptional(self, method: str, service: str = SERVICE) -> dict[str, Any] | str:
        """``optional`` on the running event loop."""
        try:
            return await self.acall(method, service)
        except AdminError as exc:
            if exc.code in ("FAILED_PRECONDITION", "UNIMPLEMENTED"):
                return exc.message or exc.code
            raise

    def call(self, method: str, **request: Any) -> dict[str, Any]:
        return self.admin.call(method, **request)

    def optional(self, method: str, service: str | None = None) -> dict[str, Any] | str:
        """A status the broker may not have (a tier, replication): its reply, or why not."""
        try:
            if service is None:
                return self.admin.call(method)
            return self.admin.call_service(service, method)
        except AdminError as exc:
            if exc.code in ("FAILED_PRECONDITION", "UNIMPLEMENTED"):
                return exc.message or exc.code
            raise

    # -- messages --------------------------------------------------------------------------

    def _messaging(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except grpc.RpcError as exc:
            code = exc.code()
            name = code.name if code is not None else "UNKNOWN"
            if code is grpc.StatusCode.UNAVAILABLE:
                raise AdminError(name, f"no broker reachable at {self.endpoint.endpoint}"
                                 ) from None
            raise AdminError(name, exc.details() or "") from None
        except MessagingError as exc:
            raise AdminError("REFUSED", str(exc)) from None

    def get(self, topic: str, queue_id: int, offset: int) -> dict[str, Any] | None:
        m = self._messaging(self.messaging.get, topic, queue_id, offset,
                            group="stratamq-console")
        return None if m is None else message_view(m)

    def send(self, topic: str, body: bytes, *, tag: str | None = None, keys: Sequence[str] = (),
             properties: dict[str, str] | None = None) -> dict[str, Any]:
        return self._messaging(self.messaging.send, topic, body, tag=tag, keys=list(keys),
                               properties=properties)

    async def query(self, topic: str, **request: Any) -> list[dict[str, Any]]:
        """``QueryMessage`` (by key, id or time range, tier included) as rows with bytes
        bodies; UNIMPLEMENTED on a broker without the online lookups."""
        rows = (await self.acall("QueryMessage", topic=topic, max=MAX_LISTED, **request)
                )["messages"]
        for row in rows:
            if "body_b64" in row:
                row["body"] = base64.b64decode(row.pop("body_b64"))
            else:
                row["body"] = str(row.get("body", "")).encode("utf-8")
        return rows

    def scan(self, topic: str, queue_id: int, begin: int, end: int
             ) -> list[dict[str, Any]]:
        """The messages at offsets [begin, end) of one queue that are still held."""
        out = []
        for offset in range(begin, end):
            m = self.get(topic, queue_id, offset)
            if m is not None:
                out.append(m)
        return out

    async def dead_letter_count(self, group: str) -> int:
        """Messages held in the group's ``%DLQ%`` topic (0 when it has none)."""
        status = await self._dlq_status(group)
        return int(status["messages"]) if status is not None else 0

    async def _dlq_status(self, group: str) -> dict[str, Any] | None:
        try:
            return await self.acall("TopicStatus", topic=DLQ_PREFIX + group)
        except AdminError as exc:
            if exc.code == "NOT_FOUND":
                return None
            raise

    async def dead_letters(self, group: str) -> list[dict[str, Any]]:
        """The group's ``%DLQ%`` messages, newest last (at most MAX_LISTED, the newest)."""
        status = await self._dlq_status(group)
        spans = [(q["queue_id"], max(q["min_offset"], q["max_offset"] - MAX_LISTED),
                  q["max_offset"]) for q in (status or {}).get("queues", [])
                 if q["max_offset"] > q["min_offset"]]
        if not spans:
            return []
        rows = await run_in_threadpool(self._scan_spans, DLQ_PREFIX + group, spans)
        return rows[-MAX_LISTED:]

    def _scan_spans(self, topic: str, spans: list[tuple[int, int, int]]
                    ) -> list[dict[str, Any]]:
        return [m for queue_id, begin, end in spans
                for m in self.scan(topic, queue_id, begin, end)]

    def resend_dead_letter(self, group: str, queue_id: int, offset: int) -> dict[str, Any]:
        """The dead letter at ``offset`` sent again to the topic it died on, keys, tag and
        properties kept (the DLQ copy stays: nothing is lost if the resend fails)."""
        m = self.get(DLQ_PREFIX + group, queue_id, offset)
        if m is None:
            raise AdminError("NOT_FOUND", f"no dead letter of {group!r} at {queue_id}:{offset}")
        origin = m["dlq_origin_topic"]
        if not origin:
            raise AdminError("FAILED_PRECONDITION",
                             f"dead letter {queue_id}:{offset} does not name its topic")
        return self.send(origin, m["body"], tag=m["tag"], keys=m["keys"],
                         properties=m["properties"])

    async def reset(self, group: str, topic: str, to: str, timestamp: int | None
                    ) -> dict[str, Any]:
        """ResetOffset to ``earliest``, ``latest`` or ``time`` (``timestamp`` ms)."""
        when = {"earliest": 0, "latest": FAR_FUTURE_MS}.get(to, timestamp)
        if when is None:
            raise AdminError("INVALID_ARGUMENT", "a reset to a time needs the time")
        return await self.acall("ResetOffset", group=group, topic=topic, timestamp=when)


def now_ms() -> int:
    return int(time.time() * 1000)
