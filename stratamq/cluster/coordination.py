"""The coordination store a cluster's brokers agree through: the small interface the roles use.

The broker's cluster roles (``membership.py``, ``election.py``) depend only on
``Coordination``; ``etcd.py`` implements it on etcd v3, the only implementation the project
ships (a real, trusted consensus engine instead of a home-made Raft). What it offers is what
Patroni's model of leader election needs and no more:

* a **lease** (``grant``/``keep_alive``/``revoke``): keys written under it vanish when it
  lapses, which is how a dead broker leaves the cluster;
* **registration** (``put`` under a lease) and reading a prefix (``get_prefix``: the members);
* **compare-and-swap** (``create``: write a key only if it does not exist; ``swap``: write
  only if it is unchanged since ``revision``; ``delete_if``): a master key is taken by one
  transaction, so two brokers can never both hold it;
* a **counter** (``increment``) for epochs, strictly increasing per group;
* **watch** of a prefix, so a slave learns at once that the master key went.

Values are bytes; keys are strings. A failure to reach the store raises
``CoordinationUnavailable``; a lease the store no longer knows raises ``LeaseLost``.
Thread-safety: implementations are safe to call from any thread.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

__all__ = ["Coordination", "CoordinationError", "CoordinationUnavailable", "KeyValue",
           "LeaseLost", "WatchEvent"]


class CoordinationError(Exception):
    """The coordination store answered with an error."""


class CoordinationUnavailable(CoordinationError):
    """No member of the coordination store could be reached (or none answered in time)."""


class LeaseLost(CoordinationError):
    """The lease expired or was revoked: every key written under it is gone."""


@dataclass(frozen=True)
class KeyValue:
    key: str
    value: bytes
    mod_revision: int  # the store's revision of the key's last change (compare-and-swap)
    lease: int  # 0: none


@dataclass(frozen=True)
class WatchEvent:
    key: str
    value: bytes | None  # None: deleted (or its lease lapsed)


class Coordination(Protocol):
    def grant(self, ttl_ms: int) -> int:
        """A new lease of ``ttl_ms`` (rounded up to whole seconds, etcd's unit); its id."""
        ...

    def keep_alive(self, lease: int) -> int:
        """Renew ``lease``; its TTL in ms from now. ``LeaseLost`` when it has lapsed."""
        ...

    def revoke(self, lease: int) -> None:
        ...

    def lease_age_ms(self, lease: int) -> int | None:
        """How long ago ``lease`` was granted or last renewed (None: it has lapsed)."""
        ...

    def put(self, key: str, value: bytes, lease: int = 0) -> None:
        ...

    def get(self, key: str) -> KeyValue | None:
        ...

    def get_prefix(self, prefix: str) -> list[KeyValue]:
        """Every key under ``prefix``, sorted by key."""
        ...

    def get_prefixes(self, *prefixes: str) -> list[list[KeyValue]]:
        """``get_prefix`` of each of ``prefixes``, read at one revision in one request."""
        ...

    def create(self, key: str, value: bytes, lease: int = 0,
               also: tuple[tuple[str, bytes], ...] = (),
               unchanged: tuple[tuple[str, int], ...] = ()) -> bool:
        """Write ``key`` (and the ``also`` pairs, without a lease) in one transaction if
        ``key`` does not exist and each ``unchanged`` key's ``mod_revision`` is as given (0:
        absent); whether they were."""
        ...

    def swap(self, key: str, revision: int, value: bytes, lease: int = 0,
             also: tuple[tuple[str, bytes], ...] = ()) -> bool:
        """Write ``key`` (and ``also``) in one transaction if its ``mod_revision`` is still
        ``revision``; whether it was."""
        ...

    def put_if(self, key: str, value: bytes,
               unchanged: tuple[tuple[str, int], ...]) -> bool:
        """Write ``key`` if each ``unchanged`` key's ``mod_revision`` is as given."""
        ...

    def delete_if(self, key: str, revision: int) -> bool:
        """Delete ``key`` if its ``mod_revision`` is still ``revision``."""
        ...

    def increment(self, key: str) -> int:
        """Add one to the decimal counter at ``key`` (0 when absent); the new value. Each call
        returns a value greater than every earlier call's, across all clients."""
        ...

    def watch_prefix(self, prefix: str, on_event: Callable[[WatchEvent], None]
                     ) -> Callable[[], None]:
        """Call ``on_event`` (on a thread of the implementation) for each change under
        ``prefix`` from now on, and with ``WatchEvent(prefix, None)`` each time the watch is
        (re)established (changes made while it was down are not reported: read again);
        returns the function that stops watching."""
        ...

    def close(self) -> None:
        ...
