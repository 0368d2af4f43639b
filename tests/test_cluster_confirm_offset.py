"""A controller-mode master dispatches only what its SyncStateSet holds (RocketMQ's confirm
offset, as with ``allAckInSyncStateSet``: StrataMQ's master acknowledges a put once every
member has it). A message the slave does not have is in the master's CommitLog but readable by
no consumer: a failover may cut it, and a consumer that had read it would commit an offset
past it and skip the acknowledged message the new master puts there. Real processes: one etcd
member, a master and a slave broker; the slave is frozen with SIGSTOP."""

from __future__ import annotations

import os
import signal

import pytest
from rocketmq.grpc_protocol import definition_pb2 as pb
from test_cluster_failover import (
    _start,
    assert_all_readable,
    one_etcd_pair,
    readable,
    send_replies,
)
from waiting import wait_until

from stratamq.client.admin import AdminClient

# The frozen slave must stay a member of the SyncStateSet while it is frozen (a slave that
# leaves the set no longer holds dispatch back): its lease and its time to catch up outlast
# the few seconds it is frozen. (A longer lease would slow the members' loop: TTL / 3.)
PATIENT = {"etcdLeaseTtlMs": "20000", "haMaxTimeSlaveNotCatchup": "600000",
           "syncFlushTimeout": "2000"}


@pytest.fixture
def pair(tmp_path):
    yield from one_etcd_pair(tmp_path, PATIENT)


def ha_status(endpoint: str) -> dict:
    with AdminClient(endpoint, timeout=5) as client:
        return client.call_service("stratamq.admin.v1.Replication", "HaStatus")


def test_a_message_the_slave_lacks_is_read_only_once_the_slave_has_it(pair):
    master, slave = _start(pair)
    [(code, _)] = send_replies(master.endpoint, [b"confirmed"])
    assert code == pb.OK
    assert_all_readable(master.endpoint, {b"confirmed": "master"})
    assert slave.proc is not None
    os.kill(slave.proc.pid, signal.SIGSTOP)
    try:
        [(code, why)] = send_replies(master.endpoint, [b"unconfirmed"])
        assert code != pb.OK, "a put the slave never got was acknowledged"
        status: dict = {}

        def dispatch_at_its_bound() -> bool:
            status.update(ha_status(master.endpoint))
            return status["dispatchedOffset"] == status["confirmOffset"]

        wait_until(dispatch_at_its_bound, timeout=30, what="dispatch to reach its bound")
        # The record is in the CommitLog, past the bound: no consumer can read it.
        assert b"unconfirmed" not in readable(master.endpoint)
        assert status["confirmOffset"] < status["masterCommitLogMaxOffset"], status
    finally:
        os.kill(slave.proc.pid, signal.SIGCONT)
    # The slave has it again: readable at the master (and at the slave), where it was put.
    assert_all_readable(master.endpoint, {b"confirmed": "master", b"unconfirmed": "master"})
    assert_all_readable(slave.endpoint, {b"confirmed": "master", b"unconfirmed": "master"})
