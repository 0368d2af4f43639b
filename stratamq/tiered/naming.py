"""Where every file of a tier lives and how it is named: the one module that knows tier paths.

The layout is RocketMQ's tieredstore layout (seed 000 section 2.2; its ``MessageStoreUtil`` and
``PosixFileSegment``), spec in ``docs/formats/tier-layout.md``::

    <tieredStoreFilePath>/<md5("cluster")[:8]>_<cluster>/<broker>/<topic>/<queueId>/
        COMMIT_LOG/<md5(str(offset))[:8]><20-digit offset>     records copied from the CommitLog
        CONSUME_QUEUE/<md5(str(offset))[:8]><20-digit offset>  20-byte units into COMMIT_LOG
    <tieredStoreFilePath>/<md5("cluster")[:8]>_<cluster>/<broker>/rmq_sys_INDEX/0/
        INDEX/<md5(str(offset))[:8]><20-digit offset>          sealed index files, back to back

The hash prefixes spread names over an object store's key space (keys sharing a prefix share a
partition). A file's offset is a byte offset in that file type's space for the queue: CommitLog
bytes of the queue, ConsumeQueue bytes (queue offset x 20), index bytes.

On an object store a file is a *directory of parts* (objects cannot be appended to): each
upload writes one immutable object ``<file>/<20-digit position in the file>``; see
``drivers/object_store.py``.

Local paths (under the store root) of the tier index: ``tiered_index_file/<begin timestamp>``
(UNSEALED, being written) and ``tiered_index_file/compacting/<begin timestamp>`` (SEALED, being
re-laid-out for upload).
"""

from __future__ import annotations

import hashlib
from enum import IntEnum

__all__ = [
    "FILE_COMPACTED_DIRECTORY_NAME", "FILE_DIRECTORY_NAME", "METADATA_FILE", "NAME_DIGITS",
    "PART_NAME_DIGITS", "RMQ_SYS_TIERED_STORE_INDEX_TOPIC", "FileSegmentType", "cluster_dir",
    "file_name_to_offset", "get_hash", "index_file_path", "offset_to_file_name", "part_name",
    "parse_part_name", "queue_file_path", "segment_path",
]  # fmt: skip

RMQ_SYS_TIERED_STORE_INDEX_TOPIC = "rmq_sys_INDEX"
FILE_DIRECTORY_NAME = "tiered_index_file"  # local UNSEALED index files, under the store root
FILE_COMPACTED_DIRECTORY_NAME = "compacting"  # local SEALED ones being re-laid-out
METADATA_FILE = "config/tieredStoreMetadata.json"  # under the store root (DefaultMetadataStore)
HASH_CHARS = 8
NAME_DIGITS = 20
PART_NAME_DIGITS = 20


class FileSegmentType(IntEnum):
    """RocketMQ's ``FileSegmentType``: the code is what the metadata stores."""

    COMMIT_LOG = 0
    CONSUME_QUEUE = 1
    INDEX = 2


def get_hash(text: str) -> str:
    """``MessageStoreUtil.getHash``: the first 8 hex digits of the MD5 of the UTF-8 text."""
    return hashlib.md5(text.encode("utf-8")).hexdigest()[:HASH_CHARS]


def offset_to_file_name(offset: int) -> str:
    """``MessageStoreUtil.offset2FileName``: hash of the decimal offset, then 20 digits."""
    if offset < 0:
        raise ValueError(f"a tier file offset cannot be negative: {offset}")
    return get_hash(str(offset)) + f"{offset:0{NAME_DIGITS}d}"


def file_name_to_offset(name: str) -> int | None:
    """The offset a tier file name encodes; None when ``name`` is not one (wrong length,
    not digits, or a hash prefix that does not match its offset)."""
    if len(name) != HASH_CHARS + NAME_DIGITS:
        return None
    digits = name[HASH_CHARS:]
    if not digits.isdigit():
        return None
    offset = int(digits)
    return offset if name[:HASH_CHARS] == get_hash(str(offset)) else None


def cluster_dir(cluster: str) -> str:
    return f"{get_hash(cluster)}_{cluster}"


def queue_file_path(broker: str, topic: str, queue_id: int) -> str:
    """``MessageStoreUtil.toFilePath``: the metadata's key of a queue's files."""
    return f"{broker}/{topic}/{queue_id}"


def index_file_path(broker: str) -> str:
    return queue_file_path(broker, RMQ_SYS_TIERED_STORE_INDEX_TOPIC, 0)


def segment_path(cluster: str, file_path: str, file_type: FileSegmentType,
                 base_offset: int) -> str:
    """A file's path relative to the tier root (``/``-separated, also for object keys)."""
    return f"{cluster_dir(cluster)}/{file_path}/{file_type.name}/{offset_to_file_name(base_offset)}"


def part_name(position: int) -> str:
    """An object-store part: the 20-digit position of its first byte in the file."""
    return f"{position:0{PART_NAME_DIGITS}d}"


def parse_part_name(name: str) -> int | None:
    if len(name) != PART_NAME_DIGITS or not name.isdigit():
        return None
    return int(name)


BROKER_CONFIG_DIR = "config"  # per broker in the tier: what an offload registers (offloaded.py)


def broker_config_path(cluster: str, broker: str, name: str) -> str:
    """A document an offload writes for one broker, relative to the tier root:
    ``<cluster dir>/<broker>/config/<name>`` (docs/formats/tier-offload.md)."""
    return f"{cluster_dir(cluster)}/{broker}/{BROKER_CONFIG_DIR}/{name}"
