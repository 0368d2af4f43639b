"""RocketMQ 4 ACL signatures on remoting (AclClientRPCHook: sorted ext field values + body,
HmacSHA1, base64) against the broker's accounts: signed requests pass, unsigned, forged and
unpermitted ones get NO_PERMISSION."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json

import pytest
from remoting_env import invoke, remoting_broker

from stratamq.broker.metadata import MetadataStore
from stratamq.remoting.acl import signature
from stratamq.remoting.codes import RequestCode, ResponseCode


def test_signature_is_rocketmqs() -> None:
    # Values in key order (Signature left out), then the body; HmacSHA1; base64.
    fields = {"b": "2", "AccessKey": "ak", "a": "1", "Signature": "ignored"}
    expected = base64.b64encode(hmac.new(b"sk", b"ak12body", hashlib.sha1).digest()).decode()
    assert signature("sk", fields, b"body") == expected


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    root = tmp_path_factory.mktemp("remoting-acl")
    MetadataStore(root / "store").create_topic("Secured", 1)
    acl = root / "acl.json"
    acl.write_text(json.dumps({"accounts": [
        {"accessKey": "publisher", "secretKey": "pub-secret", "topicPerms": ["Secured=PUB"]}]}))
    b, address = remoting_broker(root / "store", extra=(
        f"aclEnable=true\naclFile={acl}\naclAccessKey=admin\naclSecretKey=admin-secret\n"))
    yield address
    b.terminate()


def _signed(fields: dict[str, str], body: bytes, ak: str, sk: str) -> dict[str, str]:
    fields = dict(fields, AccessKey=ak)
    fields["Signature"] = signature(sk, fields, body)
    return fields


SEND = {"a": "P", "b": "Secured", "e": "0", "i": "TAGS\x01T\x02"}
PULL = {"consumerGroup": "G", "topic": "Secured", "queueId": "0", "queueOffset": "0",
        "maxMsgNums": "8", "sysFlag": "0", "commitOffset": "-1", "suspendTimeoutMillis": "0"}


def test_signed_requests_pass_and_others_get_no_permission(broker) -> None:
    ok = invoke(broker, RequestCode.SEND_MESSAGE_V2,
                _signed(SEND, b"hello", "publisher", "pub-secret"), b"hello")
    assert ok.code == ResponseCode.SUCCESS, ok.remark

    unsigned = invoke(broker, RequestCode.SEND_MESSAGE_V2, SEND, b"hello")
    assert unsigned.code == ResponseCode.NO_PERMISSION and "not signed" in unsigned.remark
    forged = invoke(broker, RequestCode.SEND_MESSAGE_V2,
                    _signed(SEND, b"hello", "publisher", "pub-secret"), b"tampered")
    assert forged.code == ResponseCode.NO_PERMISSION
    unknown = invoke(broker, RequestCode.SEND_MESSAGE_V2,
                     _signed(SEND, b"x", "nobody", "whatever"), b"x")
    assert (unknown.code, unknown.remark.replace("nobody", "publisher")) == (
        forged.code, forged.remark)  # an unknown key reads like a wrong secret

    # The publisher may not consume; the admin account may.
    refused = invoke(broker, RequestCode.PULL_MESSAGE,
                     _signed(PULL, b"", "publisher", "pub-secret"))
    assert refused.code == ResponseCode.NO_PERMISSION
    pulled = invoke(broker, RequestCode.PULL_MESSAGE, _signed(PULL, b"", "admin", "admin-secret"))
    assert pulled.code == ResponseCode.SUCCESS, pulled.remark
