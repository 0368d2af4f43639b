"""Routes, heartbeats, telemetry settings and the table of connected clients.

``ClientService`` answers ``QueryRoute``, ``Heartbeat``, ``NotifyClientTermination``, the
``settings`` commands of a ``Telemetry`` stream and ``QueryAssignment``; ``ClientRegistry``
remembers who heartbeated (admin's connections, metrics' client gauge). No gRPC here: the
adapter hands in the request and a ``Call``.

Thread-safety: any thread; the registry's table is guarded by its own lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc

from stratamq.broker.cluster_routes import ClusterRoutes
from stratamq.broker.engine import now_ms
from stratamq.broker.errors import BrokerError
from stratamq.broker.lookup import Lookup
from stratamq.broker.metadata import TopicConfig
from stratamq.broker.ports import Call
from stratamq.broker.validate import client_type_name

__all__ = ["ClientRegistry", "ClientService", "ok_status"]

Code = pb.Code
Route = Callable[[pb.Endpoints], tuple[pb.Endpoints, bool]]


def ok_status(code: int = Code.OK, message: str = "OK") -> pb.Status:
    return pb.Status(code=code, message=message)


class ClientRegistry:
    """Clients that heartbeated, by client id: group, type, address, last seen.

    A client is dropped when it says it is leaving (NotifyClientTermination) or when it has
    not heartbeated for ``expire_ms`` (``channelExpiredTimeout``, 120 s: RocketMQ's
    ``ConsumerManager.scanNotActiveChannel``), checked whenever the table is read."""

    def __init__(self, expire_ms: int = 120_000) -> None:
        self._clients: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self.expire_ms = expire_ms

    def __len__(self) -> int:
        return len(self.live())

    def note(self, call: Call, group: str, client_type: str) -> None:
        with self._lock:
            self._clients[call.client_id] = {"client_id": call.client_id, "group": group,
                                             "type": client_type, "peer": call.peer,
                                             "last_seen": now_ms()}  # fmt: skip

    def forget(self, call: Call) -> None:
        with self._lock:
            self._clients.pop(call.client_id, None)

    def live(self, group: str | None = None) -> list[dict[str, Any]]:
        """Clients of ``group`` (or all) not expired; each with ``last_seen`` (epoch ms) and
        ``last_seen_ago_ms``."""
        now = now_ms()
        cutoff = now - self.expire_ms
        with self._lock:
            for client_id in [k for k, c in self._clients.items() if c["last_seen"] < cutoff]:
                del self._clients[client_id]
            return [{**c, "last_seen_ago_ms": now - c["last_seen"]}
                    for c in self._clients.values() if group is None or c["group"] == group]


class ClientService:
    """Route, heartbeat, settings and assignment answers; handed the lookups, the registry,
    where clients reach the broker and the two settings a producer is told."""

    def __init__(self, lookup: Lookup, registry: ClientRegistry, broker_name: str,
                 advertised: tuple[str, int], max_message_size: int,
                 route: Route | None = None, cluster: ClusterRoutes | None = None) -> None:
        self.lookup = lookup
        # Controller mode: every group of the cluster (broker/cluster_routes.py), else None.
        self.cluster = cluster
        # Replication's say in routes (broker/replication.py): the endpoints to name and
        # whether queues may be written (a slave names its master, or itself read-only).
        self.route: Route = route or (lambda endpoints: (endpoints, True))
        self.registry = registry
        self.broker_name = broker_name
        self.advertised = advertised
        self.max_message_size = max_message_size
        self.config = lookup.config

    def _endpoints(self, requested: pb.Endpoints | None) -> pb.Endpoints:
        if requested is not None and requested.addresses:
            return requested  # the address the client reached us on: right behind NAT too
        host, port = self.advertised
        return pb.Endpoints(scheme=pb.IPv6 if ":" in host else pb.IPv4,
                            addresses=[pb.Address(host=host, port=port)])

    def _message_queue(self, topic: TopicConfig, qid: int, endpoints: pb.Endpoints,
                       may_write: bool = True) -> pb.MessageQueue:
        readable = qid < topic.read_queue_nums and topic.perm & 4
        writable = may_write and qid < topic.write_queue_nums and topic.perm & 2
        perm = {(True, True): pb.READ_WRITE, (True, False): pb.READ,
                (False, True): pb.WRITE}.get((bool(readable), bool(writable)), pb.NONE)
        return pb.MessageQueue(
            topic=pb.Resource(name=topic.name), id=qid, permission=perm,
            broker=pb.Broker(name=self.broker_name, id=0, endpoints=endpoints),
            accept_message_types=[pb.MessageType.Value(topic.message_type)])

    def query_route(self, request: svc.QueryRouteRequest, call: Call
                    ) -> svc.QueryRouteResponse:
        self.lookup.authorize(call, f"Topic:{request.topic.name}", "Get")
        if self.cluster is not None:
            name = request.topic.name
            try:
                local: TopicConfig | None = self.lookup.topic(name)
            except BrokerError as exc:  # not here: maybe on another group
                if exc.code != Code.TOPIC_NOT_FOUND:
                    raise
                local = None
            queues = self.cluster.query_route(name, local, self._endpoints(request.endpoints))
            if queues is not None:
                return svc.QueryRouteResponse(status=ok_status(), message_queues=queues)
        topic = self.lookup.topic(request.topic.name, create=True)
        endpoints, writable = self.route(self._endpoints(request.endpoints))
        return svc.QueryRouteResponse(status=ok_status(), message_queues=[
            self._message_queue(topic, q, endpoints, writable)
            for q in range(topic.queue_count)])

    def heartbeat(self, request: svc.HeartbeatRequest, call: Call) -> svc.HeartbeatResponse:
        self.lookup.authorize(call, "Cluster", "Get")
        group = request.group.name if request.HasField("group") else ""
        if group and request.client_type != pb.PRODUCER:
            self.lookup.authorize(call, f"Group:{group}", "Sub")
            self.lookup.group(group, call)
        self.registry.note(call, group, client_type_name(request.client_type))
        return svc.HeartbeatResponse(status=ok_status())

    def terminate(self, request: svc.NotifyClientTerminationRequest, call: Call
                  ) -> svc.NotifyClientTerminationResponse:
        self.lookup.authorize(call, "Cluster", "Get")
        self.registry.forget(call)
        return svc.NotifyClientTerminationResponse(status=ok_status())

    def query_assignment(self, request: svc.QueryAssignmentRequest, call: Call
                         ) -> svc.QueryAssignmentResponse:
        _, topic = self.lookup.subscription(call, request.group.name, request.topic.name)
        if self.cluster is not None:
            assignments = self.cluster.query_assignment(topic.name, topic,
                                                        self._endpoints(request.endpoints))
            if assignments:
                return svc.QueryAssignmentResponse(status=ok_status(), assignments=assignments)
        endpoints, writable = self.route(self._endpoints(request.endpoints))
        mq = self._message_queue(topic, 0, endpoints, writable)
        mq.id = -1  # "any queue": a receive pops across all of them
        return svc.QueryAssignmentResponse(status=ok_status(),
                                           assignments=[pb.Assignment(message_queue=mq)])

    def settings(self, s: pb.Settings, call: Call) -> svc.TelemetryCommand:
        """The broker's answer to a client's ``settings`` telemetry command: for a producer
        max body size (``maxMessageSize``), type validation on and an exponential send
        backoff; for a consumer the subscription (``fifo`` when the group consumes orderly),
        batch size, long-polling timeout and the group's retry policy."""
        out = pb.Settings()
        out.CopyFrom(s)
        if s.HasField("publishing"):
            out.publishing.max_body_size = self.max_message_size
            out.publishing.validate_message_type = True
            backoff = out.backoff_policy
            backoff.Clear()
            backoff.max_attempts = 3
            backoff.exponential_backoff.initial.FromMilliseconds(10)
            backoff.exponential_backoff.max.FromMilliseconds(1000)
            backoff.exponential_backoff.multiplier = 2.0
        elif s.HasField("subscription"):
            self.lookup.authorize(call, f"Group:{s.subscription.group.name}", "Sub")
            group = self.lookup.group(s.subscription.group.name, call)
            sub = out.subscription
            meta = self.lookup.meta
            orderly = group.consume_message_orderly or any(
                (t := meta.topic(e.topic.name)) is not None and t.message_type == "FIFO"
                for e in s.subscription.subscriptions)
            sub.fifo = orderly
            sub.receive_batch_size = self.config.receive_batch_size
            wanted = (s.subscription.long_polling_timeout.ToMilliseconds()
                      if s.subscription.HasField("long_polling_timeout") else 30_000)
            sub.long_polling_timeout.FromMilliseconds(
                max(1000, min(wanted, self.config.max_long_polling_time_mills)))
            backoff = out.backoff_policy
            backoff.Clear()
            backoff.max_attempts = group.max_delivery_attempts
            for ms in group.retry_backoff_ms:
                backoff.customized_backoff.next.add().FromMilliseconds(ms)
            self.registry.note(call, group.name, client_type_name(s.client_type))
        out.metric.on = False
        return svc.TelemetryCommand(status=ok_status(), settings=out)
