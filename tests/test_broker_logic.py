"""The broker's logic without a socket: the single writer over a real store, long polls on a
real event loop woken from another thread, the receive and ack services over a real store and
pop state. (The same parts behind gRPC: tests/test_broker_scale.py.)"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc

from stratamq.broker.engine import PopEngine
from stratamq.broker.errors import BrokerError
from stratamq.broker.lookup import Lookup
from stratamq.broker.metadata import MetadataStore
from stratamq.broker.metrics import NullMetrics
from stratamq.broker.polling import LongPolls
from stratamq.broker.pop_state import PopState
from stratamq.broker.ports import Call
from stratamq.broker.receiving import ReceiveService
from stratamq.broker.sending import SendService
from stratamq.broker.writer import GroupWriter
from stratamq.config import BrokerConfig, FlushDiskType, StoreConfig
from stratamq.message import Message
from stratamq.store.message_store import MessageStore
from stratamq.store.results import PutMessageStatus

SEGMENT = 256 * 1024


@pytest.fixture(params=[FlushDiskType.ASYNC_FLUSH, FlushDiskType.SYNC_FLUSH],
                ids=["async", "sync"])
def store(tmp_path, request):
    cfg = StoreConfig(store_path_root_dir=str(tmp_path / "store"),
                      mapped_file_size_commit_log=SEGMENT, flush_disk_type=request.param)
    with MessageStore(cfg).open() as s:
        yield s


def _msg(topic: str, body: bytes, queue: int = 0) -> Message:
    return Message(topic, body, queue_id=queue)


def test_puts_of_one_loop_turn_are_appended_together_and_a_bad_entry_fails_alone(store):
    """Three requests handed over in one turn of the loop: one append; a message too big for
    a CommitLog segment (which the broker's own size check lets through) is refused on its
    own, its neighbours in the same request and the other requests are stored, with queue
    offsets in the order the puts were made."""
    writer = GroupWriter(store).start()
    too_big = b"x" * (SEGMENT + 1)

    async def turn():
        return await asyncio.gather(
            writer.put_async([_msg("W", b"a0"), _msg("W", b"a1")]),
            writer.put_async([_msg("W", b"b0"), _msg("W", too_big), _msg("W", b"b2")]),
            writer.put_async([_msg("W", b"c0")]))

    try:
        first, second, third = asyncio.run(turn())
    finally:
        writer.close()
    assert [r.status for r in first] == [PutMessageStatus.PUT_OK] * 2
    assert [r.status for r in second] == [PutMessageStatus.PUT_OK,
                                          PutMessageStatus.MESSAGE_ILLEGAL,
                                          PutMessageStatus.PUT_OK]
    assert "cannot fit" in second[1].error
    assert [r.status for r in third] == [PutMessageStatus.PUT_OK]
    offsets = [r.appended.queue_offset for r in (*first, second[0], second[2], *third)]
    assert offsets == [0, 1, 2, 3, 4]
    store.wait_dispatched()
    with store.get_messages("g", "W", 0, 0, max_count=10) as got:
        assert [m.body for m in got.messages()] == [b"a0", b"a1", b"b0", b"b2", b"c0"]


def test_concurrent_puts_combine_and_each_gets_its_own_offsets(store):
    """Puts from many coroutines in the same turns are combined (fewer appends than puts),
    and every put's offsets are its own messages' offsets, contiguous and in order."""
    writer = GroupWriter(store).start()

    async def sender(i: int):
        results = await writer.put_async([_msg("C", b"%d-%d" % (i, j)) for j in range(4)])
        return i, results

    async def burst():
        return await asyncio.gather(*(sender(i) for i in range(50)))

    try:
        outcomes = asyncio.run(burst())
    finally:
        writer.close()
    assert writer.appends < writer.puts == 50
    seen = []
    for _i, results in outcomes:
        offsets = [r.appended.queue_offset for r in results]
        assert all(r.ok for r in results)
        assert offsets == list(range(offsets[0], offsets[0] + 4))
        seen.extend(offsets)
    assert sorted(seen) == list(range(200))
    store.wait_dispatched()
    bodies = {}
    with store.get_messages("g", "C", 0, 0, max_count=200) as got:
        for m in got.messages():
            bodies[m.queue_offset] = m.body
    for i, results in outcomes:
        for j, r in enumerate(results):
            assert bodies[r.appended.queue_offset] == b"%d-%d" % (i, j)


def test_a_put_waiter_that_raises_answers_its_puts_and_the_writer_goes_on(store):
    """A bug in what a put waits for (a flusher, a replication waiter) must not kill the writer
    thread: the puts it held are answered UNKNOWN_ERROR (their messages are stored, as after a
    flush timeout), and the next puts, from threads and from a loop, are answered as usual."""
    failures = [RuntimeError("waiter bug")]

    def flaky(end: int) -> PutMessageStatus | None:
        if failures:
            raise failures.pop()
        return None

    store.add_put_waiter(flaky)
    writer = GroupWriter(store).start()

    async def from_loop(body: bytes):
        return await asyncio.wait_for(writer.put_async([_msg("F", body)]), 30)

    try:
        first = asyncio.run(from_loop(b"one"))  # appended on the loop, waited on the thread
        second = writer.put_wait([_msg("F", b"two")], timeout=30)
        third = asyncio.run(from_loop(b"three"))
    finally:
        assert writer.close()
    assert first[0].status is PutMessageStatus.UNKNOWN_ERROR
    assert "internal error" in first[0].error and "waiter bug" not in first[0].error
    assert second[0].ok and third[0].ok
    assert [second[0].appended.queue_offset, third[0].appended.queue_offset] == [1, 2]


def test_puts_from_threads_go_through_the_writer_thread(store):
    writer = GroupWriter(store).start()
    try:
        results = writer.put_wait([_msg("T", b"one"), _msg("T", b"two")], timeout=30)
    finally:
        writer.close()
    assert [r.appended.queue_offset for r in results] == [0, 1]
    late = writer.put_wait([_msg("T", b"late")], timeout=30)
    assert late[0].status is PutMessageStatus.SERVICE_NOT_AVAILABLE


def _puts() -> list[list[Message]]:
    """Puts a broker makes, with the refusals that split a batch: a message too big for a
    segment, and a topic no store directory can be named (which refuses a batch whole)."""
    too_big = b"x" * (SEGMENT + 1)
    return [[_msg("N", b"one")],
            [_msg("N", b"a%d" % i, i % 3) for i in range(5)],
            [_msg("N", b"b0"), _msg("N", too_big), _msg("N", b"b2", 1)],
            [_msg("N", b"c0"), _msg("bad/topic", b"c1"), _msg("N", b"c2")],
            [_msg("N", too_big)],
            [_msg("N", b"d" * 3000, 2)]]


def _seen(results):
    """What a put's caller learns: statuses, errors and where each message landed (the
    store time aside, which is the clock's)."""
    return [(r.status, r.error, r.appended and r.appended._replace(store_timestamp=0))
            for r in results]


async def _one_put_per_turn(writer: GroupWriter):
    answered = []
    for put in _puts():
        await asyncio.sleep(0)  # a turn of its own: the put is appended at once
        results = writer.put_now(put)
        assert results is not None
        answered.append(results)
    return answered


async def _all_puts_in_one_turn(writer: GroupWriter):
    return await asyncio.gather(*(writer.put_async(put) for put in _puts()))


def test_a_put_answered_at_once_answers_as_the_writer_thread_and_a_combined_turn_do(tmp_path):
    """``put_now`` (a turn's first put, appended and answered without a future) gives each
    put exactly the per-entry results the general paths give for the same puts: the writer
    thread's (``put_wait``) and one combined append of a loop turn (``put_async``)."""
    outcomes = {}
    for way in ("now", "thread", "turn"):
        cfg = StoreConfig(store_path_root_dir=str(tmp_path / way),
                          mapped_file_size_commit_log=SEGMENT)
        with MessageStore(cfg).open() as store:
            writer = GroupWriter(store).start()

            try:
                if way == "now":
                    answered = asyncio.run(_one_put_per_turn(writer))
                elif way == "thread":
                    answered = [writer.put_wait(put, timeout=30) for put in _puts()]
                else:
                    answered = asyncio.run(_all_puts_in_one_turn(writer))
            finally:
                writer.close()
            outcomes[way] = [_seen(results) for results in answered]
            store.wait_dispatched()
            with store.get_messages("g", "N", 0, 0, max_count=50) as got:
                outcomes[way].append([m.body for m in got.messages()])
    assert outcomes["now"] == outcomes["thread"] == outcomes["turn"]
    statuses = [[status for status, _e, _a in results] for results in outcomes["now"][:-1]]
    ok, illegal = PutMessageStatus.PUT_OK, PutMessageStatus.MESSAGE_ILLEGAL
    assert statuses == [[ok], [ok] * 5, [ok, illegal, ok], [ok, illegal, ok], [illegal], [ok]]


def test_put_now_leaves_to_put_async_what_must_wait(store):
    """Only a turn's first put is appended at once, and only when nothing waits after an
    append: a second put in the turn, and every put under SYNC_FLUSH, is left (None, nothing
    appended) to ``put_async``, which answers it."""
    writer = GroupWriter(store).start()
    sync = store.waits_on_put

    async def turn():
        first = writer.put_now([_msg("L", b"first")])
        second = writer.put_now([_msg("L", b"second")])
        assert second is None
        if sync:
            assert first is None
            first = await writer.put_async([_msg("L", b"first")])
        return first, await writer.put_async([_msg("L", b"second")])

    try:
        first, second = asyncio.run(turn())
    finally:
        writer.close()
    assert [r.appended.queue_offset for r in (*first, *second)] == [0, 1]
    store.wait_dispatched()
    with store.get_messages("g", "L", 0, 0, max_count=10) as got:
        assert [m.body for m in got.messages()] == [b"first", b"second"]


# -- long polls ----------------------------------------------------------------------------------


def test_a_notify_from_another_thread_wakes_one_waiting_receive_per_group():
    async def scenario():
        polls = LongPolls(asyncio.get_running_loop())
        a1 = polls.register("T", "A", "c1")
        a2 = polls.register("T", "A", "c2")
        b1 = polls.register("T", "B", "c3")
        seen = polls.seq("T")
        waits = {w: asyncio.ensure_future(polls.wait(w, seen, 30)) for w in (a1, a2, b1)}
        await asyncio.sleep(0)  # every waiter is asleep now
        threading.Thread(target=polls.notify, args=("T",)).start()  # as the dispatcher does
        # One wake-up on the loop wakes both at once: a2 is decided by the time they return.
        await asyncio.wait_for(asyncio.gather(waits[a1], waits[b1]), 30)
        assert not waits[a2].done()  # only the longest waiting of each group
        a1.woken = False
        polls.pass_on(a1)  # a1 took a full batch: the next of its group looks too
        await asyncio.wait_for(waits[a2], 30)
        for w in (a1, a2, b1):
            polls.unregister(w)
        assert polls.total == 0

    asyncio.run(scenario())


def test_a_wait_returns_at_once_when_the_topic_moved_since_the_last_look():
    async def scenario():
        polls = LongPolls(asyncio.get_running_loop())
        w = polls.register("T", None, "c")
        seen = polls.seq("T")
        polls.notify("T")  # a message arrived between the read and the wait
        await asyncio.wait_for(polls.wait(w, seen, 30), 5)
        polls.unregister(w)

    asyncio.run(scenario())


def test_long_poll_limits_answer_too_many_requests():
    async def scenario():
        polls = LongPolls(asyncio.get_running_loop(), max_total=4, max_per_group=2,
                          max_per_client=3)
        held = [polls.register("T", "G", "c1"), polls.register("T", "G", "c1")]
        with pytest.raises(BrokerError) as err:
            polls.register("T", "G", "c2")  # the group's third on T
        assert err.value.code == pb.Code.TOO_MANY_REQUESTS
        assert "popPollingSize" in err.value.message
        held.append(polls.register("T", None, "c1"))  # a pull counts for the client
        with pytest.raises(BrokerError) as err:
            polls.register("U", "H", "c1")  # the client's fourth
        assert err.value.code == pb.Code.TOO_MANY_REQUESTS
        held.append(polls.register("U", "H", "c2"))
        with pytest.raises(BrokerError) as err:
            polls.register("V", "K", "c3")  # the fifth in all
        assert err.value.code == pb.Code.TOO_MANY_REQUESTS
        assert err.value.message == "polling full"
        polls.unregister(held.pop())
        polls.unregister(polls.register("V", "K", "c3"))  # room again

    asyncio.run(scenario())


# -- receive and ack -----------------------------------------------------------------------------


@pytest.fixture
def receiving(tmp_path):
    root = tmp_path / "store"
    with MessageStore(StoreConfig(store_path_root_dir=str(root))).open() as store:
        meta = MetadataStore(root)
        meta.create_topic("R", 2, "NORMAL")
        state = PopState(root / "config" / "popState")
        loop = asyncio.new_event_loop()
        polls = LongPolls(loop)
        engine = PopEngine(store, meta, state, polls.notify)
        service = ReceiveService(Lookup(meta, BrokerConfig()), engine, polls,
                                 lambda: NullMetrics())
        try:
            yield store, service, loop
        finally:
            loop.close()
            state.close()


async def _inline(fn, *args):
    return fn(*args)


def _receive_request(batch: int, poll_ms: int) -> svc.ReceiveMessageRequest:
    request = svc.ReceiveMessageRequest(
        group=pb.Resource(name="G"), batch_size=batch,
        message_queue=pb.MessageQueue(topic=pb.Resource(name="R"), id=-1),
        filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"))
    request.invisible_duration.FromSeconds(30)
    request.long_polling_timeout.FromMilliseconds(poll_ms)
    return request


def test_a_waiting_receive_gets_what_a_put_on_another_thread_makes_readable(receiving):
    store, service, loop = receiving
    call = Call({"x-mq-client-id": "c1"})

    async def scenario():
        receive = asyncio.ensure_future(service.receive(_receive_request(32, 20_000), call,
                                                        _inline))
        while service.polls.total == 0:  # registered as a waiter
            await asyncio.sleep(0.01)
        store.add_dispatch_listener(lambda info: service.polls.notify(info.topic))
        put = threading.Thread(target=store.put_messages,
                               args=([Message("R", b"late", queue_id=1)],))
        put.start()
        responses = await asyncio.wait_for(receive, 30)
        put.join()
        return responses

    responses = loop.run_until_complete(scenario())
    assert responses[0].status.code == pb.Code.OK
    assert [r.message.body for r in responses if r.HasField("message")] == [b"late"]
    assert service.polls.total == 0


def test_an_ack_of_many_entries_is_answered_per_entry(receiving):
    store, service, loop = receiving
    store.put_messages([Message("R", b"m%d" % i, queue_id=i % 2) for i in range(10)])
    store.wait_dispatched()
    call = Call({"x-mq-client-id": "c1"})
    responses = loop.run_until_complete(service.receive(_receive_request(32, 0), call, _inline))
    handles = [r.message.system_properties.receipt_handle for r in responses
               if r.HasField("message")]
    assert len(handles) == 10
    ack = svc.AckMessageRequest(group=pb.Resource(name="G"), topic=pb.Resource(name="R"),
                                entries=[svc.AckMessageEntry(message_id=str(i), receipt_handle=h)
                                         for i, h in enumerate([*handles, "garbage"])])
    reply = service.ack(ack, call)
    assert reply.status.code == pb.Code.MULTIPLE_RESULTS
    assert [e.status.code for e in reply.entries] == [pb.Code.OK] * 10 + [
        pb.Code.INVALID_RECEIPT_HANDLE]
    assert service.engine.state.entries("G", "R") == {}  # nothing left in flight


def test_pop_state_knows_the_earliest_visible_time_through_puts_acks_and_a_reopen(tmp_path):
    from stratamq.broker.pop_state import InFlight

    path = tmp_path / "popState"
    state = PopState(path)
    assert state.earliest("G", "T") is None
    state.apply("G", "T", put={(0, q): InFlight(1000 + q, 1, 1) for q in range(200)})
    assert state.earliest("G", "T") == 1000
    state.apply("G", "T", delete=[(0, 0), (0, 1)])  # acked: the next one is the earliest
    assert state.earliest("G", "T") == 1002
    state.apply("G", "T", put={(0, 2): InFlight(5000, 1, 2)})  # its invisible time changed
    assert state.earliest("G", "T") == 1003
    for _ in range(300):  # many re-puts of one entry: stale heap items must not pile up
        state.apply("G", "T", put={(0, 150): InFlight(10, 2, 3)})
        state.apply("G", "T", put={(0, 150): InFlight(9000, 2, 4)})
    assert state.earliest("G", "T") == 1003
    assert len(state._heaps[("G", "T")]) <= 2 * len(state.inflight[("G", "T")]) + 64
    assert state.busy_queues("G", "T") == {0}
    state.close()
    state = PopState(path)
    assert state.earliest("G", "T") == 1003
    state.apply("G", "T", delete=list(state.entries("G", "T")))
    assert state.earliest("G", "T") is None
    assert state.busy_queues("G", "T") == set()
    state.close()


def test_a_nacked_message_is_redelivered_while_many_others_stay_in_flight(receiving):
    store, service, loop = receiving
    store.put_messages([Message("R", b"m%d" % i, queue_id=i % 2) for i in range(100)])
    store.wait_dispatched()
    call = Call({"x-mq-client-id": "c1"})
    got = []
    for _ in range(4):
        responses = loop.run_until_complete(service.receive(_receive_request(32, 0), call,
                                                            _inline))
        got += [r.message for r in responses if r.HasField("message")]
    assert len(got) == 100
    nacked = got[57]
    service.engine.change_invisible("G", "R", nacked.system_properties.receipt_handle, 0)
    responses = loop.run_until_complete(service.receive(_receive_request(32, 0), call, _inline))
    again = [r.message for r in responses if r.HasField("message")]
    assert [m.body for m in again] == [nacked.body]
    assert again[0].system_properties.delivery_attempt == 2


# -- lanes ---------------------------------------------------------------------------------------


def test_lane_calls_of_one_key_run_one_at_a_time_in_order_each_with_its_own_answer():
    from concurrent.futures import ThreadPoolExecutor

    from stratamq.broker.lanes import Lanes

    lanes = Lanes(max_batch=3)
    executor = ThreadPoolExecutor(max_workers=8)
    order: list[int] = []
    running = [0]
    overlap = []
    guard = threading.Lock()

    def work(i: int) -> int:
        with guard:
            running[0] += 1
            overlap.append(running[0])
        threading.Event().wait(0.002)  # hold the call long enough for others to pile up
        order.append(i)
        with guard:
            running[0] -= 1
        if i == 5:
            raise BrokerError(pb.Code.BAD_REQUEST, "five")
        return i * 10

    async def scenario():
        loop = asyncio.get_running_loop()

        def run(fn, *args):
            return loop.run_in_executor(executor, fn, *args)

        return await asyncio.gather(*(lanes.call("G/T", run, work, i) for i in range(20)),
                                    return_exceptions=True)

    try:
        answers = asyncio.run(scenario())
    finally:
        executor.shutdown()
    assert order == list(range(20))
    assert max(overlap) == 1  # never two calls of the key at once, with 8 threads free
    assert [a for i, a in enumerate(answers) if i != 5] == [i * 10 for i in range(20) if i != 5]
    assert isinstance(answers[5], BrokerError) and answers[5].message == "five"
    assert lanes._queues == {}  # nothing left behind for the key


def test_a_blocked_lane_holds_up_only_its_own_key_and_a_cancelled_caller_only_itself():
    from concurrent.futures import ThreadPoolExecutor

    from stratamq.broker.lanes import Lanes

    lanes = Lanes()
    executor = ThreadPoolExecutor(max_workers=4)
    release = threading.Event()

    async def scenario():
        loop = asyncio.get_running_loop()

        def run(fn, *args):
            return loop.run_in_executor(executor, fn, *args)

        blocked = asyncio.ensure_future(lanes.call("A", run, release.wait, 30))
        cancelled = asyncio.ensure_future(lanes.call("A", run, lambda: "dropped"))
        after = asyncio.ensure_future(lanes.call("A", run, lambda: "after"))
        other = await asyncio.wait_for(lanes.call("B", run, lambda: "other"), 30)
        assert not blocked.done()  # key B went ahead of key A's blocked call
        cancelled.cancel()
        release.set()
        return other, await blocked, await after, cancelled.cancelled()

    try:
        assert asyncio.run(scenario()) == ("other", True, "after", True)
    finally:
        release.set()
        executor.shutdown()


# -- the send conversion's plain path ----------------------------------------------------------

def _mostly(usual, *others):
    """``usual`` nine times in ten, else one of ``others``: most entries of a request must
    be plain, or one refused entry empties the whole plan and nothing is compared."""
    return st.integers(0, 9).flatmap(lambda n: usual if n else st.one_of(*others))


_ids = _mostly(st.just("0123456789ABCDEF0123456789ABCDEF"), st.just("  "),
               st.text(max_size=6))
_nanos = st.one_of(st.integers(0, 999_999_999), st.integers(0, 999).map(lambda ms: ms * 10**6))
_timestamps = _mostly(st.tuples(st.integers(0, 2**33), _nanos),
                      st.none(), st.tuples(st.integers(-(2**40), 2**40),
                                           st.integers(-5, 1_000_000_001)))


@st.composite
def _entries(draw):
    """A SendMessage entry: mostly what a plain producer sends, sometimes with a field that
    takes it off the plain path or gets it refused."""
    m = pb.Message()
    m.topic.name = "Plain"
    m.body = draw(_mostly(st.binary(min_size=1, max_size=64), st.just(b""),
                          st.just(b"x" * 2000)))
    sp = m.system_properties
    sp.message_id = draw(_ids)
    sp.message_type = draw(_mostly(st.sampled_from([pb.MESSAGE_TYPE_UNSPECIFIED, pb.NORMAL]),
                                   st.sampled_from([pb.FIFO, pb.DELAY])))
    sp.body_encoding = draw(_mostly(st.sampled_from([pb.ENCODING_UNSPECIFIED, pb.IDENTITY]),
                                    st.just(pb.GZIP)))
    sp.born_host = draw(_mostly(st.just("127.0.0.1"),
                                st.sampled_from(["", "::1", "not an address"])))
    born = draw(_timestamps)
    if born is not None:
        sp.born_timestamp.seconds, sp.born_timestamp.nanos = born
    extra = draw(st.integers(0, 19))
    if extra == 0:
        sp.tag = draw(st.sampled_from(["TagA", " ", "a|b"]))
    elif extra == 1:
        sp.keys.extend(draw(st.lists(st.sampled_from(["k1", "k 2", ""]), max_size=2)))
    elif extra == 2:
        sp.message_group = draw(st.sampled_from(["g", " "]))
    elif extra == 3:
        sp.delivery_timestamp.seconds = draw(st.sampled_from([1, 2**40]))
    elif extra == 4:
        m.user_properties[draw(st.sampled_from(["p", "TAGS"]))] = "v"
    return m


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(entries=st.lists(_entries(), min_size=1, max_size=6), start=st.integers(0, 1000))
def test_the_plain_send_path_converts_as_the_general_one(tmp_path_factory, entries, start):
    """``SendService.prepare``'s plain path gives exactly the plan ``_convert`` gives entry by
    entry: the same store messages (queue, properties, born time and host), sizes and ids,
    or the same refusal with the same per-entry statuses."""
    meta = MetadataStore(tmp_path_factory.mktemp("meta"))
    meta.create_topic("Plain", 4, "NORMAL")
    request = svc.SendMessageRequest(messages=entries)
    plans = []
    for plain in (True, False):
        service = SendService(Lookup(meta, BrokerConfig()), 1024, None, lambda: NullMetrics())
        service.plain_path = plain
        service._round_robin = itertools.count(start)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(time, "time", lambda: 1_700_000_000.5)  # a born time left out
            plans.append(service.prepare(request, Call(peer="ipv4:10.0.0.9:4000")))
    fast, general = plans
    assert fast.messages == general.messages
    assert fast.sizes == general.sizes
    assert fast.message_ids == general.message_ids
    assert fast.response == general.response
    note(f"stored: {len(fast.messages)}")
