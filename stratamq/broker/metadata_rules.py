"""The limits and name rules every topic and group meets: those the admin API applies to a
new one, and those the loader (``metadata_file.py``) applies to one found in a config file.

Names are checked against RocketMQ's name rule only when created: a name already in stored data
that breaks it (Apache RocketMQ creates ``%DLQ%<group>`` for any group its clients name, dots
included) is loaded with a WARNING (``check_stored_name``), so the broker starts and serves what
the store holds; only a name that could not be a file name (empty, "/", ".", "..", control
characters, over 255 bytes) is refused.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from stratamq.compaction.policy import (
    CLEANUP_POLICY,
    COMPACTION,
    DELETE,
    DELETE_RETENTION_MS,
    attribute_problem,
)
from stratamq.names import NAME_CHARS, TOPIC_MAX_LENGTH, is_valid_name

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


def check_stored_name(what: str, name: str, check: Callable[[str], None]) -> bool:
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


def check_queues(queues: int) -> None:
    if not 1 <= queues <= MAX_QUEUES:
        raise MetadataError("invalid", f"queues must be 1..{MAX_QUEUES}, not {queues}")


def checked_message_type(message_type: str) -> str:
    """``message_type`` upper-cased, if it is one of MESSAGE_TYPES."""
    if message_type.upper() not in MESSAGE_TYPES:
        raise MetadataError("invalid", f"message type {message_type!r} is not one of "
                            + "|".join(MESSAGE_TYPES))
    return message_type.upper()



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

