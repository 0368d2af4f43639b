"""RocketMQ 4.x remoting end to end with the npm package ali-ons (a pure JavaScript remoting
client, unmodified) against ``stratamq namesrv start`` and a broker: producer, push consumer
with offsets kept across a consumer restart, and interop with the official gRPC Python client
both ways (bodies, tags, keys and properties intact).

ali-ons is installed by ``make test`` (``make remoting-clients``) into tests/remoting/; the
fixture runs the same idempotent install when it is missing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from remoting_env import remoting_broker, start_namesrv
from test_broker_harness import PROJECT, config, message, receive_until
from waiting import wait_until

from stratamq.broker.metadata import MetadataStore

CLIENT_DIR = Path(__file__).resolve().parent / "remoting"
SCRIPT = CLIENT_DIR / "ali_ons_client.js"


@pytest.fixture(scope="module")
def ali_ons() -> Path:
    if not (CLIENT_DIR / "node_modules" / "ali-ons" / "package.json").is_file():
        subprocess.run(["make", "remoting-clients"], cwd=PROJECT, check=True)
    node = shutil.which("node")
    assert node, "node is needed (make remoting-clients installs it)"
    return Path(node)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    store = tmp_path_factory.mktemp("remoting") / "store"
    meta = MetadataStore(store)
    for name in ("AliT", "AliToGrpc", "GrpcToAli", "AliRetry"):
        meta.create_topic(name, 4)
    namesrv = start_namesrv()
    broker, remoting = remoting_broker(store, namesrv.address,
                                       extra="messageDelayLevel=1s 1s 1s 1s 1s\n")
    yield namesrv, broker, remoting
    broker.terminate()
    namesrv.stop()


def _node(node: Path, *args: str, timeout: float = 120) -> list[dict]:
    done = subprocess.run([str(node), str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, ALI_ONS_DIR=str(CLIENT_DIR)))
    assert done.returncode == 0, f"ali-ons {args[0]} failed:\n{done.stdout}\n{done.stderr}"
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def _produce(node: Path, namesrv: str, topic: str, count: int, tag: str,
             prefix: str, pad: int = 0) -> list[dict]:
    sent = _node(node, "produce", namesrv, topic, str(count), tag, prefix, str(pad))
    assert [s["status"] for s in sent] == ["SEND_OK"] * count
    return sent


def _consume(node: Path, namesrv: str, topic: str, group: str, expression: str,
             count: int, *retry_first: str) -> list[dict]:
    out = _node(node, "consume", namesrv, topic, group, expression, str(count), *retry_first)
    return [m for m in out if "body" in m]


def _routed(namesrv: str, topic: str) -> bool:
    from remoting_env import invoke

    from stratamq.remoting.codes import RequestCode, ResponseCode

    return invoke(namesrv, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}).code \
        == ResponseCode.SUCCESS


def _stored_compressed(remoting: str, topic: str) -> list[bool]:
    """Per stored message of ``topic``: whether its record carries the compressed flag."""
    from remoting_env import invoke

    from stratamq import record
    from stratamq.remoting.codes import RequestCode

    flags = []
    for qid in range(4):
        got = invoke(remoting, RequestCode.PULL_MESSAGE, {
            "consumerGroup": "inspect", "topic": topic, "queueId": str(qid),
            "queueOffset": "0", "maxMsgNums": "32", "sysFlag": "0", "commitOffset": "-1"})
        pos = 0
        while pos < len(got.body):
            m = record.decode(got.body, pos)
            flags.append(bool(m.sys_flag & 1))
            pos += m.total_size
    return flags


def test_producer_and_push_consumer_keep_offsets_across_a_restart(ali_ons, cluster) -> None:
    namesrv, _broker, _remoting = cluster
    wait_until(lambda: _routed(namesrv.address, "AliT"), 60, "AliT routed")
    sent = _produce(ali_ons, namesrv.address, "AliT", 6, "TagA", "first")
    _produce(ali_ons, namesrv.address, "AliT", 2, "TagB", "other")
    assert len({(s["queueId"], s["queueOffset"]) for s in sent}) == 6

    got = _consume(ali_ons, namesrv.address, "AliT", "GID_ali", "TagA", 6)
    assert {m["body"] for m in got} == {f"first-{i}" for i in range(6)}  # no TagB
    for m in got:
        i = int(m["body"].split("-")[1])
        assert (m["tags"], m["keys"], m["props"]["color"]) == (
            "TagA", f"key-{i}", "red" if i % 2 else "blue")

    # The consumer committed its offsets: a new consumer process of the group gets only
    # what was sent since.
    _produce(ali_ons, namesrv.address, "AliT", 3, "TagA", "second")
    again = _consume(ali_ons, namesrv.address, "AliT", "GID_ali", "TagA", 3)
    assert {m["body"] for m in again} == {f"second-{i}" for i in range(3)}


def test_interop_with_the_grpc_client_both_ways(ali_ons, cluster) -> None:
    from rocketmq import FilterExpression, Producer, SimpleConsumer

    namesrv, broker, remoting = cluster
    wait_until(lambda: _routed(namesrv.address, "GrpcToAli"), 60, "GrpcToAli routed")

    # ali-ons sends (bodies of 6 KB, which it compresses), a gRPC SimpleConsumer receives
    # them decompressed.
    _produce(ali_ons, namesrv.address, "AliToGrpc", 2, "TagX", "js", 6000)
    assert _stored_compressed(remoting, "AliToGrpc") == [True, True]  # as ali-ons sent them
    consumer = SimpleConsumer(config(broker.endpoint), "GID_grpc_reader",
                              {"AliToGrpc": FilterExpression("TagX")}, await_duration=2)
    consumer.startup()
    try:
        got = receive_until(consumer, 2)
    finally:
        consumer.shutdown()
    assert sorted(m.body for m in got) == [b"js-0" + b"." * 6000, b"js-1" + b"." * 6000]
    for m in got:
        i = int(m.body.decode().split("-")[1].rstrip("."))
        assert (m.tag, m.keys, m.properties.get("color")) == (
            "TagX", {f"key-{i}"}, "red" if i % 2 else "blue")

    # A gRPC Producer sends, ali-ons consumes.
    producer = Producer(config(broker.endpoint), ("GrpcToAli",))
    producer.startup()
    try:
        for i in range(2):
            producer.send(message("GrpcToAli", f"py-{i}".encode(), tag="TagY",
                                  keys=(f"pk-{i}",), props={"n": str(i)}))
    finally:
        producer.shutdown()
    received = _consume(ali_ons, namesrv.address, "GrpcToAli", "GID_js_reader", "TagY", 2)
    by_body = {m["body"]: m for m in received}
    assert set(by_body) == {"py-0", "py-1"}
    for i in range(2):
        m = by_body[f"py-{i}"]
        assert (m["tags"], m["keys"], m["props"]["n"]) == ("TagY", f"pk-{i}", str(i))


def test_a_message_the_consumer_retries_comes_back_through_the_retry_topic(ali_ons, cluster):
    namesrv, _broker, _remoting = cluster
    wait_until(lambda: _routed(namesrv.address, "AliRetry"), 60, "AliRetry routed")
    _produce(ali_ons, namesrv.address, "AliRetry", 2, "TagR", "again")
    # The consumer answers ACTION_RETRY to each first delivery: ali-ons sends it back
    # (CONSUMER_SEND_MSG_BACK), the broker stores it in %RETRY%<group> after delay level 3.
    got = _consume(ali_ons, namesrv.address, "AliRetry", "GID_retry", "TagR", 2, "retry")
    assert {m["body"] for m in got} == {"again-0", "again-1"}
    for m in got:
        assert m["reconsumeTimes"] == 1
        assert m["props"]["RETRY_TOPIC"] == "AliRetry"
        assert m["tags"] == "TagR"

