"""A group master's SyncStateSet: the brokers that hold everything it acknowledged.

RocketMQ's controller mode (``AutoSwitchHAService``, ``ReplicasInfoManager``): a master is
elected with a SyncStateSet of itself alone; a slave joins once it has caught up, and leaves
after ``haMaxTimeSlaveNotCatchup`` without catching up. A put is acknowledged once every member
of the set has it, so the set alone may be elected (``election.py``): whoever is elected from
it holds every acknowledged message. The order of the steps is what makes that true:

* **join**: the master first requires the slave's acknowledgement for new puts (locally), then
  waits until the slave holds the whole log as of that moment (what the master acknowledged
  alone before), and only then writes the larger set to etcd;
* **leave**: the master first writes the smaller set to etcd (fenced: only while its master key
  is unchanged), and only then acknowledges puts without the slave.

The set's key is ``groups/<brokerName>/syncStateSet``: ``{"brokerIds", "masterBrokerId",
"epoch"}``. StrataMQ's HA links do not name their broker, so the master matches links to the
slaves that registered as following it at its epoch: a slave joins when as many links as such
slaves are caught up (a group of a master and one slave, the usual shape, is exact).

``SyncStateSet`` is driven by the member's loop; ``acks_alone`` is read by the put waiter from
any thread.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

from stratamq.cluster.coordination import Coordination

__all__ = ["SlaveProgress", "SyncStateSet"]

log = logging.getLogger(__name__)

# (this log's end, the least offset every connected slave acknowledged or None without one,
#  how many slave links there are)
SlaveProgress = Callable[[], tuple[int, int | None, int]]


class SyncStateSet:
    def __init__(self, coordination: Coordination, key: str, master_key: str, me: int,
                 epoch: int, progress: SlaveProgress, max_gap: int,
                 not_catchup_ms: int) -> None:
        self.coord = coordination
        self.key = key
        self.master_key = master_key
        self.me = me
        self.epoch = epoch
        self.progress = progress
        self.max_gap = max_gap
        self.not_catchup_ms = not_catchup_ms
        self.written: frozenset[int] = frozenset({me})  # as in etcd
        self.local: frozenset[int] = frozenset({me})  # whose acks puts wait for
        self._joining_end: int | None = None  # the log's end when the join began
        self._lagging_since: float | None = None

    @staticmethod
    def render(ids: frozenset[int] | set[int], master: int, epoch: int) -> bytes:
        return json.dumps({"brokerIds": sorted(ids), "masterBrokerId": master,
                           "epoch": epoch}).encode()

    def acks_alone(self) -> bool:
        """Whether a put is acknowledged without any slave (the set is this master alone)."""
        return self.local == frozenset({self.me})

    def step(self, followers: set[int], master_revision: int) -> None:
        """One pass: ``followers`` registered as following this master at its epoch."""
        end, acked, links = self.progress()
        slaves = self.local - {self.me}
        caught_up = acked is not None and end - acked < self.max_gap
        # Leave: a member that no longer follows, or lags for haMaxTimeSlaveNotCatchup.
        gone = {i for i in slaves if i not in followers}
        if slaves and (not caught_up or links < len(slaves)):
            now = time.monotonic()
            self._lagging_since = self._lagging_since or now
            if (now - self._lagging_since) * 1000 >= self.not_catchup_ms:
                gone = set(slaves)
        else:
            self._lagging_since = None
        if gone:
            smaller = frozenset(self.written - gone)
            if self._write_fenced(smaller, master_revision):
                log.warning("SyncStateSet: brokers %s left (not caught up for "
                            "haMaxTimeSlaveNotCatchup, or gone): now %s", sorted(gone),
                            sorted(smaller))
                self.local = smaller
                self._joining_end = None
            return
        # Join: every follower, once as many links are caught up.
        new = followers - slaves
        if new and self._joining_end is None and caught_up and links >= len(followers):
            self.local = frozenset(self.local | new)  # puts wait for them from here on
            self._joining_end = end
            return
        joined = (self._joining_end is not None and acked is not None
                  and acked >= self._joining_end)  # they hold all acknowledged alone before
        if joined and self._write_fenced(self.local, master_revision):
            log.info("SyncStateSet: now %s", sorted(self.local))
            self._joining_end = None

    def _write_fenced(self, ids: frozenset[int], master_revision: int) -> bool:
        """Write the set only while this broker's master key is unchanged (an old master
        cannot overwrite a new master's set)."""
        ok = self.coord.put_if(self.key, self.render(ids, self.me, self.epoch),
                               unchanged=((self.master_key, master_revision),))
        if ok:
            self.written = ids
        return ok
