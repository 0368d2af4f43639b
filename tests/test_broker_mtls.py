"""A broker that requires client certificates (``tls.server.need.client.auth=require``) and is
a client of brokers itself (its console; a slave's calls to its master): it presents
``tls.client.certPath`` / ``tls.client.keyPath``, and refuses to start without them, naming
the setting. Certificates are made with openssl (tests/certs.py)."""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from pathlib import Path

import grpc
import pytest
from broker_proc import free_port, start_broker
from certs import TestCa
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc

from stratamq.broker.tls import TlsConfigError, broker_credentials
from stratamq.client.admin import AdminClient, AdminError
from stratamq.client.connection import BrokerEndpoint
from stratamq.config import BrokerConfig

TOPIC = "OverMtls"


def mtls_settings(ca: TestCa, server: tuple[Path, Path], client: tuple[Path, Path] | None
                  ) -> dict[str, str]:
    """A broker serving ``server`` over TLS, requiring a certificate ``ca`` signed of every
    client, and presenting ``client`` (when given) as a client of brokers."""
    settings = {"tlsEnable": "true", "tls.server.certPath": str(server[0]),
                "tls.server.keyPath": str(server[1]),
                "tls.server.trustCertPath": str(ca.cert),
                "tls.server.need.client.auth": "require",
                "tls.client.trustCertPath": str(ca.cert)}
    if client is not None:
        settings.update({"tls.client.certPath": str(client[0]),
                         "tls.client.keyPath": str(client[1])})
    return settings


@pytest.fixture
def pki(tmp_path):
    ca = TestCa(tmp_path)
    return ca, ca.issue("server"), ca.issue("broker-client")


def _topics_page(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/topics", timeout=30) as page:
        return str(page.read().decode())


def _route(endpoint: BrokerEndpoint) -> int:
    with endpoint.channel() as channel:
        return service_pb2_grpc.MessagingServiceStub(channel).QueryRoute(
            svc.QueryRouteRequest(topic=pb.Resource(name=TOPIC)), timeout=10).status.code


def test_console_presents_the_client_certificate_a_broker_requires(tmp_path, pki):
    ca, server, client = pki
    port = free_port()
    broker = start_broker(tmp_path, {**mtls_settings(ca, server, client),
                                     "consoleListenPort": str(port)},
                          topics=[(TOPIC, 2, "NORMAL")])
    try:
        page = _topics_page(port)
        assert TOPIC in page and "no broker reachable" not in page
        # The broker does require a certificate: a client without one fails its handshake,
        # the same client presenting the broker's client certificate is served.
        bare = BrokerEndpoint(broker.endpoint, tls=True, ca_pem=ca.cert.read_bytes())
        with pytest.raises(grpc.RpcError):
            _route(bare)
        identified = BrokerEndpoint(broker.endpoint, tls=True, ca_pem=ca.cert.read_bytes(),
                                    client_cert=(client[0].read_bytes(),
                                                 client[1].read_bytes()))
        assert _route(identified) == pb.OK
        with AdminClient(identified, timeout=10) as admin:
            assert TOPIC in {t["topic"] for t in admin.call("ListTopics")["topics"]}
        with AdminClient(bare, timeout=10) as admin, pytest.raises(AdminError):
            admin.call("ListTopics")
        # The admin CLI presents one with --tls-cert-file / --tls-key-file.
        cli = [sys.executable, "-m", "stratamq.cli", "topic", "list", "--endpoint",
               broker.endpoint, "--tls-ca-file", str(ca.cert)]
        listed = subprocess.run([*cli, "--tls-cert-file", str(client[0]), "--tls-key-file",
                                 str(client[1])], capture_output=True, text=True, timeout=60)
        assert listed.returncode == 0 and TOPIC in listed.stdout, listed.stderr
        refused = subprocess.run(cli, capture_output=True, text=True, timeout=60)
        assert refused.returncode != 0 and TOPIC not in refused.stdout, refused.stdout
    finally:
        assert broker.stop() == 0


def test_tier_and_compaction_commands_reach_a_broker_that_requires_client_certificates(
        tmp_path, pki):
    ca, server, client = pki
    broker = start_broker(tmp_path, mtls_settings(ca, server, client),
                          topics=[(TOPIC, 2, "NORMAL")])
    try:
        tls = ["--endpoint", broker.endpoint, "--tls-ca-file", str(ca.cert)]
        identified = [*tls, "--tls-cert-file", str(client[0]), "--tls-key-file", str(client[1])]
        for command, answer in ((["tier", "status"], "tiered storage is off on this broker"),
                                (["compaction", "run", "--topic", TOPIC],
                                 f"topic {TOPIC!r} is not a compaction topic")):
            # The broker's own answer comes back: the call got through the handshake.
            reached = subprocess.run([sys.executable, "-m", "stratamq.cli", *command,
                                      *identified], capture_output=True, text=True, timeout=60)
            assert reached.returncode != 0 and answer in reached.stderr, reached.stderr
            bare = subprocess.run([sys.executable, "-m", "stratamq.cli", *command, *tls],
                                  capture_output=True, text=True, timeout=60)
            assert bare.returncode != 0 and answer not in bare.stderr, bare.stderr
    finally:
        assert broker.stop() == 0


@pytest.mark.parametrize("calls", ["console", "static slave"])
def test_a_broker_that_requires_client_certificates_refuses_to_start_without_its_own(
        tmp_path, pki, calls):
    ca, server, _client = pki
    settings = mtls_settings(ca, server, None)
    if calls == "console":
        settings["consoleListenPort"] = str(free_port())
        named = "consoleListenPort"
    else:  # its state is copied from its master's gRPC port, which asks for a certificate
        settings.update({"brokerRole": "SLAVE", "haMasterAddress": f"127.0.0.1:{free_port()}"})
        named = "brokerRole=SLAVE"
    try:
        broker = start_broker(tmp_path, settings)
    except RuntimeError as refused:
        said = str(refused)
    else:  # started: it would fail its calls to brokers later instead
        broker.stop()
        said = "".join(broker.output)
        pytest.fail(f"the broker started without a client certificate: {said}")
    assert "tls.client.certPath" in said and named in said, said
    assert "tls.server.need.client.auth=require" in said, said


def test_bad_client_certificate_settings_are_reported(pki, tmp_path):
    ca, server, client = pki
    (tmp_path / "other").mkdir()
    _, foreign_key = TestCa(tmp_path / "other", "other").issue("foreign")

    def config(**client_paths: str) -> BrokerConfig:
        return BrokerConfig(tls_enable=True, tls_server_cert_path=str(server[0]),
                            tls_server_key_path=str(server[1]), **client_paths)

    with pytest.raises(TlsConfigError, match="tls.client.certPath is set but "
                                             "tls.client.keyPath is not"):
        broker_credentials(config(tls_client_cert_path=str(client[0])))
    with pytest.raises(TlsConfigError, match="tls.client.keyPath .*: No such file"):
        broker_credentials(config(tls_client_cert_path=str(client[0]),
                                  tls_client_key_path=str(tmp_path / "missing.key")))
    with pytest.raises(TlsConfigError, match="do not load as a certificate and its key"):
        broker_credentials(config(tls_client_cert_path=str(client[0]),
                                  tls_client_key_path=str(foreign_key)))
    # A pair that loads is taken, and a broker that calls no broker needs none.
    assert broker_credentials(config(tls_client_cert_path=str(client[0]),
                                     tls_client_key_path=str(client[1]))) is not None
    assert broker_credentials(config(tls_server_trust_cert_path=str(ca.cert),
                                     tls_server_need_client_auth="require")) is not None
