"""The NameServer: ``stratamq namesrv start``, RocketMQ's route directory over remoting.

Handlers after RocketMQ's ``DefaultRequestProcessor`` / ``ClientRequestProcessor`` over a
``routes.RouteTable``: ``REGISTER_BROKER``, ``UNREGISTER_BROKER``, ``QUERY_DATA_VERSION``,
``GET_ROUTEINFO_BY_TOPIC``, ``GET_BROKER_CLUSTER_INFO``,
``GET_ALL_TOPIC_LIST_FROM_NAMESERVER``, ``GET_KV_CONFIG`` (plus ``PUT_KV_CONFIG``,
``DELETE_KV_CONFIG``, ``GET_KVLIST_BY_NAMESPACE``, ``GET_TOPICS_BY_CLUSTER`` and
``DELETE_TOPIC_IN_NAMESRV``, which mqadmin uses; KV config held in memory only). Brokers
silent for their timeout (120 s) are dropped by a scan every 5 s, and so are brokers whose
registering connection closes, as RocketMQ's ``BrokerHousekeepingService`` does.

With the cluster on etcd (``--etcd``), ``GET_ROUTEINFO_BY_TOPIC``, ``GET_BROKER_CLUSTER_INFO``
and the topic lists answer from the cluster's route table in etcd (``etcd_routes.py``), so
every NameServer answers alike; brokers registering by ``REGISTER_BROKER`` are still served
(a topic etcd does not know is answered from them).

Registrations must be uncompressed JSON (``compressed=false``, RocketMQ's
``compressedRegister`` default); a compressed one is refused with SYSTEM_ERROR saying so.

Thread-safety: everything on the event loop the server runs on.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import zlib
from collections.abc import Callable
from typing import Any

from stratamq.remoting.codec import RemotingCommand
from stratamq.remoting.codes import RequestCode, ResponseCode
from stratamq.remoting.etcd_routes import EtcdRoutes
from stratamq.remoting.routes import BROKER_CHANNEL_EXPIRED_MS, Registration, RouteTable
from stratamq.remoting.transport import Connection, Handler, RemotingServer

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_NAMESRV_PORT", "NameServer", "to_json"]

DEFAULT_NAMESRV_PORT = 9876
_SCAN_INTERVAL_S = 5.0  # RocketMQ's scanNotActiveBroker period
PUT_KV_CONFIG, DELETE_KV_CONFIG = 100, 102
DELETE_TOPIC_IN_NAMESRV, GET_KVLIST_BY_NAMESPACE, GET_TOPICS_BY_CLUSTER = 216, 219, 224
GET_SYSTEM_TOPIC_LIST_FROM_NS = 304
_APPLY_TOPIC_URL = "\nSee http://rocketmq.apache.org/docs/faq/ for further details."


def to_json(doc: Any) -> bytes:
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()


def _bad(request: RemotingCommand, text: str) -> RemotingCommand:
    return request.response(ResponseCode.SYSTEM_ERROR, text)


class NameServer:
    """Route table, KV config and the remoting handlers over them. ``clock()``: ms now."""

    def __init__(self, clock: Callable[[], int] | None = None,
                 cluster: EtcdRoutes | None = None) -> None:
        self.routes = RouteTable()
        self.cluster = cluster  # the cluster's routes in etcd, if given
        self.kv: dict[str, dict[str, str]] = {}
        self.clock = clock or (lambda: int(time.time() * 1000))
        self.server: RemotingServer | None = None
        self._scan: asyncio.Task[None] | None = None

    @property
    def handlers(self) -> dict[int, Handler]:
        return {RequestCode.REGISTER_BROKER: self.register_broker,
                RequestCode.UNREGISTER_BROKER: self.unregister_broker,
                RequestCode.QUERY_DATA_VERSION: self.query_data_version,
                RequestCode.GET_ROUTEINFO_BY_TOPIC: self.route_by_topic,
                RequestCode.GET_BROKER_CLUSTER_INFO: self.cluster_info,
                RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: self.topic_list,
                RequestCode.GET_KV_CONFIG: self.get_kv,
                PUT_KV_CONFIG: self.put_kv, DELETE_KV_CONFIG: self.delete_kv,
                GET_KVLIST_BY_NAMESPACE: self.kv_list,
                DELETE_TOPIC_IN_NAMESRV: self.delete_topic,
                GET_TOPICS_BY_CLUSTER: self.topics_of_cluster,
                GET_SYSTEM_TOPIC_LIST_FROM_NS: self.system_topics}

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self, host: str = "127.0.0.1", port: int = DEFAULT_NAMESRV_PORT) -> int:
        self.server = RemotingServer(self.handlers, on_close=self._closed)
        bound = await self.server.start(host, port)
        self._scan = asyncio.get_running_loop().create_task(self._scan_loop())
        return bound

    async def close(self) -> None:
        if self.cluster is not None:
            self.cluster.close()
        if self._scan is not None:
            self._scan.cancel()
        if self.server is not None:
            await self.server.close()

    async def _scan_loop(self) -> None:
        while True:
            await asyncio.sleep(_SCAN_INTERVAL_S)
            for cluster, addr in self.routes.expire(self.clock()):
                log.warning("namesrv: broker %s of %s expired (no registration for %d ms)",
                            addr, cluster, BROKER_CHANNEL_EXPIRED_MS)

    def _closed(self, conn: Connection) -> None:
        for cluster, addr in self.routes.channel_closed(conn):
            log.info("namesrv: broker %s of %s gone (its connection closed)", addr, cluster)

    # -- handlers -------------------------------------------------------------------------------

    async def register_broker(self, request: RemotingCommand,
                              conn: Connection) -> RemotingCommand:
        h = request.ext_fields
        if h.get("compressed") == "true":
            return _bad(request, "compressed broker registrations are not supported; set "
                        "compressedRegister=false")
        crc = h.get("bodyCrc32", "0")
        if crc not in ("", "0") and str(zlib.crc32(request.body) & 0x7FFFFFFF) != crc:
            return _bad(request, "crc32 not match")
        try:
            body = json.loads(request.body) if request.body else {}
            wrapper = body.get("topicConfigSerializeWrapper") or {}
            reg = Registration(
                cluster=h["clusterName"], broker_addr=h["brokerAddr"],
                broker_name=h["brokerName"], broker_id=int(h.get("brokerId", "0")),
                ha_server_addr=h.get("haServerAddr", ""),
                topics=dict(wrapper.get("topicConfigTable") or {}),
                data_version=dict(wrapper.get("dataVersion") or {}),
                timeout_ms=int(h.get("heartbeatTimeoutMillis") or BROKER_CHANNEL_EXPIRED_MS),
                channel=conn)
        except (KeyError, ValueError, TypeError, AttributeError) as exc:
            return _bad(request, f"bad registration: {type(exc).__name__}: {exc}")
        header = self.routes.register(reg, self.clock())
        return request.response(ResponseCode.SUCCESS, None, header)

    async def unregister_broker(self, request: RemotingCommand,
                                conn: Connection) -> RemotingCommand:
        h = request.ext_fields
        try:
            self.routes.unregister(h["clusterName"], h["brokerAddr"], h["brokerName"],
                                   int(h.get("brokerId", "0")))
        except (KeyError, ValueError) as exc:
            return _bad(request, f"bad request: {exc}")
        return request.response(ResponseCode.SUCCESS)

    async def query_data_version(self, request: RemotingCommand,
                                 conn: Connection) -> RemotingCommand:
        h = request.ext_fields
        cluster, addr = h.get("clusterName", ""), h.get("brokerAddr", "")
        try:
            theirs = json.loads(request.body) if request.body else None
        except ValueError:
            return _bad(request, "the body is not a DataVersion")
        ours = self.routes.data_version(cluster, addr)
        changed = ours is None or ours != theirs
        self.routes.touch(cluster, addr, self.clock())
        return request.response(ResponseCode.SUCCESS, None,
                                {"changed": "true" if changed else "false"},
                                to_json(ours) if ours is not None else b"")

    async def route_by_topic(self, request: RemotingCommand,
                             conn: Connection) -> RemotingCommand:
        topic = request.ext_fields.get("topic", "")
        route = self.cluster.topic_route(topic) if self.cluster is not None else None
        if route is None:
            route = self.routes.topic_route(topic)
        if route is None:
            return request.response(ResponseCode.TOPIC_NOT_EXIST,
                                    "No topic route info in name server for the topic: "
                                    f"{topic}{_APPLY_TOPIC_URL}")
        return request.response(ResponseCode.SUCCESS, body=to_json(route))

    async def cluster_info(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        info = self.routes.cluster_info()
        if self.cluster is not None:
            info = self.cluster.merge_cluster_info(info)
        return request.response(ResponseCode.SUCCESS, body=to_json(info))

    async def topic_list(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        topics = self.routes.topic_list()
        if self.cluster is not None:
            topics = {"topicList": sorted(set(topics["topicList"]) | self.cluster.topics())}
        return request.response(ResponseCode.SUCCESS, body=to_json(topics))

    async def get_kv(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        namespace = request.ext_fields.get("namespace", "")
        key = request.ext_fields.get("key", "")
        value = self.kv.get(namespace, {}).get(key)
        if value is None:
            return request.response(ResponseCode.QUERY_NOT_FOUND,
                                    f"No config item, Namespace: {namespace} Key: {key}")
        return request.response(ResponseCode.SUCCESS, None, {"value": value})

    async def put_kv(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        h = request.ext_fields
        if not h.get("namespace") or not h.get("key"):
            return _bad(request, "namespace or key is null")
        self.kv.setdefault(h["namespace"], {})[h["key"]] = h.get("value", "")
        return request.response(ResponseCode.SUCCESS)

    async def delete_kv(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        h = request.ext_fields
        self.kv.get(h.get("namespace", ""), {}).pop(h.get("key", ""), None)
        return request.response(ResponseCode.SUCCESS)

    async def kv_list(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        namespace = request.ext_fields.get("namespace", "")
        table = self.kv.get(namespace)
        if not table:
            return request.response(ResponseCode.QUERY_NOT_FOUND,
                                    f"No config item, Namespace: {namespace}")
        return request.response(ResponseCode.SUCCESS, body=to_json({"table": table}))

    async def delete_topic(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        self.routes.delete_topic(request.ext_fields.get("topic", ""),
                                 request.ext_fields.get("clusterName", ""))
        return request.response(ResponseCode.SUCCESS)

    async def topics_of_cluster(self, request: RemotingCommand, conn: Connection
                                ) -> RemotingCommand:
        cluster = request.ext_fields.get("cluster", "")
        topics = self.routes.topics_of_cluster(cluster)
        if self.cluster is not None and cluster == self.cluster.cluster:
            topics = {"topicList": sorted(set(topics["topicList"]) | self.cluster.topics())}
        return request.response(ResponseCode.SUCCESS, body=to_json(topics))

    async def system_topics(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        """RouteInfoManager.getSystemTopicList: every cluster name and broker name (each is a
        topic RocketMQ's brokers create), with one broker's address; the Dashboard marks the
        topics listed here as system topics."""
        info = self.routes.cluster_info()
        if self.cluster is not None:
            info = self.cluster.merge_cluster_info(info)
        names = [n for cluster, brokers in info["clusterAddrTable"].items()
                 for n in (cluster, *brokers)]
        doc: dict[str, Any] = {"topicList": names}
        for data in info["brokerAddrTable"].values():
            if data.get("brokerAddrs"):
                doc["brokerAddr"] = next(iter(data["brokerAddrs"].values()))
                break
        return request.response(ResponseCode.SUCCESS, body=to_json(doc))
