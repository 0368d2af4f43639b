"""gRPC server credentials from the configured PEM certificate and key, and how the
broker's own console reaches it over TLS (``console_endpoint``).

Keys follow RocketMQ's TLS settings: ``tls.server.certPath``, ``tls.server.keyPath``,
``tls.server.trustCertPath`` and ``tls.server.need.client.auth`` (none | optional | require).
With ``tlsEnable=true`` the broker serves TLS only: a plaintext client fails its handshake.

The official Python client (``tls_enable=True`` on Producer / SimpleConsumer / PushConsumer)
verifies the server against gRPC's default roots; for a private CA point
``GRPC_DEFAULT_SSL_ROOTS_FILE_PATH`` at the CA's PEM file in the client's environment.

The broker's own client of itself (the web console on ``consoleListenPort``) verifies the
broker as any client does, against ``tls.client.trustCertPath`` (RocketMQ's key for the CA a
client trusts), else the certificate the broker serves, which pins it.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import TYPE_CHECKING

import grpc

if TYPE_CHECKING:
    from stratamq.client.connection import BrokerEndpoint
    from stratamq.config import BrokerConfig

__all__ = ["TlsConfigError", "console_endpoint", "own_trust", "server_credentials"]

_CLIENT_AUTH = ("none", "optional", "require")


class TlsConfigError(ValueError):
    """A TLS setting that cannot work (missing file, not PEM, bad mode)."""


def _read_pem(path: str, setting: str, marker: bytes) -> bytes:
    if not path:
        raise TlsConfigError(f"tlsEnable=true needs {setting}")
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise TlsConfigError(f"{setting} {path}: {exc.strerror or exc}") from None
    if b"-----BEGIN" not in data or marker not in data:
        raise TlsConfigError(f"{setting} {path}: not a PEM file with a {marker.decode()} block")
    return data


def server_credentials(cert_path: str, key_path: str, trust_cert_path: str = "",
                       need_client_auth: str = "none") -> grpc.ServerCredentials:
    """Credentials for ``server.add_secure_port``; TlsConfigError says what is wrong."""
    cert = _read_pem(cert_path, "tls.server.certPath", b"CERTIFICATE")
    key = _read_pem(key_path, "tls.server.keyPath", b"PRIVATE KEY")
    try:
        # gRPC would only find a mismatched pair at bind time, with a vague message.
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert_path, key_path)
    except ssl.SSLError as exc:
        raise TlsConfigError(
            f"tls.server.certPath {cert_path} and tls.server.keyPath {key_path} do not load "
            f"as a certificate and its key: {exc.reason or exc}"
        ) from None
    mode = need_client_auth.strip().lower()
    if mode not in _CLIENT_AUTH:
        raise TlsConfigError(
            f"tls.server.need.client.auth must be one of {'|'.join(_CLIENT_AUTH)}, not {mode!r}"
        )
    roots = None
    if mode != "none" or trust_cert_path:
        roots = _read_pem(trust_cert_path, "tls.server.trustCertPath", b"CERTIFICATE")
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=roots, require_client_auth=mode == "require"
    )


def own_trust(server_cert_path: str, client_trust_cert_path: str = "") -> tuple[bytes, str]:
    """The certificates the broker's own client verifies the broker against, and the setting
    and file they came from: ``tls.client.trustCertPath`` when set, else the broker's own
    ``tls.server.certPath`` (gRPC takes any certificate it is given as trusted, so a leaf a CA
    signed verifies against itself too; its names must still include the broker's address)."""
    if client_trust_cert_path:
        return (_read_pem(client_trust_cert_path, "tls.client.trustCertPath", b"CERTIFICATE"),
                f"tls.client.trustCertPath {client_trust_cert_path}")
    return (_read_pem(server_cert_path, "tls.server.certPath", b"CERTIFICATE"),
            f"tls.server.certPath {server_cert_path}")


def console_endpoint(address: str, cfg: BrokerConfig) -> BrokerEndpoint:
    """How the console inside the broker reaches it at ``address`` (its admin account's keys,
    TLS as ``own_trust`` says), checked with one call now: a console that cannot reach its
    broker would only show errors. TlsConfigError (ValueError without TLS) says why not."""
    from stratamq.client.connection import BrokerEndpoint
    from stratamq.console.broker_api import unreachable

    ca_pem, trusting = (own_trust(cfg.tls_server_cert_path, cfg.tls_client_trust_cert_path)
                        if cfg.tls_enable else (None, ""))
    endpoint = BrokerEndpoint(address, access_key=cfg.acl_access_key or None,
                              secret_key=cfg.acl_secret_key or None, tls=cfg.tls_enable,
                              ca_pem=ca_pem)
    why = unreachable(endpoint)
    if why is not None and cfg.tls_enable:
        raise TlsConfigError(
            f"consoleListenPort: the console cannot reach this broker at {address} over TLS "
            f"trusting {trusting}: {why} (the certificate must name that address and verify "
            "against what the console trusts, tls.client.trustCertPath when set; "
            "tls.server.need.client.auth=require leaves the console no certificate to "
            "present; consoleListenPort=0 turns the console off)")
    if why is not None:
        raise ValueError(f"consoleListenPort: the console cannot reach this broker at "
                         f"{address}: {why}")
    return endpoint
