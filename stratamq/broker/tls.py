"""gRPC server credentials from the configured PEM certificate and key.

Keys follow RocketMQ's TLS settings: ``tls.server.certPath``, ``tls.server.keyPath``,
``tls.server.trustCertPath`` and ``tls.server.need.client.auth`` (none | optional | require).
With ``tlsEnable=true`` the broker serves TLS only: a plaintext client fails its handshake.

The official Python client (``tls_enable=True`` on Producer / SimpleConsumer / PushConsumer)
verifies the server against gRPC's default roots; for a private CA point
``GRPC_DEFAULT_SSL_ROOTS_FILE_PATH`` at the CA's PEM file in the client's environment.
"""

from __future__ import annotations

import ssl
from pathlib import Path

import grpc

__all__ = ["TlsConfigError", "server_credentials"]

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
