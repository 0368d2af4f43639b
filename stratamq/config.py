"""Every setting StrataMQ has: its RocketMQ key, default, unit and valid range, in one place.

Settings use RocketMQ's ``broker.conf`` key names where RocketMQ has the setting, so an existing
``broker.conf`` reads unchanged. ``StoreConfig.from_properties`` reports unknown keys instead of
ignoring them. Nothing else in the project reads the environment or hard-codes a default.

Each numeric setting declares its range with the setting (``minimum``/``maximum`` on
``_setting``), and text settings with a fixed shape a ``check``. Building a ``StoreConfig`` or
``BrokerConfig`` (directly, through ``dataclasses.replace`` or from ``broker.conf``) refuses a
value outside them with :class:`InvalidSetting` naming the key, the value and the valid range,
so a bad value stops the broker before it listens instead of failing puts or dispatch later.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from pathlib import Path
from typing import Any

from stratamq.limits import CQ_UNIT_SIZE, INT_MAX, OS_PAGE_SIZE
from stratamq.message import Host
from stratamq.store.index_file import ENTRY_SIZE, HEADER_SIZE, SLOT_SIZE
from stratamq.store.index_file import file_size as index_file_size

__all__ = ["BrokerConfig", "BrokerRole", "DiskFullPolicy", "FlushDiskType", "InvalidSetting",
           "StoreConfig", "TieredStorageLevel", "UnknownSettings", "load_broker_conf",
           "settings_table", "tier_provider"]

# The broker sizes gRPC's (int32) message limits at maxMessageSize + 1 MiB of headroom.
MAX_MESSAGE_SIZE_LIMIT = 1024 * 1024 * 1024


class FlushDiskType(StrEnum):
    ASYNC_FLUSH = "ASYNC_FLUSH"
    SYNC_FLUSH = "SYNC_FLUSH"


class BrokerRole(StrEnum):
    """RocketMQ's ``brokerRole``: a master (replies once its own store has a put, or once a
    slave has it too) or a slave (copies a master's CommitLog, refuses puts)."""

    ASYNC_MASTER = "ASYNC_MASTER"
    SYNC_MASTER = "SYNC_MASTER"
    SLAVE = "SLAVE"


class DiskFullPolicy(StrEnum):
    """What the store does when its disk fills past ``diskSpaceCleanForciblyRatio``.

    ``REFUSE_PUTS``: delete early only CommitLog files every consumer group has consumed (or
    the tier holds); past ``diskSpaceWarningLevelRatio`` refuse puts until space is freed.
    ``DELETE_OLDEST``: RocketMQ's ``cleanFileForciblyEnable``: the oldest files go whether
    consumed or not, each loss logged at ERROR and counted."""

    REFUSE_PUTS = "REFUSE_PUTS"
    DELETE_OLDEST = "DELETE_OLDEST"


class UnknownSettings(ValueError):
    """A configuration named keys StrataMQ does not know."""


class InvalidSetting(ValueError):
    """A setting's value is of the wrong type or outside its range; the message names the key,
    the value and what is allowed."""


def _setting(key: str, default: Any, unit: str, doc: str, *, minimum: int | None = None,
             maximum: int | None = None, check: Callable[[Any], str | None] | None = None) -> Any:
    """One setting. Integer settings must declare ``minimum`` (``maximum`` defaults to INT_MAX);
    ``check(value)`` returns why a value is wrong, or None."""
    if isinstance(default, int) and not isinstance(default, bool):
        if minimum is None:
            raise TypeError(f"setting {key}: an integer setting must declare its minimum")
        maximum = INT_MAX if maximum is None else maximum
    return field(default=default, metadata={"key": key, "unit": unit, "doc": doc,
                                            "minimum": minimum, "maximum": maximum,
                                            "check": check})


def _one_of(*choices: str, fold_case: bool = False) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        got = value.strip().lower() if fold_case and isinstance(value, str) else value
        allowed = [c.lower() for c in choices] if fold_case else list(choices)
        return None if got in allowed else "must be " + "|".join(choices)

    return check


def _name(value: Any) -> str | None:
    # Names appear in routes, logs and metrics labels: an empty one or one with blanks in it is
    # a typo in broker.conf far more often than a wish.
    if not isinstance(value, str) or not value.strip():
        return "must not be empty"
    if any(c.isspace() or not c.isprintable() for c in value):
        return "must not contain spaces or control characters"
    return None


def _ip(value: Any) -> str | None:
    # Written into every record and offset message id as 4 or 16 address bytes.
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return "must be an IPv4 or IPv6 address"
    return None


def _host_port_or_empty(value: Any) -> str | None:
    if value == "":
        return None
    host, sep, port = str(value).rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        return "must be host:port (e.g. 10.0.0.5:10912)"
    return None


def _hours(value: Any) -> str | None:
    # RocketMQ's isItTimeToDo skips entries it cannot parse, so "99" or "4am" would silently
    # mean "never delete expired files"; refuse them instead.
    parts = [p.strip() for p in str(value).split(";") if p.strip()]
    if not parts or not all(p.isdigit() and 0 <= int(p) <= 23 for p in parts):
        return "must be hours of the day 0..23 separated by ';' (e.g. 04 or 03;15)"
    return None


def _validate(obj: Any) -> None:
    """Refuse a config whose values are of the wrong type or out of range (InvalidSetting)."""
    for f in dataclasses.fields(obj):
        meta = f.metadata
        key, value, default = meta["key"], getattr(obj, f.name), f.default
        if isinstance(default, Enum):
            try:
                value = type(default)(value)
            except ValueError:
                choices = "|".join(m.value for m in type(default))
                raise InvalidSetting(f"{key}={value!r} is invalid: must be {choices}") from None
            setattr(obj, f.name, value)  # a plain string becomes the enum the code compares
        elif isinstance(default, bool):
            if not isinstance(value, bool):
                raise InvalidSetting(f"{key}={value!r} is invalid: must be true or false")
        elif isinstance(default, int):
            low, high = meta["minimum"], meta["maximum"]
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidSetting(f"{key}={value!r} is invalid: must be an integer "
                                     f"{low}..{high} ({meta['unit']})")
            if not low <= value <= high:
                raise InvalidSetting(f"{key}={value} is out of range: must be {low}..{high} "
                                     f"({meta['unit']})")
        check = meta["check"]
        if check is not None:
            problem = check(value)
            if problem is not None:
                raise InvalidSetting(f"{key}={value!r} is invalid: {problem}")


def _range_text(f: dataclasses.Field) -> str:
    meta = f.metadata
    if meta["minimum"] is not None:
        return f"{meta['minimum']}..{meta['maximum']}"
    if isinstance(f.default, Enum):
        return "|".join(m.value for m in type(f.default))
    if isinstance(f.default, bool):
        return "true|false"
    return ""



# -- tiered storage (issue 15) helpers ----------------------------------------------------------
TIERED_MESSAGE_STORE = "org.apache.rocketmq.tieredstore.TieredMessageStore"
TIERED_METADATA_STORE = "org.apache.rocketmq.tieredstore.metadata.DefaultMetadataStore"
# tieredBackendServiceProvider values -> the driver (stratamq/tiered/drivers/).
TIER_PROVIDERS = {
    "memory": "memory",
    "posix": "posix",
    "s3": "s3",
    "org.apache.rocketmq.tieredstore.provider.MemoryFileSegment": "memory",
    "org.apache.rocketmq.tieredstore.provider.PosixFileSegment": "posix",
}


class TieredStorageLevel(StrEnum):
    """RocketMQ's read policies (``MessageStoreConfig.TieredStorageLevel``), weakest first."""

    DISABLE = "DISABLE"
    NOT_IN_DISK = "NOT_IN_DISK"
    NOT_IN_MEM = "NOT_IN_MEM"
    FORCE = "FORCE"


def _tier_provider(value: Any) -> str | None:
    if value == "" or value in TIER_PROVIDERS:
        return None
    return "must be '' (no tier), memory, posix, s3, or RocketMQ's " \
           "org.apache.rocketmq.tieredstore.provider.MemoryFileSegment / PosixFileSegment"


def _rate(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        return "must be a number in (0, 1]"
    return None


def tier_provider(config: StoreConfig) -> str | None:
    """The tier driver a config asks for (memory / posix / s3), or None when tiering is off.

    ``messageStorePlugIn`` alone turns it on too: the driver then follows
    ``tieredStoreFilePath`` (a URL: s3; a directory: posix)."""
    chosen = config.tiered_backend_service_provider
    if chosen:
        return TIER_PROVIDERS[chosen]
    if config.message_store_plug_in != TIERED_MESSAGE_STORE:
        return None
    path = config.tiered_store_file_path
    return "s3" if path.startswith("s3://") else "posix" if path else None


def _check_tier(config: StoreConfig) -> None:
    provider = tier_provider(config)
    path = config.tiered_store_file_path
    if config.message_store_plug_in and provider is None:
        raise InvalidSetting(
            f"messageStorePlugIn={config.message_store_plug_in} turns tiered storage on, but "
            "neither tieredBackendServiceProvider nor tieredStoreFilePath says where the tier is "
            "(RocketMQ would keep it in memory and lose it at exit)")
    if provider in ("posix", "s3") and not path:
        raise InvalidSetting(
            f"tieredBackendServiceProvider={config.tiered_backend_service_provider} needs "
            "tieredStoreFilePath (a directory or s3://bucket/prefix)")
    if provider == "posix" and "://" in path:
        raise InvalidSetting(f"tieredStoreFilePath={path!r} is a URL: the posix tier needs a "
                             "directory (use tieredBackendServiceProvider=s3 for a URL)")
    if provider == "s3" and "://" not in path:
        raise InvalidSetting(f"tieredStoreFilePath={path!r} is not a URL: the s3 tier needs "
                             "s3://bucket/prefix")

@dataclass
class StoreConfig:
    """The embedded store's settings. Sizes in bytes, intervals in milliseconds unless named."""

    store_path_root_dir: str = _setting(
        "storePathRootDir", "./data", "path", "root of the store: commitlog/, consumequeue/, ..."
    )
    mapped_file_size_commit_log: int = _setting(
        "mappedFileSizeCommitLog", 1024 * 1024 * 1024, "bytes",
        "size of a new CommitLog segment (an existing store keeps the size found on disk)",
        minimum=OS_PAGE_SIZE,
    )  # fmt: skip
    mapped_file_size_consume_queue: int = _setting(
        "mappedFileSizeConsumeQueue", 300_000 * CQ_UNIT_SIZE, "bytes",
        "size of a new ConsumeQueue file, rounded up to a whole number of 20-byte units",
        minimum=CQ_UNIT_SIZE, maximum=INT_MAX // CQ_UNIT_SIZE * CQ_UNIT_SIZE,
    )  # fmt: skip
    flush_disk_type: FlushDiskType = _setting(
        "flushDiskType", FlushDiskType.ASYNC_FLUSH, "ASYNC_FLUSH|SYNC_FLUSH",
        "SYNC_FLUSH: a put returns after its bytes are on disk (group commit)",
    )  # fmt: skip
    flush_interval_commit_log: int = _setting(
        "flushIntervalCommitLog", 500, "ms", "async flush: how often the flusher wakes",
        minimum=1,
    )  # fmt: skip
    flush_commit_log_least_pages: int = _setting(
        "flushCommitLogLeastPages", 4, "pages", "async flush: dirty pages needed to flush",
        minimum=0,
    )  # fmt: skip
    flush_commit_log_thorough_interval: int = _setting(
        "flushCommitLogThoroughInterval", 10_000, "ms",
        "async flush: flush whatever is dirty at least this often",
        minimum=0,
    )  # fmt: skip
    sync_flush_timeout: int = _setting(
        "syncFlushTimeout", 5_000, "ms", "sync flush: wait this long, then FLUSH_DISK_TIMEOUT",
        minimum=1,
    )  # fmt: skip
    sync_flush_group_linger: int = _setting(
        "syncFlushGroupLinger", 10, "ms",
        "sync flush, broker saturated: a flush starts no sooner than this after the last one "
        "(fewer, larger groups); 0 flushes at once",
        minimum=0, maximum=1_000,
    )  # fmt: skip
    flush_interval_consume_queue: int = _setting(
        "flushIntervalConsumeQueue", 1_000, "ms", "how often ConsumeQueues are flushed",
        minimum=1,
    )  # fmt: skip
    flush_consume_queue_least_pages: int = _setting(
        "flushConsumeQueueLeastPages", 2, "pages", "dirty pages needed to flush a ConsumeQueue",
        minimum=0,
    )  # fmt: skip
    flush_consume_queue_thorough_interval: int = _setting(
        "flushConsumeQueueThoroughInterval", 60_000, "ms",
        "flush every ConsumeQueue and the checkpoint at least this often",
        minimum=0,
    )  # fmt: skip
    max_message_size: int = _setting(
        "maxMessageSize", 4 * 1024 * 1024, "bytes", "largest body a put accepts",
        minimum=1, maximum=MAX_MESSAGE_SIZE_LIMIT,
    )  # fmt: skip
    check_crc_on_recover: bool = _setting(
        "checkCRCOnRecover", True, "bool", "verify body CRCs while recovering"
    )
    broker_ip: str = _setting(
        "brokerIP1", "127.0.0.1", "ip", "store host address written into records and msg ids",
        check=_ip,
    )  # fmt: skip
    listen_port: int = _setting(
        "listenPort", 10911, "port", "store host port written into records and msg ids",
        minimum=0, maximum=65535,
    )  # fmt: skip
    max_transfer_count_on_message_in_memory: int = _setting(
        "maxTransferCountOnMessageInMemory", 32, "messages", "default max_count of one get",
        minimum=1,
    )  # fmt: skip
    max_transfer_bytes_on_message_in_memory: int = _setting(
        "maxTransferBytesOnMessageInMemory", 256 * 1024, "bytes", "default max_bytes of one get",
        minimum=1,
    )  # fmt: skip
    pre_allocate_mapped_file: bool = _setting(
        "preAllocateMappedFile", True, "bool",
        "create the next CommitLog segment in the background before it is needed",
    )  # fmt: skip
    dispatch_interval: int = _setting(
        "dispatchIntervalMs", 1, "ms", "how long the dispatcher sleeps when it has caught up",
        minimum=1,
    )  # fmt: skip
    destroy_mapped_file_interval_forcibly: int = _setting(
        "destroyMapedFileIntervalForcibly", 120_000, "ms",
        "a segment still held by a reader is unmapped anyway after this long",
        minimum=0,
    )  # fmt: skip

    # -- master/slave replication (issue 17; seed 004 section 1.6): brokerRole, ha* keys -----------
    broker_role: BrokerRole = _setting(
        "brokerRole", BrokerRole.ASYNC_MASTER, "ASYNC_MASTER|SYNC_MASTER|SLAVE",
        "SYNC_MASTER: a put returns once a slave has its bytes; SLAVE: copy haMasterAddress's "
        "CommitLog and refuse puts",
    )  # fmt: skip
    ha_listen_port: int = _setting(
        "haListenPort", 10912, "port", "a master's replication port (0: any free port)",
        minimum=0, maximum=65535,
    )  # fmt: skip
    ha_master_address: str = _setting(
        "haMasterAddress", "", "host:port", "a slave's master: its haListenPort",
        check=_host_port_or_empty,
    )  # fmt: skip
    ha_send_heartbeat_interval: int = _setting(
        "haSendHeartbeatInterval", 5_000, "ms",
        "a slave reports its offset at least this often (and the master sends an empty frame "
        "when idle this long); a lost link is retried after this long",
        minimum=1,
    )  # fmt: skip
    ha_housekeeping_interval: int = _setting(
        "haHousekeepingInterval", 20_000, "ms",
        "a replication link silent for this long is closed (and reconnected by the slave)",
        minimum=1,
    )  # fmt: skip
    ha_transfer_batch_size: int = _setting(
        "haTransferBatchSize", 32 * 1024, "bytes", "most CommitLog bytes in one transfer frame",
        minimum=1, maximum=4 * 1024 * 1024,
    )  # fmt: skip
    ha_max_gap_not_in_sync: int = _setting(
        "haMaxGapNotInSync", 256 * 1024 * 1024, "bytes",
        "SYNC_MASTER: a slave further behind than this is not in sync, and with none in sync "
        "puts answer SLAVE_NOT_AVAILABLE",
        minimum=1,
    )  # fmt: skip
    ha_flow_control_enable: bool = _setting(
        "haFlowControlEnable", False, "bool",
        "limit each slave's transfer to maxHaTransferByteInSecond",
    )  # fmt: skip
    max_ha_transfer_byte_in_second: int = _setting(
        "maxHaTransferByteInSecond", 100 * 1024 * 1024, "bytes/s",
        "with haFlowControlEnable, most bytes sent to one slave per second",
        minimum=1, maximum=2**62,
    )  # fmt: skip
    ha_new_slave_transfer_from: str = _setting(
        "haNewSlaveTransferFrom", "LAST_SEGMENT", "LAST_SEGMENT|MIN_OFFSET",
        "where a master starts an empty slave (one reporting offset 0): the start of its last "
        "CommitLog segment (RocketMQ, seed 004) or its oldest byte (copy everything it holds)",
        check=_one_of("LAST_SEGMENT", "MIN_OFFSET"),
    )  # fmt: skip
    store_path_epoch_file: str = _setting(
        "storePathEpochFile", "", "path",
        "where each start of a new master life (and each slave truncation) is recorded, so a "
        "slave that diverged from its master is found and cut (default <root>/epochFileCheckpoint)",
    )  # fmt: skip
    ha_master_endpoint: str = _setting(
        "haMasterEndpoint", "", "host:port",
        "a slave's master's client (gRPC) endpoint, for state sync and routes (default: "
        "haMasterAddress's host and port - 1, RocketMQ's listenPort/haListenPort pairing)",
        check=_host_port_or_empty,
    )  # fmt: skip
    ha_state_sync_interval: int = _setting(
        "haStateSyncInterval", 3_000, "ms",
        "a slave broker copies its master's topics, groups, consumer offsets and pop state "
        "this often (the most progress a consumer moving to the slave can repeat)",
        minimum=100,
    )  # fmt: skip

    # -- index (issue 3; docs/formats/index-file.md) --------------------------------------------
    message_index_enable: bool = _setting(
        "messageIndexEnable", True, "bool", "index every message's KEYS and UNIQ_KEY"
    )
    max_hash_slot_num: int = _setting(
        "maxHashSlotNum", 5_000_000, "slots", "hash slots of one index file",
        minimum=1,
    )  # fmt: skip
    max_index_num: int = _setting(
        "maxIndexNum", 20_000_000, "entries", "entries of one index file before a new one",
        minimum=1,
    )  # fmt: skip

    # -- clean-up (issue 3) ----------------------------------------------------------------------
    file_reserved_time: int = _setting(
        "fileReservedTime", 72, "hours", "CommitLog files older than this may be deleted",
        minimum=0,
    )  # fmt: skip
    delete_when: str = _setting(
        "deleteWhen", "04", "hours;hours", "hours of the day (;-separated) expired files go",
        check=_hours,
    )  # fmt: skip
    disk_max_used_space_ratio: int = _setting(
        "diskMaxUsedSpaceRatio", 75, "%", "past this disk usage expired files go at any hour",
        minimum=1, maximum=99,
    )  # fmt: skip
    disk_space_clean_forcibly_ratio: int = _setting(
        "diskSpaceCleanForciblyRatio", 85, "%",
        "past this disk usage the oldest files go even if not expired",
        minimum=1, maximum=99,
    )  # fmt: skip
    disk_space_warning_level_ratio: int = _setting(
        "diskSpaceWarningLevelRatio", 90, "%", "past this disk usage puts are rejected",
        minimum=1, maximum=99,
    )  # fmt: skip
    clean_resource_interval: int = _setting(
        "cleanResourceInterval", 10_000, "ms", "how often the clean-up service looks",
        minimum=1,
    )  # fmt: skip
    delete_commit_log_files_interval: int = _setting(
        "deleteCommitLogFilesInterval", 100, "ms", "pause between two deleted CommitLog files",
        minimum=0,
    )  # fmt: skip
    delete_consume_queue_files_interval: int = _setting(
        "deleteConsumeQueueFilesInterval", 100, "ms",
        "pause between two deleted ConsumeQueue files",
        minimum=0,
    )  # fmt: skip
    delete_file_batch_max: int = _setting(
        "deleteFileBatchMax", 10, "files", "most CommitLog files one clean-up pass deletes",
        minimum=1,
    )  # fmt: skip
    clean_file_forcibly_enable: bool = _setting(
        "cleanFileForciblyEnable", True, "bool",
        "past diskSpaceCleanForciblyRatio, delete unexpired files too (false: never)",
    )  # fmt: skip
    disk_full_policy: DiskFullPolicy = _setting(
        "diskFullPolicy", DiskFullPolicy.REFUSE_PUTS, "policy",
        "past diskSpaceCleanForciblyRatio: REFUSE_PUTS deletes only files every consumer "
        "group consumed (or the tier holds), then refuses puts; DELETE_OLDEST deletes the "
        "oldest files anyway, logging each loss at ERROR",
    )  # fmt: skip
    dispatcher_hold_max_bytes: int = _setting(
        "dispatcherRetentionHoldMaxBytes", 16 * 1024**3, "bytes",
        "how far a lagging plugged-in dispatcher (a tier uploader) may hold CommitLog clean-up "
        "back; past it files go anyway, with a warning",
        minimum=0, maximum=2**62,
    )  # fmt: skip

    # -- tiered storage (issue 15; seed 000): tieredBackendServiceProvider, tieredStore* keys ----
    # RocketMQ's tieredstore MessageStoreConfig keys and defaults (stratamq/tiered/; the store
    # never reads them: the tier plugs into it from outside). Tiering is on when
    # tieredBackendServiceProvider is set, or messageStorePlugIn names RocketMQ's
    # TieredMessageStore.
    message_store_plug_in: str = _setting(
        "messageStorePlugIn", "", "class",
        "RocketMQ's store plug-in chain: org.apache.rocketmq.tieredstore.TieredMessageStore "
        "turns tiered storage on (the only plug-in StrataMQ has)",
        check=_one_of("", TIERED_MESSAGE_STORE),
    )  # fmt: skip
    tiered_backend_service_provider: str = _setting(
        "tieredBackendServiceProvider", "", "memory|posix|s3",
        "where tiered history goes ('' = no tier unless messageStorePlugIn is set): memory (lost "
        "at exit; tests), posix (a directory), s3 (fsspec/s3fs; other fsspec URLs work too); "
        "RocketMQ's MemoryFileSegment / PosixFileSegment class names are accepted",
        check=_tier_provider,
    )  # fmt: skip
    tiered_metadata_service_provider: str = _setting(
        "tieredMetadataServiceProvider", TIERED_METADATA_STORE, "class",
        "tier metadata store: <storePathRootDir>/config/tieredStoreMetadata.json "
        "(docs/formats/tier-metadata.md)",
        check=_one_of(TIERED_METADATA_STORE),
    )  # fmt: skip
    tiered_store_file_path: str = _setting(
        "tieredStoreFilePath", "", "path|url",
        "tier root: a directory (posix) or a URL such as s3://bucket/prefix (s3)",
    )  # fmt: skip
    tiered_store_s3_endpoint: str = _setting(
        "tieredStoreS3Endpoint", "", "url",
        "endpoint of an S3-compatible server (http://host:port); '' = AWS. Credentials come "
        "from the standard AWS environment variables and files",
    )  # fmt: skip
    max_msgs_num_batch: int = _setting(
        "maxMsgsNumBatch", 64, "messages",
        "most messages one online lookup returns (stratamq message query --max is capped to it)",
        minimum=1, maximum=100_000,
    )  # fmt: skip
    tiered_store_s3_create_bucket: bool = _setting(
        "tieredStoreS3CreateBucket", False, "bool",
        "s3: create the bucket of tieredStoreFilePath at start-up when it does not exist "
        "(false: a missing bucket stops the start with an error naming it)",
    )  # fmt: skip
    tiered_storage_level: TieredStorageLevel = _setting(
        "tieredStorageLevel", TieredStorageLevel.NOT_IN_DISK,
        "DISABLE|NOT_IN_DISK|NOT_IN_MEM|FORCE",
        "which reads the tier serves: none, offsets the local store no longer has (default), "
        "also those not in memory (accessMessageInMemoryMaxRatio), or every offset it holds",
    )  # fmt: skip
    access_message_in_memory_max_ratio: int = _setting(
        "accessMessageInMemoryMaxRatio", 40, "%",
        "NOT_IN_MEM: a record is in memory when it is within this share of physical memory "
        "from the CommitLog's end",
        minimum=0, maximum=100,
    )  # fmt: skip
    tiered_store_file_reserved_time: int = _setting(
        "tieredStoreFileReservedTime", 72, "hours",
        "tier files whose newest message is older than this are deleted (independent of "
        "fileReservedTime)",
        minimum=0,
    )  # fmt: skip
    tiered_store_delete_file_enable: bool = _setting(
        "tieredStoreDeleteFileEnable", True, "bool", "delete expired tier files"
    )
    tiered_store_delete_file_interval: int = _setting(
        "tieredStoreDeleteFileInterval", 3_600_000, "ms",
        "how often expired tier files are looked for",
        minimum=1,
    )  # fmt: skip
    commit_log_rolling_interval: int = _setting(
        "commitLogRollingInterval", 24, "hours",
        "a queue's tier CommitLog file older than this rolls to a new file",
        minimum=0,
    )  # fmt: skip
    commit_log_rolling_minimum_size: int = _setting(
        "commitLogRollingMinimumSize", 16 * 1024 * 1024, "bytes",
        "...but only once it holds at least this much",
        minimum=0,
    )  # fmt: skip
    tiered_store_commit_log_max_size: int = _setting(
        "tieredStoreCommitLogMaxSize", 1024 * 1024 * 1024, "bytes",
        "size at which a queue's tier CommitLog file rolls",
        minimum=OS_PAGE_SIZE, maximum=2**62,
    )  # fmt: skip
    tiered_store_consume_queue_max_size: int = _setting(
        "tieredStoreConsumeQueueMaxSize", 100 * 1024 * 1024, "bytes",
        "size at which a queue's tier ConsumeQueue file rolls (whole 20-byte units)",
        minimum=CQ_UNIT_SIZE, maximum=2**62,
    )  # fmt: skip
    tiered_store_group_commit: bool = _setting(
        "tieredStoreGroupCommit", True, "bool", "batch uploads (false: upload every scan)"
    )
    tiered_store_group_commit_timeout: int = _setting(
        "tieredStoreGroupCommitTimeout", 30_000, "ms",
        "a queue's batch goes once its oldest waiting message is this old",
        minimum=0,
    )  # fmt: skip
    tiered_store_group_commit_count: int = _setting(
        "tieredStoreGroupCommitCount", 4096, "messages",
        "a queue's batch goes once this many messages wait",
        minimum=1,
    )  # fmt: skip
    tiered_store_group_commit_size: int = _setting(
        "tieredStoreGroupCommitSize", 32 * 1024 * 1024, "bytes",
        "a queue's batch goes once this many bytes wait (and is at most this large)",
        minimum=1,
    )  # fmt: skip
    tiered_store_max_group_commit_count: int = _setting(
        "tieredStoreMaxGroupCommitCount", 10_000, "messages",
        "most messages one tier file buffers before an upload must drain it",
        minimum=1,
    )  # fmt: skip
    tiered_store_max_pending_limit: int = _setting(
        "tieredStoreMaxPendingLimit", 10_000, "uploads",
        "most tier uploads queued or running at once (more wait for one to finish)",
        minimum=1,
    )  # fmt: skip
    tiered_store_index_file_max_hash_slot_num: int = _setting(
        "tieredStoreIndexFileMaxHashSlotNum", 5_000_000, "slots",
        "hash slots of one tier index file (docs/formats/tier-index.md)",
        minimum=1, maximum=(INT_MAX - 28) // 8,
    )  # fmt: skip
    tiered_store_index_file_max_index_num: int = _setting(
        "tieredStoreIndexFileMaxIndexNum", 20_000_000, "entries",
        "entries of one tier index file before it is sealed and a new one started",
        minimum=2, maximum=(INT_MAX - 28) // 32,
    )  # fmt: skip
    tiered_store_index_file_rolling_idle_interval: int = _setting(
        "tieredStoreIndexFileRollingIdleInterval", 3 * 60 * 60 * 1000, "ms",
        "a tier index file that took no entry for this long is sealed and uploaded, full or "
        "not (RocketMQ's rule; a sealed file is its whole slot table, whatever it holds)",
        minimum=0, maximum=INT_MAX,
    )  # fmt: skip
    read_ahead_cache_enable: bool = _setting(
        "readAheadCacheEnable", True, "bool",
        "cache what one ranged tier read brought in, for the reads that follow it"
    )
    read_ahead_message_count_threshold: int = _setting(
        "readAheadMessageCountThreshold", 4096, "messages",
        "most messages one read-ahead brings in",
        minimum=1,
    )  # fmt: skip
    read_ahead_message_size_threshold: int = _setting(
        "readAheadMessageSizeThreshold", 16 * 1024 * 1024, "bytes",
        "most bytes one read-ahead brings in",
        minimum=1,
    )  # fmt: skip
    read_ahead_cache_expire_duration: int = _setting(
        "readAheadCacheExpireDuration", 15_000, "ms",
        "a read-ahead entry not read or written for this long is dropped",
        minimum=1,
    )  # fmt: skip
    read_ahead_cache_size_threshold_rate: float = _setting(
        "readAheadCacheSizeThresholdRate", 0.3, "ratio",
        "read-ahead cache size as a share of the memory the process may use (0..1]",
        check=_rate,
    )  # fmt: skip

    # -- ConsumeQueue store (issue 4; seed 003) ---------------------------------------------------
    store_type: str = _setting(
        "storeType", "default", "default|defaultRocksDB",
        "ConsumeQueue store: one file per queue, or RocksDB; an existing store keeps its type",
        check=_one_of("default", "defaultRocksDB"),  # consume_queue_store.STORE_TYPES
    )  # fmt: skip
    rocksdb_cq_double_write_enable: bool = _setting(
        "rocksdbCQDoubleWriteEnable", False, "bool",
        "dispatch to both ConsumeQueue stores so either can serve",
    )  # fmt: skip

    # -- compaction topics (issue 16; seed 001): compaction* keys --------------------------------
    enable_compaction: bool = _setting(
        "enableCompaction", True, "bool",
        "split compaction topics (cleanup.policy=COMPACTION) into CompactionLogs and compact "
        "them in the background",
    )  # fmt: skip
    compaction_mapped_file_size: int = _setting(
        "compactionMappedFileSize", 100 * 1024 * 1024, "bytes",
        "size of a CompactionLog file (an existing queue keeps the size found on disk)",
        minimum=OS_PAGE_SIZE,
    )  # fmt: skip
    compaction_cq_mapped_file_size: int = _setting(
        "compactionCqMappedFileSize", 10 * 1024 * 1024, "bytes",
        "size of a compaction batch ConsumeQueue file, rounded down to whole 64-byte units",
        minimum=2 * 64,  # a unit and the end unit
    )  # fmt: skip
    compaction_schedule_internal: int = _setting(
        "compactionScheduleInternal", 15 * 60 * 1000, "ms",
        "how often each compaction topic's queues get a compaction round (RocketMQ's spelling)",
        minimum=1,
    )  # fmt: skip
    max_offset_map_size: int = _setting(
        "maxOffsetMapSize", 100 * 1024 * 1024, "bytes",
        "memory of the OffsetMaps (md5(key) -> offset), shared by the compaction threads",
        minimum=24 * 1024,
    )  # fmt: skip
    compaction_thread_num: int = _setting(
        "compactionThreadNum", 6, "threads",
        "queues compacted at once (at most the CPU count); each gets "
        "maxOffsetMapSize / threads of OffsetMap",
        minimum=1, maximum=256,
    )  # fmt: skip

    def __post_init__(self) -> None:
        _validate(self)
        _check_tier(self)
        # The index layout lives in index_file.py alone. An index file must fit one int-sized
        # map like every RocketMQ file.
        index_bytes = index_file_size(self.max_hash_slot_num, self.max_index_num)
        if index_bytes > INT_MAX:
            raise InvalidSetting(
                f"maxHashSlotNum={self.max_hash_slot_num} and maxIndexNum={self.max_index_num} "
                f"make a {index_bytes}-byte index file: {HEADER_SIZE} + {SLOT_SIZE} x "
                f"maxHashSlotNum + {ENTRY_SIZE} x "
                f"maxIndexNum must be at most {INT_MAX} bytes")

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
        return _from_props(cls, props, **overrides)


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
    if isinstance(default, float):
        try:
            return float(raw)
        except ValueError:
            raise ValueError(f"{f.metadata['key']} must be a number, not {raw!r}") from None
    if isinstance(default, Enum):
        try:
            return type(default)(raw)
        except ValueError:
            choices = "|".join(m.value for m in type(default))
            raise ValueError(f"{f.metadata['key']} must be {choices}, not {raw!r}") from None
    return raw


def _settings_table(cls: type) -> list[dict[str, str]]:
    return [
        {
            "key": f.metadata["key"],
            "default": str(f.default.value if isinstance(f.default, Enum) else f.default),
            "unit": f.metadata["unit"],
            "range": _range_text(f),
            "doc": f.metadata["doc"],
        }
        for f in dataclasses.fields(cls)
    ]


def settings_table() -> list[dict[str, str]]:
    """Every setting with key, default, unit and range, for docs and ``stratamq config``."""
    return _settings_table(StoreConfig)


# -- the broker (issue 5) -----------------------------------------------------------------------


@dataclass
class BrokerConfig:
    """The gRPC broker's settings (``stratamq broker start``); the store's are in StoreConfig.

    The port clients connect to is ``listenPort`` (in StoreConfig, default 10911): in Apache
    RocketMQ that key is the port clients reach the broker on, and StrataMQ's only client
    protocol is gRPC, so the same number serves gRPC and is the store host written into offset
    message ids. (RocketMQ's separate proxy listens on ``grpcServerPort`` 8081; StrataMQ has no
    separate proxy, so it has no second port.)
    """

    broker_name: str = _setting("brokerName", "broker-a", "name", "broker name in routes",
                                check=_name)
    broker_cluster_name: str = _setting(
        "brokerClusterName", "DefaultCluster", "name", "cluster name reported to admin tools",
        check=_name,
    )  # fmt: skip
    listen_host: str = _setting(
        "listenHost", "127.0.0.1", "host",
        "address the gRPC server binds (StrataMQ's own key); 0.0.0.0 for every interface",
        check=_name,
    )  # fmt: skip
    channel_expired_timeout: int = _setting(
        "channelExpiredTimeout", 120_000, "ms",
        "a client with no heartbeat (or settings) for this long is dropped from the group's "
        "clients (RocketMQ's scanNotActiveChannel); clients heartbeat every 10 s",
        minimum=1000,
    )  # fmt: skip
    auto_create_topic_enable: bool = _setting(
        "autoCreateTopicEnable", False, "bool",
        "create an unknown topic on first send or route query (NORMAL, defaultTopicQueueNums)",
    )  # fmt: skip
    auto_create_subscription_group: bool = _setting(
        "autoCreateSubscriptionGroup", True, "bool", "create an unknown consumer group on first use"
    )
    default_topic_queue_nums: int = _setting(
        "defaultTopicQueueNums", 8, "queues", "queues of a topic created without --queues",
        minimum=1, maximum=1024,
    )  # fmt: skip
    grpc_thread_pool_nums: int = _setting(
        "grpcThreadPoolNums", 16, "threads",
        "threads running the broker's blocking store calls (reads, pop-state writes); gRPC "
        "itself is event-driven, so open streams and long polls hold none",
        minimum=1,
    )  # fmt: skip
    default_invisible_time_mills: int = _setting(
        "defaultInvisibleTimeMills", 60_000, "ms",
        "invisible time of a receive that names none (PushConsumer's auto-renew receives)",
        minimum=1,
    )  # fmt: skip
    min_invisible_time_mills_for_recv: int = _setting(
        "minInvisibleTimeMillsForRecv", 10_000, "ms", "shortest invisible time a receive may ask",
        minimum=1,
    )  # fmt: skip
    max_invisible_time_mills: int = _setting(
        "maxInvisibleTimeMills", 12 * 3600 * 1000, "ms", "longest invisible time accepted",
        minimum=1,
    )  # fmt: skip
    max_long_polling_time_mills: int = _setting(
        "grpcClientConsumerMaxLongPollingTimeoutMillis", 20_000, "ms",
        "longest a receive or pull waits for messages",
        minimum=0,
    )  # fmt: skip
    max_pop_polling_size: int = _setting(
        "maxPopPollingSize", 100_000, "calls",
        "receives and pulls waiting for messages at once; past it TOO_MANY_REQUESTS "
        "(polling full)",
        minimum=0,
    )  # fmt: skip
    pop_polling_size: int = _setting(
        "popPollingSize", 1024, "calls",
        "receives of one consumer group and topic waiting at once; past it TOO_MANY_REQUESTS",
        minimum=0,
    )  # fmt: skip
    pop_polling_size_per_client: int = _setting(
        "popPollingSizePerClient", 1024, "calls",
        "receives and pulls of one client (x-mq-client-id) waiting at once (StrataMQ's own "
        "key); past it TOO_MANY_REQUESTS",
        minimum=0,
    )  # fmt: skip
    default_retry_max_times: int = _setting(
        "retryMaxTimes", 16, "times",
        "retries of a new group: a message goes to %DLQ%<group> after 1 + this many deliveries",
        minimum=0, maximum=1000,
    )  # fmt: skip
    receive_batch_size: int = _setting(
        "grpcReceiveBatchSize", 32, "messages", "batch size the broker suggests to consumers",
        minimum=1,
    )  # fmt: skip
    pop_state_sync_write: bool = _setting(
        "popStateSyncWrite", False, "bool",
        "fsync the pop-state WAL on every receive/ack (survive power loss, not just SIGKILL)",
    )  # fmt: skip
    shutdown_grace_seconds: int = _setting(
        "shutdownGraceSeconds", 10, "s", "on SIGTERM, how long in-flight requests may finish",
        minimum=0,
    )  # fmt: skip
    timer_enable: bool = _setting(
        "timerWheelEnable", True, "bool", "accept DELAY messages (needs the timer service)"
    )
    transaction_check_interval: int = _setting(
        "transactionCheckInterval", 30_000, "ms",
        "how often open transactions are checked back with their producers",
        minimum=1,
    )  # fmt: skip
    transaction_timeout: int = _setting(
        "transactionTimeOut", 6_000, "ms",
        "age of a half message before its first check (unless the producer set an orphaned "
        "transaction recovery duration)",
        minimum=0,
    )  # fmt: skip
    transaction_check_max: int = _setting(
        "transactionCheckMax", 15, "checks",
        "checks of one transaction before its half moves to TRANS_CHECK_MAX_TIME_TOPIC "
        "(logged as an ERROR)",
        minimum=0,
    )  # fmt: skip
    acl_enable: bool = _setting("aclEnable", False, "bool", "verify clients' signatures")
    tls_enable: bool = _setting("tlsEnable", False, "bool", "serve gRPC over TLS only")
    metrics_exporter_type: str = _setting(
        "metricsExporterType", "DISABLE", "DISABLE|PROM",
        "PROM serves Prometheus /metrics on metricsPromExporterHost:metricsPromExporterPort",
        check=_one_of("DISABLE", "PROM"),
    )  # fmt: skip
    metrics_host: str = _setting(
        "metricsPromExporterHost", "127.0.0.1", "host",
        "address /metrics binds (loopback unless set; 0.0.0.0 for every interface)",
        check=_name,
    )  # fmt: skip
    metrics_port: int = _setting(
        "metricsPromExporterPort", 5557, "port",
        "Prometheus /metrics port (0: any free port); alias metricsPrometheusPort",
        minimum=0, maximum=65535,
    )  # fmt: skip
    console_listen_port: int = _setting(
        "consoleListenPort", 0, "port",
        "serve the web console (stratamq console) on 127.0.0.1:PORT inside the broker; 0: off",
        minimum=0, maximum=65535,
    )  # fmt: skip
    # -- DELAY messages, ACL, TLS, metrics (issue 5, second half) --------------------------------
    timer_max_delay_sec: int = _setting(
        "timerMaxDelaySec", 3 * 24 * 3600, "s",
        "furthest-ahead delivery time a DELAY message may ask (ILLEGAL_DELIVERY_TIME beyond)",
        minimum=1,
    )  # fmt: skip
    timer_flush_interval_ms: int = _setting(
        "timerFlushIntervalMs", 1_000, "ms",
        "how often the timer index (RocksDB, no WAL) and timercheck are made durable",
        minimum=1,
    )  # fmt: skip
    acl_file: str = _setting(
        "aclFile", "", "path",
        "accounts file: RocketMQ's plain_acl.yml (.yml/.yaml) or the same fields as JSON "
        "(accessKey, secretKey, admin, defaultTopicPerm, defaultGroupPerm, topicPerms, "
        "groupPerms); see stratamq/broker/acl.py",
    )  # fmt: skip
    acl_access_key: str = _setting(
        "aclAccessKey", "", "text", "an admin account's access key, besides those in aclFile"
    )
    acl_secret_key: str = _setting("aclSecretKey", "", "text", "that account's secret key")
    acl_signature_window_sec: int = _setting(
        "aclSignatureWindowSec", 900, "s",
        "a request whose x-mq-date-time is further than this from now is UNAUTHORIZED",
        minimum=1,
    )  # fmt: skip
    tls_server_cert_path: str = _setting(
        "tls.server.certPath", "", "path", "PEM certificate chain served when tlsEnable"
    )
    tls_server_key_path: str = _setting(
        "tls.server.keyPath", "", "path", "PEM private key of that certificate"
    )
    tls_server_trust_cert_path: str = _setting(
        "tls.server.trustCertPath", "", "path", "PEM CA bundle to verify client certificates"
    )
    tls_server_need_client_auth: str = _setting(
        "tls.server.need.client.auth", "none", "none|optional|require",
        "whether clients must present a certificate signed by tls.server.trustCertPath",
        check=_one_of("none", "optional", "require", fold_case=True),
    )  # fmt: skip
    tls_client_trust_cert_path: str = _setting(
        "tls.client.trustCertPath", "", "path",
        "PEM CA bundle the broker's own console verifies tls.server.certPath against "
        "(consoleListenPort with tlsEnable); empty: tls.server.certPath itself, pinned",
    )  # fmt: skip
    # -- RocketMQ 4.x remoting (stratamq/remoting/) --
    remoting_listen_port: int = _setting(
        "remotingListenPort", 0, "port",
        "port serving RocketMQ 4.x remoting clients (StrataMQ's own key), the address "
        "registered with namesrvAddr; 0 (or the listen port): the listen port, one port for "
        "both protocols (gRPC relayed to a loopback port); another port: remoting there alone "
        "and gRPC alone on the listen port; -1: no remoting",
        minimum=-1, maximum=65535,
    )  # fmt: skip
    namesrv_addr: str = _setting(
        "namesrvAddr", "", "host:port;...",
        "NameServers the broker registers its remoting address and topics with (at start, "
        "when a topic is created, every registerNameServerPeriod)",
    )  # fmt: skip
    message_delay_level: str = _setting(
        "messageDelayLevel", "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h",
        "levels", "delays of RocketMQ 4 delay levels 1, 2, ... (s, m, h, d): DELAY sends and "
        "consumers' send-backs (%RETRY%<group>) over remoting",
        check=lambda v: _delay_levels_problem(v),
    )  # fmt: skip
    register_name_server_period: int = _setting(
        "registerNameServerPeriod", 30_000, "ms", "how often the broker registers with namesrvAddr",
        minimum=10_000, maximum=60_000,
    )  # fmt: skip

    # -- a cluster on etcd (issue 28; docs/CLUSTER.md) -------------------------------------------
    broker_id: int = _setting(
        "brokerId", 0, "id",
        "this broker's id in its group (brokerName); in controller mode ids only tell the "
        "group's brokers apart: the elected master is announced as broker id 0",
        minimum=0, maximum=2**62,
    )  # fmt: skip
    enable_controller_mode: bool = _setting(
        "enableControllerMode", False, "bool",
        "join the cluster on etcdEndpoints: register under a lease, elect each group's master "
        "(brokerRole is then ignored: the master acknowledges as SYNC_MASTER)",
    )  # fmt: skip
    etcd_endpoints: str = _setting(
        "etcdEndpoints", "", "urls",
        "the etcd members' client URLs, comma-separated (http://10.0.0.1:2379,...)",
    )  # fmt: skip
    etcd_prefix: str = _setting(
        "etcdPrefix", "", "key",
        "where the cluster's keys live in etcd (default /stratamq/<brokerClusterName>)",
    )  # fmt: skip
    etcd_lease_ttl_ms: int = _setting(
        "etcdLeaseTtlMs", 4_000, "ms",
        "a broker that has not renewed its etcd lease for this long is dead; a master stops "
        "accepting writes after two thirds of it without a renewal (fencing)",
        minimum=2_000, maximum=600_000,
    )  # fmt: skip
    etcd_failsafe_mode: bool = _setting(
        "etcdFailsafeMode", False, "bool",
        "Patroni's failsafe mode: with etcd unreachable, a master keeps accepting writes while "
        "every broker that could replace it confirms it has lost etcd too",
    )  # fmt: skip
    broker_election_priority: int = _setting(
        "brokerElectionPriority", INT_MAX, "rank",
        "among candidates of equal epoch and max offset, the lowest value is elected",
        minimum=0,
    )  # fmt: skip
    enable_elect_unclean_master: bool = _setting(
        "enableElectUncleanMaster", False, "bool",
        "when no member of the SyncStateSet is alive, elect another broker of the group "
        "(messages acknowledged by the old master may be lost: logged at ERROR)",
    )  # fmt: skip

    ha_max_time_slave_not_catchup: int = _setting(
        "haMaxTimeSlaveNotCatchup", 15_000, "ms",
        "controller mode: a slave not caught up (within haMaxGapNotInSync) for this long leaves "
        "its master's SyncStateSet, and the master acknowledges puts without it",
        minimum=1,
    )  # fmt: skip

    def cluster_prefix(self) -> str:
        """``etcdPrefix``, or its default ``/stratamq/<brokerClusterName>``."""
        return (self.etcd_prefix or f"/stratamq/{self.broker_cluster_name}").rstrip("/")

    def __post_init__(self) -> None:
        _validate(self)
        for key, value in (("minInvisibleTimeMillsForRecv", self.min_invisible_time_mills_for_recv),
                           ("defaultInvisibleTimeMills", self.default_invisible_time_mills)):
            if value > self.max_invisible_time_mills:
                raise InvalidSetting(f"{key}={value} is out of range: must be at most "
                                     f"maxInvisibleTimeMills ({self.max_invisible_time_mills} ms)")
        if self.enable_controller_mode and not self.etcd_endpoints.strip():
            raise InvalidSetting("enableControllerMode=true needs etcdEndpoints (the etcd "
                                 "members' client URLs)")


def parse_delay_levels(text: str) -> list[int]:
    """``messageDelayLevel`` ("1s 5s 10s ... 2h") as milliseconds per level; ValueError."""
    units = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
    out = []
    for item in text.split():
        number, unit = item[:-1], item[-1:]
        if unit not in units or not number.isdigit():
            raise ValueError(f"{item!r} is not a delay like 10s, 1m, 2h or 1d")
        out.append(int(number) * units[unit])
    if not out:
        raise ValueError("no delay level")
    return out


def _delay_levels_problem(value: Any) -> str | None:
    try:
        parse_delay_levels(str(value))
    except ValueError as exc:
        return str(exc)
    return None


def _from_props(cls: type, props: dict[str, str], **overrides: Any) -> Any:
    """Build ``cls`` from ``broker.conf``-style key/values; unknown keys raise UnknownSettings."""
    by_key = {f.metadata["key"]: f for f in dataclasses.fields(cls)}
    unknown = sorted(k for k in props if k not in by_key)
    if unknown:
        raise UnknownSettings("unknown settings: " + ", ".join(unknown))
    values = {by_key[k].name: _convert(by_key[k], v.strip()) for k, v in props.items()}
    return cls(**{**values, **overrides})


# Settings never shown to a client asking for the broker's config (mqadmin getBrokerConfig).
_SECRET_KEYS = frozenset({"aclSecretKey"})


def as_properties(*configs: Any) -> dict[str, str]:
    """Every setting of ``configs`` (StoreConfig, BrokerConfig) as broker.conf text by key
    (booleans as Java writes them), secrets left out: what ``GET_BROKER_CONFIG`` answers."""
    out: dict[str, str] = {}
    for config in configs:
        for f in dataclasses.fields(config):
            key, value = f.metadata["key"], getattr(config, f.name)
            if key in _SECRET_KEYS:
                continue
            out[key] = (str(value).lower() if isinstance(value, bool)
                        else str(value.value if isinstance(value, Enum) else value))
    return out


def broker_settings_table() -> list[dict[str, str]]:
    """BrokerConfig's keys with default, unit and range (StoreConfig's are in settings_table)."""
    return _settings_table(BrokerConfig)


# The broker.conf reader lives in its own module (it needs the classes above).
from stratamq.config_file import load_broker_conf  # noqa: E402
