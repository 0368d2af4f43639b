"""Offset-based reads: ``QueryOffset``, ``PullMessage`` (with long polling), ``UpdateOffset``,
``GetOffset``: replaying a queue from any offset (the Spark source's remote path).

A pull keeps no state: one store read per attempt, answered with a status, up to
``batch_size`` messages in offset order and ``next_offset``; at the end of the queue it waits
(``polling.LongPolls``, on the event loop) for a wake-up of its topic, then reads again, until
``long_polling_timeout``. See ``rpc.py``'s docstring for the wire contract.

Handed the lookups, a ``MessageReader``, the committed offsets (``PopState``) and the long
polls. Thread-safety: the sync methods from any thread; ``pull`` on the loop of the polls.
"""

from __future__ import annotations

import asyncio
import logging

from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc

from stratamq.broker.clients import ok_status
from stratamq.broker.convert import to_pb_message, valid_timestamp_ms
from stratamq.broker.errors import BrokerError, damage_text
from stratamq.broker.lookup import Lookup
from stratamq.broker.metadata import TopicConfig
from stratamq.broker.polling import LongPolls
from stratamq.broker.pop_state import PopState
from stratamq.broker.ports import Call, MessageReader
from stratamq.broker.receiving import Run, message_type_of
from stratamq.message import RecordCorrupt
from stratamq.store.filter import TagFilter
from stratamq.store.results import GetMessageStatus

__all__ = ["PULL_FORMAT_KEY", "PULL_FORMAT_RECORDS", "PullService", "consumer_offset"]

Code = pb.Code
log = logging.getLogger(__name__)

# PullMessage metadata asking for raw CommitLog records as bodies (StrataMQ's Spark source).
PULL_FORMAT_KEY, PULL_FORMAT_RECORDS = "x-stratamq-pull-format", "records"

_Answer = list[svc.PullMessageResponse] | None  # None: at the end of the queue

_FOUND = (GetMessageStatus.FOUND, GetMessageStatus.NO_MATCHED_MESSAGE,
          GetMessageStatus.MESSAGE_WAS_REMOVING)


def consumer_offset(state: PopState, group: str, topic: str, qid: int) -> int | None:
    """A group's consumer offset of a queue, whichever protocol committed it (gRPC's
    ``UpdateOffset``, remoting's ``UPDATE_CONSUMER_OFFSET``), else its pop progress."""
    offset = state.offset(group, topic, qid)
    return state.committed(group, topic, qid) if offset is None else offset


def reset_offsets(state: PopState, polls: LongPolls, group: str, topic: str,
                  offsets: dict[int, int]) -> int:
    """Move a group's position in the given queues (queue id -> offset), whichever protocol
    it consumes by: its pull offsets and pop cursors, its in-flight messages of the topic
    dropped; waiting polls woken. Returns how many in-flight messages were dropped. The gRPC
    admin's ``ResetOffset`` and remoting's ``INVOKE_BROKER_TO_RESET_OFFSET`` both reset here."""
    inflight = [k for k in state.entries(group, topic) if k[0] in offsets]
    state.apply(group, topic, cursors=offsets, delete=inflight)
    for q, offset in offsets.items():
        state.set_offset(group, topic, q, offset)
    polls.notify(topic)
    return len(inflight)


def _record_message(record: object, topic: str, qid: int) -> pb.Message:
    out = pb.Message(body=bytes(record.buffer))  # type: ignore[attr-defined]
    out.topic.name = topic
    out.system_properties.queue_id = qid
    out.system_properties.queue_offset = record.queue_offset  # type: ignore[attr-defined]
    return out


class PullService:
    """Stateless queue reads and the committed offsets of pull consumers."""

    def __init__(self, lookup: Lookup, reader: MessageReader, state: PopState,
                 polls: LongPolls) -> None:
        self.lookup = lookup
        self.reader = reader
        self.state = state
        self.polls = polls

    def query_offset(self, request: svc.QueryOffsetRequest, call: Call
                     ) -> svc.QueryOffsetResponse:
        self.lookup.authorize(call, f"Topic:{request.message_queue.topic.name}", "Get")
        topic, qid = self.lookup.named_queue(request.message_queue)
        reader = self.reader
        policy = request.query_offset_policy
        if policy == pb.BEGINNING:
            offset = reader.get_min_offset_in_queue(topic.name, qid)
        elif policy == pb.END:
            offset = reader.get_max_offset_in_queue(topic.name, qid)
        elif policy == pb.TIMESTAMP:
            if not request.HasField("timestamp"):
                raise BrokerError(Code.BAD_REQUEST, "TIMESTAMP policy needs a timestamp")
            ms = valid_timestamp_ms(request.timestamp)
            if ms is None:
                raise BrokerError(Code.BAD_REQUEST, f"timestamp {request.timestamp.seconds}s "
                                  "is not a valid time (years 1 to 9999)")
            offset = reader.get_offset_in_queue_by_time(topic.name, qid, ms)
        else:
            raise BrokerError(Code.BAD_REQUEST, f"unknown query_offset_policy {policy}")
        return svc.QueryOffsetResponse(status=ok_status(), offset=offset)

    def check_pull(self, request: svc.PullMessageRequest, call: Call
                   ) -> tuple[TopicConfig, int, TagFilter, int]:
        """The topic, queue id, filter and poll time (ms) of a pull; refusals raise."""
        self.lookup.authorize(call, f"Group:{request.group.name}", "Sub")
        self.lookup.authorize(call, f"Topic:{request.message_queue.topic.name}", "Sub")
        topic, qid = self.lookup.named_queue(request.message_queue)
        self.lookup.check_batch_size(request.batch_size)
        if request.offset < 0:
            raise BrokerError(Code.ILLEGAL_OFFSET, f"offset {request.offset} < 0")
        filt = self.lookup.filter(request.filter_expression)
        return topic, qid, filt, self.lookup.poll_ms(
            request.long_polling_timeout.ToMilliseconds(), call)

    def read(self, request: svc.PullMessageRequest, topic: TopicConfig, qid: int,
             filt: TagFilter, records: bool) -> list[svc.PullMessageResponse] | None:
        """One read: the whole answer, or None at the end of the queue (wait and read again).
        ``records``: bodies are whole CommitLog records (``x-stratamq-pull-format``)."""
        group = request.group.name or "stratamq-pull"
        got = self.reader.get_messages(group, topic.name, qid, request.offset,
                                       max_count=request.batch_size, tag_filter=filt)
        with got:
            st = got.status
            if st in _FOUND:
                next_offset = got.next_begin_offset
                if records:
                    messages = [_record_message(r, topic.name, qid) for r in got.records]
                else:
                    messages = []
                    try:
                        for m in got.messages():
                            messages.append(to_pb_message(
                                m, message_type=message_type_of(m, topic)))
                    except RecordCorrupt as exc:
                        # The messages before the damage are served; the pull that starts
                        # at the damaged one is refused, saying where it is.
                        where = f"PullMessage of {topic.name}/{qid}: {damage_text(exc)}"
                        log.error("%s", where)
                        if not messages or exc.queue_offset is None:
                            raise BrokerError(Code.INTERNAL_SERVER_ERROR, where) from None
                        next_offset = exc.queue_offset
                return [svc.PullMessageResponse(status=ok_status()),
                        *(svc.PullMessageResponse(message=m) for m in messages),
                        svc.PullMessageResponse(next_offset=next_offset)]
            if st is GetMessageStatus.OFFSET_FOUND_NULL:
                if got.next_begin_offset <= request.offset:
                    # Held, but it could not be read now (the tier did not answer): wait as
                    # at the end of the queue and read again, rather than spin the caller.
                    return None
                return self._hole(request.offset, got.next_begin_offset)
            if st is GetMessageStatus.OFFSET_TOO_SMALL:
                return [svc.PullMessageResponse(status=ok_status(
                    Code.ILLEGAL_OFFSET, f"offset {request.offset} is below the queue's min "
                    f"offset {got.min_offset}")),
                    svc.PullMessageResponse(next_offset=got.min_offset)]
            if st is GetMessageStatus.OFFSET_OVERFLOW_BADLY or (
                    st is not GetMessageStatus.OFFSET_OVERFLOW_ONE and request.offset > 0):
                return [svc.PullMessageResponse(status=ok_status(
                    Code.ILLEGAL_OFFSET, f"offset {request.offset} is past the queue's end "
                    f"{got.max_offset}")),
                    svc.PullMessageResponse(next_offset=got.max_offset)]
        return None  # at the end of the queue (or the queue was never written)

    @staticmethod
    def _hole(offset: int, next_offset: int) -> list[svc.PullMessageResponse]:
        """The answer where the queue holds ``offset`` but no source has its message (a hole:
        lost from the tier, or removed locally before it was tiered): RocketMQ's broker
        answers ``OFFSET_FOUND_NULL`` with ``PULL_NOT_FOUND`` and the next offset past the
        hole, so a reader crosses all of it in one pull."""
        why = (f"no message can be read at offsets {offset}..{next_offset - 1} (lost from the "
               f"tier, see tier status, or removed before it was tiered); continue from "
               f"{next_offset}")
        return [svc.PullMessageResponse(status=ok_status(Code.MESSAGE_NOT_FOUND, why)),
                svc.PullMessageResponse(next_offset=next_offset)]

    def start(self, request: svc.PullMessageRequest, call: Call, records: bool
              ) -> tuple[TopicConfig, int, TagFilter, int, int, _Answer]:
        """Checks and the first read in one step (one executor hop): ``check_pull``'s four,
        the topic's wake-up sequence number read before the read, and ``read``'s answer."""
        topic, qid, filt, poll_ms = self.check_pull(request, call)
        seen = self.polls.seq(topic.name)
        return topic, qid, filt, poll_ms, seen, self.read(request, topic, qid, filt, records)

    async def pull(self, request: svc.PullMessageRequest, call: Call, run: Run
                   ) -> list[svc.PullMessageResponse]:
        """The whole pull: read, and at the end of the queue wait and read again."""
        records = call.metadata.get(PULL_FORMAT_KEY) == PULL_FORMAT_RECORDS
        loop = asyncio.get_running_loop()
        started = loop.time()
        topic, qid, filt, poll_ms, seen, answer = await run(self.start, request, call, records)
        polls = self.polls
        deadline = started + poll_ms / 1000
        waiter = None
        try:
            while answer is None:
                remaining = deadline - loop.time()
                if remaining <= 0 or polls.closing:
                    break
                if waiter is None:
                    waiter = polls.register(topic.name, None, call.client_id)
                await polls.wait(waiter, seen, remaining)
                seen = polls.seq(topic.name)
                answer = await run(self.read, request, topic, qid, filt, records)
        finally:
            if waiter is not None:
                polls.unregister(waiter)
        if answer is None:
            return [svc.PullMessageResponse(status=ok_status(Code.MESSAGE_NOT_FOUND,
                                                             "no new message")),
                    svc.PullMessageResponse(next_offset=request.offset)]
        return answer

    def update_offset(self, request: svc.UpdateOffsetRequest, call: Call
                      ) -> svc.UpdateOffsetResponse:
        # Both the group and the topic, before either is looked up: a caller without the
        # right gets the same answer whether the topic exists or not.
        self.lookup.authorize(call, f"Group:{request.group.name}", "Sub")
        self.lookup.authorize(call, f"Topic:{request.message_queue.topic.name}", "Sub")
        group = self.lookup.group(request.group.name, call)
        topic, qid = self.lookup.named_queue(request.message_queue)
        if request.offset < 0:
            raise BrokerError(Code.ILLEGAL_OFFSET, f"offset {request.offset} < 0")
        self.state.set_offset(group.name, topic.name, qid, request.offset)
        return svc.UpdateOffsetResponse(status=ok_status())

    def get_offset(self, request: svc.GetOffsetRequest, call: Call) -> svc.GetOffsetResponse:
        self.lookup.authorize(call, f"Group:{request.group.name}", "Get")
        self.lookup.authorize(call, f"Topic:{request.message_queue.topic.name}", "Get")
        group = self.lookup.group(request.group.name, call)
        topic, qid = self.lookup.named_queue(request.message_queue)
        offset = consumer_offset(self.state, group.name, topic.name, qid)
        if offset is None:
            raise BrokerError(Code.OFFSET_NOT_FOUND,
                              f"group {group.name!r} has no offset for {topic.name}/{qid}")
        return svc.GetOffsetResponse(status=ok_status(), offset=offset)
