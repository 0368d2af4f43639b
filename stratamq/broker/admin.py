"""StrataMQ's admin gRPC service: topics, groups and consumer progress of a running broker.

The official protocol has no topic management (``rocketmq.grpc_protocol.admin_pb2`` only
changes log levels), so the broker serves ``/stratamq.admin.v1.Admin/<Method>`` on its gRPC
port with JSON request and response bodies (UTF-8 objects). Errors are gRPC status codes:
``INVALID_ARGUMENT`` (bad name, count or type), ``NOT_FOUND``, ``ALREADY_EXISTS``,
``PERMISSION_DENIED`` / ``UNAUTHENTICATED`` (ACL), with a message saying what was wrong.

Methods (request -> response):

* ``CreateTopic {"topic", "queues", "type"}`` -> ``{"topic": TOPIC}``
* ``UpdateTopic {"topic", "queues"?, "read_queues"?, "write_queues"?, "type"?, "force"?}``
  -> ``{"topic": TOPIC}``; ``queues`` sets both counts. Fewer read queues than before is
  refused (INVALID_ARGUMENT) while the queues dropped hold unconsumed messages, unless
  ``force``
* ``DeleteTopic {"topic"}`` -> ``{"deleted": name}``: metadata, consumer state and messages
  (its ConsumeQueues go; its records, in the CommitLog until retention, are never served again)
* ``ListTopics {}`` -> ``{"topics": [TOPIC]}``
* ``CreateGroup {"group", "retry_max_times"?, "orderly"?, "retry_backoff_ms"?}`` /
  ``UpdateGroup`` (same fields) -> ``{"group": GROUP}``; ``DeleteGroup {"group"}``
* ``ListGroups {}`` -> ``{"groups": [GROUP + "clients"]}``
* ``GroupProgress {"group"}`` -> ``{"group", "lag", "inflight", "queues": [{"topic",
  "queue_id", "max_offset", "consumer_offset", "inflight", "lag"}]}``
* ``BrokerInfo {}`` -> ``{"broker_name", "cluster", "endpoint", "store"}``

TOPIC is ``{"topic", "queues", "read_queues", "write_queues", "perm", "type", "messages"}``;
GROUP is ``{"group", "retry_max_times", "max_delivery_attempts", "orderly",
"retry_backoff_ms"}``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb

from stratamq.broker.errors import BrokerError
from stratamq.broker.metadata import GroupConfig, MetadataError, TopicConfig
from stratamq.client.admin import SERVICE

if TYPE_CHECKING:
    from stratamq.broker.server import Broker

log = logging.getLogger(__name__)

_KIND_CODES = {"invalid": grpc.StatusCode.INVALID_ARGUMENT,
               "not_found": grpc.StatusCode.NOT_FOUND,
               "exists": grpc.StatusCode.ALREADY_EXISTS}  # fmt: skip


def _loads(data: bytes) -> dict[str, Any]:
    try:
        obj = json.loads(data.decode("utf-8") or "{}")
    except (UnicodeDecodeError, ValueError) as exc:
        raise MetadataError("invalid", f"request body is not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise MetadataError("invalid", "request body must be a JSON object")
    return obj


def _dumps(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode("utf-8")


def _field(req: dict[str, Any], name: str, kind: type, required: bool = True) -> Any:
    value = req.get(name)
    if value is None:
        if required:
            raise MetadataError("invalid", f"field {name!r} is required")
        return None
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise MetadataError("invalid", f"field {name!r} must be an integer")
    if kind is not int and not isinstance(value, kind):
        raise MetadataError("invalid", f"field {name!r} must be a {kind.__name__}")
    return value


class AdminService:
    def __init__(self, broker: Broker) -> None:
        self.b = broker

    def topic_json(self, t: TopicConfig) -> dict[str, Any]:
        store = self.b.store
        messages = sum(store.get_max_offset_in_queue(t.name, q)
                       - store.get_min_offset_in_queue(t.name, q) for q in range(t.queue_count))
        return {"topic": t.name, "queues": t.queue_count, "read_queues": t.read_queue_nums,
                "write_queues": t.write_queue_nums, "perm": t.perm, "type": t.message_type,
                "messages": messages}  # fmt: skip

    @staticmethod
    def group_json(g: GroupConfig) -> dict[str, Any]:
        return {"group": g.name, "retry_max_times": g.retry_max_times,
                "max_delivery_attempts": g.max_delivery_attempts,
                "orderly": g.consume_message_orderly, "retry_backoff_ms": g.retry_backoff_ms}

    def CreateTopic(self, req: dict[str, Any]) -> dict[str, Any]:
        t = self.b.meta.create_topic(_field(req, "topic", str), _field(req, "queues", int),
                                     _field(req, "type", str, False) or "NORMAL")
        return {"topic": self.topic_json(t)}

    def UpdateTopic(self, req: dict[str, Any]) -> dict[str, Any]:
        force = bool(req.get("force", False))

        def no_hidden_messages(old: TopicConfig, new: TopicConfig) -> None:
            if force or new.read_queue_nums >= old.read_queue_nums:
                return
            hidden = self._unconsumed(old.name, range(new.read_queue_nums, old.read_queue_nums))
            if hidden:
                raise MetadataError(
                    "invalid", f"reading {old.name!r} from {new.read_queue_nums} queues instead "
                    f"of {old.read_queue_nums} would hide {hidden} unconsumed messages in "
                    f"queues {new.read_queue_nums}..{old.read_queue_nums - 1}; shrink the "
                    "write queues first and let consumers drain them, or force it")

        t = self.b.meta.update_topic(
            _field(req, "topic", str), _field(req, "queues", int, False),
            _field(req, "type", str, False), read_queues=_field(req, "read_queues", int, False),
            write_queues=_field(req, "write_queues", int, False), check=no_hidden_messages)
        return {"topic": self.topic_json(t)}

    def _unconsumed(self, topic: str, queues: range) -> int:
        """Messages in ``queues`` some consumer group has not consumed (every message, when no
        group has consumed the topic yet)."""
        store = self.b.store
        groups = [g for (g, t) in self.b.state.groups_of() if t == topic]
        total = 0
        for q in queues:
            high, low = store.get_max_offset_in_queue(topic, q), \
                store.get_min_offset_in_queue(topic, q)
            done = [c for g in groups if (c := self.b.state.committed(g, topic, q)) is not None]
            total += max(0, high - (min(done) if done and len(done) == len(groups) else low))
        return total

    def DeleteTopic(self, req: dict[str, Any]) -> dict[str, Any]:
        name = _field(req, "topic", str)
        self.b.meta.existing_topic(name)
        # The messages go with the topic (RocketMQ's deleteTopics): a topic created later
        # under the name starts empty.
        self.b.store.delete_topic(name)
        self.b.meta.delete_topic(name)
        self.b.state.drop_topic(name)
        return {"deleted": name}

    def ListTopics(self, req: dict[str, Any]) -> dict[str, Any]:
        return {"topics": [self.topic_json(t) for t in self.b.meta.topics()]}

    def CreateGroup(self, req: dict[str, Any]) -> dict[str, Any]:
        g = self.b.meta.create_group(_field(req, "group", str),
                                     retry_max_times=_field(req, "retry_max_times", int, False),
                                     orderly=bool(req.get("orderly", False)),
                                     retry_backoff_ms=_field(req, "retry_backoff_ms", list, False))
        return {"group": self.group_json(g)}

    def UpdateGroup(self, req: dict[str, Any]) -> dict[str, Any]:
        g = self.b.meta.update_group(
            _field(req, "group", str),
            retry_max_times=_field(req, "retry_max_times", int, False),
            consume_message_orderly=req.get("orderly"),
            retry_backoff_ms=_field(req, "retry_backoff_ms", list, False))
        return {"group": self.group_json(g)}

    def DeleteGroup(self, req: dict[str, Any]) -> dict[str, Any]:
        name = _field(req, "group", str)
        self.b.meta.delete_group(name)
        return {"deleted": name}

    def ListGroups(self, req: dict[str, Any]) -> dict[str, Any]:
        return {"groups": [{**self.group_json(g), "clients": len(self.b.live_clients(g.name))}
                           for g in self.b.meta.groups()]}

    def GroupProgress(self, req: dict[str, Any]) -> dict[str, Any]:
        name = _field(req, "group", str)
        if self.b.meta.group(name) is None:
            raise MetadataError("not_found", f"group {name!r} does not exist")
        rows = self.b.engine.progress(name)
        return {"group": name, "lag": sum(r["lag"] for r in rows),
                "inflight": sum(r["inflight"] for r in rows), "queues": rows,
                "clients": self.b.live_clients(name)}

    def BrokerInfo(self, req: dict[str, Any]) -> dict[str, Any]:
        return {"broker_name": self.b.config.broker_name,
                "cluster": self.b.config.broker_cluster_name, "endpoint": self.b.endpoint,
                "store": str(self.b.store_config.root)}


_ACTIONS = {"CreateTopic": "Create", "UpdateTopic": "Update", "DeleteTopic": "Delete",
            "ListTopics": "List", "CreateGroup": "Create", "UpdateGroup": "Update",
            "DeleteGroup": "Delete", "ListGroups": "List", "GroupProgress": "Get",
            "BrokerInfo": "Get"}  # fmt: skip


def admin_handler(broker: Broker) -> grpc.GenericRpcHandler:
    service = AdminService(broker)

    def make(name: str) -> Callable:
        method = getattr(service, name)

        def handle(request: bytes, context: grpc.ServicerContext) -> bytes:
            try:
                req = _loads(request)
                broker._authorize(context, "Cluster", _ACTIONS[name])
                return _dumps(method(req))
            except MetadataError as exc:
                context.abort(_KIND_CODES[exc.kind], str(exc))
            except BrokerError as exc:
                code = (grpc.StatusCode.UNAUTHENTICATED if exc.code == pb.Code.UNAUTHORIZED
                        else grpc.StatusCode.PERMISSION_DENIED if exc.code == pb.Code.FORBIDDEN
                        else grpc.StatusCode.INVALID_ARGUMENT)
                context.abort(code, exc.message)
            raise AssertionError("unreachable")  # context.abort raises

        return grpc.unary_unary_rpc_method_handler(handle)

    return grpc.method_handlers_generic_handler(SERVICE, {n: make(n) for n in _ACTIONS})
