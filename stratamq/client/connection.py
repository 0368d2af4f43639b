"""``BrokerEndpoint``: where and how to reach a broker (address, TLS trust, ACL keys), shared by
every StrataMQ client of it: the admin CLI (``AdminClient``), the console producer/consumer
(``MessagingClient``) and the Spark source (``spark.broker_io.BrokerConnection``).

It makes channels and signs each call's metadata the way the official RocketMQ clients do
(``stratamq.signature``), freshly stamped per call (the broker refuses stale stamps). It holds
only plain values, so it pickles (Spark ships it to executors); the secret key is never in its
``repr``. Not changed after construction; any thread may use it.
"""

from __future__ import annotations

import copy
import ssl
from collections.abc import Sequence
from typing import Self

import grpc

from stratamq.signature import auth_metadata

__all__ = ["ANSWERED", "BrokerEndpoint", "broker_answered", "check_endpoint", "read_ca_pem",
           "read_client_cert"]

# Trailing metadata a StrataMQ broker puts on every error it answers with itself: a client
# tells the broker's own UNAVAILABLE (a tier or a disk it cannot reach) from gRPC's (no broker
# at the address), which carry the same status code.
ANSWERED = ("stratamq-answered", "1")


def broker_answered(exc: grpc.RpcError) -> bool:
    """Whether ``exc`` is an answer from a StrataMQ broker rather than a failure to reach
    one: only then is its text the broker's."""
    if exc.code() is not grpc.StatusCode.UNAVAILABLE:
        return True
    trailing = getattr(exc, "trailing_metadata", None)
    try:
        pairs = trailing() if callable(trailing) else None
    except Exception:  # noqa: BLE001 (a call that never reached a server has none)
        pairs = None
    return any((key, value) == ANSWERED for key, value in pairs or ())


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


def _read_pem(path: str, marker: bytes, holding: str) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    if marker not in data:
        raise ValueError(f"{path} is not a PEM file of {holding} (no {marker.decode()} block)")
    return data


def read_ca_pem(path: str) -> bytes:
    """The CA certificates in the PEM file at ``path``; ValueError says why not (gRPC itself
    would only say "handshake failed" on the first call, far from the cause)."""
    return _read_pem(path, b"-----BEGIN CERTIFICATE-----", "certificates")


def read_client_cert(cert_path: str, key_path: str) -> tuple[bytes, bytes]:
    """The certificate chain and private key (PEM) a client presents, from their files;
    ValueError says why not (a pair that does not match included)."""
    chain = read_ca_pem(cert_path)
    key = _read_pem(key_path, b"PRIVATE KEY-----", "a private key")
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(cert_path, key_path)
    except ssl.SSLError as exc:
        raise ValueError(f"{cert_path} and {key_path} do not load as a certificate and its "
                         f"key: {exc.reason or exc}") from None
    return chain, key


class BrokerEndpoint:
    def __init__(self, endpoint: str, *, access_key: str | None = None,
                 secret_key: str | None = None, tls: bool = False, ca_pem: bytes | None = None,
                 ca_file: str | None = None,
                 channel_options: Sequence[tuple[str, int]] = (),
                 client_cert: tuple[bytes, bytes] | None = None) -> None:
        if bool(access_key) != bool(secret_key):
            raise ValueError("access key and secret key must be given together")
        self.endpoint = endpoint
        self.access_key, self.secret_key = access_key or None, secret_key or None
        self.tls, self.ca_pem, self.ca_file = tls, ca_pem, ca_file
        # (certificate chain PEM, private key PEM) presented to a broker that asks for one
        # (tls.server.need.client.auth); None: none presented.
        self.client_cert = client_cert
        self.channel_options = list(channel_options)

    def __repr__(self) -> str:
        parts = [f"endpoint={self.endpoint!r}", f"tls={self.tls}"]
        if self.ca_file:
            parts.append(f"tlsCaFile={self.ca_file!r}")
        if self.client_cert:
            parts.append("clientCert=<set>")
        if self.access_key:
            parts.append(f"accessKey={self.access_key!r}, secretKey=<hidden>")
        return f"{type(self).__name__}({', '.join(parts)})"

    def at(self, endpoint: str) -> Self:
        """The same way of calling (keys, TLS, client certificate, options), to the broker at
        ``endpoint``; of the same class (a Spark ``BrokerConnection`` stays one)."""
        other = copy.copy(self)
        other.endpoint = endpoint
        return other

    def channel(self) -> grpc.Channel:
        if not self.tls:
            return grpc.insecure_channel(self.endpoint, options=self.channel_options)
        return grpc.secure_channel(self.endpoint, self._credentials(),
                                   options=self.channel_options)

    def aio_channel(self) -> grpc.aio.Channel:
        """The same channel for asyncio callers (made inside the event loop that uses it)."""
        if not self.tls:
            return grpc.aio.insecure_channel(self.endpoint, options=self.channel_options)
        return grpc.aio.secure_channel(self.endpoint, self._credentials(),
                                       options=self.channel_options)

    def _credentials(self) -> grpc.ChannelCredentials:
        # Without a CA: gRPC's default roots (GRPC_DEFAULT_SSL_ROOTS_FILE_PATH, else the bundle
        # shipped with grpcio).
        chain, key = self.client_cert or (None, None)
        return grpc.ssl_channel_credentials(root_certificates=self.ca_pem, private_key=key,
                                            certificate_chain=chain)

    def metadata(self, *extra: tuple[str, str]) -> tuple[tuple[str, str], ...]:
        """``extra`` plus, with credentials, a signature stamped now (one per call)."""
        if self.access_key and self.secret_key:
            return (*extra, *auth_metadata(self.access_key, self.secret_key))
        return tuple(extra)
