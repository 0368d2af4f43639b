"""4.x transactional messages over remoting, through a raw-frame client: a TRAN_MSG send is
stored as the half message (invisible in its topic), END_TRANSACTION commits or rolls it back
once, RocketMQ's checks of the header are answered with its remarks, and check-back sends
CHECK_TRANSACTION_STATE to a live producer of the group (registered by HEART_BEAT), whose
answer ends the transaction."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from remoting_env import invoke, remoting_broker

from stratamq import record
from stratamq.broker.metadata import MetadataStore
from stratamq.record.codec import parse_offset_msg_id
from stratamq.remoting.codec import RemotingCommand
from stratamq.remoting.codes import RequestCode, ResponseCode
from stratamq.remoting.transport import Connection, RemotingClient
from stratamq.transactions.messages import HALF_TOPIC

PREPARED, COMMIT, ROLLBACK, NOT_TYPE = 4, 8, 12, 0  # MessageSysFlag transaction types


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    store = tmp_path_factory.mktemp("remoting-tx") / "store"
    MetadataStore(store).create_topic("TxEnd", 1)
    MetadataStore(store).create_topic("TxCheck", 2)
    b, address = remoting_broker(store, extra="transactionCheckInterval=300\n"
                                 "transactionTimeOut=800\n")
    yield b, address
    b.terminate()


def _props(**kv: str) -> str:
    return "".join(f"{k}\x01{v}\x02" for k, v in kv.items())


def _send_half(topic: str, group: str, uniq: str, body: bytes, qid: int = 0) -> RemotingCommand:
    return RemotingCommand(RequestCode.SEND_MESSAGE_V2, ext_fields={
        "a": group, "b": topic, "e": str(qid), "f": str(PREPARED),
        "g": str(int(time.time() * 1000)), "h": "0",
        "i": _props(TAGS="T", KEYS="k", TRAN_MSG="true", PGROUP=group, UNIQ_KEY=uniq)},
        body=body)


def _end_fields(sent: RemotingCommand, group: str, how: int, uniq: str,
                from_check: bool = False) -> dict[str, str]:
    """What DefaultMQProducerImpl.endTransaction sends for a send's result."""
    _, offset = parse_offset_msg_id(sent.ext_fields["msgId"])
    return {"producerGroup": group, "tranStateTableOffset": sent.ext_fields["queueOffset"],
            "commitLogOffset": str(offset), "commitOrRollback": str(how),
            "fromTransactionCheck": str(from_check).lower(), "msgId": uniq,
            "transactionId": uniq}


def _bodies(address: str, topic: str, qid: int = 0) -> list[bytes]:
    got = invoke(address, RequestCode.PULL_MESSAGE, {
        "consumerGroup": "Reader", "topic": topic, "queueId": str(qid), "queueOffset": "0",
        "maxMsgNums": "32", "sysFlag": "4", "commitOffset": "-1", "suspendTimeoutMillis": "0",
        "subscription": "*", "subVersion": "0"})
    out, pos = [], 0
    while pos < len(got.body):
        m = record.decode(got.body, pos)
        out.append(bytes(m.body))
        pos += m.total_size
    return out


def test_end_transaction_commits_and_rolls_back_once(broker):
    _, address = broker
    sent = {}
    for uniq, body in (("U-commit", b"kept"), ("U-rollback", b"dropped")):
        sent[uniq] = invoke(address, RequestCode.SEND_MESSAGE_V2,
                            _send_half("TxEnd", "PG", uniq, body).ext_fields, body)
        assert sent[uniq].code == ResponseCode.SUCCESS, sent[uniq].remark
        assert sent[uniq].ext_fields["queueId"] == "0"  # the producer's queue, not the half's
    assert _bodies(address, "TxEnd") == []  # halves: not in the topic
    for uniq in sent:  # what the send's offset message id names is the half
        _, offset = parse_offset_msg_id(sent[uniq].ext_fields["msgId"])
        viewed = invoke(address, RequestCode.VIEW_MESSAGE_BY_ID, {"offset": str(offset)})
        assert viewed.code == ResponseCode.SUCCESS, viewed.remark
        half = record.decode(viewed.body, 0)
        assert (half.topic, half.properties["REAL_TOPIC"], half.properties["PGROUP"],
                half.properties["TRAN_MSG"]) == (HALF_TOPIC, "TxEnd", "PG", "true")

    # checkPrepareMessage: the header must name the half's group and queue offset.
    wrong = invoke(address, RequestCode.END_TRANSACTION,
                   _end_fields(sent["U-commit"], "Other", COMMIT, "U-commit"))
    assert (wrong.code, wrong.remark) == (ResponseCode.SYSTEM_ERROR, "The producer group wrong")
    fields = dict(_end_fields(sent["U-commit"], "PG", COMMIT, "U-commit"),
                  tranStateTableOffset="7")
    wrong = invoke(address, RequestCode.END_TRANSACTION, fields)
    assert wrong.remark == "The transaction state table offset wrong"
    fields = dict(_end_fields(sent["U-commit"], "PG", COMMIT, "U-commit"), commitLogOffset="3")
    wrong = invoke(address, RequestCode.END_TRANSACTION, fields)
    assert (wrong.code, wrong.remark) == (ResponseCode.SYSTEM_ERROR,
                                          "Find prepared transaction message failed")

    for uniq, how in (("U-commit", COMMIT), ("U-rollback", ROLLBACK)):
        done = invoke(address, RequestCode.END_TRANSACTION,
                      _end_fields(sent[uniq], "PG", how, uniq))
        assert done.code == ResponseCode.SUCCESS, done.remark
    again = invoke(address, RequestCode.END_TRANSACTION,
                   _end_fields(sent["U-commit"], "PG", COMMIT, "U-commit"))
    assert again.code == ResponseCode.SUCCESS  # a retry: answered as the first, stored once
    late = invoke(address, RequestCode.END_TRANSACTION,
                  _end_fields(sent["U-rollback"], "PG", COMMIT, "U-rollback"))
    assert late.code == ResponseCode.SYSTEM_ERROR and "rolled back" in late.remark
    assert _bodies(address, "TxEnd") == [b"kept"]


def test_check_back_asks_a_live_producer_of_the_group_and_its_answer_ends_it(broker):
    _, address = broker
    checks: list[RemotingCommand] = []

    async def scenario() -> list[bytes]:
        got = asyncio.Event()

        async def on_check(request: RemotingCommand, conn: Connection) -> None:
            checks.append(request)
            got.set()

        producer = RemotingClient(address, {RequestCode.CHECK_TRANSACTION_STATE: on_check})
        try:
            beat = await producer.invoke(RemotingCommand(RequestCode.HEART_BEAT, body=json.dumps(
                {"clientID": "127.0.0.1@tx", "producerDataSet": [{"groupName": "PCheck"}],
                 "consumerDataSet": []}).encode()))
            assert beat.code == ResponseCode.SUCCESS
            half = await producer.invoke(_send_half("TxCheck", "PCheck", "U-check", b"asked",
                                                    qid=1))
            assert half.code == ResponseCode.SUCCESS, half.remark
            # (the producer "crashes" before ending it: the broker asks, after 800 ms)
            await asyncio.wait_for(got.wait(), 30)
            check = checks[0]
            h = check.ext_fields
            await producer.oneway(RemotingCommand(RequestCode.END_TRANSACTION, ext_fields={
                "producerGroup": "PCheck", "tranStateTableOffset": h["tranStateTableOffset"],
                "commitLogOffset": h["commitLogOffset"], "commitOrRollback": str(COMMIT),
                "fromTransactionCheck": "true", "msgId": h["msgId"],
                "transactionId": h["transactionId"]}))
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                bodies = await asyncio.to_thread(_bodies, address, "TxCheck", 1)
                if bodies:
                    return bodies
                await asyncio.sleep(0.1)
            return []
        finally:
            await producer.close()

    assert asyncio.run(scenario()) == [b"asked"]
    check = checks[0]
    assert check.is_oneway
    h = check.ext_fields
    assert h["msgId"] == h["transactionId"] == "U-check"
    # The body: the half as MessageDecoder encodes it, in its real topic and queue, at the
    # check copy's offsets (the ones the header names).
    msg = record.decode(check.body, 0)
    assert (msg.topic, msg.queue_id, bytes(msg.body)) == ("TxCheck", 1, b"asked")
    assert msg.physical_offset == int(h["commitLogOffset"])
    assert msg.queue_offset == int(h["tranStateTableOffset"])
    assert h["offsetMsgId"] == record.offset_msg_id(msg.store_host, msg.physical_offset)
    assert msg.properties["PGROUP"] == "PCheck"
    assert msg.properties["TRANSACTION_CHECK_TIMES"] == "1"
