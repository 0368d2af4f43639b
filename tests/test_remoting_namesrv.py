"""The NameServer: the route table as RocketMQ's RouteInfoManager keeps it (registration,
120 s expiry, slaves, deleted topics), and ``stratamq namesrv start`` with a real broker
registering through ``namesrvAddr``: routes name the broker's remoting address, a topic the
broker creates is routed without waiting for the 30 s re-registration, and a killed broker's
routes are gone."""

from __future__ import annotations

import asyncio
import json

import pytest
from remoting_env import invoke, remoting_broker, start_namesrv
from waiting import wait_until

from stratamq.broker.metadata import MetadataStore
from stratamq.remoting.codec import RemotingCommand
from stratamq.remoting.codes import RequestCode, ResponseCode
from stratamq.remoting.routes import Registration, RouteTable
from stratamq.remoting.transport import RemotingClient

T0 = 1_000_000


def _master(topics: dict, counter: int = 1, addr: str = "10.0.0.1:10911") -> Registration:
    return Registration("DefaultCluster", addr, "broker-a", 0, "10.0.0.1:10912",
                        {t: {"topicName": t, "readQueueNums": q, "writeQueueNums": q,
                             "perm": 6} for t, q in topics.items()},
                        {"counter": counter, "timestamp": 5})


def test_routes_expire_after_120_seconds_of_silence() -> None:
    table = RouteTable()
    table.register(_master({"T": 4}), T0)
    route = table.topic_route("T")
    assert route == {
        "brokerDatas": [{"cluster": "DefaultCluster", "brokerName": "broker-a",
                         "brokerAddrs": {"0": "10.0.0.1:10911"}, "enableActingMaster": False}],
        "filterServerTable": {},
        "queueDatas": [{"brokerName": "broker-a", "readQueueNums": 4, "writeQueueNums": 4,
                        "perm": 6, "topicSysFlag": 0}]}
    assert table.expire(T0 + 120_000) == []  # RocketMQ drops it only past the timeout
    table.touch("DefaultCluster", "10.0.0.1:10911", T0 + 60_000)  # QUERY_DATA_VERSION
    assert table.expire(T0 + 170_000) == []
    assert table.expire(T0 + 180_001) == [("DefaultCluster", "10.0.0.1:10911")]
    assert table.topic_route("T") is None
    assert table.cluster_info() == {"brokerAddrTable": {}, "clusterAddrTable": {}}


def test_slave_learns_its_master_and_deleted_topics_lose_their_route() -> None:
    table = RouteTable()
    table.register(_master({"T": 4, "U": 2}), T0)
    slave = Registration("DefaultCluster", "10.0.0.2:10911", "broker-a", 1, "", {}, {})
    assert table.register(slave, T0) == {"masterAddr": "10.0.0.1:10911",
                                         "haServerAddr": "10.0.0.1:10912"}
    assert table.topic_route("T")["brokerDatas"][0]["brokerAddrs"] == {
        "0": "10.0.0.1:10911", "1": "10.0.0.2:10911"}
    # The master re-registers without U (deleted on the broker): U has no route any more.
    table.register(_master({"T": 4}, counter=2), T0 + 1)
    assert table.topic_route("U") is None and table.topic_route("T") is not None
    assert table.topic_list() == {"topicList": ["T"]}
    # Same data version: the topic table is not re-read (RocketMQ's isBrokerTopicConfigChanged).
    table.register(_master({}, counter=2), T0 + 2)
    assert table.topic_route("T") is not None
    assert table.topics_of_cluster("DefaultCluster") == {"topicList": ["T"]}
    assert table.topics_of_cluster("Other") == {"topicList": []}
    table.delete_topic("T", "Other")  # another cluster's: nothing goes
    assert table.topic_route("T") is not None
    table.delete_topic("T")  # mqadmin deleteTopic
    assert table.topic_route("T") is None


@pytest.fixture
def namesrv():
    ns = start_namesrv()
    yield ns
    ns.stop()


def _route(namesrv: str, topic: str) -> dict | None:
    got = invoke(namesrv, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
    if got.code == ResponseCode.TOPIC_NOT_EXIST:
        assert f"No topic route info in name server for the topic: {topic}" in got.remark
        return None
    assert got.code == ResponseCode.SUCCESS, got.remark
    return json.loads(got.body)


def test_broker_registers_its_remoting_address_and_new_topics(tmp_path, namesrv) -> None:
    store = tmp_path / "store"
    MetadataStore(store).create_topic("Orders", 3)
    broker, remoting = remoting_broker(store, namesrv.address)
    try:
        wait_until(lambda: _route(namesrv.address, "Orders") is not None, 60, "Orders routed")
        route = _route(namesrv.address, "Orders")
        assert route["brokerDatas"][0]["brokerAddrs"] == {"0": remoting}
        assert route["queueDatas"][0]["readQueueNums"] == 3
        info = invoke(namesrv.address, RequestCode.GET_BROKER_CLUSTER_INFO)
        assert json.loads(info.body)["clusterAddrTable"] == {"DefaultCluster": ["broker-a"]}
        # The Dashboard's system topics: cluster and broker names, with a broker's address.
        system = json.loads(invoke(namesrv.address, 304).body)
        assert system == {"topicList": ["DefaultCluster", "broker-a"], "brokerAddr": remoting}
        topics = invoke(namesrv.address, RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
        assert "Orders" in json.loads(topics.body)["topicList"]

        # A consumer's heartbeat creates its retry topic on the broker; the broker registers
        # it at once, not at its next 30 s registration.
        heartbeat = {"clientID": "c1", "producerDataSet": [], "consumerDataSet": [
            {"groupName": "G1", "consumeType": "CONSUME_PASSIVELY",
             "messageModel": "CLUSTERING", "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
             "subscriptionDataSet": [{"topic": "Orders", "subString": "*"}]}]}
        got = invoke(remoting, RequestCode.HEART_BEAT, body=json.dumps(heartbeat).encode())
        assert got.code == ResponseCode.SUCCESS, got.remark
        wait_until(lambda: _route(namesrv.address, "%RETRY%G1") is not None, 20,
                   "the retry topic routed before the periodic registration")

        # A broker killed without unregistering: its connection closes, its routes go.
        broker.kill()
        wait_until(lambda: _route(namesrv.address, "Orders") is None, 30, "routes dropped")
    finally:
        if broker.proc.poll() is None:
            broker.terminate()


def test_kv_config_and_unknown_codes(namesrv) -> None:
    got = invoke(namesrv.address, RequestCode.GET_KV_CONFIG,
                 {"namespace": "ORDER_TOPIC_CONFIG", "key": "T"})
    assert got.code == ResponseCode.QUERY_NOT_FOUND
    assert got.remark == "No config item, Namespace: ORDER_TOPIC_CONFIG Key: T"
    assert invoke(namesrv.address, 100, {"namespace": "ORDER_TOPIC_CONFIG", "key": "T",
                                         "value": "broker-a:4"}).code == ResponseCode.SUCCESS
    got = invoke(namesrv.address, RequestCode.GET_KV_CONFIG,
                 {"namespace": "ORDER_TOPIC_CONFIG", "key": "T"})
    assert (got.code, got.ext_fields["value"]) == (ResponseCode.SUCCESS, "broker-a:4")
    listed = invoke(namesrv.address, 219, {"namespace": "ORDER_TOPIC_CONFIG"})
    assert json.loads(listed.body) == {"table": {"T": "broker-a:4"}}
    got = invoke(namesrv.address, RequestCode.SEND_MESSAGE_V2)  # a broker's code
    assert got.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    bad = invoke(namesrv.address, RequestCode.REGISTER_BROKER,
                 {"clusterName": "C", "brokerAddr": "a:1", "brokerName": "b", "brokerId": "0",
                  "bodyCrc32": "12345"}, body=b"{}")
    assert (bad.code, bad.remark) == (ResponseCode.SYSTEM_ERROR, "crc32 not match")



def test_register_query_data_version_and_unregister(namesrv) -> None:
    version = {"counter": 7, "stateVersion": 0, "timestamp": 1}
    body = json.dumps({"filterServerList": [], "topicConfigSerializeWrapper": {
        "dataVersion": version, "topicConfigTable": {"T": {
            "topicName": "T", "readQueueNums": 2, "writeQueueNums": 2, "perm": 6}}}}).encode()
    header = {"clusterName": "C", "brokerAddr": "10.1.1.1:10911", "brokerName": "b1",
              "brokerId": "0", "compressed": "false"}

    async def as_a_broker() -> list[RemotingCommand]:
        # One connection, as a broker keeps: its close would drop the registration.
        client = RemotingClient(namesrv.address)
        try:
            out = [await client.invoke(RemotingCommand(
                RequestCode.REGISTER_BROKER, ext_fields=header, body=body))]
            out.append(await asyncio.to_thread(invoke, namesrv.address,
                                               RequestCode.GET_ROUTEINFO_BY_TOPIC,
                                               {"topic": "T"}))
            for v in (version, {**version, "counter": 8}):
                out.append(await client.invoke(RemotingCommand(
                    RequestCode.QUERY_DATA_VERSION, ext_fields=header,
                    body=json.dumps(v).encode())))
            out.append(await client.invoke(RemotingCommand(RequestCode.UNREGISTER_BROKER,
                                                           ext_fields=header)))
            return out
        finally:
            await client.close()

    registered, route, same, newer, unregistered = asyncio.run(as_a_broker())
    assert registered.code == ResponseCode.SUCCESS, registered.remark
    assert json.loads(route.body)["brokerDatas"][0]["brokerAddrs"] == {"0": "10.1.1.1:10911"}
    assert (same.ext_fields["changed"], newer.ext_fields["changed"]) == ("false", "true")
    assert json.loads(same.body) == version  # the NameServer's copy
    assert unregistered.code == ResponseCode.SUCCESS
    assert _route(namesrv.address, "T") is None
    compressed = invoke(namesrv.address, RequestCode.REGISTER_BROKER,
                        {**header, "compressed": "true"}, b"\x00")
    assert compressed.code == ResponseCode.SYSTEM_ERROR and "compressed" in compressed.remark


def test_auto_created_topics_through_tbw102(tmp_path, namesrv) -> None:
    # With autoCreateTopicEnable the broker registers TBW102 (perm inherit|read|write), where
    # a 4.x producer finds a route for a topic nobody created; its send creates the topic,
    # which the broker registers at once.
    broker, remoting = remoting_broker(tmp_path / "store", namesrv.address,
                                       extra="autoCreateTopicEnable=true\n")
    try:
        wait_until(lambda: _route(namesrv.address, "TBW102") is not None, 60, "TBW102")
        assert _route(namesrv.address, "TBW102")["queueDatas"][0]["perm"] == 7
        assert _route(namesrv.address, "AutoMade") is None
        sent = invoke(remoting, RequestCode.SEND_MESSAGE_V2,
                      {"a": "P", "b": "AutoMade", "c": "TBW102", "d": "4", "e": "0"}, b"x")
        assert sent.code == ResponseCode.SUCCESS, sent.remark
        wait_until(lambda: _route(namesrv.address, "AutoMade") is not None, 20,
                   "the new topic routed")
        # With the queues the producer asked for (defaultTopicQueueNums, "d"), up to the
        # broker's defaultTopicQueueNums (TBW102's), as RocketMQ's createTopicInSendMessageMethod.
        assert _route(namesrv.address, "AutoMade")["queueDatas"][0]["writeQueueNums"] == 4
        assert invoke(remoting, RequestCode.SEND_MESSAGE_V2, {
            "a": "P", "b": "AutoWide", "c": "TBW102", "d": "64", "e": "0"}, b"x").code \
            == ResponseCode.SUCCESS
        wait_until(lambda: _route(namesrv.address, "AutoWide") is not None, 20, "AutoWide")
        assert _route(namesrv.address, "AutoWide")["queueDatas"][0]["writeQueueNums"] == 8
    finally:
        broker.terminate()
