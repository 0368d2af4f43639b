"""A thin client for the broker's admin service (``stratamq.broker.admin``): JSON over gRPC.

With ``access_key``/``secret_key`` every call is signed the way the official RocketMQ clients
sign theirs (``stratamq.signature``), freshly stamped per call, so it passes a broker with
``aclEnable=true`` (admin operations need an account with ``admin``).
"""

from __future__ import annotations

import json
from typing import Any

import grpc

from stratamq.signature import auth_metadata

__all__ = ["AdminClient", "AdminError", "check_endpoint"]

SERVICE = "stratamq.admin.v1.Admin"


class AdminError(RuntimeError):
    """The broker refused an admin call (``code`` is the gRPC status code name)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


def check_endpoint(endpoint: str) -> str:
    """``endpoint`` if it is HOST:PORT with a port 1..65535 (an IPv6 host in brackets).

    Checked here because gRPC takes anything: an empty target prints C-core resolver errors,
    and a missing or out-of-range port only shows up as "no broker reachable".
    """
    host, sep, port = endpoint.rpartition(":")
    bare_ipv6 = ":" in host and not (host.startswith("[") and host.endswith("]"))
    if (not sep or host.strip("[]") == "" or bare_ipv6 or not port.isdigit()
            or not 1 <= int(port) <= 65535):
        raise ValueError(f"endpoint must be HOST:PORT with a port 1..65535, not {endpoint!r}")
    return endpoint


class AdminClient:
    """``AdminClient("127.0.0.1:10911").call("ListTopics")``; use as a context manager."""

    def __init__(self, endpoint: str, timeout: float = 10.0,
                 credentials: grpc.ChannelCredentials | None = None,
                 access_key: str | None = None, secret_key: str | None = None) -> None:
        if bool(access_key) != bool(secret_key):
            raise ValueError("access key and secret key must be given together")
        self.endpoint = check_endpoint(endpoint)
        self.timeout = timeout
        self.access_key = access_key or None
        self.secret_key = secret_key or None
        self.channel = (grpc.secure_channel(endpoint, credentials) if credentials
                        else grpc.insecure_channel(endpoint))

    def call(self, method: str, **request: Any) -> dict[str, Any]:
        return self.call_service(SERVICE, method, **request)

    def call_service(self, service: str, method: str, **request: Any) -> dict[str, Any]:
        """A method of another JSON service on the broker's port (``stratamq.admin.v1.*``)."""
        stub = self.channel.unary_unary(f"/{service}/{method}")
        body = json.dumps({k: v for k, v in request.items() if v is not None}).encode()
        try:
            # Signed per call: the broker refuses stamps older than its signature window.
            metadata = (auth_metadata(self.access_key, self.secret_key)
                        if self.access_key and self.secret_key else None)
            reply = stub(body, timeout=self.timeout, metadata=metadata)
        except grpc.RpcError as exc:
            code = exc.code()
            name = code.name if code is not None else "UNKNOWN"
            if code is grpc.StatusCode.UNAVAILABLE:
                raise AdminError(name, f"no broker reachable at {self.endpoint}") from None
            raise AdminError(name, exc.details() or "") from None
        return json.loads(reply.decode("utf-8"))

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
