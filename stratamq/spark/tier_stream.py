"""Streaming reads of a tier (``spark.readStream.format("stratamq").load(<tier>)``), so the
export pipeline lands history that is only in a tier (an offloaded broker's, or what a broker's
local files no longer hold) in its tables, incrementally.

Offsets are queue offsets, ``{"topic": {"queueId": next offset}}`` as for a store, taken from
the tier's ConsumeQueue files (``docs/formats/tier-layout.md``): a queue's offsets run from its
first ConsumeQueue file's start to the end of the whole units its last one holds. Units are
uploaded after the records they point at, so every unit counted points at a record in the
tier, on an object store and on a POSIX directory a broker is still appending to alike.

A partition is a queue offset range of one queue; its task reads the units of the range
(ranged reads of the ConsumeQueue files or their parts), then the CommitLog bytes they span
(one ranged read per run of adjacent records, never a whole file), and decodes the records
into the same rows as every other read (``broker_io.raw_records_batch``: each record's own
CommitLog offset and message id). Offsets a queue's ConsumeQueue files skip (local data that
expired before it was tiered) are not rows. One broker's tier at a time: a tier holding several
brokers' is narrowed with ``option("config", "broker.conf")`` (its cluster and broker names).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from stratamq.spark.planning import OptionError
from stratamq.spark.tier_io import _cluster_of, _filesystem, _ls, _name, _settings
from stratamq.tiered.naming import file_name_to_offset, parse_part_name

__all__ = ["TierQueueSplit", "read_tier_queue_split", "tier_queue_bounds"]

UNIT = np.dtype([("offset", ">i8"), ("size", ">i4"), ("code", ">i8")])
_SIZE = struct.Struct(">i")
BATCH_RECORDS = 4096


class TierQueueSplit(InputPartition):
    """Queue offsets [start, end) of one queue of a tier (``queue_dir``: its directory)."""

    def __init__(self, url: str, endpoint: str, queue_dir: str, topic: str, queue_id: int,
                 start: int, end: int) -> None:
        self.url, self.endpoint, self.queue_dir = url, endpoint, queue_dir
        self.topic, self.queue_id, self.start, self.end = topic, queue_id, start, end


def _queue_dirs(options: Mapping[str, str]) -> tuple[Any, dict[tuple[str, int], str]]:
    """(filesystem, (topic, queue id) -> queue directory) of the tier's one broker."""
    url = options["path"]
    endpoint, want_cluster, want_broker = _settings(options)
    fs, root = _filesystem(url, endpoint)
    brokers = []
    for c in _ls(fs, root):
        cluster = _cluster_of(_name(c))
        if c.get("type") != "directory" or cluster is None or \
                want_cluster not in (None, cluster):
            continue
        brokers += [(cluster, b) for b in _ls(fs, c["name"]) if b.get("type") == "directory"
                    and want_broker in (None, _name(b))]
    if len(brokers) > 1:
        names = ", ".join(f"{c}/{_name(b)}" for c, b in brokers)
        raise OptionError(f"option 'path': the tier holds several brokers' queues ({names}): "
                          "name one with option 'config' (a broker.conf with its "
                          "brokerClusterName and brokerName)")
    queues: dict[tuple[str, int], str] = {}
    for _cluster, b in brokers:
        for t in _ls(fs, b["name"]):
            topic = _name(t)
            if t.get("type") != "directory" or topic in ("rmq_sys_INDEX", "config"):
                continue
            for q in _ls(fs, t["name"]):
                if _name(q).isdigit():
                    queues[(topic, int(_name(q)))] = str(q["name"])
    return fs, queues


def _files(fs: Any, directory: str) -> list[tuple[int, str, int]]:
    """(base offset, path, committed size) of each tier file of a file type, in order. On an
    object store a file is its contiguous parts."""
    out = []
    for entry in _ls(fs, directory):
        base = file_name_to_offset(_name(entry))
        if base is None:
            continue
        if entry.get("type") == "directory":
            end = 0
            for position, size in sorted((p, int(e["size"])) for e in _ls(fs, entry["name"])
                                         if (p := parse_part_name(_name(e))) is not None):
                if position != end:
                    break
                end += size
            out.append((base, str(entry["name"]), end))
        else:
            out.append((base, str(entry["name"]), int(entry["size"])))
    return sorted(out)


def tier_queue_bounds(options: Mapping[str, str]) -> dict[tuple[str, int], tuple[int, int]]:
    """(min, max) queue offset of every queue of the tier, from its ConsumeQueue files."""
    fs, queues = _queue_dirs(options)
    bounds = {}
    for queue, directory in queues.items():
        files = _files(fs, f"{directory}/CONSUME_QUEUE")
        if files:
            base, _path, size = files[-1]
            bounds[queue] = (files[0][0] // UNIT.itemsize,
                             (base + size - size % UNIT.itemsize) // UNIT.itemsize)
    return bounds


def queue_dir_of(options: Mapping[str, str], queue: tuple[str, int]) -> str:
    return _queue_dirs(options)[1][queue]


def _read_range(fs: Any, path: str, start: int, end: int) -> bytes:
    """Bytes [start, end) of a tier file (a plain file, or a directory of parts)."""
    entries = _ls(fs, path)
    is_file = not entries or (len(entries) == 1 and entries[0].get("type") == "file"
                              and _name(entries[0]) == _name({"name": path}))
    if is_file:
        return bytes(fs.cat_file(path, start=start, end=end))
    out = bytearray()
    for position, size, name in sorted((p, int(e["size"]), e["name"]) for e in entries
                                       if (p := parse_part_name(_name(e))) is not None):
        lo, hi = max(start, position), min(end, position + size)
        if lo < hi:
            out += fs.cat_file(name, start=lo - position, end=hi - position)
    return bytes(out)


def read_tier_queue_split(split: TierQueueSplit) -> Iterator[pa.RecordBatch]:
    from stratamq.spark.broker_io import raw_records_batch

    fs, _root = _filesystem(split.url, split.endpoint)
    units = _units(fs, split)
    if not len(units):
        return
    logs = _files(fs, f"{split.queue_dir}/COMMIT_LOG")
    bases = np.array([b for b, _p, _s in logs], dtype=np.int64)
    which = np.searchsorted(bases, units["offset"], side="right") - 1
    # Runs of records adjacent in one CommitLog file: one ranged read each.
    breaks = np.flatnonzero((np.diff(which) != 0) | (units["offset"][1:] != (
        units["offset"][:-1] + units["size"][:-1]))) + 1
    records: list[bytes] = []
    for run in np.split(np.arange(len(units)), breaks):
        f = int(which[run[0]])
        if f < 0:
            raise OSError(f"tier queue {split.queue_dir}: a unit points before its first "
                          "CommitLog file")
        base, path, _size = logs[f]
        first = int(units["offset"][run[0]])
        last = int(units["offset"][run[-1]]) + int(units["size"][run[-1]])
        data = _read_range(fs, path, first - base, last - base)
        at = 0
        for size in units["size"][run].tolist():
            if _SIZE.unpack_from(data, at)[0] != size:
                raise OSError(f"tier queue {split.queue_dir}: the record at {first + at} is "
                              f"not the {size} bytes its unit says")
            records.append(data[at:at + size])
            at += size
        if len(records) >= BATCH_RECORDS:
            yield raw_records_batch(records)
            records = []
    if records:
        yield raw_records_batch(records)


def _units(fs: Any, split: TierQueueSplit) -> np.ndarray:
    """The units of queue offsets [start, end) the ConsumeQueue files hold."""
    parts = []
    width = UNIT.itemsize
    for base, path, size in _files(fs, f"{split.queue_dir}/CONSUME_QUEUE"):
        first, last = base // width, (base + size - size % width) // width
        lo, hi = max(split.start, first), min(split.end, last)
        if lo < hi:
            data = _read_range(fs, path, (lo - first) * width, (hi - first) * width)
            parts.append(np.frombuffer(data, dtype=UNIT))
    return np.concatenate(parts) if parts else np.empty(0, dtype=UNIT)
