"""The broker's optional parts, each built from ``BrokerConfig`` when its setting asks for it:
ACL (``aclEnable``), the timer (``timerEnable``), TLS (``tlsEnable``), Prometheus metrics
(``metricsExporterType=PROM``) and the web console (``consoleListenPort``).

Each function is handed the narrow things its part uses and returns the part, or None when
the setting leaves it off; ``Broker._install_extensions`` (server.py) decides which to build
(a part a caller set already is kept) and when, and ``close_extensions`` stops them before the
store closes. The parts' modules load only when built.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import grpc

from stratamq.config import BrokerConfig, BrokerRole, StoreConfig

if TYPE_CHECKING:
    from stratamq.broker.clients import ClientRegistry
    from stratamq.broker.engine import PopEngine
    from stratamq.broker.metadata import MetadataStore
    from stratamq.store.message_store import MessageStore

log = logging.getLogger(__name__)

__all__ = ["acl_checker", "close_extensions", "console_thread", "prometheus_metrics",
           "register_tier_metrics", "timer_store", "tls_credentials"]


def acl_checker(cfg: BrokerConfig) -> Any:
    """The ACL checker when ``aclEnable``, else None."""
    if not cfg.acl_enable:
        return None
    from stratamq.broker.acl import AclChecker

    return AclChecker.from_config(cfg.acl_file, cfg.acl_access_key, cfg.acl_secret_key,
                                  cfg.acl_signature_window_sec)


def timer_store(cfg: BrokerConfig, store_config: StoreConfig, store: MessageStore) -> Any:
    """The timer when ``timerEnable`` (started, unless the election starts it), else None."""
    if not (cfg.timer_enable
            and (store_config.broker_role is not BrokerRole.SLAVE  # puts refused
                 or cfg.enable_controller_mode)):  # started when elected
        return None
    from stratamq.broker.timer import TimerMessageStore

    timer = TimerMessageStore(store, max_delay_ms=cfg.timer_max_delay_sec * 1000,
                              flush_interval_ms=cfg.timer_flush_interval_ms)
    if not cfg.enable_controller_mode:
        timer.start()
    return timer


def prometheus_metrics(cfg: BrokerConfig, store: MessageStore, meta: MetadataStore,
                       engine: PopEngine, clients: ClientRegistry, timer: Any) -> Any:
    """``BrokerMetrics`` serving ``/metrics`` on ``metricsHost:metricsPort``."""
    from stratamq.broker.metrics import BrokerMetrics, BrokerView

    def progress() -> Iterator[tuple[str, str, int, int]]:
        for group in meta.groups():
            for row in engine.progress(group.name):
                yield group.name, row["topic"], row["lag"], row["inflight"]

    def live_clients() -> list[tuple[str, str]]:
        return [(c["type"], c["group"]) for c in clients.live()]

    view = BrokerView(progress, live_clients, lambda: (len(meta.topics()), len(meta.groups())))
    metrics = BrokerMetrics(store, cluster=cfg.broker_cluster_name, node_id=cfg.broker_name,
                            view=view, timer=timer)
    port = metrics.serve(cfg.metrics_host, cfg.metrics_port)
    log.info("Prometheus metrics on %s:%d/metrics", cfg.metrics_host, port)
    return metrics


def register_tier_metrics(metrics: Any, tiered: Any) -> None:
    """The tier's gauges beside the broker's, when the metrics have a registry (PROM)."""
    if tiered is not None and hasattr(metrics, "registry"):
        from stratamq.tiered.metrics import TierCollector

        metrics.registry.register(TierCollector(tiered, metrics.node))


def tls_credentials(cfg: BrokerConfig,
                    store_config: StoreConfig) -> grpc.ServerCredentials | None:
    """TLS from ``tls.server.*`` (and ``tls.client.*``, for the brokers this one calls) when
    ``tlsEnable``, else None; TlsConfigError says what is wrong."""
    if not cfg.tls_enable:
        return None
    from stratamq.broker.tls import broker_credentials

    return broker_credentials(cfg, store_config.broker_role is BrokerRole.SLAVE)


def console_thread(cfg: BrokerConfig, endpoint: str) -> Any:
    """The web console on loopback when ``consoleListenPort`` is set, started (else None): a
    client of the broker at ``endpoint``'s admin RPCs like any other (signed with
    aclAccessKey when ACL is on, over TLS when tlsEnable); ValueError when it cannot reach
    the broker."""
    if not cfg.console_listen_port:
        return None
    from stratamq.broker.tls import console_endpoint
    from stratamq.console.server import ConsoleServer, ConsoleThread

    server = ConsoleServer(console_endpoint(endpoint, cfg),
                           f"127.0.0.1:{cfg.console_listen_port}")
    console = ConsoleThread(server).start()
    log.info("web console on %s", server.url)
    return console


def close_extensions(console: Any, timer: Any, metrics: Any, stats: Any) -> None:
    """Stop the console, the timer (it puts to the store), the metrics exporter and the
    stats windows: before the store closes."""
    if console is not None:
        console.stop()
    if timer is not None and hasattr(timer, "close"):
        timer.close()
    if hasattr(metrics, "close"):
        metrics.close()
    if stats is not None:
        stats.stop()
