"""The driver layer: tier files on memory, a POSIX directory or an object store.

``FileSegmentFactory`` makes the ``FileSegment`` of the configured driver for a (file type,
queue path, base offset) and knows where the tier root is; the containers above it never see
which driver they use (RocketMQ's ``FileSegmentFactory``).
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any

from stratamq.config import StoreConfig, tier_provider
from stratamq.tiered.drivers.base import (
    AppendResult,
    FileSegment,
    SegmentLimits,
    TierCorrupt,
    TierIOError,
)
from stratamq.tiered.naming import BROKER_CONFIG_DIR, FileSegmentType, cluster_dir, segment_path

__all__ = ["AppendResult", "FileSegment", "FileSegmentFactory", "SegmentLimits",
           "TierBucketMissing", "TierCorrupt", "TierIOError", "open_filesystem"]

log = logging.getLogger(__name__)

# The uploader's file types, as directories of a queue (a compaction topic's are COMPACTION).
QUEUE_FILE_TYPES = frozenset(t.name for t in FileSegmentType)


class TierBucketMissing(TierIOError):
    """The S3 bucket the tier is configured in does not exist (a set-up error, not retried)."""


def open_filesystem(url: str, endpoint: str = "") -> tuple[Any, str]:
    """(fsspec filesystem, root path inside it) for a tier URL. ``s3://`` goes through s3fs
    with ``endpoint`` (an S3-compatible server) and the standard AWS credential chain
    (environment variables, ``~/.aws/credentials`` and ``config``); listings are never cached,
    since sizes read from them decide where uploads go."""
    try:
        import fsspec
    except ImportError:
        raise TierIOError("the s3 tier needs fsspec and s3fs: pip install 'stratamq[s3]'") \
            from None
    protocol = url.split("://", 1)[0]
    options: dict[str, Any] = {"skip_instance_cache": True}
    if protocol in ("s3", "s3a"):
        options["use_listings_cache"] = False
        # Fail a dead server within seconds (the uploader retries on its next round), rather
        # than after botocore's and s3fs's nested retries with back-off.
        options["config_kwargs"] = {"connect_timeout": 5, "read_timeout": 60,
                                    "retries": {"max_attempts": 2}}
        if endpoint:
            options["client_kwargs"] = {"endpoint_url": endpoint}
    try:
        fs, root = fsspec.core.url_to_fs(url, **options)
    except ImportError as exc:
        raise TierIOError(f"tier URL {url}: {exc} (pip install 'stratamq[s3]')") from None
    except (ValueError, TypeError) as exc:
        raise TierIOError(f"tier URL {url}: {exc}") from None
    if protocol in ("s3", "s3a"):
        fs.retries = 2  # s3fs's own retry loop (a class attribute, 5 by default)
    return fs, str(root).rstrip("/")


class FileSegmentFactory:
    """Makes segments for one broker's tier: ``cluster`` names its top directory.

    Thread-safety: ``create_segment`` from any thread; segments share ``limits``."""

    def __init__(self, config: StoreConfig, cluster: str, *, fs: Any = None) -> None:
        provider = tier_provider(config)
        if provider is None:
            raise ValueError("tiered storage is off (tieredBackendServiceProvider is empty)")
        self.provider = provider
        self.cluster = cluster
        self.root = config.tiered_store_file_path
        self.limits = SegmentLimits(config.tiered_store_commit_log_max_size,
                                    config.tiered_store_consume_queue_max_size,
                                    config.tiered_store_max_group_commit_count,
                                    config.tiered_store_max_pending_limit)
        self.fs: Any = fs
        self.fs_root = ""
        self._s3_endpoint = config.tiered_store_s3_endpoint
        if provider == "s3" and fs is None:
            self.fs, self.fs_root = open_filesystem(self.root, config.tiered_store_s3_endpoint)
        elif provider == "s3":
            self.fs_root = self.root.split("://", 1)[-1].rstrip("/")
        self._listed_topics: dict[str, frozenset[str]] = {}
        self._listed_segments: dict[str, set[str]] = {}  # "<file path>/<TYPE>" -> names
        # Per broker, the topic directories its tier directory held when this process listed
        # it (``list_broker``): a topic not among them has only what this process wrote.
        self._broker_topics: dict[str, set[str]] = {}
        self._listing_lock = threading.Lock()
        # Controller mode (the tier is the group's, ``group_metadata.py``): object-store parts
        # are written only where none is, so a master that lost its mastership cannot replace
        # a part the next one wrote (``ObjectFileSegment.commit0``).
        self.exclusive_parts = False

    def list_broker(self, broker: str) -> None:
        """List the broker's tier directory once, at the start of a process that uploads to
        it: a topic directory missing then holds only what this process writes later, so its
        new queues' files need no listing each (``queue_absent``, ``segment_absent``). One
        request at the start instead of one or two on each new topic's first upload. Only on
        an object store (other drivers look files up locally); when the tier cannot be
        reached, nothing is assumed and each new topic is listed as before."""
        if self.provider != "s3":
            return
        from stratamq.tiered.drivers.object_store import list_directory

        try:
            files, dirs = list_directory(self.fs, self.full_path(
                f"{cluster_dir(self.cluster)}/{broker}"))
        except Exception as exc:  # the per-topic listings will report it
            log.info("tier: the broker directory could not be listed at start: %s", exc)
            return
        with self._listing_lock:
            self._broker_topics[broker] = {*dirs, *(name for name, _size in files)}

    def topics_with_queue_files(self, broker: str, most: int = 5) -> list[str]:
        """Up to ``most`` topic directories of the broker in the tier that hold the uploader's
        queue files (a queue directory with ``COMMIT_LOG``, ``CONSUME_QUEUE`` or ``INDEX``);
        not ``config`` (offload and compaction documents) nor a compaction topic's
        ``COMPACTION`` files, which need no tier metadata. On an object store the broker
        directory's listing from the start (``list_broker``) is reused, then a topic and one
        of its queues are listed per topic until one is found. Raises TierIOError when the
        tier cannot say; the memory tier holds nothing after a start."""
        if self.provider not in ("posix", "s3"):
            return []
        base = f"{cluster_dir(self.cluster)}/{broker}"
        with self._listing_lock:
            listed = self._broker_topics.get(broker) if self.provider == "s3" else None
        try:
            topics = sorted(listed) if listed is not None else self._names(base)
            found = []
            for topic in topics:
                if topic == BROKER_CONFIG_DIR:
                    continue
                for queue in self._names(f"{base}/{topic}")[:1]:
                    if QUEUE_FILE_TYPES & set(self._names(f"{base}/{topic}/{queue}")):
                        found.append(topic)
                if len(found) >= most:
                    break
            return found
        except OSError as exc:
            raise TierIOError(f"cannot list the tier directory of {broker}: {exc}") from exc

    def _names(self, relative: str) -> list[str]:
        """Names directly under a tier directory ([] when it does not exist)."""
        if self.provider == "s3":
            from stratamq.tiered.drivers.object_store import list_directory

            try:
                files, dirs = list_directory(self.fs, self.full_path(relative))
            except OSError:
                raise
            except Exception as exc:  # botocore's own errors
                raise TierIOError(str(exc)) from exc
            return sorted({*dirs, *(name for name, _size in files)})
        try:
            return sorted(os.listdir(self.full_path(relative)))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def _topic_known_absent(self, file_path: str) -> bool:
        """True when the topic of ``file_path`` (broker/topic/...) was not in its broker's
        directory when ``list_broker`` listed it (under ``_listing_lock``)."""
        broker, _, rest = file_path.partition("/")
        present = self._broker_topics.get(broker)
        return present is not None and rest.partition("/")[0] not in present

    def queue_absent(self, file_path: str) -> bool:
        """True when the tier is known to hold no file of the queue ``file_path``
        (broker/topic/queueId), so its first files need no lookup each. On an object store
        one listing of the topic's directory (per topic, per process) answers for all its
        queues, where a lookup per file would cost a listing each, and none for a topic the
        broker's directory did not hold at the start (``list_broker``); other drivers answer
        False (their per-file lookup is a cheap local call)."""
        if self.provider != "s3":
            return False
        topic_path, _, queue = file_path.rpartition("/")
        with self._listing_lock:
            present = self._listed_topics.get(topic_path)
            if present is None and self._topic_known_absent(file_path):
                present = self._listed_topics[topic_path] = frozenset()
            if present is None:
                from stratamq.tiered.drivers.object_store import list_directory

                directory = self.full_path(f"{cluster_dir(self.cluster)}/{topic_path}")
                try:
                    files, dirs = list_directory(self.fs, directory)
                except Exception:  # the per-file lookups will report it
                    return False
                present = frozenset([*dirs, *(name for name, _size in files)])
                self._listed_topics[topic_path] = present
        return queue not in present

    def segment_absent(self, file_type: FileSegmentType, file_path: str,
                       base_offset: int) -> bool:
        """True when the tier is known to hold no file at ``base_offset`` of the file
        ``file_path`` (broker/topic/queueId) and type, so a new segment there needs no size
        lookup. On an object store one listing of the file type's directory per process
        answers for every later segment (a lookup per segment would cost a listing each, on
        the upload path), none for a topic the broker's directory did not hold at the start
        (``list_broker``): this process is the directory's one writer, and a segment it makes
        is noted as present. Other drivers answer False (their lookup is a local call)."""
        if self.provider != "s3":
            return False
        directory = f"{file_path}/{file_type.name}"
        name = segment_path(self.cluster, file_path, file_type, base_offset).rpartition("/")[2]
        with self._listing_lock:
            present = self._listed_segments.get(directory)
            if present is None and self._topic_known_absent(file_path):
                present = self._listed_segments[directory] = set()
            if present is None:
                from stratamq.tiered.drivers.object_store import list_directory

                full = self.full_path(f"{cluster_dir(self.cluster)}/{directory}")
                try:
                    files, dirs = list_directory(self.fs, full)
                except Exception:  # the per-file lookup will report it
                    return False
                present = {*dirs, *(n for n, _size in files)}
                self._listed_segments[directory] = present
            absent = name not in present
            present.add(name)  # made now (or already there): a later call answers False
        return absent

    def forget_topic(self, file_path: str) -> None:
        """The queue's topic was deleted: list it again before trusting ``queue_absent`` or
        ``segment_absent``."""
        topic_path = file_path.rpartition("/")[0]
        broker, _, rest = topic_path.partition("/")
        with self._listing_lock:
            if broker in self._broker_topics:  # its directory may be left in part: list it
                self._broker_topics[broker].add(rest)
            self._listed_topics.pop(topic_path, None)
            for directory in [d for d in self._listed_segments
                              if d.startswith(topic_path + "/")]:
                del self._listed_segments[directory]

    def full_path(self, relative: str) -> str:
        """Where a path relative to the tier root is, in the driver's terms."""
        if self.provider == "posix":
            return os.path.join(self.root, relative)
        if self.provider == "s3":
            return f"{self.fs_root}/{relative}"
        return f"{self.root or 'memory'}/{relative}"

    def create_segment(self, file_type: FileSegmentType, file_path: str,
                       base_offset: int) -> FileSegment:
        relative = segment_path(self.cluster, file_path, file_type, base_offset)
        if self.provider == "posix":
            from stratamq.tiered.drivers.posix import PosixFileSegment

            return PosixFileSegment(self.limits, file_type, file_path, base_offset,
                                    Path(self.full_path(relative)))
        if self.provider == "s3":
            from stratamq.tiered.drivers.object_store import ObjectFileSegment

            return ObjectFileSegment(self.limits, file_type, file_path, base_offset, self.fs,
                                     self.full_path(relative), exclusive=self.exclusive_parts)
        from stratamq.tiered.drivers.memory import MemoryFileSegment

        return MemoryFileSegment(self.limits, file_type, file_path, base_offset,
                                 self.full_path(relative))

    def check_bucket(self, create: bool) -> None:
        """On S3: the bucket of ``tieredStoreFilePath`` exists, or (``create``) is created now.

        A missing bucket is a set-up mistake, not an outage: without this check the broker
        would start and fail every upload. TierBucketMissing names the bucket and the two ways
        out. Any other failure (the server is down) is only logged: uploads retry."""
        if self.provider != "s3" or not hasattr(self.fs, "call_s3"):
            return
        bucket = self.fs_root.split("/", 1)[0]
        try:
            self.fs.call_s3("head_bucket", Bucket=bucket)
            return
        except FileNotFoundError:
            pass
        except Exception as exc:  # botocore / aiohttp errors are not OSErrors
            log.warning("tier: cannot check bucket %r at %s: %s", bucket,
                        self._s3_endpoint or "AWS", exc)
            return
        if not create:
            raise TierBucketMissing(
                f"the tier's bucket {bucket!r} (tieredStoreFilePath={self.root}) does not exist "
                f"at {self._s3_endpoint or 'AWS S3'}: create it, or set "
                f"tieredStoreS3CreateBucket=true to have the broker create it")
        try:
            self.fs.mkdir(bucket)
        except Exception as exc:
            raise TierIOError(f"cannot create the tier's bucket {bucket!r} at "
                              f"{self._s3_endpoint or 'AWS S3'}: {exc}") from exc
        log.info("tier: created bucket %r (tieredStoreS3CreateBucket=true)", bucket)

    def describe(self) -> str:
        return f"{self.provider} tier at {self.root or '(process memory)'}"
