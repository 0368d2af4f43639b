"""The ``stratamq`` source over a tier, without a broker or a store: ``.load("s3://bucket/prefix")``
or ``.load("/path/to/tier")`` (a ``tieredStoreFilePath``), with ``option("config",
"broker.conf")`` for the tier settings (``tieredStoreS3Endpoint``; ``brokerClusterName`` and
``brokerName`` narrow the read to one broker) or ``option("tieredStoreS3Endpoint", url)``.

Planning (driver) lists the tier (docs/formats/tier-layout.md): one split per COMMIT_LOG file
of every queue, so a long history is scanned in parallel. Reading (executors) takes the file's
bytes (its parts, in order, on an object store), walks its records (whole CommitLog records,
the same bytes the local store had) and decodes them into the same rows a store directory
read gives, each with its own queue offset, CommitLog offset and message id. A torn tail (a
crash mid-upload on POSIX) ends the file's rows. Only whole-topic batch reads: offset options
and streaming are refused for a tier.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from stratamq import record as codec
from stratamq.spark.planning import OptionError
from stratamq.tiered.naming import cluster_dir, file_name_to_offset, parse_part_name

__all__ = ["TierSplit", "is_tier_read", "plan_tier", "read_tier_split", "tier_topics"]

_SIZE = struct.Struct(">i")
_NOT_FOR_TIERS = ("startingoffsets", "endingoffsets", "startingtimestamp", "endingtimestamp",
                  "startingoffsetsbytimestamp", "endingoffsetsbytimestamp", "assign")


class TierSplit(InputPartition):
    """One COMMIT_LOG file of one queue (``path``: a file, or a directory of parts)."""

    def __init__(self, url: str, endpoint: str, path: str, topic: str, queue_id: int,
                 base_offset: int) -> None:
        self.url, self.endpoint, self.path = url, endpoint, path
        self.topic, self.queue_id, self.base_offset = topic, queue_id, base_offset


def is_tier_read(options: Mapping[str, str]) -> bool:
    """A URL, or a directory laid out as a tier (``<md5>_<cluster>/`` inside, no
    ``commitlog/``)."""
    path = options.get("path") or ""
    if "://" in path:
        return True
    root = Path(path)
    if not path or (root / "commitlog").is_dir() or not root.is_dir():
        return False
    return any(_cluster_of(p.name) is not None for p in root.iterdir() if p.is_dir())


def _cluster_of(name: str) -> str | None:
    head, sep, cluster = name.partition("_")
    return cluster if sep and cluster and cluster_dir(cluster) == name else None


def _settings(options: Mapping[str, str]) -> tuple[str, str | None, str | None]:
    """(S3 endpoint, cluster, broker) from ``config`` / ``tieredStoreS3Endpoint``."""
    endpoint = options.get("tieredstores3endpoint", "")
    cluster = broker = None
    if options.get("config"):
        from stratamq.config_file import read_broker_conf

        try:
            conf = read_broker_conf(options["config"])
        except (OSError, ValueError) as exc:
            raise OptionError(f"option 'config': cannot read {options['config']}: {exc}") \
                from None
        endpoint = endpoint or conf.store.tiered_store_s3_endpoint
        cluster, broker = conf.broker.broker_cluster_name, conf.broker.broker_name
    return endpoint, cluster, broker


def _filesystem(url: str, endpoint: str) -> tuple[Any, str]:
    from stratamq.tiered.drivers import TierIOError, open_filesystem

    try:
        return open_filesystem(url if "://" in url else f"file://{Path(url).resolve()}",
                               endpoint)
    except TierIOError as exc:
        raise OptionError(f"option 'path': {exc}") from None


def _ls(fs: Any, path: str) -> list[dict[str, Any]]:
    try:
        return list(fs.ls(path, detail=True, refresh=True))
    except FileNotFoundError:
        return []
    except TypeError:  # filesystems without refresh=
        return list(fs.ls(path, detail=True))


def _name(entry: dict[str, Any]) -> str:
    return str(entry["name"]).rstrip("/").rsplit("/", 1)[-1]


def tier_catalog(options: Mapping[str, str]) -> list[TierSplit]:
    """Every COMMIT_LOG file of the tier (narrowed to ``config``'s cluster and broker)."""
    url = options["path"]
    endpoint, want_cluster, want_broker = _settings(options)
    fs, root = _filesystem(url, endpoint)
    splits = []
    for c in _ls(fs, root):
        cluster = _cluster_of(_name(c))
        if c.get("type") != "directory" or cluster is None or \
                want_cluster not in (None, cluster):
            continue
        for b in _ls(fs, c["name"]):
            if b.get("type") != "directory" or want_broker not in (None, _name(b)):
                continue
            for t in _ls(fs, b["name"]):
                topic = _name(t)
                if t.get("type") != "directory" or topic == "rmq_sys_INDEX":
                    continue
                for q in _ls(fs, t["name"]):
                    if not _name(q).isdigit():
                        continue
                    for f in _ls(fs, f"{q['name']}/COMMIT_LOG"):
                        base = file_name_to_offset(_name(f))
                        if base is not None:
                            splits.append(TierSplit(url, endpoint, str(f["name"]), topic,
                                                    int(_name(q)), base))
    splits.sort(key=lambda s: (s.topic, s.queue_id, s.base_offset))
    return splits


def tier_topics(options: Mapping[str, str]) -> dict[str, list[int]]:
    out: dict[str, set[int]] = {}
    for split in tier_catalog(options):
        out.setdefault(split.topic, set()).add(split.queue_id)
    return {t: sorted(q) for t, q in out.items()}


def plan_tier(options: Mapping[str, str], topics: list[str] | None) -> list[TierSplit]:
    for name in _NOT_FOR_TIERS:
        if options.get(name):
            raise OptionError(f"option {name!r} is not supported when reading a tier directly "
                              "(every message of the chosen topics is read)")
    return [s for s in tier_catalog(options) if topics is None or s.topic in topics]


def _file_bytes(fs: Any, path: str) -> bytes:
    """A tier file's content: the file itself, or its parts in order (object stores)."""
    entries = _ls(fs, path)
    if not entries or (len(entries) == 1 and _name(entries[0]) == _name({"name": path})
                       and entries[0].get("type") == "file"):
        return bytes(fs.cat_file(path))
    parts = sorted((p, e) for e in entries if (p := parse_part_name(_name(e))) is not None)
    data = bytearray()
    for position, entry in parts:
        if position != len(data):
            break  # a gap: what follows is not part of the file
        data += fs.cat_file(entry["name"])
    return bytes(data)


def read_tier_split(split: TierSplit) -> Iterator[pa.RecordBatch]:
    from stratamq.spark.broker_io import raw_records_batch

    fs, _root = _filesystem(split.url, split.endpoint)
    data = _file_bytes(fs, split.path)
    records: list[bytes] = []
    pos = 0
    while pos + 8 <= len(data):
        size = _SIZE.unpack_from(data, pos)[0]
        if size < codec.MIN_RECORD_SIZE or pos + size > len(data):
            break  # a torn tail
        records.append(data[pos : pos + size])
        pos += size
        if len(records) >= 4096:
            yield raw_records_batch(records)
            records = []
    if records:
        yield raw_records_batch(records)
