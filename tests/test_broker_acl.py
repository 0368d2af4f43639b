"""ACL: signatures checked, stale stamps refused, topic/group permissions enforced.

The checker's logic is driven directly; the end-to-end tests run a broker subprocess with
``aclEnable=true`` and the official client configured with credentials.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime

import grpc
import pytest
from broker_proc import start_broker
from rocketmq import (
    ClientConfiguration,
    Credentials,
    FilterExpression,
    Message,
    Producer,
    SimpleConsumer,
)
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc

from stratamq.broker.acl import Account, AclChecker, Perm, sign
from stratamq.broker.errors import BrokerError
from stratamq.broker.metadata import MetadataStore

Code = pb.Code


def _headers(ak: str, sk: str, when: datetime | None = None, signature: str | None = None):
    stamp = (when or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    sig = signature if signature is not None else sign(sk, stamp)
    return [("x-mq-date-time", stamp),
            ("authorization", f"MQv2-HMAC-SHA1 Credential={ak}, "
                              f"SignedHeaders=x-mq-date-time, Signature={sig}")]


@pytest.fixture
def checker() -> AclChecker:
    return AclChecker([
        Account("root", "rootsecret", admin=True),
        Account("alice", "alicesecret", topic_perms={"Orders": Perm.PUB, "Audit": Perm.SUB},
                group_perms={"Readers": Perm.SUB}),
    ], window_sec=900)


def test_signature_matches_what_the_official_client_sends(checker):
    from rocketmq.v5.util.signature import Signature

    # The client's own signing code, byte for byte (it signs local time labelled Z).
    stamp = datetime.now().strftime("%Y%m%dT%H%M%SZ")
    assert Signature.sign("alicesecret", stamp) == sign("alicesecret", stamp)
    assert checker.authenticate(_headers("alice", "alicesecret")).access_key == "alice"


@pytest.mark.parametrize("headers, reason", [
    ([], "no authorization header"),
    (_headers("", ""), "no access key"),
    (_headers("mallory", "x"), "do not match an account"),
    (_headers("alice", "wrong"), "do not match an account"),
    (_headers("alice", "alicesecret", signature="00" * 20), "do not match an account"),
    ([("authorization", "Basic abc")], "unsupported signature algorithm"),
    ([("authorization", "MQv2-HMAC-SHA1 garbage"), ("x-mq-date-time", "x")], "no access key"),
    ([("x-mq-date-time", "yesterday"),
      ("authorization", "MQv2-HMAC-SHA1 Credential=alice, SignedHeaders=x-mq-date-time, "
                        "Signature=ab")], "is not yyyyMMddTHHmmssZ"),
])
def test_bad_credentials_are_unauthorized(checker, headers, reason):
    with pytest.raises(BrokerError, match=reason) as err:
        checker.authenticate(headers)
    assert err.value.code == Code.UNAUTHORIZED


def test_an_unknown_key_and_a_wrong_secret_get_the_same_answer(checker):
    """Otherwise a caller could find out which access keys exist."""
    answers = []
    for ak in ("mallory", "alice"):
        with pytest.raises(BrokerError) as err:
            checker.authenticate(_headers(ak, "not-the-secret"))
        answers.append((err.value.code, err.value.message.replace(repr(ak), "<ak>")))
    assert answers[0] == answers[1]
    old = datetime.fromtimestamp(time.time() - 3 * 3600, UTC)
    stale = []
    for ak in ("mallory", "alice"):
        with pytest.raises(BrokerError) as err:
            checker.authenticate(_headers(ak, "alicesecret", when=old))
        stale.append(err.value.message)
    assert stale[0] == stale[1]  # the clock check comes before the key is looked up


def test_stale_timestamp_is_refused(checker):
    old = datetime.fromtimestamp(time.time() - 3 * 3600, UTC)
    with pytest.raises(BrokerError, match="aclSignatureWindowSec") as err:
        checker.authenticate(_headers("alice", "alicesecret", when=old))
    assert err.value.code == Code.UNAUTHORIZED


def test_permissions(checker):
    md = dict(_headers("alice", "alicesecret"))
    checker.authorize(md, "Topic:Orders", "Pub")
    checker.authorize(md, "Topic:Orders", "Get")  # route lookup: any permission on it
    checker.authorize(md, "Topic:Audit", "Sub")
    checker.authorize(md, "Group:Readers", "Sub")
    checker.authorize(md, "Cluster", "Get")  # heartbeat needs only a valid signature
    for resource, action in [("Topic:Orders", "Sub"), ("Topic:Audit", "Pub"),
                             ("Topic:Other", "Get"), ("Group:Writers", "Sub"),
                             ("Topic:Orders", "Create"), ("Cluster", "List")]:
        with pytest.raises(BrokerError) as err:
            checker.authorize(md, resource, action)
        assert err.value.code == Code.FORBIDDEN, (resource, action)
    root = dict(_headers("root", "rootsecret"))
    checker.authorize(root, "Topic:Anything", "Create")


def test_acl_file_errors_name_the_problem(tmp_path):
    path = tmp_path / "acl.json"
    for content, message in [
        ("{not json", "aclFile"),
        (json.dumps({"accounts": [{"accessKey": "a"}]}), "missing secretKey"),
        (json.dumps({"accounts": [{"accessKey": "a", "secretKey": "s",
                                   "topicPerms": ["T=WRITE"]}]}), "unknown permission"),
        (json.dumps({"accounts": [{"accessKey": "a", "secretKey": "s"}] * 2}), "twice"),
    ]:
        path.write_text(content)
        with pytest.raises(ValueError, match=message):
            AclChecker.from_config(str(path), "", "", 900)
    with pytest.raises(ValueError, match="no account"):
        AclChecker.from_config("", "", "", 900)


# -- end to end ------------------------------------------------------------------------------


@pytest.fixture
def acl_broker(tmp_path):
    acl = tmp_path / "acl.json"
    acl.write_text(json.dumps({"accounts": [
        {"accessKey": "reader", "secretKey": "readersecret", "defaultTopicPerm": "SUB",
         "defaultGroupPerm": "SUB"},
    ]}))
    (tmp_path / "store").mkdir()
    MetadataStore(tmp_path / "store").create_group("ReaderGroup")  # as an admin would
    broker = start_broker(tmp_path, {"aclEnable": "true", "aclFile": str(acl),
                                     "aclAccessKey": "root", "aclSecretKey": "rootsecret"},
                          topics=[("Secured", 2, "NORMAL")])
    yield broker
    assert broker.stop() == 0


def _producer(endpoint: str, ak: str, sk: str) -> Producer:
    return Producer(ClientConfiguration(endpoint, Credentials(ak, sk), request_timeout=3),
                    ("Secured",))


def _send(producer: Producer, body: bytes) -> str:
    m = Message()
    m.topic, m.body = "Secured", body
    return producer.send(m).message_id


def _query_route(endpoint: str, metadata) -> pb.Status:
    with grpc.insecure_channel(endpoint) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        return stub.QueryRoute(svc.QueryRouteRequest(topic=pb.Resource(name="Secured")),
                               metadata=metadata, timeout=10).status


@pytest.mark.parametrize("ak, sk", [("", ""), ("root", "not-the-secret"), ("nobody", "x")])
def test_unsigned_or_wrongly_signed_clients_are_refused(acl_broker, ak, sk):
    producer = _producer(acl_broker.endpoint, ak, sk)
    with pytest.raises(Exception):  # noqa: B017 - the client wraps the refusal its own way
        producer.startup()
        _send(producer, b"must not be stored")
    producer.shutdown()
    # The same refusal over a raw stub carries the protocol's status code.
    assert _query_route(acl_broker.endpoint, _headers(ak, sk)).code == Code.UNAUTHORIZED
    assert _query_route(acl_broker.endpoint, []).code == Code.UNAUTHORIZED


def test_signed_clients_are_served_and_permissions_enforced(acl_broker):
    root = _producer(acl_broker.endpoint, "root", "rootsecret")
    root.startup()
    sent = _send(root, b"from root")
    root.shutdown()

    # The reader may subscribe but not publish: FORBIDDEN, and nothing was stored.
    reader_producer = _producer(acl_broker.endpoint, "reader", "readersecret")
    reader_producer.startup()
    with pytest.raises(Exception, match="40300"):
        _send(reader_producer, b"from reader")
    reader_producer.shutdown()

    consumer = SimpleConsumer(
        ClientConfiguration(acl_broker.endpoint, Credentials("reader", "readersecret")),
        "ReaderGroup", {"Secured": FilterExpression("*")})
    consumer.startup()
    try:
        got = []
        deadline = time.monotonic() + 30
        while not got and time.monotonic() < deadline:
            got = consumer.receive(16, 15) or []
        assert [(m.message_id, m.body) for m in got] == [(sent, b"from root")]
        consumer.ack(got[0])
    finally:
        consumer.shutdown()
    # A stale but correctly signed header is refused, and the broker keeps serving.
    old = datetime.fromtimestamp(time.time() - 3 * 3600, UTC)
    assert _query_route(acl_broker.endpoint,
                        _headers("root", "rootsecret", when=old)).code == Code.UNAUTHORIZED
    assert _query_route(acl_broker.endpoint, _headers("root", "rootsecret")).code == Code.OK


def _admin_cli(endpoint: str, *args: str, env: dict[str, str] | None = None,
               keys: tuple[str, str] | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items()
            if k not in ("STRATAMQ_ACCESS_KEY", "STRATAMQ_SECRET_KEY")}
    cred = ["--access-key", keys[0], "--secret-key", keys[1]] if keys else []
    return subprocess.run([sys.executable, "-m", "stratamq.cli", *args, "--endpoint", endpoint,
                           *cred], capture_output=True, text=True, timeout=120,
                          env={**base, **(env or {})})


def test_admin_cli_signs_its_requests(acl_broker):
    ep = acl_broker.endpoint
    unsigned = _admin_cli(ep, "topic", "list")
    assert unsigned.returncode != 0 and "UNAUTHENTICATED" in unsigned.stderr
    wrong = _admin_cli(ep, "topic", "list", keys=("root", "not-the-secret"))
    assert wrong.returncode != 0 and "do not match an account" in wrong.stderr
    half = _admin_cli(ep, "topic", "list", env={"STRATAMQ_ACCESS_KEY": "root"})
    assert half.returncode != 0 and "together" in half.stderr

    made = _admin_cli(ep, "topic", "create", "--topic", "ByCli", "--queues", "2",
                      keys=("root", "rootsecret"))
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["topic"] == "ByCli"
    # The same credentials from the environment.
    env = {"STRATAMQ_ACCESS_KEY": "root", "STRATAMQ_SECRET_KEY": "rootsecret"}
    listed = _admin_cli(ep, "topic", "list", env=env)
    assert listed.returncode == 0, listed.stderr
    assert {json.loads(line)["topic"] for line in listed.stdout.split()} == {"ByCli", "Secured"}
    progress = _admin_cli(ep, "group", "progress", "--group", "NoSuchGroup", env=env)
    assert progress.returncode != 0 and "does not exist" in progress.stderr
    # A correctly signed account without admin rights is refused, not crashed on.
    reader = _admin_cli(ep, "topic", "delete", "--topic", "ByCli",
                        keys=("reader", "readersecret"))
    assert reader.returncode != 0 and "PERMISSION_DENIED" in reader.stderr
    assert _admin_cli(ep, "topic", "list", env=env).stdout.count("ByCli") == 1


def test_only_an_admin_may_create_groups_by_using_them(acl_broker):
    """With autoCreateSubscriptionGroup on, a consumer's heartbeat creates its group; under
    ACL only for an account that may create groups, not for any signed-in client."""
    def heartbeat(ak: str, sk: str, group: str) -> pb.Status:
        with grpc.insecure_channel(acl_broker.endpoint) as channel:
            stub = service_pb2_grpc.MessagingServiceStub(channel)
            return stub.Heartbeat(svc.HeartbeatRequest(
                group=pb.Resource(name=group), client_type=pb.SIMPLE_CONSUMER),
                metadata=_headers(ak, sk), timeout=10).status

    status = heartbeat("reader", "readersecret", "SquatterGroup")
    assert status.code == Code.FORBIDDEN and "only an admin" in status.message
    env = {"STRATAMQ_ACCESS_KEY": "root", "STRATAMQ_SECRET_KEY": "rootsecret"}
    groups = _admin_cli(acl_broker.endpoint, "group", "list", env=env)
    assert "SquatterGroup" not in groups.stdout
    assert heartbeat("reader", "readersecret", "ReaderGroup").code == Code.OK  # it exists
    assert heartbeat("root", "rootsecret", "AdminMadeGroup").code == Code.OK
    assert "AdminMadeGroup" in _admin_cli(acl_broker.endpoint, "group", "list", env=env).stdout


def test_offsets_need_the_topic_permission_too(tmp_path):
    acl = tmp_path / "acl.json"
    acl.write_text(json.dumps({"accounts": [
        {"accessKey": "mallory", "secretKey": "mallorysecret", "groupPerms": ["Mine=SUB"]},
    ]}))
    (tmp_path / "store").mkdir()
    MetadataStore(tmp_path / "store").create_group("Mine")
    broker = start_broker(tmp_path, {"aclEnable": "true", "aclFile": str(acl)},
                          topics=[("Theirs", 1, "NORMAL")])
    try:
        answers = []
        with grpc.insecure_channel(broker.endpoint) as channel:
            stub = service_pb2_grpc.MessagingServiceStub(channel)
            for topic in ("Theirs", "NoSuchTopic"):
                mq = pb.MessageQueue(topic=pb.Resource(name=topic), id=0)
                update = stub.UpdateOffset(svc.UpdateOffsetRequest(
                    group=pb.Resource(name="Mine"), message_queue=mq, offset=5),
                    metadata=_headers("mallory", "mallorysecret"), timeout=10).status
                get = stub.GetOffset(svc.GetOffsetRequest(
                    group=pb.Resource(name="Mine"), message_queue=mq),
                    metadata=_headers("mallory", "mallorysecret"), timeout=10).status
                answers.append((update.code, get.code, update.message.replace(topic, "T"),
                                get.message.replace(topic, "T")))
        assert answers[0][:2] == (Code.FORBIDDEN, Code.FORBIDDEN)
        assert answers[0] == answers[1]  # whether the topic exists does not show
    finally:
        assert broker.stop() == 0
