"""gRPC server credentials from the configured PEM certificate and key, and how the broker
reaches brokers as their client (``peer_endpoint``, ``console_endpoint``).

Keys follow RocketMQ's TLS settings: ``tls.server.certPath``, ``tls.server.keyPath``,
``tls.server.trustCertPath`` and ``tls.server.need.client.auth`` (none | optional | require).
With ``tlsEnable=true`` the broker serves TLS only: a plaintext client fails its handshake.

The official Python client (``tls_enable=True`` on Producer / SimpleConsumer / PushConsumer)
verifies the server against gRPC's default roots; for a private CA point
``GRPC_DEFAULT_SSL_ROOTS_FILE_PATH`` at the CA's PEM file in the client's environment.

A broker is a client of brokers too: its web console (``consoleListenPort``) calls itself; in
controller mode a slave forwards pop consumption to its master (``forwarding.py``), copies its
state and compaction queues (``replication.py``) and asks its group in failsafe mode
(``cluster/node.py``); a static SLAVE copies its master's state. Every such call goes as
``peer_endpoint`` says, on the assumption that the brokers of a group share their TLS
settings: over TLS when this broker serves TLS; verifying the peer against
``tls.client.trustCertPath`` (RocketMQ's key for the CA a client trusts), else the certificate
this broker serves, which pins it (the group's brokers must then serve that one certificate);
presenting ``tls.client.certPath`` / ``tls.client.keyPath``
(RocketMQ's keys for a client's certificate) when set. A broker that requires client
certificates and calls brokers without one of its own refuses to start, naming the setting
(``broker_credentials``): every such call would fail its handshake.
"""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import grpc

from stratamq.client.connection import BrokerEndpoint, read_client_cert

if TYPE_CHECKING:
    from stratamq.config import BrokerConfig

__all__ = ["TlsConfigError", "broker_credentials", "client_cert", "console_endpoint", "own_trust",
           "peer_endpoint", "server_credentials"]

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


def client_cert(cfg: BrokerConfig) -> tuple[bytes, bytes] | None:
    """The certificate chain and key this broker presents as a client of brokers
    (``tls.client.certPath`` / ``tls.client.keyPath``), None when neither is set;
    TlsConfigError when only one is, or they do not load as a certificate and its key."""
    cert_path, key_path = cfg.tls_client_cert_path, cfg.tls_client_key_path
    if not cert_path and not key_path:
        return None
    if not cert_path or not key_path:
        given, missing = (("tls.client.certPath", "tls.client.keyPath") if cert_path
                          else ("tls.client.keyPath", "tls.client.certPath"))
        raise TlsConfigError(f"{given} is set but {missing} is not: a client certificate "
                             "needs both")
    try:
        return read_client_cert(cert_path, key_path)
    except ValueError as exc:
        raise TlsConfigError(f"tls.client.certPath {cert_path} / tls.client.keyPath "
                             f"{key_path}: {exc}") from None


def _peer_calls(cfg: BrokerConfig, slave: bool) -> list[str]:
    """What makes this broker a client of brokers, in words (empty: nothing)."""
    calls = []
    if cfg.enable_controller_mode:
        calls.append("enableControllerMode (a slave forwards pop consumption to its master "
                     "and copies its state)")
    elif slave:
        calls.append("brokerRole=SLAVE (it copies its master's state)")
    if cfg.console_listen_port:
        calls.append("consoleListenPort (the console calls this broker)")
    return calls


def broker_credentials(cfg: BrokerConfig, slave: bool = False) -> grpc.ServerCredentials:
    """The server credentials of a broker with ``tlsEnable`` (``server_credentials``), once its
    client side is checked too: ``tls.client.*`` files that load, and a client certificate
    when it requires them of clients and calls brokers itself (``slave``: a static SLAVE);
    TlsConfigError says what is wrong, naming the setting."""
    credentials = server_credentials(cfg.tls_server_cert_path, cfg.tls_server_key_path,
                                     cfg.tls_server_trust_cert_path,
                                     cfg.tls_server_need_client_auth)
    own_trust(cfg.tls_server_cert_path, cfg.tls_client_trust_cert_path)
    calls = _peer_calls(cfg, slave)
    if (client_cert(cfg) is None and calls
            and cfg.tls_server_need_client_auth.strip().lower() == "require"):
        raise TlsConfigError(
            "tls.server.need.client.auth=require, and this broker calls brokers: "
            f"{'; '.join(calls)}; those of its group ask it for a certificate too: set "
            "tls.client.certPath and tls.client.keyPath (a certificate that "
            "tls.server.trustCertPath verifies)")
    return credentials


def peer_endpoint(address: str, cfg: BrokerConfig,
                  channel_options: Sequence[tuple[str, int]] = ()) -> BrokerEndpoint:
    """How this broker calls the broker at ``address`` (of its group, or itself): signed with
    its admin account's keys (``aclAccessKey``), over TLS when it serves TLS, trusting as
    ``own_trust`` says and presenting ``client_cert``. TlsConfigError as those say."""
    tls = cfg.tls_enable
    return BrokerEndpoint(
        address, access_key=cfg.acl_access_key or None, secret_key=cfg.acl_secret_key or None,
        tls=tls, channel_options=channel_options,
        ca_pem=own_trust(cfg.tls_server_cert_path, cfg.tls_client_trust_cert_path)[0]
        if tls else None,
        client_cert=client_cert(cfg) if tls else None)


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
    from stratamq.console.broker_api import unreachable

    endpoint = peer_endpoint(address, cfg)
    why = unreachable(endpoint)
    if why is not None and cfg.tls_enable:
        trusting = own_trust(cfg.tls_server_cert_path, cfg.tls_client_trust_cert_path)[1]
        presenting = (f"presenting tls.client.certPath {cfg.tls_client_cert_path}"
                      if endpoint.client_cert else "presenting no certificate")
        raise TlsConfigError(
            f"consoleListenPort: the console cannot reach this broker at {address} over TLS "
            f"trusting {trusting}, {presenting}: {why} (the certificate must name that "
            "address and verify against what the console trusts, tls.client.trustCertPath "
            "when set; with tls.server.need.client.auth, tls.client.certPath must verify "
            "against tls.server.trustCertPath; consoleListenPort=0 turns the console off)")
    if why is not None:
        raise ValueError(f"consoleListenPort: the console cannot reach this broker at "
                         f"{address}: {why}")
    return endpoint
