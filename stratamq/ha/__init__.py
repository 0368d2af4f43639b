"""Master/slave replication (RocketMQ's classic HA; seed 004 section 1.6).

A slave copies its master's CommitLog byte for byte at the same physical offsets, dispatches
it into its own ConsumeQueues and index, and serves reads; under SYNC_MASTER a put returns once
a slave has its bytes. The protocol logic is pure (``protocol.py``, ``wire.py``, ``epochs``'
parse/render); ``master.py`` and ``slave.py`` are thin socket adapters around it, and
``service.py`` plugs them into a store through its seams (``ReplicaLog``, put waiters,
``CommitLogReader``). See docs/ARCHITECTURE.md, "Replication".
"""

from stratamq.ha.epochs import EpochEntry, EpochFile
from stratamq.ha.master import HAServer
from stratamq.ha.protocol import (
    HAConnectionState,
    MasterConnection,
    ProtocolError,
    SlaveConnection,
    TransferPlan,
    plan_transfer,
)
from stratamq.ha.service import HAService, ReplicationConfigError
from stratamq.ha.slave import HAClient

__all__ = ["EpochEntry", "EpochFile", "HAClient", "HAConnectionState", "HAServer", "HAService",
           "MasterConnection", "ProtocolError", "ReplicationConfigError", "SlaveConnection",
           "TransferPlan", "plan_transfer"]
