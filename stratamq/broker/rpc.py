"""The gRPC adapter: ``apache.rocketmq.v2.MessagingService`` on ``grpc.aio``, for the official
RocketMQ 5 clients.

Protocol definitions come from the generated modules shipped in the official client package
(``rocketmq.grpc_protocol``), never from hand-copied ``.proto`` files.

Each handler is a coroutine on the broker's event loop that turns its context into a ``Call``,
hands the request to the logic (``clients.py``, ``sending.py``, ``receiving.py``,
``pulling.py``) and writes the answer. Calls that may block (store reads, pop-state and
metadata writes) run in the broker's executor (``run``); a send awaits the single writer
(``writer.py``); a long poll awaits a registered waiter (``polling.py``). An open ``Telemetry``
stream or a waiting receive is a suspended coroutine, not a thread. Every failure is answered
with a ``Status`` (``BrokerError`` -> its code, ``MetadataError`` -> BAD_REQUEST, a damaged
stored record or a bug -> INTERNAL_SERVER_ERROR, as the proxy's ``ResponseBuilder`` answers
what it has no mapping for), with a message that names the RPC and the topic / queue / offset
it concerns, never a Python exception's class or text; nothing a client sends crashes the
broker. A request that is no valid protobuf (bad wire format, a string field that is not
UTF-8) is answered with gRPC ``INVALID_ARGUMENT`` and one WARNING line (``messaging_handler``
decodes requests itself: grpc.aio would answer UNKNOWN and log a traceback per request).

RPCs:

* ``QueryRoute``: one ``MessageQueue`` per queue id with READ/WRITE permission, this broker
  (id 0) and the endpoints the client used, and the topic's message type as the only accepted
  type. Unknown topic: ``TOPIC_NOT_FOUND`` (auto-create is off by default).
* ``Heartbeat`` / ``NotifyClientTermination``: the broker tracks live clients per group.
* ``Telemetry``: each ``settings`` command is answered with the broker's settings
  (``ClientService.settings``); a producer's stream also carries the broker's transaction
  checks (``RecoverOrphanedTransactionCommand``, see ``broker/transactions.py``).
* ``SendMessage``: NORMAL / FIFO (the message group picks the queue by hash) / DELAY (held in
  the timer topic; ``UNSUPPORTED`` when no timer service runs) / TRANSACTION (stored as a half
  message, answered with its transaction id). The message type must match the topic's. One put
  per request, combined with concurrent requests' puts by the writer. A ``body_digest`` that
  does not match the body refuses the request ``MESSAGE_CORRUPTED``.
* ``EndTransaction``: commit or roll back a half message (``broker/transactions.py``); open
  ones are checked back with a ``RecoverOrphanedTransactionCommand`` down a producer's
  ``Telemetry`` stream.
* ``ReceiveMessage`` (server stream: status, then the messages, then the delivery timestamp),
  ``AckMessage``, ``ChangeInvisibleDuration``, ``ForwardMessageToDeadLetterQueue``,
  ``QueryAssignment`` (one assignment per topic with queue id -1: a receive pops across every
  queue, as RocketMQ's proxy does): see ``engine.py`` and ``receiving.py``. Past the long-poll
  limits a receive is answered ``TOO_MANY_REQUESTS`` "polling full". In controller mode a
  slave sends the first four to its group's master and answers with the master's answer
  (``forwarding.py``).

Offset-based reads, for replaying a queue from any offset (what the Spark source uses):

* ``QueryOffset(message_queue{topic.name, id}, query_offset_policy)``: ``BEGINNING`` -> the
  queue's min offset, ``END`` -> its max offset (the next offset to be written),
  ``TIMESTAMP`` (+ ``timestamp``) -> the first offset stored at or after that time (the max
  offset if none). Unknown topic: ``TOPIC_NOT_FOUND``; queue id out of range: ``BAD_REQUEST``.
* ``PullMessage(group.name, message_queue{topic.name, id}, offset, batch_size,
  filter_expression, long_polling_timeout)``: a server stream of ``status``, then up to
  ``batch_size`` messages in offset order (``system_properties.queue_offset`` is each
  message's offset; bodies are byte-identical; no receipt handle), then ``next_offset``: the
  offset to pull from next (it moves past messages the tag filter skipped). Status ``OK`` when
  the pull read something (possibly zero messages after filtering, with ``next_offset``
  advanced); ``MESSAGE_NOT_FOUND`` when ``offset`` is the end of the queue and nothing arrived
  within ``long_polling_timeout``, or (at once, with ``next_offset`` past it) when ``offset``
  is in a hole the queue's sources no longer hold (data lost from the tier: RocketMQ's
  ``OFFSET_FOUND_NULL`` -> ``PULL_NOT_FOUND``; the whole hole in one answer);
  ``ILLEGAL_OFFSET`` when ``offset`` is below the min offset (retention removed it) or past
  the end, with ``next_offset`` set to the min / max offset to resume from. A reader replays
  ``[start, end)`` by pulling from ``start`` and following ``next_offset`` until it reaches
  ``end`` (from ``QueryOffset END`` taken at the start).
  Pulls keep no state and need no consumer group registration (the group name is only used
  for logging and access control).
  With request metadata ``x-stratamq-pull-format: records`` (StrataMQ's Spark source) the
  broker answers with the same metadata and each message's ``body`` is the whole stored
  CommitLog record (``system_properties`` carry only ``queue_id`` and ``queue_offset``).
* ``UpdateOffset`` / ``GetOffset``: a pull consumer's committed offset per (group, queue),
  durable; ``GetOffset`` falls back to the group's pop progress, else ``OFFSET_NOT_FOUND``.
  Any offset >= 0 is kept, past the queue's end too, as RocketMQ's broker commits it
  (``ConsumerManageProcessor.updateConsumerOffset`` has no bound); the pull from it answers
  ``ILLEGAL_OFFSET`` with the max offset as ``next_offset`` (the broker's
  OFFSET_OVERFLOW_BADLY, which moves a RocketMQ consumer's offset back).

Not supported (answered ``NOT_IMPLEMENTED``): ``RecallMessage``, lite topics
(``SyncLiteSubscription``), SQL92 filters (``ILLEGAL_FILTER_EXPRESSION``).

Thread-safety: every handler runs on the broker's event loop; the logic it calls in the
executor is thread-safe (see each module).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc

from stratamq.broker.clients import ClientService, ok_status
from stratamq.broker.errors import BrokerError, damage_text
from stratamq.broker.forwarding import FORWARDED, MasterForwarding
from stratamq.broker.lookup import Lookup
from stratamq.broker.metadata import MetadataError
from stratamq.broker.ports import Call
from stratamq.broker.pulling import PULL_FORMAT_KEY, PULL_FORMAT_RECORDS, PullService
from stratamq.broker.receiving import ReceiveService, Run
from stratamq.broker.sending import SendService
from stratamq.broker.writer import GroupWriter
from stratamq.message import RecordCorrupt

log = logging.getLogger(__name__)
Code = pb.Code

__all__ = ["MessagingServicer", "Services", "call_of", "messaging_handler", "subject_of"]


def call_of(context: grpc.aio.ServicerContext,
            peer_names: Callable[[str], str] | None = None) -> Call:
    """The logic's view of an RPC. ``peer_names``: who is behind gRPC's peer (a connection
    the shared port relays comes from the relay's loopback socket)."""
    peer = context.peer() or ""
    return Call(dict(context.invocation_metadata() or ()),
                peer_names(peer) if peer_names is not None else peer,
                context.time_remaining())


class _MetadataOnDemand(Mapping[str, str]):
    """An RPC's metadata, read from its context the first time it is looked at.

    A send reads its metadata only to check access (never with ACL off), and turning the
    context's metadata into a dict was a measurable share of a 1-message send. Only for a
    ``Call`` whose logic runs on the loop, while the RPC lasts (the context's lifetime)."""

    __slots__ = ("_context", "_items")

    def __init__(self, context: grpc.aio.ServicerContext) -> None:
        self._context = context
        self._items: dict[str, str] | None = None

    def _read(self) -> dict[str, str]:
        if self._items is None:
            self._items = dict(self._context.invocation_metadata() or ())
        return self._items

    def __getitem__(self, key: str) -> str:
        return self._read()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._read())

    def __len__(self) -> int:
        return len(self._read())


_CODE_NAMES = {value: pb.Code.Name(value) for value in pb.Code.values()}


def _code_name(code: int) -> str:
    return _CODE_NAMES.get(code) or str(code)


def subject_of(request: Any) -> str:
    """What a request is about, for an error message: its queue, topic or group."""
    fields = request.DESCRIPTOR.fields_by_name
    if "message_queue" in fields and request.HasField("message_queue"):
        mq = request.message_queue
        queue = f" queue {mq.id}" if mq.id >= 0 else ""
        at = f" at offset {request.offset}" if "offset" in fields else ""
        return f"topic {mq.topic.name!r}{queue}{at}"
    if "topic" in fields and request.HasField("topic"):
        return f"topic {request.topic.name!r}"
    if "messages" in fields and len(request.messages):
        return f"topic {request.messages[0].topic.name!r}"
    if "group" in fields and request.HasField("group"):
        return f"group {request.group.name!r}"
    return "the request"


def failure_status(name: str, request: Any, exc: Exception) -> pb.Status:
    """The status of a call that raised ``exc`` (called in its ``except`` block): a
    ``BrokerError`` its code, a ``MetadataError`` BAD_REQUEST, a damaged stored record or
    anything else (a bug, logged with its traceback) INTERNAL_SERVER_ERROR, as the proxy's
    ResponseBuilder answers what it has no mapping for. The message names the RPC and what
    the request concerns, never the Python exception: a bug must cost one request, not the
    broker, and tell the client nothing of its insides."""
    if isinstance(exc, BrokerError):
        return ok_status(exc.code, exc.message)
    if isinstance(exc, MetadataError):
        return ok_status(Code.BAD_REQUEST, str(exc))
    subject = subject_of(request) if request is not None else "the request"
    if isinstance(exc, RecordCorrupt):
        text = f"{name} of {subject}: {damage_text(exc)}"
        log.error("%s", text)
        return ok_status(Code.INTERNAL_SERVER_ERROR, text)
    log.exception("%s of %s failed", name, subject)
    return ok_status(Code.INTERNAL_SERVER_ERROR,
                     f"{name} of {subject} failed inside the broker (an internal error, "
                     "logged with its details at the broker)")


def _failure(name: str, response_cls: type, exc: Exception, request: Any = None) -> Any:
    return response_cls(status=failure_status(name, request, exc))


class Undecodable:
    """What ``messaging_handler``'s decoders give for bytes that are no valid request."""

    __slots__ = ("method", "problem")

    def __init__(self, method: str, problem: str) -> None:
        self.method, self.problem = method, problem


def _decoder(method: str, request_cls: Any) -> Callable[[bytes], Any]:
    parse = request_cls.FromString

    def decode(raw: bytes) -> Any:
        try:
            return parse(raw)
        except DecodeError as exc:  # bad wire format, or a string that is not UTF-8
            return Undecodable(method, str(exc))

    return decode


async def _refuse_undecodable(request: Undecodable, context: grpc.aio.ServicerContext) -> None:
    log.warning("%s from %s: undecodable request: %s", request.method, context.peer(),
                request.problem)
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                        f"{request.method}: the request is not a valid protobuf message "
                        f"({request.problem})")


def messaging_handler(servicer: MessagingServicer) -> grpc.GenericRpcHandler:
    """``apache.rocketmq.v2.MessagingService`` with ``servicer``'s methods, built from the
    service's descriptor as the generated ``add_MessagingServiceServicer_to_server`` builds it,
    but with decoders that turn undecodable bytes into INVALID_ARGUMENT (one WARNING line)
    instead of grpc.aio's UNKNOWN "Unexpected <class DecodeError>" and a logged traceback."""
    service = svc.DESCRIPTOR.services_by_name["MessagingService"]
    handlers: dict[str, grpc.RpcMethodHandler] = {}
    for method in service.methods:
        name = method.name
        request_cls = getattr(svc, method.input_type.name)
        response_cls = getattr(svc, method.output_type.name)
        impl = getattr(servicer, name)
        kwargs = {"request_deserializer": _decoder(name, request_cls),
                  "response_serializer": response_cls.SerializeToString}
        if method.client_streaming:  # Telemetry: each frame is checked by the servicer
            handlers[name] = grpc.stream_stream_rpc_method_handler(impl, **kwargs)
        elif method.server_streaming:
            handlers[name] = grpc.unary_stream_rpc_method_handler(_checked_stream(impl),
                                                                  **kwargs)
        else:
            handlers[name] = grpc.unary_unary_rpc_method_handler(_checked_unary(impl), **kwargs)
    return grpc.method_handlers_generic_handler(service.full_name, handlers)


def _checked_unary(impl: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    async def handle(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if request.__class__ is Undecodable:
            await _refuse_undecodable(request, context)
        return await impl(request, context)

    return handle


def _checked_stream(impl: Callable[..., AsyncIterator[Any]]
                    ) -> Callable[..., AsyncIterator[Any]]:
    async def handle(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        if request.__class__ is Undecodable:
            await _refuse_undecodable(request, context)
        async for response in impl(request, context):
            yield response

    return handle


@dataclass
class Services:
    """The logic the adapter calls, and how: ``run(fn, *args)`` in the executor."""

    lookup: Lookup
    clients: ClientService
    sending: SendService
    receiving: ReceiveService
    pulling: PullService
    writer: GroupWriter
    run: Run
    metrics: Callable[[], Any]  # the current metrics sink (on_rpc)
    # broker/transactions.py: EndTransaction, and the producers' streams checks go down.
    transactions: Any = None
    producers: Any = None
    # The client behind gRPC's peer (remoting's shared-port relay), None: gRPC's peer as is.
    peer_names: Callable[[str], str] | None = None
    # Controller mode: a slave's pop RPCs sent to its master (broker/forwarding.py).
    forwarding: MasterForwarding | None = None


class MessagingServicer(service_pb2_grpc.MessagingServiceServicer):
    """Thin adapter: a ``Call`` from the context, the logic, the response, the RPC's metrics.

    Open ``Telemetry`` streams are tracked so that a stopping broker can end them at once
    instead of waiting out its grace period for clients that never hang up."""

    def __init__(self, services: Services) -> None:
        self.s = services
        self.run = services.run
        self.telemetry_tasks: set[asyncio.Task[Any]] = set()

    async def _answer(self, name: str, response_cls: type,
                      work: Callable[[], Awaitable[Any]], request: Any = None) -> Any:
        started = time.perf_counter()
        try:
            response = await work()
        except Exception as exc:
            response = _failure(name, response_cls, exc, request)
        self.s.metrics().on_rpc(name, _code_name(response.status.code),
                                time.perf_counter() - started)
        return response

    def _blocking(self, name: str, response_cls: type, fn: Callable[..., Any],
                  request: Any, context: grpc.aio.ServicerContext) -> Awaitable[Any]:
        call = call_of(context, self.s.peer_names)
        return self._answer(name, response_cls, lambda: self.run(fn, request, call), request)

    async def _stream(self, name: str, response_cls: type,
                      work: Callable[[], Awaitable[list[Any]]],
                      request: Any) -> AsyncIterator[Any]:
        started = time.perf_counter()
        try:
            responses = await work()
        except Exception as exc:
            responses = [_failure(name, response_cls, exc, request)]
        code = next((r.status.code for r in responses if r.HasField("status")), Code.OK)
        for response in responses:
            yield response
        self.s.metrics().on_rpc(name, _code_name(code), time.perf_counter() - started)

    # -- route, heartbeat, telemetry ------------------------------------------------------------

    async def QueryRoute(self, request, context):
        return await self._blocking("QueryRoute", svc.QueryRouteResponse,
                                    self.s.clients.query_route, request, context)

    async def Heartbeat(self, request, context):
        return await self._blocking("Heartbeat", svc.HeartbeatResponse,
                                    self.s.clients.heartbeat, request, context)

    async def NotifyClientTermination(self, request, context):
        return await self._blocking("NotifyClientTermination",
                                    svc.NotifyClientTerminationResponse,
                                    self.s.clients.terminate, request, context)

    async def QueryAssignment(self, request, context):
        return await self._blocking("QueryAssignment", svc.QueryAssignmentResponse,
                                    self.s.clients.query_assignment, request, context)

    async def Telemetry(self, request_iterator, context):
        task = asyncio.current_task()
        if task is not None:
            self.telemetry_tasks.add(task)
        call = call_of(context, self.s.peer_names)
        # Answers to the client's commands and commands of the broker's own (a transaction
        # check) share the stream: both go through this outbox, read in one place.
        outbox: asyncio.Queue[Any] = asyncio.Queue()
        producers = self.s.producers

        async def read() -> None:
            try:
                async for cmd in request_iterator:
                    if cmd.__class__ is Undecodable:
                        outbox.put_nowait(cmd)  # refused where the stream is answered
                        return
                    if cmd.HasField("settings"):
                        answer = await self.run(self.s.clients.settings, cmd.settings, call)
                        if producers is not None and cmd.settings.HasField("publishing"):
                            producers.register(outbox, frozenset(
                                t.name for t in cmd.settings.publishing.topics))
                        outbox.put_nowait(answer)
            except BaseException as exc:
                outbox.put_nowait(exc)
            else:
                outbox.put_nowait(None)

        reader: asyncio.Future[None] | None = None
        try:
            self.s.lookup.authorize(call, "Cluster", "Get")
            reader = asyncio.ensure_future(read())
            while (item := await outbox.get()) is not None:
                if item.__class__ is Undecodable:  # no TelemetryCommand: the stream ends
                    await _refuse_undecodable(item, context)
                if isinstance(item, BaseException):
                    raise item
                yield item
        except BrokerError as exc:
            yield svc.TelemetryCommand(status=ok_status(exc.code, exc.message))
        except (asyncio.CancelledError, grpc.RpcError, grpc.aio.AbortError):
            raise
        except Exception as exc:
            if not context.done():
                yield svc.TelemetryCommand(status=failure_status("Telemetry", None, exc))
        finally:
            if reader is not None:
                reader.cancel()
            if producers is not None:
                producers.forget(outbox)
            if task is not None:
                self.telemetry_tasks.discard(task)

    # -- send -----------------------------------------------------------------------------------

    async def SendMessage(self, request, context):
        # ``_answer``'s steps written out: the most frequent RPC, and its layers (a coroutine
        # and a closure per call) were a measurable share of a 1-message send. The send's
        # logic runs here on the loop, so its metadata can be read on demand.
        peer = context.peer() or ""
        if names := self.s.peer_names:
            peer = names(peer)
        call = Call(_MetadataOnDemand(context), peer, context.time_remaining())
        s = self.s
        started = time.perf_counter()
        try:
            plan = s.sending.prepare(request, call)  # CPU only: checks and conversion
            if plan.response is not None:
                response = plan.response
            else:
                results = s.writer.put_now(plan.messages)  # usually: no future, no suspension
                if results is None:
                    results = await s.writer.put_async(plan.messages)
                response = s.sending.complete(plan, results)
        except Exception as exc:
            response = _failure("SendMessage", svc.SendMessageResponse, exc, request)
        s.metrics().on_rpc("SendMessage", _code_name(response.status.code),
                           time.perf_counter() - started)
        return response

    # -- pop consumption ------------------------------------------------------------------------

    def _master(self) -> str | None:
        """Where a pop RPC goes: None here, else to the group's master (forwarding.py)."""
        forwarding = self.s.forwarding
        return forwarding.target() if forwarding is not None else None

    async def ReceiveMessage(self, request, context):
        forwarding = self.s.forwarding
        if forwarding is not None and (master := forwarding.target()) is not None:
            work = functools.partial(forwarding.receive, request, context, master)
        else:
            work = functools.partial(self.s.receiving.receive, request,
                                     call_of(context, self.s.peer_names), self.run)
        async for response in self._stream("ReceiveMessage", svc.ReceiveMessageResponse,
                                           work, request):
            yield response

    def _forwarded(self, name: str, request: Any, context: grpc.aio.ServicerContext,
                   master: str) -> Awaitable[Any]:
        forwarding = self.s.forwarding
        assert forwarding is not None  # (master is not None only with forwarding)
        return self._answer(name, FORWARDED[name],
                            functools.partial(forwarding.unary, name, request, context, master),
                            request)

    async def AckMessage(self, request, context):
        if (master := self._master()) is not None:
            return await self._forwarded("AckMessage", request, context, master)
        call = call_of(context, self.s.peer_names)
        return await self._answer("AckMessage", svc.AckMessageResponse,
                                  lambda: self.s.receiving.ack_queued(request, call, self.run),
                                  request)

    async def ChangeInvisibleDuration(self, request, context):
        if (master := self._master()) is not None:
            return await self._forwarded("ChangeInvisibleDuration", request, context, master)
        return await self._blocking("ChangeInvisibleDuration",
                                    svc.ChangeInvisibleDurationResponse,
                                    self.s.receiving.change_invisible, request, context)

    async def ForwardMessageToDeadLetterQueue(self, request, context):
        if (master := self._master()) is not None:
            return await self._forwarded("ForwardMessageToDeadLetterQueue", request, context,
                                         master)
        return await self._blocking("ForwardMessageToDeadLetterQueue",
                                    svc.ForwardMessageToDeadLetterQueueResponse,
                                    self.s.receiving.forward_to_dlq, request, context)

    # -- offsets and pull -----------------------------------------------------------------------

    async def QueryOffset(self, request, context):
        return await self._blocking("QueryOffset", svc.QueryOffsetResponse,
                                    self.s.pulling.query_offset, request, context)

    async def PullMessage(self, request, context):
        call = call_of(context, self.s.peer_names)

        async def work() -> list[svc.PullMessageResponse]:
            responses = await self.s.pulling.pull(request, call, self.run)
            if call.metadata.get(PULL_FORMAT_KEY) == PULL_FORMAT_RECORDS:
                await context.send_initial_metadata(((PULL_FORMAT_KEY, PULL_FORMAT_RECORDS),))
            return responses

        async for response in self._stream("PullMessage", svc.PullMessageResponse, work,
                                           request):
            yield response

    async def UpdateOffset(self, request, context):
        return await self._blocking("UpdateOffset", svc.UpdateOffsetResponse,
                                    self.s.pulling.update_offset, request, context)

    async def GetOffset(self, request, context):
        return await self._blocking("GetOffset", svc.GetOffsetResponse,
                                    self.s.pulling.get_offset, request, context)

    # -- transactions ---------------------------------------------------------------------------

    async def EndTransaction(self, request, context):
        if self.s.transactions is None:
            return await self._refuse("EndTransaction", svc.EndTransactionResponse,
                                      "transactional messages are not served by this broker")
        return await self._blocking("EndTransaction", svc.EndTransactionResponse,
                                    self.s.transactions.end_transaction, request, context)

    # -- not supported --------------------------------------------------------------------------

    async def RecallMessage(self, request, context):
        return await self._refuse("RecallMessage", svc.RecallMessageResponse,
                                  "recalling messages is not supported")

    async def SyncLiteSubscription(self, request, context):
        return await self._refuse("SyncLiteSubscription", svc.SyncLiteSubscriptionResponse,
                                  "lite topics are not supported")

    def _refuse(self, name: str, response_cls: type, why: str) -> Awaitable[Any]:
        async def work() -> Any:
            raise BrokerError(Code.NOT_IMPLEMENTED, why)

        return self._answer(name, response_cls, work)
