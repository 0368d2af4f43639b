"""The broker process: ``apache.rocketmq.v2.MessagingService`` for the official RocketMQ 5
clients, plus a small StrataMQ admin service, on one port; and its lifecycle.

Parts (each module says more):

* ``rpc.py``: the thin ``grpc.aio`` adapter; ``admin.py``: the admin service (JSON bodies).
* ``clients.py``, ``sending.py``, ``receiving.py``, ``pulling.py``: the logic, free of gRPC,
  over ``lookup.py`` (topics, groups, ACL), ``engine.py`` + ``pop_state.py`` (pop
  consumption), ``writer.py`` (the single writer combining concurrent sends into one append)
  and ``polling.py`` (long polls as registered waiters).
* ``Broker`` (here): opens the store, builds the parts, runs the gRPC server on an event loop
  of its own thread, and stops everything in order; with ``listening.py`` (the ports),
  ``store_plugins.py`` (the store and what plugs into it), ``extensions.py`` (the optional
  parts), ``controller_mode.py`` and ``shutdown.py``.

Threads: the caller's (``start``/``stop``), ``broker-io`` (the event loop: every RPC handler,
every open stream and waiting poll), ``broker-exec-N`` (``grpcThreadPoolNums`` threads for the
blocking store calls), ``broker-writer`` (appends), and the store's own services.

Hook points for the parts other modules provide (all off by default; set before ``start`` or
built from the config by ``_install_extensions``, ``extensions.py``):

* ``Broker.acl``: ``authorize(metadata, resource, action)`` raising ``BrokerError(UNAUTHORIZED
  | FORBIDDEN, ...)``, run first by every RPC. Resources are ``"Topic:<name>"``,
  ``"Group:<name>"`` or ``"Cluster"``; actions ``"Pub"``, ``"Sub"``, ``"Get"``, ``"Create"``,
  ``"Update"``, ``"Delete"``, ``"List"``.
* ``Broker.metrics``: ``on_send(topic, sizes, seconds, message_type)``, ``on_receive(group,
  topic, count, nbytes)``, ``on_ack(group, topic, count)``, ``on_dlq(group, topic)``,
  ``on_rpc(method, code, seconds)``; ``NullMetrics`` by default (``broker/metrics.py``).
* ``Broker.timer``: ``hold(message, deliver_at_ms) -> Message`` for DELAY sends.
* ``Broker.server_credentials``: a ``grpc.ServerCredentials`` for TLS (plaintext if None).
* ``Broker.replication``: ``broker/replication.py`` by ``brokerRole`` (always made by
  ``_build``): the store's HA service, a slave's state sync, route answers, admin refusals.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import grpc

from stratamq.broker.clients import ClientRegistry, ClientService
from stratamq.broker.compaction_topics import compaction_admin_handler
from stratamq.broker.controller_mode import (
    cluster_routes,
    join_cluster,
    master_forwarding,
    remoting_address,
)
from stratamq.broker.engine import PopEngine
from stratamq.broker.extensions import (
    acl_checker,
    close_extensions,
    console_thread,
    prometheus_metrics,
    register_tier_metrics,
    timer_store,
    tls_credentials,
)
from stratamq.broker.listening import (
    add_grpc_port,
    grpc_server,
    host_port,
    remoting_identity,
    shared_listener,
    start_remoting,
)
from stratamq.broker.lookup import Lookup
from stratamq.broker.metrics import NullMetrics
from stratamq.broker.polling import LongPolls
from stratamq.broker.pop_state import PopState
from stratamq.broker.pulling import PullService
from stratamq.broker.receiving import ReceiveService
from stratamq.broker.rpc import MessagingServicer, Services, messaging_handler
from stratamq.broker.sending import SendService
from stratamq.broker.shutdown import BrokerStopError, StopSteps, suppress_all
from stratamq.broker.stats_window import BrokerStatsWindow, StatsTee
from stratamq.broker.store_plugins import open_store
from stratamq.broker.writer import GroupWriter
from stratamq.compaction.service import CompactionStore
from stratamq.config import BrokerConfig, BrokerRole, StoreConfig
from stratamq.message import DispatchInfo
from stratamq.store.layout import StoreLayout
from stratamq.store.message_store import MessageStore

log = logging.getLogger(__name__)

__all__ = ["Broker", "BrokerStopError", "NullMetrics"]

_SERVER_STOP_MARGIN_S = 5.0  # past the grace period, how long gRPC's own shutdown may take
_PART_STOP_S = 30.0  # the writer's queue and the executor's calls, each


class Broker:
    """One broker process: a store, its metadata and pop state, the logic and the gRPC server.

    ``start()`` binds the port first (so ``--listen host:0`` learns its port and the store
    writes the real endpoint into offset message ids), then opens the store, then serves.
    ``stop()``: refuse new calls, answer waiting polls, end telemetry streams, let in-flight
    calls finish for ``shutdownGraceSeconds``, write queued sends, then close the timer, the
    metrics, the pop state and the store (which flushes, writes the checkpoint and removes
    ``abort``). ``start``/``stop`` from one owning thread.
    """

    def __init__(self, store_config: StoreConfig, config: BrokerConfig | None = None,
                 listen: str | None = None) -> None:
        self.store_config = store_config
        self.config = config or BrokerConfig()
        if listen is None:
            listen = f"{self.config.listen_host}:{store_config.listen_port}"
        host, _, port = listen.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"--listen must be HOST:PORT, not {listen!r}")
        self.listen_host, self.listen_port = host.strip("[]"), int(port)
        # Hook points (see the module docstring); set before start() or by _install_extensions.
        self.acl: Any = None
        self.metrics: Any = NullMetrics()
        self.stats: BrokerStatsWindow | None = None  # made in _build
        self.timer: Any = None
        self.replication: Any = None  # broker/replication.py, made in _build
        self.cluster: Any = None  # cluster/node.py in controller mode, made in _build
        self.server_credentials: grpc.ServerCredentials | None = None
        self.clients = ClientRegistry(self.config.channel_expired_timeout)
        self.server: grpc.aio.Server | None = None
        self.store: MessageStore
        self.tiered: Any = None  # stratamq.tiered.TieredStore when tieredBackendServiceProvider
        self.console: Any = None  # stratamq.console.server.ConsoleThread when consoleListenPort
        self.compaction: CompactionStore | None = None  # compaction topics (enableCompaction)
        self.compaction_gate: Any = None  # a slave's: ha.message_replication.CompactionGate
        self.transactions: Any = None  # transactions.TransactionEngine, made in _build
        self.transaction_checks: Any = None  # its check thread
        self.advertised: tuple[str, int] = (self.listen_host, self.listen_port)
        self.started_at = time.monotonic()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._executor: ThreadPoolExecutor | None = None
        self.writer: GroupWriter | None = None
        self.servicer: MessagingServicer | None = None
        self.forwarding: Any = None  # controller mode: broker/forwarding.py, made in _build
        self.remoting: Any = None  # remoting.broker.RemotingFrontend when remotingListenPort
        self.admin: Any = None  # broker.admin.AdminService, made in _build
        self.grpc_port = 0  # where gRPC listens: the listen port, unless remoting shares it
        self._shared_listener: socket.socket | None = None  # that shared port, bound at start

    @property
    def endpoint(self) -> str:
        return host_port(*self.advertised)

    def live_clients(self, group: str) -> list[dict[str, Any]]:
        return self.clients.live(group)

    @property
    def telemetry_streams(self) -> int:
        """Telemetry streams open now (one per connected client)."""
        return len(self.servicer.telemetry_tasks) if self.servicer is not None else 0

    # -- the event loop -------------------------------------------------------------------------

    def _start_loop(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._loop_thread = threading.Thread(target=loop.run_forever, name="broker-io",
                                             daemon=True)
        self._loop_thread.start()
        return loop

    def _on_loop(self, coro: Any, timeout: float | None = 60.0) -> Any:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def run(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        """``fn(*args)`` in the executor, awaitable on the loop (the logic's ``run``)."""
        assert self._loop is not None
        return self._loop.run_in_executor(self._executor, fn, *args)

    def _stop_loop(self) -> bool:
        loop, thread = self._loop, self._loop_thread
        if loop is None or thread is None:
            return True
        if loop.is_running():
            loop.call_soon_threadsafe(loop.stop)
        thread.join(_PART_STOP_S)
        if thread.is_alive():
            return False
        loop.close()
        return True

    # -- extensions -----------------------------------------------------------------------------

    def _install_extensions(self) -> None:
        """Where the timer, ACL and metrics services are wired in from ``self.config``
        (``extensions.py``; TLS is wired in ``start``, before binding).

        Runs after the store is open and before the server starts; each part sets one of
        ``self.timer``, ``self.acl``, ``self.metrics``. Each is built from ``self.config``
        unless a caller set it already.
        """
        cfg = self.config
        if self.acl is None:
            self.acl = acl_checker(cfg)
        if self.timer is None:
            self.timer = timer_store(cfg, self.store_config, self.store)
        if cfg.metrics_exporter_type == "PROM" and isinstance(self.metrics, NullMetrics):
            self.metrics = prometheus_metrics(cfg, self.store, self.meta, self.engine,
                                              self.clients, self.timer)
        self.engine.on_dlq = self.metrics.on_dlq
        register_tier_metrics(self.metrics, self.tiered)

    def _close_extensions(self) -> None:
        close_extensions(self.console, self.timer, self.metrics, self.stats)

    # -- start and stop -------------------------------------------------------------------------

    async def _bind(self, address: str) -> int:
        self.server = grpc_server(self.store_config.max_message_size)
        return add_grpc_port(self.server, address, self.server_credentials)

    async def _serve(self, servicer: MessagingServicer,
                     *handlers: grpc.GenericRpcHandler) -> None:
        assert self.server is not None
        self.server.add_generic_rpc_handlers((messaging_handler(servicer), *handlers))
        await self.server.start()

    def start(self) -> str:
        cfg = self.config
        address = host_port(self.listen_host, self.listen_port)
        if self.server_credentials is None:
            self.server_credentials = tls_credentials(cfg, self.store_config)
        loop = self._start_loop()
        # remotingListenPort 0 (the default) or the listen port: one port for both protocols.
        # The remoting front door takes it (bound here, so a listen port of 0 is known now)
        # and relays gRPC's connections to gRPC on a loopback port.
        shared = cfg.remoting_listen_port in (0, self.listen_port)
        try:
            if shared:
                self._shared_listener = shared_listener(self.listen_host, self.listen_port)
            port = self._on_loop(self._bind("127.0.0.1:0" if shared else address))
            if not port:
                raise OSError(f"cannot listen on {address}")
        except BaseException:
            self.server = None
            if self._shared_listener is not None:
                self._shared_listener.close()
                self._shared_listener = None
            self._stop_loop()
            raise
        self.grpc_port = port
        if self._shared_listener is not None:
            port = int(self._shared_listener.getsockname()[1])
        advertised = self.listen_host
        if advertised in ("0.0.0.0", "::", ""):
            advertised = self.store_config.broker_ip
        self.advertised = (advertised, port)
        # The store host in every record and offset message id is this broker's real endpoint.
        self.store_config = replace(self.store_config, listen_port=port)
        if cfg.enable_controller_mode:  # the group's election decides the role (cluster/)
            self.store_config = replace(self.store_config, broker_role=BrokerRole.SLAVE,
                                        ha_master_address="", ha_master_endpoint="")
        try:
            plugged = open_store(self.store_config, cfg)
        except BaseException:
            self.server = None
            self._stop_loop()
            raise
        self.store, self.tiered, self.meta = plugged.store, plugged.tiered, plugged.meta
        self.compaction, self.compaction_gate = plugged.compaction, plugged.compaction_gate
        self.transaction_table = plugged.transaction_table
        try:
            if self.tiered is not None:
                self.tiered.start()
            if self.compaction is not None:
                self.compaction.start()
            self._build(loop)
            self.console = console_thread(cfg, self.endpoint)
        except BaseException:
            self._abandon_start()
            raise
        log.info("broker %s serving on %s", cfg.broker_name, self.endpoint)
        return self.endpoint

    def _build(self, loop: asyncio.AbstractEventLoop) -> None:
        """Metadata, pop state, logic; then serve."""
        cfg = self.config
        root = self.store_config.root
        self.state = PopState(StoreLayout(root).pop_state_dir, cfg.pop_state_sync_write)
        self.polls = LongPolls(loop, max_total=cfg.max_pop_polling_size,
                               max_per_group=cfg.pop_polling_size,
                               max_per_client=cfg.pop_polling_size_per_client)
        self.engine = PopEngine(self.store, self.meta, self.state, self.polls.notify)
        # Forced clean-up (diskFullPolicy) keeps what these groups have not consumed, unless
        # the tier holds it.
        self.store.set_consumed_offsets(self.engine.consumed_offsets)
        uploader = getattr(self.tiered, "uploader", None)
        if uploader is not None:
            self.store.add_record_holder(uploader.durable_offset)
        self._install_extensions()
        self.store.add_dispatch_listener(self._on_dispatch)
        self._executor = ThreadPoolExecutor(max_workers=cfg.grpc_thread_pool_nums,
                                            thread_name_prefix="broker-exec")
        self.writer = GroupWriter(self.store).start()
        self.lookup = Lookup(self.meta, cfg, self.acl)
        from stratamq.broker.replication import (
            BrokerReplication,
            ReplicationParts,
            replication_handler,
        )

        self.replication = BrokerReplication(ReplicationParts(
            cfg, self.store_config, self.store, self.meta, self.state, self.listen_host,
            self.compaction, self.compaction_gate, self.metrics, lambda: self.advertised,
            lambda: self.cluster))
        if cfg.enable_controller_mode:  # what a role switch starts and stops
            from stratamq.broker.master_duties import for_broker

            for_broker(self.replication.b, self.timer, self.tiered,
                       lambda: self.replication.confirmed_offset())
        self.replication.start()
        if cfg.enable_controller_mode:
            self.cluster = join_cluster(
                cfg, self.store_config, self.endpoint, self.advertised[0], self.store,
                self.replication, self.meta, self._remoting_address())
        timer = self.timer if cfg.timer_enable else None
        # VIEW_BROKER_STATS_DATA's windows: counted wherever the metrics see sends and gets.
        self.stats = BrokerStatsWindow(cfg.broker_cluster_name)
        self.stats.start()  # (a deleted topic's items go with it, as RocketMQ's)
        self.meta.add_topics_listener(self.stats.topics_listener(
            lambda: [t.name for t in self.meta.topics()]))
        self.counted = StatsTee(self.stats, lambda: self.metrics)
        from stratamq.broker.transactions import (
            AnyProducer,
            EndTransactionService,
            ProducerStreams,
            register_metrics,
            start_transactions,
        )
        from stratamq.remoting.broker_transactions import RemotingProducers
        from stratamq.transactions import TransactionSettings

        self.producer_streams = ProducerStreams()
        self.remoting_producers = RemotingProducers()  # 4.x producers, by their heartbeats
        self.transactions, self.transaction_checks = start_transactions(
            self.transaction_table, self.store, self.writer,
            TransactionSettings(cfg.transaction_check_interval, cfg.transaction_timeout,
                                cfg.transaction_check_max),
            AnyProducer(self.producer_streams, self.remoting_producers),
            may_check=lambda: not self.replication.is_slave)
        if hasattr(self.metrics, "registry"):
            register_metrics(self.transactions, self.metrics.registry, self.metrics.node)
        self.forwarding = master_forwarding(cfg, self.store_config.max_message_size + 1024 * 1024,
                                            self.replication, self.cluster)
        services = Services(
            lookup=self.lookup,
            clients=ClientService(self.lookup, self.clients, cfg.broker_name, self.advertised,
                                  self.store_config.max_message_size,
                                  route=self.replication.route,
                                  cluster=cluster_routes(self.cluster, cfg.broker_name,
                                                         self.replication)),
            sending=SendService(self.lookup, self.store_config.max_message_size, timer,
                                lambda: self.counted),
            receiving=ReceiveService(self.lookup, self.engine, self.polls,
                                     lambda: self.counted),
            pulling=PullService(self.lookup, self.store, self.state, self.polls),
            writer=self.writer, run=self.run, metrics=lambda: self.metrics,
            transactions=EndTransactionService(self.lookup, self.transactions),
            producers=self.producer_streams, peer_names=self._relayed_peer,
            forwarding=self.forwarding)
        self.servicer = MessagingServicer(services)
        from stratamq.broker.admin import AdminService, admin_handler
        from stratamq.broker.message_admin import message_admin_handler
        from stratamq.broker.tier_admin import tier_admin_handler

        parts = self.admin_parts()
        self.admin = AdminService(parts)  # (also remoting's DELETE_TOPIC_IN_BROKER)
        self._on_loop(self._serve(self.servicer, admin_handler(self.admin, self.run),
                                  tier_admin_handler(self), replication_handler(parts, self.run),
                                  compaction_admin_handler(parts),
                                  message_admin_handler(self)))
        if cfg.remoting_listen_port >= 0:  # RocketMQ 4.x clients (stratamq/remoting/)
            self._on_loop(self._start_remoting(timer))

    def admin_parts(self) -> Any:
        """What the admin services use (``broker.admin.AdminParts``), once built."""
        from stratamq.broker.admin import AdminParts

        assert self.engine is not None
        return AdminParts(
            self.config, self.store_config, self.store, self.meta, self.state, self.engine,
            self.polls, self.clients, self.lookup, self.replication, self.transactions,
            self.run, self.started_at, lambda: self.endpoint, self.live_clients,
            lambda: self.telemetry_streams, self.compaction, lambda: self.advertised)

    async def _start_remoting(self, timer: Any) -> None:
        from stratamq.config import as_properties, parse_delay_levels
        from stratamq.remoting.broker import RemotingFrontend

        cfg = self.config
        assert self.writer is not None
        self.remoting = RemotingFrontend(
            lookup=self.lookup, writer=self.writer, reader=self.store,
            look_up=self.store.look_message_by_offset, query=self.store.query_messages,
            state=self.state, polls=self.polls,
            timer=timer, run=self.run, max_message_size=self.store_config.max_message_size,
            delay_levels_ms=parse_delay_levels(cfg.message_delay_level),
            identity=remoting_identity(cfg, self.store_config), acl=self.acl,
            metrics=lambda: self.counted, producers=self.remoting_producers,
            stats=self.stats, store_stats=self.store.stats.runtime_fields,
            transactions=lambda: self.transactions,
            is_slave=lambda: self.replication.is_slave, delete_topic=self.admin.DeleteTopic,
            refusal=self.replication.refusal,
            settings=lambda: as_properties(self.store_config, cfg),
            status=self.admin.BrokerStatus,
            channel_expired_ms=cfg.channel_expired_timeout)
        shared, self._shared_listener = self._shared_listener, None
        await start_remoting(self.remoting, cfg, self.store_config, self.listen_host,
                             self.grpc_port, shared)
        log.info("broker %s serving remoting on port %d", cfg.broker_name, self.remoting.port)
        if self.cluster is not None and cfg.remoting_listen_port == 0:  # bound to a free port
            self.cluster.announce_remoting(self._remoting_address(self.remoting.port))

    def _remoting_address(self, port: int | None = None) -> str:
        return remoting_address(self.config, self.store_config.broker_ip, self.listen_host, port)

    def _relayed_peer(self, grpc_peer: str) -> str:
        """gRPC's peer, or the client behind it when the shared port relayed the connection."""
        remoting = self.remoting
        return remoting.relayed_peer(grpc_peer) if remoting is not None else grpc_peer

    def _on_dispatch(self, info: DispatchInfo) -> None:
        self.polls.notify(info.topic)

    def _abandon_start(self) -> None:
        """Undo a start that failed after the store opened: nothing may stay running."""
        if self.cluster is not None:
            with suppress_all():
                self.cluster.stop()
        if self.server is not None:
            with suppress_all():
                self._on_loop(self.server.stop(0))
            self.server = None
        if self._shared_listener is not None:  # (bound, not yet handed to remoting)
            self._shared_listener.close()
            self._shared_listener = None
        if self.remoting is not None:
            with suppress_all():
                self._on_loop(self.remoting.close(), 30.0)
                self._on_loop(self.remoting.close_relays(), 10.0)
        if self.transaction_checks is not None:
            self.transaction_checks.close()
        if self.writer is not None:
            self.writer.close()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
        self._stop_loop()
        if self.replication is not None:
            with suppress_all():
                self.replication.stop()
        with suppress_all():
            self._close_extensions()
        if hasattr(self, "state"):
            with suppress_all():
                self.state.close()
        self.store.close()
        if self.tiered is not None:
            self.tiered.close()
        if self.compaction is not None:
            self.compaction.close()

    async def _shutdown_server(self, grace: float) -> None:
        assert self.server is not None
        stopping = asyncio.ensure_future(self.server.stop(grace))  # refuses new calls now
        await asyncio.sleep(0)
        self.polls.close()  # long polls answer now instead of holding the shutdown
        if self.servicer is not None:
            for task in list(self.servicer.telemetry_tasks):
                task.cancel()  # idle clients would otherwise hold the whole grace period
        await stopping
        if self.forwarding is not None:
            await self.forwarding.close()

    def stop(self, grace: float | None = None) -> bool:
        """Stop serving, then write queued sends and close the timer, metrics, pop state and
        store, each step run whatever the others did: a failing step must not leave the store
        unflushed with its ``abort`` marker behind.

        gRPC gets ``grace`` seconds to finish in-flight calls, then they are cancelled; if its
        shutdown still has not completed a few seconds later (a handler wedged), the broker
        closes everything anyway. Returns False in that case (or when an executor call or the
        writer would not finish): the caller should then end the process without waiting for
        those threads. Raises ``BrokerStopError`` naming every step that failed, after all of
        them ran."""
        if self.server is None:
            return True
        grace = self.config.shutdown_grace_seconds if grace is None else grace
        step = StopSteps()
        stopped = True

        def stop_server() -> None:
            nonlocal stopped
            try:
                self._on_loop(self._shutdown_server(grace), grace + _SERVER_STOP_MARGIN_S)
            except concurrent.futures.TimeoutError:
                stopped = False
                log.warning("gRPC did not stop within %.0f s; closing the store anyway",
                            grace + _SERVER_STOP_MARGIN_S)

        def stop_writer() -> None:
            nonlocal stopped
            assert self.writer is not None
            if not self.writer.close(_PART_STOP_S):
                stopped = False

        def stop_executor() -> None:
            nonlocal stopped
            assert self._executor is not None
            self.store.remove_dispatch_listener(self._on_dispatch)
            done = threading.Thread(target=self._executor.shutdown,
                                    kwargs={"wait": True, "cancel_futures": True}, daemon=True)
            done.start()
            done.join(_PART_STOP_S)
            if done.is_alive() or not self._stop_loop():
                stopped = False

        if self.cluster is not None:  # first: the group elects another master at once
            step("leaving the cluster", self.cluster.stop)
        if self.remoting is not None:  # unregisters from the NameServers first
            step("stopping remoting", lambda: self._on_loop(self.remoting.close(), 30.0))
        step("stopping the gRPC server", stop_server)
        if self.remoting is not None:  # a shared port's gRPC connections: after gRPC's grace
            step("closing relayed gRPC connections",
                 lambda: self._on_loop(self.remoting.close_relays(), 10.0))
        self.server = None
        if self.replication is not None:
            step("stopping replication", self.replication.stop)
        if self.transaction_checks is not None:  # it puts: before the writer goes
            step("stopping transaction checks", self.transaction_checks.close)
        step("writing queued sends", stop_writer)
        step("stopping the executor and the event loop", stop_executor)
        step("closing the timer and metrics", self._close_extensions)
        step("closing the pop state", self.state.close)
        step("closing the store", self.store.close)
        if self.tiered is not None:
            step("closing the tier", self.tiered.close)
        if self.compaction is not None:
            step("closing the compaction store", self.compaction.close)
        step.raise_failures()
        return stopped

