"""Every setting StrataMQ has, in one place to import from: the broker's here, the store's in
``store_config.py`` (re-exported), how a setting is declared and checked in ``settings.py``.

Settings use RocketMQ's ``broker.conf`` key names where RocketMQ has the setting, so an existing
``broker.conf`` reads unchanged. ``StoreConfig.from_properties`` reports unknown keys instead of
ignoring them. Nothing else in the project reads the environment or hard-codes a default.

Each numeric setting declares its range with the setting (``minimum``/``maximum`` on
``settings.setting``), and text settings with a fixed shape a ``check``. Building a
``StoreConfig`` or ``BrokerConfig`` (directly, through ``dataclasses.replace`` or from
``broker.conf``) refuses a value outside them with :class:`InvalidSetting` naming the key,
the value and the valid range, so a bad value stops the broker before it listens instead of
failing puts or dispatch later.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stratamq.limits import CQ_UNIT_SIZE, INT_MAX, OS_PAGE_SIZE
from stratamq.settings import (
    InvalidSetting,
    UnknownSettings,
    as_properties,
    check_name,
    from_props,
    one_of,
    setting,
    settings_table_of,
    validate,
)
from stratamq.store_config import (
    MAX_MESSAGE_SIZE_LIMIT,
    BrokerRole,
    DiskFullPolicy,
    FlushDiskType,
    StoreConfig,
    TieredStorageLevel,
    settings_table,
    tier_provider,
)

__all__ = ["CQ_UNIT_SIZE", "INT_MAX", "MAX_MESSAGE_SIZE_LIMIT", "OS_PAGE_SIZE", "BrokerConfig",
           "BrokerRole", "DiskFullPolicy", "FlushDiskType", "InvalidSetting", "StoreConfig",
           "TieredStorageLevel", "UnknownSettings", "as_properties", "broker_settings_table",
           "from_props", "load_broker_conf", "parse_delay_levels", "settings_table",
           "tier_provider"]


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

    broker_name: str = setting("brokerName", "broker-a", "name", "broker name in routes",
                                check=check_name)
    broker_cluster_name: str = setting(
        "brokerClusterName", "DefaultCluster", "name", "cluster name reported to admin tools",
        check=check_name,
    )  # fmt: skip
    listen_host: str = setting(
        "listenHost", "127.0.0.1", "host",
        "address the gRPC server binds (StrataMQ's own key); 0.0.0.0 for every interface",
        check=check_name,
    )  # fmt: skip
    channel_expired_timeout: int = setting(
        "channelExpiredTimeout", 120_000, "ms",
        "a client with no heartbeat (or settings) for this long is dropped from the group's "
        "clients (RocketMQ's scanNotActiveChannel); clients heartbeat every 10 s",
        minimum=1000,
    )  # fmt: skip
    auto_create_topic_enable: bool = setting(
        "autoCreateTopicEnable", False, "bool",
        "create an unknown topic on first send or route query (NORMAL, defaultTopicQueueNums)",
    )  # fmt: skip
    auto_create_subscription_group: bool = setting(
        "autoCreateSubscriptionGroup", True, "bool", "create an unknown consumer group on first use"
    )
    default_topic_queue_nums: int = setting(
        "defaultTopicQueueNums", 8, "queues", "queues of a topic created without --queues",
        minimum=1, maximum=1024,
    )  # fmt: skip
    grpc_thread_pool_nums: int = setting(
        "grpcThreadPoolNums", 16, "threads",
        "threads running the broker's blocking store calls (reads, pop-state writes); gRPC "
        "itself is event-driven, so open streams and long polls hold none",
        minimum=1,
    )  # fmt: skip
    default_invisible_time_mills: int = setting(
        "defaultInvisibleTimeMills", 60_000, "ms",
        "invisible time of a receive that names none (PushConsumer's auto-renew receives)",
        minimum=1,
    )  # fmt: skip
    min_invisible_time_mills_for_recv: int = setting(
        "minInvisibleTimeMillsForRecv", 10_000, "ms", "shortest invisible time a receive may ask",
        minimum=1,
    )  # fmt: skip
    max_invisible_time_mills: int = setting(
        "maxInvisibleTimeMills", 12 * 3600 * 1000, "ms", "longest invisible time accepted",
        minimum=1,
    )  # fmt: skip
    max_long_polling_time_mills: int = setting(
        "grpcClientConsumerMaxLongPollingTimeoutMillis", 20_000, "ms",
        "longest a receive or pull waits for messages",
        minimum=0,
    )  # fmt: skip
    max_pop_polling_size: int = setting(
        "maxPopPollingSize", 100_000, "calls",
        "receives and pulls waiting for messages at once; past it TOO_MANY_REQUESTS "
        "(polling full)",
        minimum=0,
    )  # fmt: skip
    pop_polling_size: int = setting(
        "popPollingSize", 1024, "calls",
        "receives of one consumer group and topic waiting at once; past it TOO_MANY_REQUESTS",
        minimum=0,
    )  # fmt: skip
    pop_polling_size_per_client: int = setting(
        "popPollingSizePerClient", 1024, "calls",
        "receives and pulls of one client (x-mq-client-id) waiting at once (StrataMQ's own "
        "key); past it TOO_MANY_REQUESTS",
        minimum=0,
    )  # fmt: skip
    default_retry_max_times: int = setting(
        "retryMaxTimes", 16, "times",
        "retries of a new group: a message goes to %DLQ%<group> after 1 + this many deliveries",
        minimum=0, maximum=1000,
    )  # fmt: skip
    receive_batch_size: int = setting(
        "grpcReceiveBatchSize", 32, "messages", "batch size the broker suggests to consumers",
        minimum=1,
    )  # fmt: skip
    pop_state_sync_write: bool = setting(
        "popStateSyncWrite", False, "bool",
        "fsync the pop-state WAL on every receive/ack (survive power loss, not just SIGKILL)",
    )  # fmt: skip
    shutdown_grace_seconds: int = setting(
        "shutdownGraceSeconds", 10, "s", "on SIGTERM, how long in-flight requests may finish",
        minimum=0,
    )  # fmt: skip
    timer_enable: bool = setting(
        "timerWheelEnable", True, "bool", "accept DELAY messages (needs the timer service)"
    )
    transaction_check_interval: int = setting(
        "transactionCheckInterval", 30_000, "ms",
        "how often open transactions are checked back with their producers",
        minimum=1,
    )  # fmt: skip
    transaction_timeout: int = setting(
        "transactionTimeOut", 6_000, "ms",
        "age of a half message before its first check (unless the producer set an orphaned "
        "transaction recovery duration)",
        minimum=0,
    )  # fmt: skip
    transaction_check_max: int = setting(
        "transactionCheckMax", 15, "checks",
        "checks of one transaction before its half moves to TRANS_CHECK_MAX_TIME_TOPIC "
        "(logged as an ERROR)",
        minimum=0,
    )  # fmt: skip
    acl_enable: bool = setting("aclEnable", False, "bool", "verify clients' signatures")
    tls_enable: bool = setting("tlsEnable", False, "bool", "serve gRPC over TLS only")
    metrics_exporter_type: str = setting(
        "metricsExporterType", "DISABLE", "DISABLE|PROM",
        "PROM serves Prometheus /metrics on metricsPromExporterHost:metricsPromExporterPort",
        check=one_of("DISABLE", "PROM"),
    )  # fmt: skip
    metrics_host: str = setting(
        "metricsPromExporterHost", "127.0.0.1", "host",
        "address /metrics binds (loopback unless set; 0.0.0.0 for every interface)",
        check=check_name,
    )  # fmt: skip
    metrics_port: int = setting(
        "metricsPromExporterPort", 5557, "port",
        "Prometheus /metrics port (0: any free port); alias metricsPrometheusPort",
        minimum=0, maximum=65535,
    )  # fmt: skip
    console_listen_port: int = setting(
        "consoleListenPort", 0, "port",
        "serve the web console (stratamq console) on 127.0.0.1:PORT inside the broker; 0: off",
        minimum=0, maximum=65535,
    )  # fmt: skip
    # -- DELAY messages, ACL, TLS, metrics (issue 5, second half) --------------------------------
    timer_max_delay_sec: int = setting(
        "timerMaxDelaySec", 3 * 24 * 3600, "s",
        "furthest-ahead delivery time a DELAY message may ask (ILLEGAL_DELIVERY_TIME beyond)",
        minimum=1,
    )  # fmt: skip
    timer_flush_interval_ms: int = setting(
        "timerFlushIntervalMs", 1_000, "ms",
        "how often the timer index (RocksDB, no WAL) and timercheck are made durable",
        minimum=1,
    )  # fmt: skip
    acl_file: str = setting(
        "aclFile", "", "path",
        "accounts file: RocketMQ's plain_acl.yml (.yml/.yaml) or the same fields as JSON "
        "(accessKey, secretKey, admin, defaultTopicPerm, defaultGroupPerm, topicPerms, "
        "groupPerms); see stratamq/broker/acl.py",
    )  # fmt: skip
    acl_access_key: str = setting(
        "aclAccessKey", "", "text", "an admin account's access key, besides those in aclFile"
    )
    acl_secret_key: str = setting("aclSecretKey", "", "text", "that account's secret key")
    acl_signature_window_sec: int = setting(
        "aclSignatureWindowSec", 900, "s",
        "a request whose x-mq-date-time is further than this from now is UNAUTHORIZED",
        minimum=1,
    )  # fmt: skip
    tls_server_cert_path: str = setting(
        "tls.server.certPath", "", "path", "PEM certificate chain served when tlsEnable"
    )
    tls_server_key_path: str = setting(
        "tls.server.keyPath", "", "path", "PEM private key of that certificate"
    )
    tls_server_trust_cert_path: str = setting(
        "tls.server.trustCertPath", "", "path", "PEM CA bundle to verify client certificates"
    )
    tls_server_need_client_auth: str = setting(
        "tls.server.need.client.auth", "none", "none|optional|require",
        "whether clients must present a certificate signed by tls.server.trustCertPath",
        check=one_of("none", "optional", "require", fold_case=True),
    )  # fmt: skip
    tls_client_trust_cert_path: str = setting(
        "tls.client.trustCertPath", "", "path",
        "PEM CA bundle the broker verifies the brokers it calls against (its console, its "
        "group's master in controller mode or as a SLAVE; with tlsEnable); empty: "
        "tls.server.certPath itself, pinned",
    )  # fmt: skip
    tls_client_cert_path: str = setting(
        "tls.client.certPath", "", "path",
        "PEM certificate chain the broker presents when it calls brokers (as for "
        "tls.client.trustCertPath); needed where they set tls.server.need.client.auth=require",
    )  # fmt: skip
    tls_client_key_path: str = setting(
        "tls.client.keyPath", "", "path", "PEM private key of tls.client.certPath"
    )
    # -- RocketMQ 4.x remoting (stratamq/remoting/) --
    remoting_listen_port: int = setting(
        "remotingListenPort", 0, "port",
        "port serving RocketMQ 4.x remoting clients (StrataMQ's own key), the address "
        "registered with namesrvAddr; 0 (or the listen port): the listen port, one port for "
        "both protocols (gRPC relayed to a loopback port); another port: remoting there alone "
        "and gRPC alone on the listen port; -1: no remoting",
        minimum=-1, maximum=65535,
    )  # fmt: skip
    namesrv_addr: str = setting(
        "namesrvAddr", "", "host:port;...",
        "NameServers the broker registers its remoting address and topics with (at start, "
        "when a topic is created, every registerNameServerPeriod)",
    )  # fmt: skip
    message_delay_level: str = setting(
        "messageDelayLevel", "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h",
        "levels", "delays of RocketMQ 4 delay levels 1, 2, ... (s, m, h, d): DELAY sends and "
        "consumers' send-backs (%RETRY%<group>) over remoting",
        check=lambda v: _delay_levels_problem(v),
    )  # fmt: skip
    register_name_server_period: int = setting(
        "registerNameServerPeriod", 30_000, "ms", "how often the broker registers with namesrvAddr",
        minimum=10_000, maximum=60_000,
    )  # fmt: skip

    # -- a cluster on etcd (issue 28; docs/CLUSTER.md) -------------------------------------------
    broker_id: int = setting(
        "brokerId", 0, "id",
        "this broker's id in its group (brokerName); in controller mode ids only tell the "
        "group's brokers apart: the elected master is announced as broker id 0",
        minimum=0, maximum=2**62,
    )  # fmt: skip
    enable_controller_mode: bool = setting(
        "enableControllerMode", False, "bool",
        "join the cluster on etcdEndpoints: register under a lease, elect each group's master "
        "(brokerRole is then ignored: the master acknowledges as SYNC_MASTER)",
    )  # fmt: skip
    etcd_endpoints: str = setting(
        "etcdEndpoints", "", "urls",
        "the etcd members' client URLs, comma-separated (http://10.0.0.1:2379,...)",
    )  # fmt: skip
    etcd_prefix: str = setting(
        "etcdPrefix", "", "key",
        "where the cluster's keys live in etcd (default /stratamq/<brokerClusterName>)",
    )  # fmt: skip
    etcd_lease_ttl_ms: int = setting(
        "etcdLeaseTtlMs", 4_000, "ms",
        "a broker that has not renewed its etcd lease for this long is dead; a master stops "
        "accepting writes after two thirds of it without a renewal (fencing)",
        minimum=2_000, maximum=600_000,
    )  # fmt: skip
    etcd_failsafe_mode: bool = setting(
        "etcdFailsafeMode", False, "bool",
        "Patroni's failsafe mode: with etcd unreachable, a master keeps accepting writes while "
        "every broker that could replace it confirms it has lost etcd too",
    )  # fmt: skip
    broker_election_priority: int = setting(
        "brokerElectionPriority", INT_MAX, "rank",
        "among candidates of equal epoch and max offset, the lowest value is elected",
        minimum=0,
    )  # fmt: skip
    enable_elect_unclean_master: bool = setting(
        "enableElectUncleanMaster", False, "bool",
        "when no member of the SyncStateSet is alive, elect another broker of the group "
        "(messages acknowledged by the old master may be lost: logged at ERROR)",
    )  # fmt: skip

    ha_max_time_slave_not_catchup: int = setting(
        "haMaxTimeSlaveNotCatchup", 15_000, "ms",
        "controller mode: a slave not caught up (within haMaxGapNotInSync) for this long leaves "
        "its master's SyncStateSet, and the master acknowledges puts without it",
        minimum=1,
    )  # fmt: skip

    def cluster_prefix(self) -> str:
        """``etcdPrefix``, or its default ``/stratamq/<brokerClusterName>``."""
        return (self.etcd_prefix or f"/stratamq/{self.broker_cluster_name}").rstrip("/")

    def __post_init__(self) -> None:
        validate(self)
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


def broker_settings_table() -> list[dict[str, str]]:
    """BrokerConfig's keys with default, unit and range (StoreConfig's are in settings_table)."""
    return settings_table_of(BrokerConfig)


# The broker.conf reader lives in its own module (it needs the classes above).
from stratamq.config_file import load_broker_conf  # noqa: E402
