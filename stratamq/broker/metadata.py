"""Topic and consumer-group metadata, kept where Apache RocketMQ keeps it.

Spec: ``docs/formats/broker-metadata.md``. ``<root>/config/topics.json`` holds
``{"dataVersion": {...}, "topicConfigTable": {name: TopicConfig}}`` and
``<root>/config/subscriptionGroup.json`` holds ``{"dataVersion": {...},
"subscriptionGroupTable": {name: GroupConfig}}``, with RocketMQ's field names, so a RocketMQ
broker's files load here and ours load there. A write goes to ``<file>.tmp``, is fsynced and
renamed over the file (the previous version is kept as ``<file>.bak`` like RocketMQ does), so a
kill at any moment leaves either the old or the new table, never a torn one.

Loading checks every entry against the limits the admin API applies (queue counts, message type,
retry times) and refuses a file that breaks one with a MetadataError naming the file, the entry
and the key; it never rewrites the file. Names are the exception: the name rule applies to names
being created, while a name already in stored data that breaks it (Apache RocketMQ creates
``%DLQ%<group>`` for any group its clients name, dots included) is loaded with a WARNING and
marked ``stored_name``, so the broker starts and serves what the store holds; only a name that
could not be a file name (empty, "/", ".", "..", control characters, over 255 bytes) is refused.

Thread-safety: every method may be called from any thread (one lock per table).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stratamq.compaction.policy import (
    CLEANUP_POLICY,
    COMPACTION,
    DELETE,
    DELETE_RETENTION_MS,
    TopicPolicy,
    attribute_problem,
    policy_from_attributes,
)
from stratamq.fileutil import atomic_write
from stratamq.names import NAME_CHARS, TOPIC_MAX_LENGTH, is_valid_name
from stratamq.store.layout import StoreLayout

__all__ = ["GroupConfig", "MetadataError", "MetadataStore", "TopicConfig", "MESSAGE_TYPES",
           "DEFAULT_RETRY_BACKOFF_MS", "dlq_topic", "retry_topic"]

log = logging.getLogger(__name__)

MESSAGE_TYPES = ("NORMAL", "FIFO", "DELAY", "TRANSACTION")
PERM_READ, PERM_WRITE, PERM_INHERIT = 4, 2, 1
PERM_ALL = 15  # RocketMQ's PermName bits: priority 8, read 4, write 2, inherit 1
MAX_QUEUES = 1024  # queues of one topic
MAX_RETRY_TIMES = 1000
# RocketMQ's topic and group name rule: TopicValidator's characters (the same ones the store
# accepts, so every topic the broker accepts can be stored) and its 127-character topic limit.
NAME_MAX_LENGTH = TOPIC_MAX_LENGTH
RETRY_PREFIX, DLQ_PREFIX = "%RETRY%", "%DLQ%"
# RocketMQ's delay levels from level 3 on: the push consumer's default retry backoff.
DEFAULT_RETRY_BACKOFF_MS = [1_000, 5_000, 10_000, 30_000, 60_000, 120_000, 180_000, 240_000,
                            300_000, 360_000, 420_000, 480_000, 540_000, 600_000, 1_200_000,
                            1_800_000, 3_600_000, 7_200_000]  # fmt: skip


# Topics the broker itself writes (RocketMQ's TopicValidator): the timer's
# ``rmq_sys_wheel_timer``, and the names a RocketMQ-written ``topics.json`` carries. They are
# internal: never listed, routed, created or consumed through the client or admin APIs.
SYSTEM_TOPIC_PREFIX = "rmq_sys_"
SYSTEM_TOPICS = frozenset({"SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC",
                           "RMQ_SYS_TRANS_OP_HALF_TOPIC", "TRANS_CHECK_MAX_TIME_TOPIC",
                           "TBW102"})


def is_system_topic(name: str) -> bool:
    return name.lower().startswith(SYSTEM_TOPIC_PREFIX) or name in SYSTEM_TOPICS


def retry_topic(group: str) -> str:
    return f"{RETRY_PREFIX}{group}"


def dlq_topic(group: str) -> str:
    return f"{DLQ_PREFIX}{group}"


class MetadataError(ValueError):
    """A bad topic or group definition; ``kind`` is "invalid", "not_found" or "exists"."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def check_name(what: str, name: str) -> None:
    if not is_valid_name(name, NAME_MAX_LENGTH):
        raise MetadataError("invalid", f"{what} name {name!r} must match "
                            f"[{NAME_CHARS}]{{1,{NAME_MAX_LENGTH}}} (the whole name)")


def check_topic_name(name: str) -> None:
    """A topic name: RocketMQ's rule, or a group's retry / dead-letter topic, which may be a few
    characters longer than 127 because it wraps a group name of up to 127 (all within the
    store's 255-byte limit)."""
    if isinstance(name, str):
        for prefix in (RETRY_PREFIX, DLQ_PREFIX):
            if name.startswith(prefix) and is_valid_name(name[len(prefix):], NAME_MAX_LENGTH):
                return
    check_name("topic", name)


# Longest stored name: a topic is a directory name (NAME_MAX bytes).
STORED_NAME_MAX_BYTES = 255


def stored_name_problem(name: object) -> str | None:
    """Why a name found in stored data cannot be loaded even outside today's rule (it could
    not be a directory name, or would be a path), or None."""
    if not isinstance(name, str) or not name:
        return "a name must be a non-empty string"
    if name in (".", "..") or "/" in name or "\\" in name:
        return f"name {name!r} would be a path, not a name"
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        return f"name {name[:80]!r} holds control characters"
    if len(name.encode("utf-8")) > STORED_NAME_MAX_BYTES:
        return f"name {name[:40]!r}... is longer than {STORED_NAME_MAX_BYTES} bytes"
    return None


_WARNED_NAMES: set[tuple[str, str]] = set()


def _check_stored_name(what: str, name: str, check: Callable[[str], None]) -> bool:
    """Load ``name`` (a ``what`` found in a config file): True when it passes today's rule
    (``check``); False, with a WARNING, when it breaks it but can be held; ValueError when
    it cannot be held at all."""
    try:
        check(name)
        return True
    except MetadataError as exc:
        problem = stored_name_problem(name)
        if problem is not None:
            raise ValueError(f"{exc} ({problem})") from None
        if (what, name) in _WARNED_NAMES:  # once per process: a slave reloads at every sync
            return False
        _WARNED_NAMES.add((what, name))
        log.warning("%s %r breaks today's name rule (letters, digits and %% | _ - only, at "
                    "most %d characters): loaded as stored data holds it, served, but a %s of "
                    "that name could not be created now", what, name, NAME_MAX_LENGTH, what)
        return False


def _check_queues(queues: int) -> None:
    if not 1 <= queues <= MAX_QUEUES:
        raise MetadataError("invalid", f"queues must be 1..{MAX_QUEUES}, not {queues}")


def _checked_message_type(message_type: str) -> str:
    """``message_type`` upper-cased, if it is one of MESSAGE_TYPES."""
    if message_type.upper() not in MESSAGE_TYPES:
        raise MetadataError("invalid", f"message type {message_type!r} is not one of "
                            + "|".join(MESSAGE_TYPES))
    return message_type.upper()


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


# Topic attributes besides message.type (compaction topics, issue 16): RocketMQ's
# ``cleanup.policy`` (DELETE|COMPACTION, not changeable once set) and ``delete.retention.ms``.
TOPIC_ATTRIBUTES = (CLEANUP_POLICY, DELETE_RETENTION_MS)


def checked_attributes(attributes: dict[str, Any], message_type: str) -> dict[str, str]:
    """``attributes`` (names with or without RocketMQ's ``+``) as the table stores them;
    MetadataError("invalid") for a name or value the broker does not take."""
    out: dict[str, str] = {}
    for raw, value in attributes.items():
        name = raw[1:] if isinstance(raw, str) and raw.startswith("+") else raw
        if name == "message.type":
            continue  # the topic's type, set on its own
        if name not in TOPIC_ATTRIBUTES:
            raise MetadataError("invalid", f"unknown topic attribute {raw!r}: supported are "
                                f"{', '.join(TOPIC_ATTRIBUTES)} (and message.type)")
        text = value if isinstance(value, str) else json.dumps(value)
        problem = attribute_problem(name, text)
        if problem is not None:
            raise MetadataError("invalid", problem)
        out[name] = text
    if out.get(CLEANUP_POLICY) == COMPACTION and message_type != "NORMAL":
        raise MetadataError("invalid", f"{CLEANUP_POLICY}={COMPACTION} needs a NORMAL topic, "
                            f"not {message_type}: the broker routes each message to a queue "
                            "by its key")
    if out.get(CLEANUP_POLICY) == DELETE:
        del out[CLEANUP_POLICY]  # the default, not stored
    return out


@dataclass
class TopicConfig:
    name: str
    read_queue_nums: int = 8
    write_queue_nums: int = 8
    perm: int = PERM_READ | PERM_WRITE
    message_type: str = "NORMAL"
    attributes: dict[str, str] = field(default_factory=dict)  # besides message.type
    # Loaded from stored data with a name today's rule refuses (see the module docstring).
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
            valid_name = _check_stored_name("topic", name, check_topic_name)
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
    # Loaded from stored data with a name today's rule refuses (see the module docstring).
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
            valid_name = _check_stored_name("group", name, lambda n: check_name("group", n))
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


class _JsonTable:
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


class MetadataStore:
    """Topics and groups of one broker, persisted under ``<root>/config``."""

    def __init__(self, root: Path, default_retry_max_times: int = 16) -> None:
        self.dir = StoreLayout(root).config_dir
        self.default_retry_max_times = default_retry_max_times
        self._topics = _JsonTable(StoreLayout(root).topics_file, "topicConfigTable",
                                  TopicConfig.from_json, TopicConfig.to_json)
        self._groups = _JsonTable(StoreLayout(root).groups_file, "subscriptionGroupTable",
                                  GroupConfig.from_json, GroupConfig.to_json)

    # -- topics ---------------------------------------------------------------------------------

    @property
    def topics_version(self) -> int:
        """The topic table's ``dataVersion.counter``: one more after each change."""
        return self._topics.counter

    def add_topics_listener(self, listener: Callable[[], None]) -> None:
        """``listener()`` after each change of the topic table, on the changing thread (the
        remoting broker registers with its NameServers at once)."""
        self._topics.listeners.append(listener)

    def topic(self, name: str) -> TopicConfig | None:
        return self._topics.entries.get(name)

    def topics(self, include_system: bool = False) -> list[TopicConfig]:
        """Every topic by name; system topics (``is_system_topic``) only if asked for."""
        with self._topics.lock:
            return [self._topics.entries[n] for n in sorted(self._topics.entries)
                    if include_system or not is_system_topic(n)]

    def create_topic(self, name: str, queues: int, message_type: str = "NORMAL",
                     *, exist_ok: bool = False,
                     attributes: dict[str, Any] | None = None) -> TopicConfig:
        stored = self._topics.entries.get(name)
        if exist_ok and stored is not None and stored.stored_name:
            return stored  # (a loaded name today's rule refuses: it exists, nothing to create)
        check_topic_name(name)
        if is_system_topic(name):
            raise MetadataError("invalid", f"topic name {name!r} is reserved for the broker's "
                                f"system topics ({SYSTEM_TOPIC_PREFIX}*)")
        message_type = _checked_message_type(message_type)
        extra = checked_attributes(attributes or {}, message_type)
        _check_queues(queues)
        with self._topics.lock:
            existing = self._topics.entries.get(name)
            if existing is not None:
                if exist_ok:
                    return existing
                raise MetadataError("exists", f"topic {name!r} already exists")
            cfg = TopicConfig(name, queues, queues, PERM_READ | PERM_WRITE, message_type, extra)
            self._topics.entries[name] = cfg
            self._topics.save()
            return cfg

    def update_topic(self, name: str, queues: int | None = None,
                     message_type: str | None = None, perm: int | None = None, *,
                     read_queues: int | None = None, write_queues: int | None = None,
                     check: Callable[[TopicConfig, TopicConfig], None] | None = None,
                     attributes: dict[str, Any] | None = None) -> TopicConfig:
        """Change a topic; ``queues`` sets both queue counts (``mqadmin updateTopic -r/-w``
        set them apart). ``check(old, new)`` may refuse the change (raise) before it is saved."""
        with self._topics.lock:
            old = self._topics.existing(name, "topic")
            new = TopicConfig(old.name, old.read_queue_nums, old.write_queue_nums, old.perm,
                              old.message_type, dict(old.attributes))
            if queues is not None:
                read_queues = queues if read_queues is None else read_queues
                write_queues = queues if write_queues is None else write_queues
            if read_queues is not None:
                _check_queues(read_queues)
                new.read_queue_nums = read_queues
            if write_queues is not None:
                _check_queues(write_queues)
                new.write_queue_nums = write_queues
            if message_type is not None:
                new.message_type = _checked_message_type(message_type)
            if perm is not None:
                if not 0 <= perm <= PERM_ALL:
                    raise MetadataError("invalid", f"perm must be 0..{PERM_ALL}, not {perm}")
                new.perm = perm
            if attributes:
                changed = checked_attributes({**new.attributes, **attributes},
                                             new.message_type)
                if changed.get(CLEANUP_POLICY) != new.attributes.get(CLEANUP_POLICY):
                    raise MetadataError("invalid", f"{CLEANUP_POLICY} cannot be changed once "
                                        "the topic exists (RocketMQ's rule)")
                new = TopicConfig(new.name, new.read_queue_nums, new.write_queue_nums,
                                  new.perm, new.message_type, changed)
            if old.compaction is not None and (
                    new.write_queue_nums != old.write_queue_nums
                    or new.message_type != old.message_type):
                raise MetadataError(
                    "invalid", f"topic {name!r} is a compaction topic: its messages go to a "
                    "queue by their key, so changing its write queues (or type) would move "
                    "keys to other queues where their old values are never compacted away")
            if check is not None:
                check(old, new)
            self._topics.entries[name] = new
            self._topics.save()
            return new

    def compaction_policy(self, topic: str) -> TopicPolicy | None:
        """The topic's compaction policy (None: not a compaction topic): the
        ``TopicPolicies`` the broker hands its compaction store. A dictionary lookup."""
        cfg = self._topics.entries.get(topic)
        return cfg.compaction if cfg is not None else None

    def policy(self, topic: str) -> TopicPolicy | None:
        return self.compaction_policy(topic)

    def existing_topic(self, name: str) -> TopicConfig:
        """The topic ``name``; MetadataError("not_found") if there is none."""
        topic: TopicConfig = self._topics.existing(name, "topic")
        return topic

    def delete_topic(self, name: str) -> None:
        self._topics.remove(name, "topic")

    # -- groups ---------------------------------------------------------------------------------

    def group(self, name: str) -> GroupConfig | None:
        return self._groups.entries.get(name)

    def groups(self) -> list[GroupConfig]:
        return [self._groups.entries[n] for n in sorted(self._groups.entries)]

    def create_group(self, name: str, *, retry_max_times: int | None = None,
                     orderly: bool = False, retry_backoff_ms: list[int] | None = None,
                     exist_ok: bool = False) -> GroupConfig:
        stored = self._groups.entries.get(name)
        if exist_ok and stored is not None and stored.stored_name:
            return stored  # (as create_topic)
        check_name("group", name)
        with self._groups.lock:
            existing = self._groups.entries.get(name)
            if existing is not None:
                if exist_ok:
                    return existing
                raise MetadataError("exists", f"group {name!r} already exists")
            cfg = GroupConfig(name, True, orderly,
                              self.default_retry_max_times if retry_max_times is None
                              else retry_max_times)
            if retry_backoff_ms:
                cfg.retry_backoff_ms = list(retry_backoff_ms)
            self._check_group(cfg)
            self._groups.entries[name] = cfg
            self._groups.save()
            return cfg

    def update_group(self, name: str, **changes: Any) -> GroupConfig:
        with self._groups.lock:
            cfg = self._groups.existing(name, "group")
            new = GroupConfig(**{**vars(cfg), **{k: v for k, v in changes.items()
                                                 if v is not None}})
            self._check_group(new)
            self._groups.entries[name] = new
            self._groups.save()
            return new

    def delete_group(self, name: str) -> None:
        self._groups.remove(name, "group")

    # -- replication (a slave broker copies its master's topics and groups) ------------------

    def export(self) -> dict[str, Any]:
        """Every topic (system ones too) and group, as their config files hold them."""
        with self._topics.lock, self._groups.lock:
            return {"topics": [t.to_json() for t in self._topics.entries.values()],
                    "groups": [g.to_json() for g in self._groups.entries.values()]}

    def replace_all(self, exported: dict[str, Any]) -> list[str]:
        """Make the topics and groups those of ``exported`` (from ``export``); return the names
        of the topics that went. ValueError names an entry that is not valid."""
        topics = {str(d.get("topicName")): d for d in exported.get("topics", [])
                  if isinstance(d, dict)}
        groups = {str(d.get("groupName")): d for d in exported.get("groups", [])
                  if isinstance(d, dict)}
        new_topics: dict[str, Any] = {n: TopicConfig.from_json(n, d) for n, d in topics.items()}
        new_groups: dict[str, Any] = {n: GroupConfig.from_json(n, d) for n, d in groups.items()}
        with self._topics.lock, self._groups.lock:
            gone = sorted(set(self._topics.entries) - set(new_topics))
            if new_topics != self._topics.entries:
                self._topics.entries = new_topics
                self._topics.save()
            if new_groups != self._groups.entries:
                self._groups.entries = new_groups
                self._groups.save()
        return gone

    @staticmethod
    def _check_group(cfg: GroupConfig) -> None:
        if not 0 <= cfg.retry_max_times <= MAX_RETRY_TIMES:
            raise MetadataError("invalid", f"retryMaxTimes must be 0..{MAX_RETRY_TIMES}, "
                                f"not {cfg.retry_max_times}")
        if not cfg.retry_backoff_ms or any(ms <= 0 for ms in cfg.retry_backoff_ms):
            raise MetadataError("invalid", "retry backoff must be a list of positive ms")
