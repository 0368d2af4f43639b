"""The NameServer's route table: which brokers are alive and which topics they serve.

RocketMQ's ``RouteInfoManager``, as pure state: registrations, unregistrations, expiry and the
route documents clients read (``TopicRouteData``, ``ClusterInfo``, ``TopicList``), all as
plain dicts ready for JSON. Time is passed in (``now_ms``), so expiry is tested without
waiting. The JSON field names are RocketMQ's (``QueueData``, ``BrokerData``,
``TopicRouteData``); ``brokerAddrs`` keys (broker ids) are written as JSON strings, which both
the Java client (fastjson) and ali-ons (JSON2) read.

One difference, made visible here: a master's registration carries its whole topic table, and
a topic missing from it (deleted on the broker) loses that broker's route at once. RocketMQ 5
keeps it until ``DELETE_TOPIC_IN_NAMESRV`` (StrataMQ's broker deletes topics without that
call), unless ``deleteTopicWithBrokerRegistration``, which is what this does.

Thread-safety: none; the NameServer calls it from its one event loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["BROKER_CHANNEL_EXPIRED_MS", "BrokerLive", "Registration", "RouteTable"]

MASTER_ID = 0
# RouteInfoManager.DEFAULT_BROKER_CHANNEL_EXPIRED_TIME: a broker silent this long is dropped.
BROKER_CHANNEL_EXPIRED_MS = 120_000


@dataclass
class Registration:
    """What a REGISTER_BROKER carries (header fields and body)."""

    cluster: str
    broker_addr: str
    broker_name: str
    broker_id: int
    ha_server_addr: str = ""
    topics: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> TopicConfig
    data_version: dict[str, Any] = field(default_factory=dict)
    timeout_ms: int = BROKER_CHANNEL_EXPIRED_MS
    channel: object = None  # the connection it came on: its close unregisters the broker


@dataclass
class BrokerLive:
    """RocketMQ's ``BrokerLiveInfo``."""

    last_update_ms: int
    timeout_ms: int
    data_version: dict[str, Any]
    ha_server_addr: str
    channel: object
    broker_name: str
    broker_id: int


class RouteTable:
    """Brokers, clusters and topic queues, as RocketMQ's NameServer keeps them."""

    def __init__(self) -> None:
        self.topic_queues: dict[str, dict[str, dict[str, Any]]] = {}  # topic -> name -> Q
        self.brokers: dict[str, dict[str, Any]] = {}  # broker name -> BrokerData
        self.clusters: dict[str, set[str]] = {}  # cluster -> broker names
        self.live: dict[tuple[str, str], BrokerLive] = {}  # (cluster, addr) -> liveness

    # -- changes ----------------------------------------------------------------------------------

    def register(self, reg: Registration, now_ms: int) -> dict[str, str]:
        """Record a registration; returns the response header (``masterAddr``,
        ``haServerAddr``) a slave learns its master from."""
        self.clusters.setdefault(reg.cluster, set()).add(reg.broker_name)
        data = self.brokers.setdefault(reg.broker_name, {
            "cluster": reg.cluster, "brokerName": reg.broker_name, "brokerAddrs": {},
            "enableActingMaster": False})
        data["cluster"] = reg.cluster
        addrs: dict[str, str] = data["brokerAddrs"]
        # One address, one role: a slave promoted (or demoted) replaces its old id.
        for broker_id, addr in list(addrs.items()):
            if addr == reg.broker_addr and broker_id != str(reg.broker_id):
                del addrs[broker_id]
        first = addrs.get(str(reg.broker_id)) != reg.broker_addr
        addrs[str(reg.broker_id)] = reg.broker_addr
        key = (reg.cluster, reg.broker_addr)
        previous = self.live.get(key)
        if reg.broker_id == MASTER_ID and (
                first or previous is None or previous.data_version != reg.data_version):
            self._set_topics(reg.broker_name, reg.topics)
        self.live[key] = BrokerLive(now_ms, reg.timeout_ms, reg.data_version,
                                    reg.ha_server_addr, reg.channel, reg.broker_name,
                                    reg.broker_id)
        header: dict[str, str] = {}
        if reg.broker_id != MASTER_ID:
            master = addrs.get(str(MASTER_ID))
            if master is not None:
                header["masterAddr"] = master
                master_live = self.live.get((reg.cluster, master))
                if master_live is not None and master_live.ha_server_addr:
                    header["haServerAddr"] = master_live.ha_server_addr
        return header

    def _set_topics(self, broker_name: str, topics: dict[str, dict[str, Any]]) -> None:
        for topic, cfg in topics.items():
            self.topic_queues.setdefault(topic, {})[broker_name] = {
                "brokerName": broker_name,
                "readQueueNums": int(cfg.get("readQueueNums", 0)),
                "writeQueueNums": int(cfg.get("writeQueueNums", 0)),
                "perm": int(cfg.get("perm", 6)),
                "topicSysFlag": int(cfg.get("topicSysFlag", 0)),
            }
        for topic in [t for t, queues in self.topic_queues.items()
                      if broker_name in queues and t not in topics]:
            self._drop_queues(topic, broker_name)

    def _drop_queues(self, topic: str, broker_name: str) -> None:
        queues = self.topic_queues.get(topic)
        if queues is not None:
            queues.pop(broker_name, None)
            if not queues:
                del self.topic_queues[topic]

    def unregister(self, cluster: str, broker_addr: str, broker_name: str,
                   broker_id: int) -> None:
        self.live.pop((cluster, broker_addr), None)
        data = self.brokers.get(broker_name)
        if data is not None:
            addrs = data["brokerAddrs"]
            if addrs.get(str(broker_id)) == broker_addr:
                del addrs[str(broker_id)]
            if not addrs:
                del self.brokers[broker_name]
                names = self.clusters.get(cluster)
                if names is not None:
                    names.discard(broker_name)
                    if not names:
                        del self.clusters[cluster]
                for topic in [t for t, q in self.topic_queues.items() if broker_name in q]:
                    self._drop_queues(topic, broker_name)

    def expire(self, now_ms: int) -> list[tuple[str, str]]:
        """Drop brokers silent past their timeout; returns their (cluster, address)."""
        gone = [key for key, live in self.live.items()
                if live.last_update_ms + live.timeout_ms < now_ms]
        for key in gone:
            live = self.live[key]
            self.unregister(key[0], key[1], live.broker_name, live.broker_id)
        return gone

    def channel_closed(self, channel: object) -> list[tuple[str, str]]:
        """A broker's connection closed: drop what registered on it (``onChannelDestroy``)."""
        gone = [key for key, live in self.live.items() if live.channel is channel]
        for key in gone:
            live = self.live[key]
            self.unregister(key[0], key[1], live.broker_name, live.broker_id)
        return gone

    def touch(self, cluster: str, broker_addr: str, now_ms: int) -> None:
        live = self.live.get((cluster, broker_addr))
        if live is not None:
            live.last_update_ms = now_ms

    # -- answers ----------------------------------------------------------------------------------

    def data_version(self, cluster: str, broker_addr: str) -> dict[str, Any] | None:
        live = self.live.get((cluster, broker_addr))
        return None if live is None else live.data_version

    def topic_route(self, topic: str) -> dict[str, Any] | None:
        """``TopicRouteData`` for a topic, or None when no live broker serves it."""
        queues = self.topic_queues.get(topic)
        if not queues:
            return None
        brokers = [_copy_broker(self.brokers[name]) for name in sorted(queues)
                   if name in self.brokers]
        if not brokers:
            return None
        return {"brokerDatas": brokers, "filterServerTable": {},
                "queueDatas": [dict(queues[name]) for name in sorted(queues)]}

    def cluster_info(self) -> dict[str, Any]:
        """``ClusterInfo``: every broker's addresses, and each cluster's broker names."""
        return {"brokerAddrTable": {name: _copy_broker(data)
                                    for name, data in sorted(self.brokers.items())},
                "clusterAddrTable": {cluster: sorted(names)
                                     for cluster, names in sorted(self.clusters.items())}}

    def topics_of_cluster(self, cluster: str) -> dict[str, Any]:
        """``TopicList`` of the topics some broker of ``cluster`` serves."""
        names = self.clusters.get(cluster, set())
        return {"topicList": sorted(t for t, q in self.topic_queues.items()
                                    if any(n in names for n in q))}

    def delete_topic(self, topic: str, cluster: str = "") -> None:
        """Forget a topic's queues (of ``cluster``'s brokers only, when named)."""
        queues = self.topic_queues.get(topic, {})
        names = self.clusters.get(cluster, set()) if cluster else set(queues)
        for name in [n for n in queues if n in names]:
            self._drop_queues(topic, name)

    def topic_list(self) -> dict[str, Any]:
        """``TopicList``: every topic some live broker serves."""
        return {"topicList": sorted(self.topic_queues)}


def _copy_broker(data: dict[str, Any]) -> dict[str, Any]:
    return {**data, "brokerAddrs": dict(sorted(data["brokerAddrs"].items(),
                                               key=lambda item: int(item[0])))}
