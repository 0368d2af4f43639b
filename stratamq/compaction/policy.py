"""Which topics are compaction topics, and how long their tombstones stay.

Two topic attributes decide it, kept with the topic in ``config/topics.json``
(``topicConfigTable.<topic>.attributes``):

- ``cleanup.policy``: RocketMQ's attribute (``TopicAttributes.CLEANUP_POLICY_ATTRIBUTE``),
  ``DELETE`` (the default: time-based retention) or ``COMPACTION`` (the latest value per key).
  Like RocketMQ it cannot be changed once the topic exists.
- ``delete.retention.ms``: how long a tombstone (a key with an empty body, or the user property
  ``TOMBSTONE=true``) stays readable after the compaction round that first saw it, so a reader
  that started before can still see the delete. Kafka's name; default 24 h.

The store side is handed a :class:`TopicPolicies` (anything with ``policy(topic)``), never the
broker: the broker feeds it from its metadata, and an offline command reads the store's
``config/topics.json`` read-only with :func:`policies_from_topics_json`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple, Protocol

__all__ = ["CLEANUP_POLICY", "COMPACTION", "DELETE", "DELETE_RETENTION_MS",
           "DEFAULT_DELETE_RETENTION_MS", "PolicyError", "StaticPolicies", "TopicPolicies",
           "TopicPolicy", "attribute_problem", "policies_from_topics_json",
           "policy_from_attributes"]

CLEANUP_POLICY = "cleanup.policy"
DELETE, COMPACTION = "DELETE", "COMPACTION"
CLEANUP_POLICIES = (DELETE, COMPACTION)
DELETE_RETENTION_MS = "delete.retention.ms"
DEFAULT_DELETE_RETENTION_MS = 24 * 3600 * 1000
MAX_DELETE_RETENTION_MS = 2**62
TOMBSTONE_PROPERTY = "TOMBSTONE"  # a user property: "true" makes the message a tombstone


class PolicyError(ValueError):
    """A topic attribute of the wrong value, or a ``topics.json`` that cannot be read."""


class TopicPolicy(NamedTuple):
    """What compaction needs to know of one compaction topic."""

    delete_retention_ms: int = DEFAULT_DELETE_RETENTION_MS


class TopicPolicies(Protocol):
    """``policy(topic)``: the topic's :class:`TopicPolicy` if it is a compaction topic, else
    None. Called for every dispatched record, from the dispatch thread: it must be cheap (a
    dictionary lookup) and thread-safe."""

    def policy(self, topic: str) -> TopicPolicy | None: ...


def _attr(attributes: Mapping[str, Any], name: str) -> Any:
    # RocketMQ's admin tools write "+name=value" to add an attribute; tables hold the bare name,
    # and a few writers keep the "+".
    value = attributes.get(name)
    return attributes.get("+" + name) if value is None else value


def attribute_problem(name: str, value: Any) -> str | None:
    """Why ``name=value`` is not a valid compaction attribute (None: valid, or not ours)."""
    if name == CLEANUP_POLICY:
        if value not in CLEANUP_POLICIES:
            return f"{CLEANUP_POLICY} must be {'|'.join(CLEANUP_POLICIES)}, not {value!r}"
    elif name == DELETE_RETENTION_MS:
        try:
            ms = int(value)
        except (TypeError, ValueError):
            ms = -1
        if isinstance(value, bool) or not 0 <= ms <= MAX_DELETE_RETENTION_MS:
            return (f"{DELETE_RETENTION_MS} must be a whole number of milliseconds "
                    f"0..{MAX_DELETE_RETENTION_MS}, not {value!r}")
    return None


def policy_from_attributes(attributes: Mapping[str, Any]) -> TopicPolicy | None:
    """The policy a topic's attributes give: None unless ``cleanup.policy`` is COMPACTION.
    Raises PolicyError for a value either attribute cannot take."""
    for name in (CLEANUP_POLICY, DELETE_RETENTION_MS):
        value = _attr(attributes, name)
        if value is not None:
            problem = attribute_problem(name, value)
            if problem is not None:
                raise PolicyError(problem)
    if _attr(attributes, CLEANUP_POLICY) != COMPACTION:
        return None
    retention = _attr(attributes, DELETE_RETENTION_MS)
    return TopicPolicy(DEFAULT_DELETE_RETENTION_MS if retention is None else int(retention))


class StaticPolicies:
    """A fixed table of compaction topics (tests, offline commands). Thread-safe: read-only
    after construction."""

    def __init__(self, topics: Mapping[str, TopicPolicy]) -> None:
        self._topics = dict(topics)

    def policy(self, topic: str) -> TopicPolicy | None:
        return self._topics.get(topic)

    def topics(self) -> list[str]:
        return sorted(self._topics)


def policies_from_topics_json(path: Path) -> StaticPolicies:
    """The compaction topics of a store's ``config/topics.json`` (RocketMQ's layout), read
    once, read-only. A missing file means no compaction topics; one that does not parse, or
    holds a bad attribute, raises PolicyError naming the file and the topic."""
    try:
        raw = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return StaticPolicies({})
    except OSError as exc:
        raise PolicyError(f"cannot read {path}: {exc.strerror}") from None
    try:
        table = json.loads(raw).get("topicConfigTable", {})
    except (ValueError, AttributeError) as exc:
        raise PolicyError(f"{path} is not a topics table (JSON object with "
                          f"topicConfigTable): {exc}") from None
    if not isinstance(table, dict):
        raise PolicyError(f"{path}: topicConfigTable must be an object")
    found: dict[str, TopicPolicy] = {}
    for name, entry in table.items():
        attributes = entry.get("attributes") if isinstance(entry, dict) else None
        if not isinstance(attributes, dict):
            continue
        try:
            policy = policy_from_attributes(attributes)
        except PolicyError as exc:
            raise PolicyError(f"{path}: topic {name!r}: {exc}") from None
        if policy is not None:
            found[name] = policy
    return StaticPolicies(found)
