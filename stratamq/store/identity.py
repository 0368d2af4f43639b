"""A store's identity and the lineage of its CommitLog (spec: ``docs/formats/store-identity.md``).

Every store directory has an id, made when the store is made, and a lineage: the id of the
store whose log its CommitLog continues. A store that began its own log is its own lineage; a
slave that started empty and copied a master's log takes the master's lineage, so a master and
its slaves share one. A master whose directory was wiped (or replaced by another store) comes
back with a new id and a new lineage: its bytes at an offset are not those a slave holds there,
and no comparison of epochs can tell (both logs begin an epoch at offset 0). Replication
(``stratamq.ha``) compares lineages before a slave follows a master.

A directory that has data but no identity file (written by RocketMQ, or before StrataMQ kept
one) gets an id on its first read-write open and an unknown lineage (``None``): replication
confirms it (a master's is its own id; a slave takes its master's once the master's log has
shown to hold what the slave holds).

The file is JSON, replaced atomically with the previous version kept as ``.bak`` (read when
the file is damaged). A damaged file with no good backup stops the store from opening: a new
identity would let a slave follow a master of another lineage and cut its log.
Thread-safety: ``StoreIdentity`` methods take its lock; any thread.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stratamq.fileutil import atomic_write

__all__ = ["Identity", "StoreIdentity", "StoreIdentityError", "parse", "render"]

log = logging.getLogger(__name__)


class StoreIdentityError(ValueError):
    """The identity file is not a whole identity; the message says what is wrong."""


@dataclass(frozen=True)
class Identity:
    store_id: str  # this directory's, made with it
    created_ms: int
    lineage: str | None  # the id of the store whose log this CommitLog continues; None: unknown
    lineage_ms: int | None  # when the lineage was set

    def as_dict(self) -> dict[str, Any]:
        return {"storeId": self.store_id, "createdTimestamp": self.created_ms,
                "lineage": self.lineage, "lineageTimestamp": self.lineage_ms}


def _uuid(value: object, field: str) -> str:
    try:
        return str(uuid.UUID(str(value)))
    except ValueError:
        raise StoreIdentityError(f"{field} {value!r} is not a UUID") from None


def _millis(value: object, field: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise StoreIdentityError(f"{field} {value!r} is not a timestamp in milliseconds")
    return value


def parse(data: bytes) -> Identity:
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StoreIdentityError(f"not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise StoreIdentityError("not a JSON object")
    for key in ("storeId", "createdTimestamp", "lineage", "lineageTimestamp"):
        if key not in doc:
            raise StoreIdentityError(f"no {key}")
    lineage = doc["lineage"]
    return Identity(
        _uuid(doc["storeId"], "storeId"), _millis(doc["createdTimestamp"], "createdTimestamp"),
        None if lineage is None else _uuid(lineage, "lineage"),
        None if doc["lineageTimestamp"] is None
        else _millis(doc["lineageTimestamp"], "lineageTimestamp"))


def render(identity: Identity) -> bytes:
    return (json.dumps(identity.as_dict(), indent=2) + "\n").encode()


class StoreIdentity:
    """The identity of one store directory; see the module docstring."""

    def __init__(self, path: Path, identity: Identity, *, read_only: bool = False) -> None:
        self.path = path
        self.read_only = read_only
        self._lock = threading.Lock()
        self._current = identity

    @classmethod
    def open(cls, path: Path, *, has_data: bool, read_only: bool = False) -> StoreIdentity | None:
        """The identity in ``path``; a store without one gets one (its own lineage when it has
        no data yet, an unknown one when it has). Read-only: None when there is none."""
        backup = path.with_name(path.name + ".bak")
        damage = []
        for candidate in (path, backup):
            if not candidate.exists():
                continue
            try:
                found = parse(candidate.read_bytes())
            except (OSError, StoreIdentityError) as exc:
                damage.append(f"{candidate}: {exc}")
                continue
            if damage:
                log.error("store identity damaged (%s): read from its backup %s",
                          "; ".join(damage), candidate)
            if candidate is backup and not read_only:
                # Whole again (damaged, or lost between the renames of a replacement), so
                # the next change keeps a good .bak.
                atomic_write(path, render(found))
            return cls(path, found, read_only=read_only)
        if damage and read_only:  # a look at the data needs no identity
            log.error("store identity unreadable: %s", "; ".join(damage))
            return None
        if damage:
            raise StoreIdentityError(
                f"the store identity is damaged ({'; '.join(damage)}); restore the file, or "
                f"delete {path} and its .bak to give the store a new identity (a slave's "
                "lineage is then confirmed again by its master)")
        if read_only:
            return None
        now = int(time.time() * 1000)
        store_id = str(uuid.uuid4())
        made = Identity(store_id, now, None if has_data else store_id,
                        None if has_data else now)
        atomic_write(path, render(made), backup=True)
        if has_data:
            log.warning("store %s had no identity: it is now %s, its lineage unknown until "
                        "replication confirms it", path.parent, store_id)
        else:
            log.info("new store %s: identity %s", path.parent, store_id)
        return cls(path, made)

    @property
    def current(self) -> Identity:
        return self._current

    @property
    def store_id(self) -> str:
        return self._current.store_id

    @property
    def lineage(self) -> str | None:
        return self._current.lineage

    def set_lineage(self, lineage: str | None) -> None:
        """Record the lineage of this store's CommitLog (None: unknown, for a log that was
        cleared to be copied again)."""
        if self.read_only:
            raise PermissionError(f"store identity {self.path} is open read-only")
        with self._lock:
            old = self._current
            if lineage == old.lineage:
                return
            new = Identity(old.store_id, old.created_ms,
                           None if lineage is None else _uuid(lineage, "lineage"),
                           int(time.time() * 1000))
            atomic_write(self.path, render(new), backup=True)
            self._current = new

    def as_dict(self) -> dict[str, Any]:
        return self._current.as_dict()
