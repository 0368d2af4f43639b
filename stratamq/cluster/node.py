"""A broker in controller mode: its ``ClusterMember`` wired to the few things it changes.

``enableControllerMode=true`` (with ``etcdEndpoints``): the broker opens its store as a SLAVE
with no master (``brokerRole`` is ignored, as RocketMQ ignores it in controller mode) and
``ClusterNode`` decides its role from etcd (``member.py``):

* elected: ``switch_role(SYNC_MASTER, epoch=E)``: the store records epoch E at its log's end in
  ``epochFileCheckpoint`` and serves slaves; it acknowledges a put once every slave of its
  SyncStateSet has it, at once while the set is itself alone (``sync_state.py``);
* another broker is master: ``switch_role(SLAVE, its haAddress, its endpoint)``: the HA link
  follows it (cutting this log back where it differs: the epoch rule, and refusing a master
  of another lineage), and state sync copies its topics, groups and offsets;
* no master known: a SLAVE with no link.

Every put first asks the member's fence (``MessageStore.put_guards``): a broker that is not
the elected master, or a master whose lease renewal is overdue, refuses it.

What it is given: the settings, the store's max offset and last epoch, its own endpoints, the
role switch (``BrokerReplication.switch_role``), where to add the put guard and, for a planned
switch, the last copy of the old master's state (``BrokerReplication.take_over_state``); not
the Broker.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

import grpc

from stratamq.cluster.coordination import Coordination
from stratamq.cluster.member import BrokerIdentity, ClusterMember, MasterInfo
from stratamq.cluster.routes import RouteTable, TopicPublisher
from stratamq.cluster.sync_state import SlaveProgress
from stratamq.config import BrokerConfig, BrokerRole

__all__ = ["ClusterNode", "SwitchRole"]

log = logging.getLogger(__name__)

# (role, master_ha_address="", master_endpoint="", epoch=None, acks_alone=None)
SwitchRole = Callable[..., None]


class ClusterNode:
    """One broker's membership in its cluster; see the module docstring."""

    def __init__(self, config: BrokerConfig, *, endpoint: str, ha_address: str,
                 max_offset: Callable[[], int], last_epoch: Callable[[], int],
                 switch_role: SwitchRole,
                 put_guards: list[Callable[[], str | None]],
                 progress: SlaveProgress | None = None, max_gap: int = 256 << 20,
                 coordination: Coordination | None = None,
                 topics: Callable[[], dict[str, bytes]] | None = None,
                 remoting_address: str = "",
                 take_over_state: Callable[[str], None] | None = None) -> None:
        if coordination is None:
            from stratamq.cluster.etcd import EtcdCoordination

            # A request may take at most a third of the TTL: a renewal that cannot get
            # through in time is known to have failed while the fence still holds. One pass
            # over the members per call: the member's own loop asks again at its next step.
            coordination = EtcdCoordination(config.etcd_endpoints,
                                            timeout_s=min(2.0, config.etcd_lease_ttl_ms / 3000),
                                            retry_s=0)
        self.coordination = coordination
        self.switch_role = switch_role
        me = BrokerIdentity(config.broker_cluster_name, config.broker_name, config.broker_id,
                            config.broker_election_priority, endpoint, ha_address,
                            remoting_address)
        self.member = ClusterMember(coordination, me, config.cluster_prefix(),
                                    config.etcd_lease_ttl_ms, max_offset=max_offset,
                                    last_epoch=last_epoch, on_master=self._on_master,
                                    on_slave=self._on_slave,
                                    allow_unclean=config.enable_elect_unclean_master,
                                    progress=progress, max_gap=max_gap,
                                    not_catchup_ms=config.ha_max_time_slave_not_catchup,
                                    ask_failsafe=(self._ask_failsafe(config)
                                                  if config.etcd_failsafe_mode else None),
                                    take_over_state=take_over_state)
        self._put_guards = put_guards
        put_guards.append(self.member.fence.refusal)
        # The cluster's route table, and this group's topics in it while this broker is master
        # (routes.py).
        self.routes = RouteTable(coordination, config.cluster_prefix())
        self.publisher = (TopicPublisher(coordination, config.cluster_prefix(),
                                         config.broker_name, topics, self._mastership)
                          if topics is not None else None)

    def announce_remoting(self, address: str) -> None:
        """The remoting address, once known (``remotingListenPort=0`` binds at start): in the
        registration from the member's next pass on."""
        self.member.me = replace(self.member.me, remoting_address=address)

    def _mastership(self) -> int | None:
        m = self.member
        return m.epoch if m.is_master else None

    def start(self) -> None:
        self.member.start()
        self.routes.start()
        if self.publisher is not None:
            self.publisher.start()

    @staticmethod
    def _ask_failsafe(config: BrokerConfig) -> Callable[[str, int, int], bool]:
        """``etcdFailsafeMode``: ask a broker of the group (its admin ``ClusterFailsafe``)
        whether it has lost etcd too; no answer in a sixth of the TTL is a no."""
        from stratamq.broker.tls import peer_endpoint
        from stratamq.client.admin import AdminClient, AdminError

        peer = peer_endpoint("", config)  # (TLS files read once)

        def ask(endpoint: str, master_id: int, epoch: int) -> bool:
            try:
                with AdminClient(peer.at(endpoint),
                                 timeout=config.etcd_lease_ttl_ms / 6000) as client:
                    reply = client.call_service(
                        "stratamq.admin.v1.Replication", "ClusterFailsafe",
                        masterBrokerId=master_id, epoch=epoch)
            except (AdminError, OSError, grpc.RpcError) as exc:
                log.debug("failsafe: %s did not answer: %s", endpoint, exc)
                return False
            return reply.get("lostEtcd") is True

        return ask

    def confirm_failsafe(self, master_id: int, epoch: int) -> dict:
        """``ClusterFailsafe``: whether this broker lost etcd too, following that master."""
        return {"lostEtcd": self.member.confirm_failsafe(master_id, epoch)}

    def stop(self) -> None:
        if self.publisher is not None:
            self.publisher.stop()
        self.routes.stop()
        self.member.stop()
        if self.member.fence.refusal in self._put_guards:
            self._put_guards.remove(self.member.fence.refusal)
        self.coordination.close()

    def _on_master(self, epoch: int) -> None:
        self.switch_role(BrokerRole.SYNC_MASTER, epoch=epoch, acks_alone=self.member.acks_alone)

    def _on_slave(self, master: MasterInfo | None) -> None:
        if master is None:
            self.switch_role(BrokerRole.SLAVE)
        else:
            self.switch_role(BrokerRole.SLAVE, master.ha_address, master.endpoint)

    def group_status(self) -> list[dict]:
        """``cluster status`` as this broker's etcd says it (``status.py``)."""
        from stratamq.cluster.status import group_status

        return group_status(self.coordination, self.member.prefix, self.member.me.cluster)

    def elect(self, group: str, broker_id: int | None) -> dict:
        """``cluster elect`` through this broker (``status.request_election``)."""
        from stratamq.cluster.status import request_election

        return request_election(self.coordination, self.member.prefix, self.member.me.cluster,
                                group, broker_id)

    def status(self) -> dict:
        m = self.member
        master = m.master
        return {"cluster": m.me.cluster, "brokerName": m.me.group, "brokerId": m.me.broker_id,
                "role": "MASTER" if m.is_master else "SLAVE", "epoch": m.epoch,
                "writable": m.fence.writable(), "failsafe": m.failsafe,
                "masterBrokerId": master.broker_id if master is not None else None,
                "syncStateSet": sorted(m.sync.written) if m.sync is not None else None,
                "lastError": m.last_error,
                # Sent since start (the benchmark's etcd requests per broker per second).
                "etcdRequests": getattr(self.coordination, "requests", None)}
