"""The console inside a broker with ``tlsEnable=true`` (``consoleListenPort``): it reaches its
broker over TLS, verifying the broker's certificate like any client, and a broker whose
console cannot verify it refuses to start, saying why. Certificates are made with openssl."""

from __future__ import annotations

import subprocess
import urllib.request
from pathlib import Path

import pytest
from broker_proc import free_port, self_signed_cert, start_broker
from certs import TestCa


def _page(port: int, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as page:
        return str(page.read().decode())


def _console_broker(directory: Path, cert: Path, key: Path, **settings: str):
    directory.mkdir()
    port = free_port()
    broker = start_broker(directory, {"tlsEnable": "true", "tls.server.certPath": str(cert),
                                      "tls.server.keyPath": str(key),
                                      "consoleListenPort": str(port), **settings},
                          topics=[("OverTls", 2, "NORMAL")])
    broker.console_port = port
    return broker


def _ca_signed_cert(directory: Path) -> tuple[Path, Path, Path]:
    """A CA, and a certificate for 127.0.0.1 / localhost it signed."""
    ca = TestCa(directory)
    return (ca.cert, *ca.issue("leaf"))


def test_console_in_a_tls_broker_trusts_its_self_signed_certificate(tmp_path):
    cert, key = self_signed_cert(tmp_path)
    broker = _console_broker(tmp_path / "broker", cert, key)
    try:
        # The topics page lists what ListTopics answered, over the TLS channel.
        topics = _page(broker.console_port, "/topics")
        assert "OverTls" in topics
        assert "no broker reachable" not in topics
        assert "DefaultCluster" in _page(broker.console_port, "/")
    finally:
        assert broker.stop() == 0


def test_console_in_a_tls_broker_verifies_against_tls_client_trust_cert_path(tmp_path):
    ca, cert, key = _ca_signed_cert(tmp_path)
    broker = _console_broker(tmp_path / "with-ca", cert, key,
                             **{"tls.client.trustCertPath": str(ca)})
    try:
        assert "OverTls" in _page(broker.console_port, "/topics")
    finally:
        assert broker.stop() == 0
    # A CA that did not sign the broker's certificate: the broker refuses to start rather than
    # serve a console that could only show handshake errors.
    other_ca, _ = self_signed_cert(tmp_path, "other")
    with pytest.raises(RuntimeError) as refused:
        _console_broker(tmp_path / "wrong-ca", cert, key,
                        **{"tls.client.trustCertPath": str(other_ca)})
    said = str(refused.value)
    assert "consoleListenPort" in said and f"tls.client.trustCertPath {other_ca}" in said, said
    assert "CERTIFICATE_VERIFY_FAILED" in said, said


def test_console_in_a_tls_broker_refuses_a_certificate_not_for_its_address(tmp_path):
    # Issued for another name than the address the broker advertises (127.0.0.1): trusting the
    # certificate itself does not make it this broker's.
    cert, key = tmp_path / "elsewhere.crt", tmp_path / "elsewhere.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", "/CN=mq.example.com", "-addext", "subjectAltName=DNS:mq.example.com",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    with pytest.raises(RuntimeError) as refused:
        _console_broker(tmp_path / "broker", cert, key)
    said = str(refused.value)
    assert "consoleListenPort" in said and f"tls.server.certPath {cert}" in said, said
    assert "Hostname Verification" in said, said
