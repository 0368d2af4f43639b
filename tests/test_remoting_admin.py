"""The admin codes RocketMQ Dashboard and ``mqadmin`` send through ``MQAdminExt`` beyond the
basic ones (test_remoting_broker.py), over raw frames, the bodies read as the Java tools read
them: field names and types of ``TopicConfig``, ``SubscriptionGroupConfig``,
``ProducerConnection``, ``GroupList``, ``TopicList`` and ``ResetOffsetBody`` (a fastjson map
keyed by ``MessageQueue`` objects), and the calls the broker passes on to a live consumer."""

from __future__ import annotations

import asyncio
import json
import re
import time

import pytest
from remoting_env import invoke, remoting_broker

from stratamq.broker.metadata import MetadataStore
from stratamq.remoting.codec import RemotingCommand
from stratamq.remoting.codes import RequestCode, ResponseCode
from stratamq.remoting.transport import Connection, RemotingClient

GET_BROKER_CONFIG, DELETE_SUBSCRIPTIONGROUP, GET_PRODUCER_CONNECTION_LIST = 26, 207, 204
RESET_CONSUMER_CLIENT_OFFSET, INVOKE_BROKER_TO_RESET_OFFSET = 220, 222
QUERY_TOPIC_CONSUME_BY_WHO, GET_CONSUMER_RUNNING_INFO, CONSUME_MESSAGE_DIRECTLY = 300, 307, 309
QUERY_TOPICS_BY_CONSUMER, GET_TOPIC_CONFIG, GET_SUBSCRIPTIONGROUP_CONFIG = 343, 351, 352


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    store = tmp_path_factory.mktemp("remoting-admin") / "store"
    MetadataStore(store).create_topic("Dash", 2)
    MetadataStore(store).create_topic("Busy", 1)
    b, address = remoting_broker(store)
    yield b, address
    b.terminate()


def _fastjson_queue_map(text: str) -> dict[tuple[str, int], object]:
    """A fastjson map keyed by MessageQueue objects, read as the Java client reads it."""
    out = {}
    for key, value in re.findall(r'(\{"brokerName":[^}]*\}):(-?\d+|\{[^}]*\})', text):
        mq = json.loads(key)
        out[(mq["topic"], mq["queueId"])] = json.loads(value)
    return out


def test_topic_group_and_broker_config(broker):
    _, address = broker
    topic = invoke(address, GET_TOPIC_CONFIG, {"topic": "Dash", "lo": "false"})
    assert topic.code == ResponseCode.SUCCESS, topic.remark
    config = json.loads(topic.body)
    assert {k: config[k] for k in ("topicName", "readQueueNums", "writeQueueNums", "perm")} \
        == {"topicName": "Dash", "readQueueNums": 2, "writeQueueNums": 2, "perm": 6}
    missing = invoke(address, GET_TOPIC_CONFIG, {"topic": "Nowhere"})
    assert (missing.code, missing.remark) == (ResponseCode.TOPIC_NOT_EXIST,
                                              "No topic in this broker. topic: Nowhere")

    assert invoke(address, 200, body=json.dumps(
        {"groupName": "DashGroup", "retryMaxTimes": 5}).encode()).code == ResponseCode.SUCCESS
    group = json.loads(invoke(address, GET_SUBSCRIPTIONGROUP_CONFIG, {"group": "DashGroup"}).body)
    assert (group["groupName"], group["retryMaxTimes"]) == ("DashGroup", 5)
    assert invoke(address, GET_SUBSCRIPTIONGROUP_CONFIG, {"group": "NoGroup"}).code \
        == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST

    # mqadmin getBrokerConfig: "key=value" lines (Properties), the data version in the header.
    got = invoke(address, GET_BROKER_CONFIG)
    lines = dict(line.split("=", 1) for line in got.body.decode().splitlines())
    assert lines["brokerName"] == "broker-a"
    assert lines["autoCreateTopicEnable"] in ("true", "false")
    assert "aclSecretKey" not in lines
    assert "counter" in json.loads(got.ext_fields["version"])
    # brokerStatus: the store's figures next to the version.
    _send(address, b"counted", "Busy")
    runtime = json.loads(invoke(address, RequestCode.GET_BROKER_RUNTIME_INFO).body)["table"]
    assert int(runtime["commitLogMaxOffset"]) > int(runtime["commitLogMinOffset"]) >= 0
    assert 0.0 <= float(runtime["commitLogDiskRatio"]) <= 1.0

    # deleteSubGroup with cleanOffset: the group and its offsets go.
    assert invoke(address, RequestCode.UPDATE_CONSUMER_OFFSET, {
        "consumerGroup": "DashGroup", "topic": "Dash", "queueId": "0",
        "commitOffset": "0"}).code == ResponseCode.SUCCESS
    gone = invoke(address, DELETE_SUBSCRIPTIONGROUP, {"groupName": "DashGroup",
                                                       "cleanOffset": "true"})
    assert gone.code == ResponseCode.SUCCESS, gone.remark
    assert "DashGroup" not in json.loads(invoke(address, 201).body)["subscriptionGroupTable"]
    assert json.loads(invoke(address, QUERY_TOPICS_BY_CONSUMER,
                             {"group": "DashGroup"}).body)["topicList"] == []


def _send(address: str, body: bytes, topic: str = "Dash") -> None:
    sent = invoke(address, RequestCode.SEND_MESSAGE_V2, {"a": "DashP", "b": topic, "e": "0"},
                  body)
    assert sent.code == ResponseCode.SUCCESS, sent.remark


def test_clients_listed_called_and_offsets_reset(broker):
    _, address = broker
    before = int(time.time() * 1000) - 1
    for body in (b"d1", b"d2", b"d3"):
        _send(address, body)
    msg_id = invoke(address, RequestCode.SEND_MESSAGE_V2, {"a": "DashP", "b": "Dash", "e": "0"},
                    b"direct").ext_fields["msgId"]
    for q in (0, 1):
        assert invoke(address, RequestCode.UPDATE_CONSUMER_OFFSET, {
            "consumerGroup": "DashC", "topic": "Dash", "queueId": str(q),
            "commitOffset": str(4 if q == 0 else 0)}).code == ResponseCode.SUCCESS
    # No consumer online: the Dashboard is told so (and then sets offsets one by one).
    offline = invoke(address, INVOKE_BROKER_TO_RESET_OFFSET, {
        "topic": "Dash", "group": "DashC", "timestamp": str(before), "isForce": "true"})
    assert offline.code == ResponseCode.CONSUMER_NOT_ONLINE

    async def scenario() -> dict:
        seen: dict[str, RemotingCommand] = {}

        async def running_info(cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
            seen["running"] = cmd
            return cmd.response(ResponseCode.SUCCESS, body=b'{"properties":{"k":"v"}}')

        async def directly(cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
            seen["direct"] = cmd
            return cmd.response(ResponseCode.SUCCESS, body=b'{"consumeResult":"CR_SUCCESS"}')

        async def reset(cmd: RemotingCommand, conn: Connection) -> None:
            seen["reset"] = cmd

        consumer = RemotingClient(address, {GET_CONSUMER_RUNNING_INFO: running_info,
                                            CONSUME_MESSAGE_DIRECTLY: directly,
                                            RESET_CONSUMER_CLIENT_OFFSET: reset})
        admin = RemotingClient(address)

        async def ask(code: int, fields: dict[str, str]) -> RemotingCommand:
            return await admin.invoke(RemotingCommand(code, ext_fields=fields), 15)

        try:
            beat = await consumer.invoke(RemotingCommand(RequestCode.HEART_BEAT, body=json.dumps({
                "clientID": "dash@1",
                "producerDataSet": [{"groupName": "DashP"}],
                "consumerDataSet": [{"groupName": "DashC", "consumeType": "CONSUME_PASSIVELY",
                                     "messageModel": "CLUSTERING",
                                     "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
                                     "subscriptionDataSet": [{"topic": "Dash",
                                                              "subString": "*"}]}]}).encode()))
            assert beat.code == ResponseCode.SUCCESS
            out = {
                "producers": await ask(GET_PRODUCER_CONNECTION_LIST, {"producerGroup": "DashP"}),
                "no_producers": await ask(GET_PRODUCER_CONNECTION_LIST,
                                          {"producerGroup": "Nobody"}),
                "by_who": await ask(QUERY_TOPIC_CONSUME_BY_WHO, {"topic": "Dash"}),
                "topics": await ask(QUERY_TOPICS_BY_CONSUMER, {"group": "DashC"}),
                "running": await ask(GET_CONSUMER_RUNNING_INFO, {
                    "consumerGroup": "DashC", "clientId": "dash@1", "jstackEnable": "false"}),
                "not_online": await ask(GET_CONSUMER_RUNNING_INFO, {
                    "consumerGroup": "DashC", "clientId": "gone@1"}),
                "direct": await ask(CONSUME_MESSAGE_DIRECTLY, {
                    "consumerGroup": "DashC", "clientId": "dash@1", "msgId": msg_id,
                    "topic": "Dash"}),
                "reset": await ask(INVOKE_BROKER_TO_RESET_OFFSET, {
                    "topic": "Dash", "group": "DashC", "timestamp": str(before),
                    "isForce": "false"}),
                "offset": await ask(RequestCode.QUERY_CONSUMER_OFFSET, {
                    "consumerGroup": "DashC", "topic": "Dash", "queueId": "0"}),
            }
            for _ in range(200):  # the reset notice is a oneway frame sent after the answer
                if "reset" in seen:
                    break
                await asyncio.sleep(0.05)
            return {**out, "seen": seen}
        finally:
            await consumer.close()
            await admin.close()

    got = asyncio.run(scenario())
    producers = json.loads(got["producers"].body)["connectionSet"]
    assert [(c["clientId"], c["language"], type(c["version"])) for c in producers] \
        == [("dash@1", "JAVA", int)]
    assert re.fullmatch(r"127\.0\.0\.1:\d+", producers[0]["clientAddr"])
    assert (got["no_producers"].code, got["no_producers"].remark) == (
        ResponseCode.SYSTEM_ERROR, "the producer group[Nobody] not exist")
    assert "DashC" in json.loads(got["by_who"].body)["groupList"]
    topics = json.loads(got["topics"].body)
    assert topics["topicList"] == ["Dash"] and topics["brokerAddr"] == address

    # Passed on to the consumer's own connection, its answer returned as it is.
    assert got["running"].code == ResponseCode.SUCCESS, got["running"].remark
    assert json.loads(got["running"].body) == {"properties": {"k": "v"}}
    assert got["seen"]["running"].ext_fields["clientId"] == "dash@1"
    assert (got["not_online"].code, got["not_online"].remark) == (
        ResponseCode.SYSTEM_ERROR, "The Consumer <DashC> <gone@1> not online")
    assert json.loads(got["direct"].body) == {"consumeResult": "CR_SUCCESS"}
    from stratamq import record
    passed = got["seen"]["direct"]
    assert record.decode(passed.body).body == b"direct"
    assert passed.ext_fields["brokerName"] == "broker-a"

    # Reset to before the first message, not forced: queue 0 goes back to 0, queue 1 (at
    # 0 already, nothing later) stays; committed here, and the consumer told the same table.
    assert got["reset"].code == ResponseCode.SUCCESS, got["reset"].remark
    table = _fastjson_queue_map(got["reset"].body.decode())
    assert table == {("Dash", 0): 0, ("Dash", 1): 0}
    assert got["offset"].ext_fields["offset"] == "0"
    notice = got["seen"]["reset"]
    assert (notice.ext_fields["group"], notice.ext_fields["topic"]) == ("DashC", "Dash")
    assert _fastjson_queue_map(notice.body.decode()) == table


def test_codes_not_served_answer_not_supported(broker):
    """Codes with nothing behind them here (e.g. ACL 2.0 users) answer as RocketMQ does."""
    _, address = broker
    for code in (3001, 45):  # CREATE_USER, GET_ALL_DELAY_OFFSET
        got = invoke(address, code)
        assert got.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
        assert got.remark == f" request type {code} not supported"


def test_consumers_expire_after_channel_expired_timeout(tmp_path):
    """A consumer whose connection stays open but sends no heartbeat is dropped after the
    broker's channelExpiredTimeout (RocketMQ's ConsumerManager), not a fixed 120 s."""
    b, address = remoting_broker(tmp_path / "store", extra="channelExpiredTimeout=1000\n")

    async def silent_consumer() -> float:
        client = RemotingClient(address)
        try:
            beat = await client.invoke(RemotingCommand(RequestCode.HEART_BEAT, body=json.dumps(
                {"clientID": "quiet@1", "consumerDataSet": [{"groupName": "Quiet",
                                                             "subscriptionDataSet": []}]}
            ).encode()))
            assert beat.code == ResponseCode.SUCCESS
            began = time.monotonic()
            # The broker scans every 10 s; a fixed 120 s expiry would still list it at 60 s.
            while time.monotonic() - began < 60:
                listed = await client.invoke(RemotingCommand(
                    RequestCode.GET_CONSUMER_LIST_BY_GROUP, ext_fields={"consumerGroup": "Quiet"}))
                if listed.code == ResponseCode.SYSTEM_ERROR:
                    return time.monotonic() - began
                await asyncio.sleep(0.2)
            raise AssertionError("the silent consumer was still listed after 60 s")
        finally:
            await client.close()

    try:
        asyncio.run(silent_consumer())
    finally:
        b.terminate()
