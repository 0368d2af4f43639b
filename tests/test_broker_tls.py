"""TLS: a broker with a configured certificate and key, reached over a gRPC secure channel and
by the official client with ``tls_enable=True``. Certificates are made here with openssl."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import grpc
import pytest
from broker_proc import self_signed_cert, start_broker
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc

from stratamq.broker.tls import TlsConfigError, server_credentials


@pytest.fixture
def tls_broker(tmp_path):
    cert, key = self_signed_cert(tmp_path)
    broker = start_broker(tmp_path, {"tlsEnable": "true", "tls.server.certPath": str(cert),
                                     "tls.server.keyPath": str(key)},
                          topics=[("Tls", 1, "NORMAL")])
    broker.cert = cert
    yield broker
    assert broker.stop() == 0


def _route(channel: grpc.Channel) -> pb.Status:
    stub = service_pb2_grpc.MessagingServiceStub(channel)
    return stub.QueryRoute(svc.QueryRouteRequest(topic=pb.Resource(name="Tls")),
                           timeout=10).status


def test_secure_channel_is_served_plaintext_is_not(tls_broker):
    creds = grpc.ssl_channel_credentials(root_certificates=tls_broker.cert.read_bytes())
    with grpc.secure_channel(tls_broker.endpoint, creds) as channel:
        assert _route(channel).code == pb.Code.OK
    with grpc.insecure_channel(tls_broker.endpoint) as channel, pytest.raises(grpc.RpcError):
        _route(channel)
    # A client that does not trust the certificate fails its handshake.
    with (grpc.secure_channel(tls_broker.endpoint, grpc.ssl_channel_credentials()) as channel,
          pytest.raises(grpc.RpcError)):
        _route(channel)


_CLIENT = textwrap.dedent("""
    import sys, time
    from rocketmq import (ClientConfiguration, Credentials, FilterExpression, Message, Producer,
                          SimpleConsumer)
    endpoint = sys.argv[1]
    cfg = ClientConfiguration(endpoint, Credentials())
    producer = Producer(cfg, ("Tls",), tls_enable=True)
    producer.startup()
    m = Message()
    m.topic, m.body, m.tag = "Tls", b"over tls", "T"
    sent = producer.send(m).message_id
    producer.shutdown()
    consumer = SimpleConsumer(cfg, "TlsGroup", {"Tls": FilterExpression("*")}, tls_enable=True)
    consumer.startup()
    got = []
    deadline = time.monotonic() + 30
    while not got and time.monotonic() < deadline:
        got = consumer.receive(16, 15) or []
    consumer.ack(got[0])
    consumer.shutdown()
    print("RESULT", sent == got[0].message_id, got[0].body.decode(), flush=True)
""")


def test_official_client_with_tls_enable(tls_broker):
    # The client verifies against gRPC's default roots; point them at our CA for this process.
    env = {**os.environ, "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": str(tls_broker.cert)}
    out = subprocess.run([sys.executable, "-c", _CLIENT, tls_broker.endpoint], env=env,
                         capture_output=True, text=True, timeout=120)
    assert "RESULT True over tls" in out.stdout, out.stdout + out.stderr


def test_bad_tls_settings_are_reported(tmp_path):
    cert, key = self_signed_cert(tmp_path)
    other_cert, _ = self_signed_cert(tmp_path, "other")
    with pytest.raises(TlsConfigError, match="tls.server.keyPath"):
        server_credentials(str(cert), "")
    with pytest.raises(TlsConfigError, match="No such file"):
        server_credentials(str(cert), str(tmp_path / "missing.key"))
    with pytest.raises(TlsConfigError, match="not a PEM"):
        server_credentials(str(cert), str(cert))
    with pytest.raises(TlsConfigError, match="do not load"):
        server_credentials(str(other_cert), str(key))
    with pytest.raises(TlsConfigError, match="need.client.auth"):
        server_credentials(str(cert), str(key), need_client_auth="maybe")
    # The broker refuses to start, saying why, rather than serving plaintext.
    conf = tmp_path / "bad.conf"
    conf.write_text(f"tlsEnable=true\ntls.server.certPath={cert}\n")
    out = subprocess.run([sys.executable, "-m", "stratamq.cli", "broker", "start", "--config",
                          str(conf), "--store", str(tmp_path / "s"), "--listen", "127.0.0.1:0"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "tls.server.keyPath" in out.stderr + out.stdout
