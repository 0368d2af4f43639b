"""The ``stratamq`` Spark source against a broker with ``tlsEnable=true`` and ``aclEnable=true``:
options ``tls`` / ``tlsCaFile`` / ``accessKey`` / ``secretKey``, and the export CLI's flags.

One broker subprocess (TLS with a self-signed certificate made by openssl, ACL with four
accounts) serves the whole module; each test uses its own topic."""

from __future__ import annotations

import json
import os
import pickle
import re
import subprocess
import sys
import time

import pytest
from broker_proc import self_signed_cert, start_broker
from conftest_spark import spark_session  # noqa: F401  (the shared `spark` fixture)

ROOT = ("root", "root-secret-1f0c")
READER = ("reader", "reader-secret-77a2")  # SUB on every topic and group, cannot list topics
WRITER = ("writer", "writer-secret-3b9e")  # PUB on Guarded only
STRANGER = ("stranger", "stranger-secret-c41d")  # no permission at all
ANALYST = ("analyst", "analyst-secret-9d03")  # SUB on Secured, as group "analytics" only
SECRETS = (ROOT[1], READER[1], WRITER[1], STRANGER[1], ANALYST[1])


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("secure-broker")
    cert, key = self_signed_cert(tmp)
    acl = tmp / "acl.json"
    acl.write_text(json.dumps({"accounts": [
        {"accessKey": READER[0], "secretKey": READER[1], "defaultTopicPerm": "SUB",
         "defaultGroupPerm": "SUB"},
        {"accessKey": WRITER[0], "secretKey": WRITER[1], "topicPerms": ["Guarded=PUB"]},
        {"accessKey": STRANGER[0], "secretKey": STRANGER[1]},
        {"accessKey": ANALYST[0], "secretKey": ANALYST[1], "topicPerms": ["Secured=SUB"],
         "groupPerms": ["analytics=SUB"]},
    ]}))
    proc = start_broker(tmp, {"aclEnable": "true", "aclFile": str(acl),
                              "aclAccessKey": ROOT[0], "aclSecretKey": ROOT[1],
                              "tlsEnable": "true", "tls.server.certPath": str(cert),
                              "tls.server.keyPath": str(key)},
                        topics=[("Secured", 2, "NORMAL"), ("Guarded", 2, "NORMAL"),
                                ("Exported", 2, "NORMAL")])
    proc.cert = cert
    yield proc
    assert proc.stop() == 0


def options(broker, keys: tuple[str, str] | None = ROOT, ca: bool = True,
            **extra: str) -> dict[str, str]:
    opts = {"endpoints": broker.endpoint, **extra}
    if ca:
        opts["tlsCaFile"] = str(broker.cert)
    if keys:
        opts["accessKey"], opts["secretKey"] = keys
    return opts


def load(spark, opts: dict[str, str]):
    reader = spark.read.format("stratamq")
    for key, value in opts.items():
        reader = reader.option(key, value)
    return reader.load()


def write(spark, opts: dict[str, str], topic: str, bodies: list[bytes]) -> None:
    frame = spark.createDataFrame([(b, f"key-{i}") for i, b in enumerate(bodies)],
                                  "body BINARY, keys STRING")
    writer = frame.write.format("stratamq").mode("append").option("topic", topic)
    for key, value in opts.items():
        writer = writer.option(key, value)
    writer.save()


def bodies_when_visible(spark, opts: dict[str, str], total: int) -> list[bytes]:
    """The bodies read once ``total`` are readable: a send is acknowledged when it is in the
    CommitLog, its ConsumeQueue unit (what QueryOffset END reports) follows a moment later."""
    deadline = time.monotonic() + 60
    while True:
        got = sorted(r.body for r in load(spark, opts).select("body").collect())
        if len(got) >= total or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


def error_text(call) -> str:
    """The text of what ``call`` raised (Spark wraps the source's error; its text is kept)."""
    with pytest.raises(Exception) as err:
        call()
    text = str(err.value)
    for secret in SECRETS:
        assert secret not in text
    return text


def test_signed_write_and_read_over_tls(spark, broker):
    bodies = [f"secured-{i}".encode() + bytes([i, 0, 255]) for i in range(40)]
    write(spark, options(broker), "Secured", bodies)
    assert bodies_when_visible(spark, options(broker, topics="Secured"), 40) == sorted(bodies)
    # An account that may read but not list topics reads the topics it names.
    as_reader = options(broker, READER, topics="Secured")
    assert sorted(r.body for r in load(spark, as_reader).collect()) == sorted(bodies)

    # Splits carry the connection to executors: pickled whole, the secret out of their repr.
    from stratamq.spark.datasource import plan_batch

    splits = plan_batch(options(broker, topics="Secured"))
    assert splits and not any(ROOT[1] in repr(s) for s in splits)
    shipped = pickle.loads(pickle.dumps(splits[0]))
    assert shipped.connection.secret_key == ROOT[1]
    assert shipped.connection.ca_pem == broker.cert.read_bytes()


@pytest.mark.parametrize(("keys", "says"), [
    (None, "requires signed requests"),
    ((ROOT[0], "not-the-root-secret"), "do not match an account"),
])
def test_unsigned_or_wrongly_signed_read_fails_at_load(spark, broker, keys, says):
    text = error_text(lambda: load(spark, options(broker, keys)))
    assert "accessKey" in text and "secretKey" in text and says in text
    assert "not-the-root-secret" not in text


def test_missing_permissions_are_reported(spark, broker):
    write(spark, options(broker), "Guarded", [b"a", b"b", b"c"])
    bodies_when_visible(spark, options(broker, topics="Guarded"), 3)
    # Listing the broker's topics needs an admin account: name them.
    text = error_text(lambda: load(spark, options(broker, READER)))
    assert "option 'topics'" in text and "ListTopics needs an admin" in text
    # No permission on the topic at all: refused while planning.
    text = error_text(lambda: load(spark, options(broker, STRANGER, topics="Guarded")))
    assert "option 'accessKey'" in text and "FORBIDDEN" in text and "'stranger'" in text
    # PUB only: planning may look the topic up, pulling it is refused (on the executors).
    text = error_text(lambda: load(spark, options(broker, WRITER, topics="Guarded")).collect())
    assert "option 'accessKey'" in text and "FORBIDDEN" in text and "needs SUB" in text
    # SUB only: sending is refused, and nothing was stored.
    text = error_text(lambda: write(spark, options(broker, READER), "Guarded", [b"no"]))
    assert "option 'accessKey'" in text and "FORBIDDEN" in text and "needs PUB" in text
    assert bodies_when_visible(spark, options(broker, topics="Guarded"), 3) == [b"a", b"b", b"c"]


def test_pulls_name_the_group_option(spark, broker):
    bodies = [f"grouped-{i}".encode() for i in range(5)]
    write(spark, options(broker), "Secured", bodies)
    bodies_when_visible(spark, options(broker, topics="Secured"), 5)
    # The account may read Secured only as group "analytics": the default group is refused...
    text = error_text(lambda: load(spark, options(broker, ANALYST, topics="Secured")).collect())
    assert "FORBIDDEN" in text and "group 'stratamq-spark'" in text
    # ...and with option group=analytics the same read is served.
    got = load(spark, options(broker, ANALYST, topics="Secured", group="analytics")).collect()
    assert set(bodies) <= {r.body for r in got}
    text = error_text(lambda: load(spark, options(broker, topics="Secured", group="no spaces")))
    assert "option 'group'" in text


def test_tls_broker_without_tls_options_names_them(spark, broker):
    plaintext = error_text(lambda: load(spark, options(broker, ca=False, topics="Secured")))
    assert "option 'tls'" in plaintext and "tlsCaFile" in plaintext
    untrusted = error_text(lambda: load(spark, options(broker, ca=False, tls="true",
                                                       topics="Secured")))
    assert "with tls=true" in untrusted and "option 'tlsCaFile'" in untrusted


@pytest.mark.parametrize(("opts", "named"), [
    ({"secretKey": "lonely-secret-value"}, "option 'accessKey': missing"),
    ({"accessKey": "root"}, "option 'secretKey': missing"),
    ({"tlsCaFile": "/no/such/ca.pem"}, "option 'tlsCaFile': cannot read"),
    ({"tlsCaFile": __file__}, "option 'tlsCaFile': .* is not a PEM"),
    ({"tls": "maybe"}, "option 'tls': 'maybe' is not true or false"),
    ({"tls": "false", "tlsCaFile": __file__}, "option 'tls': false"),
    ({"tlsCertFile": __file__}, "option 'tlsKeyFile': missing"),
    ({"tlsCertFile": __file__, "tlsKeyFile": __file__}, "option 'tlsCertFile': .* PEM"),
])
def test_bad_security_options_fail_at_load(spark, opts, named):
    # Nothing listens on port 1: these fail before any call to the broker.
    text = error_text(lambda: load(spark, {"endpoints": "127.0.0.1:1", **opts}))
    assert "lonely-secret-value" not in text
    assert re.search(named, text), text


def test_a_broker_requiring_client_certificates_is_written_and_read_presenting_one(
        spark, tmp_path):
    from certs import TestCa

    ca = TestCa(tmp_path)
    server, client = ca.issue("server"), ca.issue("spark-job")
    mtls = start_broker(tmp_path, {
        "tlsEnable": "true", "tls.server.certPath": str(server[0]),
        "tls.server.keyPath": str(server[1]), "tls.server.trustCertPath": str(ca.cert),
        "tls.server.need.client.auth": "require"}, topics=[("Identified", 2, "NORMAL")])
    try:
        opts = {"endpoints": mtls.endpoint, "tlsCaFile": str(ca.cert)}
        identified = {**opts, "tlsCertFile": str(client[0]), "tlsKeyFile": str(client[1])}
        bodies = [f"identified-{i}".encode() for i in range(10)]
        write(spark, identified, "Identified", bodies)  # executors present it too
        assert bodies_when_visible(spark, {**identified, "topics": "Identified"},
                                   10) == sorted(bodies)
        # Without the certificate the broker's handshake refuses the job.
        assert "did not answer" in error_text(
            lambda: load(spark, {**opts, "topics": "Identified"}))
        out = tmp_path / "export"
        run = subprocess.run(
            [sys.executable, "-m", "stratamq.cli", "spark", "export", "--endpoints",
             mtls.endpoint, "--topics", "Identified", "--out", str(out), "--no-progress",
             "--tls-ca-file", str(ca.cert), "--tls-cert-file", str(client[0]),
             "--tls-key-file", str(client[1]), "--master", "local[1]"],
            capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-3000:]
        assert json.loads(run.stdout.strip().splitlines()[-1])["exported"] == 10
    finally:
        assert mtls.stop() == 0


def test_export_cli_with_credentials_and_tls(spark, broker, tmp_path):
    bodies = [f"export-{i}".encode() for i in range(12)]
    write(spark, options(broker), "Exported", bodies)
    bodies_when_visible(spark, options(broker, topics="Exported"), 12)
    out = tmp_path / "export"
    env = {**os.environ, "STRATAMQ_SECRET_KEY": ROOT[1]}  # the key by flag, the secret by env
    env.pop("STRATAMQ_ACCESS_KEY", None)
    run = subprocess.run(
        [sys.executable, "-m", "stratamq.cli", "spark", "export", "--endpoints", broker.endpoint,
         "--topics", "Exported", "--out", str(out), "--no-progress", "--access-key", ROOT[0],
         "--tls-ca-file", str(broker.cert), "--master", "local[1]"],
        capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout.strip().splitlines()[-1])["exported"] == 12
    assert sorted(r.body for r in spark.read.parquet(str(out)).collect()) == sorted(bodies)
