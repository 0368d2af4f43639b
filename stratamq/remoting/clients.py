"""The remoting consumers a broker knows from their heartbeats (RocketMQ's
``ConsumerManager``): per group, each client id's connection and subscriptions.

A client leaves on ``UNREGISTER_CLIENT``, when its connection closes, or (``expire``) after
``expiry_s`` without a heartbeat (consumers: the broker's ``channelExpiredTimeout``, 120 s by
default; producers: RocketMQ's fixed 120 s). Register, unregister and
drop say whether the group's client set changed: the broker then tells the group's
consumers (``NOTIFY_CONSUMER_IDS_CHANGED``) so they rebalance at once.

Thread-safety: a lock; heartbeats arrive on executor threads.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ConsumerTable"]

CHANNEL_EXPIRED_S = 120.0  # RocketMQ's default channelExpiredTimeout, and ProducerManager's


@dataclass
class _Client:
    connection: Any
    subscriptions: dict[str, str]
    last_seen: float = field(default_factory=time.monotonic)
    info: dict[str, Any] = field(default_factory=dict)  # address, language, consumer data


class ConsumerTable:
    def __init__(self, expiry_s: float = CHANNEL_EXPIRED_S) -> None:
        self.expiry_s = expiry_s
        self._groups: dict[str, dict[str, _Client]] = {}
        self._lock = threading.Lock()

    def register(self, group: str, client_id: str, connection: Any,
                 subscriptions: dict[str, str], info: dict[str, Any] | None = None) -> bool:
        with self._lock:
            clients = self._groups.setdefault(group, {})
            known = client_id in clients
            clients[client_id] = _Client(connection, subscriptions, info=info or {})
            return not known

    def describe(self, group: str) -> list[tuple[str, dict[str, Any]]]:
        """Each client id of the group with what its heartbeat said (admin listings)."""
        with self._lock:
            return sorted((cid, dict(c.info)) for cid, c in self._groups.get(group, {}).items())

    def find(self, group: str, client_id: str) -> tuple[Any, dict[str, Any]] | None:
        """A client's connection and what its heartbeat said (RocketMQ's ``findChannel``)."""
        with self._lock:
            client = self._groups.get(group, {}).get(client_id)
            return None if client is None else (client.connection, dict(client.info))

    def groups_subscribed_to(self, topic: str) -> set[str]:
        """The groups with a client subscribed to ``topic`` (``queryTopicConsumeByWho``)."""
        with self._lock:
            return {g for g, clients in self._groups.items()
                    if any(topic in c.subscriptions for c in clients.values())}

    def unregister(self, group: str, client_id: str) -> bool:
        with self._lock:
            clients = self._groups.get(group, {})
            return clients.pop(client_id, None) is not None

    def drop_connection(self, connection: Any) -> list[str]:
        """Forget the clients of a closed connection; the groups that changed."""
        changed = []
        with self._lock:
            for group, clients in self._groups.items():
                for client_id in [c for c, v in clients.items() if v.connection is connection]:
                    del clients[client_id]
                    changed.append(group)
        return sorted(set(changed))

    def expire(self, now: float | None = None) -> list[str]:
        now = time.monotonic() if now is None else now
        changed = []
        with self._lock:
            for group, clients in self._groups.items():
                for client_id in [c for c, v in clients.items()
                                  if now - v.last_seen > self.expiry_s]:
                    del clients[client_id]
                    changed.append(group)
        return sorted(set(changed))

    def client_ids(self, group: str) -> list[str]:
        with self._lock:
            return sorted(self._groups.get(group, {}))

    def connections(self, group: str) -> list[Any]:
        with self._lock:
            return [c.connection for c in self._groups.get(group, {}).values()]

    def subscription(self, group: str, topic: str) -> str | None:
        """The tag expression a group's consumers subscribed ``topic`` with (the newest)."""
        with self._lock:
            clients = sorted(self._groups.get(group, {}).values(), key=lambda c: c.last_seen)
        for client in reversed(clients):
            if topic in client.subscriptions:
                return client.subscriptions[topic]
        return None
