"""Replication in the broker: the store's ``HAService``, a slave's copy of its master's state,
routes that move readers to the slave while the master is away, status and metrics.

What a broker does by ``brokerRole`` (the store's part is ``stratamq.ha``):

* A master (ASYNC_MASTER, SYNC_MASTER) serves slaves on ``haListenPort``. An ASYNC_MASTER
  whose port is taken logs it and serves without replication (a standalone broker must not
  fail to start because of a port it does not need); a SYNC_MASTER refuses to start.
* A SLAVE copies its master's CommitLog (``HAClient``) and, every ``haStateSyncInterval``
  (3 s by default), its topics, groups, consumer offsets and pop state (cursors, in-flight
  messages, the receipt-handle key) through the master's ``SyncState`` RPC, as RocketMQ's
  SlaveSynchronize does (it runs every 3 s and copies everything at least once a minute).
  It refuses sends (the store answers SERVICE_NOT_AVAILABLE) and changes to topics, groups
  and offsets (``_ADMIN_WRITES``: they are its master's, copied every interval).

Routes (``QueryRoute``): a master answers as always. A slave whose link to its master is up
answers with the master's client endpoint (``haMasterEndpoint``), so clients that reached the
slave go to the master; while the link is down it answers with its own endpoint and READ-only
queues, broker id 0 as RocketMQ 5's slave-acting-master does, so consumers (which read only
from broker id 0) keep consuming from the slave and producers find no writable queue. A
client configured with both endpoints (``master;slave``) reaches the slave through gRPC's
fail-over when the master is down, and is sent back once the master returns.

The window: a consumer that moves to the slave resumes from the state the slave last copied,
at most ``haStateSyncInterval`` old (plus one RPC): messages acknowledged on the master in
that window may be delivered again; none is lost (at-least-once). State is copied one way:
acknowledgements made on the slave while the master is down are not copied back, so after
the master returns those messages may be delivered once more.

``SERVICE`` (``/stratamq.admin.v1.Replication/<Method>``, JSON as the admin service):
``HaStatus {}`` (ACL: Cluster Get) -> the ``HAService`` runtime info, plus ``"stateSync"``
on a slave; ``SyncState {}`` (ACL: Cluster Update, it carries the receipt-handle key) ->
``{"metadata": {"topics", "groups"}, "popState": {...}, "deletedTopics": {topic: cutoff},
"lineage": ...}`` (a master's; in controller mode also a slave's
waiting for an election: a planned switch's old master, copied once more by the broker
taking over, ``take_over_state``). A slave deletes a topic's queues only when its master lists
the deletion, never because the topic is missing from the master's configuration, and copies
nothing from a master whose CommitLog is not of its own lineage (a wiped or replaced master:
``stratamq.ha.protocol.judge_lineage``; ``stratamq ha reseed`` is the way to follow it).

Thread-safety: the sync thread alone writes the slave's metadata and pop state from the
master; ``route`` and the RPCs read plain attributes from gRPC threads.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
from prometheus_client.core import GaugeMetricFamily
from rocketmq.grpc_protocol import definition_pb2 as pb

from stratamq.broker.compaction_topics import plug
from stratamq.broker.metadata import MetadataError
from stratamq.broker.state_sync import SERVICE, StateSync
from stratamq.broker.tls import peer_endpoint
from stratamq.client.admin import AdminClient
from stratamq.compaction.service import CompactionStore
from stratamq.config import BrokerRole, StoreConfig
from stratamq.ha import HAConnectionState, HAService
from stratamq.ha.message_replication import CompactionGate, CompactionReplicator, GrpcPullSource
from stratamq.store.message_store import MessageStore
from stratamq.store.results import PutMessageStatus

if TYPE_CHECKING:
    from stratamq.broker.admin import AdminParts
    from stratamq.broker.master_duties import MasterDuties
    from stratamq.broker.metadata import MetadataStore
    from stratamq.broker.pop_state import PopState
    from stratamq.config import BrokerConfig

__all__ = ["SERVICE", "BrokerReplication", "ReplicationParts", "master_endpoint", "plug_compaction"]

log = logging.getLogger(__name__)

_ADMIN_WRITES = frozenset({"CreateTopic", "UpdateTopic", "DeleteTopic", "CreateGroup",
                           "UpdateGroup", "DeleteGroup", "ResetOffset"})


def master_endpoint(ha_master_endpoint: str, ha_master_address: str) -> str:
    """The master's client endpoint: ``haMasterEndpoint``, else ``haMasterAddress``'s host and
    port - 1 (RocketMQ pairs haListenPort = listenPort + 1)."""
    if ha_master_endpoint:
        return ha_master_endpoint
    host, _, port = ha_master_address.rpartition(":")
    return f"{host}:{int(port) - 1}"


def plug_compaction(store: MessageStore, config: StoreConfig, meta: MetadataStore
                    ) -> tuple[CompactionStore | None, CompactionGate | None]:
    """The broker's compaction store plugged into ``store`` (before it opens), and on a SLAVE
    the gate in front of its dispatch (``ha/message_replication.py``): a slave's compaction
    queues are rebuilt by pulling from the master, then follow its own CommitLog. (None,
    None) when ``enableCompaction`` is off."""
    if config.broker_role is not BrokerRole.SLAVE or not config.enable_compaction:
        return plug(store, config, meta), None
    compaction = CompactionStore(config, meta)
    def local_end(topic: str, queue_id: int) -> int:
        queue = store.cq_stores[0].find(topic, queue_id)
        return queue.max_offset() if queue is not None else 0

    gate = CompactionGate(compaction, meta, local_end)
    store.add_dispatcher(gate)
    store.add_read_source(compaction, first=True)
    return compaction, gate


def _endpoints(host: str, port: int) -> pb.Endpoints:
    return pb.Endpoints(scheme=pb.IPv6 if ":" in host else pb.IPv4,
                        addresses=[pb.Address(host=host, port=port)])


@dataclass
class ReplicationParts:
    """What replication uses of a broker (never the ``Broker``): its settings, store,
    metadata and pop state (a slave's copy of its master's), compaction store and gate,
    metrics, the HA listen host and the endpoint clients reach (read per call)."""

    config: BrokerConfig
    store_config: StoreConfig
    store: MessageStore
    meta: MetadataStore
    state: PopState
    listen_host: str
    compaction: CompactionStore | None
    compaction_gate: CompactionGate | None
    metrics: Any
    advertised_of: Callable[[], tuple[str, int]]
    # In controller mode, the broker's cluster node (stratamq/cluster/node.py), made after
    # replication starts: read per call.
    cluster_of: Callable[[], Any] | None = None
    # Controller mode: the master-only duties a role switch starts and stops
    # (``broker/master_duties.py``), and the timer's ``timercheck`` as a master sends it in
    # ``SyncState`` and as a slave keeps it (``master_duties.timer_check_state``).
    duties: MasterDuties | None = None
    timer_check: tuple[Callable[[], Any], Callable[[Any], None]] | None = None

    @property
    def advertised(self) -> tuple[str, int]:
        return self.advertised_of()

    @property
    def cluster(self) -> Any:
        return self.cluster_of() if self.cluster_of is not None else None


class BrokerReplication:
    """Replication for one broker; see the module docstring."""

    def __init__(self, broker: ReplicationParts) -> None:
        self.b = broker
        cfg = broker.store_config
        self.role = cfg.broker_role
        self.ha = HAService.for_store(broker.store, host=broker.listen_host)
        self.sync: StateSync | None = None
        self.replicator: CompactionReplicator | None = None
        self.error = ""
        self.master_endpoint = (master_endpoint(cfg.ha_master_endpoint, cfg.ha_master_address)
                                if self.is_slave and cfg.ha_master_address else "")
        self._applying = threading.Lock()  # one copy of a master's state applied at a time

    @property
    def is_slave(self) -> bool:
        return self.role is BrokerRole.SLAVE

    @property
    def waiting_for_election(self) -> bool:
        """Controller mode before this broker knows its group's master: no link at all."""
        return self.is_slave and not self.b.store_config.ha_master_address

    def start(self) -> None:
        if not self.waiting_for_election:
            self._start_parts()
        registry = getattr(self.b.metrics, "registry", None)
        if registry is not None:
            registry.register(_ReplicationCollector(self, self.b.metrics.node))

    def switch_role(self, role: BrokerRole, master_ha_address: str = "",
                    master_endpoint: str = "", epoch: int | None = None,
                    acks_alone: Callable[[], bool] | None = None) -> None:
        """Controller mode (``stratamq/cluster``): become ``role`` now. A master starts the
        cluster's ``epoch`` at its log's end; a slave follows ``master_ha_address`` (its
        master's client endpoint ``master_endpoint`` for state), cutting its log back where
        it differs (the epoch file's rule). ``acks_alone``: whether a master's put may be
        acknowledged without a slave now (its SyncStateSet is itself alone). The master-only
        duties (``master_duties.py``) stop first and start again once a master is ready."""
        duties = self.b.duties
        if duties is not None:
            duties.stop()
        self._stop_parts()
        store = self.b.store
        self.ha.forget_put_waiter(store.put_waiters)
        if role is BrokerRole.SLAVE:
            # Dispatch stays where it may go now (a master's confirm offset, or what the store
            # opened with: the checkpoint's) until the HA link has the log in step with the
            # new master's, cut back where it differs: a tail no slave confirmed is read by no
            # consumer before the cut. In step, a slave's dispatch is not bounded.
            store.hold_dispatch_where_bound()
        else:
            store.set_dispatch_bound(None)
        if role is not BrokerRole.SLAVE and self.role is BrokerRole.SLAVE:
            store.recover_topic_queue_table()  # its copies assigned no queue offsets
        cfg = self.b.store_config  # the store's own object: its puts check the role
        cfg.broker_role = role
        cfg.ha_master_address = master_ha_address
        cfg.ha_master_endpoint = master_endpoint
        self.role = role
        self.error = ""
        self.master_endpoint = master_endpoint
        self.ha = HAService.for_store(store, host=self.b.listen_host, cluster_epoch=epoch)
        self.sync = None
        self.replicator = None
        if role is BrokerRole.SLAVE:
            ha = self.ha

            def in_step() -> None:  # (not a client outlived by a later switch's join)
                if self.ha is ha:
                    store.set_dispatch_bound(None)

            ha.on_in_step = in_step
        if not self.waiting_for_election:
            self._start_parts()
        server = self.ha.server
        if server is not None and acks_alone is not None:
            wait_for_slave = server.wait_for_slave

            def wait_for_sync_state_set(end: int) -> PutMessageStatus | None:
                status = None if acks_alone() else wait_for_slave(end)
                if status is None:  # on disk's page cache before the put is acknowledged
                    store.note_confirmed(end)
                return status

            waiters = store.put_waiters
            waiters[:] = [wait_for_sync_state_set if w == wait_for_slave else w
                          for w in waiters]
            # RocketMQ's confirm offset (controller mode, allAckInSyncStateSet): dispatch stops
            # where a put could have been acknowledged, so a consumer never reads a message a
            # failover may cut (then skipping the message that takes its offset). A slave's
            # dispatch is not bounded: it holds only what its master sent.
            ha_server = server

            def confirm_offset() -> int:
                return (store.max_physical_offset if acks_alone()
                        else ha_server.push2slave_max_offset)

            store.set_dispatch_bound(confirm_offset)
            ha_server.on_acked = store.wake_dispatch
        self._acks_alone = acks_alone
        if duties is not None and role is not BrokerRole.SLAVE:
            duties.start(epoch or 0)

    _acks_alone: Callable[[], bool] | None = None

    def take_over_state(self, old_master_endpoint: str) -> None:
        """Controller mode, a planned switch to this broker (``cluster/member.py``): copy the
        old master's state once more, now that it has stepped down and serves no pops (they
        go to the group's master: ``forwarding.py``), before this broker takes the master key.
        Acknowledgements made there after this broker's last periodic copy then stay
        acknowledged. Bounded by a sixth of the lease TTL; a failure is logged and leaves the
        failover's window (docs/CLUSTER.md)."""
        cfg = self.b.config
        copy = StateSync(self.b, old_master_endpoint,
                         self.b.store_config.ha_state_sync_interval, self._applying)
        bound = max(0.5, cfg.etcd_lease_ttl_ms / 6000)  # the member's loop waits meanwhile
        try:
            with AdminClient(peer_endpoint(old_master_endpoint, cfg), timeout=bound) as client:
                copy.sync_once(client, wait=bound)
        except Exception as exc:  # noqa: BLE001 (the election goes on: the window stays)
            log.warning("planned switch: the old master's last state (%s) was not copied: %s; "
                        "acknowledgements made there since the last copy may be delivered "
                        "again", old_master_endpoint, exc)
        else:
            log.info("planned switch: copied the old master's state from %s",
                     old_master_endpoint)

    def confirmed_offset(self) -> int:
        """The CommitLog offset below which every record is held by the whole SyncStateSet
        (RocketMQ's confirm offset in controller mode): the log's end while the master
        acknowledges alone, else the least its slaves acknowledged."""
        end, acked, _links = self.slave_progress()
        alone = self._acks_alone
        if self.is_slave:
            return 0
        if alone is None or alone():
            return end
        return min(end, acked) if acked is not None else 0

    def slave_progress(self) -> tuple[int, int | None, int]:
        """A master's log end, the least offset its slaves acknowledged (None: no slave), and
        how many slaves are connected (the SyncStateSet's inputs)."""
        server = self.ha.server
        if server is None:
            return self.b.store.max_physical_offset, None, 0
        # Only links past the lineage handshake, copying; one that has acknowledged nothing
        # yet holds at least the empty log (-1 then, as RocketMQ's slaveAckOffset).
        links = [link for link in server.links if link.state is HAConnectionState.TRANSFER]
        acked = min((max(0, link.proto.acked) for link in links), default=None)
        return server.reader.end(), acked, len(links)

    def _start_parts(self) -> None:
        try:
            self.ha.start()
        except OSError as exc:
            if self.role is not BrokerRole.ASYNC_MASTER:
                raise OSError(f"replication cannot listen on haListenPort "
                              f"{self.b.store_config.ha_listen_port}: {exc}") from None
            self.error = (f"replication is off: cannot listen on haListenPort "
                          f"{self.b.store_config.ha_listen_port}: {exc}")
            log.error("%s (set haListenPort to a free port to serve slaves)", self.error)
            self.ha.shutdown()
        if self.is_slave:
            self.sync = StateSync(self.b, self.master_endpoint,
                                  self.b.store_config.ha_state_sync_interval, self._applying)
            self.sync.start()
            gate = self.b.compaction_gate
            if gate is not None and self.b.compaction is not None:
                self.replicator = self._compaction_replicator(gate, self.b.compaction)
                self.replicator.start()

    def _compaction_replicator(self, gate: CompactionGate, compaction: CompactionStore
                               ) -> CompactionReplicator:
        cfg = self.b.config
        endpoint = peer_endpoint(self.master_endpoint, cfg)
        meta = self.b.meta

        client = self.ha.client

        def queues() -> list[tuple[str, int]]:  # the compaction topics copied from the master
            if client is None or client.lineage_mismatch or client.master_lineage is None:
                return []  # nothing is pulled from a master of another lineage
            return [(t.name, q) for t in meta.topics() if t.compaction is not None
                    for q in range(t.queue_count)]

        return CompactionReplicator(gate, compaction, lambda: GrpcPullSource(endpoint), queues,
                                    self.b.store_config.ha_state_sync_interval / 1000)

    def describe(self) -> str:
        """One line for the broker's start-up output."""
        if self.waiting_for_election:
            return "controller mode: the group's election decides this broker's role"
        if self.is_slave:
            return (f"SLAVE of {self.b.store_config.ha_master_address} (state from "
                    f"{self.master_endpoint})")
        if self.ha.server is None or self.error:
            return f"{self.role.value}, serving no slaves ({self.error})"
        return f"{self.role.value} serving slaves on {self.ha.server.host}:{self.ha.listen_port}"

    def stop(self) -> None:
        duties = self.b.duties
        if duties is not None:  # (a compaction catch-up reads the store: before it closes)
            duties.stop(but=("tier",))  # the tier's close saves and publishes its progress
        self._stop_parts()

    def _stop_parts(self) -> None:
        if self.replicator is not None:
            self.replicator.stop()
        if self.sync is not None:
            self.sync.stop()
        self.ha.shutdown()

    # -- what the broker asks ------------------------------------------------------------------

    def master_reachable(self) -> bool:
        client = self.ha.client
        return client is not None and client.state is HAConnectionState.TRANSFER

    def route(self, endpoints: pb.Endpoints) -> tuple[pb.Endpoints, bool]:
        """The endpoints a QueryRoute answer names and whether its queues may be written."""
        if not self.is_slave:
            return endpoints, True
        if self.master_reachable():
            host, _, port = self.master_endpoint.rpartition(":")
            return _endpoints(host.strip("[]"), int(port)), True
        return _endpoints(*self.b.advertised), False

    def refusal(self, admin_method: str) -> str | None:
        """Why an admin call may not run here (a slave's metadata is its master's)."""
        if self.is_slave and admin_method in _ADMIN_WRITES:
            return (f"this broker is a SLAVE: {admin_method} goes to its master "
                    f"({self.master_endpoint}), whose topics and groups it copies")
        return None

    # -- RPCs ----------------------------------------------------------------------------------

    def HaStatus(self, req: dict[str, Any]) -> dict[str, Any]:
        info = self.ha.runtime_info()
        info["brokerName"] = self.b.config.broker_name
        if self.error:
            info["error"] = self.error
        if self.sync is not None:
            info["masterEndpoint"] = self.master_endpoint
            info["masterReachable"] = self.master_reachable()
            info["stateSync"] = self.sync.info()
        if self.replicator is not None:
            info["compactionReplication"] = self.replicator.info()
        cluster = self.b.cluster
        if cluster is not None:  # controller mode (stratamq/cluster/node.py)
            info["cluster"] = cluster.status()
            # Dispatch's progress and where it stops: a master's confirm offset (switch_role).
            info["dispatchedOffset"], info["confirmOffset"] = self.b.store.dispatch_progress()
        return info

    def ClusterStatus(self, req: dict[str, Any]) -> dict[str, Any]:
        return {"groups": self._cluster().group_status()}

    def ClusterElect(self, req: dict[str, Any]) -> dict[str, Any]:
        from stratamq.cluster.status import ElectError

        broker_id = req.get("brokerId")
        try:
            return self._cluster().elect(str(req.get("brokerName") or ""),
                                         None if broker_id is None else int(broker_id))
        except (ElectError, ValueError, TypeError) as exc:
            raise MetadataError("precondition", str(exc)) from None

    def ClusterFailsafe(self, req: dict[str, Any]) -> dict[str, Any]:
        try:  # etcdFailsafeMode: a master asks whether this broker lost etcd too
            return self._cluster().confirm_failsafe(int(req["masterBrokerId"]),
                                                    int(req["epoch"]))
        except (KeyError, ValueError, TypeError):
            raise MetadataError("invalid", "ClusterFailsafe needs integer masterBrokerId "
                                "and epoch") from None

    def _cluster(self) -> Any:
        cluster = self.b.cluster
        if cluster is None:
            raise MetadataError("precondition", "this broker is not in controller mode "
                                "(enableControllerMode=true with etcdEndpoints)")
        return cluster

    def SyncState(self, req: dict[str, Any]) -> dict[str, Any]:
        # A controller-mode slave with no master yet answers too: the old master of a
        # planned switch, asked once by the broker taking over (``take_over_state``).
        if self.is_slave and not (self.waiting_for_election and self.b.cluster is not None):
            raise MetadataError("precondition", "this broker is a SLAVE: ask its master for "
                                "state")
        snap = {"metadata": self.b.meta.export(), "popState": self.b.state.snapshot(),
                "deletedTopics": dict(self.b.store.deleted_topics.cutoffs),
                "lineage": self.ha.identity.lineage}
        if self.b.timer_check is not None:
            snap["timerCheck"] = self.b.timer_check[0]()
        return snap


def replication_handler(broker: AdminParts, run: Any) -> grpc.GenericRpcHandler:
    """``/stratamq.admin.v1.Replication/{HaStatus,SyncState}`` as ``grpc.aio`` handlers; the
    work runs in the broker's executor (``run(fn, *args)``)."""
    from stratamq.broker.admin import json_methods_handler

    replication = broker.replication
    return json_methods_handler(
        broker, SERVICE, {"HaStatus": (replication.HaStatus, "Get"),
                          "SyncState": (replication.SyncState, "Update"),
                          "ClusterStatus": (replication.ClusterStatus, "Get"),
                          "ClusterElect": (replication.ClusterElect, "Update"),
                          "ClusterFailsafe": (replication.ClusterFailsafe, "Update")}, run)


class _ReplicationCollector:
    """Replication gauges at scrape time: lag per slave on a master, distance on a slave."""

    def __init__(self, replication: BrokerReplication, node: tuple[str, str, str]) -> None:
        self.r = replication
        self.node = node

    def collect(self) -> Iterator[GaugeMetricFamily]:
        labels = ["cluster", "node_type", "node_id"]
        info = self.r.ha.runtime_info()
        if info.get("master"):
            lag_bytes = GaugeMetricFamily("stratamq_replication_lag_bytes",
                                          "CommitLog bytes a slave has not acknowledged",
                                          labels=[*labels, "slave"])
            lag_ms = GaugeMetricFamily("stratamq_replication_lag_ms",
                                       "age of the oldest message a slave has not acknowledged",
                                       labels=[*labels, "slave"])
            for conn in info.get("haConnectionInfo", []):
                lag_bytes.add_metric([*self.node, conn["addr"]], conn["diff"])
                lag_ms.add_metric([*self.node, conn["addr"]], conn["lagMs"])
            yield lag_bytes
            yield lag_ms
            synced = GaugeMetricFamily("stratamq_replication_in_sync_slaves",
                                       "slaves within haMaxGapNotInSync", labels=labels)
            synced.add_metric(list(self.node), info.get("inSyncSlaveNums", 0))
            yield synced
        elif "haClientRuntimeInfo" in info:
            client = info["haClientRuntimeInfo"]
            behind = GaugeMetricFamily("stratamq_replication_slave_behind_bytes",
                                       "bytes the master had sent past this slave's log",
                                       labels=labels)
            behind.add_metric(list(self.node), client["behindBytes"] or 0)
            yield behind
            mismatch = GaugeMetricFamily("stratamq_replication_lineage_mismatch",
                                         "1 while this slave refuses a master whose CommitLog "
                                         "is of another lineage", labels=labels)
            mismatch.add_metric(list(self.node), 1 if info.get("lineageMismatch") else 0)
            yield mismatch
