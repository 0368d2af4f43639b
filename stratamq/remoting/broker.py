"""The broker's remoting front end: the request codes RocketMQ 4.x clients use, served on
``remotingListenPort`` over the same services as the gRPC adapter, and the NameServer
registration (``namesrvAddr``).

``RemotingFrontend`` is handed the narrow parts it uses (lookups, the single writer, a queue
reader, the offsets, the long polls, the timer, the executor's ``run``), never the broker.
The address it registers is the one clients reach: ``brokerIP1`` when set to something other
than loopback or when the broker listens on every interface, else the listen host; with the
remoting port.

Thread-safety: ``start``/``close`` on the broker's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Callable
from typing import Any

from stratamq.broker.acl import AclChecker
from stratamq.broker.lookup import Lookup
from stratamq.broker.polling import LongPolls
from stratamq.broker.pop_state import PopState
from stratamq.broker.ports import Call, MessageReader
from stratamq.broker.stats_window import BrokerStatsWindow
from stratamq.broker.writer import GroupWriter
from stratamq.message import StoredMessage
from stratamq.remoting.acl import VERIFIED_KEY, RemotingAcl
from stratamq.remoting.broker_admin import AdminHandlers
from stratamq.remoting.broker_admin_clients import ClientAdminHandlers
from stratamq.remoting.broker_consume import ConsumeHandlers
from stratamq.remoting.broker_lookup import LookupHandlers, Query
from stratamq.remoting.broker_retry import SendBackHandler
from stratamq.remoting.broker_send import SendHandlers
from stratamq.remoting.broker_transactions import RemotingProducers, TransactionHandlers
from stratamq.remoting.clients import ConsumerTable
from stratamq.remoting.codec import DEFAULT_MAX_FRAME, RemotingCommand
from stratamq.remoting.codes import RequestCode
from stratamq.remoting.errors import RemotingError
from stratamq.remoting.locks import QueueLocks
from stratamq.remoting.registration import BrokerRegistrar, parse_namesrv_addr
from stratamq.remoting.transport import Connection, Handler, RemotingServer

__all__ = ["RemotingFrontend", "registered_host"]

AUTO_CREATE_TOPIC = "TBW102"  # TopicValidator.AUTO_CREATE_TOPIC_KEY_TOPIC
_EXPIRY_SCAN_S = 10.0  # RocketMQ's ClientHousekeepingService period


def registered_host(broker_ip: str, listen_host: str) -> str:
    """The host clients reach (see the module docstring)."""
    if listen_host in ("0.0.0.0", "::", "") or broker_ip not in ("127.0.0.1", ""):
        return broker_ip or "127.0.0.1"
    return listen_host


class RemotingFrontend:
    """The broker's remoting server and its NameServer registration."""

    def __init__(self, *, lookup: Lookup, writer: GroupWriter, reader: MessageReader,
                 look_up: Callable[[int], StoredMessage | None], query: Query,
                 state: PopState,
                 polls: LongPolls, timer: Any, run: Callable[..., Any],
                 max_message_size: int, delay_levels_ms: list[int],
                 identity: dict[str, str], acl: AclChecker | None = None,
                 metrics: Callable[[], Any] | None = None,
                 producers: RemotingProducers | None = None,
                 transactions: Callable[[], Any] = lambda: None,
                 is_slave: Callable[[], bool] = lambda: False,
                 delete_topic: Callable[[dict[str, Any]], Any] | None = None,
                 refusal: Callable[[str], str | None] = lambda method: None,
                 settings: Callable[[], dict[str, str]] = dict,
                 status: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
                 channel_expired_ms: int = 120_000,
                 stats: BrokerStatsWindow | None = None,
                 store_stats: Callable[[], dict[str, str]] | None = None) -> None:
        # With ACL on, the remoting adapter verifies RocketMQ 4 signatures itself and checks
        # permissions through the same accounts (its own Lookup over the same metadata).
        self.acl = RemotingAcl(acl) if acl is not None else None
        if self.acl is not None:
            lookup = Lookup(lookup.meta, lookup.config, self.acl)
        self.lookup = lookup
        # Consumers without a heartbeat for channelExpiredTimeout are dropped (ConsumerManager).
        self.consumers = ConsumerTable(channel_expired_ms / 1000)
        self.identity = identity  # clusterName, brokerName, brokerId, haServerAddr
        self.send = SendHandlers(lookup, writer, max_message_size, timer, self.call_of, run,
                                 delay_levels_ms, metrics)
        self.send_back = SendBackHandler(
            lookup, look_up, self.send, self.call_of, run,
            (lambda group, topic: metrics().on_dlq(group, topic)) if metrics else None)
        self.locks = QueueLocks()
        self.lookups = LookupHandlers(lookup, reader, look_up, query, self.call_of, run)
        # 4.x producers (HEART_BEAT's producerDataSet): where transaction checks go.
        self.producers = producers if producers is not None else RemotingProducers()
        self.consume = ConsumeHandlers(
            lookup, reader, state, polls, self.consumers, self.call_of, run,
            self.producers.table,
            (lambda group, topic, n, nbytes: metrics().on_receive(group, topic, n, nbytes))
            if metrics else None)
        self.transactions = TransactionHandlers(lookup, transactions, look_up, is_slave,
                                                self.call_of, run)
        self.server: RemotingServer | None = None
        self.registrar: BrokerRegistrar | None = None
        self.port = 0
        self._started_ms = int(time.time() * 1000)
        self.advertised = ""  # host:port registered with the NameServers, once started
        self.admin = AdminHandlers(lookup, reader, state, self.consumers,
                                   identity.get("brokerName", ""), self._started_ms,
                                   self.call_of, run, delete_topic, refusal, settings,
                                   status, stats, store_stats, look_up)
        self.client_admin = ClientAdminHandlers(
            lookup, reader, state, polls, self.consumers, self.producers.table,
            identity.get("brokerName", ""), lambda: self.advertised, self.lookups.record_at,
            self.call_of, run, refusal)
        self._housekeeping: asyncio.Task[None] | None = None

    def call_of(self, request: RemotingCommand, conn: Connection) -> Call:
        """The request as the shared logic sees it: its peer and (ACL on) the access key
        ``guarded`` verified."""
        if self.acl is None:
            return Call(peer=conn.peer)
        return Call(metadata={VERIFIED_KEY: request.ext_fields.get("AccessKey", "")},
                    peer=conn.peer)

    def _guarded(self, handler: Handler) -> Handler:
        acl = self.acl
        if acl is None:
            return handler

        async def verified(request: RemotingCommand, conn: Connection
                           ) -> RemotingCommand | None:
            try:
                acl.verify(request)
            except RemotingError as exc:
                return request.response(exc.code, exc.message)
            return await handler(request, conn)

        return verified

    @property
    def handlers(self) -> dict[int, Handler]:
        return {code: self._guarded(h)
                for code, h in {**self.admin.handlers(), **self.client_admin.handlers(),
                                **self._handlers()}.items()}

    def _handlers(self) -> dict[int, Handler]:
        s, c = self.send, self.consume
        return {RequestCode.SEND_MESSAGE: s.send, RequestCode.SEND_MESSAGE_V2: s.send,
                RequestCode.SEND_BATCH_MESSAGE: s.send_batch,
                RequestCode.PULL_MESSAGE: c.pull,
                RequestCode.QUERY_CONSUMER_OFFSET: c.query_offset,
                RequestCode.UPDATE_CONSUMER_OFFSET: c.update_offset,
                RequestCode.GET_MAX_OFFSET: c.max_offset,
                RequestCode.GET_MIN_OFFSET: c.min_offset,
                RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: c.search_offset,
                RequestCode.GET_EARLIEST_MSG_STORETIME: c.earliest_store_time,
                RequestCode.HEART_BEAT: c.heartbeat,
                RequestCode.UNREGISTER_CLIENT: c.unregister_client,
                RequestCode.GET_CONSUMER_LIST_BY_GROUP: c.consumer_list,
                RequestCode.CONSUMER_SEND_MSG_BACK: self.send_back.send_back,
                RequestCode.END_TRANSACTION: self.transactions.end_transaction,
                RequestCode.VIEW_MESSAGE_BY_ID: self.lookups.view_by_id,
                RequestCode.QUERY_MESSAGE: self.lookups.query_message,
                RequestCode.LOCK_BATCH_MQ: self.locks.lock_batch,
                RequestCode.UNLOCK_BATCH_MQ: self.locks.unlock_batch}

    def topic_table(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The topic table and data version a registration carries."""
        meta, config = self.lookup.meta, self.lookup.config
        table = {t.name: t.to_json() for t in meta.topics()}
        if config.auto_create_topic_enable:
            # RocketMQ's TBW102: with autoCreateTopicEnable the broker registers this topic
            # (perm inherit|read|write), so 4.x producers find a route for a topic nobody
            # created yet and send; the send creates it (defaultTopicQueueNums queues).
            queues = config.default_topic_queue_nums
            table[AUTO_CREATE_TOPIC] = {
                "topicName": AUTO_CREATE_TOPIC, "readQueueNums": queues,
                "writeQueueNums": queues, "perm": 7, "topicFilterType": "SINGLE_TAG",
                "topicSysFlag": 0, "order": False}
        return table, {"counter": meta.topics_version, "stateVersion": 0,
                       "timestamp": self._started_ms}

    def _topics_changed(self) -> None:
        if self.registrar is not None:
            self.registrar.changed()

    async def start(self, host: str, port: int, forward: tuple[str, int] | None,
                    advertised_host: str, namesrv_addr: str, register_period_ms: int,
                    max_message_size: int, listener: socket.socket | None = None) -> int:
        """Serve remoting on ``host:port`` (or on ``listener``, bound already); ``forward``:
        the port is the broker's listen port, shared with gRPC, which listens at ``forward``
        (connections not speaking remoting are relayed there)."""
        self.server = RemotingServer(self.handlers,
                                     max(DEFAULT_MAX_FRAME, max_message_size + (1 << 20)),
                                     on_close=self.consume.connection_closed)
        self.port = await self.server.start(host, port, forward, listener)
        self.producers.loop = asyncio.get_running_loop()
        self._housekeeping = asyncio.get_running_loop().create_task(self._expire_clients())
        addresses = parse_namesrv_addr(namesrv_addr)
        self.advertised = f"{advertised_host}:{self.port}"
        if addresses:
            identity = dict(self.identity, brokerAddr=self.advertised)
            self.registrar = BrokerRegistrar(addresses, identity, self.topic_table,
                                             register_period_ms / 1000)
            self.lookup.meta.add_topics_listener(self._topics_changed)
            self.registrar.start()
        return self.port

    async def _expire_clients(self) -> None:
        while True:
            await asyncio.sleep(_EXPIRY_SCAN_S)
            for group in self.consumers.expire():
                self.consume.notify_changed(group)
            self.producers.table.expire()

    def relayed_peer(self, grpc_peer: str) -> str:
        """The client behind a gRPC connection the shared port relays (else the peer as is)."""
        server = self.server
        return server.relayed_peer(grpc_peer) if server is not None else grpc_peer

    async def close_relays(self) -> None:
        """End the gRPC connections a shared port relays (after gRPC's own stop: ``close``
        leaves them to finish their calls)."""
        if self.server is not None:
            self.server.close_relays()

    async def close(self) -> None:
        if self._housekeeping is not None:
            self._housekeeping.cancel()
            with contextlib.suppress(BaseException):
                await self._housekeeping
        if self.registrar is not None:
            await self.registrar.close()
        if self.server is not None:
            await self.server.close()
