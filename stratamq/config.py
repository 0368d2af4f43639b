"""Every setting StrataMQ has: its RocketMQ key, default and unit, in one place.

Settings use RocketMQ's ``broker.conf`` key names where RocketMQ has the setting, so an existing
``broker.conf`` reads unchanged. ``StoreConfig.from_properties`` reports unknown keys instead of
ignoring them. Nothing else in the project reads the environment or hard-codes a default.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from pathlib import Path
from typing import Any

from stratamq.message import Host

__all__ = ["FlushDiskType", "StoreConfig", "UnknownSettings", "settings_table"]

OS_PAGE_SIZE = 4096  # bytes; flush thresholds count dirty pages of this size
CQ_UNIT_SIZE = 20  # bytes of one ConsumeQueue unit (docs/formats/consumequeue-unit.md)


class FlushDiskType(StrEnum):
    ASYNC_FLUSH = "ASYNC_FLUSH"
    SYNC_FLUSH = "SYNC_FLUSH"


class UnknownSettings(ValueError):
    """A configuration named keys StrataMQ does not know."""


def _setting(key: str, default: Any, unit: str, doc: str) -> Any:
    return field(default=default, metadata={"key": key, "unit": unit, "doc": doc})


@dataclass
class StoreConfig:
    """The embedded store's settings. Sizes in bytes, intervals in milliseconds unless named."""

    store_path_root_dir: str = _setting(
        "storePathRootDir", "./data", "path", "root of the store: commitlog/, consumequeue/, ..."
    )
    mapped_file_size_commit_log: int = _setting(
        "mappedFileSizeCommitLog", 1024 * 1024 * 1024, "bytes",
        "size of a new CommitLog segment (an existing store keeps the size found on disk)",
    )  # fmt: skip
    mapped_file_size_consume_queue: int = _setting(
        "mappedFileSizeConsumeQueue", 300_000 * CQ_UNIT_SIZE, "bytes",
        "size of a new ConsumeQueue file, rounded up to a whole number of 20-byte units",
    )  # fmt: skip
    flush_disk_type: FlushDiskType = _setting(
        "flushDiskType", FlushDiskType.ASYNC_FLUSH, "ASYNC_FLUSH|SYNC_FLUSH",
        "SYNC_FLUSH: a put returns after its bytes are on disk (group commit)",
    )  # fmt: skip
    flush_interval_commit_log: int = _setting(
        "flushIntervalCommitLog", 500, "ms", "async flush: how often the flusher wakes"
    )
    flush_commit_log_least_pages: int = _setting(
        "flushCommitLogLeastPages", 4, "pages", "async flush: dirty pages needed to flush"
    )
    flush_commit_log_thorough_interval: int = _setting(
        "flushCommitLogThoroughInterval", 10_000, "ms",
        "async flush: flush whatever is dirty at least this often",
    )  # fmt: skip
    sync_flush_timeout: int = _setting(
        "syncFlushTimeout", 5_000, "ms", "sync flush: wait this long, then FLUSH_DISK_TIMEOUT"
    )
    flush_interval_consume_queue: int = _setting(
        "flushIntervalConsumeQueue", 1_000, "ms", "how often ConsumeQueues are flushed"
    )
    flush_consume_queue_least_pages: int = _setting(
        "flushConsumeQueueLeastPages", 2, "pages", "dirty pages needed to flush a ConsumeQueue"
    )
    flush_consume_queue_thorough_interval: int = _setting(
        "flushConsumeQueueThoroughInterval", 60_000, "ms",
        "flush every ConsumeQueue and the checkpoint at least this often",
    )  # fmt: skip
    max_message_size: int = _setting(
        "maxMessageSize", 4 * 1024 * 1024, "bytes", "largest body a put accepts"
    )
    check_crc_on_recover: bool = _setting(
        "checkCRCOnRecover", True, "bool", "verify body CRCs while recovering"
    )
    broker_ip: str = _setting(
        "brokerIP1", "127.0.0.1", "ip", "store host address written into records and msg ids"
    )
    listen_port: int = _setting(
        "listenPort", 10911, "port", "store host port written into records and msg ids"
    )
    max_transfer_count_on_message_in_memory: int = _setting(
        "maxTransferCountOnMessageInMemory", 32, "messages", "default max_count of one get"
    )
    max_transfer_bytes_on_message_in_memory: int = _setting(
        "maxTransferBytesOnMessageInMemory", 256 * 1024, "bytes", "default max_bytes of one get"
    )
    pre_allocate_mapped_file: bool = _setting(
        "preAllocateMappedFile", True, "bool",
        "create the next CommitLog segment in the background before it is needed",
    )  # fmt: skip
    dispatch_interval: int = _setting(
        "dispatchIntervalMs", 1, "ms", "how long the dispatcher sleeps when it has caught up"
    )
    destroy_mapped_file_interval_forcibly: int = _setting(
        "destroyMapedFileIntervalForcibly", 120_000, "ms",
        "a segment still held by a reader is unmapped anyway after this long",
    )  # fmt: skip

    # -- index (issue 3; docs/formats/index-file.md) --------------------------------------------
    message_index_enable: bool = _setting(
        "messageIndexEnable", True, "bool", "index every message's KEYS and UNIQ_KEY"
    )
    max_hash_slot_num: int = _setting(
        "maxHashSlotNum", 5_000_000, "slots", "hash slots of one index file"
    )
    max_index_num: int = _setting(
        "maxIndexNum", 20_000_000, "entries", "entries of one index file before a new one"
    )

    # -- clean-up (issue 3) ----------------------------------------------------------------------
    file_reserved_time: int = _setting(
        "fileReservedTime", 72, "hours", "CommitLog files older than this may be deleted"
    )
    delete_when: str = _setting(
        "deleteWhen", "04", "hours;hours", "hours of the day (;-separated) expired files go"
    )
    disk_max_used_space_ratio: int = _setting(
        "diskMaxUsedSpaceRatio", 75, "%", "past this disk usage expired files go at any hour"
    )
    disk_space_clean_forcibly_ratio: int = _setting(
        "diskSpaceCleanForciblyRatio", 85, "%",
        "past this disk usage the oldest files go even if not expired",
    )  # fmt: skip
    disk_space_warning_level_ratio: int = _setting(
        "diskSpaceWarningLevelRatio", 90, "%", "past this disk usage puts are rejected"
    )
    clean_resource_interval: int = _setting(
        "cleanResourceInterval", 10_000, "ms", "how often the clean-up service looks"
    )
    delete_commit_log_files_interval: int = _setting(
        "deleteCommitLogFilesInterval", 100, "ms", "pause between two deleted CommitLog files"
    )
    delete_consume_queue_files_interval: int = _setting(
        "deleteConsumeQueueFilesInterval", 100, "ms",
        "pause between two deleted ConsumeQueue files",
    )  # fmt: skip
    delete_file_batch_max: int = _setting(
        "deleteFileBatchMax", 10, "files", "most CommitLog files one clean-up pass deletes"
    )
    clean_file_forcibly_enable: bool = _setting(
        "cleanFileForciblyEnable", True, "bool",
        "past diskSpaceCleanForciblyRatio, delete unexpired files too",
    )  # fmt: skip

    # -- ConsumeQueue store (issue 4; seed 003) ---------------------------------------------------
    store_type: str = _setting(
        "storeType", "default", "default|defaultRocksDB",
        "ConsumeQueue store: one file per queue, or RocksDB; an existing store keeps its type",
    )  # fmt: skip
    rocksdb_cq_double_write_enable: bool = _setting(
        "rocksdbCQDoubleWriteEnable", False, "bool",
        "dispatch to both ConsumeQueue stores so either can serve",
    )  # fmt: skip

    @property
    def root(self) -> Path:
        return Path(self.store_path_root_dir)

    @property
    def store_host(self) -> Host:
        return Host(self.broker_ip, self.listen_port)

    @property
    def cq_file_size(self) -> int:
        """ConsumeQueue file size rounded up to whole units, as seed 004 describes."""
        units = -(-self.mapped_file_size_consume_queue // CQ_UNIT_SIZE)
        return units * CQ_UNIT_SIZE

    @classmethod
    def from_properties(cls, props: dict[str, str], **overrides: Any) -> StoreConfig:
        """Build from ``broker.conf``-style key/values; unknown keys raise UnknownSettings."""
        by_key = {f.metadata["key"]: f for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {}
        unknown = []
        for key, raw in props.items():
            f = by_key.get(key)
            if f is None:
                unknown.append(key)
                continue
            values[f.name] = _convert(f, raw.strip())
        if unknown:
            raise UnknownSettings("unknown settings: " + ", ".join(sorted(unknown)))
        values.update(overrides)
        return cls(**values)


def _convert(f: dataclasses.Field, raw: str) -> Any:
    default = f.default
    if isinstance(default, bool):
        if raw.lower() not in ("true", "false"):
            raise ValueError(f"{f.metadata['key']} must be true or false, not {raw!r}")
        return raw.lower() == "true"
    if isinstance(default, int):
        try:
            return int(raw)
        except ValueError:
            raise ValueError(f"{f.metadata['key']} must be an integer, not {raw!r}") from None
    if isinstance(default, Enum):
        try:
            return type(default)(raw)
        except ValueError:
            choices = "|".join(m.value for m in type(default))
            raise ValueError(f"{f.metadata['key']} must be {choices}, not {raw!r}") from None
    return raw


def settings_table() -> list[dict[str, str]]:
    """Every setting with key, default and unit, for docs and ``stratamq config``."""
    return [
        {
            "key": f.metadata["key"],
            "default": str(f.default.value if isinstance(f.default, Enum) else f.default),
            "unit": f.metadata["unit"],
            "doc": f.metadata["doc"],
        }
        for f in dataclasses.fields(StoreConfig)
    ]
