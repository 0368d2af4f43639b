"""``HAService``: replication for one store, by ``brokerRole``.

* ASYNC_MASTER / SYNC_MASTER: records the start of this life in the epoch file and runs the
  ``HAServer`` on ``haListenPort``. Under SYNC_MASTER its put waiter goes into the store (a
  put returns once a slave has its bytes, and wakes the senders at once); under ASYNC_MASTER
  puts wait for nothing, and a dispatch listener wakes idle senders when records arrive.
* SLAVE: runs the ``HAClient`` against ``haMasterAddress``; every cut of the log is recorded
  in the epoch file (should this node become a master, its slaves are checked there).

Both send or check the lineage of the store's CommitLog (``stratamq/store/identity.py``); a
master whose store has data of an unknown lineage (a directory from before identities) makes
the log its own lineage when it starts.

``for_store`` is the one place that takes a ``MessageStore``: it hands the parts their pieces
(the ``CommitLogReader``, the ``ReplicaLog``, store time by offset, the put-waiter hook).
Thread-safety: ``start``/``shutdown`` from one thread; ``runtime_info`` from any.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stratamq.config import BrokerRole, StoreConfig
from stratamq.ha.epochs import EpochFile
from stratamq.ha.master import HAServer
from stratamq.ha.slave import HAClient
from stratamq.store.identity import StoreIdentity
from stratamq.store.log_reader import CommitLogReader
from stratamq.store.replica import ReplicaLog, TruncateReport
from stratamq.store.results import PutMessageStatus

if TYPE_CHECKING:
    from stratamq.store.message_store import MessageStore

__all__ = ["HAService", "ReplicationConfigError"]

Listener = Callable[[Any], None]

log = logging.getLogger(__name__)


class ReplicationConfigError(ValueError):
    """The replication settings cannot work together (named in the message)."""


class HAService:
    """Replication for one store; see the module docstring."""

    def __init__(self, config: StoreConfig, reader: CommitLogReader, replica: ReplicaLog,
                 *, identity: StoreIdentity, epoch_file: Path, life_start: int,
                 store_time_at: Callable[[int], int | None],
                 add_put_waiter: Callable[[Callable[[int], PutMessageStatus | None]], None],
                 dispatch_listeners: tuple[Callable[[Listener], None],
                                           Callable[[Listener], None]] | None = None,
                 host: str = "127.0.0.1") -> None:
        self.cluster_epoch: int | None = None  # a cluster master's epoch, from etcd
        self.config = config
        self.role = config.broker_role
        self.reader = reader
        self.replica = replica
        self.identity = identity
        self.epoch_file = epoch_file
        self.life_start = life_start
        self.store_time_at = store_time_at
        self.add_put_waiter = add_put_waiter
        self.dispatch_listeners = dispatch_listeners  # (add, remove)
        self.host = host
        self.epochs: EpochFile | None = None
        self.server: HAServer | None = None
        self.client: HAClient | None = None
        # A slave's: called once its log is in step with its master's (``HAClient.on_in_step``).
        self.on_in_step: Callable[[], None] | None = None

    @classmethod
    def for_store(cls, store: MessageStore, host: str = "127.0.0.1",
                  cluster_epoch: int | None = None) -> HAService:
        """Replication for an open store, by its ``brokerRole``. ``cluster_epoch``: a master
        elected in a cluster (``stratamq/cluster``) starts that epoch where its log ends now."""
        cfg = store.config
        epoch_file = (Path(cfg.store_path_epoch_file) if cfg.store_path_epoch_file
                      else store.layout.epoch_file)
        life_start = store.recovery.end_offset if store.recovery is not None else 0
        if cluster_epoch is not None:
            life_start = store.max_physical_offset
        if store.identity is None:
            raise ReplicationConfigError("replication needs a store opened read-write")
        service = cls(cfg, store.log_reader, store.replica, identity=store.identity,
                   epoch_file=epoch_file,
                   life_start=life_start, store_time_at=_store_time(store.log_reader),
                   add_put_waiter=store.add_put_waiter,
                   dispatch_listeners=(store.add_dispatch_listener,
                                       store.remove_dispatch_listener), host=host)
        service.cluster_epoch = cluster_epoch
        return service

    @property
    def is_master(self) -> bool:
        return self.role is not BrokerRole.SLAVE

    def start(self) -> None:
        if self.role is BrokerRole.SLAVE and not self.config.ha_master_address:
            raise ReplicationConfigError(
                "brokerRole=SLAVE needs haMasterAddress (the master's host:haListenPort)")
        self.epochs = EpochFile(self.epoch_file)
        if self.is_master:
            entry = self.epochs.begin(self.life_start, self.reader.min_offset,
                                      self.cluster_epoch)
            log.info("master epoch %d starts at CommitLog offset %d", entry.epoch,
                     entry.start_offset)
            identity = self.identity
            if identity.lineage is None:
                log.warning("this master's CommitLog was of an unknown lineage: it is now its "
                            "own, %s", identity.store_id)
                identity.set_lineage(identity.store_id)
            self.server = HAServer(self.config, self.reader, self.epochs.offsets,
                                   self.store_time_at,
                                   lambda: (identity.lineage or identity.store_id,
                                            identity.store_id), self.host)
            self.server.start()
            if self.role is BrokerRole.SYNC_MASTER:
                self.add_put_waiter(self.server.wait_for_slave)  # also wakes the senders
            if self.dispatch_listeners is not None:  # an ASYNC_MASTER's senders wake on these
                self.dispatch_listeners[0](self._new_records)
        else:
            epochs = self.epochs

            def record_cut(report: TruncateReport) -> None:
                epochs.begin(report.offset, self.reader.min_offset)

            self.replica.on_truncate.append(record_cut)
            self.client = HAClient(self.config, self.replica, self.reader, self.identity)
            self.client.on_in_step = self.on_in_step
            self.client.start()

    @property
    def listen_port(self) -> int | None:
        return self.server.port if self.server is not None else None

    def _new_records(self, _info: object) -> None:
        # No slave, no writer to wake: skip the Condition, taken after every dispatch round.
        # A link is listed before its writer starts and the writer reads ``data_seq`` before
        # it looks for data, so an append it has not seen finds the link listed here.
        server = self.server
        if server is not None and server.links:
            server.wake_writers()

    def shutdown(self) -> None:
        if self.server is not None:
            if self.dispatch_listeners is not None:
                self.dispatch_listeners[1](self._new_records)
            self.server.shutdown()
        if self.client is not None:
            self.client.shutdown()

    def forget_put_waiter(self, waiters: list) -> None:
        """Take this master's "a slave has the bytes" out of a store's put waiters (its role
        changes at run time: the next ``HAService`` adds its own)."""
        server = self.server
        if server is not None:
            waiters[:] = [w for w in waiters if w != server.wait_for_slave]

    def runtime_info(self) -> dict:
        """RocketMQ's HARuntimeInfo as JSON-ready data (``stratamq ha status``)."""
        if self.server is not None:
            info = self.server.runtime_info()
        elif self.client is not None:
            info = self.client.runtime_info()
        else:
            info = {"master": self.is_master, "role": self.role.value}
        info["storeId"] = self.identity.store_id
        info["lineage"] = self.identity.lineage
        client = self.client
        info["lineageMismatch"] = client is not None and client.lineage_mismatch
        if client is not None:
            info["masterLineage"] = client.master_lineage
        entries = self.epochs.entries if self.epochs is not None else []
        info["epochs"] = [{"epoch": e.epoch, "startOffset": e.start_offset} for e in entries]
        return info


def _store_time(reader: CommitLogReader) -> Callable[[int], int | None]:
    """Store time of the record at an offset (the next segment's first after a blank)."""
    from stratamq import record as codec

    def at(offset: int) -> int | None:
        for _ in range(2):
            head = reader.read_bytes(offset, 8)
            if head is None:
                return None
            size, magic = codec.read_size_and_magic(head, 0)
            if magic == codec.BLANK_MAGIC_CODE:
                offset += size
                continue
            whole = reader.read_bytes(offset, size)
            return codec.record_store_timestamp(whole, 0) if whole is not None else None
        return None

    return at
