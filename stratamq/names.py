"""RocketMQ's rule for topic and group names, written once for the store, the broker and Spark.

A name is RocketMQ's ``TopicValidator`` character set (letters, digits, ``%|_-``). The store
adds a byte limit (a topic is the directory name ``consumequeue/<topic>/``); the broker adds
RocketMQ's length limits (127 for topics, 255 for groups, as ``Validators.checkTopic`` /
``checkGroup``). Every check is a *full* match: a ``^...$`` pattern with ``re.match`` accepts a
trailing newline, which once let ``NL`` and ``NL\\n`` coexist as two topics.
"""

from __future__ import annotations

import re

__all__ = ["NAME_CHARS", "TOPIC_MAX_LENGTH", "GROUP_MAX_LENGTH", "MAX_TOPIC_NAME_BYTES",
           "is_valid_name", "invalid_characters", "topic_name_problem"]

NAME_CHARS = "%|a-zA-Z0-9_-"
TOPIC_MAX_LENGTH = 127  # RocketMQ's Validators.TOPIC_MAX_LENGTH
GROUP_MAX_LENGTH = 255  # RocketMQ's Validators.CHARACTER_MAX_LENGTH
_NAME = re.compile(f"[{NAME_CHARS}]+")
_NAME_CHAR = re.compile(f"[{NAME_CHARS}]")


def is_valid_name(name: object, max_length: int | None = None) -> bool:
    """True if ``name`` is a non-empty string of name characters, at most ``max_length`` long."""
    if not isinstance(name, str) or _NAME.fullmatch(name) is None:
        return False
    return max_length is None or len(name) <= max_length


def invalid_characters(name: str, limit: int = 8) -> str:
    """The characters of ``name`` that no name may hold, quoted, for an error message."""
    bad = sorted({c for c in name if _NAME_CHAR.fullmatch(c) is None})
    return ", ".join(map(repr, bad[:limit]))


# Characters of a topic name: RocketMQ's TopicValidator rule (its brokers and clients refuse any
# other), which also keeps a name a single, harmless path component: a topic is the directory
# name ``consumequeue/<topic>/`` (no "/", ".", "..", blanks).
# Longest topic the store writes: a directory name is at most NAME_MAX (255) bytes. Topics over
# 127 bytes are written as RocketMQ's message version 2 (two-byte topic length).
MAX_TOPIC_NAME_BYTES = 255


def topic_name_problem(topic: object, max_bytes: int = MAX_TOPIC_NAME_BYTES) -> str | None:
    """Why ``topic`` cannot be stored (a sentence naming the rule it breaks), or None."""
    if not isinstance(topic, str):
        return f"topic must be a string, not {type(topic).__name__}"
    if not topic:
        return "topic is empty"
    if not is_valid_name(topic):
        bad = invalid_characters(topic)
        return (f"topic {topic[:80]!r} contains {bad}: a topic name may only hold letters, "
                "digits and % | _ - (RocketMQ's topic rule; a topic is also a directory name)")
    if len(topic) > max_bytes:  # ASCII only by now: characters are bytes
        return (f"topic {topic[:40]!r}... is {len(topic)} bytes, longer than {max_bytes} bytes "
                "(a topic is a directory name, consumequeue/<topic>/)")
    return None
