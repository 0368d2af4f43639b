"""The broker's two metadata files, in Apache RocketMQ's format: their entries and how a table
is read and written.

Spec: ``docs/formats/broker-metadata.md``. ``<root>/config/topics.json`` holds
``{"dataVersion": {...}, "topicConfigTable": {name: TopicConfig}}`` and
``<root>/config/subscriptionGroup.json`` holds ``{"dataVersion": {...},
"subscriptionGroupTable": {name: GroupConfig}}``, with RocketMQ's field names, so a RocketMQ
broker's files load here and ours load there. A write goes to ``<file>.tmp``, is fsynced and
renamed over the file (the previous version is kept as ``<file>.bak`` like RocketMQ does), so a
kill at any moment leaves either the old or the new table, never a torn one.

Loading checks every entry against the limits the admin API applies (``metadata_rules.py``:
queue counts, message type, retry times; stored names as that module says) and refuses a file
that breaks one with a MetadataError naming the file, the entry and the key; it never rewrites
the file.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stratamq.broker.metadata_rules import (
    DEFAULT_RETRY_BACKOFF_MS,
    MAX_QUEUES,
    MAX_RETRY_TIMES,
    MESSAGE_TYPES,
    PERM_ALL,
    PERM_READ,
    PERM_WRITE,
    MetadataError,
    check_name,
    check_stored_name,
    check_topic_name,
    checked_attributes,
)
from stratamq.compaction.policy import TopicPolicy, policy_from_attributes
from stratamq.fileutil import atomic_write

__all__ = ["GroupConfig", "JsonTable", "TopicConfig"]

_MISSING = object()


def _json_kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            type(None): "null", int: "a number", float: "a number"}.get(type(value),
                                                                         type(value).__name__)


def _get(d: dict[str, Any], key: str, kind: type, default: Any = _MISSING) -> Any:
    """``d[key]`` if it is a JSON ``kind``; ``default`` if absent or null. Errors name the key."""
    value = d.get(key)
    if value is None:
        if default is _MISSING:
            raise ValueError(f"key {key!r} is missing")
        return default
    ok = (isinstance(value, int) and not isinstance(value, bool)) if kind is int else (
        isinstance(value, kind))
    if not ok:
        want = {int: "an integer", bool: "true or false", str: "a string", dict: "an object",
                list: "a list"}[kind]
        raise ValueError(f"key {key!r} must be {want}, not {_json_kind(value)} ({value!r:.60})")
    return value


def _get_int(d: dict[str, Any], key: str, default: int, low: int, high: int) -> int:
    value = _get(d, key, int, default)
    if not low <= value <= high:
        raise ValueError(f"key {key!r} must be {low}..{high}, not {value}")
    return value


def _named(name: str, d: Any, name_key: str) -> dict[str, Any]:
    """The entry ``d`` stored under table key ``name``: an object whose ``name_key`` is ``name``."""
    if not isinstance(d, dict):
        raise ValueError(f"must be an object, not {_json_kind(d)}")
    own = _get(d, name_key, str)
    if own != name:
        raise ValueError(f"key {name_key!r} is {own!r} but the entry is stored under {name!r}; "
                         "they must be the same")
    return d



@dataclass
class TopicConfig:
    name: str
    read_queue_nums: int = 8
    write_queue_nums: int = 8
    perm: int = PERM_READ | PERM_WRITE
    message_type: str = "NORMAL"
    attributes: dict[str, str] = field(default_factory=dict)  # besides message.type
    # Loaded from stored data with a name today's rule refuses (see metadata_rules.py).
    stored_name: bool = field(default=False, compare=False)

    def __post_init__(self) -> None:
        # Looked up for every dispatched record and every send: computed once.
        self.compaction: TopicPolicy | None = policy_from_attributes(self.attributes)

    @property
    def queue_count(self) -> int:
        return max(self.read_queue_nums, self.write_queue_nums)

    def to_json(self) -> dict[str, Any]:
        return {"topicName": self.name, "readQueueNums": self.read_queue_nums,
                "writeQueueNums": self.write_queue_nums, "perm": self.perm,
                "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0,
                "order": self.message_type == "FIFO",
                "attributes": {"message.type": self.message_type,
                               **self.attributes}}  # fmt: skip

    @classmethod
    def from_json(cls, name: str, d: Any) -> TopicConfig:
        """The entry stored under ``name``, checked like the admin API checks a new topic;
        ValueError names the key that is wrong."""
        d = _named(name, d, "topicName")
        try:
            valid_name = check_stored_name("topic", name, check_topic_name)
        except ValueError as exc:
            raise ValueError(f"key 'topicName': {exc}") from None
        attrs = _get(d, "attributes", dict, {})
        mtype = attrs.get("message.type") or attrs.get("+message.type")
        if not mtype:
            mtype = "FIFO" if _get(d, "order", bool, False) else "NORMAL"
        if not isinstance(mtype, str) or mtype.upper() not in MESSAGE_TYPES:
            raise ValueError(f"key 'attributes.message.type' must be one of "
                             f"{'|'.join(MESSAGE_TYPES)}, not {mtype!r}")
        try:
            extra = checked_attributes(attrs, mtype.upper())
        except MetadataError as exc:
            raise ValueError(f"key 'attributes': {exc}") from None
        return cls(name, _get_int(d, "readQueueNums", 8, 1, MAX_QUEUES),
                   _get_int(d, "writeQueueNums", 8, 1, MAX_QUEUES),
                   _get_int(d, "perm", PERM_READ | PERM_WRITE, 0, PERM_ALL), mtype.upper(),
                   extra, stored_name=not valid_name)


@dataclass
class GroupConfig:
    name: str
    consume_enable: bool = True
    consume_message_orderly: bool = False
    retry_max_times: int = 16
    retry_backoff_ms: list[int] = field(default_factory=lambda: list(DEFAULT_RETRY_BACKOFF_MS))
    # Loaded from stored data with a name today's rule refuses (see metadata_rules.py).
    stored_name: bool = field(default=False, compare=False)

    @property
    def max_delivery_attempts(self) -> int:
        return self.retry_max_times + 1

    def to_json(self) -> dict[str, Any]:
        return {"groupName": self.name, "consumeEnable": self.consume_enable,
                "consumeFromMinEnable": True, "consumeBroadcastEnable": True,
                "consumeMessageOrderly": self.consume_message_orderly,
                "retryQueueNums": 1, "retryMaxTimes": self.retry_max_times, "brokerId": 0,
                "whichBrokerWhenConsumeSlowly": 1, "notifyConsumerIdsChangedEnable": True,
                "groupRetryPolicy": {"type": "CUSTOMIZED",
                                     "customizedRetryPolicy": {"next": self.retry_backoff_ms}},
                "attributes": {}}  # fmt: skip

    @classmethod
    def from_json(cls, name: str, d: Any) -> GroupConfig:
        """The entry stored under ``name``, checked like the admin API checks a new group;
        ValueError names the key that is wrong."""
        d = _named(name, d, "groupName")
        try:
            valid_name = check_stored_name("group", name, lambda n: check_name("group", n))
        except ValueError as exc:
            raise ValueError(f"key 'groupName': {exc}") from None
        policy = _get(_get(d, "groupRetryPolicy", dict, {}), "customizedRetryPolicy", dict, {})
        backoff = _get(policy, "next", list, [])
        if any(isinstance(ms, bool) or not isinstance(ms, int) or ms <= 0 for ms in backoff):
            raise ValueError("key 'groupRetryPolicy.customizedRetryPolicy.next' must be a list "
                             f"of positive milliseconds, not {backoff!r:.80}")
        return cls(name, _get(d, "consumeEnable", bool, True),
                   _get(d, "consumeMessageOrderly", bool, False),
                   _get_int(d, "retryMaxTimes", 16, 0, MAX_RETRY_TIMES),
                   list(backoff) or list(DEFAULT_RETRY_BACKOFF_MS), stored_name=not valid_name)


class JsonTable:
    """One RocketMQ-style JSON config file: a table of named entries plus a data version."""

    def __init__(self, path: Path, table_key: str, load_entry, dump_entry) -> None:
        self.path = path
        self.table_key = table_key
        self._dump_entry = dump_entry
        self.lock = threading.RLock()
        self.entries: dict[str, Any] = {}
        self.counter = 0
        self.listeners: list[Callable[[], None]] = []  # called after each save
        if path.exists():
            self._load(load_entry)

    def _load(self, load_entry) -> None:
        """Read the file, or raise one MetadataError naming it, the entry and the key. A bad
        file is left exactly as it is: never replaced by an empty or repaired table."""
        path = self.path
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise self._error(f"cannot read it: {exc}") from None
        if not isinstance(doc, dict):
            raise self._error(f"it must hold a JSON object, not {_json_kind(doc)}")
        try:
            version = _get(doc, "dataVersion", dict, {})
            table = _get(doc, self.table_key, dict, {})
        except ValueError as exc:
            raise self._error(str(exc)) from None
        try:
            self.counter = _get_int(version, "counter", 0, 0, 2**63 - 1)
        except ValueError as exc:
            raise self._error(f"dataVersion: {exc}") from None
        for name, entry in table.items():
            try:
                self.entries[name] = load_entry(name, entry)
            except ValueError as exc:
                raise self._error(f"{self.table_key} entry {name!r}: {exc}") from None

    def _error(self, problem: str) -> MetadataError:
        bak = self.path.with_name(self.path.name + ".bak")
        hint = (f"; the previous version is in {bak}" if bak.is_file() else "")
        return MetadataError("invalid", f"{self.path}: {problem}. Correct the file and start "
                             f"the broker again (it left the file unchanged){hint}")

    def existing(self, name: str, what: str) -> Any:
        """The entry ``name``; MetadataError("not_found") naming ``what`` if there is none."""
        entry = self.entries.get(name)
        if entry is None:
            raise MetadataError("not_found", f"{what} {name!r} does not exist")
        return entry

    def remove(self, name: str, what: str) -> None:
        with self.lock:
            self.existing(name, what)
            del self.entries[name]
            self.save()

    def save(self) -> None:
        with self.lock:
            self.counter += 1
            doc = {"dataVersion": {"counter": self.counter, "stateVersion": 0,
                                   "timestamp": int(time.time() * 1000)},
                   self.table_key: {n: self._dump_entry(e) for n, e in
                                    sorted(self.entries.items())}}  # fmt: skip
            data = json.dumps(doc, indent=2, sort_keys=True).encode("utf-8")
            atomic_write(self.path, data, backup=True)
        for listener in self.listeners:
            listener()

