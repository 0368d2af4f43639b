"""A slave's copy of its master's state (``StateSync``): topics, groups, consumer offsets, pop
state, deleted topics and the timer's check state, fetched through the master's ``SyncState``
RPC every ``haStateSyncInterval``, as RocketMQ's SlaveSynchronize does (see ``replication.py``,
which starts it on a SLAVE and serves ``SyncState`` on a master).

Nothing is copied from a master whose CommitLog is not of this store's lineage; a topic is
deleted here only when the master lists its deletion, at the master's cutoff.

Thread-safety: the sync thread alone writes the slave's metadata and pop state; a planned
switch's last copy (``BrokerReplication.take_over_state``) shares its ``applying`` lock.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from stratamq.broker.tls import peer_endpoint
from stratamq.client.admin import AdminClient, AdminError

if TYPE_CHECKING:
    from stratamq.broker.replication import ReplicationParts

__all__ = ["SERVICE", "StateSync"]

log = logging.getLogger(__name__)

SERVICE = "stratamq.admin.v1.Replication"  # served by replication.py (SyncState, HaStatus...)
# How long one sync waits for the slave's dispatch to reach a deletion (it finishes later
# when it does not; the next sync sees the slave's cutoff and does not delete again).
_DELETE_WAIT_S = 5.0


class _OtherLineage(Exception):
    """The master's CommitLog is not (yet) of this slave's lineage: copy nothing from it."""


_EAGER_FIRST_SYNC_S = 10.0  # how long a slave retries its first state copy every 0.2 s


class StateSync:
    """A slave's copy of its master's topics, groups and pop state, every interval."""

    def __init__(self, broker: ReplicationParts, endpoint: str, interval_ms: int,
                 applying: threading.Lock | None = None) -> None:
        self.b = broker
        self.endpoint = endpoint
        # Held from asking to applying: a planned switch's last copy (take_over_state) is
        # never overwritten by an older snapshot this thread fetched before it.
        self.applying = applying if applying is not None else threading.Lock()
        self.interval = interval_ms / 1000
        self.last_sync_ms = 0
        self.last_change_ms = 0
        self.syncs = 0
        self.last_error = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="ha-state-sync")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        # A sync in progress ends within its RPC timeout and _DELETE_WAIT_S.
        self._thread.join(10 + _DELETE_WAIT_S)

    def _run(self) -> None:
        cfg = self.b.config
        with AdminClient(peer_endpoint(self.endpoint, cfg),
                         timeout=max(2.0, self.interval)) as client:
            # A fresh slave's first copy waits for its HA link to adopt the master's lineage
            # (a moment after start): until a copy succeeds, ask again soon for a while, so
            # its topics do not lag its messages by a whole interval.
            eager_until = time.monotonic() + _EAGER_FIRST_SYNC_S
            while not self._stop.wait(self._pause(eager_until)):
                try:
                    self.sync_once(client)
                except _OtherLineage as exc:  # the HA client says why, at ERROR if it must
                    if str(exc) != self.last_error:
                        log.info("%s", exc)
                    self.last_error = str(exc)
                except (AdminError, ValueError, OSError) as exc:
                    if str(exc) != self.last_error:
                        log.warning("copying state from master %s failed: %s", self.endpoint,
                                    exc)
                    self.last_error = str(exc)
                except Exception as exc:  # a reply of another shape, a bug: keep the thread
                    if str(exc) != self.last_error:
                        log.exception("copying state from master %s failed", self.endpoint)
                    self.last_error = f"{type(exc).__name__}: {exc}"

    def _pause(self, eager_until: float) -> float:
        if not self.syncs and not self.last_error:
            return 0
        if not self.syncs and time.monotonic() < eager_until:
            return min(self.interval, 0.2)
        return self.interval

    def sync_once(self, client: AdminClient, wait: float = -1) -> None:
        """One copy; ``wait``: how long to wait for a copy under way (-1: as long as it
        takes), TimeoutError past it."""
        if not self.applying.acquire(timeout=wait):
            raise TimeoutError("another copy of the master's state is under way")
        try:
            self._sync_once(client)
        finally:
            self.applying.release()

    def _sync_once(self, client: AdminClient) -> None:
        snap = client.call_service(SERVICE, "SyncState")
        own = self.b.store.identity.lineage if self.b.store.identity is not None else None
        if snap.get("lineage") != own or own is None:
            # Fresh slave: its lineage becomes the master's once the HA link has said it (a
            # later sync copies). Another lineage: the HA client logs that at ERROR.
            raise _OtherLineage(f"state not copied: the master's CommitLog is of lineage "
                                f"{snap.get('lineage')}, this store's of {own}")
        broker = self.b
        gone = broker.meta.replace_all(snap["metadata"])
        for topic in gone:
            log.info("topic %s is no longer in the master's configuration", topic)
        deleted = self._apply_deletions(snap.get("deletedTopics") or {})
        changed = broker.state.restore(snap["popState"])
        if broker.timer_check is not None and "timerCheck" in snap:
            broker.timer_check[1](snap["timerCheck"])
        now = int(time.time() * 1000)
        if changed or gone or deleted:
            self.last_change_ms = now
        self.last_sync_ms = now
        self.syncs += 1
        self.last_error = ""

    def _apply_deletions(self, master_cutoffs: dict[str, int]) -> list[str]:
        """Delete here the topics the master deleted (its ``deletedTopics`` cutoffs).

        Only an explicit deletion removes data: a topic merely missing from the master's
        configuration (a master restarted over an empty config directory) keeps its queues
        here, as RocketMQ's slave only replaces its config table. A deletion is applied once
        this CommitLog holds the master's cutoff, and at that cutoff: what the slave received
        of the topic's next generation before this sync stays, as it stays on the master."""
        store = self.b.store
        applied: list[str] = []
        for topic, cutoff in master_cutoffs.items():
            if not isinstance(cutoff, int) or store.deleted_topics.cutoffs.get(topic, -1) >= cutoff:
                continue
            if store.max_physical_offset < cutoff:
                continue  # not replicated that far yet: a later sync applies it
            log.info("topic %s was deleted on the master (below CommitLog offset %d): deleting "
                     "its queues here", topic, cutoff)
            store.delete_topic(topic, timeout=_DELETE_WAIT_S, at=cutoff)
            applied.append(topic)
        return applied

    def info(self) -> dict[str, Any]:
        return {"masterEndpoint": self.endpoint, "intervalMs": int(self.interval * 1000),
                "lastSyncTimestamp": self.last_sync_ms, "lastChangeTimestamp":
                self.last_change_ms, "syncs": self.syncs, "lastError": self.last_error}
