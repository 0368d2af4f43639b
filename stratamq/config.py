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

__all__ = ["BrokerConfig", "FlushDiskType", "StoreConfig", "UnknownSettings", "load_broker_conf",
           "settings_table"]

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

    broker_name: str = _setting("brokerName", "broker-a", "name", "broker name in routes")
    broker_cluster_name: str = _setting(
        "brokerClusterName", "DefaultCluster", "name", "cluster name reported to admin tools"
    )
    listen_host: str = _setting(
        "listenHost", "0.0.0.0", "host", "address the gRPC server binds (StrataMQ's own key)"
    )
    auto_create_topic_enable: bool = _setting(
        "autoCreateTopicEnable", False, "bool",
        "create an unknown topic on first send or route query (NORMAL, defaultTopicQueueNums)",
    )  # fmt: skip
    auto_create_subscription_group: bool = _setting(
        "autoCreateSubscriptionGroup", True, "bool", "create an unknown consumer group on first use"
    )
    default_topic_queue_nums: int = _setting(
        "defaultTopicQueueNums", 8, "queues", "queues of a topic created without --queues"
    )
    grpc_thread_pool_nums: int = _setting(
        "grpcThreadPoolNums", 128, "threads",
        "gRPC worker threads; each long poll and each client's telemetry stream holds one",
    )  # fmt: skip
    default_invisible_time_mills: int = _setting(
        "defaultInvisibleTimeMills", 60_000, "ms",
        "invisible time of a receive that names none (PushConsumer's auto-renew receives)",
    )  # fmt: skip
    min_invisible_time_mills_for_recv: int = _setting(
        "minInvisibleTimeMillsForRecv", 10_000, "ms", "shortest invisible time a receive may ask"
    )
    max_invisible_time_mills: int = _setting(
        "maxInvisibleTimeMills", 12 * 3600 * 1000, "ms", "longest invisible time accepted"
    )
    max_long_polling_time_mills: int = _setting(
        "grpcClientConsumerMaxLongPollingTimeoutMillis", 20_000, "ms",
        "longest a receive or pull waits for messages",
    )  # fmt: skip
    default_retry_max_times: int = _setting(
        "retryMaxTimes", 16, "times",
        "retries of a new group: a message goes to %DLQ%<group> after 1 + this many deliveries",
    )  # fmt: skip
    receive_batch_size: int = _setting(
        "grpcReceiveBatchSize", 32, "messages", "batch size the broker suggests to consumers"
    )
    pop_state_sync_write: bool = _setting(
        "popStateSyncWrite", False, "bool",
        "fsync the pop-state WAL on every receive/ack (survive power loss, not just SIGKILL)",
    )  # fmt: skip
    shutdown_grace_seconds: int = _setting(
        "shutdownGraceSeconds", 10, "s", "on SIGTERM, how long in-flight requests may finish"
    )
    timer_enable: bool = _setting(
        "timerWheelEnable", True, "bool", "accept DELAY messages (needs the timer service)"
    )
    acl_enable: bool = _setting("aclEnable", False, "bool", "verify clients' signatures")
    tls_enable: bool = _setting("tlsEnable", False, "bool", "serve gRPC over TLS only")
    metrics_port: int = _setting(
        "metricsPrometheusPort", 0, "port", "Prometheus /metrics port; 0: no metrics server"
    )
    # -- DELAY messages, ACL, TLS, metrics (issue 5, second half) --------------------------------
    timer_max_delay_sec: int = _setting(
        "timerMaxDelaySec", 3 * 24 * 3600, "s",
        "furthest-ahead delivery time a DELAY message may ask (ILLEGAL_DELIVERY_TIME beyond)",
    )  # fmt: skip
    timer_flush_interval_ms: int = _setting(
        "timerFlushIntervalMs", 1_000, "ms",
        "how often the timer index (RocksDB, no WAL) and timercheck are made durable",
    )  # fmt: skip
    acl_file: str = _setting(
        "aclFile", "", "path",
        "JSON accounts file (plain_acl.yml's fields: accessKey, secretKey, admin, "
        "defaultTopicPerm, defaultGroupPerm, topicPerms, groupPerms); see stratamq/broker/acl.py",
    )  # fmt: skip
    acl_access_key: str = _setting(
        "aclAccessKey", "", "text", "an admin account's access key, besides those in aclFile"
    )
    acl_secret_key: str = _setting("aclSecretKey", "", "text", "that account's secret key")
    acl_signature_window_sec: int = _setting(
        "aclSignatureWindowSec", 900, "s",
        "a request whose x-mq-date-time is further than this from now is UNAUTHORIZED",
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
    )  # fmt: skip


def _from_props(cls: type, props: dict[str, str]) -> Any:
    by_key = {f.metadata["key"]: f for f in dataclasses.fields(cls)}
    return cls(**{by_key[k].name: _convert(by_key[k], v.strip()) for k, v in props.items()})


def load_broker_conf(
    path: str | Path | None = None, text: str | None = None
) -> tuple[StoreConfig, BrokerConfig, list[str]]:
    """Read a ``broker.conf`` (Java properties ``key=value``; ``#``/``!`` comments) and split its
    keys between StoreConfig and BrokerConfig; returns the unknown keys instead of dropping them
    (the caller reports them). Bad values raise ValueError naming the key."""
    if text is None:
        text = Path(path).read_text(encoding="utf-8") if path is not None else ""
    store_keys = {f.metadata["key"] for f in dataclasses.fields(StoreConfig)}
    broker_keys = {f.metadata["key"] for f in dataclasses.fields(BrokerConfig)}
    store_props: dict[str, str] = {}
    broker_props: dict[str, str] = {}
    unknown: list[str] = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        sep = min((i for i in (line.find("="), line.find(":")) if i >= 0), default=-1)
        if sep <= 0:
            raise ValueError(f"line {lineno}: expected key=value, got {raw!r}")
        key, value = line[:sep].strip(), line[sep + 1 :].strip()
        if key in store_keys:
            store_props[key] = value
        elif key in broker_keys:
            broker_props[key] = value
        else:
            unknown.append(key)
    return (StoreConfig.from_properties(store_props), _from_props(BrokerConfig, broker_props),
            unknown)


def broker_settings_table() -> list[dict[str, str]]:
    """BrokerConfig's keys with default and unit (StoreConfig's are in settings_table)."""
    return [
        {"key": f.metadata["key"], "default": str(f.default), "unit": f.metadata["unit"],
         "doc": f.metadata["doc"]}
        for f in dataclasses.fields(BrokerConfig)
    ]
