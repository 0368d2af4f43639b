"""StrataMQ's admin gRPC service: topics, groups and consumer progress of a running broker.

The official protocol has no topic management (``rocketmq.grpc_protocol.admin_pb2`` only
changes log levels), so the broker serves ``/stratamq.admin.v1.Admin/<Method>`` on its gRPC
port with JSON request and response bodies (UTF-8 objects). Errors are gRPC status codes:
``INVALID_ARGUMENT`` (bad name, count or type), ``NOT_FOUND``, ``ALREADY_EXISTS``,
``PERMISSION_DENIED`` / ``UNAUTHENTICATED`` (ACL), with a message saying what was wrong.

Methods (request -> response):

* ``CreateTopic {"topic", "queues", "type", "attributes"?}`` -> ``{"topic": TOPIC}``;
  ``attributes`` is ``{"cleanup.policy": "DELETE"|"COMPACTION", "delete.retention.ms": ms}``
  (RocketMQ's ``+name`` spelling accepted)
* ``UpdateTopic {"topic", "queues"?, "read_queues"?, "write_queues"?, "type"?, "force"?,
  "attributes"?}`` -> ``{"topic": TOPIC}``; ``queues`` sets both counts. Fewer read queues
  than before is refused (INVALID_ARGUMENT) while the queues dropped hold unconsumed
  messages, unless ``force``; a compaction topic's write queues, type and cleanup.policy
  never change
* ``DeleteTopic {"topic"}`` -> ``{"deleted": name}``: metadata, consumer state and messages
  (its ConsumeQueues go; its records, in the CommitLog until retention, are never served again)
* ``ListTopics {}`` -> ``{"topics": [TOPIC]}``
* ``CreateGroup {"group", "retry_max_times"?, "orderly"?, "retry_backoff_ms"?}`` /
  ``UpdateGroup`` (same fields) -> ``{"group": GROUP}``; ``DeleteGroup {"group"}``
* ``ListGroups {}`` -> ``{"groups": [GROUP + "clients", "retry_messages",
  "dlq_messages"]}``: the last two count the messages held in ``%RETRY%<group>`` and
  ``%DLQ%<group>`` (0 without the topic)
* ``GroupProgress {"group"}`` -> ``{"group", "lag", "inflight", "queues": [{"topic",
  "queue_id", "max_offset", "consumer_offset", "inflight", "lag"}], "clients",
  "retry_messages", "dlq_messages"}``
* ``BrokerInfo {}`` -> ``{"broker_name", "cluster", "endpoint", "store"}``
* ``TopicRoute {"topic"}`` -> ``{"topic", "type", "broker_name", "broker_id", "endpoint",
  "queues": [{"queue_id", "perm"}]}`` (perm READ_WRITE | READ | WRITE | NONE)
* ``TopicStatus {"topic"}`` -> ``{"topic", "messages", "queues": [{"queue_id", "min_offset",
  "max_offset", "last_store_time"}]}`` (last_store_time in ms, null for an empty queue)
* ``ResetOffset {"group", "topic", "timestamp"}`` -> ``{"group", "topic", "timestamp",
  "dropped_inflight", "queues": [{"queue_id", "offset"}]}``: RocketMQ's resetOffsetByTime
* ``BrokerStatus {}`` -> ``{"version", "broker_name", "cluster", "role", "endpoint", "store",
  "uptime_s", "disk": {"total", "used", "free", "used_ratio"}, "commitlog": {"min_offset",
  "max_offset"}, "dispatch_behind_bytes", "disk_full_policy", "disk_full",
  "unconsumed_deleted": {"files", "messages"}, "connections", "topics", "groups",
  "long_polls", "telemetry_streams", "store_identity": {"storeId", "createdTimestamp",
  "lineage", "lineageTimestamp"}, "recovery_set_aside": {"cut_offset", "records", "path"} or
  null}``: ``long_polls`` receives and pulls waiting for messages
  now, ``telemetry_streams`` clients' open Telemetry streams, ``store_identity`` the store's
  id and its CommitLog's lineage (docs/formats/store-identity.md); ``disk_full``: puts are
  refused for a full disk; ``unconsumed_deleted``: what forced clean-up deleted before it was
  consumed (diskFullPolicy=DELETE_OLDEST); ``recovery_set_aside``: valid records this start's
  recovery cut out of a damaged CommitLog, and where it kept them

TOPIC is ``{"topic", "queues", "read_queues", "write_queues", "perm", "type", "attributes",
"messages", "bytes"}`` (``bytes``: the CommitLog bytes of the messages held, estimated from
each queue's oldest and newest units; null when a queue's messages are all in a tier);
GROUP is ``{"group", "retry_max_times", "max_delivery_attempts", "orderly",
"retry_backoff_ms"}``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb

from stratamq.broker.errors import BrokerError
from stratamq.broker.metadata import (
    GroupConfig,
    MetadataError,
    TopicConfig,
    dlq_topic,
    retry_topic,
)
from stratamq.broker.ports import Call
from stratamq.broker.pulling import reset_offsets
from stratamq.broker.receiving import Run
from stratamq.broker.rpc import call_of
from stratamq.client.admin import SERVICE
from stratamq.client.connection import ANSWERED

if TYPE_CHECKING:
    from stratamq.broker.engine import PopEngine
    from stratamq.broker.lookup import Lookup
    from stratamq.broker.metadata import MetadataStore
    from stratamq.broker.polling import LongPolls
    from stratamq.broker.pop_state import PopState
    from stratamq.config import BrokerConfig, StoreConfig
    from stratamq.store.message_store import MessageStore

log = logging.getLogger(__name__)

_KIND_CODES = {"invalid": grpc.StatusCode.INVALID_ARGUMENT,
               "not_found": grpc.StatusCode.NOT_FOUND,
               "exists": grpc.StatusCode.ALREADY_EXISTS,
               "precondition": grpc.StatusCode.FAILED_PRECONDITION}  # fmt: skip


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


class Guarded(Protocol):
    """What ``json_methods_handler`` checks a call against: the ACL lookups and (None off)
    the replication that refuses writes on a slave."""

    lookup: Lookup
    replication: Any


@dataclass
class AdminParts:
    """The parts of a running broker the admin services use (never the ``Broker``): its
    settings, store, metadata, pop state and engine, long polls, gRPC clients, lookups,
    replication, transaction engine, executor ``run``, and the live values read per call."""

    config: BrokerConfig
    store_config: StoreConfig
    store: MessageStore
    meta: MetadataStore
    state: PopState
    engine: PopEngine
    polls: LongPolls
    clients: Any  # broker.clients.ClientRegistry (len: connections)
    lookup: Lookup
    replication: Any  # broker.replication.BrokerReplication
    transactions: Any  # transactions.TransactionEngine
    run: Run
    started_at: float
    endpoint_of: Callable[[], str]
    live_clients: Callable[[str], list[dict[str, Any]]]
    telemetry_streams_of: Callable[[], int]
    compaction: Any = None  # compaction.service.CompactionStore when enableCompaction
    advertised_of: Callable[[], tuple[str, int]] | None = None  # (host, port) clients reach

    @property
    def endpoint(self) -> str:
        return self.endpoint_of()

    @property
    def advertised(self) -> tuple[str, int]:
        assert self.advertised_of is not None, "built without the advertised address"
        return self.advertised_of()

    @property
    def telemetry_streams(self) -> int:
        return self.telemetry_streams_of()


class AdminService:
    def __init__(self, parts: AdminParts) -> None:
        self.b = parts

    def topic_json(self, t: TopicConfig) -> dict[str, Any]:
        messages, size = self._held(t.name, t.queue_count)
        return {"topic": t.name, "queues": t.queue_count, "read_queues": t.read_queue_nums,
                "write_queues": t.write_queue_nums, "perm": t.perm, "type": t.message_type,
                "attributes": t.attributes, "messages": messages, "bytes": size}  # fmt: skip

    def _held(self, topic: str, queue_count: int) -> tuple[int, int | None]:
        """Messages held in the topic's queues and their CommitLog bytes, estimated per queue
        as its messages times the mean size of its oldest and newest local ConsumeQueue units
        (two unit reads a queue, where summing every unit would read them all); None when a
        queue holding messages has no local unit to size them by (all in a tier)."""
        store = self.b.store
        messages, size = 0, 0
        sized = True
        for q in range(queue_count):
            low, high = store.get_min_offset_in_queue(topic, q), \
                store.get_max_offset_in_queue(topic, q)
            messages += high - low
            if high <= low or not sized:
                continue
            cq = store.consume_queues.find(topic, q)
            local = range(max(low, cq.min_offset()), min(high, cq.max_offset())) if cq else ()
            units = [u for offset in {local[0], local[-1]} for u in cq.get_units(offset, 1)
                     if u[1] > 0] if cq and local else []
            if not units:
                sized = False
                continue
            size += (high - low) * sum(u[1] for u in units) // len(units)
        return messages, size if sized else None

    @staticmethod
    def group_json(g: GroupConfig) -> dict[str, Any]:
        return {"group": g.name, "retry_max_times": g.retry_max_times,
                "max_delivery_attempts": g.max_delivery_attempts,
                "orderly": g.consume_message_orderly, "retry_backoff_ms": g.retry_backoff_ms}

    def CreateTopic(self, req: dict[str, Any]) -> dict[str, Any]:
        t = self.b.meta.create_topic(_field(req, "topic", str), _field(req, "queues", int),
                                     _field(req, "type", str, False) or "NORMAL",
                                     attributes=_field(req, "attributes", dict, False))
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
            write_queues=_field(req, "write_queues", int, False), check=no_hidden_messages,
            attributes=_field(req, "attributes", dict, False))
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
        return {"groups": [{**self.group_json(g), "clients": len(self.b.live_clients(g.name)),
                            **self._retry_and_dlq(g.name)} for g in self.b.meta.groups()]}

    def _retry_and_dlq(self, group: str) -> dict[str, int]:
        """Messages held in the group's ``%RETRY%`` and ``%DLQ%`` topics (0 without them)."""
        out = {}
        for field, name in (("retry_messages", retry_topic(group)),
                            ("dlq_messages", dlq_topic(group))):
            t = self.b.meta.topic(name)
            out[field] = self._held(name, t.queue_count)[0] if t is not None else 0
        return out

    def GroupProgress(self, req: dict[str, Any]) -> dict[str, Any]:
        name = _field(req, "group", str)
        if self.b.meta.group(name) is None:
            raise MetadataError("not_found", f"group {name!r} does not exist")
        rows = self.b.engine.progress(name)
        return {"group": name, "lag": sum(r["lag"] for r in rows),
                "inflight": sum(r["inflight"] for r in rows), "queues": rows,
                "clients": self.b.live_clients(name), **self._retry_and_dlq(name)}

    def TopicRoute(self, req: dict[str, Any]) -> dict[str, Any]:
        t = self.b.meta.existing_topic(_field(req, "topic", str))
        endpoint, may_write = self._routed_endpoint()
        perms = {(True, True): "READ_WRITE", (True, False): "READ", (False, True): "WRITE"}
        return {"topic": t.name, "type": t.message_type, "broker_name": self.b.config.broker_name,
                "broker_id": 0, "endpoint": endpoint, "queues": [
                    {"queue_id": q, "perm": perms.get((q < t.read_queue_nums and bool(t.perm & 4),
                                                       may_write and q < t.write_queue_nums
                                                       and bool(t.perm & 2)), "NONE")}
                    for q in range(t.queue_count)]}

    def _routed_endpoint(self) -> tuple[str, bool]:
        """The endpoint a client's QueryRoute is told and whether its queues may be written:
        replication's say (a slave names its master, or itself read-only while the master is
        down), so the route shown is the one clients act on."""
        if self.b.replication is None:
            return self.b.endpoint, True
        host, port = self.b.advertised
        told, may_write = self.b.replication.route(pb.Endpoints(
            scheme=pb.IPv6 if ":" in host else pb.IPv4,
            addresses=[pb.Address(host=host, port=port)]))
        address = told.addresses[0]
        named = (f"[{address.host}]:{address.port}" if ":" in address.host
                 else f"{address.host}:{address.port}")
        return named, may_write

    def TopicStatus(self, req: dict[str, Any]) -> dict[str, Any]:
        t = self.b.meta.existing_topic(_field(req, "topic", str))
        store = self.b.store
        queues: list[dict[str, Any]] = []
        for q in range(t.queue_count):
            low, high = store.get_min_offset_in_queue(t.name, q), \
                store.get_max_offset_in_queue(t.name, q)
            last = None
            if high > low:
                with store.get_messages("stratamq-admin", t.name, q, high - 1,
                                        max_count=1) as got:
                    last = next((m.store_timestamp for m in got.messages()), None)
            queues.append({"queue_id": q, "min_offset": low, "max_offset": high,
                           "last_store_time": last})
        messages = sum(int(x["max_offset"]) - int(x["min_offset"]) for x in queues)
        return {"topic": t.name, "messages": messages, "queues": queues}

    def ResetOffset(self, req: dict[str, Any]) -> dict[str, Any]:
        """The group's position in each queue of the topic moves to the first message stored
        at or after ``timestamp`` (ms): RocketMQ's resetOffsetByTime. Messages in flight are
        dropped from its pop state; the next receive starts there."""
        group = _field(req, "group", str)
        if self.b.meta.group(group) is None:
            raise MetadataError("not_found", f"group {group!r} does not exist")
        t = self.b.meta.existing_topic(_field(req, "topic", str))
        timestamp = _field(req, "timestamp", int)
        store, state = self.b.store, self.b.state
        offsets = {q: store.get_offset_in_queue_by_time(t.name, q, timestamp)
                   for q in range(t.queue_count)}
        dropped = reset_offsets(state, self.b.polls, group, t.name, offsets)
        return {"group": group, "topic": t.name, "timestamp": timestamp,
                "dropped_inflight": dropped,
                "queues": [{"queue_id": q, "offset": o} for q, o in offsets.items()]}

    def BrokerStatus(self, req: dict[str, Any]) -> dict[str, Any]:
        import shutil

        from stratamq import __version__

        root = self.b.store_config.root
        disk = shutil.disk_usage(root)
        return {"version": __version__, "broker_name": self.b.config.broker_name,
                "cluster": self.b.config.broker_cluster_name,
                "role": self.b.store_config.broker_role.value,
                "endpoint": self.b.endpoint, "store": str(root),
                "uptime_s": round(time.monotonic() - self.b.started_at, 1),
                "disk": {"total": disk.total, "used": disk.used, "free": disk.free,
                         "used_ratio": round(disk.used / disk.total, 4) if disk.total else None},
                "commitlog": {"min_offset": self.b.store.min_physical_offset,
                              "max_offset": self.b.store.max_physical_offset},
                "dispatch_behind_bytes": self.b.store.dispatch_behind_bytes(),
                **self._disk_policy_status(),
                "connections": len(self.b.clients), "topics": len(self.b.meta.topics()),
                "groups": len(self.b.meta.groups()), "long_polls": self.b.polls.total,
                "telemetry_streams": self.b.telemetry_streams,
                "store_identity": (self.b.store.identity.as_dict()
                                   if self.b.store.identity is not None else None),
                "recovery_set_aside": self._recovery_set_aside()}

    def _recovery_set_aside(self) -> dict[str, Any] | None:
        report = getattr(self.b.store, "recovery", None)
        if report is None or report.set_aside is None:
            return None
        return {"cut_offset": report.end_offset, "records": report.records_after_cut,
                "path": report.set_aside}

    def _disk_policy_status(self) -> dict[str, Any]:
        """The disk-full mark, the policy, and what forced clean-up deleted unconsumed."""
        cleanup = self.b.store.cleanup
        return {"disk_full_policy": self.b.store_config.disk_full_policy.value,
                "disk_full": bool(cleanup is not None and cleanup.disk_full),
                "unconsumed_deleted": {
                    "files": cleanup.unconsumed_deleted_files if cleanup else 0,
                    "messages": cleanup.unconsumed_deleted_messages if cleanup else 0}}

    def ListTransactions(self, req: dict[str, Any]) -> dict[str, Any]:
        engine = self.b.transactions
        return {"transactions": engine.open_transactions() if engine is not None else []}

    def BrokerInfo(self, req: dict[str, Any]) -> dict[str, Any]:
        return {"broker_name": self.b.config.broker_name,
                "cluster": self.b.config.broker_cluster_name, "endpoint": self.b.endpoint,
                "store": str(self.b.store_config.root)}


_ACTIONS = {"CreateTopic": "Create", "UpdateTopic": "Update", "DeleteTopic": "Delete",
            "ListTopics": "List", "CreateGroup": "Create", "UpdateGroup": "Update",
            "DeleteGroup": "Delete", "ListGroups": "List", "GroupProgress": "Get",
            "BrokerInfo": "Get", "TopicRoute": "Get", "TopicStatus": "Get",
            "ResetOffset": "Update", "BrokerStatus": "Get",
            "ListTransactions": "List"}  # fmt: skip


def admin_handler(service: AdminService, run: Run) -> grpc.GenericRpcHandler:
    """The admin methods as ``grpc.aio`` handlers; ``run(fn, *args)`` runs each method (they
    write metadata, delete topics...) in the broker's executor."""
    return json_methods_handler(
        service.b, SERVICE, {name: (getattr(service, name), action)
                          for name, action in _ACTIONS.items()}, run)


# (request) -> reply; (request, call) -> reply for the methods named in ``with_call``.
JsonMethod = Callable[..., dict[str, Any]]


def json_methods_handler(broker: Guarded, service: str,
                         methods: dict[str, tuple[JsonMethod, str]], run: Run, *,
                         with_call: frozenset[str] = frozenset()) -> grpc.GenericRpcHandler:
    """``methods`` (name -> (method, ACL action on the Cluster resource)) as ``grpc.aio``
    handlers of ``service``, the one shape of every StrataMQ admin service: a JSON object in,
    the caller authorized, the method refused on a SLAVE when it changes what the slave copies
    from its master, run in the broker's executor (``run``), a JSON object out.

    Errors, the same for every method: ``MetadataError`` by kind (INVALID_ARGUMENT, NOT_FOUND,
    ALREADY_EXISTS, FAILED_PRECONDITION); a ``BrokerError`` UNAUTHORIZED -> UNAUTHENTICATED,
    FORBIDDEN -> PERMISSION_DENIED, any other -> INVALID_ARGUMENT; ``OSError`` (a disk, a
    tier) -> UNAVAILABLE; anything else is logged and answered INTERNAL, never gRPC's
    UNKNOWN without a word. The methods named in ``with_call`` get the ``Call`` too (for
    an ACL check of their own, on the resource they read)."""

    def make(name: str, method: JsonMethod, action: str) -> grpc.RpcMethodHandler:
        def work(request: bytes, call: Call) -> bytes:
            req = _loads(request)
            broker.lookup.authorize(call, "Cluster", action)
            refusal = broker.replication.refusal(name) if broker.replication else None
            if refusal is not None:  # a slave's topics and groups are its master's
                raise MetadataError("precondition", refusal)
            return _dumps(method(req, call) if name in with_call else method(req))

        async def handle(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            try:
                return await run(work, request, call_of(context))
            except MetadataError as exc:
                code, message = _KIND_CODES[exc.kind], str(exc)
            except BrokerError as exc:
                code = (grpc.StatusCode.UNAUTHENTICATED if exc.code == pb.Code.UNAUTHORIZED
                        else grpc.StatusCode.PERMISSION_DENIED if exc.code == pb.Code.FORBIDDEN
                        else grpc.StatusCode.INVALID_ARGUMENT)
                message = exc.message
            except OSError as exc:  # its text names the file and the system's reason
                code, message = grpc.StatusCode.UNAVAILABLE, f"{name}: {exc}"
            except Exception:
                log.exception("%s/%s failed", service, name)
                code, message = grpc.StatusCode.INTERNAL, (
                    f"{name} failed inside the broker (an internal error, logged with its "
                    "details at the broker)")
            await context.abort(code, message, trailing_metadata=(ANSWERED,))
            raise AssertionError("unreachable")  # context.abort raises

        return grpc.unary_unary_rpc_method_handler(handle)

    return grpc.method_handlers_generic_handler(
        service, {name: make(name, method, action) for name, (method, action) in methods.items()})
