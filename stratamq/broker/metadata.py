"""Topic and consumer-group metadata, kept where Apache RocketMQ keeps it: ``MetadataStore``.

The files' format and how a table is loaded and saved: ``metadata_file.py`` (spec:
``docs/formats/broker-metadata.md``); the limits and name rules every topic and group meets:
``metadata_rules.py`` (the names callers import from here stay importable from here).

Thread-safety: every method may be called from any thread (one lock per table).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from stratamq.broker.metadata_file import GroupConfig, JsonTable, TopicConfig
from stratamq.broker.metadata_rules import (
    DEFAULT_RETRY_BACKOFF_MS,
    MAX_RETRY_TIMES,
    MESSAGE_TYPES,
    PERM_ALL,
    PERM_READ,
    PERM_WRITE,
    SYSTEM_TOPIC_PREFIX,
    MetadataError,
    check_name,
    check_queues,
    check_topic_name,
    checked_attributes,
    checked_message_type,
    dlq_topic,
    is_system_topic,
    retry_topic,
)
from stratamq.compaction.policy import CLEANUP_POLICY, TopicPolicy
from stratamq.store.layout import StoreLayout

__all__ = ["GroupConfig", "MetadataError", "MetadataStore", "TopicConfig", "MESSAGE_TYPES",
           "DEFAULT_RETRY_BACKOFF_MS", "dlq_topic", "retry_topic",
           # imported from here by other modules and tests (they lived here before the split)
           "PERM_READ", "PERM_WRITE", "check_name", "check_topic_name", "is_system_topic"]


class MetadataStore:
    """Topics and groups of one broker, persisted under ``<root>/config``."""

    def __init__(self, root: Path, default_retry_max_times: int = 16) -> None:
        self.dir = StoreLayout(root).config_dir
        self.default_retry_max_times = default_retry_max_times
        self._topics = JsonTable(StoreLayout(root).topics_file, "topicConfigTable",
                                 TopicConfig.from_json, TopicConfig.to_json)
        self._groups = JsonTable(StoreLayout(root).groups_file, "subscriptionGroupTable",
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
        message_type = checked_message_type(message_type)
        extra = checked_attributes(attributes or {}, message_type)
        check_queues(queues)
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
                check_queues(read_queues)
                new.read_queue_nums = read_queues
            if write_queues is not None:
                check_queues(write_queues)
                new.write_queue_nums = write_queues
            if message_type is not None:
                new.message_type = checked_message_type(message_type)
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
