"""What a broker hands the cluster in controller mode (``enableControllerMode``): it joins its
group's election (``cluster/node.py``), publishes its topics and remoting address for the
NameServers, sends a slave's pop RPCs to the group's master, and answers routes across every
group.

Each function is handed the narrow things it uses; ``Broker`` (server.py) calls them while it
builds its parts. The cluster's modules load only in controller mode.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stratamq.broker.listening import host_port
from stratamq.config import BrokerConfig, StoreConfig

if TYPE_CHECKING:
    from stratamq.broker.metadata import MetadataStore
    from stratamq.store.message_store import MessageStore

__all__ = ["cluster_routes", "join_cluster", "master_forwarding", "remoting_address",
           "topic_entries"]


def join_cluster(cfg: BrokerConfig, store_config: StoreConfig, endpoint: str, host: str,
                 store: MessageStore, replication: Any, meta: MetadataStore,
                 remoting: str) -> Any:
    """Start this broker's ``ClusterNode``: ``endpoint`` is where clients reach it, ``host``
    the host it advertises (its HA port beside it), ``remoting`` its 4.x address ("" if
    none, or not known yet)."""
    from stratamq.cluster.node import ClusterNode
    from stratamq.ha.epochs import EpochFile

    def last_epoch() -> int:  # of the store's epoch file, whatever the role
        epochs = replication.ha.epochs or EpochFile(replication.ha.epoch_file)
        return epochs.entries[-1].epoch if epochs.entries else 0

    node = ClusterNode(cfg, endpoint=endpoint,
                       ha_address=f"{host}:{store_config.ha_listen_port}",
                       max_offset=lambda: store.max_physical_offset,
                       last_epoch=last_epoch, switch_role=replication.switch_role,
                       put_guards=store.put_guards, progress=replication.slave_progress,
                       max_gap=store_config.ha_max_gap_not_in_sync,
                       topics=lambda: topic_entries(meta),
                       remoting_address=remoting,
                       take_over_state=replication.take_over_state)
    if node.publisher is not None:
        meta.add_topics_listener(node.publisher.changed)
    node.start()
    return node


def topic_entries(meta: MetadataStore) -> dict[str, bytes]:
    """The broker's topics as the cluster's route table holds them (cluster/routes.py)."""
    from stratamq.cluster.routes import topic_entry

    return {t.name: topic_entry(t.read_queue_nums, t.write_queue_nums, t.perm,
                                t.message_type) for t in meta.topics()}


def remoting_address(cfg: BrokerConfig, broker_ip: str, listen_host: str,
                     port: int | None = None) -> str:
    """Where 4.x clients reach this broker, for NameServers reading routes from etcd ("" if
    off, or not known before remoting starts: remotingListenPort=0, announced then)."""
    from stratamq.remoting.broker import registered_host

    port = cfg.remoting_listen_port if port is None else port
    if port <= 0:
        return ""
    return host_port(registered_host(broker_ip, listen_host), port)


def master_forwarding(cfg: BrokerConfig, max_message_length: int, replication: Any,
                      cluster: Any) -> Any:
    """Controller mode: a slave's pop RPCs sent to its group's master; else None."""
    if not cfg.enable_controller_mode:
        return None  # a static slave serves them while its master is away
    from stratamq.broker.forwarding import for_broker

    member = cluster.member

    def master() -> str | None:  # None: served here; "": the group has no master now
        if replication.is_slave:
            return replication.master_endpoint
        # Stepping down (a planned switch) stops pops before the key goes and the role
        # changes: nothing more is popped here, so the next master's last copy holds it all.
        return None if member.serves_pops else ""

    return for_broker(cfg, max_message_length, master)


def cluster_routes(cluster: Any, broker_name: str, replication: Any) -> Any:
    """Routes across every group of the cluster (controller mode), else None."""
    if cluster is None:
        return None
    from stratamq.broker.cluster_routes import ClusterRoutes

    return ClusterRoutes(cluster.routes, broker_name,
                         is_master=lambda: not replication.is_slave)
