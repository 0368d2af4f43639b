"""One route table for a cluster on etcd: every group's topics, masters and slaves, as every
broker (``QueryRoute``, ``QueryAssignment``) and every NameServer answers them.

Keys under ``etcdPrefix`` besides the membership's (``member.py``), values JSON:

* ``topics/<brokerName>/<topic>``: ``{"readQueueNums", "writeQueueNums", "perm",
  "messageType"}`` (no lease: a topic outlives its brokers, as RocketMQ's topic config does).
  Written by the group's master only (``TopicPublisher``): when it becomes master (one range
  read of its group's entries, then a put for each that differs and a delete for each it no
  longer has) and after each create, update or delete of a topic (a put or a delete). A slave
  never writes: its topics are its master's (state sync).

``RouteTable`` reads the whole prefix once, then keeps it by one watch (a long-lived stream,
no request per change), and reads it again every ``resync_s`` (30 s) in case the watch lost
events while it reconnected: about 0.03 requests per second per broker at steady state.

A group's routes: its master (``groups/<G>/master``: brokerId, endpoint) and its live
registrations (``brokers/<G>/<id>``: endpoint, role, remotingAddress). Thread-safety: any
thread; the table is swapped whole under a lock.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from stratamq.cluster.coordination import Coordination, CoordinationError, WatchEvent
from stratamq.cluster.status import _json

__all__ = ["BrokerRoute", "GroupRoute", "RouteTable", "TopicPublisher", "TopicRoute",
           "topic_entry"]

log = logging.getLogger(__name__)

MASTER_ID = 0  # RocketMQ's MixAll.MASTER_ID: the id a group's master is routed under


@dataclass(frozen=True)
class TopicRoute:
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    message_type: str

    @classmethod
    def parse(cls, raw: bytes) -> TopicRoute | None:
        try:
            d = json.loads(raw)
            return cls(int(d["readQueueNums"]), int(d["writeQueueNums"]), int(d["perm"]),
                       str(d.get("messageType") or "NORMAL"))
        except (ValueError, KeyError, TypeError):
            return None


def topic_entry(read_queue_nums: int, write_queue_nums: int, perm: int,
                message_type: str) -> bytes:
    """The value of ``topics/<brokerName>/<topic>``."""
    return json.dumps({"readQueueNums": read_queue_nums, "writeQueueNums": write_queue_nums,
                       "perm": perm, "messageType": message_type}, sort_keys=True).encode()


@dataclass(frozen=True)
class BrokerRoute:
    broker_id: int
    endpoint: str  # gRPC, host:port
    remoting_address: str  # "" when the broker serves no remoting port known at its start


@dataclass(frozen=True)
class GroupRoute:
    name: str
    master: BrokerRoute | None  # None while the group has no elected master
    slaves: tuple[BrokerRoute, ...]  # live brokers of the group other than its master
    topics: dict[str, TopicRoute] = field(default_factory=dict)


def build_groups(kvs: dict[str, bytes], prefix: str) -> list[GroupRoute]:
    """The groups (sorted by name) that the keys under ``prefix`` describe."""
    regs: dict[str, dict[int, dict[str, Any]]] = {}
    masters: dict[str, dict[str, Any]] = {}
    topics: dict[str, dict[str, TopicRoute]] = {}
    for key, value in kvs.items():
        rest = key[len(prefix) + 1:]
        kind, _, tail = rest.partition("/")
        group, _, leaf = tail.rpartition("/")
        if not group:
            continue
        if kind == "brokers":
            d = _json(value)
            if isinstance(d.get("brokerId"), int):
                regs.setdefault(group, {})[d["brokerId"]] = d
        elif kind == "groups" and leaf == "master":
            masters[group] = _json(value)
        elif kind == "topics":
            route = TopicRoute.parse(value)
            if route is not None:
                topics.setdefault(group, {})[leaf] = route
    out = []
    for name in sorted(set(regs) | set(masters) | set(topics)):
        members = regs.get(name, {})
        m = masters.get(name) or {}
        master_id = m.get("brokerId") if isinstance(m.get("brokerId"), int) else None
        master = None
        if master_id is not None and m.get("endpoint"):
            master = BrokerRoute(master_id, str(m["endpoint"]),
                                 str(members.get(master_id, {}).get("remotingAddress") or ""))
        slaves = tuple(BrokerRoute(i, str(d.get("endpoint") or ""),
                                   str(d.get("remotingAddress") or ""))
                       for i, d in sorted(members.items())
                       # Id 0 is the master's in every route: a slave configured with it
                       # cannot be told apart from the master, so it is left out.
                       if i != master_id and i != MASTER_ID and d.get("endpoint"))
        out.append(GroupRoute(name, master, slaves, topics.get(name, {})))
    return out


class RouteTable:
    """The cluster's groups as etcd has them, kept by a watch; see the module docstring."""

    def __init__(self, coordination: Coordination, prefix: str, resync_s: float = 30.0) -> None:
        self.coord = coordination
        self.prefix = prefix.rstrip("/")
        self.resync_s = resync_s
        self._kvs: dict[str, bytes] = {}
        self._groups: list[GroupRoute] | None = None
        self._lock = threading.Lock()
        self._loaded = threading.Event()
        self._stop = threading.Event()
        self._unwatch: Callable[[], None] | None = None
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"routes {self.prefix}")

    @property
    def loaded(self) -> bool:
        """Whether etcd has been read once (before that the table is empty)."""
        return self._loaded.is_set()

    def start(self) -> RouteTable:
        # The watch first: a change between the read and the watch would otherwise be lost.
        self._unwatch = self.coord.watch_prefix(f"{self.prefix}/", self._apply)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._unwatch is not None:
            self._unwatch()
        self._thread.join(5)

    def wait_loaded(self, timeout: float) -> bool:
        return self._loaded.wait(timeout)

    def _run(self) -> None:
        last_error = ""
        while not self._stop.is_set():
            try:
                self.reload()
            except CoordinationError as exc:
                if str(exc) != last_error:  # once per situation, not every second
                    log.warning("cluster routes: cannot read %s from etcd (routes as last "
                                "read): %s", self.prefix, exc)
                last_error = str(exc)
                self._stop.wait(1.0)  # not loaded yet, or etcd away: ask again soon
                continue
            last_error = ""
            self._stop.wait(self.resync_s)

    def reload(self) -> None:
        """Read every key under the prefix (one range request)."""
        kvs = {kv.key: kv.value for kv in self.coord.get_prefix(f"{self.prefix}/")}
        with self._lock:
            self._kvs = kvs
            self._groups = None
        self._loaded.set()

    def _apply(self, event: WatchEvent) -> None:
        with self._lock:
            if event.value is None:
                self._kvs.pop(event.key, None)
            else:
                self._kvs[event.key] = event.value
            self._groups = None

    def groups(self) -> list[GroupRoute]:
        with self._lock:
            if self._groups is None:
                self._groups = build_groups(self._kvs, self.prefix)
            return self._groups

    def topic_groups(self, topic: str) -> list[tuple[GroupRoute, TopicRoute]]:
        """The groups that serve ``topic``, with its queues there."""
        return [(g, g.topics[topic]) for g in self.groups() if topic in g.topics]


class TopicPublisher:
    """Writes this group's topics to etcd while this broker is the group's master; see the
    module docstring. ``topics()``: the local topics as ``topic_entry`` values;
    ``mastership()``: this broker's epoch while it is master, else None."""

    def __init__(self, coordination: Coordination, prefix: str, group: str,
                 topics: Callable[[], dict[str, bytes]],
                 mastership: Callable[[], int | None], interval_s: float = 1.0) -> None:
        self.coord = coordination
        self.base = f"{prefix.rstrip('/')}/topics/{group}/"
        self.topics = topics
        self.mastership = mastership
        self.interval_s = interval_s
        self.writes = 0  # puts and deletes sent
        self._published: dict[str, bytes] | None = None  # as etcd has it, while master
        self._epoch: int | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"topic publisher {group}")

    def start(self) -> TopicPublisher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(5)

    def changed(self) -> None:
        """A topic was created, updated or deleted (``MetadataStore`` listener)."""
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            # The role is a local read each interval; etcd is asked only when there is
            # something to write.
            self._wake.wait(self.interval_s)
            self._wake.clear()
            try:
                self.publish()
            except CoordinationError as exc:
                log.warning("cluster routes: cannot publish topics: %s", exc)
                self._published = None  # read again once etcd answers
            except Exception:  # a bug: keep publishing later
                log.exception("cluster routes: publishing topics failed")
                self._published = None

    def publish(self) -> None:
        """Bring etcd's entries of this group in line with the local topics (master only)."""
        epoch = self.mastership()
        if epoch is None:
            self._published, self._epoch = None, None
            return
        if self._published is None or epoch != self._epoch:
            self._published = {kv.key[len(self.base):]: kv.value
                               for kv in self.coord.get_prefix(self.base)}
            self._epoch = epoch
        published = self._published
        want = self.topics()
        for name, value in sorted(want.items()):
            if published.get(name) != value:
                self.coord.put(self.base + name, value)
                self.writes += 1
                published[name] = value
        for name in sorted(set(published) - set(want)):
            kv = self.coord.get(self.base + name)
            if kv is not None:
                self.coord.delete_if(kv.key, kv.mod_revision)
                self.writes += 1
            del published[name]
