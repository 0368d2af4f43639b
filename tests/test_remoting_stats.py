"""The numbers RocketMQ Dashboard charts: ``VIEW_BROKER_STATS_DATA`` (315) after real sends and
pulls over raw frames, and the ``msgPutTotal*``/``msgGetTotal*`` fields of the broker's runtime
info; the morning counts of ``BrokerStatsWindow`` over a driven clock."""

from __future__ import annotations

import json

import pytest
from remoting_env import invoke, remoting_broker
from waiting import wait_until

from stratamq.broker.metadata import MetadataStore
from stratamq.broker.stats_window import BrokerStatsWindow
from stratamq.remoting.codes import RequestCode, ResponseCode

VIEW_BROKER_STATS_DATA = 315
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
    assert _minute_sum(address, "TOPIC_PUT_SIZE", "Charts") == sum(map(len, BODIES))
    assert _minute_sum(address, "BROKER_PUT_NUMS", "DefaultCluster") == 3
    assert _minute_sum(address, "BROKER_GET_NUMS", "DefaultCluster") == 3
    assert _minute_sum(address, "GROUP_GET_SIZE", "Charts@ChartsC") == len(pulled.body)

    for name, key in (("TOPIC_PUT_NUMS", "Nowhere"), ("GROUP_GET_NUMS", "ChartsC@Charts"),
                      ("NO_SUCH_STAT", "Charts")):
        missing = _stats(address, name, key)
        assert (missing.code, missing.remark) == (ResponseCode.SYSTEM_ERROR,
                                                  f"The stats <{name}> <{key}> not exist")


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
