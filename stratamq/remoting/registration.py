"""A broker's registration with its NameServers (``namesrvAddr``), as RocketMQ's
``BrokerOuterAPI.registerBrokerAll``.

``REGISTER_BROKER`` to every NameServer at start, at once when the topic table changes
(``changed()``, from any thread: a topic or retry topic created), and every
``registerNameServerPeriod``; ``UNREGISTER_BROKER`` at stop. The body is RocketMQ's
``RegisterBrokerBody`` as uncompressed JSON (``topicConfigSerializeWrapper``: the topic table
and its data version), with ``bodyCrc32`` in the header. A NameServer that cannot be reached
is logged and tried again at the next turn; the others are not held up by it.

Thread-safety: ``start``/``close`` on the broker's loop; ``changed`` from any thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import zlib
from collections.abc import Callable
from typing import Any

from stratamq.remoting.codec import RemotingCommand
from stratamq.remoting.codes import RequestCode, ResponseCode
from stratamq.remoting.namesrv import to_json
from stratamq.remoting.transport import RemotingClient

log = logging.getLogger(__name__)

__all__ = ["BrokerRegistrar", "parse_namesrv_addr"]

_TIMEOUT_S = 6.0  # RocketMQ's registerBrokerTimeoutMills default


def parse_namesrv_addr(text: str) -> list[str]:
    """``host:port;host:port`` (RocketMQ's separator; commas are accepted too)."""
    return [a.strip() for a in text.replace(",", ";").split(";") if a.strip()]


class BrokerRegistrar:
    """Keeps one broker registered with its NameServers.

    ``identity``: ``clusterName``, ``brokerName``, ``brokerAddr``, ``brokerId``,
    ``haServerAddr``; ``topics()``: the topic table (name -> RocketMQ TopicConfig JSON) and
    its data version, read on the loop each time it registers."""

    def __init__(self, addresses: list[str], identity: dict[str, str],
                 topics: Callable[[], tuple[dict[str, Any], dict[str, Any]]],
                 period_s: float) -> None:
        self.clients = [RemotingClient(a) for a in addresses]
        self.identity = identity
        self.topics = topics
        self.period_s = period_s
        self.registered = 0  # successful registrations, all NameServers counted
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._task = self._loop.create_task(self._run())

    def changed(self) -> None:
        """The topic table changed: register now (any thread)."""
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None and not loop.is_closed():
            loop.call_soon_threadsafe(wake.set)

    async def _run(self) -> None:
        assert self._wake is not None
        while True:
            self._wake.clear()
            try:
                await self.register_all()
            except Exception:  # keep registering: a NameServer must not lose this broker
                log.exception("registering with the NameServers failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.period_s)

    def _request(self) -> RemotingCommand:
        table, version = self.topics()
        body = to_json({"filterServerList": [], "topicConfigSerializeWrapper": {
            "dataVersion": version, "topicConfigTable": table}})
        header = dict(self.identity)
        header.update(compressed="false", heartbeatTimeoutMillis="120000",
                      enableActingMaster="false",
                      bodyCrc32=str(zlib.crc32(body) & 0x7FFFFFFF))
        # version: RocketMQ 4.9.4's ordinal, so a Java NameServer reads the v3.0.11+ body.
        return RemotingCommand(RequestCode.REGISTER_BROKER, version=395, ext_fields=header,
                               body=body)

    async def register_all(self) -> int:
        """Register with every NameServer; returns how many accepted."""
        async def one(client: RemotingClient) -> bool:
            try:
                response = await client.invoke(self._request(), _TIMEOUT_S)
            except (OSError, TimeoutError) as exc:
                log.warning("cannot register with NameServer %s: %s", client.address, exc)
                await client.close()
                return False
            if response.code != ResponseCode.SUCCESS:
                log.warning("NameServer %s refused the registration: %d %s", client.address,
                            response.code, response.remark)
                return False
            return True

        done = sum(await asyncio.gather(*(one(c) for c in self.clients)))
        self.registered += done
        return done

    async def close(self) -> None:
        """Stop registering and unregister from every NameServer (best effort)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
        request_header = {k: self.identity[k] for k in
                          ("clusterName", "brokerName", "brokerAddr", "brokerId")}
        for client in self.clients:
            with contextlib.suppress(OSError, TimeoutError):
                await client.invoke(RemotingCommand(RequestCode.UNREGISTER_BROKER,
                                                    ext_fields=dict(request_header)), 3.0)
            await client.close()
