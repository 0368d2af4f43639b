"""The broker process: ``apache.rocketmq.v2.MessagingService`` for the official RocketMQ 5
clients, plus a small StrataMQ admin service, on one port; and its lifecycle.

Parts (each module says more):

* ``rpc.py``: the thin ``grpc.aio`` adapter; ``admin.py``: the admin service (JSON bodies).
* ``clients.py``, ``sending.py``, ``receiving.py``, ``pulling.py``: the logic, free of gRPC,
  over ``lookup.py`` (topics, groups, ACL), ``engine.py`` + ``pop_state.py`` (pop
  consumption), ``writer.py`` (the single writer combining concurrent sends into one append)
  and ``polling.py`` (long polls as registered waiters).
* ``Broker`` (here): opens the store, builds the parts, runs the gRPC server on an event loop
  of its own thread, and stops everything in order.

Threads: the caller's (``start``/``stop``), ``broker-io`` (the event loop: every RPC handler,
every open stream and waiting poll), ``broker-exec-N`` (``grpcThreadPoolNums`` threads for the
blocking store calls), ``broker-writer`` (appends), and the store's own services.

Hook points for the parts other modules provide (all off by default; set before ``start`` or
built from the config by ``_install_extensions``):

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
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import grpc

from stratamq.broker.clients import ClientRegistry, ClientService
from stratamq.broker.compaction_topics import compaction_admin_handler
from stratamq.broker.engine import PopEngine
from stratamq.broker.lookup import Lookup
from stratamq.broker.metadata import MetadataStore
from stratamq.broker.metrics import NullMetrics
from stratamq.broker.polling import LongPolls
from stratamq.broker.pop_state import PopState
from stratamq.broker.pulling import PullService
from stratamq.broker.receiving import ReceiveService
from stratamq.broker.rpc import MessagingServicer, Services, messaging_handler
from stratamq.broker.sending import SendService
from stratamq.broker.stats_window import BrokerStatsWindow, StatsTee
from stratamq.broker.writer import GroupWriter
from stratamq.compaction.service import CompactionStore
from stratamq.config import BrokerConfig, BrokerRole, StoreConfig
from stratamq.message import DispatchInfo
from stratamq.remoting.transport import listen_socket
from stratamq.store.layout import StoreLayout
from stratamq.store.message_store import MessageStore

log = logging.getLogger(__name__)

__all__ = ["Broker", "BrokerStopError", "NullMetrics"]

_SERVER_STOP_MARGIN_S = 5.0  # past the grace period, how long gRPC's own shutdown may take
_PART_STOP_S = 30.0  # the writer's queue and the executor's calls, each


class BrokerStopError(RuntimeError):
    """One or more shutdown steps failed (all of them ran); ``errors`` names each."""

    def __init__(self, errors: list[tuple[str, BaseException]]) -> None:
        super().__init__("; ".join(f"{name}: {type(exc).__name__}: {exc}"
                                   for name, exc in errors))
        self.errors = errors


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
        host, port = self.advertised
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

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
        """Where the timer, ACL, TLS and metrics services are wired in from ``self.config``.

        Runs after the store is open and before the server starts; each part sets one of
        ``self.timer``, ``self.acl``, ``self.server_credentials`` (before binding, in start),
        ``self.metrics``. Each is built from ``self.config`` unless a caller set it already.
        """
        cfg = self.config
        if self.acl is None and cfg.acl_enable:
            from stratamq.broker.acl import AclChecker

            self.acl = AclChecker.from_config(cfg.acl_file, cfg.acl_access_key,
                                              cfg.acl_secret_key, cfg.acl_signature_window_sec)
        if (self.timer is None and cfg.timer_enable
                and (self.store_config.broker_role is not BrokerRole.SLAVE  # puts refused
                     or cfg.enable_controller_mode)):  # started when elected
            from stratamq.broker.timer import TimerMessageStore

            self.timer = TimerMessageStore(self.store,
                                           max_delay_ms=cfg.timer_max_delay_sec * 1000,
                                           flush_interval_ms=cfg.timer_flush_interval_ms)
            if not cfg.enable_controller_mode:
                self.timer.start()
        if cfg.metrics_exporter_type == "PROM" and isinstance(self.metrics, NullMetrics):
            from stratamq.broker.metrics import BrokerMetrics, BrokerView

            def progress() -> Iterator[tuple[str, str, int, int]]:
                for group in self.meta.groups():
                    for row in self.engine.progress(group.name):
                        yield group.name, row["topic"], row["lag"], row["inflight"]

            def clients() -> list[tuple[str, str]]:
                return [(c["type"], c["group"]) for c in self.clients.live()]

            view = BrokerView(progress, clients,
                              lambda: (len(self.meta.topics()), len(self.meta.groups())))
            self.metrics = BrokerMetrics(self.store, cluster=cfg.broker_cluster_name,
                                         node_id=cfg.broker_name, view=view, timer=self.timer)
            port = self.metrics.serve(cfg.metrics_host, cfg.metrics_port)
            log.info("Prometheus metrics on %s:%d/metrics", cfg.metrics_host, port)
        self.engine.on_dlq = self.metrics.on_dlq
        if self.tiered is not None and hasattr(self.metrics, "registry"):
            from stratamq.tiered.metrics import TierCollector

            self.metrics.registry.register(TierCollector(self.tiered, self.metrics.node))

    def _tls_credentials(self) -> grpc.ServerCredentials | None:
        """TLS from ``tls.server.*`` (and ``tls.client.*``, for the brokers this one calls)
        when ``tlsEnable``; TlsConfigError says what is wrong."""
        cfg = self.config
        if self.server_credentials is not None or not cfg.tls_enable:
            return self.server_credentials
        from stratamq.broker.tls import broker_credentials

        return broker_credentials(cfg, self.store_config.broker_role is BrokerRole.SLAVE)

    def _start_console(self) -> None:
        """The web console on loopback when ``consoleListenPort`` is set: a client of this
        broker's admin RPCs like any other (signed with aclAccessKey when ACL is on, over TLS
        when tlsEnable); ValueError when it cannot reach the broker."""
        cfg = self.config
        if not cfg.console_listen_port:
            return
        from stratamq.broker.tls import console_endpoint
        from stratamq.console.server import ConsoleServer, ConsoleThread

        endpoint = console_endpoint(self.endpoint, cfg)
        server = ConsoleServer(endpoint, f"127.0.0.1:{cfg.console_listen_port}")
        self.console = ConsoleThread(server).start()
        log.info("web console on %s", server.url)

    def _close_extensions(self) -> None:
        """Stop the timer (it puts to the store) and the metrics exporter before the store."""
        if self.console is not None:
            self.console.stop()
        if self.timer is not None and hasattr(self.timer, "close"):
            self.timer.close()
        if hasattr(self.metrics, "close"):
            self.metrics.close()
        if self.stats is not None:
            self.stats.stop()

    # -- start and stop -------------------------------------------------------------------------

    async def _bind(self, address: str) -> int:
        max_len = self.store_config.max_message_size + 1024 * 1024
        self.server = grpc.aio.server(options=[
            ("grpc.max_receive_message_length", max_len),
            ("grpc.max_send_message_length", max_len),
            ("grpc.so_reuseport", 0),
            # gRPC Core holds calls that arrive faster than the loop takes them, and cancels
            # those past 1,000 (3,000 at worst): thousands of clients reconnecting at once
            # (a broker restart) would lose their first calls. Take them all, for 60 s.
            ("grpc.server.max_pending_requests", 100_000),
            ("grpc.server.max_pending_requests_hard_limit", 100_000),
            ("grpc.server_max_unrequested_time_in_server", 60)])
        try:
            if self.server_credentials is not None:
                return self.server.add_secure_port(address, self.server_credentials)
            return self.server.add_insecure_port(address)
        except RuntimeError as exc:
            raise OSError(f"cannot listen on {address}: {exc}") from None

    async def _serve(self, servicer: MessagingServicer,
                     *handlers: grpc.GenericRpcHandler) -> None:
        assert self.server is not None
        self.server.add_generic_rpc_handlers((messaging_handler(servicer), *handlers))
        await self.server.start()

    def start(self) -> str:
        cfg = self.config
        address = (f"[{self.listen_host}]:{self.listen_port}" if ":" in self.listen_host
                   else f"{self.listen_host}:{self.listen_port}")
        self.server_credentials = self._tls_credentials()
        loop = self._start_loop()
        # remotingListenPort 0 (the default) or the listen port: one port for both protocols.
        # The remoting front door takes it (bound here, so a listen port of 0 is known now)
        # and relays gRPC's connections to gRPC on a loopback port.
        shared = cfg.remoting_listen_port in (0, self.listen_port)
        try:
            if shared:
                try:
                    self._shared_listener = listen_socket(self.listen_host, self.listen_port)
                except OSError as exc:  # (no errno: the CLI names the reason, as for gRPC's)
                    raise OSError(f"cannot listen on {address}: {exc.strerror or exc}"
                                  ) from None
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
            self.store = MessageStore(self.store_config, controller_mode=cfg.enable_controller_mode)
            from stratamq.compaction.tiering import link as link_compaction_tier
            from stratamq.tiered import wire

            # Plugged in before the open: its uploader replays from its own durable progress.
            # A SLAVE reads its master's tier but never uploads to it (nor would its uploader
            # follow a cut-back of its CommitLog): no uploader, and its compacted files are
            # not uploaded either (the compaction tier is read-only then).
            # In controller mode the tier is the group's: every broker has an uploader,
            # paused until it is elected (broker/master_duties.py).
            self.tiered = wire(self.store, cluster=cfg.broker_cluster_name,
                               broker=cfg.broker_name,
                               upload=(self.store_config.broker_role is not BrokerRole.SLAVE
                                       or cfg.enable_controller_mode),
                               group=cfg.enable_controller_mode)
            # The topics first: compaction topics are split out from the first replay on.
            self.meta = MetadataStore(self.store_config.root, cfg.default_retry_max_times)
            from stratamq.broker.replication import plug_compaction

            # A slave's compaction queues are pulled from its master (message replication).
            self.compaction, self.compaction_gate = plug_compaction(
                self.store, self.store_config, self.meta)
            link_compaction_tier(self.compaction, self.tiered)  # compacted files in the tier
            from stratamq.broker.transactions import plug_transactions

            # Open transactions, rebuilt from the half and op topics as the store replays.
            self.transaction_table = plug_transactions(self.store, self.store_config.root)
            self.store.open()
        except BaseException:
            self.server = None
            self._stop_loop()
            if self.tiered is not None:
                self.tiered.close()
            if self.compaction is not None:
                self.compaction.close()
            raise
        try:
            if self.tiered is not None:
                self.tiered.start()
            if self.compaction is not None:
                self.compaction.start()
            self._build(loop)
            self._start_console()
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
            self.cluster = self._join_cluster()
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
        self.forwarding = self._master_forwarding()
        services = Services(
            lookup=self.lookup,
            clients=ClientService(self.lookup, self.clients, cfg.broker_name, self.advertised,
                                  self.store_config.max_message_size,
                                  route=self.replication.route,
                                  cluster=self._cluster_routes()),
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
        from stratamq.remoting.broker import RemotingFrontend, registered_host

        cfg = self.config
        assert self.writer is not None
        self.remoting = RemotingFrontend(
            lookup=self.lookup, writer=self.writer, reader=self.store,
            look_up=self.store.look_message_by_offset, query=self.store.query_messages,
            state=self.state, polls=self.polls,
            timer=timer, run=self.run, max_message_size=self.store_config.max_message_size,
            delay_levels_ms=parse_delay_levels(cfg.message_delay_level),
            identity={"clusterName": cfg.broker_cluster_name, "brokerName": cfg.broker_name,
                      # RocketMQ's ids: 0 the master, a slave's above (clients send to 0).
                      "brokerId": "1" if self.store_config.broker_role is BrokerRole.SLAVE
                      else "0", "haServerAddr": ""}, acl=self.acl,
            metrics=lambda: self.counted, producers=self.remoting_producers,
            stats=self.stats, store_stats=self.store.stats.runtime_fields,
            transactions=lambda: self.transactions,
            is_slave=lambda: self.replication.is_slave, delete_topic=self.admin.DeleteTopic,
            refusal=self.replication.refusal,
            settings=lambda: as_properties(self.store_config, cfg),
            status=self.admin.BrokerStatus,
            channel_expired_ms=cfg.channel_expired_timeout)
        shared, self._shared_listener = self._shared_listener, None
        try:
            await self.remoting.start(
                self.listen_host, cfg.remoting_listen_port,
                ("127.0.0.1", self.grpc_port) if shared is not None else None,
                registered_host(self.store_config.broker_ip, self.listen_host),
                cfg.namesrv_addr, cfg.register_name_server_period,
                self.store_config.max_message_size, listener=shared)
        except OSError as exc:  # (no errno: the CLI prints it as it is)
            raise OSError(f"cannot listen on {self.listen_host}:{cfg.remoting_listen_port} "
                          f"(remotingListenPort): {exc.strerror or exc}") from None
        log.info("broker %s serving remoting on port %d", cfg.broker_name, self.remoting.port)
        if self.cluster is not None and cfg.remoting_listen_port == 0:  # bound to a free port
            self.cluster.announce_remoting(self._remoting_address(self.remoting.port))

    def _join_cluster(self) -> Any:
        from stratamq.cluster.node import ClusterNode
        from stratamq.ha.epochs import EpochFile

        replication, store = self.replication, self.store
        host = self.advertised[0]

        def last_epoch() -> int:  # of the store's epoch file, whatever the role
            epochs = replication.ha.epochs or EpochFile(replication.ha.epoch_file)
            return epochs.entries[-1].epoch if epochs.entries else 0

        node = ClusterNode(self.config, endpoint=self.endpoint,
                           ha_address=f"{host}:{self.store_config.ha_listen_port}",
                           max_offset=lambda: store.max_physical_offset,
                           last_epoch=last_epoch, switch_role=replication.switch_role,
                           put_guards=store.put_guards, progress=replication.slave_progress,
                           max_gap=self.store_config.ha_max_gap_not_in_sync,
                           topics=self._topic_entries,
                           remoting_address=self._remoting_address(),
                           take_over_state=replication.take_over_state)
        if node.publisher is not None:
            self.meta.add_topics_listener(node.publisher.changed)
        node.start()
        return node

    def _topic_entries(self) -> dict[str, bytes]:
        """This broker's topics as the cluster's route table holds them (cluster/routes.py)."""
        from stratamq.cluster.routes import topic_entry

        return {t.name: topic_entry(t.read_queue_nums, t.write_queue_nums, t.perm,
                                    t.message_type) for t in self.meta.topics()}

    def _remoting_address(self, port: int | None = None) -> str:
        """Where 4.x clients reach this broker, for NameServers reading routes from etcd ("" if
        off, or not known before remoting starts: remotingListenPort=0, announced then)."""
        from stratamq.remoting.broker import registered_host

        port = self.config.remoting_listen_port if port is None else port
        if port <= 0:
            return ""
        host = registered_host(self.store_config.broker_ip, self.listen_host)
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def _relayed_peer(self, grpc_peer: str) -> str:
        """gRPC's peer, or the client behind it when the shared port relayed the connection."""
        remoting = self.remoting
        return remoting.relayed_peer(grpc_peer) if remoting is not None else grpc_peer

    def _master_forwarding(self) -> Any:
        """Controller mode: a slave's pop RPCs sent to its group's master; else None."""
        if not self.config.enable_controller_mode:
            return None  # a static slave serves them while its master is away
        from stratamq.broker.forwarding import for_broker

        replication, member = self.replication, self.cluster.member

        def master() -> str | None:  # None: served here; "": the group has no master now
            if replication.is_slave:
                return replication.master_endpoint
            # Stepping down (a planned switch) stops pops before the key goes and the role
            # changes: nothing more is popped here, so the next master's last copy holds it all.
            return None if member.serves_pops else ""

        return for_broker(self.config, self.store_config.max_message_size + 1024 * 1024,
                          master)

    def _cluster_routes(self) -> Any:
        """Routes across every group of the cluster (controller mode), else None."""
        if self.cluster is None:
            return None
        from stratamq.broker.cluster_routes import ClusterRoutes

        replication = self.replication
        return ClusterRoutes(self.cluster.routes, self.config.broker_name,
                             is_master=lambda: not replication.is_slave)

    def _on_dispatch(self, info: DispatchInfo) -> None:
        self.polls.notify(info.topic)

    def _abandon_start(self) -> None:
        """Undo a start that failed after the store opened: nothing may stay running."""
        if self.cluster is not None:
            with _suppress_all():
                self.cluster.stop()
        if self.server is not None:
            with _suppress_all():
                self._on_loop(self.server.stop(0))
            self.server = None
        if self._shared_listener is not None:  # (bound, not yet handed to remoting)
            self._shared_listener.close()
            self._shared_listener = None
        if self.remoting is not None:
            with _suppress_all():
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
            with _suppress_all():
                self.replication.stop()
        with _suppress_all():
            self._close_extensions()
        if hasattr(self, "state"):
            with _suppress_all():
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
        errors: list[tuple[str, BaseException]] = []
        stopped = True

        def step(name: str, action: Callable[[], object]) -> None:
            try:
                action()
            except BaseException as exc:  # every step runs; all failures are reported
                log.error("broker stop: %s failed: %s", name, exc)
                errors.append((name, exc))

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
        if errors:
            raise BrokerStopError(errors)
        return stopped


class _suppress_all:
    """Swallow (and log) any exception: undoing a failed start must undo everything."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> bool:
        if exc is not None:
            log.warning("while undoing a failed start: %s", exc)
        return True
