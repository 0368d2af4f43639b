"""The store's put and get totals and their 10 s / 60 s / 600 s rates, as RocketMQ's
``StoreStatsService`` reports them in the broker's runtime info (``putTps``,
``getTransferredTps``, ...): real puts and gets on a real store, its samples taken on a driven
clock (the sampler thread stopped) so every rate is exact."""

from __future__ import annotations

from stratamq.message import Message
from stratamq.store.message_store import MessageStore
from stratamq.store.results import GetMessageStatus, PutMessageStatus
from stratamq.store.store_stats import java_double


def test_rates_over_the_three_windows_and_the_totals(small_config):
    clock = [1_000.0]
    with MessageStore(small_config) as store:
        stats = store.stats
        stats.stop()  # samples only when this test takes them
        stats.clock = lambda: clock[0]

        def sample_until(second: int) -> None:
            while clock[0] < 1_000.0 + second:
                clock[0] += 1
                stats.sample()

        stats.sample()  # second 0: nothing yet
        before = store.max_physical_offset
        put = store.put_messages([Message("Rated", b"x" * (i + 1), 0) for i in range(20)])
        assert put.ok
        too_big = store.put_message(Message("Rated", bytes(small_config.max_message_size + 1)))
        assert too_big.status is not PutMessageStatus.PUT_OK
        with store.get_messages("G", "Rated", 0, 0, max_count=32) as found:
            assert len(found.records) == 20
        with store.get_messages("G", "Rated", 0, 20) as missed:
            assert missed.status is not GetMessageStatus.FOUND

        fields = stats.runtime_fields()
        # Until a window has its samples its rate is blank, as RocketMQ's; the total is 0.0.
        assert (fields["putTps"], fields["getFoundTps"], fields["getTotalTps"]) \
            == ("  ", "  ", "0.0 0.0 0.0")
        assert fields["putMessageTimesTotal"] == "20"
        # Stored bytes (the encoded records), not bodies: what the CommitLog grew by.
        assert fields["putMessageSizeTotal"] == str(store.max_physical_offset - before)
        assert int(fields["putMessageSizeTotal"]) > sum(range(1, 21))
        assert fields["putMessageAverageSize"] == java_double(
            (store.max_physical_offset - before) / 20)
        assert fields["putMessageFailedTimes"] == "1"

        sample_until(10)
        fields = stats.runtime_fields()
        assert fields["putTps"] == "2.0  "  # 20 puts over the last 10 s
        assert fields["getFoundTps"] == "0.1  "
        assert fields["getMissTps"] == "0.1  "
        assert fields["getTotalTps"] == "0.2 0.0 0.0"
        assert fields["getTransferredTps"] == fields["getTransferedTps"] == "2.0  "

        sample_until(60)
        assert stats.runtime_fields()["putTps"] == "0.0 0.3333333333333333 "
        sample_until(600)
        fields = stats.runtime_fields()
        assert fields["putTps"] == "0.0 0.0 0.03333333333333333"
        assert fields["getTransferredTps"] == "0.0 0.0 0.03333333333333333"
        sample_until(700)  # ten minutes kept: the puts have left every window
        assert stats.runtime_fields()["putTps"] == "0.0 0.0 0.0"


def test_an_idle_store_reports_one_put_as_rocketmq_does(small_config):
    with MessageStore(small_config) as store:
        fields = store.stats.runtime_fields()
    assert (fields["putMessageTimesTotal"], fields["putMessageSizeTotal"]) == ("1", "0")
    assert fields["putMessageAverageSize"] == "0.0"


def test_doubles_are_written_as_java_writes_them():
    assert [java_double(v) for v in (0.0, 2.0, 0.25, 1234567.5, 1e7, 12345678.0, 0.0001)] \
        == ["0.0", "2.0", "0.25", "1234567.5", "1.0E7", "1.2345678E7", "1.0E-4"]
