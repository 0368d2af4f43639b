"""The embedded store's settings (``StoreConfig``) and the choices they take.

Settings use RocketMQ's ``broker.conf`` key names where RocketMQ has the setting, so an existing
``broker.conf`` reads unchanged; how a setting is declared and checked is in ``settings.py``.
The broker's own settings are in ``config.py``, which re-exports everything here.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from stratamq.limits import CQ_UNIT_SIZE, INT_MAX, OS_PAGE_SIZE
from stratamq.message import Host
from stratamq.settings import (
    InvalidSetting,
    check_host_port,
    check_hours,
    check_ip,
    check_rate,
    from_props,
    one_of,
    setting,
    settings_table_of,
    validate,
)
from stratamq.store.index_file import ENTRY_SIZE, HEADER_SIZE, SLOT_SIZE
from stratamq.store.index_file import file_size as index_file_size

__all__ = ["MAX_MESSAGE_SIZE_LIMIT", "BrokerRole", "DiskFullPolicy", "FlushDiskType",
           "StoreConfig", "TieredStorageLevel", "settings_table", "tier_provider"]

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

    store_path_root_dir: str = setting(
        "storePathRootDir", "./data", "path", "root of the store: commitlog/, consumequeue/, ..."
    )
    mapped_file_size_commit_log: int = setting(
        "mappedFileSizeCommitLog", 1024 * 1024 * 1024, "bytes",
        "size of a new CommitLog segment (an existing store keeps the size found on disk)",
        minimum=OS_PAGE_SIZE,
    )  # fmt: skip
    mapped_file_size_consume_queue: int = setting(
        "mappedFileSizeConsumeQueue", 300_000 * CQ_UNIT_SIZE, "bytes",
        "size of a new ConsumeQueue file, rounded up to a whole number of 20-byte units",
        minimum=CQ_UNIT_SIZE, maximum=INT_MAX // CQ_UNIT_SIZE * CQ_UNIT_SIZE,
    )  # fmt: skip
    flush_disk_type: FlushDiskType = setting(
        "flushDiskType", FlushDiskType.ASYNC_FLUSH, "ASYNC_FLUSH|SYNC_FLUSH",
        "SYNC_FLUSH: a put returns after its bytes are on disk (group commit)",
    )  # fmt: skip
    flush_interval_commit_log: int = setting(
        "flushIntervalCommitLog", 500, "ms", "async flush: how often the flusher wakes",
        minimum=1,
    )  # fmt: skip
    flush_commit_log_least_pages: int = setting(
        "flushCommitLogLeastPages", 4, "pages", "async flush: dirty pages needed to flush",
        minimum=0,
    )  # fmt: skip
    flush_commit_log_thorough_interval: int = setting(
        "flushCommitLogThoroughInterval", 10_000, "ms",
        "async flush: flush whatever is dirty at least this often",
        minimum=0,
    )  # fmt: skip
    sync_flush_timeout: int = setting(
        "syncFlushTimeout", 5_000, "ms", "sync flush: wait this long, then FLUSH_DISK_TIMEOUT",
        minimum=1,
    )  # fmt: skip
    sync_flush_group_linger: int = setting(
        "syncFlushGroupLinger", 10, "ms",
        "sync flush, broker saturated: a flush starts no sooner than this after the last one "
        "(fewer, larger groups); 0 flushes at once",
        minimum=0, maximum=1_000,
    )  # fmt: skip
    flush_interval_consume_queue: int = setting(
        "flushIntervalConsumeQueue", 1_000, "ms", "how often ConsumeQueues are flushed",
        minimum=1,
    )  # fmt: skip
    flush_consume_queue_least_pages: int = setting(
        "flushConsumeQueueLeastPages", 2, "pages", "dirty pages needed to flush a ConsumeQueue",
        minimum=0,
    )  # fmt: skip
    flush_consume_queue_thorough_interval: int = setting(
        "flushConsumeQueueThoroughInterval", 60_000, "ms",
        "flush every ConsumeQueue and the checkpoint at least this often",
        minimum=0,
    )  # fmt: skip
    max_message_size: int = setting(
        "maxMessageSize", 4 * 1024 * 1024, "bytes", "largest body a put accepts",
        minimum=1, maximum=MAX_MESSAGE_SIZE_LIMIT,
    )  # fmt: skip
    check_crc_on_recover: bool = setting(
        "checkCRCOnRecover", True, "bool", "verify body CRCs while recovering"
    )
    broker_ip: str = setting(
        "brokerIP1", "127.0.0.1", "ip", "store host address written into records and msg ids",
        check=check_ip,
    )  # fmt: skip
    listen_port: int = setting(
        "listenPort", 10911, "port", "store host port written into records and msg ids",
        minimum=0, maximum=65535,
    )  # fmt: skip
    max_transfer_count_on_message_in_memory: int = setting(
        "maxTransferCountOnMessageInMemory", 32, "messages", "default max_count of one get",
        minimum=1,
    )  # fmt: skip
    max_transfer_bytes_on_message_in_memory: int = setting(
        "maxTransferBytesOnMessageInMemory", 256 * 1024, "bytes", "default max_bytes of one get",
        minimum=1,
    )  # fmt: skip
    pre_allocate_mapped_file: bool = setting(
        "preAllocateMappedFile", True, "bool",
        "create the next CommitLog segment in the background before it is needed",
    )  # fmt: skip
    dispatch_interval: int = setting(
        "dispatchIntervalMs", 1, "ms", "how long the dispatcher sleeps when it has caught up",
        minimum=1,
    )  # fmt: skip
    destroy_mapped_file_interval_forcibly: int = setting(
        "destroyMapedFileIntervalForcibly", 120_000, "ms",
        "a segment still held by a reader is unmapped anyway after this long",
        minimum=0,
    )  # fmt: skip

    # -- master/slave replication (issue 17; seed 004 section 1.6): brokerRole, ha* keys -----------
    broker_role: BrokerRole = setting(
        "brokerRole", BrokerRole.ASYNC_MASTER, "ASYNC_MASTER|SYNC_MASTER|SLAVE",
        "SYNC_MASTER: a put returns once a slave has its bytes; SLAVE: copy haMasterAddress's "
        "CommitLog and refuse puts",
    )  # fmt: skip
    ha_listen_port: int = setting(
        "haListenPort", 10912, "port", "a master's replication port (0: any free port)",
        minimum=0, maximum=65535,
    )  # fmt: skip
    ha_master_address: str = setting(
        "haMasterAddress", "", "host:port", "a slave's master: its haListenPort",
        check=check_host_port,
    )  # fmt: skip
    ha_send_heartbeat_interval: int = setting(
        "haSendHeartbeatInterval", 5_000, "ms",
        "a slave reports its offset at least this often (and the master sends an empty frame "
        "when idle this long); a lost link is retried after this long",
        minimum=1,
    )  # fmt: skip
    ha_housekeeping_interval: int = setting(
        "haHousekeepingInterval", 20_000, "ms",
        "a replication link silent for this long is closed (and reconnected by the slave)",
        minimum=1,
    )  # fmt: skip
    ha_transfer_batch_size: int = setting(
        "haTransferBatchSize", 32 * 1024, "bytes", "most CommitLog bytes in one transfer frame",
        minimum=1, maximum=4 * 1024 * 1024,
    )  # fmt: skip
    ha_max_gap_not_in_sync: int = setting(
        "haMaxGapNotInSync", 256 * 1024 * 1024, "bytes",
        "SYNC_MASTER: a slave further behind than this is not in sync, and with none in sync "
        "puts answer SLAVE_NOT_AVAILABLE",
        minimum=1,
    )  # fmt: skip
    ha_flow_control_enable: bool = setting(
        "haFlowControlEnable", False, "bool",
        "limit each slave's transfer to maxHaTransferByteInSecond",
    )  # fmt: skip
    max_ha_transfer_byte_in_second: int = setting(
        "maxHaTransferByteInSecond", 100 * 1024 * 1024, "bytes/s",
        "with haFlowControlEnable, most bytes sent to one slave per second",
        minimum=1, maximum=2**62,
    )  # fmt: skip
    ha_new_slave_transfer_from: str = setting(
        "haNewSlaveTransferFrom", "LAST_SEGMENT", "LAST_SEGMENT|MIN_OFFSET",
        "where a master starts an empty slave (one reporting offset 0): the start of its last "
        "CommitLog segment (RocketMQ, seed 004) or its oldest byte (copy everything it holds)",
        check=one_of("LAST_SEGMENT", "MIN_OFFSET"),
    )  # fmt: skip
    store_path_epoch_file: str = setting(
        "storePathEpochFile", "", "path",
        "where each start of a new master life (and each slave truncation) is recorded, so a "
        "slave that diverged from its master is found and cut (default <root>/epochFileCheckpoint)",
    )  # fmt: skip
    ha_master_endpoint: str = setting(
        "haMasterEndpoint", "", "host:port",
        "a slave's master's client (gRPC) endpoint, for state sync and routes (default: "
        "haMasterAddress's host and port - 1, RocketMQ's listenPort/haListenPort pairing)",
        check=check_host_port,
    )  # fmt: skip
    ha_state_sync_interval: int = setting(
        "haStateSyncInterval", 3_000, "ms",
        "a slave broker copies its master's topics, groups, consumer offsets and pop state "
        "this often (the most progress a consumer moving to the slave can repeat)",
        minimum=100,
    )  # fmt: skip

    # -- index (issue 3; docs/formats/index-file.md) --------------------------------------------
    message_index_enable: bool = setting(
        "messageIndexEnable", True, "bool", "index every message's KEYS and UNIQ_KEY"
    )
    max_hash_slot_num: int = setting(
        "maxHashSlotNum", 5_000_000, "slots", "hash slots of one index file",
        minimum=1,
    )  # fmt: skip
    max_index_num: int = setting(
        "maxIndexNum", 20_000_000, "entries", "entries of one index file before a new one",
        minimum=1,
    )  # fmt: skip

    # -- clean-up (issue 3) ----------------------------------------------------------------------
    file_reserved_time: int = setting(
        "fileReservedTime", 72, "hours", "CommitLog files older than this may be deleted",
        minimum=0,
    )  # fmt: skip
    delete_when: str = setting(
        "deleteWhen", "04", "hours;hours", "hours of the day (;-separated) expired files go",
        check=check_hours,
    )  # fmt: skip
    disk_max_used_space_ratio: int = setting(
        "diskMaxUsedSpaceRatio", 75, "%", "past this disk usage expired files go at any hour",
        minimum=1, maximum=99,
    )  # fmt: skip
    disk_space_clean_forcibly_ratio: int = setting(
        "diskSpaceCleanForciblyRatio", 85, "%",
        "past this disk usage the oldest files go even if not expired",
        minimum=1, maximum=99,
    )  # fmt: skip
    disk_space_warning_level_ratio: int = setting(
        "diskSpaceWarningLevelRatio", 90, "%", "past this disk usage puts are rejected",
        minimum=1, maximum=99,
    )  # fmt: skip
    clean_resource_interval: int = setting(
        "cleanResourceInterval", 10_000, "ms", "how often the clean-up service looks",
        minimum=1,
    )  # fmt: skip
    delete_commit_log_files_interval: int = setting(
        "deleteCommitLogFilesInterval", 100, "ms", "pause between two deleted CommitLog files",
        minimum=0,
    )  # fmt: skip
    delete_consume_queue_files_interval: int = setting(
        "deleteConsumeQueueFilesInterval", 100, "ms",
        "pause between two deleted ConsumeQueue files",
        minimum=0,
    )  # fmt: skip
    delete_file_batch_max: int = setting(
        "deleteFileBatchMax", 10, "files", "most CommitLog files one clean-up pass deletes",
        minimum=1,
    )  # fmt: skip
    clean_file_forcibly_enable: bool = setting(
        "cleanFileForciblyEnable", True, "bool",
        "past diskSpaceCleanForciblyRatio, delete unexpired files too (false: never)",
    )  # fmt: skip
    disk_full_policy: DiskFullPolicy = setting(
        "diskFullPolicy", DiskFullPolicy.REFUSE_PUTS, "policy",
        "past diskSpaceCleanForciblyRatio: REFUSE_PUTS deletes only files every consumer "
        "group consumed (or the tier holds), then refuses puts; DELETE_OLDEST deletes the "
        "oldest files anyway, logging each loss at ERROR",
    )  # fmt: skip
    dispatcher_hold_max_bytes: int = setting(
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
    message_store_plug_in: str = setting(
        "messageStorePlugIn", "", "class",
        "RocketMQ's store plug-in chain: org.apache.rocketmq.tieredstore.TieredMessageStore "
        "turns tiered storage on (the only plug-in StrataMQ has)",
        check=one_of("", TIERED_MESSAGE_STORE),
    )  # fmt: skip
    tiered_backend_service_provider: str = setting(
        "tieredBackendServiceProvider", "", "memory|posix|s3",
        "where tiered history goes ('' = no tier unless messageStorePlugIn is set): memory (lost "
        "at exit; tests), posix (a directory), s3 (fsspec/s3fs; other fsspec URLs work too); "
        "RocketMQ's MemoryFileSegment / PosixFileSegment class names are accepted",
        check=_tier_provider,
    )  # fmt: skip
    tiered_metadata_service_provider: str = setting(
        "tieredMetadataServiceProvider", TIERED_METADATA_STORE, "class",
        "tier metadata store: <storePathRootDir>/config/tieredStoreMetadata.json "
        "(docs/formats/tier-metadata.md)",
        check=one_of(TIERED_METADATA_STORE),
    )  # fmt: skip
    tiered_store_file_path: str = setting(
        "tieredStoreFilePath", "", "path|url",
        "tier root: a directory (posix) or a URL such as s3://bucket/prefix (s3)",
    )  # fmt: skip
    tiered_store_s3_endpoint: str = setting(
        "tieredStoreS3Endpoint", "", "url",
        "endpoint of an S3-compatible server (http://host:port); '' = AWS. Credentials come "
        "from the standard AWS environment variables and files",
    )  # fmt: skip
    max_msgs_num_batch: int = setting(
        "maxMsgsNumBatch", 64, "messages",
        "most messages one online lookup returns (stratamq message query --max is capped to it)",
        minimum=1, maximum=100_000,
    )  # fmt: skip
    tiered_store_s3_create_bucket: bool = setting(
        "tieredStoreS3CreateBucket", False, "bool",
        "s3: create the bucket of tieredStoreFilePath at start-up when it does not exist "
        "(false: a missing bucket stops the start with an error naming it)",
    )  # fmt: skip
    tiered_storage_level: TieredStorageLevel = setting(
        "tieredStorageLevel", TieredStorageLevel.NOT_IN_DISK,
        "DISABLE|NOT_IN_DISK|NOT_IN_MEM|FORCE",
        "which reads the tier serves: none, offsets the local store no longer has (default), "
        "also those not in memory (accessMessageInMemoryMaxRatio), or every offset it holds",
    )  # fmt: skip
    access_message_in_memory_max_ratio: int = setting(
        "accessMessageInMemoryMaxRatio", 40, "%",
        "NOT_IN_MEM: a record is in memory when it is within this share of physical memory "
        "from the CommitLog's end",
        minimum=0, maximum=100,
    )  # fmt: skip
    tiered_store_file_reserved_time: int = setting(
        "tieredStoreFileReservedTime", 72, "hours",
        "tier files whose newest message is older than this are deleted (independent of "
        "fileReservedTime)",
        minimum=0,
    )  # fmt: skip
    tiered_store_delete_file_enable: bool = setting(
        "tieredStoreDeleteFileEnable", True, "bool", "delete expired tier files"
    )
    tiered_store_delete_file_interval: int = setting(
        "tieredStoreDeleteFileInterval", 3_600_000, "ms",
        "how often expired tier files are looked for",
        minimum=1,
    )  # fmt: skip
    commit_log_rolling_interval: int = setting(
        "commitLogRollingInterval", 24, "hours",
        "a queue's tier CommitLog file older than this rolls to a new file",
        minimum=0,
    )  # fmt: skip
    commit_log_rolling_minimum_size: int = setting(
        "commitLogRollingMinimumSize", 16 * 1024 * 1024, "bytes",
        "...but only once it holds at least this much",
        minimum=0,
    )  # fmt: skip
    tiered_store_commit_log_max_size: int = setting(
        "tieredStoreCommitLogMaxSize", 1024 * 1024 * 1024, "bytes",
        "size at which a queue's tier CommitLog file rolls",
        minimum=OS_PAGE_SIZE, maximum=2**62,
    )  # fmt: skip
    tiered_store_consume_queue_max_size: int = setting(
        "tieredStoreConsumeQueueMaxSize", 100 * 1024 * 1024, "bytes",
        "size at which a queue's tier ConsumeQueue file rolls (whole 20-byte units)",
        minimum=CQ_UNIT_SIZE, maximum=2**62,
    )  # fmt: skip
    tiered_store_group_commit: bool = setting(
        "tieredStoreGroupCommit", True, "bool", "batch uploads (false: upload every scan)"
    )
    tiered_store_group_commit_timeout: int = setting(
        "tieredStoreGroupCommitTimeout", 30_000, "ms",
        "a queue's batch goes once its oldest waiting message is this old",
        minimum=0,
    )  # fmt: skip
    tiered_store_group_commit_count: int = setting(
        "tieredStoreGroupCommitCount", 4096, "messages",
        "a queue's batch goes once this many messages wait",
        minimum=1,
    )  # fmt: skip
    tiered_store_group_commit_size: int = setting(
        "tieredStoreGroupCommitSize", 32 * 1024 * 1024, "bytes",
        "a queue's batch goes once this many bytes wait (and is at most this large)",
        minimum=1,
    )  # fmt: skip
    tiered_store_max_group_commit_count: int = setting(
        "tieredStoreMaxGroupCommitCount", 10_000, "messages",
        "most messages one tier file buffers before an upload must drain it",
        minimum=1,
    )  # fmt: skip
    tiered_store_max_pending_limit: int = setting(
        "tieredStoreMaxPendingLimit", 10_000, "uploads",
        "most tier uploads queued or running at once (more wait for one to finish)",
        minimum=1,
    )  # fmt: skip
    tiered_store_index_file_max_hash_slot_num: int = setting(
        "tieredStoreIndexFileMaxHashSlotNum", 5_000_000, "slots",
        "hash slots of one tier index file (docs/formats/tier-index.md)",
        minimum=1, maximum=(INT_MAX - 28) // 8,
    )  # fmt: skip
    tiered_store_index_file_max_index_num: int = setting(
        "tieredStoreIndexFileMaxIndexNum", 20_000_000, "entries",
        "entries of one tier index file before it is sealed and a new one started",
        minimum=2, maximum=(INT_MAX - 28) // 32,
    )  # fmt: skip
    tiered_store_index_file_rolling_idle_interval: int = setting(
        "tieredStoreIndexFileRollingIdleInterval", 3 * 60 * 60 * 1000, "ms",
        "a tier index file that took no entry for this long is sealed and uploaded, full or "
        "not (RocketMQ's rule; a sealed file is its whole slot table, whatever it holds)",
        minimum=0, maximum=INT_MAX,
    )  # fmt: skip
    read_ahead_cache_enable: bool = setting(
        "readAheadCacheEnable", True, "bool",
        "cache what one ranged tier read brought in, for the reads that follow it"
    )
    read_ahead_message_count_threshold: int = setting(
        "readAheadMessageCountThreshold", 4096, "messages",
        "most messages one read-ahead brings in",
        minimum=1,
    )  # fmt: skip
    read_ahead_message_size_threshold: int = setting(
        "readAheadMessageSizeThreshold", 16 * 1024 * 1024, "bytes",
        "most bytes one read-ahead brings in",
        minimum=1,
    )  # fmt: skip
    read_ahead_cache_expire_duration: int = setting(
        "readAheadCacheExpireDuration", 15_000, "ms",
        "a read-ahead entry not read or written for this long is dropped",
        minimum=1,
    )  # fmt: skip
    read_ahead_cache_size_threshold_rate: float = setting(
        "readAheadCacheSizeThresholdRate", 0.3, "ratio",
        "read-ahead cache size as a share of the memory the process may use (0..1]",
        check=check_rate,
    )  # fmt: skip

    # -- ConsumeQueue store (issue 4; seed 003) ---------------------------------------------------
    store_type: str = setting(
        "storeType", "default", "default|defaultRocksDB",
        "ConsumeQueue store: one file per queue, or RocksDB; an existing store keeps its type",
        check=one_of("default", "defaultRocksDB"),  # consume_queue_store.STORE_TYPES
    )  # fmt: skip
    rocksdb_cq_double_write_enable: bool = setting(
        "rocksdbCQDoubleWriteEnable", False, "bool",
        "dispatch to both ConsumeQueue stores so either can serve",
    )  # fmt: skip

    # -- compaction topics (issue 16; seed 001): compaction* keys --------------------------------
    enable_compaction: bool = setting(
        "enableCompaction", True, "bool",
        "split compaction topics (cleanup.policy=COMPACTION) into CompactionLogs and compact "
        "them in the background",
    )  # fmt: skip
    compaction_mapped_file_size: int = setting(
        "compactionMappedFileSize", 100 * 1024 * 1024, "bytes",
        "size of a CompactionLog file (an existing queue keeps the size found on disk)",
        minimum=OS_PAGE_SIZE,
    )  # fmt: skip
    compaction_cq_mapped_file_size: int = setting(
        "compactionCqMappedFileSize", 10 * 1024 * 1024, "bytes",
        "size of a compaction batch ConsumeQueue file, rounded down to whole 64-byte units",
        minimum=2 * 64,  # a unit and the end unit
    )  # fmt: skip
    compaction_schedule_internal: int = setting(
        "compactionScheduleInternal", 15 * 60 * 1000, "ms",
        "how often each compaction topic's queues get a compaction round (RocketMQ's spelling)",
        minimum=1,
    )  # fmt: skip
    max_offset_map_size: int = setting(
        "maxOffsetMapSize", 100 * 1024 * 1024, "bytes",
        "memory of the OffsetMaps (md5(key) -> offset), shared by the compaction threads",
        minimum=24 * 1024,
    )  # fmt: skip
    compaction_thread_num: int = setting(
        "compactionThreadNum", 6, "threads",
        "queues compacted at once (at most the CPU count); each gets "
        "maxOffsetMapSize / threads of OffsetMap",
        minimum=1, maximum=256,
    )  # fmt: skip

    def __post_init__(self) -> None:
        validate(self)
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
        return from_props(cls, props, **overrides)


def settings_table() -> list[dict[str, str]]:
    """Every setting with key, default, unit and range, for docs and ``stratamq config``."""
    return settings_table_of(StoreConfig)
