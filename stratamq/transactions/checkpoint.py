"""``config/transactionCheckpoint.json``: where the transaction table's replay starts.

Format (docs/formats/transaction-checkpoint.md): a JSON object ``{"replayFrom": <CommitLog
offset>}``, replaced atomically (``fileutil.atomic_write``). A missing file reads as 0 (replay
from the start of the CommitLog: a store first opened with transactions, or one written by
Apache RocketMQ). A damaged one also reads as 0, with an ERROR: replaying more is always
safe, never less.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from stratamq.fileutil import atomic_write

log = logging.getLogger(__name__)

__all__ = ["CHECKPOINT_NAME", "read_replay_from", "write_replay_from"]

CHECKPOINT_NAME = "transactionCheckpoint.json"  # under <root>/config/
_KEY = "replayFrom"


def read_replay_from(path: Path) -> int:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return 0
    try:
        value = json.loads(raw)[_KEY]
        if not isinstance(value, int) or value < 0:
            raise ValueError(f"{_KEY} is {value!r}")
        return value
    except (ValueError, KeyError, TypeError) as exc:
        log.error("%s is damaged (%s): the transaction table replays the whole CommitLog",
                  path, exc)
        return 0


def write_replay_from(path: Path, offset: int) -> None:
    atomic_write(path, json.dumps({_KEY: offset}).encode())
