"""``QueryRoute`` and ``QueryAssignment`` for a whole cluster on etcd (controller mode).

From the cluster's route table (``stratamq/cluster/routes.py``), as RocketMQ 5's proxy builds
them (``RouteActivity``):

* ``QueryRoute``: for each group serving the topic, its master's queues under broker id 0
  (``MixAll.MASTER_ID``) with the topic's permission, and each live slave's queues under its
  own id, readable only (a client writes to a master only; clients pick ``is_master_broker``
  queues). A group without a master (an election under way) is routed by its slaves alone, so
  a producer's queue choice, and its retry of a failed send, goes to the groups that can
  write. Master queues are interleaved across groups (A0, B0, A1, B1, ...): a client that
  retries a failed send on the next queue of the route (the Python client does) retries on
  another group.
* ``QueryAssignment``: one assignment per group with a master and readable queues (``id -1``:
  a receive pops across all of them), naming the master.

This broker's own group comes from its own topic table (fresher than the watch) and, while it
is the master, the endpoint the client reached it on (right behind NAT too). A topic no group
has is left to the local answer (auto-creation or TOPIC_NOT_FOUND).
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import zip_longest

from rocketmq.grpc_protocol import definition_pb2 as pb

from stratamq.broker.metadata import PERM_READ, PERM_WRITE, TopicConfig
from stratamq.cluster.routes import MASTER_ID, GroupRoute, RouteTable, TopicRoute

__all__ = ["ClusterRoutes"]


def endpoints_of(address: str) -> pb.Endpoints:
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    return pb.Endpoints(scheme=pb.IPv6 if ":" in host else pb.IPv4,
                        addresses=[pb.Address(host=host, port=int(port))])


def _permission(read: bool, write: bool) -> int:
    return {(True, True): pb.READ_WRITE, (True, False): pb.READ,
            (False, True): pb.WRITE}.get((read, write), pb.NONE)


def _queues(topic: str, route: TopicRoute, group: str, broker_id: int,
            endpoints: pb.Endpoints, may_write: bool) -> list[pb.MessageQueue]:
    """The queues of ``topic`` on one broker (queue i readable below readQueueNums, writable
    below writeQueueNums, as the broker's own route numbers them)."""
    out = []
    for qid in range(max(route.read_queue_nums, route.write_queue_nums)):
        readable = qid < route.read_queue_nums and bool(route.perm & PERM_READ)
        writable = may_write and qid < route.write_queue_nums and bool(route.perm & PERM_WRITE)
        out.append(pb.MessageQueue(
            topic=pb.Resource(name=topic), id=qid, permission=_permission(readable, writable),
            broker=pb.Broker(name=group, id=broker_id, endpoints=endpoints),
            accept_message_types=[pb.MessageType.Value(route.message_type)]))
    return out


class ClusterRoutes:
    """Routes of every group; see the module docstring. ``is_master()``: whether this broker
    is its group's master now (its replication role)."""

    def __init__(self, table: RouteTable, group: str, is_master: Callable[[], bool]) -> None:
        self.table = table
        self.group = group
        self.is_master = is_master

    def _groups(self, topic: str, local: TopicConfig | None
                ) -> list[tuple[GroupRoute, TopicRoute]]:
        found = {g.name: (g, r) for g, r in self.table.topic_groups(topic)}
        if local is not None:
            own = next((g for g in self.table.groups() if g.name == self.group),
                       GroupRoute(self.group, None, ()))
            found[self.group] = (own, TopicRoute(local.read_queue_nums, local.write_queue_nums,
                                                 local.perm, local.message_type))
        return [found[name] for name in sorted(found)]

    def _master(self, group: GroupRoute, requested: pb.Endpoints) -> pb.Endpoints | None:
        if group.name == self.group and self.is_master():
            return requested
        return endpoints_of(group.master.endpoint) if group.master is not None else None

    def query_route(self, topic: str, local: TopicConfig | None, requested: pb.Endpoints
                    ) -> list[pb.MessageQueue] | None:
        """The cluster's queues of ``topic``; None when no group routes it (answer locally)."""
        groups = self._groups(topic, local)
        if not groups:
            return None
        masters: list[list[pb.MessageQueue]] = []
        slaves: list[pb.MessageQueue] = []
        for group, route in groups:
            endpoints = self._master(group, requested)
            if endpoints is not None:
                masters.append(_queues(topic, route, group.name, MASTER_ID, endpoints, True))
            for slave in group.slaves:
                slaves.extend(_queues(topic, route, group.name, slave.broker_id,
                                      endpoints_of(slave.endpoint), False))
        interleaved = [q for row in zip_longest(*masters) for q in row if q is not None]
        # Nothing known yet (etcd not read, no master anywhere): the broker's own answer.
        return interleaved + slaves or None

    def query_assignment(self, topic: str, local: TopicConfig | None, requested: pb.Endpoints
                         ) -> list[pb.Assignment] | None:
        """One assignment per group with a master and readable queues; None when no group
        has the topic (answer locally)."""
        groups = self._groups(topic, local)
        if not groups:
            return None
        out = []
        for group, route in groups:
            endpoints = self._master(group, requested)
            if endpoints is None or not route.perm & PERM_READ or route.read_queue_nums <= 0:
                continue
            out.append(pb.Assignment(message_queue=pb.MessageQueue(
                topic=pb.Resource(name=topic), id=-1,
                permission=_permission(True, bool(route.perm & PERM_WRITE)),
                broker=pb.Broker(name=group.name, id=MASTER_ID, endpoints=endpoints),
                accept_message_types=[pb.MessageType.Value(route.message_type)])))
        return out
