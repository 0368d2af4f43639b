"""The broker's remoting codes through a raw-frame client built from the protocol description
(the paths ali-ons does not take): the three send codes in both header encodings, compressed
bodies, tag filtering at the broker, long-polled pulls, consumer offsets shared with gRPC,
send-back to the retry topic and on to the DLQ, queue locks, heartbeats and consumer lists."""

from __future__ import annotations

import asyncio
import json
import os
import struct
import urllib.request
import zlib
from pathlib import Path

import grpc
import pytest
from broker_proc import free_port
from pulling import pull_queue
from remoting_env import invoke, remoting_broker
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc
from waiting import wait_until

from stratamq import record
from stratamq.broker.metadata import MetadataStore
from stratamq.client.admin import AdminClient
from stratamq.remoting.codec import RemotingCommand
from stratamq.remoting.codes import RequestCode, ResponseCode, SerializeType
from stratamq.remoting.locks import QueueLocks
from stratamq.remoting.transport import RemotingClient

SUBSCRIBED = 4 | 2  # PullSysFlag: subscription in the request, suspend


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    store = tmp_path_factory.mktemp("remoting-broker") / "store"
    MetadataStore(store).create_topic("Raw", 2)
    MetadataStore(store).create_topic("Poll", 1)
    MetadataStore(store).create_topic("Offsets", 2)
    MetadataStore(store).create_topic("Retried", 1)
    MetadataStore(store).create_topic("Misc", 2)
    metrics_port = free_port()
    b, address = remoting_broker(store, extra="messageDelayLevel=1s 1s 1s 1s 1s\n"
                                 f"metricsExporterType=PROM\nmetricsPromExporterPort={metrics_port}\n")
    b.metrics_port = metrics_port
    yield b, address
    b.terminate()


def _metric(b, name: str, **labels: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{b.metrics_port}/metrics", timeout=10).read()
    total = 0.0
    for line in text.decode().splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _props(**kv: str) -> str:
    return "".join(f"{k}\x01{v}\x02" for k, v in kv.items())


def _batch(*entries: tuple[bytes, dict[str, str]]) -> bytes:
    out = b""
    for body, props in entries:
        p = _props(**props).encode()
        size = 20 + len(body) + 2 + len(p)
        out += struct.pack(">iiIii", size, 0, zlib.crc32(body), 0, len(body)) + body
        out += struct.pack(">h", len(p)) + p
    return out


def _pull(address: str, topic: str, qid: int, offset: int, expression: str = "*",
          group: str = "G", suspend_ms: int = 0) -> tuple[RemotingCommand, list]:
    got = invoke(address, RequestCode.PULL_MESSAGE, {
        "consumerGroup": group, "topic": topic, "queueId": str(qid),
        "queueOffset": str(offset), "maxMsgNums": "32", "sysFlag": str(SUBSCRIBED),
        "commitOffset": "-1", "suspendTimeoutMillis": str(suspend_ms),
        "subscription": expression, "subVersion": "0"})
    records, pos = [], 0
    while pos < len(got.body):
        m = record.decode(got.body, pos)
        records.append(m)
        pos += m.total_size
    return got, records


def test_sends_in_both_encodings_compressed_bodies_and_broker_side_tag_filter(broker):
    b, address = broker
    counted = _metric(b, "rocketmq_messages_in_total", topic="Raw")
    one = invoke(address, RequestCode.SEND_MESSAGE, {
        "producerGroup": "P", "topic": "Raw", "queueId": "0", "sysFlag": "0",
        "bornTimestamp": "1700000000000", "flag": "0", "reconsumeTimes": "0",
        "properties": _props(TAGS="TagA", KEYS="k1 k2", color="red")}, b"one")
    assert one.code == ResponseCode.SUCCESS, one.remark
    assert (one.ext_fields["queueId"], one.ext_fields["queueOffset"]) == ("0", "0")
    zipped = zlib.compress(b"zipped " * 200)
    two = invoke(address, RequestCode.SEND_MESSAGE_V2, {
        "a": "P", "b": "Raw", "e": "0", "f": "1", "g": "1700000000001", "h": "0",
        "i": _props(TAGS="TagB")}, zipped, kind=SerializeType.ROCKETMQ)
    assert (two.code, two.serialize_type) == (ResponseCode.SUCCESS, SerializeType.ROCKETMQ)
    batch = invoke(address, RequestCode.SEND_BATCH_MESSAGE, {
        "a": "P", "b": "Raw", "e": "1", "f": "0", "g": "1700000000002", "h": "0", "m": "true"},
        _batch((b"b0", {"TAGS": "TagA"}), (b"b1", {"KEYS": "kb1"}), (b"b2", {"x": "y"})))
    assert batch.code == ResponseCode.SUCCESS, batch.remark
    assert len(batch.ext_fields["msgId"].split(",")) == 3

    # The broker filters by tag: a TagA pull of queue 0 skips the TagB message.
    got, records = _pull(address, "Raw", 0, 0, "TagA")
    assert got.code == ResponseCode.SUCCESS
    assert [(m.body, m.properties["TAGS"], m.properties["KEYS"]) for m in records] == [
        (b"one", "TagA", "k1 k2")]
    assert records[0].born_timestamp == 1700000000000
    _, records = _pull(address, "Raw", 0, 0, "TagB")
    assert records[0].body == zipped and records[0].sys_flag & 1  # stored as sent

    # gRPC readers see the same messages; the compressed body arrives decompressed.
    by_queue = {q: pull_queue(b.endpoint, "Raw", q) for q in (0, 1)}
    assert [m.body for m in by_queue[0]] == [b"one", b"zipped " * 200]
    assert by_queue[0][0].system_properties.tag == "TagA"
    assert set(by_queue[0][0].system_properties.keys) == {"k1", "k2"}
    assert by_queue[0][0].user_properties["color"] == "red"
    assert [m.body for m in by_queue[1]] == [b"b0", b"b1", b"b2"]
    # Counted in the broker's metrics as gRPC sends are.
    assert _metric(b, "rocketmq_messages_in_total", topic="Raw") - counted == 5

    unknown = invoke(address, RequestCode.SEND_MESSAGE_V2, {"a": "P", "b": "Nope", "e": "0"},
                     b"x")
    assert unknown.code == ResponseCode.TOPIC_NOT_EXIST
    bad_queue = invoke(address, RequestCode.SEND_MESSAGE_V2, {"a": "P", "b": "Raw", "e": "9"},
                       b"x")
    assert bad_queue.code == ResponseCode.SYSTEM_ERROR and "queueId[9]" in bad_queue.remark


def test_a_suspended_pull_answers_when_a_message_arrives(broker):
    _, address = broker

    async def scenario() -> RemotingCommand:
        puller = RemotingClient(address)
        try:
            pull = asyncio.ensure_future(puller.invoke(RemotingCommand(
                RequestCode.PULL_MESSAGE, ext_fields={
                    "consumerGroup": "G", "topic": "Poll", "queueId": "0",
                    "queueOffset": "0", "maxMsgNums": "32", "sysFlag": str(SUBSCRIBED),
                    "commitOffset": "-1", "suspendTimeoutMillis": "20000",
                    "subscription": "*"}), 30))
            await asyncio.sleep(0)  # the pull's frame is written before the send's
            sender = RemotingClient(address)
            try:
                sent = await sender.invoke(RemotingCommand(
                    RequestCode.SEND_MESSAGE_V2, ext_fields={"a": "P", "b": "Poll", "e": "0"},
                    body=b"woken"), 30)
                assert sent.code == ResponseCode.SUCCESS
            finally:
                await sender.close()
            return await pull
        finally:
            await puller.close()

    got = asyncio.run(scenario())
    assert got.code == ResponseCode.SUCCESS, got.remark
    assert record.decode(got.body).body == b"woken"
    assert got.ext_fields["nextBeginOffset"] == "1"
    # At the end of the queue without suspending: PULL_NOT_FOUND at once.
    empty, _ = _pull(address, "Poll", 0, 1)
    assert empty.code == ResponseCode.PULL_NOT_FOUND


def test_consumer_offsets_are_shared_with_grpc_and_queue_offsets(broker):
    b, address = broker
    for body in (b"o1", b"o2", b"o3"):
        assert invoke(address, RequestCode.SEND_MESSAGE_V2, {"a": "P", "b": "Offsets", "e": "1"},
                      body).code == ResponseCode.SUCCESS
    got = invoke(address, RequestCode.UPDATE_CONSUMER_OFFSET, {
        "consumerGroup": "Shared", "topic": "Offsets", "queueId": "0", "commitOffset": "1"})
    assert got.code == ResponseCode.SUCCESS
    with grpc.insecure_channel(b.endpoint) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        queue = pb.MessageQueue(topic=pb.Resource(name="Offsets"), id=0)
        reply = stub.GetOffset(svc.GetOffsetRequest(group=pb.Resource(name="Shared"),
                                                    message_queue=queue), timeout=10)
        assert (reply.status.code, reply.offset) == (pb.OK, 1)
        stub.UpdateOffset(svc.UpdateOffsetRequest(
            group=pb.Resource(name="Shared"), offset=2,
            message_queue=pb.MessageQueue(topic=pb.Resource(name="Offsets"), id=1)), timeout=10)
    got = invoke(address, RequestCode.QUERY_CONSUMER_OFFSET,
                 {"consumerGroup": "Shared", "topic": "Offsets", "queueId": "1"})
    assert (got.code, got.ext_fields["offset"]) == (ResponseCode.SUCCESS, "2")

    def offset(code: int, **extra: str) -> int:
        reply = invoke(address, code, {"topic": "Offsets", "queueId": "1", **extra})
        assert reply.code == ResponseCode.SUCCESS, reply.remark
        return int(reply.ext_fields["offset"])

    assert offset(RequestCode.GET_MIN_OFFSET) == 0
    assert offset(RequestCode.GET_MAX_OFFSET) == 3
    assert offset(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, timestamp="0") == 0
    earliest = invoke(address, RequestCode.GET_EARLIEST_MSG_STORETIME,
                      {"topic": "Offsets", "queueId": "1"})
    first = pull_queue(b.endpoint, "Offsets", 1)[0]
    stored = first.system_properties.store_timestamp.ToMilliseconds()
    assert int(earliest.ext_fields["timestamp"]) == stored


def test_send_back_goes_to_the_retry_topic_then_the_dlq(broker):
    _, address = broker
    assert invoke(address, RequestCode.HEART_BEAT, body=json.dumps({
        "clientID": "c-retry", "producerDataSet": [], "consumerDataSet": [{
            "groupName": "GR", "subscriptionDataSet": [{"topic": "Retried", "subString": "*"}]}]
    }).encode()).code == ResponseCode.SUCCESS
    assert invoke(address, RequestCode.SEND_MESSAGE_V2, {
        "a": "P", "b": "Retried", "e": "0", "i": _props(TAGS="TagA")}, b"one"
    ).code == ResponseCode.SUCCESS
    _, records = _pull(address, "Retried", 0, 0, "TagA")
    original = records[0]
    back = invoke(address, RequestCode.CONSUMER_SEND_MSG_BACK, {
        "offset": str(original.physical_offset), "group": "GR", "delayLevel": "0",
        "originMsgId": "ORIG-1", "originTopic": "Retried", "maxReconsumeTimes": "1"})
    assert back.code == ResponseCode.SUCCESS, back.remark

    retried: list = []

    def in_retry_topic() -> bool:
        got, found = _pull(address, "%RETRY%GR", 0, 0)
        retried[:] = found
        return bool(found)

    wait_until(in_retry_topic, 30, "the message in %RETRY%GR after its delay level")
    assert _retry_and_dlq(broker[0], "GR") == (1, 0)  # what the console's group pages show
    again = retried[0]
    assert (again.body, again.reconsume_times) == (b"one", 1)
    assert again.properties["RETRY_TOPIC"] == "Retried"
    assert again.properties["ORIGIN_MESSAGE_ID"] == "ORIG-1"
    assert again.properties["TAGS"] == "TagA"

    # Its reconsume times reached the client's maxReconsumeTimes: dead letter.
    dead = invoke(address, RequestCode.CONSUMER_SEND_MSG_BACK, {
        "offset": str(again.physical_offset), "group": "GR", "delayLevel": "0",
        "originMsgId": "ORIG-1", "originTopic": "Retried", "maxReconsumeTimes": "1"})
    assert dead.code == ResponseCode.SUCCESS, dead.remark
    _, letters = _pull(address, "%DLQ%GR", 0, 0)
    assert [(m.body, m.reconsume_times, m.properties["RETRY_TOPIC"]) for m in letters] == [
        (b"one", 2, "Retried")]
    assert _metric(broker[0], "rocketmq_send_to_dlq_messages_total", consumer_group="GR") == 1
    assert _retry_and_dlq(broker[0], "GR") == (1, 1)
    missing = invoke(address, RequestCode.CONSUMER_SEND_MSG_BACK, {
        "offset": "0", "group": "NoSuchGroup", "delayLevel": "0"})
    assert missing.code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST


def _retry_and_dlq(b, group: str) -> tuple[int, int]:
    """The messages held in the group's %RETRY% and %DLQ% topics, as ListGroups and
    GroupProgress count them (they must agree)."""
    from stratamq.client.admin import AdminClient

    with AdminClient(b.endpoint) as admin:
        [listed] = [g for g in admin.call("ListGroups")["groups"] if g["group"] == group]
        progress = admin.call("GroupProgress", group=group)
    counts = (listed["retry_messages"], listed["dlq_messages"])
    assert (progress["retry_messages"], progress["dlq_messages"]) == counts
    return counts


def test_queue_locks_and_consumer_lists(broker):
    _, address = broker
    queues = [{"topic": "Raw", "brokerName": "broker-a", "queueId": q} for q in (0, 1)]

    def lock(client: str, code: int = RequestCode.LOCK_BATCH_MQ, mqs: list = queues) -> list:
        got = invoke(address, code, body=json.dumps(
            {"consumerGroup": "GL", "clientId": client, "mqSet": mqs}).encode())
        assert got.code == ResponseCode.SUCCESS, got.remark
        return sorted(q["queueId"] for q in json.loads(got.body)["lockOKMQSet"]) \
            if got.body else []

    assert lock("A") == [0, 1]
    assert lock("B") == []
    lock("A", RequestCode.UNLOCK_BATCH_MQ, queues[:1])
    assert lock("B") == [0]
    # An unrenewed lock expires after 60 s (RebalanceLockManager), here with a given clock.
    locks = QueueLocks()
    assert locks.lock("g", "A", [("T", "b", 0)], 0) == [("T", "b", 0)]
    assert locks.lock("g", "B", [("T", "b", 0)], 60_000) == []
    assert locks.lock("g", "B", [("T", "b", 0)], 60_001) == [("T", "b", 0)]

    async def two_consumers() -> tuple[list[str], list[RemotingCommand]]:
        notified: list[RemotingCommand] = []

        async def on_notify(cmd: RemotingCommand, conn: object) -> None:
            notified.append(cmd)

        first = RemotingClient(address, {RequestCode.NOTIFY_CONSUMER_IDS_CHANGED: on_notify})
        second = RemotingClient(address)
        try:
            for client, cid in ((first, "c1"), (second, "c2")):
                got = await client.invoke(RemotingCommand(RequestCode.HEART_BEAT, body=json.dumps(
                    {"clientID": cid, "consumerDataSet": [{"groupName": "GC",
                                                           "subscriptionDataSet": []}]}
                ).encode()))
                assert got.code == ResponseCode.SUCCESS
            listed = await first.invoke(RemotingCommand(RequestCode.GET_CONSUMER_LIST_BY_GROUP,
                                                        ext_fields={"consumerGroup": "GC"}))
            for _ in range(100):  # the notification is a oneway frame after the heartbeat
                if notified:
                    break
                await asyncio.sleep(0.05)
            return json.loads(listed.body)["consumerIdList"], notified
        finally:
            await first.close()
            await second.close()

    ids, notified = asyncio.run(two_consumers())
    assert ids == ["c1", "c2"]
    assert notified and notified[0].ext_fields == {"consumerGroup": "GC"}
    # Both connections closed: the group has no consumer left.
    wait_until(lambda: invoke(address, RequestCode.GET_CONSUMER_LIST_BY_GROUP,
                              {"consumerGroup": "GC"}).code == ResponseCode.SYSTEM_ERROR,
               10, "the closed connections' consumers forgotten")


def test_lookups_by_commitlog_offset_and_by_key(broker):
    _, address = broker
    sent = invoke(address, RequestCode.SEND_MESSAGE_V2, {
        "a": "P", "b": "Misc", "e": "1", "i": _props(TAGS="TagK", KEYS="order-77 cust-9")},
        b"looked up")
    assert sent.code == ResponseCode.SUCCESS
    _host, offset = record.parse_offset_msg_id(sent.ext_fields["msgId"])
    view = invoke(address, RequestCode.VIEW_MESSAGE_BY_ID, {"offset": str(offset)})
    assert view.code == ResponseCode.SUCCESS, view.remark
    found = record.decode(view.body)
    assert (found.body, found.physical_offset, found.properties["KEYS"]) == (
        b"looked up", offset, "order-77 cust-9")

    def by_key() -> RemotingCommand:
        return invoke(address, RequestCode.QUERY_MESSAGE, {
            "topic": "Misc", "key": "cust-9", "maxNum": "32", "beginTimestamp": "0",
            "endTimestamp": str(2**62)})

    wait_until(lambda: by_key().code == ResponseCode.SUCCESS, 10, "the key indexed")
    assert record.decode(by_key().body).body == b"looked up"
    missing = invoke(address, RequestCode.QUERY_MESSAGE, {
        "topic": "Misc", "key": "no-such-key", "maxNum": "32", "beginTimestamp": "0",
        "endTimestamp": str(2**62)})
    assert missing.code == ResponseCode.QUERY_NOT_FOUND
    wrong = invoke(address, RequestCode.VIEW_MESSAGE_BY_ID, {"offset": str(offset + 1)})
    assert wrong.code == ResponseCode.SYSTEM_ERROR


def test_one_port_serves_both_protocols_by_default(tmp_path):
    """No remotingListenPort: the listen port (here any free one) answers both protocols."""
    from test_broker_harness import FAST_CONF, BrokerProcess

    store = tmp_path / "store"
    MetadataStore(store).create_topic("Shared", 1)
    b = BrokerProcess(store, FAST_CONF + "haListenPort=0\n", listen="127.0.0.1:0").start()
    try:
        sent = invoke(b.endpoint, RequestCode.SEND_MESSAGE_V2,
                      {"a": "P", "b": "Shared", "e": "0", "i": _props(TAGS="One")}, b"one port")
        assert sent.code == ResponseCode.SUCCESS, sent.remark
        # The offset message id names this port, where remoting clients look the message up.
        host, offset = record.parse_offset_msg_id(sent.ext_fields["msgId"])
        assert f"{host.ip}:{host.port}" == b.endpoint
        view = invoke(b.endpoint, RequestCode.VIEW_MESSAGE_BY_ID, {"offset": str(offset)})
        assert record.decode(view.body).body == b"one port"
        # gRPC (HTTP/2) on the same port reads what remoting wrote.
        got = pull_queue(b.endpoint, "Shared", 0)
        assert [(m.body, m.system_properties.tag) for m in got] == [(b"one port", "One")]
        # A gRPC client through the shared port is listed by its own address (a socket of
        # this process connected to the listen port), not by the relay's loopback socket.
        channel = grpc.insecure_channel(b.endpoint)
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        stub.Heartbeat(svc.HeartbeatRequest(group=pb.Resource(name="SharedGroup"),
                                            client_type=pb.SIMPLE_CONSUMER),
                       metadata=[("x-mq-client-id", "shared-port-client")], timeout=10)
        with AdminClient(b.endpoint) as admin:
            clients = admin.call("GroupProgress", group="SharedGroup")["clients"]
        peer = next(c["peer"] for c in clients if c["client_id"] == "shared-port-client")
        port = int(b.endpoint.rsplit(":", 1)[1])
        assert int(peer.rsplit(":", 1)[1]) in _local_ports_connected_to(port), peer
        channel.close()
    finally:
        b.terminate()


def _local_ports_connected_to(port: int) -> set[int]:
    """Local ports of this process's TCP sockets connected to ``port`` (gRPC's are IPv6
    sockets with IPv4-mapped addresses: /proc/net/tcp6 as well as tcp)."""
    mine = {os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
            if os.path.exists(f"/proc/self/fd/{fd}")}
    found = set()
    lines = [line for table in ("tcp", "tcp6")
             for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]]
    for line in lines:
        fields = line.split()
        local, remote, inode = fields[1], fields[2], fields[9]
        if int(remote.split(":")[1], 16) == port and f"socket:[{inode}]" in mine:
            found.add(int(local.split(":")[1], 16))
    return found


def test_admin_codes_for_mqadmin(broker):
    _, address = broker
    made = invoke(address, RequestCode.UPDATE_AND_CREATE_TOPIC, {
        "topic": "AdminMade", "defaultTopic": "TBW102", "readQueueNums": "3",
        "writeQueueNums": "2", "perm": "6", "topicFilterType": "SINGLE_TAG",
        "topicSysFlag": "0", "order": "false"})
    assert made.code == ResponseCode.SUCCESS, made.remark
    table = json.loads(invoke(address, RequestCode.GET_ALL_TOPIC_CONFIG).body)
    assert {k: table["topicConfigTable"]["AdminMade"][k] for k in (
        "readQueueNums", "writeQueueNums", "perm")} == {
        "readQueueNums": 3, "writeQueueNums": 2, "perm": 6}
    group = invoke(address, 200, body=json.dumps(
        {"groupName": "AdminGroup", "retryMaxTimes": 3, "consumeEnable": True}).encode())
    assert group.code == ResponseCode.SUCCESS, group.remark
    groups = json.loads(invoke(address, 201).body)["subscriptionGroupTable"]
    assert groups["AdminGroup"]["retryMaxTimes"] == 3
    runtime = json.loads(invoke(address, RequestCode.GET_BROKER_RUNTIME_INFO).body)["table"]
    assert runtime["brokerVersionDesc"].startswith("V4_")

    # Maps keyed by a MessageQueue, written as fastjson writes them (object keys).
    assert invoke(address, RequestCode.UPDATE_CONSUMER_OFFSET, {
        "consumerGroup": "AdminGroup", "topic": "AdminMade", "queueId": "0",
        "commitOffset": "0"}).code == ResponseCode.SUCCESS
    stats = invoke(address, 202, {"topic": "AdminMade"}).body.decode()
    assert stats.startswith('{"offsetTable":{{"brokerName":"broker-a","queueId":0,'
                            '"topic":"AdminMade"}:{"lastUpdateTimestamp":0,"maxOffset":0,')
    consume = invoke(address, 208, {"consumerGroup": "AdminGroup", "topic": "AdminMade"})
    assert '"consumerOffset":0' in consume.body.decode()
    offline = invoke(address, 203, {"consumerGroup": "AdminGroup"})
    assert offline.code == ResponseCode.CONSUMER_NOT_ONLINE


def test_delete_topic_in_broker_removes_it_and_its_messages(broker):
    """mqadmin deleteTopic's DELETE_TOPIC_IN_BROKER: the gRPC admin's DeleteTopic."""
    _, address = broker
    assert invoke(address, RequestCode.UPDATE_AND_CREATE_TOPIC, {
        "topic": "Doomed", "readQueueNums": "1", "writeQueueNums": "1",
        "perm": "6"}).code == ResponseCode.SUCCESS
    sent = invoke(address, RequestCode.SEND_MESSAGE, {
        "producerGroup": "P", "topic": "Doomed", "queueId": "0", "sysFlag": "0",
        "bornTimestamp": "1700000000000", "flag": "0", "properties": ""}, b"gone")
    assert sent.code == ResponseCode.SUCCESS, sent.remark
    assert [m.body for m in _pull(address, "Doomed", 0, 0)[1]] == [b"gone"]

    blank = invoke(address, 215, {"topic": " "})
    assert (blank.code, blank.remark) == (ResponseCode.SYSTEM_ERROR,
                                          "The specified topic is blank.")
    system = invoke(address, 215, {"topic": "RMQ_SYS_TRANS_HALF_TOPIC"})
    assert system.remark == "The topic[RMQ_SYS_TRANS_HALF_TOPIC] is conflict with system topic."
    done = invoke(address, 215, {"topic": "Doomed"})
    assert done.code == ResponseCode.SUCCESS, done.remark
    table = json.loads(invoke(address, RequestCode.GET_ALL_TOPIC_CONFIG).body)
    assert "Doomed" not in table["topicConfigTable"]
    # Created again under the name, the topic starts empty.
    assert invoke(address, RequestCode.UPDATE_AND_CREATE_TOPIC, {
        "topic": "Doomed", "readQueueNums": "1", "writeQueueNums": "1",
        "perm": "6"}).code == ResponseCode.SUCCESS
    assert _pull(address, "Doomed", 0, 0)[1] == []
    assert invoke(address, 215, {"topic": "NeverWas"}).code == ResponseCode.SUCCESS


def test_bad_requests_get_rocketmq_errors_and_the_broker_serves_on(broker):
    _, address = broker
    cases = [
        (RequestCode.PULL_MESSAGE, {"consumerGroup": "G", "topic": "Misc", "queueId": "0",
                                    "queueOffset": "abc"}, b"", ResponseCode.INVALID_PARAMETER),
        (RequestCode.HEART_BEAT, {}, b"{not json", ResponseCode.SYSTEM_ERROR),
        (RequestCode.SEND_BATCH_MESSAGE, {"a": "P", "b": "Misc", "e": "0"},
         struct.pack(">iiiii", 1000, 0, 0, 0, 5) + b"short", ResponseCode.MESSAGE_ILLEGAL),
        (RequestCode.LOCK_BATCH_MQ, {}, b"[1, 2]", ResponseCode.SYSTEM_ERROR),
        (9999, {}, b"", ResponseCode.REQUEST_CODE_NOT_SUPPORTED),
        (RequestCode.SEND_MESSAGE_V2, {"a": "P", "b": "%bad topic%", "e": "0"}, b"x",
         ResponseCode.INVALID_PARAMETER),
    ]
    for code, fields, body, expected in cases:
        got = invoke(address, code, fields, body)
        assert (code, got.code) == (code, expected), got.remark
    ok = invoke(address, RequestCode.SEND_MESSAGE_V2, {"a": "P", "b": "Misc", "e": "0"}, b"fine")
    assert ok.code == ResponseCode.SUCCESS
