"""A slave's pop consumption sent to its group's master (controller mode), as RocketMQ's proxy
sends it.

After a failover or a planned ``cluster elect`` a client's cached route (refreshed every 30 s)
still names the old master, now a slave. RocketMQ's proxy sends every pop, ack, invisible-time
change and dead-letter forward to the group's *current* master (``TopicRouteService.
getBrokerAddr`` -> the ``MixAll.MASTER_ID`` address; ``ConsumerProcessor``), and the official
clients receive only from master queues. A StrataMQ slave answering them from its own copy of
the pop state would deliver what the master already delivered, and its acknowledgements would
be undone by the next copy of the master's state. So a broker in controller mode that is not
its group's master forwards ``ReceiveMessage``, ``AckMessage``, ``ChangeInvisibleDuration``
and ``ForwardMessageToDeadLetterQueue`` to its master:

* the request as the client sent it, with the client's metadata (ACL signature, client id,
  language, ...; not gRPC's own headers) and the client's remaining deadline;
* the master's answer (status, messages, receipt handles) back unchanged;
* the master unreachable: ``INTERNAL_SERVER_ERROR`` "connect to <master> failed", as the
  proxy answers a ``RemotingConnectException``; no answer within the client's deadline:
  ``PROXY_TIMEOUT``, as it answers a ``RemotingTimeoutException``; any other gRPC failure of
  the call: ``INTERNAL_SERVER_ERROR`` naming it. Never a pop from the slave's own state;
* the group has no master (an election under way, or this broker is a master stepping down:
  it dropped the master key, its role has not switched yet): ``ReceiveMessage`` is answered
  ``FORBIDDEN`` "no readable queue" (the proxy's ``ConsumerProcessor`` answer when it finds no
  queue to pop from), the other three ``INTERNAL_SERVER_ERROR`` (the proxy has no master
  address to send them to). The client retries; nothing is acknowledged.

A broker outside controller mode (a static master/slave pair) is left alone: its slave serves
reads while its master is away (slave-acting-master, ``replication.py``), which forwarding
would undo.

One channel per master endpoint, made on first use and closed (its calls given a grace
period) when the master changes or the broker stops. Handed only the current master's
endpoint and how to open a channel to it, never the Broker.

Thread-safety: every method runs on the broker's event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc

from stratamq.broker.errors import BrokerError
from stratamq.broker.tls import peer_endpoint
from stratamq.client.connection import broker_answered
from stratamq.config import BrokerConfig

__all__ = ["FORWARDED", "MasterForwarding", "for_broker"]

log = logging.getLogger(__name__)

Code = pb.Code
_SERVICE = "/apache.rocketmq.v2.MessagingService/"
# The RPCs a slave forwards, with their response types.
FORWARDED: dict[str, Any] = {
    "ReceiveMessage": svc.ReceiveMessageResponse,
    "AckMessage": svc.AckMessageResponse,
    "ChangeInvisibleDuration": svc.ChangeInvisibleDurationResponse,
    "ForwardMessageToDeadLetterQueue": svc.ForwardMessageToDeadLetterQueueResponse,
}
# Metadata gRPC sets itself on every call: not the client's to pass on.
_TRANSPORT_KEYS = frozenset({"user-agent", "te", "content-type", "grpc-timeout",
                             "grpc-encoding", "grpc-accept-encoding"})
_CLOSE_GRACE_S = 30.0  # a replaced channel's calls (a long poll) may finish meanwhile


class MasterForwarding:
    """Forwards a slave's pop RPCs to its master; see the module docstring.

    ``master()``: None while this broker serves them itself (it is the master, or not in
    controller mode); "" while its group has no master; else the master's client endpoint.
    ``connect(endpoint)``: a ``grpc.aio`` channel to it (TLS and options as the broker's)."""

    def __init__(self, master: Callable[[], str | None],
                 connect: Callable[[str], grpc.aio.Channel], group: str) -> None:
        self.master = master
        self.connect = connect
        self.group = group
        self._endpoint = ""
        self._channel: grpc.aio.Channel | None = None
        self._closing: set[asyncio.Task[Any]] = set()

    def target(self) -> str | None:
        """Where this broker's pop RPCs go now: None (served here), "" (no master), else
        the master's endpoint."""
        return self.master()

    def _channel_to(self, endpoint: str) -> grpc.aio.Channel:
        if self._channel is None or endpoint != self._endpoint:
            self._close_current()
            log.info("pop consumption of group %s forwarded to its master %s", self.group,
                     endpoint)
            self._channel, self._endpoint = self.connect(endpoint), endpoint
        return self._channel

    def _close_current(self) -> None:
        channel, self._channel = self._channel, None
        if channel is not None:
            task = asyncio.ensure_future(channel.close(grace=_CLOSE_GRACE_S))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        """Close the channel (on the loop, as the broker stops)."""
        channel, self._channel = self._channel, None
        if channel is not None:
            await channel.close(grace=None)
        for task in list(self._closing):
            task.cancel()

    async def receive(self, request: Any, context: grpc.aio.ServicerContext,
                      endpoint: str) -> list[svc.ReceiveMessageResponse]:
        """``ReceiveMessage`` at the master: its whole stream (status, messages, delivery
        time). A stream the master breaks after its status keeps what came (those messages
        were popped there and are the client's); before it, a status that says why."""
        if not endpoint:
            raise BrokerError(Code.FORBIDDEN, f"no readable queue: broker group {self.group} "
                              "has no master now (an election is under way); retry shortly")
        call = self._channel_to(endpoint).unary_stream(
            _SERVICE + "ReceiveMessage", request_serializer=_serialize,
            response_deserializer=svc.ReceiveMessageResponse.FromString)
        got: list[svc.ReceiveMessageResponse] = []
        try:
            async for response in call(request, **_call_options(context)):
                got.append(response)
        except grpc.RpcError as exc:
            if not any(r.HasField("status") for r in got):
                raise _failure("ReceiveMessage", endpoint, exc) from None
            log.warning("ReceiveMessage forwarded to master %s broke after its status: %s",
                        endpoint, _describe(exc))
        return got

    async def unary(self, name: str, request: Any, context: grpc.aio.ServicerContext,
                    endpoint: str) -> Any:
        """``AckMessage``, ``ChangeInvisibleDuration`` or ``ForwardMessageToDeadLetterQueue``
        at the master, its answer as it is."""
        if not endpoint:
            raise BrokerError(Code.INTERNAL_SERVER_ERROR,
                              f"{name}: broker group {self.group} has no master now (an "
                              "election is under way); retry shortly")
        call = self._channel_to(endpoint).unary_unary(
            _SERVICE + name, request_serializer=_serialize,
            response_deserializer=FORWARDED[name].FromString)
        try:
            return await call(request, **_call_options(context))
        except grpc.RpcError as exc:
            raise _failure(name, endpoint, exc) from None


def _serialize(request: Any) -> bytes:
    return request.SerializeToString()


def _call_options(context: grpc.aio.ServicerContext) -> dict[str, Any]:
    """The client's metadata and remaining deadline, for the call to the master."""
    metadata: Sequence[tuple[str, Any]] = context.invocation_metadata() or ()
    passed = tuple((k, v) for k, v in metadata
                   if not k.startswith(":") and k not in _TRANSPORT_KEYS)
    return {"metadata": passed, "timeout": context.time_remaining()}


def _describe(exc: grpc.RpcError) -> str:
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    return f"{code.name if code is not None else 'UNKNOWN'}: {details}"


def _failure(name: str, endpoint: str, exc: grpc.RpcError) -> BrokerError:
    """The status a forwarded call that failed in gRPC is answered with (the proxy's
    ``ResponseBuilder`` mapping of the remoting client's exceptions)."""
    code = exc.code() if hasattr(exc, "code") else None
    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
        return BrokerError(Code.PROXY_TIMEOUT,
                           f"{name}: the group's master {endpoint} did not answer within the "
                           "request's deadline")
    if code is grpc.StatusCode.UNAVAILABLE and not broker_answered(exc):
        return BrokerError(Code.INTERNAL_SERVER_ERROR,
                           f"{name}: connect to {endpoint} failed (the group's master, which "
                           f"this slave forwards pop consumption to: {_describe(exc)})")
    return BrokerError(Code.INTERNAL_SERVER_ERROR,
                       f"{name}: the group's master {endpoint} failed the call: "
                       f"{_describe(exc)}")


def for_broker(config: BrokerConfig, max_message_length: int,
               master: Callable[[], str | None]) -> MasterForwarding:
    """The forwarding of a broker with these settings: channels as ``tls.peer_endpoint``
    makes them (over TLS when it serves TLS, trusting ``tls.client.trustCertPath`` else its
    own certificate, presenting ``tls.client.certPath``), messages as large as it serves.
    The client's own signature goes with each call, not the broker's."""
    options = [("grpc.max_receive_message_length", max_message_length),
               ("grpc.max_send_message_length", max_message_length)]
    peer = peer_endpoint("", config, options)  # its TLS files read once, now

    def connect(endpoint: str) -> grpc.aio.Channel:
        return peer.at(endpoint).aio_channel()

    return MasterForwarding(master, connect, config.broker_name)
