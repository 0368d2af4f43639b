"""One broker's part in a cluster: registration under a lease, its group's election, fencing.

Keys under ``etcdPrefix`` (default ``/stratamq/<brokerClusterName>``), values JSON:

* ``brokers/<brokerName>/<brokerId>`` (under the broker's lease): ``{"brokerId",
  "endpoint", "haAddress", "role", "epoch", "maxOffset", "priority", "remotingAddress"}``. A
  lapsed lease removes it: a dead broker.
* ``groups/<brokerName>/master`` (under the master's lease): ``{"brokerId", "epoch",
  "endpoint", "haAddress"}``. Taken by one transaction that also raises the group's epoch
  (Patroni's model): it succeeds only if the key is absent and the epoch unchanged since read,
  so at most one broker holds it and each holder's epoch is greater than every earlier one's.
* ``groups/<brokerName>/epoch``: the group's epoch counter (no lease: it outlives everyone).
* ``groups/<brokerName>/syncStateSet``: ``{"brokerIds": [...]}`` (written by the master; an
  absent key counts every live broker, as the first election does).
* ``groups/<brokerName>/elect``: ``{"brokerId"}``, a planned switch (``cluster elect``).

The loop (a thread, every third of ``etcdLeaseTtlMs``, and at once when the group's keys
change): renew the lease (one request), read the group's keys and registrations (one
request, only when a watch reported a change under them, or once every ``_RESYNC_PASSES``
passes in case a watch missed one), refresh the registration when it changed, then

* a master key held by another broker: follow it (``on_slave``);
* no master key: run ``DefaultElectPolicy`` (``election.py``) over the live registrations;
  the broker it names takes the key (the others wait: it takes it within one loop);
* the key is this broker's: stay master; a planned switch naming another live broker makes it
  step down (fence first, then delete the key). The broker it names copies the old master's
  pop state and offsets once more before it takes the key (``take_over_state``): what was
  acknowledged on the old master up to its step-down stays acknowledged.

Fencing: ``Fence.writable()`` is true only while this broker holds the master key and less than
two thirds of the TTL have passed since the send of its last successful renewal; etcd expires
the lease no sooner than a full TTL after that send, so a master that cannot renew (etcd gone,
partitioned, the process stopped) refuses writes before anyone else can be elected. The check
is a clock read at each put, so a process woken from SIGSTOP refuses before its loop runs.
Failsafe mode (``etcdFailsafeMode``, Patroni's): a master that cannot reach etcd asks every
broker that could be elected in its place (its SyncStateSet's other members; every registered
broker with ``enableElectUncleanMaster``) whether it has lost etcd too. Only if all confirm
does it extend its fence, by the same two thirds of the TTL from the moment it asked. A broker
that confirms takes no master key for a full TTL from its answer, so it cannot be elected
while the master may still acknowledge writes on its word; a broker that reached etcd on its
last pass refuses to confirm, so a master cut off from etcd alone is fenced as without
failsafe mode.

Thread-safety: ``Fence`` and ``status`` from any thread; the loop alone changes roles.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from stratamq.cluster.coordination import (
    Coordination,
    CoordinationError,
    CoordinationUnavailable,
    KeyValue,
    LeaseLost,
    WatchEvent,
)
from stratamq.cluster.election import Candidate, elect
from stratamq.cluster.sync_state import SlaveProgress, SyncStateSet

__all__ = ["BrokerIdentity", "ClusterMember", "Fence", "MasterInfo", "group_keys"]

log = logging.getLogger(__name__)

_FENCE_SHARE = 2 / 3  # of the TTL a master may acknowledge writes after a renewal's send
# A full read of the group every this many passes (two TTLs) even without a watch event: a
# watch stream that hangs (a partitioned member) reports nothing and no error.
_RESYNC_PASSES = 6

# (endpoint, master broker id, epoch) -> whether that broker confirms it has lost etcd too
AskFailsafe = Callable[[str, int, int], bool]


@dataclass(frozen=True)
class BrokerIdentity:
    cluster: str
    group: str  # brokerName
    broker_id: int
    priority: int  # brokerElectionPriority
    endpoint: str  # the client (gRPC) endpoint, host:port
    ha_address: str  # host:haListenPort, where slaves connect
    remoting_address: str = ""  # host:port of RocketMQ 4.x remoting (routes.py), "" if none


@dataclass(frozen=True)
class MasterInfo:
    broker_id: int
    epoch: int
    endpoint: str
    ha_address: str

    @classmethod
    def parse(cls, data: bytes) -> MasterInfo:
        d = json.loads(data)
        return cls(int(d["brokerId"]), int(d["epoch"]), str(d["endpoint"]),
                   str(d["haAddress"]))

    def render(self) -> bytes:
        return json.dumps({"brokerId": self.broker_id, "epoch": self.epoch,
                           "endpoint": self.endpoint, "haAddress": self.ha_address}).encode()


def group_keys(prefix: str, group: str) -> dict[str, str]:
    base = f"{prefix}/groups/{group}"
    return {"master": f"{base}/master", "epoch": f"{base}/epoch",
            "syncStateSet": f"{base}/syncStateSet", "elect": f"{base}/elect",
            "brokers": f"{prefix}/brokers/{group}/"}


def _without_offset(registration: bytes) -> dict:
    d = json.loads(registration)
    d.pop("maxOffset", None)
    return d


class Fence:
    """Whether this broker may acknowledge writes as its group's master; see the module
    docstring."""

    def __init__(self) -> None:
        self._until = 0.0  # time.monotonic()
        self._master = False

    def hold(self, until: float) -> None:
        self._master = True
        self._until = until

    def extend(self, until: float) -> None:
        if self._master:
            self._until = max(self._until, until)

    def drop(self) -> None:
        self._master = False
        self._until = 0.0

    def writable(self) -> bool:
        return self._master and time.monotonic() < self._until

    def refusal(self) -> str | None:
        """Why a put must be refused now (None: it may go on)."""
        if not self._master:
            return "this broker is not its group's elected master"
        if time.monotonic() >= self._until:
            return ("this master could not renew its etcd lease in time: writes are fenced "
                    "until it can (another broker may be elected)")
        return None


class ClusterMember:
    """The loop of one broker; see the module docstring."""

    def __init__(self, coordination: Coordination, me: BrokerIdentity, prefix: str,
                 ttl_ms: int, *, max_offset: Callable[[], int], last_epoch: Callable[[], int],
                 on_master: Callable[[int], None],
                 on_slave: Callable[[MasterInfo | None], None],
                 allow_unclean: bool = False, progress: SlaveProgress | None = None,
                 max_gap: int = 256 << 20, not_catchup_ms: int = 15_000,
                 ask_failsafe: AskFailsafe | None = None,
                 take_over_state: Callable[[str], None] | None = None) -> None:
        self.coord = coordination
        # A planned switch's new master, before it takes the key: copy the state of the old
        # master (its client endpoint) now that it has stepped down. Never raises.
        self.take_over_state = take_over_state
        self.me = me
        self.prefix = prefix
        self.ttl_ms = ttl_ms
        self.keys = group_keys(prefix, me.group)
        self.my_key = f"{self.keys['brokers']}{me.broker_id}"
        self.max_offset = max_offset
        self.last_epoch = last_epoch
        self.on_master = on_master
        self.on_slave = on_slave
        self.allow_unclean = allow_unclean
        self.progress = progress or (lambda: (self.max_offset(), None, 0))
        self.max_gap = max_gap
        self.not_catchup_ms = not_catchup_ms
        self.sync: SyncStateSet | None = None  # while master
        self.fence = Fence()
        self.lease = 0
        self.master: MasterInfo | None = None  # the group's, as last read
        self.is_master = False
        # Whether this broker, once its role is master, serves pops and acks itself: set
        # before it switches to master, cleared before anything else when it steps down (a
        # planned switch's target then copies a state nothing changes any more).
        self.serves_pops = False
        self.epoch = 0  # of this broker's mastership, while it is master
        self.last_error = ""
        self._registered = b""
        self.ask_failsafe = ask_failsafe  # None: etcdFailsafeMode=false
        self.failsafe = False  # this master's fence was last extended by its slaves' word
        self.etcd_lost = False  # this broker's last request to etcd failed
        self._no_election_until = 0.0  # monotonic; after confirming a master's failsafe
        self._elect_lock = threading.Lock()  # a failsafe answer vs. taking the master key
        self._snapshot: dict[str, KeyValue] = {}  # the group's keys as last read
        self._broker_kvs: list[KeyValue] = []  # the group's registrations as last read
        self._stale = True  # a watch reported a change since the last read
        self._passes_since_read = 0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._unwatch: Callable[[], None] | None = None
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"cluster {me.group}/{me.broker_id}")

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        unwatch = [self.coord.watch_prefix(f"{self.prefix}/groups/{self.me.group}/",
                                           self._changed),
                   self.coord.watch_prefix(self.keys["brokers"], self._changed)]

        def unwatch_all() -> None:
            for u in unwatch:
                u()

        self._unwatch = unwatch_all
        self._thread.start()

    def stop(self) -> None:
        """Leave the cluster: fence, give up the master key and the lease (others elect at
        once instead of after a TTL)."""
        self._stop.set()
        self._wake.set()
        self._thread.join(self.ttl_ms / 1000 + 5)
        self.serves_pops = False
        self.fence.drop()
        if self._unwatch is not None:
            self._unwatch()
        if self.lease:
            try:
                self.coord.revoke(self.lease)
            except CoordinationError as exc:
                log.warning("could not revoke the etcd lease on leaving: %s", exc)

    def _changed(self, event: WatchEvent) -> None:
        if event.key == self.my_key:
            return  # this broker's own registration
        self._stale = True
        if not event.key.startswith(self.keys["brokers"]) or event.value is None:
            self._wake.set()  # the master key may have gone: act now (a registration can wait)

    def _run(self) -> None:
        interval = self.ttl_ms / 3000
        while not self._stop.is_set():
            pause = interval
            try:
                self.step()
                self.last_error = ""
                self.etcd_lost = False
            except CoordinationUnavailable as exc:
                self.etcd_lost = True
                if self.is_master and self.ask_failsafe is not None:
                    self._failsafe()
                    pause = interval / 2  # a failed round must not outlast the fence
                if str(exc) != self.last_error:
                    log.warning("cluster: %s", exc)
                self.last_error = str(exc)
            except CoordinationError as exc:
                if str(exc) != self.last_error:
                    log.warning("cluster: %s", exc)
                self.last_error = str(exc)
            except Exception as exc:  # a bug: keep the loop (the fence lapses on its own)
                log.exception("cluster loop failed")
                self.last_error = f"{type(exc).__name__}: {exc}"
            self._wake.wait(pause)
            self._wake.clear()

    # -- one step ------------------------------------------------------------------------------

    def step(self) -> None:
        """Renew, read the group if it changed, register, and act (one pass of the loop)."""
        self._renew()
        self._register()
        self._passes_since_read += 1
        if self._stale or self._passes_since_read >= _RESYNC_PASSES:
            self._read()
        self._act()

    def _read(self) -> None:
        """The group's keys and its registrations, in one request."""
        self._stale = False  # first: a change from here on is read at the next pass
        try:
            groups, brokers = self.coord.get_prefixes(
                f"{self.prefix}/groups/{self.me.group}/", self.keys["brokers"])
        except CoordinationError:
            self._stale = True
            raise
        self._snapshot = {kv.key: kv for kv in groups}
        self._broker_kvs = brokers
        self._passes_since_read = 0

    def _renew(self) -> None:
        sent = time.monotonic()
        if not self.lease:
            self.lease = self.coord.grant(self.ttl_ms)
            self.etcd_lost = False
            self._registered = b""
            return
        try:
            self.coord.keep_alive(self.lease)
        except LeaseLost:
            log.error("cluster: this broker's etcd lease lapsed (it was unreachable for "
                      "etcdLeaseTtlMs): %s", "stepping down" if self.is_master else "rejoining")
            self._step_down(None)
            self.lease = self.coord.grant(self.ttl_ms)
            self.etcd_lost = False
            self._registered = b""
            self._stale = True  # the master key may have gone with the lease
            return
        except CoordinationUnavailable:
            raise  # the fence lapses by itself; nothing else changes while etcd is away
        self.etcd_lost = False
        self.fence.extend(sent + self.ttl_ms * _FENCE_SHARE / 1000)
        self.failsafe = False

    def _registration(self) -> bytes:
        return json.dumps({
            "brokerId": self.me.broker_id, "endpoint": self.me.endpoint,
            "haAddress": self.me.ha_address, "role": "MASTER" if self.is_master else "SLAVE",
            "masterBrokerId": (self.me.broker_id if self.is_master else
                               self._following.broker_id if self._following else None),
            "epoch": self._epoch_known(), "maxOffset": self.max_offset(),
            "priority": self.me.priority,
            "remotingAddress": self.me.remoting_address}).encode()

    def _epoch_known(self) -> int:
        """The epoch this broker's log is of, for the election's ranking: its own while master,
        its master's while following one, else the last its store recorded."""
        if self.is_master:
            return self.epoch
        following = self._following
        return max(self.last_epoch(), following.epoch if following is not None else 0)

    def _register(self) -> None:
        """Put the registration when it changed; a change of max offset alone at most once
        every third pass (a TTL): it only ranks candidates of the SyncStateSet, which all
        hold what was acknowledged, so a little staleness costs nothing but etcd writes do."""
        value = self._registration()
        if value == self._registered:
            return
        self._passes_since_put += 1
        if (self._registered and self._passes_since_put < 3
                and _without_offset(value) == _without_offset(self._registered)):
            return
        self.coord.put(self.my_key, value, self.lease)
        self._registered = value
        self._passes_since_put = 0
        # The watch skips this broker's own key: the cached registrations take it from here.
        mine = KeyValue(self.my_key, value, 0, self.lease)
        self._broker_kvs = sorted([kv for kv in self._broker_kvs if kv.key != self.my_key]
                                  + [mine], key=lambda kv: kv.key)

    def _act(self) -> None:
        current = self._snapshot.get(self.keys["master"])
        master = MasterInfo.parse(current.value) if current is not None else None
        self.master = master
        if current is not None and master is not None:
            if current.lease == self.lease and master.broker_id == self.me.broker_id:
                if not self.is_master:  # taken by this broker's previous loop, then lost
                    self._become_master(master.epoch, time.monotonic())
                self._keep_sync_state_set(current.mod_revision)
                self._planned_switch(current.mod_revision)
                return
            if self.is_master:
                log.error("cluster: broker %d holds the master key of %s: stepping down",
                          master.broker_id, self.me.group)
            self._step_down(master)
            return
        if self.is_master:
            self._step_down(None)  # the key went (revoked): never write without it
        self._try_elect()

    def _brokers(self) -> list[KeyValue]:
        return self._broker_kvs

    def _registrations(self) -> list[dict]:
        out = []
        for kv in self._brokers():
            try:
                value = json.loads(kv.value)
            except ValueError:
                value = None
            if isinstance(value, dict):
                out.append(value)
            else:
                log.warning("cluster: ignoring a malformed registration at %s", kv.key)
        return out

    def _keep_sync_state_set(self, master_revision: int) -> None:
        sync = self.sync
        if sync is None:
            return
        followers = {int(d["brokerId"]) for d in self._registrations()
                     if d.get("masterBrokerId") == self.me.broker_id
                     and d.get("epoch") == self.epoch and d.get("brokerId") != self.me.broker_id}
        sync.step(followers, master_revision)

    def acks_alone(self) -> bool:
        """Whether this master acknowledges puts without a slave (its SyncStateSet is itself)."""
        sync = self.sync
        return self.is_master and sync is not None and sync.acks_alone()

    def _live(self) -> dict[int, Candidate]:
        live = {}
        for kv in self._brokers():
            try:
                d = json.loads(kv.value)
                live[int(d["brokerId"])] = Candidate(int(d["brokerId"]), int(d["epoch"]),
                                                     int(d["maxOffset"]), int(d["priority"]))
            except (ValueError, KeyError, TypeError):
                log.warning("cluster: ignoring a malformed registration at %s", kv.key)
        return live

    def _json(self, key: str) -> dict | None:
        kv = self._snapshot.get(key)
        if kv is None:
            return None
        try:
            value = json.loads(kv.value)
        except ValueError:
            return None
        return value if isinstance(value, dict) else None

    def _try_elect(self) -> None:
        with self._elect_lock:
            if time.monotonic() < self._no_election_until:
                return  # confirmed a master's failsafe: it may still acknowledge writes
            self._elect()

    def _elect(self) -> None:
        live = self._live()
        sss = self._json(self.keys["syncStateSet"]) or {}
        in_sync = [int(i) for i in sss.get("brokerIds", [])]
        request = self._json(self.keys["elect"]) or {}
        preferred = request.get("brokerId")
        preferred = int(preferred) if isinstance(preferred, int) and preferred in live else None
        old = sss.get("masterBrokerId")
        choice = elect(live, in_sync, old if isinstance(old, int) else None, preferred,
                       self.allow_unclean)
        if choice.broker_id != self.me.broker_id:
            why = (f"SyncStateSet {in_sync}, live {sorted(live)}"
                   if choice.broker_id is None and live else "")
            if why and why != self._no_candidate:  # once per situation, not every pass
                log.warning("cluster: no broker of %s can be elected (SyncStateSet %s, live "
                            "%s; enableElectUncleanMaster is off)", self.me.group, in_sync,
                            sorted(live))
            self._no_candidate = why
            self._step_down(None)
            return
        if preferred == self.me.broker_id and isinstance(old, int):
            self._take_over_state(old)
        epoch_kv = self._snapshot.get(self.keys["epoch"])
        epoch = (int(epoch_kv.value) if epoch_kv is not None else 0) + 1
        epoch = max(epoch, self.last_epoch() + 1)  # never below what this store has recorded
        mine = MasterInfo(self.me.broker_id, epoch, self.me.endpoint, self.me.ha_address)
        revision = epoch_kv.mod_revision if epoch_kv is not None else 0
        sent = time.monotonic()
        alone = SyncStateSet.render({self.me.broker_id}, self.me.broker_id, epoch)
        if not self.coord.create(self.keys["master"], mine.render(), self.lease,
                                 also=((self.keys["epoch"], str(epoch).encode()),
                                       (self.keys["syncStateSet"], alone)),
                                 unchanged=((self.keys["epoch"], revision),)):
            self._stale = True
            return  # another broker was faster: the next pass follows it
        if choice.unclean:
            log.error("cluster: UNCLEAN election in %s: broker %d is master at epoch %d "
                      "though not in the SyncStateSet %s (enableElectUncleanMaster): messages "
                      "the old master acknowledged may be missing", self.me.group,
                      self.me.broker_id, epoch, in_sync)
        if preferred == self.me.broker_id:
            self.coord.put(self.keys["elect"], b"{}")  # the planned switch is done
        self.master = mine
        self._become_master(epoch, sent)

    def _take_over_state(self, old_master: int) -> None:
        """A planned switch to this broker: the old master stepped down (it deleted the key
        and serves no pops from then on), so one more copy of its state closes the window of
        acknowledgements made after this broker's last periodic copy."""
        endpoint = next((d.get("endpoint") for d in self._registrations()
                         if d.get("brokerId") == old_master), None)
        if (self.take_over_state is not None and isinstance(endpoint, str) and endpoint
                and old_master != self.me.broker_id):
            self.take_over_state(endpoint)

    # -- failsafe mode -------------------------------------------------------------------------

    def _failsafe(self) -> None:
        """etcd is unreachable: keep the fence while every broker that could be elected
        instead confirms it has lost etcd too (see the module docstring)."""
        sync, ask = self.sync, self.ask_failsafe
        if sync is None or ask is None:
            return
        registered = {int(d["brokerId"]): str(d.get("endpoint") or "")
                      for d in self._registrations() if isinstance(d.get("brokerId"), int)}
        others = (set(registered) if self.allow_unclean else set(sync.written)) - {
            self.me.broker_id}
        sent = time.monotonic()
        refused = [i for i in sorted(others)
                   if not registered.get(i) or not ask(registered[i], self.me.broker_id,
                                                       self.epoch)]
        if refused:
            if self.failsafe:
                log.error("cluster: failsafe mode ends: brokers %s did not confirm they lost "
                          "etcd too; writes are fenced", refused)
            self.failsafe = False
            return
        if not self.failsafe:
            log.warning("cluster: etcd unreachable; failsafe mode: brokers %s confirm they "
                        "lost it too, so this master keeps accepting writes", sorted(others))
        self.failsafe = True
        self.fence.extend(sent + self.ttl_ms * _FENCE_SHARE / 1000)

    def confirm_failsafe(self, master_id: int, epoch: int) -> bool:
        """A master's failsafe question (any thread): True if this broker follows it at
        ``epoch`` and its own last request to etcd failed; it then takes no master key for a
        full TTL (the master may acknowledge writes for two thirds of one on this answer)."""
        with self._elect_lock:
            return self._confirm(master_id, epoch)

    def _confirm(self, master_id: int, epoch: int) -> bool:
        following = self._following
        if (self.is_master or not self.etcd_lost or following is None
                or following.broker_id != master_id or following.epoch != epoch):
            return False
        self._no_election_until = max(self._no_election_until,
                                      time.monotonic() + self.ttl_ms / 1000)
        return True

    def _become_master(self, epoch: int, sent: float) -> None:
        log.info("cluster: broker %d is master of %s at epoch %d", self.me.broker_id,
                 self.me.group, epoch)
        self.sync = SyncStateSet(self.coord, self.keys["syncStateSet"], self.keys["master"],
                                 self.me.broker_id, epoch, self.progress, self.max_gap,
                                 self.not_catchup_ms)
        self.serves_pops = True
        self.on_master(epoch)  # the store is a master (epoch recorded) before any write
        self.is_master = True
        self.epoch = epoch
        self.fence.hold(sent + self.ttl_ms * _FENCE_SHARE / 1000)
        self._registered = b""

    def _step_down(self, master: MasterInfo | None) -> None:
        self.serves_pops = False
        self.fence.drop()  # first: no write is acknowledged from here on
        was = self.is_master
        self.is_master = False
        self.epoch = 0
        self.sync = None
        if was or master != self._following:
            self._following = master
            self.on_slave(master)
            self._registered = b""

    _following: MasterInfo | None = None
    _no_candidate = ""
    _passes_since_put = 0

    def _planned_switch(self, master_revision: int) -> None:
        request = self._json(self.keys["elect"]) or {}
        target = request.get("brokerId")
        if not isinstance(target, int) or target == self.me.broker_id:
            return
        if target not in self._live() or self.sync is None or target not in self.sync.written:
            return  # not alive, or may lack acknowledged messages (the CLI said so already)
        log.info("cluster: planned switch of %s to broker %d: stepping down", self.me.group,
                 target)
        self.serves_pops = False
        self.fence.drop()
        if self.coord.delete_if(self.keys["master"], master_revision):
            self._step_down(None)
