"""``ReceiveMessage`` (with long polling), ``AckMessage``, ``ChangeInvisibleDuration`` and
``ForwardMessageToDeadLetterQueue``, over the pop engine (``engine.py``).

A receive is checked (``plan``), then popped: one pass of the engine, which reads each queue
it takes messages from once (and redeliveries in runs of consecutive offsets). Finding nothing,
it waits as a registered waiter (``polling.LongPolls``, on the event loop: no thread held) for
a wake-up or the next in-flight message's visibility, then pops again, until the long-polling
time is up. Past the long-poll limits it is answered ``TOO_MANY_REQUESTS`` "polling full", as
RocketMQ's proxy answers its broker's ``POLLING_FULL``. The answer is a status, the messages
(each with its signed receipt handle) and the delivery timestamp.

An ``AckMessage`` with N entries is one pop-state write (``PopEngine.ack_many``); each entry
gets its own status.

The blocking parts (pops, acks, building messages: store reads, RocksDB writes, MD5) are plain
methods an executor runs: ``receive`` (and ``ack_queued``) take the ``run`` that does so and
queue them in the lane of their group and topic (``lanes.py``: one executor job at a time per
pair, as the engine's lock would serialise them anyway); tests drive everything without a
socket. Thread-safety: the sync methods from any thread; ``receive`` on
the loop that owns the ``LongPolls``.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc

from stratamq.broker.clients import ok_status
from stratamq.broker.convert import to_pb_message
from stratamq.broker.engine import PopEngine, Popped, now_ms
from stratamq.broker.errors import BrokerError
from stratamq.broker.lanes import Lanes
from stratamq.broker.lookup import Lookup
from stratamq.broker.metadata import GroupConfig, TopicConfig
from stratamq.broker.polling import LongPolls
from stratamq.broker.ports import Call
from stratamq.broker.validate import RECEIVE_BATCH_MAX, check_invisible_time
from stratamq.message import Prop, StoredMessage
from stratamq.store.filter import TagFilter

__all__ = ["ReceivePlan", "ReceiveService", "Run", "message_type_of"]

Code = pb.Code
T = TypeVar("T")
_OK = ok_status()  # copied into each message that holds it, never changed
Run = Callable[..., Awaitable[Any]]  # run(fn, *args): fn(*args) in the executor


def message_type_of(msg: StoredMessage, topic: TopicConfig) -> str:
    """The type a stored message is delivered as."""
    if Prop.MESSAGE_GROUP in msg.properties:
        return "FIFO"
    if Prop.TIMER_DELIVER_MS in msg.properties:
        return "DELAY"
    return topic.message_type


@dataclass(frozen=True)
class ReceivePlan:
    """A checked receive: what to pop, for how long to wait."""

    group: GroupConfig
    topic: TopicConfig
    filt: TagFilter
    batch: int
    invisible_ms: int
    poll_ms: int
    start_queue: int
    client: str


class ReceiveService:
    """Receives and acks for the official clients' SimpleConsumer and PushConsumer.

    ``metrics`` gives the current metrics sink (``on_receive``, ``on_ack``)."""

    def __init__(self, lookup: Lookup, engine: PopEngine, polls: LongPolls,
                 metrics: Callable[[], Any]) -> None:
        self.lookup = lookup
        self.engine = engine
        self.polls = polls
        self.metrics = metrics
        self.config = lookup.config
        # Pops and acks of one group and topic reach the executor one job at a time (see
        # lanes.py): they serialise on the engine's lock anyway.
        self.lanes = Lanes()

    # -- receive --------------------------------------------------------------------------------

    def plan(self, request: svc.ReceiveMessageRequest, call: Call) -> ReceivePlan:
        group, topic = self.lookup.subscription(call, request.group.name,
                                                request.message_queue.topic.name)
        if not topic.perm & 4:
            raise BrokerError(Code.FORBIDDEN, f"topic {topic.name!r} is not readable")
        cfg = self.config
        # RocketMQ's broker pops at most 32 messages a request (PopMessageProcessor).
        self.lookup.check_batch_size(request.batch_size, RECEIVE_BATCH_MAX)
        filt = self.lookup.filter(request.filter_expression)
        if request.HasField("invisible_duration"):
            invisible = request.invisible_duration.ToMilliseconds()
            check_invisible_time(invisible, cfg.min_invisible_time_mills_for_recv,
                                 cfg.max_invisible_time_mills)
        else:
            invisible = cfg.default_invisible_time_mills
        poll = (request.long_polling_timeout.ToMilliseconds()
                if request.HasField("long_polling_timeout") else 0)
        if poll < 0:
            raise BrokerError(Code.ILLEGAL_POLLING_TIME, f"long polling timeout {poll} ms < 0")
        qid = request.message_queue.id
        start = qid if 0 <= qid < topic.read_queue_nums else random.randrange(
            topic.read_queue_nums)
        return ReceivePlan(group, topic, filt, request.batch_size, invisible,
                           self.lookup.poll_ms(poll, call), start, call.client_id)

    def pop(self, plan: ReceivePlan) -> list[Popped]:
        """One pass of the engine (blocking: store reads and a pop-state write)."""
        return self.engine.pop_once(plan.group, plan.topic, plan.filt, plan.batch,
                                    plan.invisible_ms, plan.start_queue)

    def responses(self, plan: ReceivePlan, popped: list[Popped]
                  ) -> list[svc.ReceiveMessageResponse]:
        """The stream a receive answers with (blocking only for CPU: decoding, MD5)."""
        if not popped:
            return [svc.ReceiveMessageResponse(status=ok_status(Code.MESSAGE_NOT_FOUND,
                                                                "no new message"))]
        group, topic = plan.group.name, plan.topic.name
        out = [svc.ReceiveMessageResponse(status=ok_status())]
        nbytes = stored = 0
        for p in popped:
            nbytes += len(p.message.body)
            stored += p.message.total_size
            response = svc.ReceiveMessageResponse()  # filled in place: no copy of the message
            to_pb_message(p.message, message_type=message_type_of(p.message, plan.topic),
                          receipt=self.engine.handle(group, topic, p.receipt),
                          attempt=p.attempt, invisible_ms=p.invisible_ms, out=response.message)
            out.append(response)
        self.metrics().on_receive(group, topic, len(popped), nbytes, stored)
        ts = svc.ReceiveMessageResponse()
        now = time.time_ns()  # Timestamp.GetCurrentTime goes through datetime: slow
        stamp = ts.delivery_timestamp
        stamp.seconds, stamp.nanos = divmod(now, 1_000_000_000)
        out.append(ts)
        return out

    def pop_and_answer(self, plan: ReceivePlan) -> tuple[int, list[svc.ReceiveMessageResponse]]:
        popped = self.pop(plan)
        return len(popped), (self.responses(plan, popped) if popped else [])

    def start(self, request: svc.ReceiveMessageRequest, call: Call
              ) -> tuple[ReceivePlan, int, int, list[svc.ReceiveMessageResponse]]:
        """Plan and first pop in one step (one executor hop, not two): the plan, the topic's
        wake-up sequence number read before the pop, and what the pop found."""
        plan = self.plan(request, call)
        seen = self.polls.seq(plan.topic.name)
        return (plan, seen, *self.pop_and_answer(plan))

    async def receive(self, request: svc.ReceiveMessageRequest, call: Call, run: Run
                      ) -> list[svc.ReceiveMessageResponse]:
        """The whole receive: plan, pop, wait and pop again until something came or the
        long-polling time is up. Runs on the loop of ``self.polls``; ``run`` executes the
        blocking steps."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        lane = (request.group.name, request.message_queue.topic.name)
        plan, seen, count, answer = await self.lanes.call(lane, run, self.start, request, call)
        polls, topic = self.polls, plan.topic.name
        deadline = started + plan.poll_ms / 1000
        waiter = None
        try:
            while not count:
                remaining = deadline - loop.time()
                if remaining <= 0 or polls.closing:
                    break
                if waiter is None:
                    waiter = polls.register(topic, plan.group.name, plan.client)
                due = self.engine.next_visible(plan.group.name, topic)
                if due is not None:
                    remaining = min(remaining, max(0.0, (due - now_ms()) / 1000) + 0.001)
                await polls.wait(waiter, seen, remaining)
                seen = polls.seq(topic)
                count, answer = await self.lanes.call(lane, run, self.pop_and_answer, plan)
                waiter.woken = False
            if waiter is not None and count >= plan.batch:
                polls.pass_on(waiter)  # a full batch: there may be more for the others
        finally:
            if waiter is not None:
                polls.unregister(waiter)
        if not count:
            return self.responses(plan, [])
        polls.expect(topic, plan.invisible_ms / 1000)  # redeliver to waiters if not acked
        return answer

    # -- ack and friends ------------------------------------------------------------------------

    def ack(self, request: svc.AckMessageRequest, call: Call) -> svc.AckMessageResponse:
        group, topic = self.lookup.subscription(call, request.group.name, request.topic.name)
        if not request.entries:
            raise BrokerError(Code.BAD_REQUEST, "AckMessageRequest has no entries")
        errors = self.engine.ack_many(group.name, topic.name,
                                      [e.receipt_handle for e in request.entries])
        response = svc.AckMessageResponse()
        add = response.entries.add  # built in place: one OK status shared, not one per entry
        for entry, error in zip(request.entries, errors, strict=True):
            add(message_id=entry.message_id, receipt_handle=entry.receipt_handle,
                status=_OK if error is None else ok_status(error.code, error.message))
        ok = errors.count(None)
        if ok:
            self.metrics().on_ack(group.name, topic.name, ok)
        codes = {error.code for error in errors if error is not None}
        if ok:
            codes.add(_OK.code)  # not Code.OK per entry: the enum wrapper's lookup is Python
        response.status.CopyFrom(response.entries[0].status if len(codes) == 1 else
                                 ok_status(Code.MULTIPLE_RESULTS, "mixed results"))
        return response

    async def ack_queued(self, request: svc.AckMessageRequest, call: Call, run: Run
                         ) -> svc.AckMessageResponse:
        """``ack`` in the lane of its group and topic (on the loop; ``run`` as for receive)."""
        return await self.lanes.call((request.group.name, request.topic.name), run, self.ack,
                                     request, call)

    def change_invisible(self, request: svc.ChangeInvisibleDurationRequest, call: Call
                         ) -> svc.ChangeInvisibleDurationResponse:
        group, topic = self.lookup.subscription(call, request.group.name, request.topic.name)
        # The handle first: a client whose duration we refused would otherwise retry a handle
        # it can never get an answer about. 0 ms is a nack (deliver again now), as the proxy
        # accepts it; clients send it when a listener fails.
        self.engine.check_handle(group.name, topic.name, request.receipt_handle)
        ms = request.invisible_duration.ToMilliseconds()
        check_invisible_time(ms, 0, self.config.max_invisible_time_mills)
        handle = self.engine.change_invisible(group.name, topic.name, request.receipt_handle,
                                              ms)
        return svc.ChangeInvisibleDurationResponse(status=ok_status(), receipt_handle=handle)

    def forward_to_dlq(self, request: svc.ForwardMessageToDeadLetterQueueRequest, call: Call
                       ) -> svc.ForwardMessageToDeadLetterQueueResponse:
        group, topic = self.lookup.subscription(call, request.group.name, request.topic.name)
        self.engine.forward_to_dlq(group.name, topic.name, request.receipt_handle)
        return svc.ForwardMessageToDeadLetterQueueResponse(status=ok_status())
