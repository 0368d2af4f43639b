"""The tier metadata of a broker group, kept in the tier itself and fenced by epoch.

In controller mode (``stratamq/cluster``) the tier belongs to the group (``brokerName``), not to
one broker: whichever broker is master uploads to it, and the next master continues where the
last one stopped. Each master's uploader keeps its own document
(``config/tieredStoreMetadata.json``, ``metadata.py``) and, after every write of it, publishes a
copy to ``<cluster dir>/<broker>/config/groupTierMetadata.json`` in the tier; a broker elected
master takes that copy over (``TieredStore.take_over``) when it was written at a higher epoch
than its own document. Format and the argument for the fence: ``docs/formats/tier-metadata.md``.

The fence: every document carries ``writerEpoch``, the cluster epoch of the master that wrote
it. A publish whose epoch is lower than the one stored is refused (ERROR log, counted in
``fenced``, nothing written): an old master woken after a new one was elected cannot overwrite
what the new one recorded. The compare and the write are one step:

* S3 (and S3-compatible stores): a conditional ``PutObject`` (``If-Match`` the ETag read with
  the epoch, ``If-None-Match: *`` when there is no copy yet). A write between the read and
  the put makes the put fail (412); the publish reads again and decides again.
* POSIX: the read, compare and atomic replace under an exclusive ``flock`` on a lock file next
  to the document: two writers on one filesystem (or NFSv4, whose byte-range locks go through
  the server) serialise there.

Other tier providers (``memory``) keep no group copy: they are not shared between processes.

Thread-safety: ``publish`` and ``read`` from any thread (one publish at a time, ``_lock``).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

from stratamq.config import StoreConfig, tier_provider
from stratamq.fileutil import atomic_write
from stratamq.tiered.naming import METADATA_FILE
from stratamq.tiered.offloaded import TierDocs

__all__ = ["GROUP_METADATA", "GroupTierMetadata", "adopt_group", "precondition_failed",
           "writer", "writer_epoch"]

log = logging.getLogger(__name__)

GROUP_METADATA = "groupTierMetadata.json"
_RETRIES = 5  # conditional puts lost to a concurrent writer before a publish gives up


def writer_epoch(raw: bytes) -> int:
    """The ``writerEpoch`` of a tier metadata document (0: none, a standalone broker's)."""
    return writer(raw)[0]


def writer(raw: bytes) -> tuple[int, int]:
    """(``writerEpoch``, ``writerBrokerId``) of a tier metadata document ((0, -1): none)."""
    try:
        doc = json.loads(raw)
    except ValueError:
        return 0, -1
    if not isinstance(doc, dict):
        return 0, -1
    epoch, broker = doc.get("writerEpoch", 0), doc.get("writerBrokerId", -1)
    return (epoch if isinstance(epoch, int) else 0, broker if isinstance(broker, int) else -1)


class GroupTierMetadata:
    """The group's copy of the tier metadata document (see the module docstring)."""

    def __init__(self, config: StoreConfig, cluster: str, broker: str, *,
                 fs: Any = None) -> None:
        self.docs = TierDocs(config, cluster, broker, fs=fs)
        self.fenced = 0  # publishes refused: a newer master's copy is there
        self.published = 0
        self.last_error = ""
        self._lock = threading.Lock()

    @staticmethod
    def supported(config: StoreConfig) -> bool:
        return tier_provider(config) in ("posix", "s3")

    @property
    def path(self) -> str:
        return self.docs.path(GROUP_METADATA)

    def read(self) -> bytes | None:
        """The group's document (None: none yet). OSError when the tier cannot be read."""
        return self.docs.read(GROUP_METADATA)

    def publish(self, raw: bytes, epoch: int) -> bool:
        """Store ``raw`` (a document of ``writerEpoch`` ``epoch``) unless the stored copy is of
        a higher epoch; False when refused. OSError when the tier fails."""
        with self._lock:
            if self.docs.provider == "posix":
                ok = self._publish_posix(raw, epoch)
            else:
                ok = self._publish_s3(raw, epoch)
            if ok:
                self.published += 1
            return ok

    def _refuse(self, stored: int, epoch: int) -> bool:
        self.fenced += 1
        log.error("tier metadata of group %s NOT written: the tier's copy %s was written at "
                  "epoch %d, after this broker's epoch %d (a newer master owns the tier; this "
                  "one must not overwrite it)", self.docs.broker, self.path, stored, epoch)
        return False

    def _publish_posix(self, raw: bytes, epoch: int) -> bool:
        path = Path(self.path)
        path.parent.mkdir(parents=True, exist_ok=True)
        lock_path = path.with_name(path.name + ".lock")
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                stored = writer_epoch(path.read_bytes())
            except FileNotFoundError:
                stored = 0
            if stored > epoch:
                return self._refuse(stored, epoch)
            atomic_write(path, raw)
            return True
        finally:
            os.close(fd)  # (drops the lock)

    def _publish_s3(self, raw: bytes, epoch: int) -> bool:
        fs, path = self.docs.fs, self.path
        for _ in range(_RETRIES):
            fs.invalidate_cache(path)
            try:
                etag = fs.info(path)["ETag"]
            except FileNotFoundError:
                etag = None
            if etag is not None:
                try:
                    stored = writer_epoch(bytes(fs.cat_file(path)))
                except FileNotFoundError:
                    continue  # deleted meanwhile: decide again
                if stored > epoch:
                    return self._refuse(stored, epoch)
            # The put holds only if the object is still the one whose epoch was read (the
            # ETag of the HEAD; a write between it and the GET fails the put too).
            condition = {"IfMatch": etag} if etag is not None else {"IfNoneMatch": "*"}
            try:
                fs.pipe_file(path, raw, **condition)
                return True
            except OSError as exc:
                if not precondition_failed(exc):
                    raise
                log.info("tier metadata of group %s changed during a publish: reading it "
                         "again", self.docs.broker)
        raise OSError(f"tier metadata {path}: {_RETRIES} conditional writes in a row lost to "
                      "concurrent writers")


def precondition_failed(exc: BaseException) -> bool:
    """Whether an S3 error is a failed condition (412 PreconditionFailed, or 409
    ConditionalRequestConflict), through s3fs's translation of botocore's errors."""
    seen: BaseException | None = exc
    while seen is not None:
        text = str(seen)
        if "PreconditionFailed" in text or "412" in text or "ConditionalRequestConflict" in text:
            return True
        seen = seen.__cause__ or seen.__context__
    return False



def adopt_group(group: GroupTierMetadata, root: str | Path) -> bool:
    """A store without tier metadata of its own (a broker new to its group) starts from the
    group's copy: its tier files are the group's, and without the document they describe the
    tier would refuse to start (``TieredStore._refuse_without_metadata``). Whether it did."""
    local = Path(root) / METADATA_FILE
    if local.exists() or local.with_name(local.name + ".bak").exists():
        return False
    try:
        raw = group.read()
    except OSError as exc:
        log.warning("the group's tier metadata %s could not be read (%s): starting without it",
                    group.path, exc)
        return False
    if raw is None:
        return False
    local.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(local, raw)
    log.info("tier metadata of group %s taken from the tier (written at epoch %d)",
             group.docs.broker, writer_epoch(raw))
    return True
