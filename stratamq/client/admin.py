"""A thin client for the broker's admin service (``stratamq.broker.admin``): JSON over gRPC.

With ``access_key``/``secret_key`` every call is signed the way the official RocketMQ clients
sign theirs (``stratamq.signature``), freshly stamped per call, so it passes a broker with
``aclEnable=true`` (admin operations need an account with ``admin``).
"""

from __future__ import annotations

import json
from typing import Any

import grpc

from stratamq.client.connection import BrokerEndpoint, broker_answered, check_endpoint

__all__ = ["AdminClient", "AdminError", "check_endpoint"]

SERVICE = "stratamq.admin.v1.Admin"


class AdminError(RuntimeError):
    """The broker refused an admin call (``code`` is the gRPC status code name)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


def request_body(request: dict[str, Any]) -> bytes:
    """A JSON method's request as sent (fields set to None left out)."""
    return json.dumps({k: v for k, v in request.items() if v is not None}).encode()


def refusal(exc: grpc.RpcError, endpoint: str) -> AdminError:
    """The AdminError of a failed call: the broker's code and message, or that no broker
    answered at ``endpoint``."""
    code = exc.code()
    name = code.name if code is not None else "UNKNOWN"
    if not broker_answered(exc):
        return AdminError(name, f"no broker reachable at {endpoint}")
    return AdminError(name, exc.details() or "")


class AdminClient:
    """``AdminClient("127.0.0.1:10911").call("ListTopics")``; use as a context manager."""

    def __init__(self, endpoint: str | BrokerEndpoint, timeout: float = 10.0,
                 credentials: grpc.ChannelCredentials | None = None,
                 access_key: str | None = None, secret_key: str | None = None) -> None:
        self.broker = (endpoint if isinstance(endpoint, BrokerEndpoint) else BrokerEndpoint(
            check_endpoint(endpoint), access_key=access_key, secret_key=secret_key))
        self.endpoint = self.broker.endpoint
        self.timeout = timeout
        self.channel = (grpc.secure_channel(self.endpoint, credentials) if credentials
                        else self.broker.channel())

    def call(self, method: str, **request: Any) -> dict[str, Any]:
        return self.call_service(SERVICE, method, **request)

    def call_service(self, service: str, method: str, **request: Any) -> dict[str, Any]:
        """A method of another JSON service on the broker's port (``stratamq.admin.v1.*``)."""
        stub = self.channel.unary_unary(f"/{service}/{method}")
        try:
            # Signed per call: the broker refuses stamps older than its signature window.
            reply = stub(request_body(request), timeout=self.timeout,
                         metadata=self.broker.metadata() or None)
        except grpc.RpcError as exc:
            raise refusal(exc, self.endpoint) from None
        return json.loads(reply.decode("utf-8"))

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
