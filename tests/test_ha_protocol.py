"""The replication protocol without sockets (h11's shape): exact bytes in, events out, exact
bytes to send; where a stream starts; the epoch file's text."""

from __future__ import annotations

import struct

import pytest

from stratamq.ha.epochs import EpochEntry, EpochFile, EpochFileCorrupt, parse, render
from stratamq.ha.protocol import (
    Gap,
    Heartbeat,
    LineageVerdict,
    MasterConnection,
    MasterEnd,
    MasterLineage,
    Overlap,
    ProtocolError,
    SlaveAck,
    SlaveConnection,
    SlaveRequest,
    Transfer,
    TransferPlan,
    judge_lineage,
    plan_transfer,
)

SEG = 1 << 20
LINEAGE = "0f1e2d3c-4b5a-4968-8776-8594a3b2c1d0"
STORE_ID = "00112233-4455-4677-8899-aabbccddeeff"


def frame(offset: int, body: bytes = b"") -> bytes:
    return struct.pack(">qi", offset, len(body)) + body


def report(offset: int) -> bytes:
    return struct.pack(">q", offset)


def greeted(log_end: int, log_empty: bool) -> SlaveConnection:
    """A slave's side of a link that has read the master's lineage (every link's first frame)."""
    slave = SlaveConnection(log_end=log_end, log_empty=log_empty)
    assert slave.receive_data(MasterConnection.lineage_frame(LINEAGE, STORE_ID)) == [
        MasterLineage(LINEAGE, STORE_ID)]
    return slave


# -- the wire, byte for byte --------------------------------------------------------------------

def test_frames_and_reports_are_seed_004s_layout():
    master = MasterConnection()
    master.begin(TransferPlan(start=0x0102030405060708))
    assert master.data_frame(3) == bytes.fromhex("0102030405060708 00000003")
    assert master.heartbeat() == bytes.fromhex("010203040506070b 00000000")
    assert SlaveConnection.report(0x11223344) == bytes.fromhex("0000000011223344")


@pytest.mark.parametrize("chunks, events", [
    # One frame, whole.
    ([frame(100, b"abc")], [Transfer(100, b"abc")]),
    # Split anywhere: inside the header, inside the body.
    ([frame(100, b"abc")[:5], frame(100, b"abc")[5:13], frame(100, b"abc")[13:]],
     [Transfer(100, b"abc")]),
    # Two frames in one read, then a heartbeat at the new end.
    ([frame(100, b"ab") + frame(102, b"cd") + frame(104)],
     [Transfer(100, b"ab"), Transfer(102, b"cd"), Heartbeat(104)]),
    # Bytes the slave already holds: a check, not an append.
    ([frame(40, b"xyz")], [Overlap(40, b"xyz")]),
    # A heartbeat before the slave's end: the master's log ends there.
    ([frame(60)], [MasterEnd(60)]),
    # Bytes past the slave's end.
    ([frame(150, b"q")], [Gap(150, 100)]),
])
def test_the_slave_side_turns_bytes_into_events(chunks, events):
    slave = greeted(log_end=100, log_empty=False)
    got = []
    for chunk in chunks:
        got += slave.receive_data(chunk)
    assert got == events


def test_an_empty_slave_takes_its_first_bytes_anywhere_and_then_follows_them():
    slave = greeted(log_end=0, log_empty=True)
    assert slave.receive_data(frame(3 * SEG, b"ab") + frame(3 * SEG + 2, b"c")) == [
        Transfer(3 * SEG, b"ab"), Transfer(3 * SEG + 2, b"c")]
    assert slave.receive_data(frame(3 * SEG + 9, b"d")) == [Gap(3 * SEG + 9, 3 * SEG + 3)]


def test_a_cut_back_moves_where_the_slave_expects_the_next_bytes():
    slave = greeted(log_end=100, log_empty=False)
    assert slave.receive_data(frame(60) + frame(60, b"new")) == [MasterEnd(60),
                                                                 Transfer(60, b"new")]


@pytest.mark.parametrize("bad", [frame(-1, b"x"), struct.pack(">qi", 5, -3),
                                 struct.pack(">qi", 5, 64 * 1024 * 1024)])
def test_frames_no_master_sends_are_protocol_errors(bad):
    with pytest.raises(ProtocolError):
        greeted(log_end=0, log_empty=True).receive_data(bad)


# -- lineage: which log a master holds ----------------------------------------------------------

def test_the_lineage_frame_is_the_links_first_and_carries_both_ids():
    assert MasterConnection.lineage_frame(LINEAGE, STORE_ID) == bytes.fromhex(
        "ffffffffffffffff 00000020"
        "0f1e2d3c4b5a49688776 8594a3b2c1d0 00112233445546778899aabbccddeeff")
    # Split anywhere, then data in the same read: the lineage event comes first.
    data = MasterConnection.lineage_frame(LINEAGE, STORE_ID) + frame(100, b"ab")
    slave = SlaveConnection(log_end=100, log_empty=False)
    assert slave.receive_data(data[:7]) == []
    assert slave.receive_data(data[7:]) == [MasterLineage(LINEAGE, STORE_ID), Transfer(100, b"ab")]


@pytest.mark.parametrize("first", [frame(100, b"ab"), frame(100), frame(-1, b"short")])
def test_a_master_that_does_not_say_its_lineage_first_is_not_followed(first):
    with pytest.raises(ProtocolError, match="lineage"):
        SlaveConnection(log_end=100, log_empty=False).receive_data(first)


def test_a_second_lineage_frame_is_a_protocol_error():
    slave = greeted(log_end=100, log_empty=False)
    with pytest.raises(ProtocolError):
        slave.receive_data(MasterConnection.lineage_frame(LINEAGE, STORE_ID))


@pytest.mark.parametrize("own, master, holds, verdict", [
    (LINEAGE, LINEAGE, True, LineageVerdict.FOLLOW),
    (LINEAGE, STORE_ID, True, LineageVerdict.MISMATCH),  # a wiped or replaced master
    (LINEAGE, STORE_ID, False, LineageVerdict.ADOPT),  # nothing to lose: a fresh copy
    (None, STORE_ID, False, LineageVerdict.ADOPT),
    (None, STORE_ID, True, LineageVerdict.CONFIRM),  # a store from before identities
    (LINEAGE, LINEAGE, False, LineageVerdict.FOLLOW),
])
def test_which_master_a_slave_follows(own, master, holds, verdict):
    assert judge_lineage(own, master, holds_data=holds) is verdict


def test_the_master_side_reads_the_request_then_counts_acks_it_can_vouch_for():
    master = MasterConnection()
    assert master.receive_data(report(500)[:3]) == []
    assert master.receive_data(report(500)[3:]) == [SlaveRequest(500)]
    master.begin(TransferPlan(start=500))
    master.data_frame(100)
    # Its own start again, a report past what was sent, and a real ack in one read: only the
    # real ack counts (and only the last of several).
    assert master.receive_data(report(500) + report(900) + report(550) + report(600)) == [
        SlaveAck(600)]
    assert master.acked == 600 and master.reported == 600
    assert master.receive_data(report(550)) == []  # never backwards
    with pytest.raises(ProtocolError):
        master.receive_data(report(-5))


def test_a_slave_ahead_of_the_master_never_releases_a_put_with_its_first_report():
    master = MasterConnection()
    assert master.receive_data(report(10_000)) == [SlaveRequest(10_000)]
    plan = plan_transfer(10_000, master_min=0, master_max=4_000, segment_size=SEG,
                         from_min_offset=False, epochs=[0, 3_000])
    master.begin(plan)
    assert master.cut_frame() == frame(4_000)
    # The slave's periodic report, sent before it read the cut, is not an ack.
    assert master.receive_data(report(10_000)) == []
    master.data_frame(50)
    assert master.receive_data(report(4_050)) == [SlaveAck(4_050)]


def test_check_frames_lie_before_the_stream_and_come_first():
    master = MasterConnection()
    master.receive_data(report(800))
    master.begin(TransferPlan(start=800, checks=(300,)))
    assert master.check_frame(300, 40) == struct.pack(">qi", 300, 40)
    with pytest.raises(ValueError):
        master.check_frame(800, 40)
    master.data_frame(10)
    with pytest.raises(ValueError):
        master.check_frame(300, 40)


# -- where a stream starts ----------------------------------------------------------------------

@pytest.mark.parametrize("request_, kwargs, plan", [
    # An empty slave: the start of the master's last segment (seed 004), or all it holds.
    (0, dict(master_min=SEG, master_max=3 * SEG + 77, from_min_offset=False),
     TransferPlan(3 * SEG)),
    (0, dict(master_min=SEG, master_max=3 * SEG + 77, from_min_offset=True), TransferPlan(SEG)),
    (0, dict(master_min=0, master_max=0, from_min_offset=False), TransferPlan(0)),
    # A slave inside the log: checks at the epochs below what it holds.
    (2 * SEG, dict(master_min=0, master_max=3 * SEG, from_min_offset=False),
     TransferPlan(2 * SEG, checks=(0, SEG + 5))),
    # A slave ahead: checks below the master's end, then cut back to it.
    (4 * SEG, dict(master_min=0, master_max=3 * SEG, from_min_offset=False),
     TransferPlan(3 * SEG, checks=(0, SEG + 5, 2 * SEG + 9), cut_to=3 * SEG)),
    # A slave the master's retention has passed.
    (SEG // 2, dict(master_min=SEG, master_max=3 * SEG, from_min_offset=False),
     TransferPlan(SEG, behind_retention=True)),
])
def test_plan_transfer(request_, kwargs, plan):
    epochs = [0, SEG + 5, 2 * SEG + 9, 5 * SEG]
    if kwargs["master_min"]:
        plan = TransferPlan(plan.start, tuple(e for e in plan.checks if e >= kwargs["master_min"]),
                            plan.cut_to, plan.behind_retention)
    assert plan_transfer(request_, segment_size=SEG, epochs=epochs, **kwargs) == plan


# -- the epoch file -----------------------------------------------------------------------------

def test_the_epoch_file_is_rocketmqs_checkpoint_text():
    entries = [EpochEntry(1, 0), EpochEntry(2, 4096)]
    text = render(entries)
    body = b"1-0\n2-4096\n"
    import zlib
    assert text == b"2\n%d\n" % (zlib.crc32(body) & 0x7FFFFFFF) + body
    assert parse(text) == entries
    assert parse(b"1\n0\n7-99\n") == [EpochEntry(7, 99)]  # a CRC of 0 is not checked


@pytest.mark.parametrize("bad, why", [
    (b"", "count"), (b"2\n0\n1-0\n", "announced"), (b"1\n12345\n1-0\n", "CRC"),
    (b"1\n0\n1:0\n", "epoch"), (b"\xff\xfe", "text"),
])
def test_a_damaged_epoch_file_says_what_is_wrong(bad, why):
    with pytest.raises(EpochFileCorrupt, match=why):
        parse(bad)


def test_epochs_are_replaced_past_a_new_start_and_a_damaged_file_falls_back_to_its_backup(
        tmp_path):
    path = tmp_path / "epochFileCheckpoint"
    epochs = EpochFile(path)
    epochs.begin(0)
    epochs.begin(5000)
    epochs.begin(9000)
    assert epochs.offsets() == [0, 5000, 9000]
    # A life that starts at 7000 (a tail was lost): the epoch at 9000 is gone with it.
    entry = epochs.begin(7000)
    assert entry == EpochEntry(4, 7000) and epochs.offsets() == [0, 5000, 7000]
    # Below the CommitLog's min offset nothing can be compared any more.
    epochs.begin(8000, min_offset=4000)
    assert EpochFile(path).offsets() == [5000, 7000, 8000]
    path.write_bytes(b"garbage")
    assert EpochFile(path).offsets() == [0, 5000, 7000]  # the .bak: the version before
