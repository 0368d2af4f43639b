"""What each record of a transaction holds, as Apache RocketMQ's broker writes it: pure
functions from one message to the next, no I/O.

* The half message (``TransactionalMessageBridge.parseHalfMessageInner``): the producer's
  message moved to ``RMQ_SYS_TRANS_HALF_TOPIC`` queue 0, with ``REAL_TOPIC``, ``REAL_QID``,
  ``TRAN_MSG=true``, ``PGROUP`` and ``__transactionId__`` (its unique id), and its sysFlag's
  transaction bits reset to "not a transaction" so the half topic's ConsumeQueue indexes it
  (a record with the prepared bits set is kept out of every ConsumeQueue).
* The committed message (``EndTransactionProcessor.endMessageTransaction``): back in its real
  topic and queue, every property kept but ``REAL_TOPIC``, ``REAL_QID`` and ``TRAN_MSG``, the
  commit type in its sysFlag and the half's CommitLog offset as its prepared transaction
  offset; the unique id (the message id clients see) is unchanged.
* The op record (``TransactionalMessageServiceImpl.getOpMessage``): tag ``d`` in
  ``RMQ_SYS_TRANS_OP_HALF_TOPIC`` queue 0, body the half queue offsets it ends, each followed
  by ``,`` (RocketMQ 4 wrote one offset without the comma; both are read).
* A check's copy (``renewHalfMessageInner``): the half written again to the half queue with
  ``TRANSACTION_CHECK_TIMES`` counted up, so the count survives a restart.
* The discarded half (``DefaultTransactionalMessageCheckListener.toMessageExtBrokerInner``):
  after ``transactionCheckMax`` checks, the half as it is, in ``TRANS_CHECK_MAX_TIME_TOPIC``.
"""

from __future__ import annotations

import itertools
import os
import time

from stratamq.message import Host, Message, Prop, StoredMessage
from stratamq.record.layout import SysFlag

__all__ = [
    "CHECK_IMMUNITY_TIME", "CHECK_MAX_TOPIC", "CHECK_TIMES", "HALF_TOPIC", "OP_TOPIC",
    "REMOVE_TAG", "TRANSACTION_ID", "check_copy", "committed_message", "discarded_message",
    "half_message", "op_message", "op_offsets", "transaction_id_of",
]

HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"  # TopicValidator.RMQ_SYS_TRANS_HALF_TOPIC
OP_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"  # TopicValidator.RMQ_SYS_TRANS_OP_HALF_TOPIC
CHECK_MAX_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"  # TopicValidator.RMQ_SYS_TRANS_CHECK_MAX_TIME_TOPIC
REMOVE_TAG = "d"  # TransactionalMessageUtil.REMOVE_TAG
OFFSET_SEPARATOR = ","  # TransactionalMessageUtil.OFFSET_SEPARATOR
TRANSACTION_ID = "__transactionId__"  # TransactionalMessageUtil.TRANSACTION_ID
CHECK_TIMES = "TRANSACTION_CHECK_TIMES"  # MessageConst.PROPERTY_TRANSACTION_CHECK_TIMES
CHECK_IMMUNITY_TIME = "CHECK_IMMUNITY_TIME_IN_SECONDS"  # PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS
PREPARED_QUEUE_OFFSET = "TRAN_PREPARED_QUEUE_OFFSET"  # PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET

# RocketMQ's MessageClientIDSetter shape for the op records' own unique ids: ip (8 hex), pid (4),
# a per-process hash (8), then milliseconds (8) and a counter (4).
_ID_PREFIX = f"7F000001{os.getpid() & 0xFFFF:04X}{id(object()) & 0xFFFFFFFF:08X}"
_id_counter = itertools.count()


def _new_uniq_id() -> str:
    return (f"{_ID_PREFIX}{int(time.time() * 1000) & 0xFFFFFFFF:08X}"
            f"{next(_id_counter) & 0xFFFF:04X}")


def _with_transaction_type(sys_flag: int, kind: int) -> int:
    """MessageSysFlag.resetTransactionValue."""
    return (sys_flag & ~SysFlag.TRANSACTION_MASK) | kind


def transaction_id_of(properties: dict[str, str], physical_offset: int) -> str:
    """A half's transaction id: its unique id (what the proxy hands the client as the
    transaction id), else ``__transactionId__``, else its position (a record written without
    either still gets a key of its own)."""
    return (properties.get(Prop.UNIQ_KEY) or properties.get(TRANSACTION_ID)
            or f"@{physical_offset}")


def half_message(msg: Message, producer_group: str) -> Message:
    """The half a TRANSACTION send stores instead of ``msg`` (its queue already chosen)."""
    props = dict(msg.properties)
    uniq = props.get(Prop.UNIQ_KEY)
    if uniq:
        props[TRANSACTION_ID] = uniq
    props[Prop.TRANSACTION_PREPARED] = "true"
    props[Prop.PRODUCER_GROUP] = producer_group
    props[Prop.REAL_TOPIC] = msg.topic
    props[Prop.REAL_QUEUE_ID] = str(msg.queue_id)
    return Message(HALF_TOPIC, msg.body, 0, props, msg.flag,
                   _with_transaction_type(msg.sys_flag, SysFlag.TRANSACTION_NOT_TYPE),
                   msg.born_timestamp, msg.born_host, msg.reconsume_times)


def committed_message(half: StoredMessage) -> Message:
    """The message a COMMIT puts into the half's real topic and queue."""
    props = dict(half.properties)
    topic = props.pop(Prop.REAL_TOPIC)
    queue_id = int(props.pop(Prop.REAL_QUEUE_ID))
    props.pop(Prop.TRANSACTION_PREPARED, None)
    return Message(topic, bytes(half.body), queue_id, props, half.flag,
                   _with_transaction_type(half.sys_flag, SysFlag.TRANSACTION_COMMIT_TYPE),
                   half.born_timestamp, half.born_host, half.reconsume_times,
                   prepared_transaction_offset=half.physical_offset)


def op_message(half_queue_offsets: list[int], store_host: Host) -> Message:
    """The op record ending the halves at these half queue offsets."""
    body = "".join(f"{offset}{OFFSET_SEPARATOR}" for offset in half_queue_offsets).encode()
    props = {Prop.TAGS: REMOVE_TAG, Prop.UNIQ_KEY: _new_uniq_id()}
    return Message(OP_TOPIC, body, 0, props, 0, 0, int(time.time() * 1000), store_host)


def op_offsets(body: bytes) -> list[int]:
    """The half queue offsets an op record's body names (bad parts skipped, as RocketMQ's
    ``getLong`` reads them as -1, below every offset)."""
    out = []
    for part in body.decode("utf-8", "replace").split(OFFSET_SEPARATOR):
        part = part.strip()
        if part.isdigit():
            out.append(int(part))
    return out


def check_copy(half: StoredMessage, check_times: int) -> Message:
    """The half written again for a check, its check count set to ``check_times``."""
    props = dict(half.properties)
    props[CHECK_TIMES] = str(check_times)
    return Message(half.topic, bytes(half.body), half.queue_id, props, half.flag, half.sys_flag,
                   half.born_timestamp, half.born_host, half.reconsume_times)


def discarded_message(half: StoredMessage) -> Message:
    """The half moved to ``TRANS_CHECK_MAX_TIME_TOPIC`` queue 0 after too many checks."""
    return Message(CHECK_MAX_TOPIC, bytes(half.body), 0, dict(half.properties), half.flag,
                   half.sys_flag, half.born_timestamp, half.born_host, half.reconsume_times)
