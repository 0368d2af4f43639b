"""What only a broker group's master does, started when a broker is elected at run time and
stopped when it steps down (controller mode, ``stratamq/cluster``).

A standalone master starts these with the broker; a broker in controller mode opens its store
as a slave and learns its role from etcd later, so ``BrokerReplication.switch_role`` calls
``MasterDuties.stop()`` before every switch and ``start(epoch)`` after a switch to master: the
one place that does it. Each duty gets the narrow things it uses, never the Broker:

* ``prefaulter``: the store's CommitLog page prefaulting (``MessageStore.start_prefaulter``);
* ``timer``: DELAY messages (``TimerMessageStore``): its index is rebuilt from the timer
  ConsumeQueue on election, skipping what the last master's ``timercheck`` says it delivered
  (copied to the slaves with the rest of the state: ``timer_check_state``), then delivery
  starts; a step-down stops it;
* ``tier``: the tier uploader takes the group's tier metadata over and continues where the last
  master stopped, on its own thread with retries (a slow or unreachable tier must not hold the
  election's loop up): ``TieredStore.take_over`` / ``step_down``;
* ``compaction``: a broker opened as a slave holds its compaction queues closed until it pulled
  them from a master (``ha/message_replication.py``); elected, it brings those still closed
  up from its own log (``LocalPullSource``) and opens them; open queues follow the local
  CommitLog whatever the role.

Transaction check-back needs no duty: each check asks the role first (``may_check``), and the
open transactions are rebuilt on every broker from the half and op topics as they dispatch.

Thread-safety: ``start``/``stop`` from the cluster's loop thread (role switches are serial).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Duty", "LocalPullSource", "MasterDuties", "compaction_duty", "for_broker", "tier_duty",
           "timer_check_state", "timer_duty"]

log = logging.getLogger(__name__)

_TIER_RETRY_S = 2.0


@dataclass(frozen=True)
class Duty:
    name: str
    start: Callable[[int], None]  # (the cluster epoch of the new mastership)
    stop: Callable[[], None]


class MasterDuties:
    """The master-only duties of one broker; see the module docstring."""

    def __init__(self) -> None:
        self.duties: list[Duty] = []
        self.running: list[str] = []
        self.epoch = 0

    def add(self, duty: Duty) -> None:
        self.duties.append(duty)

    def start(self, epoch: int) -> None:
        """Elected at ``epoch``: start every duty (one that fails is logged and left off; the
        others start)."""
        self.epoch = epoch
        for duty in self.duties:
            if duty.name in self.running:
                continue
            try:
                duty.start(epoch)
            except Exception:
                log.exception("master duty %s did not start (epoch %d)", duty.name, epoch)
                continue
            self.running.append(duty.name)
        log.info("master duties running at epoch %d: %s", epoch,
                 ", ".join(self.running) or "none")

    def stop(self, but: tuple[str, ...] = ()) -> None:
        """Stepping down (or switching): stop every running duty, the last started first
        (``but``: those left running, for the broker's own stop to close)."""
        for duty in reversed(self.duties):
            if duty.name not in self.running or duty.name in but:
                continue
            try:
                duty.stop()
            except Exception:
                log.exception("master duty %s did not stop cleanly", duty.name)
            self.running.remove(duty.name)


def timer_duty(timer: Any) -> Duty:
    """The timer (``TimerMessageStore``): rebuilt and started on election, closed on
    step-down."""
    def start(_epoch: int) -> None:
        timer.rebuild()  # this broker's own index is stale: the last master delivered since
        timer.start()

    return Duty("timer", start, timer.close)


def tier_duty(tier: Any, broker_id: int, local_queues: Callable[[], dict[str, list[int]]],
              confirmed: Callable[[], int]) -> Duty:
    """The tier (``TieredStore``): take the group's tier over on election (a thread retries
    while the tier cannot be read), pause on step-down."""
    stop = threading.Event()
    thread: list[threading.Thread] = []

    def take_over(epoch: int) -> None:
        while not stop.is_set():
            try:
                tier.take_over(epoch, broker_id, local_queues(), confirmed)
                if stop.is_set():  # stepped down meanwhile: pause again
                    tier.step_down()
                return
            except OSError as exc:
                log.error("tier: cannot take the group's tier over at epoch %d (%s): retrying "
                          "in %.0f s; nothing is uploaded meanwhile", epoch, exc, _TIER_RETRY_S)
                stop.wait(_TIER_RETRY_S)

    def start(epoch: int) -> None:
        stop.clear()
        t = threading.Thread(target=take_over, args=(epoch,), daemon=True,
                             name="tier-take-over")
        thread[:] = [t]
        t.start()

    def halt() -> None:
        stop.set()
        tier.step_down()  # at once: the loop that calls this must not wait on the tier
        for t in thread:
            t.join(1)

    return Duty("tier", start, halt)


class LocalPullSource:
    """A compaction queue's raw records from this broker's own ConsumeQueue and CommitLog,
    past the compaction store (``ha.message_replication.PullSource``): what a broker elected
    with compaction queues still closed (a group's first master, or a slave whose pull from
    the old master was cut short) brings its CompactionLog up from."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def pull(self, topic: str, queue_id: int, offset: int, max_count: int
             ) -> tuple[list[bytes], int]:
        cq = self.store.cq_stores[0].find(topic, queue_id)
        if cq is None:
            return [], offset
        offset = max(offset, cq.min_offset())
        records = []
        for phys, size, _code in cq.get_units(offset, max(0, min(max_count,
                                                                 cq.max_offset() - offset))):
            record = self.store.log_reader.read_bytes(phys, size) if size > 0 else None
            if record is None:
                break  # (a blank unit, or a record gone: the next pass asks again)
            records.append(record)
        return records, offset + len(records)


def compaction_duty(parts: Any) -> Duty:
    """Compaction queues a broker's gate still holds closed (it never pulled them from a
    master) are brought up from its own log and opened on election
    (``CompactionReplicator`` over ``LocalPullSource``); stopped on step-down."""
    from stratamq.ha.message_replication import CompactionReplicator

    running: list[CompactionReplicator] = []

    def queues() -> list[tuple[str, int]]:
        return [(t.name, q) for t in parts.meta.topics() if t.compaction is not None
                for q in range(t.queue_count)]

    def start(_epoch: int) -> None:
        replicator = CompactionReplicator(parts.compaction_gate, parts.compaction,
                                          lambda: LocalPullSource(parts.store), queues,
                                          parts.store_config.ha_state_sync_interval / 1000)
        running[:] = [replicator]
        replicator.start()

    def stop() -> None:
        for replicator in running:
            replicator.stop()
        running.clear()

    return Duty("compaction", start, stop)


def timer_check_state(check_path: Path) -> tuple[Callable[[], list[int] | None],
                                                  Callable[[Any], None]]:
    """(what a master sends of its ``timercheck`` in ``SyncState``, what a slave does with it):
    the slave writes it as its own, so that the timer it starts when elected skips what the
    old master delivered (a window of one state sync: those may be delivered again)."""
    from stratamq.broker.timer import TimerCheck

    def export() -> list[int] | None:
        check = TimerCheck.read(check_path)
        return None if check == TimerCheck(0, 0) else list(check)

    def keep(value: Any) -> None:
        if (isinstance(value, list) and len(value) == 2
                and all(isinstance(v, int) for v in value)):
            check = TimerCheck(value[0], value[1])
            if check != TimerCheck.read(check_path):
                check.write(check_path)

    return export, keep


def for_broker(parts: Any, timer: Any, tier: Any, confirmed: Callable[[], int]) -> None:
    """A controller-mode broker's duties, set on its replication parts (``parts.duties``,
    ``parts.timer_check``): the store's prefaulter, ``timer`` (None: timerEnable off) and
    ``tier`` (None: no tier), with ``confirmed`` the SyncStateSet's confirmed offset."""
    store = parts.store
    duties = MasterDuties()
    duties.add(Duty("prefaulter", lambda _epoch: store.start_prefaulter(),
                    store.stop_prefaulter))
    if timer is not None:
        duties.add(timer_duty(timer))
        parts.timer_check = timer_check_state(timer.check_path)
    if tier is not None and tier.uploader is not None:
        duties.add(tier_duty(tier, parts.config.broker_id, store.topics, confirmed))
    if parts.compaction is not None and parts.compaction_gate is not None:
        duties.add(compaction_duty(parts))
    parts.duties = duties
