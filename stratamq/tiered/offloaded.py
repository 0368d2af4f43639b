"""History an offload wrote into a tier, and how a broker takes it over.

``stratamq spark offload`` copies a retired store's history into a tier as the uploader would
have (``docs/formats/tier-layout.md``), then registers it for one broker with three documents
under ``<cluster dir>/<broker>/config/`` in the tier (``docs/formats/tier-offload.md``):

* ``topics.json``: the offloaded topics' configuration, in the broker's own format
  (``docs/formats/broker-metadata.md``);
* ``tieredStoreMetadata.json``: the tier metadata document (``docs/formats/tier-metadata.md``)
  describing every file the offload wrote;
* ``offload.json``: the manifest (where the history came from, what it holds). Written last:
  while it is missing the offload is not complete, and nothing adopts it.

A broker whose tier is configured and whose store has no tier metadata yet *adopts* them when
``wire`` plugs the tier in (``adopt``): the metadata document becomes the store's
``config/tieredStoreMetadata.json`` and the topics are added to its ``config/topics.json``
(a topic the store already configures is kept as it is). So a broker on an empty store lists
the topics and serves their whole history from the tier, with nothing created by hand. A store
that has tier metadata of its own adopts nothing: its own uploads are the truth.

Thread-safety: called once, on the opening thread, before the tier is built.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from stratamq.config import StoreConfig, tier_provider
from stratamq.fileutil import atomic_write, fsync_directory
from stratamq.tiered.naming import METADATA_FILE, broker_config_path

__all__ = ["MANIFEST", "METADATA", "TOPICS", "TierDocs", "adopt"]

log = logging.getLogger(__name__)

MANIFEST = "offload.json"
METADATA = "tieredStoreMetadata.json"
TOPICS = "topics.json"
LOCAL_TOPICS = Path("config") / "topics.json"  # under the store root (broker/metadata.py)


class TierDocs:
    """The offload documents of one broker in a tier: read, and written whole or not at all
    (POSIX: a temporary file renamed over; object stores: one put). One thread at a time (the
    offload's driver, or the opening thread adopting); it owns its filesystem client."""

    def __init__(self, config: StoreConfig, cluster: str, broker: str, *,
                 fs: Any = None) -> None:
        self.provider = tier_provider(config)
        if self.provider not in ("posix", "s3"):
            raise ValueError("offloaded history lives in a posix or s3 tier, not "
                             f"{self.provider or 'no tier'}")
        self.cluster, self.broker = cluster, broker
        self.root = config.tiered_store_file_path
        self.fs, self.fs_root = fs, ""
        if self.provider == "s3":
            from stratamq.tiered.drivers import open_filesystem

            if fs is None:
                self.fs, self.fs_root = open_filesystem(self.root,
                                                        config.tiered_store_s3_endpoint)
            else:
                self.fs_root = self.root.split("://", 1)[-1].rstrip("/")

    def path(self, name: str) -> str:
        relative = broker_config_path(self.cluster, self.broker, name)
        if self.provider == "posix":
            return os.path.join(self.root, relative)
        return f"{self.fs_root}/{relative}"

    def read(self, name: str) -> bytes | None:
        path = self.path(name)
        if self.provider == "posix":
            try:
                return Path(path).read_bytes()
            except FileNotFoundError:
                return None
        try:
            return bytes(self.fs.cat_file(path))
        except FileNotFoundError:
            return None

    def write(self, name: str, data: bytes) -> None:
        path = self.path(name)
        if self.provider == "posix":
            atomic_write(Path(path), data)
            return
        self.fs.pipe_file(path, data)

    def remove(self, name: str) -> None:
        path = self.path(name)
        if self.provider == "posix":
            Path(path).unlink(missing_ok=True)
            if Path(path).parent.exists():
                fsync_directory(Path(path).parent)
            return
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(path)

    def manifest(self) -> dict[str, Any] | None:
        raw = self.read(MANIFEST)
        if raw is None:
            return None
        try:
            doc = json.loads(raw)
        except ValueError as exc:
            raise ValueError(f"{self.path(MANIFEST)}: not an offload manifest ({exc})") from None
        if not isinstance(doc, dict):
            raise ValueError(f"{self.path(MANIFEST)}: not an offload manifest")
        return doc


def adopt(config: StoreConfig, cluster: str, broker: str) -> list[str]:
    """Take over what an offload registered for ``broker`` when the store has no tier
    metadata of its own; returns what was adopted (for the log), [] when nothing was."""
    if tier_provider(config) not in ("posix", "s3"):
        return []
    local = Path(config.root) / METADATA_FILE
    if local.exists():
        return []
    docs = TierDocs(config, cluster, broker)
    try:
        manifest = docs.manifest()
    except (OSError, ValueError) as exc:
        log.warning("tier offload manifest of %s unreadable, nothing adopted: %s", broker, exc)
        return []
    if manifest is None:
        return []
    metadata = docs.read(METADATA)
    if metadata is None:
        raise ValueError(f"{docs.path(MANIFEST)} names no {METADATA}: the offload is damaged; "
                         "run it again")
    topics = docs.read(TOPICS)
    adopted = []
    if topics is not None:
        added = _merge_topics(Path(config.root) / LOCAL_TOPICS, json.loads(topics))
        if added:
            adopted.append(f"{len(added)} topics ({', '.join(added[:5])}"
                           f"{', ...' if len(added) > 5 else ''})")
    atomic_write(local, metadata)
    adopted.append(f"tier metadata of {manifest.get('messages', '?')} offloaded messages")
    log.info("adopted the offload of %s from the tier: %s", manifest.get("source", "?"),
             "; ".join(adopted))
    return adopted


def _merge_topics(path: Path, offloaded: dict[str, Any]) -> list[str]:
    """Add the offloaded topics the store does not configure to its topics.json."""
    table = offloaded.get("topicConfigTable", {}) if isinstance(offloaded, dict) else {}
    try:
        current = json.loads(path.read_bytes())
    except FileNotFoundError:
        current = {"dataVersion": {"counter": 0, "stateVersion": 0, "timestamp": 0},
                   "topicConfigTable": {}}
    mine = current.setdefault("topicConfigTable", {})
    added = sorted(t for t in table if t not in mine)
    if not added:
        return []
    for topic in added:
        mine[topic] = table[topic]
    version = current.setdefault("dataVersion", {"counter": 0, "stateVersion": 0,
                                                 "timestamp": 0})
    version["counter"] = int(version.get("counter", 0)) + 1
    atomic_write(path, json.dumps(current, indent=2, sort_keys=True).encode("utf-8"),
                 backup=path.exists())
    return added
