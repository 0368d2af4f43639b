"""Compaction topics in the broker (``cleanup.policy=COMPACTION``): what the send path does for
them, the compaction store the broker plugs into its message store, and the admin methods.

- **Routing**: the official clients pick a queue themselves only for FIFO topics, so for a
  NORMAL compaction topic the broker chooses: the queue of a message is
  ``abs(hashCode(KEYS)) % writeQueueNums`` (Java's ``String.hashCode``, as RocketMQ's
  ``SelectMessageQueueByHash``), so every value of a key lands in one queue, where compaction
  keeps only the latest. A message without a key is refused (ILLEGAL_MESSAGE_KEY).
- **Tombstones**: an empty body is accepted on a compaction topic only; the official clients
  refuse empty bodies, so a message with the user property ``TOMBSTONE=true`` is one too.
- **Reading**: the compaction store is a read source ahead of the local ConsumeQueues, so
  ``ReceiveMessage``, ``PullMessage`` and offset queries read the compacted queue; a new group
  starts at the minimum offset (the engine's rule), which is the first kept message.

Admin methods (``/stratamq.admin.v1.Admin/<Method>``, JSON bodies, errors and ACL as in
``broker/admin.py``), registered as a second handler of the same service:

* ``CompactionRun {"topic"?}`` -> ``{"queues": [REPORT]}``: one round of every queue (of
  ``topic``) now, the file being written sealed first; REPORT is a row of ``stratamq
  compaction run``
* ``CompactionStatus {"topic"?}`` -> ``{"queues": [STATUS]}``: rows of ``stratamq compaction
  status``

Both answer ``FAILED_PRECONDITION`` when compaction is off (``enableCompaction=false``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb

from stratamq.broker.errors import BrokerError
from stratamq.broker.metadata import MetadataError, MetadataStore, TopicConfig
from stratamq.client.admin import SERVICE
from stratamq.compaction.service import CompactionStore
from stratamq.config import StoreConfig
from stratamq.javahash import java_string_hash
from stratamq.message import Message, Prop
from stratamq.store.message_store import MessageStore

if TYPE_CHECKING:
    from stratamq.broker.admin import AdminParts

__all__ = ["compaction_admin_handler", "plug", "route_by_key"]

Code = pb.Code


def plug(store: MessageStore, config: StoreConfig, meta: MetadataStore
         ) -> CompactionStore | None:
    """Plug a compaction store fed by the broker's topic metadata into ``store`` (before it
    opens); None when ``enableCompaction`` is off."""
    if not config.enable_compaction:
        return None
    return CompactionStore(config, meta).plug_into(store)


def route_by_key(topic: TopicConfig, msg: Message) -> None:
    """Put ``msg`` of compaction topic ``topic`` on the queue its key hashes to."""
    key = msg.properties.get(Prop.KEYS)
    if not key:
        raise BrokerError(Code.ILLEGAL_MESSAGE_KEY,
                          f"topic {topic.name!r} is a compaction topic: every message needs a "
                          "key (its latest value per key is what the topic keeps)")
    msg.queue_id = abs(java_string_hash(key)) % topic.write_queue_nums


def compaction_admin_handler(broker: AdminParts) -> grpc.GenericRpcHandler:
    """The methods as ``grpc.aio`` handlers, each run in the broker's executor (a round takes
    a while)."""
    from stratamq.broker.admin import _field, json_methods_handler

    def compaction() -> CompactionStore:
        comp = broker.compaction
        if comp is None:
            raise MetadataError("precondition", "compaction is off on this broker "
                                "(enableCompaction=false)")
        return comp

    def run(req: dict[str, Any]) -> dict[str, Any]:
        topic = _field(req, "topic", str, False)
        comp = compaction()
        if topic is not None:
            cfg = broker.meta.existing_topic(topic)
            if cfg.compaction is None:
                raise MetadataError("invalid", f"topic {topic!r} is not a compaction topic "
                                    "(cleanup.policy=COMPACTION)")
        # Rounds cover what is dispatched: let dispatch catch up with what was sent first.
        broker.store.wait_dispatched()
        return {"queues": [r.to_json() for r in comp.run_now(topic)]}

    def status(req: dict[str, Any]) -> dict[str, Any]:
        topic = _field(req, "topic", str, False)
        return {"queues": [r for r in compaction().status()
                           if topic is None or r["topic"] == topic]}

    return json_methods_handler(
        broker, SERVICE, {"CompactionRun": (run, "Update"), "CompactionStatus": (status, "Get")},
        broker.run)
