"""Deleted topics: where each one's records end, so they are never served for it again.

Deleting a topic (RocketMQ's ``deleteTopics``) removes its ConsumeQueues at once, but its
records stay in the CommitLog until retention removes them. Without a note of where they end,
a replay after a crash would dispatch them into the ConsumeQueues of a topic created later
under the same name, and key lookups would find them: the old messages would come back. The
note is ``config/deletedTopics.json`` (``docs/formats/deleted-topics.md``): per topic the
CommitLog offset at deletion; dispatch and index lookups pass over that topic's records below
it. An entry is dropped once the CommitLog's min offset has passed it.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from stratamq.fileutil import atomic_write

log = logging.getLogger(__name__)

__all__ = ["DeletedTopics"]

FORMAT_VERSION = 1


class DeletedTopics:
    """``topic -> CommitLog offset`` of deleted topics, kept in memory and on disk.

    ``covers`` runs on the dispatcher thread for every record while any topic is listed, so
    it is a dict lookup; ``add`` replaces the dict (readers see the old one or the new)."""

    def __init__(self, path: Path, *, read_only: bool = False) -> None:
        self.path = path
        self.read_only = read_only
        self.cutoffs: dict[str, int] = {}
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: {exc}; it lists deleted topics whose old records must "
                             "not be served again: repair it or remove it knowingly") from None
        topics = doc.get("topics") if isinstance(doc, dict) else None
        if not isinstance(topics, dict) or not all(
                isinstance(k, str) and isinstance(v, int) and v >= 0 for k, v in topics.items()):
            raise ValueError(f"{path}: expected {{\"version\": 1, \"topics\": {{name: "
                             "offset}}}")
        self.cutoffs = dict(topics)

    def covers(self, topic: str, physical_offset: int) -> bool:
        """True if the record at ``physical_offset`` belongs to a deleted generation of
        ``topic``."""
        cutoff = self.cutoffs.get(topic)
        return cutoff is not None and physical_offset < cutoff

    def add(self, topic: str, cutoff: int) -> None:
        """Note (in memory) that ``topic``'s records below ``cutoff`` are deleted."""
        self.cutoffs = {**self.cutoffs, topic: max(cutoff, self.cutoffs.get(topic, 0))}

    def save(self) -> None:
        doc = {"version": FORMAT_VERSION, "topics": dict(sorted(self.cutoffs.items()))}
        atomic_write(self.path, json.dumps(doc, indent=2).encode("utf-8"))

    def prune(self, commitlog_min_offset: int) -> None:
        """Forget topics whose deleted records retention has removed."""
        kept = {t: c for t, c in self.cutoffs.items() if c > commitlog_min_offset}
        if kept != self.cutoffs:
            self.cutoffs = kept
            if not self.read_only:
                self.save()
