"""A store it wrote, it opens: names already in stored data that today's name rule refuses.

Apache RocketMQ creates ``%DLQ%<group>`` for whatever group its clients name, dots included;
``stratamq spark offload`` carries such a topic into a tier's topics.json and from there into
the broker's. The rule applies to names being created; a broker loads what its store holds
(with a WARNING) and serves it."""

from __future__ import annotations

import json
import uuid

from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from test_broker_harness import BrokerProcess, raw_stub

from stratamq.config import StoreConfig
from stratamq.message import Message, Prop
from stratamq.store.message_store import MessageStore

GROUP = "group.with.dot"
DLQ = f"%DLQ%{GROUP}"


def _rocketmq_topic(name: str, queues: int) -> dict:
    """A topics.json entry as Apache RocketMQ writes it."""
    return {"topicName": name, "readQueueNums": queues, "writeQueueNums": queues, "perm": 6,
            "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0, "order": False,
            "attributes": {}}


def _write_store(root) -> None:
    """Three messages in ``DLQ`` (appended as RocketMQ wrote them: the store's own put refuses
    the name today) and RocketMQ's config files naming the topic and the group."""
    config = StoreConfig(store_path_root_dir=str(root), mapped_file_size_commit_log=1 << 20)
    with MessageStore(config).open() as store:
        result = store.parts().commitlog.append([
            Message(DLQ, b"dead-%d" % i, 0, {Prop.UNIQ_KEY: uuid.uuid4().hex})
            for i in range(3)])
        assert result.ok, result
        store.wait_dispatched()
        store.flush()
    (root / "config").mkdir(exist_ok=True)
    (root / "config" / "topics.json").write_text(json.dumps({
        "dataVersion": {"counter": 3, "timestamp": 0},
        "topicConfigTable": {DLQ: _rocketmq_topic(DLQ, 1),
                             "Orders": _rocketmq_topic("Orders", 2)}}))
    (root / "config" / "subscriptionGroup.json").write_text(json.dumps({
        "dataVersion": {"counter": 1, "timestamp": 0},
        "subscriptionGroupTable": {GROUP: {"groupName": GROUP, "consumeEnable": True,
                                           "retryMaxTimes": 16}}}))


def test_a_broker_serves_names_its_store_holds_and_still_refuses_to_create_them(tmp_path):
    root = tmp_path / "store"
    _write_store(root)
    b = BrokerProcess(root).start()  # refused before: "topic name ... must match ..."
    try:
        log = b.log.read_text()
        assert f"topic {DLQ!r} breaks today's name rule" in log
        assert f"group {GROUP!r} breaks today's name rule" in log
        channel, stub = raw_stub(b)
        route = stub.QueryRoute(svc.QueryRouteRequest(topic=pb.Resource(name=DLQ)))
        assert route.status.code == pb.OK and len(route.message_queues) == 1
        pull = svc.PullMessageRequest(
            group=pb.Resource(name=GROUP),
            message_queue=pb.MessageQueue(topic=pb.Resource(name=DLQ), id=0), offset=0,
            batch_size=32, filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"))
        answer = list(stub.PullMessage(pull, timeout=30))
        assert answer[0].status.code == pb.OK, answer[0].status
        assert [r.message.body for r in answer if r.HasField("message")] == [
            b"dead-0", b"dead-1", b"dead-2"]
        got = stub.UpdateOffset(svc.UpdateOffsetRequest(
            group=pb.Resource(name=GROUP),
            message_queue=pb.MessageQueue(topic=pb.Resource(name=DLQ), id=0), offset=3))
        assert got.status.code == pb.OK, got.status
        channel.close()
        # The rule still applies to names being created.
        for kind, flag, name in (("topic", "--topic", "new.with.dot"),
                                 ("group", "--group", "other.with.dot")):
            made = b.cli(kind, "create", flag, name)
            assert made.returncode != 0 and "must match" in made.stderr, made.stderr
        listed = b.cli("topic", "list")
        assert listed.returncode == 0 and DLQ in listed.stdout
    finally:
        b.terminate()
    # The broker rewrote nothing it could not read back: it starts again.
    BrokerProcess(root).start().terminate()
