"""The NameServer's view of a cluster on etcd: RocketMQ's route documents from the cluster's
route table (``stratamq/cluster/routes.py``), so every NameServer answers alike.

``TopicRouteData`` for a topic: a ``QueueData`` per group that serves it and a ``BrokerData``
per such group whose ``brokerAddrs`` name the group's master under id 0 and its live slaves
under their own ids, at their remoting addresses (what 4.x clients connect to; a broker that
announced none, remoting being off, is left out). A group with no
master keeps its slaves, as RocketMQ's NameServer keeps a slave whose master is gone: clients
read from them and send elsewhere.

Thread-safety: the table is kept by its own threads; these calls only read it.
"""

from __future__ import annotations

from typing import Any

from stratamq.cluster.routes import MASTER_ID, GroupRoute, RouteTable

__all__ = ["EtcdRoutes"]


class EtcdRoutes:
    """Routes of ``cluster`` from etcd (``table``), as the NameServer's documents."""

    def __init__(self, table: RouteTable, cluster: str, closer: Any = None) -> None:
        self.table = table
        self.cluster = cluster
        self._closer = closer

    def close(self) -> None:
        self.table.stop()
        if self._closer is not None:
            self._closer.close()

    def _broker_data(self, group: GroupRoute) -> dict[str, Any] | None:
        addrs = {}
        if group.master is not None and group.master.remoting_address:
            addrs[str(MASTER_ID)] = group.master.remoting_address
        for slave in group.slaves:
            if slave.remoting_address:
                addrs[str(slave.broker_id)] = slave.remoting_address
        if not addrs:
            return None
        return {"cluster": self.cluster, "brokerName": group.name, "brokerAddrs": addrs,
                "enableActingMaster": False}

    def topic_route(self, topic: str) -> dict[str, Any] | None:
        """``TopicRouteData``, or None when no reachable group serves ``topic``."""
        queues, brokers = [], []
        for group, route in self.table.topic_groups(topic):
            data = self._broker_data(group)
            if data is None:
                continue
            brokers.append(data)
            queues.append({"brokerName": group.name, "readQueueNums": route.read_queue_nums,
                           "writeQueueNums": route.write_queue_nums, "perm": route.perm,
                           "topicSysFlag": 0})
        if not brokers:
            return None
        return {"brokerDatas": brokers, "filterServerTable": {}, "queueDatas": queues}

    def merge_cluster_info(self, info: dict[str, Any]) -> dict[str, Any]:
        """``ClusterInfo`` with the cluster's groups from etcd (over registrations of the same
        broker names)."""
        addr_table = dict(info.get("brokerAddrTable") or {})
        clusters = {name: list(names) for name, names in
                    (info.get("clusterAddrTable") or {}).items()}
        names = set(clusters.get(self.cluster, []))
        for group in self.table.groups():
            data = self._broker_data(group)
            if data is not None:
                addr_table[group.name] = data
                names.add(group.name)
        if names:
            clusters[self.cluster] = sorted(names)
        return {"brokerAddrTable": dict(sorted(addr_table.items())),
                "clusterAddrTable": dict(sorted(clusters.items()))}

    def topics(self) -> set[str]:
        return {t for g in self.table.groups() if self._broker_data(g) is not None
                for t in g.topics}
