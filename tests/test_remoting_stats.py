"""The numbers RocketMQ Dashboard charts: ``VIEW_BROKER_STATS_DATA`` (315) after real sends and
pulls over raw frames (put and get sizes as stored, for a gRPC receive too; a deleted topic's
items gone with it), and the broker's runtime info: ``msgPutTotal*``/``msgGetTotal*``, the
store's totals and its ``putTps``/``getTransferredTps`` rates; the morning counts of
``BrokerStatsWindow`` over a driven clock."""

from __future__ import annotations

import json
import re
import time

import grpc
import pytest
from remoting_env import invoke, remoting_broker
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc
from waiting import wait_until

from stratamq.broker.metadata import MetadataStore
from stratamq.broker.stats_window import BrokerStatsWindow
from stratamq.remoting.codes import RequestCode, ResponseCode

VIEW_BROKER_STATS_DATA, DELETE_TOPIC_IN_BROKER, UPDATE_AND_CREATE_TOPIC = 315, 215, 17
DELETE_SUBSCRIPTIONGROUP = 207
BODIES = (b"one", b"second", b"the third")


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    store = tmp_path_factory.mktemp("remoting-stats") / "store"
    MetadataStore(store).create_topic("Charts", 1)
    b, address = remoting_broker(store)
    yield b, address
    b.terminate()


def _stats(address: str, name: str, key: str):
    return invoke(address, VIEW_BROKER_STATS_DATA, {"statsName": name, "statsKey": key})


def _minute_sum(address: str, name: str, key: str) -> int:
    got = _stats(address, name, key)
    return json.loads(got.body)["statsMinute"]["sum"] if got.code == ResponseCode.SUCCESS else -1


def test_dashboard_stats_after_sends_and_pulls(broker):
    _, address = broker
    for body in BODIES:
        sent = invoke(address, RequestCode.SEND_MESSAGE_V2,
                      {"a": "ChartsP", "b": "Charts", "e": "0"}, body)
        assert sent.code == ResponseCode.SUCCESS, sent.remark
    pulled = invoke(address, RequestCode.PULL_MESSAGE, {
        "consumerGroup": "ChartsC", "topic": "Charts", "queueId": "0", "queueOffset": "0",
        "maxMsgNums": "32", "sysFlag": "4", "commitOffset": "-1",
        "suspendTimeoutMillis": "0", "subscription": "*", "subVersion": "0"})
    assert pulled.code == ResponseCode.SUCCESS, pulled.remark

    # The runtime info counts at once; the windows at their next 10 s sample.
    runtime = json.loads(invoke(address, RequestCode.GET_BROKER_RUNTIME_INFO).body)["table"]
    assert (runtime["msgPutTotalTodayNow"], runtime["msgGetTotalTodayNow"]) == ("3", "3")
    assert (runtime["msgPutTotalTodayMorning"], runtime["msgPutTotalYesterdayMorning"]) \
        == ("0", "0")
    wait_until(lambda: _minute_sum(address, "GROUP_GET_NUMS", "Charts@ChartsC") == 3,
               30, "the minute sample of the pull")

    puts = json.loads(_stats(address, "TOPIC_PUT_NUMS", "Charts").body)
    assert set(puts) == {"statsMinute", "statsHour", "statsDay"}
    assert set(puts["statsMinute"]) == {"sum", "tps", "avgpt"}
    assert puts["statsMinute"]["sum"] == 3
    assert puts["statsMinute"]["avgpt"] == 1.0  # three sends of one message
    assert puts["statsMinute"]["tps"] > 0
    # The stored size of the messages (RocketMQ's wroteBytes), not their bodies': the pull
    # hands back the three records as stored.
    assert len(pulled.body) > sum(map(len, BODIES))
    assert _minute_sum(address, "TOPIC_PUT_SIZE", "Charts") == len(pulled.body)
    assert _minute_sum(address, "BROKER_PUT_NUMS", "DefaultCluster") == 3
    assert _minute_sum(address, "BROKER_GET_NUMS", "DefaultCluster") == 3
    assert _minute_sum(address, "GROUP_GET_SIZE", "Charts@ChartsC") == len(pulled.body)

    for name, key in (("TOPIC_PUT_NUMS", "Nowhere"), ("GROUP_GET_NUMS", "ChartsC@Charts"),
                      ("NO_SUCH_STAT", "Charts")):
        missing = _stats(address, name, key)
        assert (missing.code, missing.remark) == (ResponseCode.SYSTEM_ERROR,
                                                  f"The stats <{name}> <{key}> not exist")


def _send(address: str, topic: str, body: bytes) -> None:
    sent = invoke(address, RequestCode.SEND_MESSAGE_V2, {"a": "StatsP", "b": topic, "e": "0"},
                  body)
    assert sent.code == ResponseCode.SUCCESS, sent.remark


def _pull(address: str, group: str, topic: str) -> bytes:
    pulled = invoke(address, RequestCode.PULL_MESSAGE, {
        "consumerGroup": group, "topic": topic, "queueId": "0", "queueOffset": "0",
        "maxMsgNums": "32", "sysFlag": "4", "commitOffset": "-1",
        "suspendTimeoutMillis": "0", "subscription": "*", "subVersion": "0"})
    assert pulled.code == ResponseCode.SUCCESS, pulled.remark
    return pulled.body


def _create(address: str, topic: str) -> None:
    made = invoke(address, UPDATE_AND_CREATE_TOPIC, {
        "topic": topic, "readQueueNums": "1", "writeQueueNums": "1", "perm": "6"})
    assert made.code == ResponseCode.SUCCESS, made.remark


def test_a_deleted_topic_takes_its_stats_and_a_new_one_starts_from_zero(broker):
    _, address = broker
    _create(address, "Fleeting")
    for body in BODIES:
        _send(address, "Fleeting", body)
    _pull(address, "FleetingC", "Fleeting")
    items = (("TOPIC_PUT_NUMS", "Fleeting"), ("TOPIC_PUT_SIZE", "Fleeting"),
             ("GROUP_GET_NUMS", "Fleeting@FleetingC"), ("GROUP_GET_SIZE", "Fleeting@FleetingC"))
    for name, key in items:  # counted at once (their windows show it at the next sample)
        assert _stats(address, name, key).code == ResponseCode.SUCCESS, (name, key)

    gone = invoke(address, DELETE_TOPIC_IN_BROKER, {"topic": "Fleeting"})
    assert gone.code == ResponseCode.SUCCESS, gone.remark
    # RocketMQ's onTopicDeleted: the topic's put items and its groups' get items go at once.
    for name, key in items:
        missing = _stats(address, name, key)
        assert (missing.code, missing.remark) == (ResponseCode.SYSTEM_ERROR,
                                                  f"The stats <{name}> <{key}> not exist")

    # Created again under the name: its charts count only what came after.
    _create(address, "Fleeting")
    _send(address, "Fleeting", b"anew")
    stored = _pull(address, "FleetingC", "Fleeting")
    wait_until(lambda: _minute_sum(address, "GROUP_GET_NUMS", "Fleeting@FleetingC") == 1,
               30, "the minute sample of the new topic's pull")
    assert _minute_sum(address, "TOPIC_PUT_NUMS", "Fleeting") == 1
    assert _minute_sum(address, "TOPIC_PUT_SIZE", "Fleeting") == len(stored)
    assert _minute_sum(address, "GROUP_GET_SIZE", "Fleeting@FleetingC") == len(stored)

    # mqadmin deleteSubGroup: the group's get items go too (RocketMQ's onGroupDeleted).
    assert invoke(address, DELETE_SUBSCRIPTIONGROUP, {"groupName": "FleetingC"}).code \
        == ResponseCode.SUCCESS
    assert _stats(address, "GROUP_GET_NUMS", "Fleeting@FleetingC").code \
        == ResponseCode.SYSTEM_ERROR
    assert _minute_sum(address, "TOPIC_PUT_NUMS", "Fleeting") == 1


def _grpc_receive(endpoint: str, group: str, topic: str, count: int) -> list[bytes]:
    """Bodies of ``count`` messages received over gRPC (ReceiveMessage, as the official
    SimpleConsumer receives)."""
    got: list[bytes] = []
    req = svc.ReceiveMessageRequest(
        group=pb.Resource(name=group), message_queue=pb.MessageQueue(
            topic=pb.Resource(name=topic), id=-1), batch_size=32,
        filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"))
    req.invisible_duration.FromSeconds(60)
    req.long_polling_timeout.FromMilliseconds(1000)

    def enough() -> bool:
        with grpc.insecure_channel(endpoint) as channel:
            replies = list(service_pb2_grpc.MessagingServiceStub(channel).ReceiveMessage(
                req, timeout=30))
        got.extend(r.message.body for r in replies if r.HasField("message"))
        return len(got) >= count

    wait_until(enough, 30, f"{count} messages received over gRPC")
    return got


def test_group_get_size_of_a_grpc_receive_counts_the_stored_records(broker):
    b, address = broker
    _create(address, "Popped")
    for body in BODIES:
        _send(address, "Popped", body)
    assert sorted(_grpc_receive(b.endpoint, "PoppedC", "Popped", 3)) == sorted(BODIES)
    # As a remoting pull does (RocketMQ's PopMessageProcessor counts getBufferTotalSize, as
    # its pulls do): the records as stored, which a pull hands back, not their bodies.
    stored = _pull(address, "PoppedPullC", "Popped")
    assert len(stored) > sum(map(len, BODIES))
    wait_until(lambda: _minute_sum(address, "GROUP_GET_NUMS", "Popped@PoppedC") == 3,
               30, "the minute sample of the gRPC receive")
    assert _minute_sum(address, "GROUP_GET_SIZE", "Popped@PoppedC") == len(stored)


def _runtime(address: str) -> dict[str, str]:
    got = invoke(address, RequestCode.GET_BROKER_RUNTIME_INFO)
    assert got.code == ResponseCode.SUCCESS, got.remark
    return json.loads(got.body)["table"]


def _first_rate(rates: str) -> float:
    first = rates.split(" ")[0]
    return float(first) if first else 0.0


def test_runtime_info_rates_and_totals_after_sends_and_pulls(broker):
    _, address = broker
    _create(address, "Rates")
    _send(address, "Rates", b"warm-up")  # (an idle store reports one put, as RocketMQ's)
    before = _runtime(address)
    for body in BODIES:
        _send(address, "Rates", body)
    stored = _pull(address, "RatesC", "Rates")  # the warm-up and the three
    after = _runtime(address)
    # The store's totals: messages and the stored bytes of their records.
    assert int(after["putMessageTimesTotal"]) - int(before["putMessageTimesTotal"]) == 3
    warm_up = len(stored) - (int(after["putMessageSizeTotal"])
                             - int(before["putMessageSizeTotal"]))
    assert 0 < warm_up < len(stored)  # the three records are all of stored but the first
    assert after["putMessageFailedTimes"] == "0"

    # clusterList's and the Dashboard's TPS: "<10 s> <60 s> <600 s>" over the store's
    # per-second samples; the 10 s one counts the sends once the broker has been up 10 s.
    wait_until(lambda: _first_rate(_runtime(address)["putTps"]) > 0
               and _first_rate(_runtime(address)["getTransferredTps"]) > 0,
               30, "a 10 s put and transfer rate")
    table = _runtime(address)
    for key in ("putTps", "getTransferredTps", "getTransferedTps", "getFoundTps",
                "getMissTps", "getTotalTps"):
        fields = table[key].split(" ")
        assert len(fields) == 3, (key, table[key])
        assert all(f == "" or float(f) >= 0 for f in fields), (key, table[key])
    assert float(table["putTps"].split(" ")[0]) > 0
    assert table["getTransferedTps"] == table["getTransferredTps"]  # 4.x and 5.x spellings
    assert float(table["getTotalTps"].split(" ")[0]) > 0

    assert re.fullmatch(r"\[ \d+ days, \d+ hours, \d+ minutes, \d+ seconds \]",
                        table["runtime"]), table["runtime"]
    # The first record's store time: this store's first message, sent after the boot.
    assert int(table["bootTimestamp"]) <= int(table["earliestMessageTimeStamp"]) \
        <= int(time.time() * 1000)
    assert re.fullmatch(r"Total : [\d.]+ [KMGTPE]?i?B, Free : [\d.]+ [KMGTPE]?i?B\.",
                        table["commitLogDirCapacity"]), table["commitLogDirCapacity"]
    assert 0.0 <= float(table["commitLogDiskRatio"]) <= 1.0  # (-1.0: no store path)


def test_morning_counts_roll_at_each_record():
    clock = [1_000.0]
    window = BrokerStatsWindow("C", clock=lambda: clock[0])
    window.on_put("Orders", 5, 50)
    window.on_put("rmq_sys_TRACE", 7, 70)  # a system topic: not in the totals
    window.on_get("G", "Orders", 2, 20)
    window.record_morning()
    window.on_put("Orders", 4, 40)
    fields = window.runtime_fields()
    assert (fields["msgPutTotalTodayMorning"], fields["msgPutTotalTodayNow"],
            fields["msgGetTotalTodayMorning"]) == ("5", "9", "2")
    window.record_morning()
    fields = window.runtime_fields()
    assert (fields["msgPutTotalYesterdayMorning"], fields["msgPutTotalTodayMorning"]) \
        == ("5", "9")

    # The windows: a zero sample an interval before the first, then the running values.
    window.sample(0)
    clock[0] += 10
    window.on_put("Orders", 1, 10)
    window.sample(0)
    minute = window.stats_data("TOPIC_PUT_NUMS", "Orders")["statsMinute"]
    assert minute == {"sum": 10, "tps": 0.5, "avgpt": 10 / 3}
    assert window.stats_data("BROKER_PUT_NUMS", "C")["statsMinute"]["sum"] == 17
    assert window.stats_data("TOPIC_PUT_NUMS", "Elsewhere") is None
